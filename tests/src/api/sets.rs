//! The suite's check of the atomic AcquireAll: a set granted whole or not at all, on every
//! backend.

use lockd_proto::v1::acquire_all_response::Outcome as SetOutcome;
use lockd_proto::v1::{AcquireAllRequest, AcquireAllResponse, Lease};
use tonic::{Code, Status};

use super::{Api, Backend, WORK_AND_OTHER, assert_refused, policy};

fn set(resources: &[&str], request_id: &str) -> AcquireAllRequest {
    AcquireAllRequest {
        resources: resources.iter().map(|r| r.to_string()).collect(),
        request_id: request_id.to_string(),
        ttl_ms: 60_000,
        holder: "set-holder".to_string(),
    }
}

impl Api {
    fn acquire_all(&mut self, r: AcquireAllRequest) -> Result<AcquireAllResponse, Status> {
        let r = self.call(r);
        Ok(self.rt.block_on(self.rpc.acquire_all(r))?.into_inner())
    }

    /// A set that must be granted, its leases in the order asked.
    fn granted_all(&mut self, r: AcquireAllRequest, what: &str) -> Vec<Lease> {
        let n = r.resources.len();
        match self.acquire_all(r) {
            Ok(AcquireAllResponse {
                outcome: Some(SetOutcome::Granted(s)),
                ..
            }) if s.leases.len() == n => s.leases,
            other => panic!("{what}, not {other:?}"),
        }
    }
}

/// AcquireAll: every member granted, one lease and a rising token each, in the order asked; or,
/// when one is held, nothing at all. A retry of its request id (after a kill -9 too) gets every
/// original lease; another set under the same id is refused; bad sets, and a set with another
/// tenant's resource, are refused before anything is done; the largest set, with the longest
/// names, fits in one commit.
pub fn a_set_is_granted_whole_or_not_at_all(b: &dyn Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (worker, stranger) = (
        "set-worker-0123456789abcdef01234",
        "set-other-0123456789abcdef012345",
    );
    let args = policy(
        dir.path(),
        WORK_AND_OTHER,
        &[("worker", "work", worker), ("stranger", "other", stranger)],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let data = dir.path().join("data");
    let mut lockd = b.start(&data, &args);
    let mut api = Api::with_token(&lockd, worker);

    let held = api.grant("job/b", 60_000);
    let busy = api
        .acquire_all(set(&["job/a", "job/b", "job/c"], "s1"))
        .unwrap();
    match &busy.outcome {
        Some(SetOutcome::NotGranted(ng)) => {
            assert_eq!(
                ng.token, held.token,
                "the busy answer names the holder's token"
            );
            assert_eq!(busy.busy_resource, "job/b", "and which member is held");
        }
        other => panic!("a set with a held member is not granted: {other:?}"),
    }
    for free in ["job/a", "job/c"] {
        assert!(
            !api.describe(free).held,
            "nothing of a busy set is granted: {free}"
        );
    }
    assert!(api.release("job/b", &held.lease_id).released);

    let order = ["job/c", "job/a", "job/b"];
    let leases = api.granted_all(set(&order, "s1"), "a free set is granted");
    let mut last = held.token;
    for (lease, resource) in leases.iter().zip(order) {
        assert!(
            lease.token > last,
            "tokens rise in the order asked: {leases:?}"
        );
        last = lease.token;
        let d = api.describe(resource);
        assert!(
            d.held && d.token == lease.token,
            "{resource} is held by its lease: {d:?}"
        );
    }
    let again = api.granted_all(set(&order, "s1"), "a retried set gets its grants back");
    for (a, l) in again.iter().zip(&leases) {
        assert!(
            a.duplicate && a.held && a.lease_id == l.lease_id && a.token == l.token,
            "{again:?}"
        );
    }
    for other in [
        &["job/c", "job/a"][..],
        &["job/a", "job/c", "job/b"],
        &["job/c", "job/a", "job/b", "job/d"],
    ] {
        let err = api
            .acquire_all(set(other, "s1"))
            .expect_err("another set under the id");
        assert_refused(&err, Code::InvalidArgument, "request_id_reused");
        assert!(
            err.message().contains("\"s1\""),
            "named as the caller spelled it: {err:?}"
        );
    }

    // Bad sets, and another tenant's member, refuse the whole call.
    let many: Vec<String> = (0..33).map(|i| format!("job/m{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let bad = [
        (vec![], "names no resource"),
        (many, "more than the 32"),
        (vec!["job/x", "job/y", "job/x"], "job/x twice"),
        (
            vec!["job/x", "job/bad name"],
            "resources[1]: invalid resource name",
        ),
    ];
    for (resources, needle) in &bad {
        let err = api.acquire_all(set(resources, "")).expect_err("a bad set");
        assert_refused(&err, Code::InvalidArgument, "invalid_argument");
        assert!(err.message().contains(needle), "{needle}: {err:?}");
    }
    let err = api
        .acquire_all(set(&["job/x", "other/x"], ""))
        .expect_err("another tenant's");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(!api.describe("job/x").held, "a refused set grants nothing");

    // The largest set, the longest names: one commit, and it survives a kill -9 whole.
    let alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@";
    let long: Vec<String> = (0..32)
        .map(|i| {
            let tail: String = alphabet.chars().cycle().skip(i).take(252 - 3).collect();
            format!("job/{i:02}-{tail}")
        })
        .collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let mut big = set(&long, &"r".repeat(128));
    big.holder = "h".repeat(128);
    let first = api.granted_all(big.clone(), "32 resources with the longest names");
    drop(api);
    lockd.kill9();
    lockd = b.start(&data, &args);
    let mut api = Api::with_token(&lockd, worker);
    let back = api.granted_all(big, "the set after a kill -9");
    for (a, l) in back.iter().zip(&first) {
        assert!(
            a.duplicate && a.held && a.lease_id == l.lease_id,
            "every lease came back: {back:?}"
        );
    }
    let again = api.granted_all(set(&order, "s1"), "the first set after a kill -9");
    assert!(
        again
            .iter()
            .zip(&leases)
            .all(|(a, l)| a.lease_id == l.lease_id),
        "{again:?}"
    );

    // Each lease is its own: released one by one. Another identity's "s1" is its own request.
    let refs: Vec<(&str, &str)> = order
        .iter()
        .copied()
        .zip(leases.iter().map(|l| l.lease_id.as_str()))
        .collect();
    let released = api.release_many(&refs).unwrap();
    assert!(released.iter().all(|r| r.released), "{released:?}");
    let mut other = Api::with_token(&lockd, stranger);
    let theirs = other.granted_all(set(&["other/a"], "s1"), "another identity's id is its own");
    assert!(!theirs[0].duplicate, "{theirs:?}");
}
