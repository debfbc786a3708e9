//! Several stateless lockd instances over one etcd cluster.

use std::time::Duration;

use e2e::etcd::EtcdCluster;
use lockd_client::{AcquireOptions, Acquired, Client};

use crate::{Load, lockd_on};

fn opts(ttl_s: u64, wait_s: u64, request_id: Option<&str>) -> AcquireOptions {
    AcquireOptions {
        ttl: Some(Duration::from_secs(ttl_s)),
        wait: Duration::from_secs(wait_s),
        holder: "test".to_string(),
        request_id: request_id.map(str::to_string),
    }
}

/// An acquire through `client` that must be granted (`what` says why, if not); the lease,
/// detached from its guard (these tests renew nothing).
fn granted(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    resource: &str,
    opts: AcquireOptions,
    what: &str,
) -> lockd_client::Lease {
    match rt.block_on(client.acquire(resource, opts)).unwrap() {
        Acquired::Granted(g) => rt.block_on(g.detach()),
        Acquired::NotGranted(why) => panic!("{what}, not {why}"),
    }
}

#[test]
fn two_instances_serve_one_set_of_locks_and_one_may_die() {
    let cluster = EtcdCluster::start(3);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = lockd_on(da.path(), &cluster);
    let b = lockd_on(db.path(), &cluster);
    let load = Load::start(&[a.endpoint.clone(), b.endpoint.clone()], 6, 3);
    load.recorder
        .wait_grants(40, "grants through both instances");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let (ca, cb) = (
        Client::connect(&a.endpoint).unwrap(),
        Client::connect(&b.endpoint).unwrap(),
    );
    // A grant through A, retried with the same request id through B: the same grant.
    let first = granted(
        &rt,
        &ca,
        "job",
        opts(60, 0, Some("retry-me")),
        "a free resource is granted",
    );
    let again = granted(
        &rt,
        &cb,
        "job",
        opts(60, 0, Some("retry-me")),
        "a retry is answered with the original grant",
    );
    assert_eq!(
        (again.token, &again.lease_id),
        (first.token, &first.lease_id)
    );
    assert!(again.duplicate);

    // A waiter queued through A, another through B after it.
    let queued_a = rt.spawn({
        let ca = ca.clone();
        async move { ca.acquire("job", opts(60, 60, None)).await }
    });
    let describe = |c: &Client| rt.block_on(c.describe("job")).unwrap().waiters;
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    while describe(&cb) < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "A's waiter never queued"
        );
    }
    let queued_b = rt.spawn({
        let cb = cb.clone();
        async move { cb.acquire("job", opts(60, 60, None)).await }
    });
    while describe(&cb) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "B's waiter never queued"
        );
    }

    // A dies: its clients move to B, its waiter leaves the queue with its etcd session.
    a.kill9();
    drop(queued_a);
    while describe(&cb) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the dead instance's waiter is still queued"
        );
    }
    load.recorder
        .wait_grants(40, "grants after instance A died");
    // The holder releases (through B): B's waiter, now first, gets the lock.
    assert!(rt.block_on(cb.release("job", &first.lease_id)).unwrap());
    let Acquired::Granted(next) = rt.block_on(queued_b).unwrap().unwrap() else {
        panic!("B's waiter is granted once the lock is released");
    };
    assert!(next.token() > first.token);
    load.finish();
}

#[test]
fn tokens_stay_above_what_was_answered_when_etcd_loses_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let old = EtcdCluster::start(1);
    let mut lockd = lockd_on(dir.path(), &old);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let mut last = 0;
    for i in 0..10 {
        let g = granted(
            &rt,
            &client,
            &format!("h{i}"),
            opts(30, 0, None),
            "a free resource is granted",
        );
        last = last.max(g.token);
    }
    // lockd stops cleanly (its high-water is written down), and etcd is replaced by an empty
    // cluster: its revisions start again from 1.
    lockd.process.signal(libc::SIGTERM);
    assert!(lockd.process.wait().success());
    drop(old);
    let fresh = EtcdCluster::start(1);
    let lockd = lockd_on(dir.path(), &fresh);
    let client = Client::connect(&lockd.endpoint).unwrap();
    let g = granted(
        &rt,
        &client,
        "h0",
        opts(30, 0, None),
        "a free resource is granted",
    );
    assert!(
        g.token > last + (1 << 32) - 1_000,
        "token {} after {last}: the offset must lift tokens past the floor and its margin",
        g.token
    );
    lockd.wait_event("etcd's revision is behind tokens this lockd has answered (etcd lost data, or was restored from a backup); raising the token offset", |_| true);
}
