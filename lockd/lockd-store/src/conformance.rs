//! The behaviour every [`Store`] must show, as a suite each implementation runs.
//!
//! An implementation provides a [`Harness`] (how to open its data, and how to close it as a
//! crash would) and instantiates the suite in its tests with
//! [`conformance_tests!`](crate::conformance_tests):
//!
//! ```text
//! lockd_store::conformance_tests!(MyHarness::new());
//! ```
//!
//! Each check is also a public function, for stores whose tests need a custom setup. A check
//! panics with a message naming the broken rule.

use std::collections::BTreeMap;

use fencing::{FencingToken, LeaseId, RESOURCE_NAME_LEN_MAX, ResourceName};
use lockd_core::{LeaseRecord, Op, Reentrant, RwRole, Snapshot};

use crate::{Store, StoreError};

/// How the suite reaches one implementation.
pub trait Harness {
    type S: Store;
    /// Opens the store on the harness's data: empty the first time, the same data later.
    fn open(&mut self) -> Self::S;
    /// Closes the store the way a crash would: nothing is flushed.
    fn crash(&mut self, store: Self::S);
}

/// Instantiates every check of the suite as a `#[test]`, each with a fresh harness from `$make`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            new_store_is_empty,
            grants_survive_reopen,
            high_water_survives_removal_of_every_lease,
            remove_and_forget_take_effect,
            grant_of_a_held_resource_is_refused_and_the_batch_is_atomic,
            tokens_must_rise,
            removal_of_another_lease_is_refused,
            forgetting_an_unknown_request_is_refused,
            remove_then_grant_in_one_batch,
            synced_batches_survive_a_crash,
            a_sync_makes_earlier_lazy_batches_durable,
            longest_fields_round_trip,
            reentrant_holds_are_stored,
            permits_keep_their_semaphores_number,
            read_write_leases_keep_their_side,
            an_atomic_set_lands_whole_or_not_at_all,
            random_history_matches_a_model
        );
    };
    (@each $make:expr; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                let mut harness = $make;
                $crate::conformance::$check(&mut harness);
            }
        )*
    };
}

// ---- helpers ---------------------------------------------------------------------------------

fn res(name: &str) -> ResourceName {
    ResourceName::new(name).expect("valid test resource name")
}

fn lid(n: u64) -> LeaseId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_be_bytes());
    b[8] = 0xa5;
    LeaseId::from_bytes(b)
}

fn tok(n: u64) -> FencingToken {
    FencingToken::new(n).expect("valid test token")
}

fn rec(resource: &str, token: u64, request_id: Option<&str>) -> LeaseRecord {
    LeaseRecord {
        resource: res(resource),
        lease_id: lid(token),
        token: tok(token),
        holder: format!("holder-{token}"),
        ttl_ms: 1_000 + token,
        request_id: request_id.map(str::to_string),
        reentrant: None,
        permits: None,
        rw: None,
    }
}

/// A reentrant lease's record, held `holds` times.
fn owned(resource: &str, token: u64, holds: u32) -> LeaseRecord {
    LeaseRecord {
        reentrant: Some(Reentrant {
            owner: format!("owner-{token}"),
            holds,
        }),
        ..rec(resource, token, None)
    }
}

fn reenter(resource: &str, token: u64, holds: u32, request_id: Option<&str>) -> Op {
    Op::Reenter {
        resource: res(resource),
        lease_id: lid(token),
        holds,
        request_id: request_id.map(str::to_string),
    }
}

fn unhold(resource: &str, token: u64, holds: u32) -> Op {
    Op::Unhold {
        resource: res(resource),
        lease_id: lid(token),
        holds,
    }
}

fn grant(resource: &str, token: u64, request_id: Option<&str>) -> Op {
    Op::Grant(rec(resource, token, request_id))
}

/// A grant for other tests: resource `r<n>`, token `n`, request id `q<n>`.
pub fn sample_grant(n: u64) -> Op {
    grant(&format!("r{n}"), n, Some(&format!("q{n}")))
}

/// The removal of [`sample_grant`]`(n)`'s lease.
pub fn sample_remove(n: u64) -> Op {
    remove(&format!("r{n}"), n)
}

fn remove(resource: &str, token: u64) -> Op {
    Op::Remove {
        resource: res(resource),
        lease_id: lid(token),
    }
}

fn forget(request_id: &str) -> Op {
    Op::ForgetRequest {
        request_id: request_id.to_string(),
    }
}

/// A snapshot in a canonical order, for comparisons.
fn canonical(mut s: Snapshot) -> Snapshot {
    s.leases.sort_by(|a, b| a.resource.cmp(&b.resource));
    s.requests.sort_by(|a, b| a.request_id.cmp(&b.request_id));
    s
}

fn load<S: Store>(store: &mut S) -> Snapshot {
    canonical(store.load().expect("load"))
}

fn commit<S: Store>(store: &mut S, ops: &[Op], sync: bool) {
    store
        .commit(ops, sync)
        .unwrap_or_else(|e| panic!("commit of {ops:?} failed: {e}"));
}

fn reopen<H: Harness>(h: &mut H, store: H::S) -> H::S {
    drop(store);
    h.open()
}

// ---- the checks ------------------------------------------------------------------------------

/// A new store holds nothing and has issued no token.
pub fn new_store_is_empty<H: Harness>(h: &mut H) {
    let mut s = h.open();
    assert_eq!(
        load(&mut s),
        Snapshot::default(),
        "a new store must be empty"
    );
}

/// Granted leases, their request ids and the high-water come back after a reopen.
pub fn grants_survive_reopen<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(
        &mut s,
        &[grant("a", 1, Some("req-a")), grant("b", 2, None)],
        true,
    );
    commit(&mut s, &[grant("c", 5, Some("req-c"))], true);
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    assert_eq!(
        snap.last_token,
        Some(tok(5)),
        "the high-water is the highest granted token"
    );
    assert_eq!(
        snap.leases,
        vec![
            rec("a", 1, Some("req-a")),
            rec("b", 2, None),
            rec("c", 5, Some("req-c"))
        ]
    );
    assert_eq!(
        snap.requests,
        vec![rec("a", 1, Some("req-a")), rec("c", 5, Some("req-c"))]
    );
}

/// Removing every lease never lowers the high-water (invariant 2 across restarts).
pub fn high_water_survives_removal_of_every_lease<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(&mut s, &[grant("a", 7, None)], true);
    commit(&mut s, &[remove("a", 7)], true);
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    assert!(snap.leases.is_empty());
    assert_eq!(
        snap.last_token,
        Some(tok(7)),
        "the high-water must outlive the leases"
    );
    let refused = s.commit(&[grant("a", 7, None)], true);
    assert!(
        matches!(refused, Err(StoreError::TokenNotIncreasing { .. })),
        "token 7 reused: {refused:?}"
    );
}

/// Remove deletes the lease (not its request id); forget deletes the request id.
pub fn remove_and_forget_take_effect<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(
        &mut s,
        &[grant("a", 1, Some("q1")), grant("b", 2, Some("q2"))],
        true,
    );
    commit(&mut s, &[remove("a", 1)], true);
    let snap = load(&mut s);
    assert_eq!(snap.leases, vec![rec("b", 2, Some("q2"))]);
    assert_eq!(
        snap.requests.len(),
        2,
        "a removed lease's request id is still remembered"
    );
    commit(&mut s, &[forget("q1")], true);
    let mut s = reopen(h, s);
    assert_eq!(load(&mut s).requests, vec![rec("b", 2, Some("q2"))]);
}

/// A grant of a resource that has a stored lease is refused, and nothing of its batch lands.
pub fn grant_of_a_held_resource_is_refused_and_the_batch_is_atomic<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(&mut s, &[grant("a", 1, None)], true);
    let before = load(&mut s);
    let refused = s.commit(
        &[
            grant("b", 2, Some("q")),
            remove("a", 1),
            grant("c", 3, None),
            grant("c", 4, None),
        ],
        true,
    );
    assert!(
        matches!(refused, Err(StoreError::GrantWhileHeld { .. })),
        "second grant of c: {refused:?}"
    );
    assert_eq!(load(&mut s), before, "a refused batch must change nothing");
    let mut s = reopen(h, s);
    assert_eq!(
        load(&mut s),
        before,
        "a refused batch must change nothing, on disk either"
    );
}

/// Tokens must rise strictly, within a batch and across batches.
pub fn tokens_must_rise<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(&mut s, &[grant("a", 10, None)], true);
    for (ops, what) in [
        (vec![grant("b", 10, None)], "an equal token"),
        (vec![grant("b", 9, None)], "a lower token"),
        (
            vec![grant("b", 12, None), grant("c", 11, None)],
            "a lower token later in the batch",
        ),
    ] {
        let refused = s.commit(&ops, true);
        assert!(
            matches!(refused, Err(StoreError::TokenNotIncreasing { .. })),
            "{what}: {refused:?}"
        );
    }
    assert_eq!(load(&mut s).last_token, Some(tok(10)));
}

/// Only the stored lease of a resource can be removed.
pub fn removal_of_another_lease_is_refused<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(&mut s, &[grant("a", 1, None)], true);
    let refused = s.commit(&[remove("a", 2)], true);
    assert!(
        matches!(refused, Err(StoreError::RemoveNotStored { .. })),
        "stale lease id: {refused:?}"
    );
    let refused = s.commit(&[remove("zzz", 1)], true);
    assert!(
        matches!(refused, Err(StoreError::RemoveNotStored { .. })),
        "unheld resource: {refused:?}"
    );
    assert_eq!(load(&mut s).leases, vec![rec("a", 1, None)]);
}

/// Forgetting needs a remembered request id; remembering one twice is refused.
pub fn forgetting_an_unknown_request_is_refused<H: Harness>(h: &mut H) {
    let mut s = h.open();
    let refused = s.commit(&[forget("never")], true);
    assert!(
        matches!(refused, Err(StoreError::ForgetUnknown { .. })),
        "{refused:?}"
    );
    commit(&mut s, &[grant("a", 1, Some("q"))], true);
    let refused = s.commit(&[grant("b", 2, Some("q"))], true);
    assert!(
        matches!(refused, Err(StoreError::RequestRemembered { .. })),
        "{refused:?}"
    );
    commit(&mut s, &[forget("q"), grant("b", 2, Some("q"))], true);
    assert_eq!(load(&mut s).requests, vec![rec("b", 2, Some("q"))]);
}

/// A hand-off is a removal and a grant of the same resource in one batch.
pub fn remove_then_grant_in_one_batch<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(&mut s, &[grant("a", 1, None)], true);
    commit(
        &mut s,
        &[
            remove("a", 1),
            grant("a", 2, None),
            remove("a", 2),
            grant("a", 3, None),
        ],
        true,
    );
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    assert_eq!(snap.leases, vec![rec("a", 3, None)]);
    assert_eq!(snap.last_token, Some(tok(3)));
}

/// After a crash, every synced batch is there, and the state is that after some batch at or
/// after the last synced one (never a torn batch, never a synced batch missing).
pub fn synced_batches_survive_a_crash<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(
        &mut s,
        &[grant("a", 1, None), grant("b", 2, Some("q"))],
        true,
    );
    let synced = load(&mut s);
    commit(&mut s, &[remove("a", 1)], false);
    let lazy1 = load(&mut s);
    commit(&mut s, &[forget("q"), remove("b", 2)], false);
    let lazy2 = load(&mut s);
    h.crash(s);
    let mut s = h.open();
    let after = load(&mut s);
    assert!(
        after == synced || after == lazy1 || after == lazy2,
        "after a crash the store must be at a batch boundary at or after the last sync, found {after:?}"
    );
}

/// A synced commit makes the lazy batches before it durable as well.
pub fn a_sync_makes_earlier_lazy_batches_durable<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(&mut s, &[grant("a", 1, None), grant("b", 2, None)], true);
    commit(&mut s, &[remove("a", 1)], false);
    commit(&mut s, &[grant("c", 3, None)], true);
    let expected = load(&mut s);
    h.crash(s);
    let mut s = h.open();
    assert_eq!(
        load(&mut s),
        expected,
        "a lazy batch before a synced one was lost"
    );
}

/// The longest names, holders and request ids the limits allow are stored unchanged.
pub fn longest_fields_round_trip<H: Harness>(h: &mut H) {
    let mut s = h.open();
    let record = LeaseRecord {
        resource: res(&"r".repeat(RESOURCE_NAME_LEN_MAX)),
        lease_id: LeaseId::from_bytes([0xff; 16]),
        token: FencingToken::MAX,
        holder: "ü".repeat(512),
        ttl_ms: u64::from(u32::MAX),
        request_id: Some("~".repeat(1024)),
        reentrant: None,
        permits: None,
        rw: None,
    };
    commit(&mut s, &[Op::Grant(record.clone())], true);
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    assert_eq!(snap.leases, vec![record.clone()]);
    assert_eq!(snap.requests, vec![record]);
    assert_eq!(snap.last_token, Some(FencingToken::MAX));
}

/// A reentrant lease's holds are stored with it, in the batch order; a change of the holds of
/// a lease that is not the stored one is refused; a remembered request id, a grant's or a
/// re-entry's, keeps the grant without the reentrant part, after the lease has ended too; a
/// re-entry under a request id already remembered is refused.
pub fn reentrant_holds_are_stored<H: Harness>(h: &mut H) {
    let mut s = h.open();
    let mut granted = owned("a", 1, 1);
    granted.request_id = Some("q1".to_string());
    commit(&mut s, &[Op::Grant(granted.clone())], true);
    commit(
        &mut s,
        &[reenter("a", 1, 2, Some("in-1")), reenter("a", 1, 3, None)],
        true,
    );
    commit(&mut s, &[unhold("a", 1, 2)], false);
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    let mut held = owned("a", 1, 2);
    held.request_id = Some("q1".to_string());
    assert_eq!(
        snap.leases,
        vec![held.clone()],
        "holds as the last op left them"
    );
    assert_eq!(
        snap.requests,
        vec![rec("a", 1, Some("in-1")), rec("a", 1, Some("q1"))],
        "the remembered grant and re-entry, without the reentrant part"
    );
    for (op, what) in [
        (reenter("a", 2, 4, None), "another lease of the resource"),
        (unhold("zzz", 1, 1), "a resource without a lease"),
    ] {
        let refused = s.commit(&[op], true);
        assert!(
            matches!(refused, Err(StoreError::HoldsNotStored { .. })),
            "{what}: {refused:?}"
        );
    }
    for id in ["q1", "in-1"] {
        let refused = s.commit(&[reenter("a", 1, 3, Some(id))], true);
        assert!(
            matches!(refused, Err(StoreError::RequestRemembered { .. })),
            "a re-entry under {id}, remembered already: {refused:?}"
        );
    }
    commit(
        &mut s,
        &[reenter("a", 1, 3, Some("in-2")), remove("a", 1)],
        true,
    );
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    assert!(snap.leases.is_empty(), "the removal ended every hold");
    assert_eq!(
        snap.requests,
        vec![
            rec("a", 1, Some("in-1")),
            rec("a", 1, Some("in-2")),
            rec("a", 1, Some("q1"))
        ],
        "the re-entries' request ids outlive the lease, as the grant's does"
    );
}
/// A semaphore's permit keeps its semaphore's number of permits across a reopen (recovery
/// rebuilds the semaphore from it), in the lease only: the remembered grant is a plain one.
pub fn permits_keep_their_semaphores_number<H: Harness>(h: &mut H) {
    let mut s = h.open();
    let permit = |k: u64, request_id: Option<&str>| LeaseRecord {
        permits: Some(8),
        ..rec(&format!("jobs@permit-{k}"), k, request_id)
    };
    commit(
        &mut s,
        &[Op::Grant(permit(1, Some("q1"))), Op::Grant(permit(2, None))],
        true,
    );
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    assert_eq!(snap.leases.len(), 2);
    for (k, lease) in [permit(1, Some("q1")), permit(2, None)]
        .into_iter()
        .enumerate()
    {
        assert!(
            snap.leases.contains(&lease),
            "permit {} as granted: {:?}",
            k + 1,
            snap.leases
        );
    }
    assert_eq!(
        snap.requests,
        vec![rec("jobs@permit-1", 1, Some("q1"))],
        "the remembered grant, without the permits"
    );
}

/// A read-write lock's leases keep their side across a reopen (recovery rebuilds the lock
/// from it: a writer stays a writer, not an exclusive lock), in the lease only. A downgrade's
/// two ops, the writer's removal and the reader's grant, land together in one batch.
pub fn read_write_leases_keep_their_side<H: Harness>(h: &mut H) {
    let mut s = h.open();
    let side = |resource: &str, token: u64, rw: RwRole, request_id: Option<&str>| LeaseRecord {
        rw: Some(rw),
        ..rec(resource, token, request_id)
    };
    let writer = side("doc", 1, RwRole::Write, None);
    commit(&mut s, &[Op::Grant(writer.clone())], true);
    let reader = side("doc@read-1", 2, RwRole::Read, Some("down"));
    let downgrade = [
        Op::Remove {
            resource: writer.resource.clone(),
            lease_id: writer.lease_id,
        },
        Op::Grant(reader.clone()),
    ];
    commit(&mut s, &downgrade, true);
    let other = side("other", 3, RwRole::Write, Some("w"));
    commit(&mut s, &[Op::Grant(other.clone())], true);
    let mut s = reopen(h, s);
    let snap = load(&mut s);
    let mut leases = snap.leases.clone();
    leases.sort_by_key(|l| l.token);
    assert_eq!(leases, vec![reader, other], "each lease with its side");
    let mut requests = snap.requests.clone();
    requests.sort_by_key(|l| l.token);
    assert_eq!(
        requests,
        vec![
            rec("doc@read-1", 2, Some("down")),
            rec("other", 3, Some("w"))
        ],
        "the remembered grants, without the side"
    );
}

/// An atomic op (an AcquireAll's grants) lands whole: every lease and request record of it,
/// across a reopen and a crash. One with a grant that breaks a precondition lands not at all,
/// and one that is empty or holds anything but grants is refused.
pub fn an_atomic_set_lands_whole_or_not_at_all<H: Harness>(h: &mut H) {
    let mut s = h.open();
    commit(&mut s, &[grant("held", 1, None)], true);
    let set: Vec<Op> = (0..32u64)
        .map(|k| {
            let id = match k {
                0 => "set".to_string(),
                k => format!("set {k}"),
            };
            let mut r = rec(&format!("m{k}"), 2 + k, Some(&id));
            r.holder = "h".repeat(1024);
            Op::Grant(r)
        })
        .collect();
    commit(&mut s, &[Op::Atomic(set.clone())], false);
    let whole = load(&mut s);
    assert_eq!(whole.leases.len(), 33, "every lease of the set is stored");
    assert_eq!(
        whole.requests.len(),
        32,
        "every member's request id is remembered"
    );
    assert!(
        whole
            .requests
            .iter()
            .any(|r| r.request_id.as_deref() == Some("set 31"))
    );
    assert_eq!(whole.last_token, Some(tok(33)));
    h.crash(s);
    let mut s = h.open();
    let after = load(&mut s);
    let before: Vec<_> = whole
        .leases
        .iter()
        .filter(|l| l.resource.as_str() == "held")
        .cloned()
        .collect();
    assert!(
        after == whole || (after.leases == before && after.requests.is_empty()),
        "after a crash an unsynced atomic set is stored whole or not at all, found {} of its 32 leases",
        after.leases.len() - 1
    );
    let mut s = reopen(h, s);
    if after != whole {
        commit(&mut s, &[Op::Atomic(set)], true);
    }
    assert_eq!(load(&mut s), whole);
    let mut s = reopen(h, s);
    assert_eq!(load(&mut s), whole, "a synced atomic set survives a reopen");
    let refused = s.commit(
        &[Op::Atomic(vec![
            grant("fresh", 40, Some("set2")),
            grant("held", 41, None),
        ])],
        true,
    );
    assert!(
        matches!(refused, Err(StoreError::GrantWhileHeld { .. })),
        "a set with a held member: {refused:?}"
    );
    for bad in [
        vec![],
        vec![remove("held", 1)],
        vec![grant("x", 42, None), forget("set")],
    ] {
        let refused = s.commit(&[Op::Atomic(bad.clone())], true);
        assert!(
            matches!(refused, Err(StoreError::AtomicNotGrants)),
            "atomic {bad:?}: {refused:?}"
        );
    }
    assert_eq!(load(&mut s), whole, "a refused set changes nothing");
    let mut s = reopen(h, s);
    assert_eq!(
        load(&mut s),
        whole,
        "a refused set changes nothing, on disk either"
    );
}

/// A long random history of batches, syncs, reopens and crashes, against a model.
pub fn random_history_matches_a_model<H: Harness>(h: &mut H) {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut model = Model::default();
    // States the store may be in after a crash: the last synced one and every later one.
    let mut since_sync: Vec<Snapshot> = vec![model.snapshot()];
    let mut s = h.open();
    let mut token = 0u64;
    for step in 0..600 {
        match rng.below(20) {
            0 => {
                s = reopen(h, s);
                assert_eq!(load(&mut s), model.snapshot(), "step {step}: reopen");
                since_sync = vec![model.snapshot()];
            }
            1 => {
                h.crash(s);
                s = h.open();
                let found = load(&mut s);
                assert!(
                    since_sync.contains(&found),
                    "step {step}: crash recovered to a state that was never committed after the last sync: {found:?}"
                );
                model = Model::from_snapshot(&found);
                since_sync = vec![found];
            }
            _ => {
                let mut ops = Vec::new();
                let mut staged = model.clone();
                for _ in 0..1 + rng.below(4) {
                    if let Some(op) = staged.random_op(&mut rng, &mut token) {
                        staged.apply(&op);
                        ops.push(op);
                    }
                }
                let sync = rng.below(3) == 0;
                commit(&mut s, &ops, sync);
                model = staged;
                if sync {
                    since_sync = vec![model.snapshot()];
                } else {
                    since_sync.push(model.snapshot());
                }
            }
        }
    }
    assert_eq!(load(&mut s), model.snapshot(), "final state");
}

#[derive(Clone, Default)]
struct Model {
    last_token: Option<FencingToken>,
    leases: BTreeMap<ResourceName, LeaseRecord>,
    requests: BTreeMap<String, LeaseRecord>,
}

impl Model {
    fn from_snapshot(s: &Snapshot) -> Model {
        Model {
            last_token: s.last_token,
            leases: s
                .leases
                .iter()
                .map(|r| (r.resource.clone(), r.clone()))
                .collect(),
            requests: s
                .requests
                .iter()
                .map(|r| (r.request_id.clone().expect("request id"), r.clone()))
                .collect(),
        }
    }

    fn snapshot(&self) -> Snapshot {
        canonical(Snapshot {
            last_token: self.last_token,
            leases: self.leases.values().cloned().collect(),
            requests: self.requests.values().cloned().collect(),
        })
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Atomic(parts) => parts.iter().for_each(|p| self.apply(p)),
            Op::Grant(r) => {
                self.last_token = Some(r.token);
                self.leases.insert(r.resource.clone(), r.clone());
                if let Some(id) = &r.request_id {
                    self.requests.insert(id.clone(), r.remembered_as(id));
                }
            }
            Op::Remove { resource, .. } => {
                self.leases.remove(resource);
            }
            Op::ForgetRequest { request_id } => {
                self.requests.remove(request_id);
            }
            Op::Reenter { resource, .. } | Op::Unhold { resource, .. } => {
                let rec = self.leases.get_mut(resource).expect("a stored lease");
                op.apply_holds(rec);
                if let Op::Reenter {
                    request_id: Some(id),
                    ..
                } = op
                {
                    self.requests.insert(id.clone(), rec.remembered_as(id));
                }
            }
        }
    }

    /// A valid op for the current state, if the dice find one.
    fn random_op(&self, rng: &mut XorShift, token: &mut u64) -> Option<Op> {
        let resource = format!("res-{}", rng.below(12));
        match rng.below(4) {
            0 => {
                if self.leases.contains_key(resource.as_str()) {
                    return None;
                }
                *token =
                    (*token).max(self.last_token.map_or(0, FencingToken::get)) + 1 + rng.below(3);
                let request_id = format!("req-{}", rng.below(30));
                let request = (rng.below(2) == 0 && !self.requests.contains_key(&request_id))
                    .then_some(request_id);
                let mut r = rec(&resource, *token, request.as_deref());
                if rng.below(3) == 0 {
                    r.reentrant = owned(&resource, *token, 1).reentrant;
                }
                if rng.below(4) > 0 {
                    return Some(Op::Grant(r));
                }
                // An AcquireAll's grants: this one and up to two more free resources, their
                // request ids the set's member ids.
                let mut parts = vec![Op::Grant(r)];
                for k in 1..=rng.below(3) {
                    let more = format!("res-{}-{k}", rng.below(12));
                    if self.leases.contains_key(more.as_str())
                        || parts
                            .iter()
                            .any(|p| matches!(p, Op::Grant(g) if g.resource.as_str() == more))
                    {
                        continue;
                    }
                    *token += 1;
                    let id = request
                        .as_ref()
                        .map(|id| format!("{id} {k}"))
                        .filter(|id| !self.requests.contains_key(id));
                    parts.push(grant(&more, *token, id.as_deref()));
                }
                Some(Op::Atomic(parts))
            }
            3 => {
                let r = self.leases.get(resource.as_str())?;
                let holds = r.reentrant.as_ref()?.holds;
                let (resource, lease_id) = (r.resource.clone(), r.lease_id);
                Some(match rng.below(2) {
                    0 if holds > 1 => Op::Unhold {
                        resource,
                        lease_id,
                        holds: holds - 1,
                    },
                    _ => Op::Reenter {
                        resource,
                        lease_id,
                        holds: holds + 1,
                        // From the grants' pool of ids: a re-entry remembers its id as a
                        // grant does.
                        request_id: Some(format!("req-{}", rng.below(30)))
                            .filter(|id| rng.below(2) == 0 && !self.requests.contains_key(id)),
                    },
                })
            }
            1 => self.leases.get(resource.as_str()).map(|r| Op::Remove {
                resource: r.resource.clone(),
                lease_id: r.lease_id,
            }),
            _ => {
                let n = self.requests.len();
                (n > 0).then(|| {
                    forget(
                        self.requests
                            .keys()
                            .nth(rng.below(n as u64) as usize)
                            .expect("in range"),
                    )
                })
            }
        }
    }
}

/// A tiny deterministic generator, so that the suite needs no dependency and a failure
/// reproduces exactly.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
