//! What every replicated store (over etcd, ZooKeeper, Redis) must keep beside the Store
//! conformance suite: a deposed leader's batch, a late batch of the same term, and a batch
//! after the term ended by the leader's own clock change nothing.

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Op};
use lockd_store::conformance::Harness;
use lockd_store::{Store, StoreError};

/// A replicated store's harness: `open` starts a new term (ending the current one).
pub trait Replicated: Harness {
    /// Ends the current term as its leadership's end would (its stores stay around).
    fn end_term(&mut self);
    /// Another store of the current term, not loaded yet.
    fn another_store(&mut self) -> Self::S;
    /// Ends the current term by the leader's own clock, saying `why`, while the service
    /// still holds its leadership.
    fn end_by_clock(&mut self, why: &str);
}

/// A lease record of `resource` with token `token` (its lease id, holder and request id made
/// from the token).
pub fn record(resource: &str, token: u64) -> LeaseRecord {
    LeaseRecord {
        resource: ResourceName::new(resource).unwrap(),
        lease_id: LeaseId::from_bytes([token as u8; 16]),
        token: FencingToken::new(token).unwrap(),
        holder: format!("h{token}"),
        ttl_ms: 5_000,
        request_id: Some(format!("q{token}")),
        reentrant: None,
        permits: None,
        rw: None,
    }
}

pub fn a_deposed_leaders_batch_is_refused_and_changes_nothing<H: Replicated>(mut h: H) {
    let mut old = h.open();
    old.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    // The old leader's leadership ends (it was paused, say); another instance leads.
    h.end_term();
    let mut new = h.open();
    let err = old
        .commit(&[Op::Grant(record("b", 2))], true)
        .expect_err("a deposed leader's batch must be refused");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
    let snap = new.load().unwrap();
    assert_eq!(snap.leases, vec![record("a", 1)]);
    assert_eq!(snap.last_token, FencingToken::new(1));
}

/// A batch whose answer was lost may be attempted again later; a store that has not seen the
/// term's last batch stands for that late attempt: it must change nothing.
pub fn a_batch_built_before_the_terms_last_commit_changes_nothing<H: Replicated>(mut h: H) {
    let mut store = h.open();
    store.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    // Built before the next grant commits: a release of the lease the batch above granted
    // (as a delayed attempt of an earlier release would delete a later grant's record).
    let mut late = h.another_store();
    late.load().unwrap();
    let remove = Op::Remove {
        resource: ResourceName::new("a").unwrap(),
        lease_id: record("a", 1).lease_id,
    };
    store.commit(&[Op::Grant(record("b", 2))], true).unwrap();
    let err = late
        .commit(&[remove], false)
        .expect_err("a batch built before the term's last commit must not land");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
    // Both grants stand, and the first store goes on committing.
    store.commit(&[Op::Grant(record("c", 3))], true).unwrap();
    let snap = h.open().load().unwrap();
    let mut leases = snap.leases;
    leases.sort_by(|x, y| x.resource.cmp(&y.resource));
    assert_eq!(leases, vec![record("a", 1), record("b", 2), record("c", 3)]);
}

pub fn a_term_ended_by_its_own_clock_commits_nothing<H: Replicated>(mut h: H) {
    let mut store = h.open();
    store.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    h.end_by_clock("a pause past the leadership's timeout (test)");
    let err = store
        .commit(&[Op::Grant(record("b", 2))], true)
        .expect_err("a batch after the term ended must be refused");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
    assert!(err.to_string().contains("(test)"), "{err}");
}

/// Instantiates the checks as `#[test]`s, each with a fresh harness from `$make`.
#[macro_export]
macro_rules! replicated_store_tests {
    ($make:expr) => {
        $crate::replicated_store_tests!(@each $make;
            a_deposed_leaders_batch_is_refused_and_changes_nothing,
            a_batch_built_before_the_terms_last_commit_changes_nothing,
            a_term_ended_by_its_own_clock_commits_nothing
        );
    };
    (@each $make:expr; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                $crate::replicated::$check($make);
            }
        )*
    };
}
