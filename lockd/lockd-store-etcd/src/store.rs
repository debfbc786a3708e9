//! The leader's store: the core's batches as etcd transactions conditional on the leader key.

use std::collections::BTreeMap;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use fencing::FencingToken;
use lockd_core::{Op, Snapshot};
use lockd_store::{StoreError, check_batch};
use lockd_store_kv::{Change, Key, Mirror};
use tokio::runtime::Handle;

use crate::Cluster;
use crate::election::Term;
use crate::state::Stored;

/// Most bytes of keys and values in one transaction: well under etcd's default
/// `--max-request-bytes` (1.5 MiB), whatever the limits on names, holders and request ids.
pub const MAX_TXN_BYTES: usize = 1 << 20;

/// The state of one term in etcd. See the crate documentation.
pub struct EtcdStore {
    cluster: Arc<Cluster>,
    term: Arc<Term>,
    mirror: Mirror,
    /// Batches of this store committed so far, and the revision of the last one (`None`:
    /// none yet). Each batch is conditional on `{p}/batch` having that revision.
    batches: u64,
    last_batch: Option<i64>,
    /// Tells this store's batches from any other's in `{p}/batch`.
    nonce: u64,
    /// The runtime the etcd calls run on (`commit` is called from plain threads).
    runtime: Handle,
}

impl EtcdStore {
    /// The store of `term`, whose etcd calls run on the current runtime.
    pub fn new(cluster: Arc<Cluster>, term: Arc<Term>) -> EtcdStore {
        EtcdStore {
            cluster,
            term,
            mirror: Mirror::default(),
            batches: 0,
            last_batch: None,
            nonce: {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b)
                    .expect("the operating system's random number generator failed");
                u64::from_le_bytes(b)
            },
            runtime: Handle::current(),
        }
    }

    /// Reads the whole state at one revision, and applies the high-water rule (see
    /// [`highwater`](crate::highwater)).
    pub async fn load_async(&mut self) -> Result<Snapshot, StoreError> {
        let (stored, _) = self.cluster.read_state().await?;
        self.load_from(&stored).await
    }

    /// Starts from `stored` (a follower's warm copy, at or after the term's revision) instead
    /// of reading it, and applies the high-water rule.
    pub async fn load_from(&mut self, stored: &Stored) -> Result<Snapshot, StoreError> {
        let (mut snapshot, stored_hw) = stored.snapshot();
        let last = self.cluster.high_water().continue_at(stored_hw, 0, "etcd");
        if last > stored_hw {
            // Written down at once, so that other instances continue from here too.
            self.put_high_water(last).await?;
        }
        snapshot.last_token = FencingToken::new(last);
        self.mirror = Mirror::of(&snapshot);
        self.cluster.high_water().saw(last);
        Ok(snapshot)
    }

    async fn put_high_water(&mut self, value: u64) -> Result<(), StoreError> {
        let mut changes = BTreeMap::new();
        changes.insert(Key::HighWater, Change::Put(value.to_string()));
        self.apply(changes).await
    }

    /// One transaction of `changes`, conditional on the term twice (this instance's own
    /// check that its term is in force, by its clock checked against etcd's; and etcd's
    /// compare of the leader key's create revision and lease with the term's), and on the
    /// term's previous batch being the last one committed (`{p}/batch`'s mod revision).
    ///
    /// The last condition makes retries safe: a call that timed out on one member is sent
    /// again to another, and the first attempt may still land later. Landing after a later
    /// batch, it would undo that batch (a release's delete after the next grant's put); with
    /// the condition it fails and changes nothing. An attempt that fails because an earlier
    /// attempt of the same batch committed finds its own id in `{p}/batch`, and succeeds.
    async fn apply(&mut self, changes: BTreeMap<Key, Change>) -> Result<(), StoreError> {
        if !self
            .term
            .wait_in_force(self.cluster.request_timeout())
            .await
        {
            return Err(StoreError::Deposed(format!(
                "this instance's term is over by its own clock{}",
                self.term
                    .ended()
                    .map_or(String::new(), |why| format!(": {why}"))
            )));
        }
        let keys = self.cluster.keys();
        let id = format!(
            "{}:{:016x}:{}",
            self.term.revision(),
            self.nonce,
            self.batches + 1
        );
        let mut ops: Vec<TxnOp> = changes
            .into_iter()
            .map(|(k, c)| match c {
                Change::Put(v) => TxnOp::put(keys.name(&k), v, None),
                Change::Delete => TxnOp::delete(keys.name(&k), None),
            })
            .collect();
        ops.push(TxnOp::put(keys.batch(), id.clone(), None));
        let after = match self.last_batch {
            Some(revision) => Compare::mod_revision(keys.batch(), CompareOp::Equal, revision),
            // The previous terms' batches all committed before this term's key was written.
            None => Compare::mod_revision(keys.batch(), CompareOp::Less, self.term.revision()),
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(keys.leader(), CompareOp::Equal, self.term.revision()),
                Compare::lease(keys.leader(), CompareOp::Equal, self.term.lease()),
                after,
            ])
            .and_then(ops)
            .or_else([TxnOp::get(keys.batch(), None)]);
        let r = self.cluster.txn("committing a batch", txn).await?;
        let committed = if r.succeeded() {
            r.header().map(|h| h.revision())
        } else {
            // An earlier attempt of this very batch may have committed (its answer lost).
            match r.op_responses().first() {
                Some(TxnOpResponse::Get(g)) => g
                    .kvs()
                    .first()
                    .filter(|kv| kv.value() == id.as_bytes())
                    .map(etcd_client::KeyValue::mod_revision),
                _ => None,
            }
        };
        match committed {
            Some(revision) => {
                self.batches += 1;
                self.last_batch = Some(revision);
                Ok(())
            }
            None => Err(StoreError::Deposed(format!(
                "{} is no longer this instance's key (revision {}, lease {}), or another batch was committed in between",
                keys.leader(),
                self.term.revision(),
                self.term.lease()
            ))),
        }
    }

    /// Commits `ops` as few transactions as etcd's limits allow (`max_txn_ops` operations,
    /// [`MAX_TXN_BYTES`]), each a prefix-closed piece of
    /// the batch (a grant's lock, request record and high-water always travel together).
    async fn commit_async(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        // Refused before anything is sent: a refused batch changes nothing.
        check_batch(&self.mirror, ops)?;
        // One operation of each transaction is the put of `{p}/batch`.
        let max = self.cluster.max_txn_ops - 1;
        let cluster = Arc::clone(&self.cluster);
        let keys = cluster.keys();
        let mut start = 0;
        while start < ops.len() {
            let piece = self
                .mirror
                .piece(ops, start, max, MAX_TXN_BYTES, |k| match k {
                    Key::HighWater => keys.high_water().len(),
                    Key::Lock(r) => keys.locks().len() + r.as_str().len(),
                    Key::Request(id) => keys.requests().len() + id.len(),
                });
            let end = piece.end;
            self.apply(piece.changes).await?;
            for op in &ops[start..end] {
                self.mirror.apply(op);
            }
            if let Some(last) = self.mirror.high_water() {
                self.cluster.high_water().saw(last.get());
            }
            start = end;
        }
        Ok(())
    }
}

lockd_store_kv::blocking_store!(EtcdStore);
