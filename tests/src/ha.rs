//! What the high-availability tests share, over etcd and over ZooKeeper: acquire options, an
//! acquire that must be granted, a raw Acquire whose answer is lockd's own, and the check of
//! an UNAVAILABLE answer.

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
