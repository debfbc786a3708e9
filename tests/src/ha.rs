//! What the high-availability tests share, over etcd, ZooKeeper and Redis: acquire options,
//! an acquire that must be granted, a raw Acquire whose answer is lockd's own, the check of an
//! UNAVAILABLE answer, and the checks of two instances that every coordination service passes
//! alike.

use std::time::Duration;

use lockd_client::{AcquireOptions, Acquired, Client};
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, AcquireResponse};
use tonic::Code;
use tonic::transport::Channel;

/// An exclusive lock's options: a TTL, a wait, and a request id if any.
pub fn opts(ttl_s: u64, wait_s: u64, request_id: Option<&str>) -> AcquireOptions {
    AcquireOptions {
        ttl: Some(Duration::from_secs(ttl_s)),
        wait: Duration::from_secs(wait_s),
        holder: "test".to_string(),
        request_id: request_id.map(str::to_string),
        owner: Default::default(),
        permits: 0,
        mode: lockd_client::Mode::Exclusive,
    }
}

/// An acquire through `client` that must be granted (`what` says why, if not); the lease,
/// detached from its guard (these tests renew by hand).
pub fn granted(
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

/// A try-lock of `resource` (TTL 60 s) with a deadline of 30 s: far beyond lockd's own bounds
/// (the request timeouts, 3 s, for a commit and for finding a leader), so that the answer is
/// lockd's, not this deadline.
pub fn acquire_raw(
    rt: &tokio::runtime::Runtime,
    rpc: &mut LockServiceClient<Channel>,
    resource: &str,
) -> Result<AcquireResponse, tonic::Status> {
    let mut req = tonic::Request::new(AcquireRequest {
        resource: resource.to_string(),
        request_id: String::new(),
        ttl_ms: 60_000,
        wait_timeout_ms: 0,
        holder: "test".to_string(),
        owner: Default::default(),
        permits: 0,
        mode: 0,
        downgrade_lease_id: String::new(),
    });
    req.set_timeout(Duration::from_secs(30));
    rt.block_on(rpc.acquire(req))
        .map(tonic::Response::into_inner)
}

/// UNAVAILABLE because the leader lost its term (its batch failed, or its term could not be
/// kept) or because no leader can be elected: a client retries, and no answer is a grant.
pub fn assert_unavailable(err: &tonic::Status) {
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let code = err
        .metadata()
        .get("lockd-error")
        .and_then(|v| v.to_str().ok());
    assert!(matches!(code, Some("not_leader" | "no_leader")), "{err:?}");
}

/// Starts a lockd over some coordination service on a data directory; returns once it leads
/// or follows.
pub type StartLockd<'a> = &'a dyn Fn(&std::path::Path) -> crate::Lockd;

/// Two lockd instances; the first starts first, so leads.
pub fn two(start: StartLockd<'_>, dirs: &[tempfile::TempDir; 2]) -> Vec<crate::Lockd> {
    let first = start(dirs[0].path());
    first.wait_event(crate::etcd::LEADING, |_| true);
    let second = start(dirs[1].path());
    vec![first, second]
}

/// Two instances: a request id retried through the other instance gets the original grant;
/// SIGTERM of the leader hands the leadership over at once, locks and request ids kept, and
/// tokens rise.
pub fn a_retry_through_the_other_instance_gets_the_original_grant_and_a_clean_stop_hands_over(
    start: StartLockd<'_>,
) {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut lockds = two(start, &dirs);
    let (leader, follower) = (0, 1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let clients: Vec<Client> = lockds
        .iter()
        .map(|l| Client::connect(&l.endpoint).unwrap())
        .collect();
    let first = granted(
        &rt,
        &clients[follower],
        "job",
        opts(60, 0, Some("retry-me")),
        "a free resource is granted through the follower",
    );
    let again = granted(
        &rt,
        &clients[leader],
        "job",
        opts(60, 0, Some("retry-me")),
        "a retry through the leader is answered with the original grant",
    );
    assert_eq!(
        (again.token, &again.lease_id),
        (first.token, &first.lease_id)
    );
    assert!(again.duplicate);

    // SIGTERM of the leader: it gives its leadership up, the other takes over at once, and
    // the lock is still held, by the same lease.
    lockds[leader].process.signal(libc::SIGTERM);
    assert!(lockds[leader].process.wait().success());
    lockds[follower].wait_event(crate::etcd::LEADING, |e| e["leases"].as_u64() >= Some(1));
    rt.block_on(clients[follower].renew("job", &first.lease_id))
        .expect("the lease survives the hand-over");
    let retried = granted(
        &rt,
        &clients[follower],
        "job",
        opts(60, 0, Some("retry-me")),
        "a retry after the hand-over is answered with the original grant",
    );
    assert_eq!(retried.token, first.token);
    let next = granted(
        &rt,
        &clients[follower],
        "other",
        opts(60, 0, None),
        "a free resource is granted by the new leader",
    );
    assert!(next.token > first.token, "tokens rise across the hand-over");
}

/// Two instances: `kill -9` of the leader; the follower takes over once the leadership has run
/// out, with the locks granted before, and tokens rise.
pub fn kill_9_of_the_lockd_leader_keeps_its_locks_and_tokens_rise(start: StartLockd<'_>) {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut lockds = two(start, &dirs);
    let (leader, follower) = (0, 1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&lockds[follower].endpoint).unwrap();
    let kept = granted(
        &rt,
        &client,
        "kept",
        opts(60, 0, None),
        "a free resource is granted",
    );
    lockds[leader].kill9();
    // The killed leader's leadership runs out, then the follower leads; the SDK retries
    // through the failover.
    let probe = granted(
        &rt,
        &client,
        "probe",
        opts(30, 0, None),
        "a free resource is granted after the failover",
    );
    assert!(probe.token > kept.token, "tokens rise across the failover");
    lockds[follower].wait_event(crate::etcd::LEADING, |e| e["leases"].as_u64() >= Some(1));
    let d = rt.block_on(client.describe("kept")).unwrap();
    assert_eq!(d.token, Some(kept.token));
    rt.block_on(client.renew("kept", &kept.lease_id))
        .expect("a lease granted before the kill is renewed after it");
}
