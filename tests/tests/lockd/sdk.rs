//! The client SDK against a real lockd: renewal, the lost signal, retries through an outage.

use std::time::Duration;

use e2e::{Lockd, free_loopback_addr, output};
use lockd_client::{AcquireOptions, Acquired, Client, LostReason};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

fn opts(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl: Some(Duration::from_millis(ttl_ms)),
        ..AcquireOptions::default()
    }
}

#[test]
fn the_guard_keeps_the_lease_alive_past_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let Acquired::Granted(guard) = rt.block_on(client.acquire("kept", opts(1_500))).unwrap() else {
        panic!("a free resource is granted")
    };
    // Renewals every ttl/3: by the fourth, the lease has outlived its TTL.
    lockd.wait_events("renewed", 4, |e| e["resource"] == "kept");
    assert!(!guard.is_lost());
    let d = rt.block_on(client.describe("kept")).unwrap();
    assert_eq!(
        d.token,
        Some(guard.token()),
        "still held by the guard's lease"
    );
    assert!(
        rt.block_on(guard.release()).unwrap(),
        "the guard released its own lease"
    );
    assert!(!rt.block_on(client.describe("kept")).unwrap().held);
}

#[test]
fn lost_fires_when_lockd_says_the_lease_is_not_current() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let Acquired::Granted(guard) = rt.block_on(client.acquire("revoked", opts(600))).unwrap()
    else {
        panic!()
    };
    // Someone with the lease id ends the lease behind the guard's back.
    let mut release = lockd.lockctl();
    release.args(["release", "revoked", guard.lease_id()]);
    assert!(output(release).0.success());
    let reason = rt
        .block_on(async { tokio::time::timeout(e2e::PATIENCE, guard.lost()).await })
        .unwrap();
    assert!(
        matches!(reason, LostReason::NotCurrent(ref m) if m.contains("not the current lease")),
        "{reason:?}"
    );
    assert!(guard.is_lost());
}

#[test]
fn acquire_retries_while_lockd_is_down_and_succeeds_once_it_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_loopback_addr();
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&format!("http://{addr}")).unwrap();
    let pending =
        rt.spawn(async move { client.acquire("patient", AcquireOptions::default()).await });
    // The call is already failing and retrying; lockd comes up on the address it uses.
    let lockd = Lockd::start_on(dir.path(), &addr, &[]);
    let acquired = rt
        .block_on(pending)
        .unwrap()
        .expect("granted once lockd is up");
    let Acquired::Granted(guard) = acquired else {
        panic!("a free resource is granted")
    };
    let granted = lockd.wait_event("granted", |e| e["resource"] == "patient");
    assert_eq!(
        granted["token"].as_str().map(str::to_string),
        Some(guard.token().to_string())
    );
}
