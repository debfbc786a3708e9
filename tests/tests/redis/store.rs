//! The Redis store: the Store conformance suite against a real Redis with Sentinel, and what
//! is particular to a replicated store over Redis.

use std::sync::Arc;
use std::time::Duration;

use e2e::redis::{MASTER, RedisSet};
use e2e::replicated::{Replicated, record};
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Op};
use lockd_store::conformance::{Harness, sample_grant};
use lockd_store::{Store, StoreError};
use lockd_store_kv::highwater::MARGIN;
use lockd_store_redis::{Campaign, Cluster, EPOCH_SHIFT, Member, RedisOptions, RedisStore, Term};

/// A master, a replica and a Sentinel, and the terms the suite's stores run in.
struct OnRedis {
    redis: RedisSet,
    rt: tokio::runtime::Runtime,
    cluster: Arc<Cluster>,
    dir: tempfile::TempDir,
    term: Option<Arc<Term>>,
}

fn options(redis: &RedisSet, dir: &std::path::Path) -> RedisOptions {
    RedisOptions {
        sentinels: redis.endpoints(),
        master: MASTER.to_string(),
        prefix: "lockd".to_string(),
        request_timeout: Duration::from_secs(5),
        leader_ttl: Duration::from_secs(2),
        wait_replicas: 1,
        data_dir: dir.to_path_buf(),
    }
}

impl OnRedis {
    fn new() -> OnRedis {
        OnRedis::on(RedisSet::start(1, 1), tempfile::tempdir().unwrap(), |o| o)
    }

    /// Over `redis`, this instance's data directory `dir`, with `tune` applied to the
    /// options.
    fn on(
        redis: RedisSet,
        dir: tempfile::TempDir,
        tune: impl FnOnce(RedisOptions) -> RedisOptions,
    ) -> OnRedis {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let cluster = Arc::new(
            rt.block_on(Cluster::connect(&tune(options(&redis, dir.path()))))
                .unwrap(),
        );
        OnRedis {
            redis,
            rt,
            cluster,
            dir,
            term: None,
        }
    }

    /// Ends the current term, as its key's expiry would.
    fn end_term(&mut self) {
        if let Some(t) = self.term.take() {
            self.rt.block_on(self.cluster.resign(&t));
        }
    }

    /// A new term, kept (its key renewed) as the leader keeps its own.
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

    fn store(&self, term: &Arc<Term>) -> RedisStore {
        let _in = self.rt.enter();
        RedisStore::new(Arc::clone(&self.cluster), Arc::clone(term))
    }

    /// A connection of its own to server `i`, as an operator's `redis-cli` would be.
    fn client(&self, i: usize) -> redis::aio::MultiplexedConnection {
        let c = redis::Client::open(format!("redis://{}/", self.redis.servers[i].addr)).unwrap();
        self.rt
            .block_on(c.get_multiplexed_async_connection())
            .unwrap()
    }

    /// `args` as a command to server `i`.
    fn cmd<T: redis::FromRedisValue>(&self, i: usize, args: &[&str]) -> T {
        let mut c = self.client(i);
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        self.rt
            .block_on(cmd.query_async(&mut c))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }
}

impl Harness for OnRedis {
    type S = RedisStore;

    /// A new term (the previous store's leader gave up, or its key expired), whose store
    /// starts from what Redis holds.
    fn open(&mut self) -> RedisStore {
        self.end_term();
        let term = self.campaign();
        self.term = Some(Arc::clone(&term));
        self.store(&term)
    }

    /// Every commit is on the master's disk and on the replica when it returns; a crash of
    /// the leader only leaves its key to expire, which `open` stands in for.
    fn crash(&mut self, store: RedisStore) {
        drop(store);
    }
}

lockd_store::conformance_tests!(OnRedis::new());

impl Replicated for OnRedis {
    fn end_term(&mut self) {
        OnRedis::end_term(self);
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

e2e::replicated_store_tests!(OnRedis::new());

#[test]
fn a_leader_whose_key_was_taken_commits_nothing() {
    let mut h = OnRedis::new();
    let mut store = h.open();
    store.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    // An operator overwrites the key; the term's own clock still says it leads.
    let _: () = h.cmd(0, &["SET", "lockd:leader", "someone else"]);
    let err = store
        .commit(&[Op::Grant(record("b", 2))], true)
        .expect_err("a batch without the leader key must be refused");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
    let _: () = h.cmd(0, &["DEL", "lockd:leader"]);
    h.term = None;
    let snap = h.open().load().unwrap();
    assert_eq!(snap.leases, vec![record("a", 1)]);
}

#[test]
fn a_batch_beyond_one_scripts_size_is_cut_and_lands_whole() {
    let mut h = OnRedis::new();
    let mut s = h.open();
    // About 6 MiB of records: more than one script's 4 MiB.
    let long = "h".repeat(2000);
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
    let batch: String = h.cmd(0, &["GET", "lockd:batch"]);
    let scripts: u64 = batch.rsplit(':').next().unwrap().parse().unwrap();
    assert!(scripts >= 4, "the grants took several scripts: {batch}");
    let snap = h.open().load().unwrap();
    assert_eq!(snap.leases.len(), 1500);
    assert_eq!(snap.requests.len(), 3000);
    assert_eq!(snap.last_token, FencingToken::new(3000));
}

#[test]
fn the_key_layout_is_the_documented_one() {
    let mut h = OnRedis::new();
    let mut s = h.open();
    let mut rec = record("tenant/a/../b.c", 9);
    rec.request_id = Some("retry 1/2".to_string());
    s.commit(&[Op::Grant(rec.clone())], true).unwrap();
    let hw: String = h.cmd(0, &["GET", "lockd:high-water"]);
    assert_eq!(hw, "9");
    let lock: String = h.cmd(0, &["HGET", "lockd:locks", "tenant/a/../b.c"]);
    let lock: serde_json::Value = serde_json::from_str(&lock).unwrap();
    assert_eq!(lock["token"], 9);
    assert_eq!(lock["holder"], "h9");
    assert_eq!(lock["lease_id"], LeaseId::from_bytes([9; 16]).to_string());
    let req: String = h.cmd(0, &["HGET", "lockd:requests", "retry 1/2"]);
    let req: serde_json::Value = serde_json::from_str(&req).unwrap();
    assert_eq!(req["resource"], "tenant/a/../b.c");
    let leader: String = h.cmd(0, &["GET", "lockd:leader"]);
    let leader: serde_json::Value = serde_json::from_str(&leader).unwrap();
    assert_eq!(leader["address"], "http://test");
    assert_eq!(leader["master"], h.redis.servers[0].addr);
    let ttl: i64 = h.cmd(0, &["PTTL", "lockd:leader"]);
    assert!(
        (1..=2000).contains(&ttl),
        "the leader key lives its TTL: {ttl}"
    );
    let epoch: String = h.cmd(0, &["GET", "lockd:epoch"]);
    assert_eq!(epoch, "0");
    let batch: String = h.cmd(0, &["GET", "lockd:batch"]);
    assert!(batch.starts_with("0:") && batch.ends_with(":1"), "{batch}");
    // The replica has it too (the batch waited for it).
    let on_replica: String = h.cmd(1, &["HGET", "lockd:locks", "tenant/a/../b.c"]);
    assert_eq!(
        on_replica.len(),
        serde_json::to_string(&lock).unwrap().len()
    );
    let snap = h.open().load().unwrap();
    assert_eq!(snap.leases, vec![rec.clone()]);
    assert_eq!(snap.requests[0].request_id.as_deref(), Some("retry 1/2"));
}

#[test]
fn a_record_lockd_did_not_write_is_refused_on_load() {
    let mut h = OnRedis::new();
    let mut s = h.open();
    s.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    let _: i64 = h.cmd(0, &["HSET", "lockd:locks", "not a name", "{}"]);
    let err = h
        .open()
        .load()
        .expect_err("a foreign record must be refused");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("not a name"), "{err}");
}

#[test]
fn a_batch_the_replicas_did_not_take_is_not_answered_as_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = OnRedis::on(RedisSet::start(1, 1), dir, |o| RedisOptions {
        request_timeout: Duration::from_secs(2),
        ..o
    });
    let mut s = h.open();
    s.commit(&[Op::Grant(record("a", 1))], true).unwrap();
    // The only replica is stopped: WAIT cannot be answered with it.
    h.redis.pause(1, true);
    let err = s
        .commit(&[Op::Grant(record("b", 2))], true)
        .expect_err("a batch no replica has must not be answered as committed");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(err.to_string().contains("0 of the 1 replicas"), "{err}");
    // And the store commits nothing more in this term: its next batch is refused too.
    h.redis.pause(1, false);
    let err = s
        .commit(&[Op::Grant(record("c", 3))], true)
        .expect_err("after an unanswered batch the term's store refuses");
    assert!(matches!(err, StoreError::Deposed(_)), "{err}");
}

#[test]
fn a_master_that_does_not_sync_every_write_is_not_led() {
    let redis = RedisSet::start_with(0, 1, "appendfsync everysec");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cluster = rt
        .block_on(Cluster::connect(&options(&redis, dir.path())))
        .unwrap();
    let Err(e) = rt.block_on(cluster.campaign(&Member::new("http://test".to_string()))) else {
        panic!("a master without appendfsync always must not be led");
    };
    assert!(e.to_string().contains("appendfsync \"everysec\""), "{e}");
}

#[test]
fn a_wrong_master_name_is_an_error_at_connect() {
    let redis = RedisSet::start(0, 1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Err(e) = rt.block_on(Cluster::connect(&RedisOptions {
        master: "not-monitored".to_string(),
        ..options(&redis, dir.path())
    })) else {
        panic!("an unknown master name must be refused");
    };
    assert!(e.to_string().contains("\"not-monitored\""), "{e}");
}

#[test]
fn tokens_continue_above_the_epoch_floor_after_a_failover_whatever_the_new_master_holds() {
    let mut h = OnRedis::new();
    let mut s = h.open();
    s.load().unwrap();
    s.commit(&[Op::Grant(record("a", 7))], true).unwrap();
    h.end_term();
    // Sentinel promotes the replica: the configuration epoch rises.
    let _: () = {
        let c = redis::Client::open(format!("redis://{}/", h.redis.sentinels[0].addr)).unwrap();
        let mut c = h.rt.block_on(c.get_multiplexed_async_connection()).unwrap();
        h.rt.block_on(
            redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER)
                .query_async(&mut c),
        )
        .unwrap()
    };
    let promoted = h.redis.wait_failover_from(0);
    assert_eq!(promoted, 1);
    // The old master rejoins as a replica of the new one, so that WAIT can be answered.
    h.redis.wait_demoted(0);
    let mut s = loop_until_led(&mut h);
    let snap = s.load().unwrap_or_else(|e| {
        panic!(
            "{e}\n--- the old master:\n{}\n--- the new one:\n{}",
            h.redis.log(0),
            h.redis.log(1)
        )
    });
    let term = h.term.clone().unwrap();
    assert!(term.epoch() >= 1, "{term:?}");
    assert_eq!(term.master().address, h.redis.servers[1].addr);
    let floor = term.epoch() << EPOCH_SHIFT;
    assert_eq!(snap.last_token, FencingToken::new(floor));
    assert_eq!(
        snap.leases,
        vec![record("a", 7)],
        "the waited-for grant survived"
    );
    // Stored at once, so that the next term on this master continues from there.
    let hw: String = h.cmd(1, &["GET", "lockd:high-water"]);
    assert_eq!(hw, floor.to_string());
    let epoch: String = h.cmd(1, &["GET", "lockd:epoch"]);
    assert_eq!(epoch, term.epoch().to_string());
}

/// A term on the new master (campaigns fail while Sentinel still reconfigures).
fn loop_until_led(h: &mut OnRedis) -> RedisStore {
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    loop {
        match h
            .rt
            .block_on(h.cluster.campaign(&Member::new("http://test".to_string())))
        {
            Ok(Campaign::Won(t)) => {
                let term = Arc::new(t);
                let (c, t) = (Arc::clone(&h.cluster), Arc::clone(&term));
                h.rt.spawn(async move { c.keep_leading(&t).await });
                h.term = Some(Arc::clone(&term));
                return h.store(&term);
            }
            Ok(Campaign::Lost(l)) => panic!("the only candidate lost to {l:?}"),
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "no term on the new master: {e}"
            ),
        }
    }
}

#[test]
fn tokens_continue_above_this_instances_high_water_when_redis_lost_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut h = OnRedis::new();
        let mut s = h.open();
        s.load().unwrap();
        s.commit(&[Op::Grant(record("a", 40))], true).unwrap();
        h.cluster.high_water().flush().unwrap();
        std::fs::copy(
            h.dir.path().join(lockd_store_redis::HIGH_WATER_FILE),
            dir.path().join(lockd_store_redis::HIGH_WATER_FILE),
        )
        .unwrap();
    }
    // An empty Redis, and an instance whose data directory saw token 40.
    let mut h = OnRedis::on(RedisSet::start(1, 1), dir, |o| o);
    let snap = h.open().load().unwrap();
    assert_eq!(snap.last_token, FencingToken::new(40 + MARGIN));
    assert!(snap.leases.is_empty());
    let hw: String = h.cmd(0, &["GET", "lockd:high-water"]);
    assert_eq!(hw, (40 + MARGIN).to_string());
}

#[test]
fn a_second_candidate_loses_to_the_leader_and_names_it() {
    let mut h = OnRedis::new();
    let _s = h.open();
    let other =
        h.rt.block_on(h.cluster.campaign(&Member::new("http://other".to_string())))
            .unwrap();
    match other {
        Campaign::Lost(Some(l)) => assert_eq!(l.address, "http://test"),
        Campaign::Lost(None) => panic!("the leader's record must be readable"),
        Campaign::Won(_) => panic!("two leaders at once"),
    }
}

/// An outside tester's finding: a batch whose WAIT failed is on the master; the next term
/// loaded it and answered a retried request id with it at once, though no replica had it (a
/// failover then lost it, and the resource was granted twice). A term now answers nothing it
/// loaded before the replicas have it.
#[test]
fn a_term_answers_nothing_it_loaded_before_the_replicas_have_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = OnRedis::on(RedisSet::start(1, 1), dir, |o| RedisOptions {
        request_timeout: Duration::from_secs(2),
        ..o
    });
    let mut s = h.open();
    s.load().unwrap();
    h.redis.pause(1, true);
    let err = s
        .commit(&[Op::Grant(record("a", 1))], true)
        .expect_err("no replica: the batch is not answered");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    // The grant is on the master; the next term must not take it as answered yet.
    let err = h
        .open()
        .load()
        .expect_err("a term must not load what no replica has");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(
        err.to_string().contains("the state this term loaded"),
        "{err}"
    );
    // Once the replica has it, it is there to answer.
    h.redis.pause(1, false);
    let snap = h.open().load().unwrap();
    assert_eq!(snap.leases, vec![record("a", 1)]);
    let on_replica: i64 = h.cmd(1, &["HEXISTS", "lockd:locks", "a"]);
    assert_eq!(on_replica, 1);
}

/// An outside tester's findings: an epoch set by hand far above any real one was adopted
/// (every token at once exhausted, for good: the instances' high-water files took it too); a
/// leader key lockd did not write stopped every campaign with a message that named nothing.
#[test]
fn an_epoch_or_leader_key_lockd_did_not_write_is_refused_and_named() {
    let mut h = OnRedis::new();
    let campaign = |h: &OnRedis| {
        h.rt.block_on(h.cluster.campaign(&Member::new("http://test".to_string())))
    };
    for bad in ["999999999", "-5", "1.5", "abc"] {
        let _: () = h.cmd(0, &["SET", "lockd:epoch", bad]);
        let Err(e) = campaign(&h) else {
            panic!("an epoch of {bad:?} must be refused");
        };
        assert!(
            e.to_string().contains("lockd:epoch") && e.to_string().contains("not an epoch"),
            "{bad}: {e}"
        );
        assert_eq!(h.cluster.high_water().value(), 0, "nothing adopted");
    }
    let _: () = h.cmd(0, &["DEL", "lockd:epoch"]);
    let _: () = h.cmd(0, &["SET", "lockd:leader", "x"]);
    let Err(e) = campaign(&h) else {
        panic!("a leader key lockd did not write must be named");
    };
    assert!(
        e.to_string().contains("lockd:leader") && e.to_string().contains("DEL lockd:leader"),
        "{e}"
    );
    let _: () = h.cmd(0, &["DEL", "lockd:leader"]);
    let mut s = h.open();
    assert_eq!(s.load().unwrap().last_token, None);
}

/// An outside tester's finding: `CONFIG SET appendfsync everysec` on the master went unnoticed
/// until the next term. The keep-alive now checks it every round.
#[test]
fn a_master_that_stops_syncing_every_write_ends_the_term() {
    let mut h = OnRedis::new();
    let _s = h.open();
    let term = h.term.clone().unwrap();
    let _: () = h.cmd(0, &["CONFIG", "SET", "appendfsync", "everysec"]);
    h.rt.block_on(async { tokio::time::timeout(e2e::PATIENCE, term.wait_ended()).await })
        .expect("the term must end once the master no longer syncs every write");
    let why = term.ended().unwrap();
    assert!(why.contains("appendfsync \"everysec\""), "{why}");
    assert!(!term.in_force());
}

/// An outside tester's finding: with every Sentinel stopped, the keep-alive waited on them
/// before each renewal, and the term ran out though the master was fine. The renewals no
/// longer wait for the Sentinels.
#[test]
fn stopped_sentinels_hold_no_renewal_back() {
    let mut h = OnRedis::new();
    let _s = h.open();
    let term = h.term.clone().unwrap();
    h.redis.pause_sentinel(0, true);
    // Three renewals seen (the key's TTL going up again), and the key never gone meanwhile.
    let mut renewals = 0;
    let mut last = i64::MAX;
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    while renewals < 3 {
        let ttl: i64 = h.cmd(0, &["PTTL", "lockd:leader"]);
        assert!(
            ttl > 0,
            "the leader key ran out while the Sentinels were stopped"
        );
        if ttl > last {
            renewals += 1;
        }
        last = ttl;
        assert!(std::time::Instant::now() < deadline, "no renewal seen");
    }
    assert!(term.in_force(), "{:?}", term.ended());
    h.redis.pause_sentinel(0, false);
}
