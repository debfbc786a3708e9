//! The ZooKeeper store: the Store conformance suite against a real ZooKeeper, and what is
//! particular to a replicated store (a deposed leader's batch, a late batch, batches beyond
//! ZooKeeper's request size, the node layout operators read).

use std::sync::Arc;
use std::time::Duration;

use e2e::replicated::{Replicated, record};
use e2e::zookeeper::ZkEnsemble;
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Op};
use lockd_store::conformance::{Harness, sample_grant};
use lockd_store::{Store, StoreError};
use lockd_store_kv::highwater::MARGIN;
use lockd_store_zk::{Campaign, Cluster, Member, Term, ZkOptions, ZkStore};
use zookeeper_client as zk;

/// One ZooKeeper server, and the terms the suite's stores run in.
struct OnZk {
    zk: ZkEnsemble,
    rt: tokio::runtime::Runtime,
    cluster: Arc<Cluster>,
    dir: tempfile::TempDir,
    term: Option<Arc<Term>>,
}

fn options(zk: &ZkEnsemble, dir: &std::path::Path) -> ZkOptions {
    ZkOptions {
        endpoints: zk.endpoints(),
        prefix: "/lockd".to_string(),
        request_timeout: Duration::from_secs(5),
        session_timeout: Duration::from_secs(2),
        data_dir: dir.to_path_buf(),
    }
}

impl OnZk {
    fn new() -> OnZk {
        OnZk::on(ZkEnsemble::start(1), tempfile::tempdir().unwrap())
    }

    /// Over `zk`, this instance's data directory `dir`.
    fn on(zk: ZkEnsemble, dir: tempfile::TempDir) -> OnZk {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let cluster = Arc::new(
            rt.block_on(Cluster::connect(&options(&zk, dir.path())))
                .unwrap(),
        );
        OnZk {
            zk,
            rt,
            cluster,
            dir,
            term: None,
        }
    }

    /// Ends the current term, as its session's end would.
    fn end_term(&mut self) {
        if let Some(t) = self.term.take() {
            self.rt.block_on(self.cluster.resign(&t));
        }
    }

    /// A new term, kept (its node read, its session alive) as the leader keeps its own.
    fn campaign(&self) -> Arc<Term> {
        match self
            .rt
            .block_on(
                self.cluster
                    .campaign(&Member::new("http://test".to_string())),
            )
            .unwrap()
        {
            Campaign::Won(t) => {
                let term = Arc::new(t);
                let (c, t) = (Arc::clone(&self.cluster), Arc::clone(&term));
                self.rt.spawn(async move { c.keep_leading(&t).await });
                term
            }
            Campaign::Lost(l) => panic!("the only candidate lost to {l:?}"),
        }
    }

    fn store(&self, term: &Arc<Term>) -> ZkStore {
        let _in = self.rt.enter();
        ZkStore::new(Arc::clone(&self.cluster), Arc::clone(term))
    }

    /// A client of its own, as an operator's `zkCli.sh` would be.
    fn client(&self) -> zk::Client {
        let endpoints = self.zk.endpoints().join(",");
        self.rt.block_on(zk::Client::connect(&endpoints)).unwrap()
    }
}

impl Harness for OnZk {
    type S = ZkStore;

    /// A new term (the previous store's leader gave up, or its session ended), whose store
    /// starts from what ZooKeeper holds.
    fn open(&mut self) -> ZkStore {
        self.end_term();
        let term = self.campaign();
        self.term = Some(Arc::clone(&term));
        self.store(&term)
    }

    /// Every commit is replicated when it returns; a crash of the leader only leaves its
    /// session to expire, which `open` stands in for.
    fn crash(&mut self, store: ZkStore) {
        drop(store);
    }
}

lockd_store::conformance_tests!(OnZk::new());

impl Replicated for OnZk {
    fn end_term(&mut self) {
        OnZk::end_term(self);
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

e2e::replicated_store_tests!(OnZk::new());

#[test]
fn a_leader_whose_node_was_deleted_commits_nothing() {
    let mut h = OnZk::new();
    let mut store = h.open();
    store.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    let node = h.term.as_ref().unwrap().node().to_string();
    let operator = h.client();
    h.rt.block_on(operator.delete(&node, None)).unwrap();
    let err = store
        .commit(&[Op::Grant(record("b", 2))], true)
        .expect_err("a batch without the leader's node must be refused");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
    h.term = None;
    let snap = h.open().load().unwrap();
    assert_eq!(snap.leases, vec![record("a", 1)]);
}

#[test]
fn a_batch_beyond_zookeepers_request_size_is_cut_and_lands_whole() {
    let mut h = OnZk::new();
    let mut s = h.open();
    // About 1.5 MiB of records: more than one request of ZooKeeper's (1 MiB).
    let long = "h".repeat(600);
    let grants: Vec<Op> = (1..=3000)
        .map(|n| match sample_grant(n) {
            Op::Grant(r) => Op::Grant(LeaseRecord {
                holder: long.clone(),
                ..r
            }),
            _ => unreachable!("a grant"),
        })
        .collect();
    s.commit(&grants, true).unwrap();
    let removes: Vec<Op> = (1..=1500)
        .map(|n| Op::Remove {
            resource: ResourceName::new(&format!("r{n}")).unwrap(),
            lease_id: match sample_grant(n) {
                Op::Grant(r) => r.lease_id,
                _ => unreachable!("a grant"),
            },
        })
        .collect();
    s.commit(&removes, false).unwrap();
    let snap = h.open().load().unwrap();
    assert_eq!(snap.leases.len(), 1500);
    assert_eq!(snap.requests.len(), 3000);
    assert_eq!(snap.last_token, FencingToken::new(3000));
}

#[test]
fn the_node_layout_is_the_documented_one() {
    let mut h = OnZk::new();
    let mut s = h.open();
    // A name with every character ZooKeeper could not take as it is, and a request id with a
    // slash and a space.
    let mut rec = record("tenant/a/../b.c", 9);
    rec.request_id = Some("retry 1/2".to_string());
    s.commit(&[Op::Grant(rec.clone())], true).unwrap();
    let c = h.client();
    let get = |path: &str| -> String {
        let (data, _) =
            h.rt.block_on(c.get_data(path))
                .unwrap_or_else(|e| panic!("{path}: {e}"));
        String::from_utf8(data).unwrap()
    };
    assert_eq!(get("/lockd/high-water"), "9");
    let find = |parent: &str, node: &str| -> String {
        for b in 0..256 {
            let path = format!("{parent}/{b:02x}");
            let children = h.rt.block_on(c.list_children(&path)).unwrap();
            if children.iter().any(|n| n == node) {
                return format!("{path}/{node}");
            }
        }
        panic!("{node} is in no bucket of {parent}")
    };
    let lock = find("/lockd/locks", "tenant%2Fa%2F%2E%2E%2Fb%2Ec");
    let lock: serde_json::Value = serde_json::from_str(&get(&lock)).unwrap();
    assert_eq!(lock["token"], 9);
    assert_eq!(lock["holder"], "h9");
    assert_eq!(lock["lease_id"], LeaseId::from_bytes([9; 16]).to_string());
    let req = find("/lockd/requests", "retry%201%2F2");
    let req: serde_json::Value = serde_json::from_str(&get(&req)).unwrap();
    assert_eq!(req["resource"], "tenant/a/../b.c");
    let members = h.rt.block_on(c.list_children("/lockd/election")).unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    let leader: serde_json::Value =
        serde_json::from_str(&get(&format!("/lockd/election/{}", members[0]))).unwrap();
    assert_eq!(leader["address"], "http://test");
    let batch = get("/lockd/batch");
    assert!(
        batch.starts_with(&format!("{}:", h.term.as_ref().unwrap().node())),
        "{batch}"
    );
    // What lockd read back is what it wrote, under both names.
    let snap = h.open().load().unwrap();
    assert_eq!(snap.leases, vec![rec.clone()]);
    assert_eq!(snap.requests[0].request_id.as_deref(), Some("retry 1/2"));
}

#[test]
fn a_node_lockd_did_not_write_is_refused_on_load() {
    let mut h = OnZk::new();
    let mut s = h.open();
    s.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    let c = h.client();
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    h.rt.block_on(c.create("/lockd/locks/00/not%2fencoded", b"{}", &options))
        .unwrap();
    let err = h.open().load().expect_err("a foreign node must be refused");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("not%2fencoded"), "{err}");
}

#[test]
fn tokens_continue_above_this_instances_high_water_when_zookeeper_lost_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut h = OnZk::new();
        let mut s = h.open();
        s.load().unwrap();
        s.commit(&[Op::Grant(record("a", 40))], true).unwrap();
        h.cluster.high_water().flush().unwrap();
        std::fs::copy(
            h.dir.path().join(lockd_store_zk::HIGH_WATER_FILE),
            dir.path().join(lockd_store_zk::HIGH_WATER_FILE),
        )
        .unwrap();
    }
    // An empty ensemble, and an instance whose data directory saw token 40.
    let mut h = OnZk::on(ZkEnsemble::start(1), dir);
    let snap = h.open().load().unwrap();
    assert_eq!(snap.last_token, FencingToken::new(40 + MARGIN));
    assert!(snap.leases.is_empty());
    // Written to ZooKeeper at once, so that the next leader continues from there too, even
    // one without the file.
    let c = h.client();
    let (data, _) = h.rt.block_on(c.get_data("/lockd/high-water")).unwrap();
    assert_eq!(String::from_utf8(data).unwrap(), (40 + MARGIN).to_string());
}

/// A prefix inside another cluster's nodes would put records where that cluster reads its
/// own (an outside tester's finding: the other cluster's next leader refused to load).
#[test]
fn a_prefix_inside_another_clusters_nodes_is_refused() {
    let h = OnZk::new();
    let dir = tempfile::tempdir().unwrap();
    for inside in ["/lockd/locks/00", "/lockd/requests", "/lockd/election/x"] {
        let options = ZkOptions {
            prefix: inside.to_string(),
            ..options(&h.zk, dir.path())
        };
        let Err(e) = h.rt.block_on(Cluster::connect(&options)) else {
            panic!("{inside} inside the cluster at /lockd must be refused");
        };
        assert!(e.to_string().contains("cluster at /lockd"), "{e}");
    }
    // Beside it is fine.
    for beside in ["/lockd2", "/teams/lockd"] {
        let options = ZkOptions {
            prefix: beside.to_string(),
            ..options(&h.zk, dir.path())
        };
        h.rt.block_on(Cluster::connect(&options))
            .unwrap_or_else(|e| panic!("{beside}: {e}"));
    }
}

/// Followers watch the leader's node (the "the others watch their predecessor"): the
/// watch resolves when the node goes, so a follower campaigns at once instead of at its next
/// poll.
#[test]
fn a_watch_of_the_leaders_node_resolves_when_it_goes() {
    let mut h = OnZk::new();
    let _s = h.open();
    let (record, seq) =
        h.rt.block_on(h.cluster.observe())
            .unwrap()
            .expect("a leader");
    assert_eq!(record.address, "http://test");
    let cluster = Arc::clone(&h.cluster);
    let gone = h.rt.spawn(async move { cluster.leader_gone(seq).await });
    assert!(!gone.is_finished(), "woken while the leader's node lives");
    h.end_term();
    h.rt.block_on(async { tokio::time::timeout(e2e::PATIENCE, gone).await })
        .expect("the watch must resolve when the leader's node is deleted")
        .unwrap();
    // A node that is gone already: at once.
    h.rt.block_on(async { tokio::time::timeout(e2e::PATIENCE, h.cluster.leader_gone(seq)).await })
        .expect("a watch of a deleted node resolves at once");
}
