//! The leader's store: the core's batches as ZooKeeper multi-ops conditional on the leader's
//! election node and on the batch before.

use std::sync::Arc;

use fencing::FencingToken;
use lockd_core::{Op, Snapshot};
use lockd_store::{StoreError, check_batch};
use lockd_store_kv::{Change, Key, Mirror};
use tokio::runtime::Handle;
use zookeeper_client as zk;

use crate::Cluster;
use crate::election::Term;

/// Most bytes of paths and data in one multi-op: half of ZooKeeper's default
/// `jute.maxbuffer` (1 MiB), whatever the limits on names, holders and request ids.
pub const MAX_MULTI_BYTES: usize = 512 << 10;

/// Most operations in one multi-op.
pub const MAX_MULTI_OPS: usize = 2048;

/// Bytes counted for each operation beside its path and data (its header).
const OP_OVERHEAD: usize = 32;

/// The state of one term in ZooKeeper. See the crate documentation.
pub struct ZkStore {
    cluster: Arc<Cluster>,
    term: Arc<Term>,
    mirror: Mirror,
    /// The version of `{p}/batch` after the last batch committed (or as loaded; `None`: not
    /// read yet): the next batch sets it only at this version.
    batch_version: Option<i32>,
    batches: u64,
    /// Tells this store's batches from any other's in `{p}/batch`.
    nonce: u64,
    /// The runtime the ZooKeeper calls run on (`commit` is called from plain threads).
    runtime: Handle,
}

impl ZkStore {
    /// The store of `term`, whose ZooKeeper calls run on the current runtime.
    pub fn new(cluster: Arc<Cluster>, term: Arc<Term>) -> ZkStore {
        ZkStore {
            cluster,
            term,
            mirror: Mirror::default(),
            batch_version: None,
            batches: 0,
            nonce: {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b)
                    .expect("the operating system's random number generator failed");
                u64::from_le_bytes(b)
            },
            runtime: Handle::current(),
        }
    }

    /// Reads the whole state through the term's session, and applies the high-water rule
    /// ([`lockd_store_kv::highwater`]): if this instance has seen tokens above what
    /// ZooKeeper holds (it lost data, or was restored from a backup), tokens continue above
    /// them, and ZooKeeper is told at once.
    pub async fn load_async(&mut self) -> Result<Snapshot, StoreError> {
        let read = self.cluster.read_state(self.term.client()).await?;
        let (mut snapshot, stored) = read.stored.snapshot();
        self.batch_version = Some(read.batch_version);
        let last = self
            .cluster
            .high_water()
            .continue_at(stored, 0, "ZooKeeper");
        snapshot.last_token = FencingToken::new(last);
        self.mirror = Mirror::of(&snapshot);
        if last > stored {
            self.apply(vec![(Key::HighWater, Change::Put(last.to_string()))])
                .await?;
        }
        self.cluster.high_water().saw(last);
        Ok(snapshot)
    }

    /// One multi-op of `changes`: the leader's node checked first, then each change, then the
    /// batch node set at the version the previous batch left, so that the multi commits only
    /// while this term's node lives and no other batch came in between. The term is checked
    /// by this instance's own clock first.
    async fn apply(&mut self, changes: Vec<(Key, Change)>) -> Result<(), StoreError> {
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
        let batch_version = match self.batch_version {
            Some(v) => v,
            None => {
                let v = self.cluster.batch_version(self.term.client()).await?;
                self.batch_version = Some(v);
                v
            }
        };
        let paths = self.cluster.paths();
        let id = format!(
            "{}:{:016x}:{}",
            self.term.node(),
            self.nonce,
            self.batches + 1
        );
        let create = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let client = self.term.client();
        let mut multi = client.new_multi_writer();
        // What each operation of the multi is about, for the error that names it.
        let mut about = vec![self.term.node().to_string()];
        let bad = |e: zk::Error| StoreError::Io(format!("building a ZooKeeper multi-op: {e}"));
        multi.add_check_version(self.term.node(), 0).map_err(bad)?;
        for (key, change) in &changes {
            let path = paths.name(key);
            let stored = self.mirror.holds(key);
            match (change, stored) {
                (Change::Put(v), true) => multi.add_set_data(&path, v.as_bytes(), None),
                (Change::Put(v), false) => multi.add_create(&path, v.as_bytes(), &create),
                (Change::Delete, true) => multi.add_delete(&path, None),
                (Change::Delete, false) => continue,
            }
            .map_err(bad)?;
            about.push(path);
        }
        multi
            .add_set_data(paths.batch(), id.as_bytes(), Some(batch_version))
            .map_err(bad)?;
        about.push(paths.batch().to_string());
        let answer = self
            .cluster
            .answer("committing a batch", multi.commit())
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        match answer {
            Ok(_) => {
                self.batches += 1;
                self.batch_version = Some(batch_version + 1);
                Ok(())
            }
            Err(zk::MultiWriteError::OperationFailed { index: 0, source }) => {
                Err(StoreError::Deposed(format!(
                    "{} is no longer this instance's election node ({source}): another instance may lead",
                    self.term.node()
                )))
            }
            Err(zk::MultiWriteError::OperationFailed { index, source })
                if index + 1 == about.len() =>
            {
                Err(StoreError::Deposed(format!(
                    "{} is not at version {} ({source}): another batch was committed in between",
                    paths.batch(),
                    batch_version
                )))
            }
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                Err(StoreError::Corrupt(format!(
                    "ZooKeeper refused the change of {} ({source}): the stored state is not what this leader read and wrote (changed by hand?)",
                    about.get(index).map_or("?", String::as_str)
                )))
            }
            // The outcome of a multi whose answer was lost is unknown: the writer stops and
            // the term ends, and the next leader reads what landed.
            Err(zk::MultiWriteError::RequestFailed {
                source: zk::Error::SessionExpired,
            }) => Err(StoreError::Deposed(
                "this instance's ZooKeeper session expired".to_string(),
            )),
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(StoreError::Unavailable(
                format!("committing a batch: {}", crate::failed("ZooKeeper", source)),
            )),
        }
    }

    /// Commits `ops` as few multi-ops as ZooKeeper's request size allows, each a
    /// prefix-closed piece of the batch.
    async fn commit_async(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        // Refused before anything is sent: a refused batch changes nothing.
        check_batch(&self.mirror, ops)?;
        let cluster = Arc::clone(&self.cluster);
        let paths = cluster.paths();
        let mut start = 0;
        while start < ops.len() {
            let piece = self
                .mirror
                .piece(ops, start, MAX_MULTI_OPS - 2, MAX_MULTI_BYTES, |k| {
                    paths.name_len(k) + OP_OVERHEAD
                });
            let end = piece.end;
            self.apply(piece.changes.into_iter().collect()).await?;
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

lockd_store_kv::blocking_store!(ZkStore);
