//! A leader whose clock jumps (libfaketime, Debian's `libfaketime`, loaded into that one
//! lockd): it gives the leadership up before it expires anything by the jumped clock, and the
//! lock its clock would have expired is still held, by the same lease and token, under the
//! next leader.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::Lockd;
use e2e::etcd::{EtcdCluster, LEADING};
use lockd_client::{AcquireOptions, Acquired, Client};

/// libfaketime's library for threaded programs (Debian's `libfaketime`).
fn libfaketime() -> PathBuf {
    let lib = PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1");
    assert!(
        lib.exists(),
        "{} is missing: apt-get install libfaketime (./x installs it)",
        lib.display()
    );
    lib
}

/// A clock offset lockd's libfaketime reads at every clock call.
struct FakeClock {
    file: PathBuf,
}

impl FakeClock {
    fn new(dir: &Path) -> FakeClock {
        let clock = FakeClock {
            file: dir.join("faketime"),
        };
        clock.set("+0");
        clock
    }

    /// libfaketime's syntax: `+60` is sixty seconds ahead of the real time.
    fn set(&self, offset: &str) {
        std::fs::write(&self.file, format!("{offset}\n")).unwrap();
    }

    fn env(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("LD_PRELOAD", libfaketime()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.clone()),
            ("FAKETIME_NO_CACHE", PathBuf::from("1")),
        ]
    }
}

/// Leader `a` (on the faked clock) and follower `b` over one etcd member, a lock taken
/// through `a` for `lock_ttl_s`; then `a`'s clock jumps `jump`. `a` must step down for a
/// clock fault, and the lock must still be held by its lease under the next leader.
fn jump_on_the_leader(leader_ttl_ms: &str, lock_ttl_s: u64, jump: &str, reasons: &[&str]) {
    let cluster = EtcdCluster::start(1);
    let (da, db, dc) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let clock = FakeClock::new(dc.path());
    let env = clock.env();
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let ttl = ["--etcd-leader-ttl-ms", leader_ttl_ms];
    let a: Lockd = cluster.lockd_with_env(da.path(), "127.0.0.1:0", &ttl, &env);
    a.wait_event(LEADING, |_| true);
    let b = cluster.lockd(db.path(), &ttl);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&a.endpoint).unwrap();
    let opts = AcquireOptions {
        ttl: Some(Duration::from_secs(lock_ttl_s)),
        wait: Duration::ZERO,
        holder: "held".to_string(),
        request_id: None,
        owner: Default::default(),
        permits: 0,
        mode: lockd_client::Mode::Exclusive,
    };
    let lease = match rt.block_on(client.acquire("held", opts)).unwrap() {
        Acquired::Granted(g) => rt.block_on(g.detach()),
        Acquired::NotGranted(why) => panic!("a free resource is granted, not {why}"),
    };

    clock.set(jump);
    let stopped = a.wait_event("stopped leading", |_| true);
    let reason = stopped["reason"].as_str().unwrap_or_default();
    assert!(
        reasons.iter().any(|r| reason.contains(r)),
        "the leader stepped down for another reason than {reasons:?}: {stopped}"
    );
    assert!(
        !a.process
            .stderr
            .text()
            .contains("lease expired without renewal"),
        "the leader expired a lease by its jumped clock"
    );

    // Whoever leads now (b, or a again on its now steady clock) holds the lock by the same
    // lease: the renewal is answered, and the lock is described with the same token.
    let through_b = Client::connect(&b.endpoint).unwrap();
    let renewed = rt.block_on(through_b.renew("held", &lease.lease_id));
    assert!(
        renewed.is_ok(),
        "the lease the jumped clock would have expired is gone: {renewed:?}"
    );
    let d = rt.block_on(through_b.describe("held")).unwrap();
    assert_eq!(
        d.token,
        Some(lease.token),
        "the lock is held by its first lease"
    );
}

/// The outside tester's case: a 60 s jump, past the leader's whole term. Whichever sees it
/// first ends the term: the keep-alive (the term has run out by the clock) or the clock check.
#[test]
fn a_leader_whose_clock_jumps_past_its_term_expires_nothing() {
    jump_on_the_leader(
        e2e::etcd::LEADER_TTL_MS,
        30,
        "+60",
        &["clock ran ahead", "could not be renewed in time"],
    );
}

/// A jump well inside the term (leadership TTL 30 s: the term runs 27 s past each
/// keep-alive) but past the clock's trust (10 s past the last check): without the check
/// against etcd's clock, the term is still in force and the expiry would be committed.
#[test]
fn a_leader_whose_clock_jumps_within_its_term_expires_nothing() {
    jump_on_the_leader("30000", 12, "+15", &["clock ran ahead"]);
}
