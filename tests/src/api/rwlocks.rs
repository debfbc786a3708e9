//! The check of the suite for read-write locks.

use tonic::Code;

use super::{Api, Backend, assert_refused, busy, req, two_tenants};
use lockd_proto::v1::AcquireRequest;
use lockd_proto::v1::acquire_request::Mode;

/// `req` for a side of the read-write lock `lock`.
fn side(lock: &str, mode: Mode, request_id: &str, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        mode: mode as i32,
        holder: "worker".to_string(),
        ..req(lock, request_id, 60_000, wait_ms)
    }
}

/// A read-write lock: readers share it, each a lease with its own token on its own slot; a
/// writer waits behind them and readers that come after it wait behind the writer (one FIFO
/// queue); the writer is granted alone when the last reader leaves, and the readers behind it
/// together when it leaves; a downgrade trades the write lease for a read lease with nobody in
/// between; a name is one kind at a time, readers use their slots' names, and a writer is still
/// a writer after a kill -9.
pub fn a_read_write_lock_shares_readers_and_keeps_a_waiting_writer_first(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (token, outsider) = (
        "rw-worker-0123456789abcdef012345",
        "rw-outsider-0123456789abcdef0123",
    );
    let (mut lockd, args) = two_tenants(b, dir.path(), (token, outsider));
    let mut api = Api::with_token(&lockd, token);
    let r1 = api.granted_now(side("job/doc", Mode::Read, "", 0), "a free lock, read");
    let r2 = api.granted_now(side("job/doc", Mode::Read, "rw-q2", 0), "a second reader");
    assert_eq!(
        (r1.resource.as_str(), r2.resource.as_str()),
        ("job/doc@read-1", "job/doc@read-2"),
        "each reader is a lease on its own slot"
    );
    assert!(r2.token > r1.token, "each reader has its own token");
    let w = busy(api.acquire(side("job/doc", Mode::Write, "", 0)));
    assert_eq!(w.token, r1.token, "busy names the reader that ends first");
    let writer = api.queue(side("job/doc", Mode::Write, "rw-w", 60_000));
    api.wait_waiters("job/doc", 1);
    // Its request id waits as the writer: asked again as a reader, it is refused, and the
    // message spells the id as the caller did (not as lockd keeps it, under the identity).
    let err = api
        .acquire(side("job/doc", Mode::Read, "rw-w", 0))
        .expect_err("a writer's waiting request id sent as a read");
    assert_refused(&err, Code::InvalidArgument, "request_id_reused");
    assert!(
        err.message()
            .contains("\"rw-w\" is waiting for job/doc as its writer"),
        "{err:?}"
    );
    // A reader after the waiting writer does not overtake it.
    let late = busy(api.acquire(side("job/doc", Mode::Read, "", 0)));
    assert_eq!(late.waiters, 1, "{late:?}");
    let reader3 = api.queue(side("job/doc", Mode::Read, "", 60_000));
    let reader4 = api.queue(side("job/doc", Mode::Read, "", 60_000));
    api.wait_waiters("job/doc", 3);
    let d = api.describe("job/doc");
    assert!(
        !d.held && d.read_write && d.readers == 2 && d.waiters == 3,
        "held by readers: {d:?}"
    );
    assert_eq!(api.describe("job/doc@read-2").token, r2.token);

    // Readers use their slots' names; the lock's name is no lease while they hold it.
    let err = api
        .renew("job/doc", &r1.lease_id)
        .expect_err("a renewal under the lock's name");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    assert!(
        err.message().contains("job/doc@read-1"),
        "names its slot: {err:?}"
    );
    let err = api
        .try_release("job/doc", &r1.lease_id)
        .expect_err("a release under the lock's name");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    // Any other lease id under the lock's name is a lease that is not current, as anywhere.
    let stale = "0123456789abcdef0123456789abcdef";
    assert!(!api.release("job/doc", stale).released);
    let err = api
        .renew("job/doc", stale)
        .expect_err("a lease that is not current");
    assert_refused(&err, Code::FailedPrecondition, "lease_not_current");
    assert_eq!(
        api.describe("job/doc@read-1").waiters,
        3,
        "a reader's waiters are its lock's"
    );
    // One kind per name; the slots' names are lockd's; fields that do not go with a mode.
    let refusals = [
        (
            req("job/doc", "", 60_000, 0),
            Code::FailedPrecondition,
            "kind_mismatch",
        ),
        (
            AcquireRequest {
                permits: 2,
                ..req("job/doc", "", 60_000, 0)
            },
            Code::FailedPrecondition,
            "kind_mismatch",
        ),
        (
            req("job/doc@read-1", "", 60_000, 0),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            side("job/doc@read-01", Mode::Read, "", 0),
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            AcquireRequest {
                owner: "o".to_string(),
                ..side("job/other", Mode::Write, "", 0)
            },
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            AcquireRequest {
                mode: 7,
                ..side("job/other", Mode::Read, "", 0)
            },
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            AcquireRequest {
                downgrade_lease_id: r1.lease_id.clone(),
                ..side("job/doc", Mode::Write, "", 0)
            },
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            AcquireRequest {
                downgrade_lease_id: "not-a-lease".to_string(),
                ..side("job/doc", Mode::Read, "", 0)
            },
            Code::InvalidArgument,
            "invalid_argument",
        ),
        (
            AcquireRequest {
                downgrade_lease_id: r1.lease_id.clone(),
                ..side("job/doc", Mode::Read, "", 0)
            },
            Code::FailedPrecondition,
            "lease_not_current",
        ),
    ];
    for (r, grpc, lockd_code) in refusals {
        let what = format!("{} mode={} {:?}", r.resource, r.mode, r.downgrade_lease_id);
        let err = api.acquire(r).expect_err(&what);
        assert_refused(&err, grpc, lockd_code);
    }
    let lock = api.grant("job/lock", 60_000);
    let err = api
        .acquire(side("job/lock", Mode::Read, "", 0))
        .expect_err("a held lock asked for as a read-write lock");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    let excl = api.granted_now(req("job/excl", "rw-x", 60_000, 0), "an exclusive lock");
    let err = api
        .acquire(side("job/excl", Mode::Write, "rw-x", 0))
        .expect_err("an exclusive lock's request id sent as a write");
    assert_refused(&err, Code::InvalidArgument, "request_id_reused");
    assert!(
        err.message()
            .contains("\"rw-x\" was already used for job/excl as an exclusive lock"),
        "{err:?}"
    );
    assert!(api.release("job/excl", &excl.lease_id).released);
    assert!(api.release("job/lock", &lock.lease_id).released);
    // A reader is its lock's tenant's.
    let mut other = Api::with_token(&lockd, outsider);
    let err = other
        .try_release("job/doc@read-1", &r1.lease_id)
        .expect_err("another tenant's reader");
    assert_refused(&err, Code::PermissionDenied, "permission_denied");

    // The last reader leaves: the writer gets it, alone; then both readers behind it.
    assert!(api.release("job/doc@read-1", &r1.lease_id).released);
    assert!(api.describe("job/doc").waiters == 3, "one reader left");
    assert!(api.release("job/doc@read-2", &r2.lease_id).released);
    let w = api.granted(writer);
    assert_eq!(w.resource, "job/doc");
    assert!(w.token > r2.token, "a write grant gets a new token");
    let d = api.describe("job/doc");
    assert!(
        d.held && d.readers == 0 && d.waiters == 2,
        "the writer: {d:?}"
    );

    // A writer is still a writer after a kill -9 (the readers' waits end with the old lockd).
    lockd.kill9();
    drop(lockd);
    let _ = (reader3, reader4);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lockd = b.start(&dir.path().join("data"), &args);
    let mut api = Api::with_token(&lockd, token);
    let d = api.describe("job/doc");
    assert!(
        d.held && d.read_write && d.token == w.token,
        "after a kill -9: {d:?}"
    );
    let err = api
        .acquire(req("job/doc", "", 60_000, 0))
        .expect_err("the writer's lock asked for as a lock");
    assert_refused(&err, Code::FailedPrecondition, "kind_mismatch");
    let reader = api.queue(side("job/doc", Mode::Read, "", 60_000));
    api.wait_waiters("job/doc", 1);

    // The writer downgrades: a reader's lease at once, and the waiting reader joins it.
    let down = api.granted_now(
        AcquireRequest {
            downgrade_lease_id: w.lease_id.clone(),
            ..side("job/doc", Mode::Read, "rw-down", 0)
        },
        "a downgrade",
    );
    assert_eq!(down.resource, "job/doc@read-1");
    assert!(down.token > w.token);
    let joined = api.granted(reader);
    assert_eq!(joined.resource, "job/doc@read-2");
    let again = api.granted_now(
        AcquireRequest {
            downgrade_lease_id: w.lease_id.clone(),
            ..side("job/doc", Mode::Read, "rw-down", 0)
        },
        "a retried downgrade",
    );
    assert!(
        again.duplicate && again.lease_id == down.lease_id,
        "a retry gets the reader's lease back: {again:?}"
    );
    let d = api.describe("job/doc");
    assert!(!d.held && d.readers == 2, "two readers: {d:?}");
}
