//! The leader's store: the core's batches as Lua scripts conditional on the leader key and on
//! the batch before, each waited for by the replicas.

use std::sync::Arc;
use std::time::Duration;

use fencing::FencingToken;
use lockd_core::{Op, Snapshot};
use lockd_store::{StoreError, check_batch};
use lockd_store_kv::{Change, Key, Mirror};
use tokio::runtime::Handle;

use crate::election::Term;
use crate::scripts::COMMIT;
use crate::{Cluster, epoch_floor};

/// Most bytes of fields and values in one script: Redis serves nobody else while a script
/// runs, so a batch beyond this is cut into several.
pub const MAX_SCRIPT_BYTES: usize = 4 << 20;

/// Most changes in one script.
pub const MAX_SCRIPT_CHANGES: usize = 8192;

/// Bytes counted for each change beside its field and value.
const CHANGE_OVERHEAD: usize = 16;

/// The state of one term in Redis. See the crate documentation.
pub struct RedisStore {
    cluster: Arc<Cluster>,
    term: Arc<Term>,
    mirror: Mirror,
    /// The id of the last batch committed (or as loaded; `None`: not read yet): the next
    /// batch lands only while the batch key holds it.
    batch: Option<String>,
    batches: u64,
    /// Tells this store's batches from any other's.
    nonce: u64,
    /// Why a batch of this store failed: its outcome may be unknown (on the master, not on
    /// the replicas), so the mirror may be wrong, and the store commits nothing more.
    broken: Option<String>,
    /// The runtime the Redis calls run on (`commit` is called from plain threads).
    runtime: Handle,
}

impl RedisStore {
    /// The store of `term`, whose Redis calls run on the current runtime.
    pub fn new(cluster: Arc<Cluster>, term: Arc<Term>) -> RedisStore {
        RedisStore {
            cluster,
            term,
            mirror: Mirror::default(),
            batch: None,
            batches: 0,
            nonce: {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b)
                    .expect("the operating system's random number generator failed");
                u64::from_le_bytes(b)
            },
            broken: None,
            runtime: Handle::current(),
        }
    }

    /// Reads the whole state from the term's master. Tokens continue above the highest of:
    /// the stored high-water, the term's epoch floor ([`crate::epoch_floor`]), and this
    /// instance's high-water file plus a margin if the master is behind it
    /// ([`lockd_store_kv::highwater`]); a raise is written to Redis at once.
    pub async fn load_async(&mut self) -> Result<Snapshot, StoreError> {
        let mut conn = self.term.conn();
        let read = self.cluster.read_state(&mut conn).await?;
        // What an earlier term wrote may be on the master only (its batch's WAIT failed, and
        // nobody was told of it). It is answered from now on (a retried request id gets its
        // grant): so not before the replicas have it. This connection's last write (the
        // term's campaign) came after all of it, so one WAIT covers it all.
        self.wait_for_replicas(&mut conn, "the state this term loaded")
            .await?;
        let (mut snapshot, stored) = read.stored.snapshot();
        self.batch = Some(read.batch);
        let last =
            self.cluster
                .high_water()
                .continue_at(stored, epoch_floor(self.term.epoch()), "Redis");
        snapshot.last_token = FencingToken::new(last);
        self.mirror = Mirror::of(&snapshot);
        if last > stored {
            self.apply(vec![(Key::HighWater, Change::Put(last.to_string()))])
                .await?;
        }
        self.cluster.high_water().saw(last);
        Ok(snapshot)
    }

    /// One script of `changes`, then `WAIT` for the replicas. The term is checked by this
    /// instance's own clock first.
    async fn apply(&mut self, changes: Vec<(Key, Change)>) -> Result<(), StoreError> {
        let timeout = self.cluster.request_timeout();
        if !self.term.wait_in_force(timeout).await {
            return Err(StoreError::Deposed(format!(
                "this instance's term is over by its own clock{}",
                self.term
                    .ended()
                    .map_or(String::new(), |why| format!(": {why}"))
            )));
        }
        let mut conn = self.term.conn();
        let previous = match &self.batch {
            Some(b) => b.clone(),
            None => {
                let b = self.cluster.batch_id(&mut conn).await?;
                self.batch = Some(b.clone());
                b
            }
        };
        let id = format!(
            "{}:{:016x}:{}",
            self.term.epoch(),
            self.nonce,
            self.batches + 1
        );
        let keys = self.cluster.keys();
        let script = redis::Script::new(COMMIT);
        let mut call = script.prepare_invoke();
        call.key(&keys.leader)
            .key(&keys.batch)
            .key(&keys.locks)
            .key(&keys.requests)
            .key(&keys.high_water)
            .arg(self.term.value())
            .arg(&previous)
            .arg(&id);
        for (key, change) in &changes {
            let (op, field): (&str, &str) = match (key, change) {
                (Key::Lock(r), Change::Put(_)) => ("L", r.as_str()),
                (Key::Lock(r), Change::Delete) => ("l", r.as_str()),
                (Key::Request(q), Change::Put(_)) => ("R", q),
                (Key::Request(q), Change::Delete) => ("r", q),
                (Key::HighWater, Change::Put(_)) => ("H", ""),
                (Key::HighWater, Change::Delete) => continue,
            };
            let value = match change {
                Change::Put(v) => v.as_str(),
                Change::Delete => "",
            };
            call.arg(op).arg(field).arg(value);
        }
        let answer: i64 = self
            .cluster
            .within("committing a batch", call.invoke_async(&mut conn))
            .await?;
        match answer {
            1 => {}
            0 => {
                return Err(StoreError::Deposed(format!(
                    "{} no longer holds this term's value: another instance may lead",
                    keys.leader
                )));
            }
            _ => {
                return Err(StoreError::Deposed(format!(
                    "{} does not hold this term's last batch: another batch was committed in between",
                    keys.batch
                )));
            }
        }
        self.batches += 1;
        self.batch = Some(id);
        self.wait_for_replicas(&mut conn, "a batch").await
    }

    /// `WAIT` for `redis_wait_replicas` replicas to have every write made through `conn` so
    /// far (and so every write the master took before them): an error if fewer have them in
    /// time (`what` names the writes in it).
    async fn wait_for_replicas(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        what: &str,
    ) -> Result<(), StoreError> {
        let wanted = self.cluster.options.wait_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let timeout = self.cluster.request_timeout();
        // Redis answers a WAIT at its timeout with the count reached (late by up to its event
        // loop's 100 ms tick): a fifth, and at least 150 ms, less than the request timeout, so
        // that the count comes before the call's deadline.
        let wait = timeout
            .saturating_sub((timeout / 5).max(Duration::from_millis(150)))
            .max(Duration::from_millis(1));
        let reached: i64 = self
            .cluster
            .within(
                "waiting for the replicas",
                redis::cmd("WAIT")
                    .arg(wanted)
                    .arg(wait.as_millis() as u64)
                    .query_async(conn),
            )
            .await?;
        if reached < i64::from(wanted) {
            // On the master, not on enough replicas: a failover now could lose it. Not
            // answered as a success; the term ends, and the next leader reads what is there
            // (and waits for the replicas to have it before it answers anything).
            return Err(StoreError::Unavailable(format!(
                "{what} reached {reached} of the {wanted} replicas asked for (redis_wait_replicas) within {wait:?}"
            )));
        }
        Ok(())
    }

    /// Commits `ops` as few scripts as [`MAX_SCRIPT_BYTES`] allows, each a prefix-closed
    /// piece of the batch.
    async fn commit_async(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        if let Some(why) = &self.broken {
            return Err(StoreError::Deposed(format!(
                "this term's store stopped after a batch failed ({why}): the next leader reads what landed"
            )));
        }
        // Refused before anything is sent: a refused batch changes nothing.
        check_batch(&self.mirror, ops)?;
        let cluster = Arc::clone(&self.cluster);
        let mut start = 0;
        while start < ops.len() {
            let piece = self
                .mirror
                .piece(ops, start, MAX_SCRIPT_CHANGES, MAX_SCRIPT_BYTES, |k| {
                    CHANGE_OVERHEAD
                        + match k {
                            Key::HighWater => 0,
                            Key::Lock(r) => r.as_str().len(),
                            Key::Request(q) => q.len(),
                        }
                });
            let end = piece.end;
            if let Err(e) = self.apply(piece.changes.into_iter().collect()).await {
                self.broken = Some(e.to_string());
                return Err(e);
            }
            for op in &ops[start..end] {
                self.mirror.apply(op);
            }
            if let Some(last) = self.mirror.high_water() {
                cluster.high_water().saw(last.get());
            }
            start = end;
        }
        Ok(())
    }

    /// The highest token this store holds.
    pub fn high_water(&self) -> Option<FencingToken> {
        self.mirror.high_water()
    }
}

lockd_store_kv::blocking_store!(RedisStore);
