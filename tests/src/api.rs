//! The API conformance suite: what every lockd backend must do, checked through the gRPC API
//! against the real binary. The embedded backend runs it from the `lockd` tests, the etcd
//! backend from the `etcd` tests, the ZooKeeper backend from the `zookeeper` tests
//! ([`api_suite!`](crate::api_suite)), so that all keep one contract: contention, FIFO hand-off, expiry, request-id de-duplication, stale lease ids,
//! tokens across restarts, the longest fields, cancelled waiters, a retried waiter keeping its
//! place, queue limits, bad input, tenants, batched renewals and releases, reentrant locks, atomic
//! sets, semaphores, read-write locks.
//!
//! Each check panics with a message naming the broken rule. Waits are for states (a queue of
//! the expected length, a grant), each a round trip, never a sleep.

use std::path::Path;
use std::time::Instant;

use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{
    AcquireRequest, DescribeRequest, DescribeResponse, Lease, LeaseRef, NotGranted,
    ReleaseManyRequest, ReleaseRequest, ReleaseResponse, RenewManyRequest, RenewRequest,
    RenewResponse, RenewResult,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::etcd::EtcdCluster;
use crate::zookeeper::ZkEnsemble;
use crate::{Lockd, PATIENCE};

mod kinds;
mod rwlocks;
mod semaphores;
mod sets;
pub use kinds::{
    a_reentrant_owner_holds_the_lease_as_often_as_it_acquired_it,
    many_leases_are_renewed_and_released_in_one_call,
};
pub use rwlocks::a_read_write_lock_shares_readers_and_keeps_a_waiting_writer_first;
pub use semaphores::a_semaphore_grants_at_most_n_permits_each_a_lease_of_its_own;
pub use sets::a_set_is_granted_whole_or_not_at_all;

/// How a check starts lockd.
pub trait Backend {
    fn start(&self, dir: &Path, extra: &[&str]) -> Lockd;
}

/// The embedded store.
pub struct Embedded;

impl Backend for Embedded {
    fn start(&self, dir: &Path, extra: &[&str]) -> Lockd {
        Lockd::start(dir, extra)
    }
}

/// lockd over an etcd cluster (one member, one lockd, which leads: the suite is about
/// semantics; the failure tests use three of each).
pub struct OverEtcd(pub EtcdCluster);

impl OverEtcd {
    pub fn new() -> OverEtcd {
        OverEtcd(EtcdCluster::start(1))
    }
}

impl Default for OverEtcd {
    fn default() -> OverEtcd {
        OverEtcd::new()
    }
}

impl Backend for OverEtcd {
    fn start(&self, dir: &Path, extra: &[&str]) -> Lockd {
        let lockd = self.0.lockd(dir, extra);
        // After a restart the predecessor's leadership must run out first.
        lockd.wait_event(crate::etcd::LEADING, |_| true);
        lockd
    }
}

/// lockd over a ZooKeeper ensemble (one server, one lockd, which leads).
pub struct OverZooKeeper(pub ZkEnsemble);

impl OverZooKeeper {
    pub fn new() -> OverZooKeeper {
        OverZooKeeper(ZkEnsemble::start(1))
    }
}

impl Default for OverZooKeeper {
    fn default() -> OverZooKeeper {
        OverZooKeeper::new()
    }
}

impl Backend for OverZooKeeper {
    fn start(&self, dir: &Path, extra: &[&str]) -> Lockd {
        let lockd = self.0.lockd(dir, extra);
        // After a restart the predecessor's session must end first.
        lockd.wait_event(crate::etcd::LEADING, |_| true);
        lockd
    }
}

/// lockd over Redis with Sentinel: a master, one replica (each batch waits for it) and one
/// Sentinel.
pub struct OverRedis(pub crate::redis::RedisSet);

impl OverRedis {
    pub fn new() -> OverRedis {
        OverRedis(crate::redis::RedisSet::start(1, 1))
    }
}

impl Default for OverRedis {
    fn default() -> OverRedis {
        OverRedis::new()
    }
}

impl Backend for OverRedis {
    fn start(&self, dir: &Path, extra: &[&str]) -> Lockd {
        let lockd = self.0.lockd(dir, extra);
        // After a restart the predecessor's leader key must run out first.
        lockd.wait_event(crate::etcd::LEADING, |_| true);
        lockd
    }
}

/// Instantiates every check of the suite as a `#[test]`, each with a fresh backend from
/// `$make`.
#[macro_export]
macro_rules! api_suite {
    ($make:expr) => {
        $crate::api_suite!(@each $make;
            contention_is_an_answer_not_an_error,
            waiters_are_served_in_order,
            an_expired_lease_passes_the_lock_on,
            a_retried_request_id_gets_the_original_grant,
            stale_lease_ids_change_nothing,
            tokens_rise_across_grants_and_restarts,
            the_longest_fields_round_trip,
            a_cancelled_waiter_leaves_the_queue,
            a_retried_waiter_keeps_its_place,
            a_full_queue_is_refused,
            bad_input_is_refused_with_the_reason,
            tenants_are_kept_apart_and_within_their_quotas,
            many_leases_are_renewed_and_released_in_one_call,
            a_reentrant_owner_holds_the_lease_as_often_as_it_acquired_it,
            a_set_is_granted_whole_or_not_at_all,
            a_semaphore_grants_at_most_n_permits_each_a_lease_of_its_own,
            a_read_write_lock_shares_readers_and_keeps_a_waiting_writer_first
        );
    };
    (@each $make:expr; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                let backend = $make;
                $crate::api::$check(&backend);
            }
        )*
    };
}

/// A raw gRPC client on its own runtime, with a bearer token if given.
struct Api {
    rt: tokio::runtime::Runtime,
    rpc: LockServiceClient<Channel>,
    token: Option<tonic::metadata::AsciiMetadataValue>,
}

/// `message` as a request with `token` as its bearer token.
fn with_token<T>(
    message: T,
    token: &Option<tonic::metadata::AsciiMetadataValue>,
) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(t) = token {
        r.metadata_mut().insert("authorization", t.clone());
    }
    r
}

fn req(resource: &str, request_id: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
        ttl_ms,
        wait_timeout_ms: wait_ms,
        holder: format!("holder-of-{resource}"),
        owner: String::new(),
        permits: 0,
        mode: 0,
        downgrade_lease_id: String::new(),
    }
}

/// `req` for a reentrant lock of `owner`.
fn owned(resource: &str, request_id: &str, owner: &str) -> AcquireRequest {
    AcquireRequest {
        owner: owner.to_string(),
        ..req(resource, request_id, 60_000, 0)
    }
}

impl Api {
    fn new(lockd: &Lockd) -> Api {
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        let rpc = rt
            .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
            .expect("connecting to lockd");
        Api {
            rt,
            rpc,
            token: None,
        }
    }

    /// A client presenting `token` (`Bearer` and the token).
    fn with_token(lockd: &Lockd, token: &str) -> Api {
        let mut api = Api::new(lockd);
        api.token = Some(format!("Bearer {token}").parse().expect("a metadata value"));
        api
    }

    fn call<T>(&self, message: T) -> tonic::Request<T> {
        with_token(message, &self.token)
    }

    fn acquire(&mut self, r: AcquireRequest) -> Result<Outcome, Status> {
        let r = self.call(r);
        let resp = self.rt.block_on(self.rpc.acquire(r))?;
        Ok(resp.into_inner().outcome.expect("an outcome"))
    }

    /// An acquire that must be granted at once (`what` says why, if it is not).
    fn granted_now(&mut self, r: AcquireRequest, what: &str) -> Lease {
        match self.acquire(r) {
            Ok(Outcome::Granted(l)) => l,
            other => panic!("{what}, not {other:?}"),
        }
    }

    fn grant(&mut self, resource: &str, ttl_ms: u64) -> Lease {
        self.granted_now(
            req(resource, "", ttl_ms, 0),
            "a free resource is granted at once",
        )
    }

    fn release(&mut self, resource: &str, lease_id: &str) -> ReleaseResponse {
        self.try_release(resource, lease_id)
            .expect("release is answered")
    }

    fn try_release(&mut self, resource: &str, lease_id: &str) -> Result<ReleaseResponse, Status> {
        let r = self.call(ReleaseRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_string(),
        });
        self.rt
            .block_on(self.rpc.release(r))
            .map(tonic::Response::into_inner)
    }

    fn renew(&mut self, resource: &str, lease_id: &str) -> Result<RenewResponse, Status> {
        let r = self.call(RenewRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_string(),
        });
        self.rt
            .block_on(self.rpc.renew(r))
            .map(tonic::Response::into_inner)
    }

    fn renew_many(&mut self, leases: &[(&str, &str)]) -> Result<Vec<RenewResult>, Status> {
        let r = self.call(RenewManyRequest {
            leases: lease_refs(leases),
        });
        let results = self
            .rt
            .block_on(self.rpc.renew_many(r))?
            .into_inner()
            .results;
        assert_eq!(results.len(), leases.len(), "one result per lease asked");
        Ok(results)
    }

    fn release_many(&mut self, leases: &[(&str, &str)]) -> Result<Vec<ReleaseResponse>, Status> {
        let r = self.call(ReleaseManyRequest {
            leases: lease_refs(leases),
        });
        let results = self
            .rt
            .block_on(self.rpc.release_many(r))?
            .into_inner()
            .results;
        assert_eq!(results.len(), leases.len(), "one result per lease asked");
        Ok(results)
    }

    fn describe(&mut self, resource: &str) -> DescribeResponse {
        self.try_describe(resource).expect("describe is answered")
    }

    fn try_describe(&mut self, resource: &str) -> Result<DescribeResponse, Status> {
        let r = self.call(DescribeRequest {
            resource: resource.to_string(),
        });
        self.rt
            .block_on(self.rpc.describe(r))
            .map(tonic::Response::into_inner)
    }

    /// Starts a waiting acquire in the background.
    fn queue(
        &self,
        r: AcquireRequest,
    ) -> tokio::task::JoinHandle<Result<tonic::Response<lockd_proto::v1::AcquireResponse>, Status>>
    {
        let mut rpc = self.rpc.clone();
        let r = self.call(r);
        self.rt.spawn(async move { rpc.acquire(r).await })
    }

    /// Waits until `resource` has `n` waiters.
    fn wait_waiters(&mut self, resource: &str, n: u32) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let got = self.describe(resource).waiters;
            if got == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{resource} kept {got} waiters, expected {n}"
            );
        }
    }

    fn granted(
        &self,
        h: tokio::task::JoinHandle<
            Result<tonic::Response<lockd_proto::v1::AcquireResponse>, Status>,
        >,
    ) -> Lease {
        let resp = self
            .rt
            .block_on(async { tokio::time::timeout(PATIENCE, h).await })
            .expect("a queued acquire is answered")
            .expect("the task ran")
            .expect("a queued acquire succeeds");
        match resp.into_inner().outcome {
            Some(Outcome::Granted(l)) => l,
            other => panic!("a queued acquire is granted, not {other:?}"),
        }
    }
}

/// Two tenants: `work` owns `job/`, `other` owns `other/`.
const WORK_AND_OTHER: &str = r#"
[[tenant]]
name = "work"
prefixes = ["job/"]
[[tenant]]
name = "other"
prefixes = ["other/"]
"#;

/// lockd under `dir` (its data in `dir/data`) with the policy of [`WORK_AND_OTHER`]: the
/// identity `worker` of tenant `work` and another of tenant `other`, known by these bearer
/// tokens. Returns lockd and the arguments that start it again on the same data.
fn two_tenants(b: &dyn Backend, dir: &Path, (worker, other): (&str, &str)) -> (Lockd, Vec<String>) {
    let args = policy(
        dir,
        WORK_AND_OTHER,
        &[("worker", "work", worker), ("outsider", "other", other)],
    );
    let lockd = b.start(
        &dir.join("data"),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    (lockd, args)
}

/// Writes a policy under `dir`: the `tenants` TOML, and an identity for each (name, tenant,
/// bearer token). Returns lockd's arguments that put it in force.
fn policy(dir: &Path, tenants: &str, identities: &[(&str, &str, &str)]) -> Vec<String> {
    let mut toml = tenants.to_string();
    for (name, tenant, token) in identities {
        toml.push_str(&format!(
            "\n[[identity]]\nname = \"{name}\"\ntenant = \"{tenant}\"\ntoken_sha256 = \"{}\"\n",
            crate::sha256_hex(token)
        ));
    }
    let path = dir.join("policy.toml");
    std::fs::write(&path, toml).unwrap();
    vec!["--policy".to_string(), path.to_str().unwrap().to_string()]
}

fn lease_refs(leases: &[(&str, &str)]) -> Vec<LeaseRef> {
    leases
        .iter()
        .map(|(resource, lease_id)| LeaseRef {
            resource: resource.to_string(),
            lease_id: lease_id.to_string(),
        })
        .collect()
}

fn busy(o: Result<Outcome, Status>) -> NotGranted {
    match o {
        Ok(Outcome::NotGranted(ng)) => ng,
        other => panic!("a held lock is not granted (and that is no error): {other:?}"),
    }
}

fn code(s: &Status) -> Option<&str> {
    s.metadata()
        .get("lockd-error")
        .and_then(|v| v.to_str().ok())
}

/// `err` is the gRPC status `grpc` with lockd's error code `code`.
fn assert_refused(err: &Status, grpc: Code, lockd_code: &str) {
    assert_eq!(err.code(), grpc, "{err:?}");
    assert_eq!(code(err), Some(lockd_code), "{err:?}");
}

pub fn contention_is_an_answer_not_an_error(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let held = api.grant("inventory:sku-1", 30_000);
    assert!(held.token >= 1 && held.ttl_ms >= 30_000, "{held:?}");
    let ng = busy(api.acquire(req("inventory:sku-1", "", 30_000, 0)));
    assert_eq!(ng.token, held.token, "the answer names the holder's token");
    assert_eq!(ng.holder, "holder-of-inventory:sku-1");
    let d = api.describe("inventory:sku-1");
    assert!(
        d.held && d.token == held.token && d.holder == ng.holder,
        "{d:?}"
    );
    assert!(!api.describe("inventory:sku-2").held);
}

pub fn waiters_are_served_in_order(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let held = api.grant("fifo", 60_000);
    let mut queued = Vec::new();
    for i in 1..=3 {
        queued.push(api.queue(req("fifo", &format!("w{i}"), 60_000, 60_000)));
        api.wait_waiters("fifo", i);
    }
    let mut previous = held;
    for (i, h) in queued.into_iter().enumerate() {
        assert!(api.release("fifo", &previous.lease_id).released);
        let next = api.granted(h);
        assert!(
            next.token > previous.token,
            "waiter {} got token {} after {}",
            i + 1,
            next.token,
            previous.token
        );
        // The others still wait: the grant went to the head of the queue.
        assert_eq!(api.describe("fifo").waiters, 2 - i as u32);
        previous = next;
    }
}

pub fn an_expired_lease_passes_the_lock_on(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let short = api.grant("expiring", 1_000);
    let waiter = api.queue(req("expiring", "next", 30_000, 60_000));
    let next = api.granted(waiter);
    assert!(next.token > short.token);
    let err = api
        .renew("expiring", &short.lease_id)
        .expect_err("an expired lease is not renewed");
    assert_refused(&err, Code::FailedPrecondition, "lease_not_current");
}

pub fn a_retried_request_id_gets_the_original_grant(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let first = api.granted_now(req("job", "req-1", 30_000, 0), "granted");
    assert!(!first.duplicate);
    let again = api.granted_now(
        req("job", "req-1", 30_000, 0),
        "a retry gets the grant back",
    );
    assert!(again.duplicate && again.held, "{again:?}");
    assert_eq!(
        (again.token, &again.lease_id),
        (first.token, &first.lease_id)
    );
    // Released: a retry still gets the original answer, marked as no longer held.
    assert!(api.release("job", &first.lease_id).released);
    let late = api.granted_now(
        req("job", "req-1", 30_000, 0),
        "a late retry gets the original grant",
    );
    assert!(late.duplicate && !late.held, "{late:?}");
    assert_eq!(late.token, first.token);
    assert!(
        !api.describe("job").held,
        "the retry did not take the lock again"
    );
    let err = api
        .acquire(req("other-job", "req-1", 30_000, 0))
        .expect_err("a request id is bound to its resource");
    assert_refused(&err, Code::InvalidArgument, "request_id_reused");
}

pub fn stale_lease_ids_change_nothing(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let held = api.grant("acct:1", 30_000);
    let stranger = "0123456789abcdef0123456789abcdef";
    let r = api.release("acct:1", stranger);
    assert!(!r.released && r.current_token == held.token, "{r:?}");
    let err = api
        .renew("acct:1", stranger)
        .expect_err("a stranger cannot renew");
    assert_eq!(code(&err), Some("lease_not_current"), "{err:?}");
    assert!(api.describe("acct:1").held, "still held by its holder");
    assert!(api.renew("acct:1", &held.lease_id).is_ok());
    assert!(api.release("acct:1", &held.lease_id).released);
    let r = api.release("acct:1", &held.lease_id);
    assert!(
        !r.released && r.current_token == 0,
        "a second release is not an error and changes nothing: {r:?}"
    );
    let err = api
        .renew("acct:1", "not-a-lease-id")
        .expect_err("a malformed lease id");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

pub fn tokens_rise_across_grants_and_restarts(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let mut lockd = b.start(dir.path(), &[]);
    let mut last = 0;
    {
        let mut api = Api::new(&lockd);
        for i in 0..5 {
            let l = api.grant(&format!("t{}", i % 2), 30_000);
            assert!(l.token > last, "token {} after {last}", l.token);
            last = l.token;
            assert!(api.release(&format!("t{}", i % 2), &l.lease_id).released);
        }
    }
    lockd.kill9();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    // A fresh resource: a release may be lost in a crash (it only keeps the lock held until
    // its TTL), a grant never.
    let l = api.grant("t-after", 30_000);
    assert!(
        l.token > last,
        "after a kill -9 and restart, token {} after {last}",
        l.token
    );
}

pub fn the_longest_fields_round_trip(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@";
    let resource: String = alphabet.chars().cycle().take(256).collect();
    let request_id: String = "r".repeat(128);
    let holder = "h".repeat(128);
    let mut r = req(&resource, &request_id, 30_000, 0);
    r.holder = holder.clone();
    let first = api.granted_now(r.clone(), "the longest names are granted");
    let d = api.describe(&resource);
    assert_eq!((d.held, d.holder.as_str()), (true, holder.as_str()));
    let again = api.granted_now(r, "a retry with the longest id");
    assert_eq!(again.lease_id, first.lease_id);
    assert!(api.release(&resource, &first.lease_id).released);
}

pub fn a_cancelled_waiter_leaves_the_queue(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let held = api.grant("busy", 60_000);
    let waiter = api.queue(req("busy", "patient", 60_000, 60_000));
    api.wait_waiters("busy", 1);
    // The client gives up: the call is dropped, the waiter must leave.
    waiter.abort();
    api.wait_waiters("busy", 0);
    assert!(api.release("busy", &held.lease_id).released);
    assert!(!api.describe("busy").held, "nobody was granted the lock");
}

/// A waiting Acquire retried with the same request id (its client lost the connection, say)
/// while the first call still waits keeps its place: the first call is answered ABORTED
/// `superseded`, and the retry is served before whoever queued after it.
pub fn a_retried_waiter_keeps_its_place(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    let holder = api.grant("queue", 30_000);
    let first = api.queue(req("queue", "w1", 30_000, 30_000));
    api.wait_waiters("queue", 1);
    let second = api.queue(req("queue", "w2", 30_000, 30_000));
    api.wait_waiters("queue", 2);
    let retry = api.queue(req("queue", "w1", 30_000, 30_000));
    let err = api
        .rt
        .block_on(first)
        .expect("the task ran")
        .expect_err("the first call is taken over by its retry");
    assert_refused(&err, Code::Aborted, "superseded");
    api.wait_waiters("queue", 2);
    assert!(api.release("queue", &holder.lease_id).released);
    let l = api.granted(retry);
    let d = api.describe("queue");
    assert_eq!(
        (d.token, d.waiters),
        (l.token, 1),
        "the retried waiter is served first, the one queued after it still waits"
    );
    assert!(api.release("queue", &l.lease_id).released);
    let next = api.granted(second);
    assert!(next.token > l.token);
}

pub fn a_full_queue_is_refused(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &["--waiters-per-resource-max", "1"]);
    let mut api = Api::new(&lockd);
    let _held = api.grant("hot", 60_000);
    let _first = api.queue(req("hot", "first", 60_000, 60_000));
    api.wait_waiters("hot", 1);
    let err = api
        .acquire(req("hot", "second", 60_000, 60_000))
        .expect_err("the queue is full");
    assert_refused(&err, Code::ResourceExhausted, "queue_full");
    assert_eq!(
        api.describe("hot").waiters,
        1,
        "the refused call did not stay queued"
    );
}

pub fn bad_input_is_refused_with_the_reason(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let lockd = b.start(dir.path(), &[]);
    let mut api = Api::new(&lockd);
    for (r, needle) in [
        (req("bad name", "", 30_000, 0), "resource"),
        (req(&"x".repeat(257), "", 30_000, 0), "resource"),
        (req("ok", "", 50, 0), "ttl_ms"),
        (req("ok", "", 30_000, 10_000_000), "wait_timeout_ms"),
        (req("ok", "has space", 30_000, 0), "request_id"),
    ] {
        let err = api.acquire(r).expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(needle), "{err:?}");
    }
    // The service is unharmed.
    api.grant("ok", 30_000);
}

/// With a policy (bearer tokens here; certificates in the TLS tests), each identity uses only
/// its tenant's resources, whatever the call, and within its tenant's quotas; the holder of a
/// grant is the identity.
pub fn tenants_are_kept_apart_and_within_their_quotas(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (pay_token, inv_token, batch_token) = (
        "pay-0123456789abcdef0123456789ab",
        "inv-0123456789abcdef0123456789ab",
        "batch-0123456789abcdef0123456789",
    );
    let args = policy(
        dir.path(),
        r#"
        [[tenant]]
        name = "pay"
        prefixes = ["pay/"]
        leases_max = 2
        waiters_max = 1
        [[tenant]]
        name = "inv"
        prefixes = ["inv/"]
        "#,
        &[
            ("pay-api", "pay", pay_token),
            ("inv-worker", "inv", inv_token),
            ("pay-batch", "pay", batch_token),
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lockd = b.start(&dir.path().join("data"), &args);
    let (mut pay, mut inv) = (
        Api::with_token(&lockd, pay_token),
        Api::with_token(&lockd, inv_token),
    );
    let mut anonymous = Api::new(&lockd);
    let mut stranger = Api::with_token(&lockd, "not-a-token-of-this-policy-at-all");
    for api in [&mut anonymous, &mut stranger] {
        let err = api.try_describe("pay/1").expect_err("an unknown caller");
        assert_refused(&err, Code::Unauthenticated, "unauthenticated");
        let err = api
            .acquire(req("pay/1", "", 1_000, 0))
            .expect_err("an unknown caller");
        assert_refused(&err, Code::Unauthenticated, "unauthenticated");
    }
    let held = pay.grant("pay/1", 60_000);
    let d = pay.describe("pay/1");
    assert_eq!(
        d.holder, "pay-api (holder-of-pay/1)",
        "the holder is the identity"
    );
    // Another tenant's identity can do nothing with it, not even with its lease id.
    let denied = |r: Result<(), Status>, what: &str| {
        let err = r.expect_err(what);
        assert_refused(&err, Code::PermissionDenied, "permission_denied");
        assert!(err.message().contains("inv-worker"), "{err:?}");
    };
    denied(
        inv.acquire(req("pay/1", "", 1_000, 0)).map(drop),
        "acquire of another tenant's",
    );
    denied(
        inv.acquire(req("pay/9", "", 1_000, 0)).map(drop),
        "acquire of another tenant's",
    );
    denied(
        inv.renew("pay/1", &held.lease_id).map(drop),
        "renew of another tenant's",
    );
    denied(
        inv.try_release("pay/1", &held.lease_id).map(drop),
        "release of another tenant's",
    );
    denied(
        inv.try_describe("pay/1").map(drop),
        "describe of another tenant's",
    );
    denied(
        inv.acquire(req("unowned", "", 1_000, 0)).map(drop),
        "a resource of no tenant",
    );
    let d = pay.describe("pay/1");
    assert!(
        d.held && d.token == held.token,
        "pay-api still holds pay/1: {d:?}"
    );
    pay.renew("pay/1", &held.lease_id)
        .expect("its holder renews it");
    let mine = inv.grant("inv/1", 60_000);
    // Request ids are each identity's own: the same id from another tenant is another request
    // (no request_id_reused naming inv's resource), and from another identity of the same
    // tenant it is not a retry that hands over the lease.
    let Ok(Outcome::Granted(by_id)) = inv.acquire(req("inv/2", "order-123", 60_000, 0)) else {
        panic!("inv/2 is free")
    };
    let Ok(Outcome::Granted(other)) = pay.acquire(req("pay/7", "order-123", 60_000, 0)) else {
        panic!("another tenant's request id is not this one's")
    };
    assert!(pay.release("pay/7", &other.lease_id).released);
    let mut batch = Api::with_token(&lockd, batch_token);
    let Ok(Outcome::Granted(own)) = pay.acquire(req("pay/8", "job-42", 60_000, 0)) else {
        panic!("pay/8 is free")
    };
    let replay = batch.acquire(req("pay/8", "job-42", 60_000, 0));
    assert!(
        matches!(&replay, Ok(Outcome::NotGranted(_))),
        "another identity's replay of a request id is a new try-lock of a held lock: {replay:?}"
    );
    assert!(pay.release("pay/8", &own.lease_id).released);
    assert!(inv.release("inv/2", &by_id.lease_id).released);
    assert_eq!(inv.describe("inv/1").holder, "inv-worker (holder-of-inv/1)");
    // A listing shows each identity its own tenant's locks only.
    let listed = |api: &mut Api| -> Result<Vec<String>, Status> {
        let r = api.call(lockd_proto::v1::ListRequest::default());
        let page = api.rt.block_on(api.rpc.list(r))?.into_inner();
        let mut names: Vec<String> = page.locks.into_iter().map(|l| l.resource).collect();
        names.sort();
        Ok(names)
    };
    assert_eq!(listed(&mut pay).unwrap(), vec!["pay/1".to_string()]);
    assert_eq!(listed(&mut inv).unwrap(), vec!["inv/1".to_string()]);
    let err = listed(&mut anonymous).expect_err("an unknown caller lists nothing");
    assert_refused(&err, Code::Unauthenticated, "unauthenticated");
    // pay's quotas: two leases, one waiter; inv's lease does not count.
    let second = pay.grant("pay/2", 60_000);
    let err = pay
        .acquire(req("pay/3", "", 60_000, 0))
        .expect_err("a third lease");
    assert_refused(&err, Code::ResourceExhausted, "tenant_leases_exhausted");
    assert!(
        err.message()
            .contains("tenant pay holds its maximum of 2 leases"),
        "{err:?}"
    );
    let waiting = pay.queue(req("pay/1", "w1", 60_000, 60_000));
    pay.wait_waiters("pay/1", 1);
    let err = pay
        .acquire(req("pay/2", "w2", 60_000, 60_000))
        .expect_err("a second waiter");
    assert_refused(&err, Code::ResourceExhausted, "tenant_waiters_exhausted");
    assert_eq!(
        pay.describe("pay/2").waiters,
        0,
        "the refused call did not stay queued"
    );
    // A hand-off keeps the tenant at two leases and frees the waiter's place.
    assert!(pay.release("pay/1", &held.lease_id).released);
    let handed = pay.granted(waiting);
    assert!(handed.token > mine.token && handed.token > second.token);
    let again = pay.queue(req("pay/2", "w3", 60_000, 60_000));
    pay.wait_waiters("pay/2", 1);
    assert!(pay.release("pay/2", &second.lease_id).released);
    pay.granted(again);
}
