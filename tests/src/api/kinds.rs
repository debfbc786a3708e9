//! The checks of the suite for batched calls and the lock kinds beyond the exclusive lock.

use tonic::Code;

use super::{Api, Backend, WORK_AND_OTHER, assert_refused, busy, owned, policy, req};
use lockd_proto::v1::AcquireRequest;

/// RenewMany and ReleaseMany: each lease served as the single call would, in the order asked;
/// a lease that is not current is that lease's answer; a bad entry, or another tenant's
/// resource, refuses the whole batch before anything is done.
pub fn many_leases_are_renewed_and_released_in_one_call(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let token = "many-0123456789abcdef0123456789a";
    let args = policy(dir.path(), WORK_AND_OTHER, &[("worker", "work", token)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lockd = b.start(&dir.path().join("data"), &args);
    let mut api = Api::with_token(&lockd, token);
    let (a, b_, c) = (
        api.grant("job/a", 60_000),
        api.grant("job/b", 60_000),
        api.grant("job/c", 60_000),
    );
    assert!(api.release("job/c", &c.lease_id).released);
    let waiting = api.queue(req("job/b", "next", 60_000, 60_000));
    api.wait_waiters("job/b", 1);

    let renewed = api
        .renew_many(&[
            ("job/a", &a.lease_id),
            ("job/b", &b_.lease_id),
            ("job/c", &c.lease_id),
        ])
        .expect("a batch of renewals is answered");
    assert!(
        renewed[0].renewed && renewed[1].renewed && renewed[0].ttl_ms == 60_000,
        "current leases are renewed: {renewed:?}"
    );
    assert!(
        !renewed[2].renewed && renewed[2].current_token == 0,
        "a released lease is not renewed, and is only its own answer: {renewed:?}"
    );

    // Bad batches do nothing at all.
    let bad = [
        (vec![], "leases is empty"),
        (
            vec![("job/a", a.lease_id.as_str()), ("job/b", "not-a-lease-id")],
            "leases[1]: lease_id",
        ),
        (
            vec![
                ("job/a", a.lease_id.as_str()),
                ("bad name", b_.lease_id.as_str()),
            ],
            "leases[1]: invalid resource name",
        ),
    ];
    for (leases, needle) in &bad {
        for err in [
            api.release_many(leases).expect_err("a bad batch"),
            api.renew_many(leases).expect_err("a bad batch"),
        ] {
            assert_refused(&err, Code::InvalidArgument, "invalid_argument");
            assert!(err.message().contains(needle), "{needle}: {err:?}");
        }
    }
    let long: Vec<(&str, &str)> = (0..1001).map(|_| ("job/a", a.lease_id.as_str())).collect();
    let err = api.release_many(&long).expect_err("1001 leases");
    assert_refused(&err, Code::InvalidArgument, "invalid_argument");
    assert!(err.message().contains("limit is 1000"), "{err:?}");
    let foreign = [
        ("job/a", a.lease_id.as_str()),
        ("other/x", a.lease_id.as_str()),
    ];
    for err in [
        api.release_many(&foreign)
            .expect_err("another tenant's resource"),
        api.renew_many(&foreign)
            .expect_err("another tenant's resource"),
    ] {
        assert_refused(&err, Code::PermissionDenied, "permission_denied");
    }
    let d = api.describe("job/a");
    assert!(
        d.held && d.token == a.token,
        "no refused batch released job/a: {d:?}"
    );
    // The largest valid batch fits in a message: 1000 entries, names at their 256 bytes.
    let longest = format!("job/{}", "n".repeat(fencing::RESOURCE_NAME_LEN_MAX - 4));
    let l = api.granted_now(
        AcquireRequest {
            holder: "worker".to_string(),
            ..req(&longest, "", 60_000, 0)
        },
        "a free lock",
    );
    let full: Vec<(&str, &str)> = (0..1000)
        .map(|_| (longest.as_str(), l.lease_id.as_str()))
        .collect();
    let renewed = api.renew_many(&full).expect("a full batch is answered");
    assert!(
        renewed.len() == 1000 && renewed.iter().all(|r| r.renewed),
        "every entry of a full batch is renewed"
    );
    assert!(api.release_many(&full).expect("a full batch")[0].released);

    let released = api
        .release_many(&[
            ("job/a", &a.lease_id),
            ("job/b", &b_.lease_id),
            ("job/b", &b_.lease_id),
            ("job/c", &c.lease_id),
        ])
        .expect("a batch of releases is answered");
    let flags: Vec<bool> = released.iter().map(|r| r.released).collect();
    assert_eq!(
        flags,
        [true, true, false, false],
        "each lease is released once, in the order asked: {released:?}"
    );
    let next = api.granted(waiting);
    assert!(
        next.token > b_.token && next.token > c.token,
        "the waiter was handed job/b with a new token"
    );
    assert_eq!(
        released[2].current_token, next.token,
        "the repeated release sees the waiter's new lease"
    );
    assert!(!api.describe("job/a").held, "job/a is free");
    assert!(
        !api.renew_many(&[("job/a", &a.lease_id)]).unwrap()[0].renewed,
        "a released lease is not renewed"
    );
}

/// A reentrant lease: its owner acquires it again and gets the same lease and token with one
/// more hold, a retry of that re-entry is not counted twice, others are busy, each release
/// ends one hold, the holds survive a kill -9 (a re-entry is answered once durable), and with
/// a policy an owner is the identity's own.
pub fn a_reentrant_owner_holds_the_lease_as_often_as_it_acquired_it(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let mut lockd = b.start(&dir.path().join("data"), &[]);
    let first = {
        let mut api = Api::new(&lockd);
        let first = api.granted_now(owned("nest", "", "o1"), "a free lock");
        assert_eq!(first.holds, 1, "{first:?}");
        let inner = api.granted_now(owned("nest", "in-1", "o1"), "its owner re-enters");
        assert_eq!(
            (&inner.lease_id, inner.token, inner.holds, inner.duplicate),
            (&first.lease_id, first.token, 2, false),
            "the same lease, one more hold"
        );
        let retry = api.granted_now(owned("nest", "in-1", "o1"), "a retried re-entry");
        assert_eq!(
            (retry.holds, retry.duplicate),
            (2, true),
            "a retried re-entry is not counted twice"
        );
        for other in [owned("nest", "", "o2"), req("nest", "", 60_000, 0)] {
            let ng = busy(api.acquire(other));
            assert_eq!(ng.token, first.token, "another owner, or none, is busy");
        }
        let third = api.granted_now(owned("nest", "", "o1"), "a third hold");
        assert_eq!(third.holds, 3);
        let d = api.describe("nest");
        assert!(d.held && d.holds == 3 && d.token == first.token, "{d:?}");
        let r = api.release("nest", &first.lease_id);
        assert!(r.released && r.holds == 2, "one hold ended: {r:?}");
        first
    };
    lockd.kill9();
    let lockd = b.start(&dir.path().join("data"), &[]);
    {
        let mut api = Api::new(&lockd);
        // The release of a hold may be lost in a crash (it costs waiting, not safety), an
        // answered re-entry never.
        let d = api.describe("nest");
        assert!(d.held && d.token == first.token, "{d:?}");
        assert!(d.holds == 2 || d.holds == 3, "holds after a kill -9: {d:?}");
        // A re-entry's request id is remembered as a grant's is: across the restart, ...
        let retry = api.granted_now(owned("nest", "in-1", "o1"), "a re-entry retried");
        assert!(
            retry.duplicate && retry.held && retry.holds == d.holds,
            "{retry:?}"
        );
        for left in (0..d.holds).rev() {
            let r = api.release("nest", &first.lease_id);
            assert!(r.released && r.holds == left, "{left} left: {r:?}");
        }
        assert!(
            !api.describe("nest").held,
            "the last release ended the lease"
        );
        // ... after the lease has ended (no new lease for a late retry), and for one resource.
        let late = api.granted_now(owned("nest", "in-1", "o1"), "a late re-entry retried");
        assert!(
            late.duplicate && !late.held && late.token == first.token,
            "{late:?}"
        );
        let err = api
            .acquire(req("elsewhere", "in-1", 60_000, 0))
            .expect_err("a re-entry's request id is bound to its resource");
        assert_refused(&err, Code::InvalidArgument, "request_id_reused");
        assert!(
            err.message()
                .contains(r#""in-1" was already used to acquire nest"#),
            "named as the caller spelled it: {err:?}"
        );
        let again = api.granted_now(owned("nest", "", "o1"), "free again");
        assert!(again.token > first.token && again.holds == 1, "{again:?}");
        let err = api
            .acquire(owned("nest", "", "has space"))
            .expect_err("a bad owner");
        assert_refused(&err, Code::InvalidArgument, "invalid_argument");
        assert!(err.message().contains("owner"), "{err:?}");
        // Spelled as a policy's identity `a` would spell its owner and request id, for the
        // restart with a policy below.
        let anon = api.granted_now(owned("team/y", "a/r1", "a/shared"), "a free lock");
        assert_eq!(anon.holds, 1);
    }
    drop(lockd);

    // With a policy, the same owner string from another identity is another owner.
    let (a, b_) = (
        "team-a-0123456789abcdef012345678",
        "team-b-0123456789abcdef012345678",
    );
    let args = policy(
        dir.path(),
        "[[tenant]]\nname = \"team\"\nprefixes = [\"team/\"]\n",
        &[("a", "team", a), ("b", "team", b_)],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lockd = b.start(&dir.path().join("data"), &args);
    let (mut ia, mut ib) = (Api::with_token(&lockd, a), Api::with_token(&lockd, b_));
    let held = ia.granted_now(owned("team/x", "r2", "shared"), "a free lock");
    let ng = busy(ib.acquire(owned("team/x", "", "shared")));
    assert_eq!(
        ng.token, held.token,
        "b cannot re-enter a's lease by naming its owner"
    );
    let inner = ia.granted_now(owned("team/x", "", "shared"), "a re-enters");
    assert_eq!((&inner.lease_id, inner.holds), (&held.lease_id, 2));
    // An owner or request id is the identity's own across a change of policy too: what an
    // anonymous caller named `a/shared` and `a/r1` is not identity a's `shared` and `r1`.
    for (request_id, owner) in [("", "shared"), ("r1", "shared"), ("r1", "")] {
        let ng = busy(ia.acquire(owned("team/y", request_id, owner)));
        assert!(
            ng.token < held.token,
            "the anonymous lease is not a's ({request_id:?}, {owner:?})"
        );
    }
    drop((ia, ib));
    drop(lockd);
    let lockd = b.start(&dir.path().join("data"), &[]);
    let mut api = Api::new(&lockd);
    for (request_id, owner) in [("", "a/shared"), ("a/r2", "a/shared")] {
        let ng = busy(api.acquire(owned("team/x", request_id, owner)));
        assert_eq!(
            ng.token, held.token,
            "without the policy, no one is identity a ({request_id:?}, {owner:?})"
        );
    }
}
