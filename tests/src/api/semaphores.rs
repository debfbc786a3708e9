//! The check of the suite for semaphores.

use tonic::Code;

use super::{Api, Backend, assert_refused, busy, req, two_tenants};
use lockd_proto::v1::{AcquireAllRequest, AcquireRequest};

/// `req` for one of the `n` permits of `semaphore`.
fn permit(semaphore: &str, request_id: &str, n: u32, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        permits: n,
        holder: "worker".to_string(),
        ..req(semaphore, request_id, 60_000, wait_ms)
    }
}

/// A semaphore of N: at most N permits at once, each a lease with its own token on its own
/// name (renewed, released and described under it, and its semaphore's tenant's); the next
/// caller is busy or waits in FIFO order and gets the permit that frees; a name is one kind
/// at a time and every caller asks with the same N; N and a retried request id's permit
/// survive a kill -9.
pub fn a_semaphore_grants_at_most_n_permits_each_a_lease_of_its_own(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (token, outsider) = (
        "sem-worker-0123456789abcdef01234",
        "sem-outsider-0123456789abcdef012",
    );
    let (mut lockd, args) = two_tenants(b, dir.path(), (token, outsider));
    let mut api = Api::with_token(&lockd, token);
    let first = api.granted_now(permit("job/pool", "", 2, 0), "a free permit");
    let second = api.granted_now(permit("job/pool", "sem-q2", 2, 0), "the other permit");
    assert_eq!(
        (first.resource.as_str(), second.resource.as_str()),
        ("job/pool@permit-1", "job/pool@permit-2"),
        "each permit is a lease on its own name, the lowest free first"
    );
    assert!(second.token > first.token, "each permit has its own token");
    let full = busy(api.acquire(permit("job/pool", "", 2, 0)));
    assert_eq!(
        full.token, first.token,
        "busy names the permit that ends first"
    );
    let waiting = api.queue(permit("job/pool", "", 2, 60_000));
    api.wait_waiters("job/pool", 1);
    let d = api.describe("job/pool");
    assert!(
        !d.held && d.permits == 2 && d.permits_held == 2 && d.waiters == 1,
        "the semaphore in use: {d:?}"
    );
    assert_eq!(api.describe("job/pool@permit-2").token, second.token);

    // One kind per name, one N per semaphore, and the permits' names are lockd's to hand out.
    let refusals = [
        (
            req("job/pool", "", 60_000, 0),
            Code::FailedPrecondition,
            "kind_mismatch",
        ),
        (
            permit("job/pool", "", 3, 0),
            Code::FailedPrecondition,
            "permits_mismatch",
        ),
        (
            req("job/pool@permit-1", "", 60_000, 0),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            req("job/pool@permit-01", "", 60_000, 0),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            permit("job/other", "", 1001, 0),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            AcquireRequest {
                owner: "o".to_string(),
                ..permit("job/other", "", 2, 0)
            },
            Code::InvalidArgument,
            "invalid_argument",
        ),
    ];
    for (r, grpc, lockd_code) in refusals {
        let what = format!("{} permits={} owner={:?}", r.resource, r.permits, r.owner);
        let err = api.acquire(r).expect_err(&what);
        assert_refused(&err, grpc, lockd_code);
    }
    // The semaphore's own name is no lease: renewing or releasing under it is refused, and
    // the permit is untouched.
    let err = api
        .renew("job/pool", &first.lease_id)
        .expect_err("a renewal under the semaphore's name");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    assert!(err.message().contains("job/pool@permit-K"), "{err:?}");
    let err = api
        .try_release("job/pool", &first.lease_id)
        .expect_err("a release under the semaphore's name");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    assert_eq!(api.describe("job/pool@permit-1").token, first.token);
    let lock = api.grant("job/lock", 60_000);
    let err = api
        .acquire(permit("job/lock", "", 2, 0))
        .expect_err("a held lock asked for as a semaphore");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    let set = AcquireAllRequest {
        resources: vec!["job/free".to_string(), "job/pool".to_string()],
        holder: "worker".to_string(),
        ..Default::default()
    };
    let err = api
        .rt
        .block_on(api.rpc.clone().acquire_all(api.call(set)))
        .expect_err("a semaphore in a set of locks");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    assert!(!api.describe("job/free").held, "a refused set took nothing");
    assert!(api.release("job/lock", &lock.lease_id).released);

    // A permit is its semaphore's tenant's, whatever its name looks like.
    let mut other = Api::with_token(&lockd, outsider);
    for err in [
        other
            .try_describe("job/pool@permit-1")
            .expect_err("another tenant's permit"),
        other
            .try_release("job/pool@permit-1", &first.lease_id)
            .expect_err("another tenant's permit"),
    ] {
        assert_refused(&err, Code::PermissionDenied, "permission_denied");
    }

    // The permit that frees goes to the waiter, with a new token.
    assert!(api.renew("job/pool@permit-2", &second.lease_id).is_ok());
    assert!(api.release("job/pool@permit-1", &first.lease_id).released);
    let third = api.granted(waiting);
    assert_eq!(third.resource, "job/pool@permit-1");
    assert!(third.token > second.token);

    // N and the permits survive a kill -9; a retry gets its own permit back.
    lockd.kill9();
    drop(lockd);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lockd = b.start(&dir.path().join("data"), &args);
    let mut api = Api::with_token(&lockd, token);
    let err = api
        .acquire(permit("job/pool", "", 3, 0))
        .expect_err("N survives a restart");
    assert_refused(&err, Code::FailedPrecondition, "permits_mismatch");
    let d = api.describe("job/pool");
    assert!(
        d.permits == 2 && d.permits_held == 2,
        "after a kill -9: {d:?}"
    );
    let again = api.granted_now(permit("job/pool", "sem-q2", 2, 0), "a retry");
    assert!(
        again.duplicate
            && again.held
            && again.lease_id == second.lease_id
            && again.resource == "job/pool@permit-2",
        "a retry gets its permit back: {again:?}"
    );
    let full = busy(api.acquire(permit("job/pool", "", 2, 0)));
    assert!(full.token == second.token || full.token == third.token);
}
