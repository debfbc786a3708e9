//! The etcd store: the Store conformance suite against a real etcd, and what is particular to
//! a replicated store (a deposed leader's batch, batches beyond etcd's transaction limit, the
//! key layout operators read, the high-water guard).

use std::sync::Arc;
use std::time::Duration;

use e2e::etcd::EtcdCluster;
use e2e::replicated::{Replicated, record};
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::Op;
use lockd_store::conformance::{Harness, sample_grant};
use lockd_store::{Store, StoreError};
use lockd_store_etcd::highwater::MARGIN;
use lockd_store_etcd::{Campaign, Cluster, EtcdOptions, EtcdStore, Member, Term};

/// One etcd member, and the terms the suite's stores run in.
struct OnEtcd {
    etcd: EtcdCluster,
    rt: tokio::runtime::Runtime,
    cluster: Arc<Cluster>,
    dir: tempfile::TempDir,
    term: Option<Arc<Term>>,
}

/// `term`, kept as a leader keeps its term (its lease alive, its clock checked against
/// etcd's) until it ends or the runtime stops: a store commits only in a term in force.
fn keep(rt: &tokio::runtime::Runtime, cluster: &Arc<Cluster>, term: Term) -> Arc<Term> {
    let term = Arc::new(term);
    let (c, t) = (Arc::clone(cluster), Arc::clone(&term));
    rt.spawn(async move { c.keep_leading(&t).await });
    term
}

fn options(etcd: &EtcdCluster, dir: &std::path::Path, max_txn_ops: usize) -> EtcdOptions {
    EtcdOptions {
        endpoints: etcd.endpoints().split(',').map(str::to_string).collect(),
        prefix: "/lockd".to_string(),
        request_timeout: Duration::from_secs(5),
        leader_ttl: Duration::from_secs(2),
        data_dir: dir.to_path_buf(),
        max_txn_ops,
        tls: None,
    }
}

impl OnEtcd {
    fn new() -> OnEtcd {
        OnEtcd::with(EtcdCluster::start(1), 128)
    }

    fn with(etcd: EtcdCluster, max_txn_ops: usize) -> OnEtcd {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cluster = Arc::new(
            rt.block_on(Cluster::connect(&options(&etcd, dir.path(), max_txn_ops)))
                .unwrap(),
        );
        OnEtcd {
            etcd,
            rt,
            cluster,
            dir,
            term: None,
        }
    }

    /// Ends the current term, as its lease running out would.
    fn end_term(&mut self) {
        if let Some(t) = self.term.take() {
            self.rt.block_on(self.cluster.resign(&t));
        }
    }

    /// A new term, kept (its lease alive, its clock checked) as the leader keeps its own.
    fn campaign(&self) -> Arc<Term> {
        match self
            .rt
            .block_on(
                self.cluster
                    .campaign(&Member::new("http://test".to_string())),
            )
            .unwrap()
        {
            Campaign::Won(t) => keep(&self.rt, &self.cluster, t),
            Campaign::Lost(l, _) => panic!("the only candidate lost to {l:?}"),
        }
    }

    fn store(&self, term: &Arc<Term>) -> EtcdStore {
        let _in = self.rt.enter();
        EtcdStore::new(Arc::clone(&self.cluster), Arc::clone(term))
    }
}

impl Harness for OnEtcd {
    type S = EtcdStore;

    /// A new term (the previous store's leader gave up, or its lease ran out), whose store
    /// starts from what etcd holds.
    fn open(&mut self) -> EtcdStore {
        self.end_term();
        let term = self.campaign();
        self.term = Some(Arc::clone(&term));
        self.store(&term)
    }

    /// Every commit is replicated when it returns; a crash of the leader only leaves its
    /// lease to run out, which `open` stands in for.
    fn crash(&mut self, store: EtcdStore) {
        drop(store);
    }
}

lockd_store::conformance_tests!(OnEtcd::new());

impl Replicated for OnEtcd {
    fn end_term(&mut self) {
        OnEtcd::end_term(self);
    }

    fn another_store(&mut self) -> Self::S {
        let term = self.term.clone().expect("a term");
        self.store(&term)
    }

    fn end_by_clock(&mut self, why: &str) {
        let term = self.term.clone().expect("a term");
        term.end(why);
        assert!(!term.in_force());
    }
}

e2e::replicated_store_tests!(OnEtcd::new());

#[test]
fn a_term_ended_by_its_own_clock_commits_nothing_though_etcd_still_has_its_key() {
    let mut h = OnEtcd::new();
    let mut store = h.open();
    store.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    // The clock check found a jump: the term ends at once, while etcd still holds the
    // leader key under a live lease (so etcd's compare alone would let the batch through).
    let term = h.term.clone().unwrap();
    term.end("a clock fault (test)");
    assert!(!term.in_force());
    let err = store
        .commit(
            &[Op::Remove {
                resource: ResourceName::new("a").unwrap(),
                lease_id: record("a", 1).lease_id,
            }],
            false,
        )
        .expect_err("a batch after the term ended by its own clock must be refused");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
    assert!(err.to_string().contains("a clock fault (test)"), "{err}");
    h.term = None; // not resigned: the key stays until its lease runs out
    let leader = h.rt.block_on(h.cluster.observe()).unwrap();
    assert!(
        leader.is_some(),
        "the test needs the leader key still in etcd"
    );
    h.rt.block_on(h.cluster.resign(&term));
    let snap = h.open().load().unwrap();
    assert_eq!(
        snap.leases,
        vec![record("a", 1)],
        "the expiry was committed"
    );
}

#[test]
fn a_leader_key_put_again_under_another_lease_refuses_the_batch() {
    let mut h = OnEtcd::new();
    let mut store = h.open();
    store.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    // Someone puts the leader key again under a lease of their own: the key keeps its create
    // revision, but it is no longer this term's.
    let endpoints = h.etcd.endpoints();
    let other = h.rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoints.as_str()], None)
            .await
            .unwrap();
        let lease = c.lease_grant(60, None).await.unwrap().id();
        let old = c.get("/lockd/leader", None).await.unwrap();
        let value = old.kvs()[0].value().to_vec();
        c.put(
            "/lockd/leader",
            value,
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
        lease
    });
    assert_ne!(other, h.term.as_ref().unwrap().lease());
    let err = store
        .commit(&[Op::Grant(record("b", 2))], true)
        .expect_err("a batch under a leader key of another lease must be refused");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
}

#[test]
fn a_batch_beyond_etcds_transaction_limit_is_cut_and_lands_whole() {
    // etcd refuses a transaction of more than --max-txn-ops (128) operations.
    let mut h = OnEtcd::with(EtcdCluster::start(1), 128);
    let mut s = h.open();
    let grants: Vec<Op> = (1..=500).map(sample_grant).collect();
    s.commit(&grants, true).unwrap();
    let removes: Vec<Op> = (1..=250)
        .map(|n| Op::Remove {
            resource: ResourceName::new(&format!("r{n}")).unwrap(),
            lease_id: match sample_grant(n) {
                Op::Grant(r) => r.lease_id,
                _ => unreachable!("a grant"),
            },
        })
        .collect();
    s.commit(&removes, false).unwrap();
    let mut s = h.open();
    let snap = s.load().unwrap();
    assert_eq!(snap.leases.len(), 250);
    assert_eq!(snap.requests.len(), 500);
    assert_eq!(snap.last_token, FencingToken::new(500));
}

#[test]
fn the_key_layout_is_the_documented_one() {
    let mut h = OnEtcd::new();
    let mut s = h.open();
    s.commit(&[Op::Grant(record("inventory:7", 9))], true)
        .unwrap();
    let endpoint = h.etcd.endpoints();
    let got = h.rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .unwrap();
        let r = c
            .get(
                "/lockd/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        r.kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key_str().unwrap().to_string(),
                    kv.value_str().unwrap().to_string(),
                    kv.lease(),
                )
            })
            .collect::<Vec<_>>()
    });
    let find = |k: &str| {
        got.iter()
            .find(|(key, _, _)| key == k)
            .unwrap_or_else(|| panic!("{k} is not in etcd: {got:?}"))
            .clone()
    };
    assert_eq!(find("/lockd/high-water").1, "9");
    let lock: serde_json::Value =
        serde_json::from_str(&find("/lockd/locks/inventory:7").1).unwrap();
    assert_eq!(lock["token"], 9);
    assert_eq!(lock["holder"], "h9");
    assert_eq!(lock["lease_id"], LeaseId::from_bytes([9; 16]).to_string());
    let req: serde_json::Value = serde_json::from_str(&find("/lockd/requests/q9").1).unwrap();
    assert_eq!(req["resource"], "inventory:7");
    let (_, leader, lease) = find("/lockd/leader");
    let leader: serde_json::Value = serde_json::from_str(&leader).unwrap();
    assert_eq!(leader["address"], "http://test");
    assert_eq!(
        lease,
        h.term.as_ref().unwrap().lease(),
        "the leader key lives under the leadership lease"
    );
    // The last batch of the term, which orders its batches.
    let (_, batch, lease) = find("/lockd/batch");
    let term_revision = h.term.as_ref().unwrap().revision();
    assert!(
        batch.starts_with(&format!("{term_revision}:")) && lease == 0,
        "{batch}"
    );
    assert_eq!(got.len(), 5, "nothing else is stored: {got:?}");
}

#[test]
fn tokens_continue_above_this_instances_high_water_when_etcd_lost_data() {
    let dir = tempfile::tempdir().unwrap();
    let old = EtcdCluster::start(1);
    {
        let h = OnEtcd::with(old, 128);
        let term = h.campaign();
        let mut s = h.store(&term);
        s.load().unwrap();
        s.commit(&[Op::Grant(record("a", 40))], true).unwrap();
        h.cluster.high_water().flush().unwrap();
        std::fs::copy(
            h.dir.path().join(lockd_store_etcd::highwater::FILE),
            dir.path().join(lockd_store_etcd::highwater::FILE),
        )
        .unwrap();
    }
    // An empty cluster, and an instance whose data directory saw token 40.
    let fresh = EtcdCluster::start(1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = Arc::new(
        rt.block_on(Cluster::connect(&options(&fresh, dir.path(), 128)))
            .unwrap(),
    );
    let Campaign::Won(term) = rt
        .block_on(cluster.campaign(&Member::new("http://test".to_string())))
        .unwrap()
    else {
        panic!("the only candidate leads");
    };
    let term = keep(&rt, &cluster, term);
    let mut s = {
        let _in = rt.enter();
        EtcdStore::new(Arc::clone(&cluster), term)
    };
    let snap = s.load().unwrap();
    assert_eq!(snap.last_token, FencingToken::new(40 + MARGIN));
    assert!(snap.leases.is_empty());
    // Written to etcd at once, so that the next leader continues from there too.
    let mut again = s;
    let snap = again.load().unwrap();
    assert_eq!(snap.last_token, FencingToken::new(40 + MARGIN));
}

#[test]
fn a_batch_beyond_etcds_request_size_is_cut_and_lands_whole() {
    // 40 grants of 64 KiB holders: 2.5 MiB, over etcd's --max-request-bytes (1.5 MiB), in
    // fewer operations than --max-txn-ops.
    let mut h = OnEtcd::new();
    let mut s = h.open();
    let big: Vec<Op> = (1..=40)
        .map(|n| {
            let mut r = record(&format!("big-{n}"), n);
            r.holder = "h".repeat(64 << 10);
            Op::Grant(r)
        })
        .collect();
    s.commit(&big, true).unwrap();
    let mut s = h.open();
    let snap = s.load().unwrap();
    assert_eq!(snap.leases.len(), 40);
    assert!(snap.leases.iter().all(|l| l.holder.len() == 64 << 10));
}

/// A follower's warm copy (a full read, then the watch) equals what a full read finds, after
/// a history of grants, removals and forgotten request ids, some of them in one batch.
#[test]
fn the_warm_copy_follows_every_batch() {
    use lockd_store_etcd::Warm;
    let mut h = OnEtcd::new();
    let mut s = h.open();
    s.commit(&[sample_grant(1), sample_grant(2)], true).unwrap();
    let warm = Arc::new(Warm::default());
    let watcher = h.rt.spawn({
        let (cluster, warm) = (Arc::clone(&h.cluster), Arc::clone(&warm));
        async move { cluster.keep_warm(&warm).await }
    });
    let lease_of = |n: u64| match sample_grant(n) {
        Op::Grant(r) => r.lease_id,
        _ => unreachable!("a grant"),
    };
    let remove = |n: u64| Op::Remove {
        resource: ResourceName::new(&format!("r{n}")).unwrap(),
        lease_id: lease_of(n),
    };
    let forget = |n: u64| Op::ForgetRequest {
        request_id: format!("q{n}"),
    };
    for n in (3..300).step_by(3) {
        s.commit(
            &[sample_grant(n), sample_grant(n + 1), remove(n - 1)],
            n % 2 == 0,
        )
        .unwrap();
        s.commit(&[forget(n - 1), sample_grant(n + 2), remove(n)], false)
            .unwrap();
    }
    let revision = h.rt.block_on(h.cluster.revision()).unwrap();
    let copy =
        h.rt.block_on(warm.take_at(revision, Duration::from_secs(30)))
            .expect("the warm copy reaches the latest revision");
    let (full, _) = h.rt.block_on(h.cluster.read_state()).unwrap();
    let sorted = |stored: &lockd_store_etcd::Stored| {
        let (mut snap, hw) = stored.snapshot();
        snap.leases.sort_by(|a, b| a.resource.cmp(&b.resource));
        snap.requests
            .sort_by(|a, b| a.request_id.cmp(&b.request_id));
        (snap, hw)
    };
    let (got, want) = (sorted(&copy), sorted(&full));
    assert!(!want.0.leases.is_empty() && !want.0.requests.is_empty());
    assert_eq!(got, want, "the warm copy differs from a full read");
    watcher.abort();
}

#[test]
fn a_high_water_at_the_top_of_the_token_range_stays_in_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(lockd_store_etcd::highwater::FILE),
        format!("{}\n", FencingToken::MAX.get() - 7),
    )
    .unwrap();
    let etcd = EtcdCluster::start(1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = Arc::new(
        rt.block_on(Cluster::connect(&options(&etcd, dir.path(), 128)))
            .unwrap(),
    );
    let campaign = || match rt
        .block_on(cluster.campaign(&Member::new("http://test".to_string())))
        .unwrap()
    {
        Campaign::Won(t) => keep(&rt, &cluster, t),
        Campaign::Lost(..) => panic!("the only candidate leads"),
    };
    let term = campaign();
    let mut s = {
        let _in = rt.enter();
        EtcdStore::new(Arc::clone(&cluster), Arc::clone(&term))
    };
    // The margin would pass the top: tokens stop there (the core answers tokens_exhausted).
    let snap = s.load().unwrap();
    assert_eq!(snap.last_token, Some(FencingToken::MAX));
    rt.block_on(cluster.resign(&term));
    // A high-water outside the token range, written by hand, is refused as damaged.
    let endpoint = etcd.endpoints();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .unwrap();
        c.put("/lockd/high-water", "9223372036854775808", None)
            .await
            .unwrap();
    });
    let term = campaign();
    let mut s = {
        let _in = rt.enter();
        EtcdStore::new(Arc::clone(&cluster), term)
    };
    let err = s.load().expect_err("an out-of-range high-water is refused");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("/lockd/high-water"), "{err}");
}
