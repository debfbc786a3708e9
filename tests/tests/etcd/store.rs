//! The etcd store: the Store conformance suite against a real etcd, and what is particular to
//! a replicated store (a deposed leader's batch, batches beyond etcd's transaction limit, the
//! key layout operators read, the high-water guard).

use std::sync::Arc;
use std::time::Duration;

use e2e::etcd::EtcdCluster;
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Op};
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

fn options(etcd: &EtcdCluster, dir: &std::path::Path, max_txn_ops: usize) -> EtcdOptions {
    EtcdOptions {
        endpoints: etcd.endpoints().split(',').map(str::to_string).collect(),
        prefix: "/lockd".to_string(),
        request_timeout: Duration::from_secs(5),
        leader_ttl: Duration::from_secs(2),
        data_dir: dir.to_path_buf(),
        max_txn_ops,
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

    fn campaign(&self) -> Arc<Term> {
        match self
            .rt
            .block_on(
                self.cluster
                    .campaign(&Member::new("http://test".to_string())),
            )
            .unwrap()
        {
            Campaign::Won(t) => Arc::new(t),
            Campaign::Lost(l) => panic!("the only candidate lost to {l:?}"),
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

fn record(resource: &str, token: u64) -> LeaseRecord {
    LeaseRecord {
        resource: ResourceName::new(resource).unwrap(),
        lease_id: LeaseId::from_bytes([token as u8; 16]),
        token: FencingToken::new(token).unwrap(),
        holder: format!("h{token}"),
        ttl_ms: 5_000,
        request_id: Some(format!("q{token}")),
    }
}

#[test]
fn a_deposed_leaders_batch_is_refused_and_changes_nothing() {
    let mut h = OnEtcd::new();
    let mut old = h.open();
    old.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    // The old leader's lease runs out (it was paused, say); another instance leads.
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
    assert_eq!(got.len(), 4, "nothing else is stored: {got:?}");
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
    let mut s = {
        let _in = rt.enter();
        EtcdStore::new(Arc::clone(&cluster), Arc::new(term))
    };
    let snap = s.load().unwrap();
    assert_eq!(snap.last_token, FencingToken::new(40 + MARGIN));
    assert!(snap.leases.is_empty());
    // Written to etcd at once, so that the next leader continues from there too.
    let mut again = s;
    let snap = again.load().unwrap();
    assert_eq!(snap.last_token, FencingToken::new(40 + MARGIN));
}
