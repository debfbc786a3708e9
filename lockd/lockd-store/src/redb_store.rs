//! The embedded, durable store: a redb file (`lockd.redb`) behind a journal (`lockd.journal`),
//! both in the data directory.
//!
//! redb tables: `leases` (resource → lease record), `requests` (request id → lease record) and
//! `meta` (`format_version`, `last_token`, `applied_seq`).
//!
//! A batch is made durable by appending it to the journal and syncing that (one small write,
//! one `fdatasync`); then it is answered. It is applied to redb afterwards, without a sync, by
//! [`Store::tidy`] (or before the next batch). When the journal fills up, and on a clean close,
//! a checkpoint commits redb durably with the number of the last applied journal record, and
//! the journal starts over. On open, records numbered above redb's `applied_seq` are replayed.
//! The server batches many grants into one journal append (group commit).
//!
//! Batches are checked against redb before they are journaled (see `check`), so a refused
//! batch reaches neither file. The files are locked by redb while open, so two lockd processes
//! cannot share a directory.

use std::path::{Path, PathBuf};

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{Op, Snapshot};
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};

use crate::check::{View, check_batch};
use crate::encoding::{decode, encode};
use crate::journal::Journal;
use crate::{Store, StoreError};

const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
const REQUESTS: TableDefinition<&str, &[u8]> = TableDefinition::new("requests");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const META_FORMAT_VERSION: &str = "format_version";
const META_LAST_TOKEN: &str = "last_token";
const META_APPLIED_SEQ: &str = "applied_seq";
/// Bumped when the layout of the tables, records or journal changes incompatibly.
const FORMAT_VERSION: u64 = 1;
/// Ops applied to redb without a sync before a checkpoint. A checkpoint syncs every page redb
/// wrote since the last one, and redb writes whole copies of the pages it changes, so its cost
/// grows with the interval: measured with `examples/checkpoint_cost.rs` (20,000 held leases,
/// a release and a grant per commit), every commit 0.23 ms, every 8 commits 0.34 ms, every 64
/// commits 0.47 ms, every 512 commits 1.2 ms (p99 7 ms), every 4096 commits 21 ms. 128 ops
/// (about 64 commits) keeps each checkpoint under a millisecond for about 10 us per op.
const CHECKPOINT_OPS: usize = 128;

/// The redb file's name inside the data directory.
pub const DATA_FILE: &str = "lockd.redb";
/// The journal's file name inside the data directory.
pub const JOURNAL_FILE: &str = "lockd.journal";

/// Tuning of the redb store.
#[derive(Clone, Debug)]
pub struct RedbStoreOptions {
    /// redb's page cache, in bytes. redb's own default (1 GiB) would dominate lockd's memory;
    /// the working set of a commit is a few pages, and a restart reads the file once.
    pub cache_size_bytes: usize,
    /// Size of the journal file. A checkpoint runs each time it fills: bigger means fewer
    /// checkpoints and a longer replay after a crash (about a second per 32 MiB).
    pub journal_bytes: u64,
}

impl Default for RedbStoreOptions {
    fn default() -> RedbStoreOptions {
        RedbStoreOptions {
            cache_size_bytes: 32 << 20,
            journal_bytes: 32 << 20,
        }
    }
}

/// See the module documentation.
pub struct RedbStore {
    db: Option<Database>,
    journal: Journal,
    path: PathBuf,
    /// Journaled, not yet applied to redb.
    deferred: Vec<Op>,
    /// Number of the last journal record written.
    last_seq: u64,
    /// Ops applied to redb since the last checkpoint.
    unsynced_ops: usize,
}

impl RedbStore {
    /// Opens (creating if needed) the store in `dir`, replaying the journal if the last run
    /// did not end with a checkpoint.
    pub fn open(dir: &Path, options: &RedbStoreOptions) -> Result<RedbStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Io(format!(
                "cannot create the data directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join(DATA_FILE);
        let shown = path.display().to_string();
        let db = Database::builder()
            .set_cache_size(options.cache_size_bytes)
            .create(&path)
            .map_err(|e| match e {
                DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
                    path: dir.display().to_string(),
                },
                other => StoreError::Io(format!("cannot open {shown}: {other}")),
            })?;
        let applied_seq = prepare(&db, &shown)?;
        let (journal, records) = Journal::open(&dir.join(JOURNAL_FILE), options.journal_bytes)?;
        let mut store = RedbStore {
            db: Some(db),
            journal,
            path,
            deferred: Vec::new(),
            last_seq: applied_seq,
            unsynced_ops: 0,
        };
        for record in records {
            if record.seq <= applied_seq {
                continue; // already in redb
            }
            store.check(&record.ops).map_err(|e| {
                StoreError::Corrupt(format!(
                    "journal record {} does not apply to the stored state: {e}",
                    record.seq
                ))
            })?;
            store.deferred = record.ops;
            store.last_seq = record.seq;
            store.apply_deferred()?;
        }
        store.checkpoint()?;
        Ok(store)
    }

    /// The redb file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies everything journaled and commits redb durably; the journal starts over. Done
    /// when the journal fills up and on a clean close.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        self.checkpoint()
    }

    /// Closes the store *without* a checkpoint, as a crash would leave it (for tests).
    pub fn abandon(mut self) {
        drop(self.db.take());
    }

    fn db(&self) -> &Database {
        self.db.as_ref().expect("the database is open until drop")
    }

    /// Checks `ops` against redb as it is (see `check`): call after `apply_deferred`.
    fn check(&self, ops: &[Op]) -> Result<(), StoreError> {
        let tx = self.db().begin_read()?;
        let (leases, requests, meta) = (
            tx.open_table(LEASES)?,
            tx.open_table(REQUESTS)?,
            tx.open_table(META)?,
        );
        check_batch(
            &TxView {
                leases: &leases,
                requests: &requests,
                meta: &meta,
            },
            ops,
        )
        .map(|_| ())
    }

    fn checkpoint_due(&self) -> bool {
        self.unsynced_ops >= CHECKPOINT_OPS || self.journal.half_full()
    }

    fn checkpoint(&mut self) -> Result<(), StoreError> {
        self.apply_deferred()?;
        let mut tx = self.db().begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        tx.open_table(META)?
            .insert(META_APPLIED_SEQ, self.last_seq)?;
        tx.commit()?;
        self.journal.restart();
        self.unsynced_ops = 0;
        Ok(())
    }

    /// Applies the journaled batch to redb (not durably: the journal holds it).
    fn apply_deferred(&mut self) -> Result<(), StoreError> {
        if self.deferred.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut self.deferred);
        self.unsynced_ops += ops.len();
        let mut tx = self.db().begin_write()?;
        tx.set_durability(Durability::None)?;
        {
            let mut leases = tx.open_table(LEASES)?;
            let mut requests = tx.open_table(REQUESTS)?;
            let mut meta = tx.open_table(META)?;
            let mut last_token = None;
            for op in ops.iter().flat_map(Op::parts) {
                match op {
                    Op::Atomic(_) => unreachable!("parts are never atomic ops"),
                    Op::Grant(rec) => {
                        let bytes = encode(rec);
                        leases.insert(rec.resource.as_str(), bytes.as_slice())?;
                        if let Some(id) = &rec.request_id {
                            // Remembered as granted, without the reentrant part, the
                            // permits or the side (only the lease keeps them).
                            let plain = rec.reentrant.is_none()
                                && rec.permits.is_none()
                                && rec.rw.is_none();
                            let remembered = match plain {
                                true => bytes,
                                false => encode(&rec.remembered_as(id)),
                            };
                            requests.insert(id.as_str(), remembered.as_slice())?;
                        }
                        last_token = Some(rec.token);
                    }
                    Op::Remove { resource, .. } => {
                        leases.remove(resource.as_str())?;
                    }
                    Op::ForgetRequest { request_id } => {
                        requests.remove(request_id.as_str())?;
                    }
                    Op::Reenter { resource, .. } | Op::Unhold { resource, .. } => {
                        let stored = leases.get(resource.as_str())?.map(|v| v.value().to_vec());
                        if let Some(bytes) = stored {
                            let mut rec = decode(&bytes)?;
                            op.apply_holds(&mut rec);
                            leases.insert(resource.as_str(), encode(&rec).as_slice())?;
                            if let Op::Reenter {
                                request_id: Some(id),
                                ..
                            } = op
                            {
                                let remembered = encode(&rec.remembered_as(id));
                                requests.insert(id.as_str(), remembered.as_slice())?;
                            }
                        }
                    }
                }
            }
            if let Some(token) = last_token {
                meta.insert(META_LAST_TOKEN, token.get())?;
            }
            meta.insert(META_APPLIED_SEQ, self.last_seq)?;
        }
        tx.commit()?;
        Ok(())
    }
}

/// Creates the tables and checks the format on open; returns the last applied journal record.
fn prepare(db: &Database, shown: &str) -> Result<u64, StoreError> {
    let tx = db.begin_write()?;
    let applied;
    {
        let mut meta = tx.open_table(META)?;
        tx.open_table(LEASES)?;
        tx.open_table(REQUESTS)?;
        let found = meta.get(META_FORMAT_VERSION)?.map(|v| v.value());
        match found {
            None => {
                meta.insert(META_FORMAT_VERSION, FORMAT_VERSION)?;
            }
            Some(FORMAT_VERSION) => {}
            Some(found) => {
                return Err(StoreError::Version {
                    path: shown.to_string(),
                    found,
                    supported: FORMAT_VERSION,
                });
            }
        }
        applied = meta.get(META_APPLIED_SEQ)?.map_or(0, |v| v.value());
    }
    tx.commit()?;
    Ok(applied)
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        if self.db.is_some() {
            // Best effort: if this fails, the next open replays the journal.
            let _ = self.checkpoint();
        }
    }
}

struct TxView<'a, L, M> {
    leases: &'a L,
    requests: &'a L,
    meta: &'a M,
}

impl<L, M> View for TxView<'_, L, M>
where
    L: ReadableTable<&'static str, &'static [u8]>,
    M: ReadableTable<&'static str, u64>,
{
    fn lease(&self, resource: &ResourceName) -> Result<Option<LeaseId>, StoreError> {
        match self.leases.get(resource.as_str())? {
            None => Ok(None),
            Some(v) => Ok(Some(decode(v.value())?.lease_id)),
        }
    }
    fn has_request(&self, request_id: &str) -> Result<bool, StoreError> {
        Ok(self.requests.get(request_id)?.is_some())
    }
    fn last_token(&self) -> Result<Option<FencingToken>, StoreError> {
        last_token(self.meta.get(META_LAST_TOKEN)?.map(|v| v.value()))
    }
}

fn last_token(raw: Option<u64>) -> Result<Option<FencingToken>, StoreError> {
    match raw {
        None => Ok(None),
        Some(raw) => FencingToken::new(raw)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt(format!("stored last_token {raw} is out of range"))),
    }
}

impl Store for RedbStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        self.apply_deferred()?;
        let tx = self.db().begin_read()?;
        let meta = tx.open_table(META)?;
        let last_token = last_token(meta.get(META_LAST_TOKEN)?.map(|v| v.value()))?;
        let leases_table = tx.open_table(LEASES)?;
        let mut leases = Vec::with_capacity(leases_table.len()? as usize);
        for entry in leases_table.iter()? {
            let (key, value) = entry?;
            let rec = decode(value.value())?;
            if rec.resource.as_str() != key.value() {
                return Err(StoreError::Corrupt(format!(
                    "lease stored under {:?} names {}",
                    key.value(),
                    rec.resource
                )));
            }
            leases.push(rec);
        }
        let requests_table = tx.open_table(REQUESTS)?;
        let mut requests = Vec::with_capacity(requests_table.len()? as usize);
        for entry in requests_table.iter()? {
            let (key, value) = entry?;
            let rec = decode(value.value())?;
            if rec.request_id.as_deref() != Some(key.value()) {
                return Err(StoreError::Corrupt(format!(
                    "request stored under {:?} names another id",
                    key.value()
                )));
            }
            requests.push(rec);
        }
        Ok(Snapshot {
            last_token,
            leases,
            requests,
        })
    }

    fn commit(&mut self, ops: &[Op], sync: bool) -> Result<(), StoreError> {
        if ops.is_empty() {
            return if sync { self.journal.sync() } else { Ok(()) };
        }
        self.apply_deferred()?;
        if self.checkpoint_due() {
            self.checkpoint()?;
        }
        self.check(ops)?;
        if !self.journal.fits(ops) {
            // Everything before this batch moves into redb, durably; the journal starts over.
            self.journal.sync()?;
            self.checkpoint()?;
        }
        if !self.journal.could_ever_fit(ops) {
            // Larger than the whole journal: straight into redb, durably.
            self.deferred = ops.to_vec();
            self.last_seq += 1;
            return self.checkpoint();
        }
        self.last_seq = self.journal.append(self.last_seq + 1, ops)?;
        if sync {
            self.journal.sync()?;
        }
        self.deferred = ops.to_vec();
        Ok(())
    }

    fn tidy(&mut self) -> Result<(), StoreError> {
        self.apply_deferred()?;
        if self.checkpoint_due() {
            self.checkpoint()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::sample_grant as grant;

    /// A checkpoint costs a redb sync: it must come every `CHECKPOINT_OPS` ops, not after each
    /// commit once the first one has run.
    #[test]
    fn checkpoints_come_once_per_checkpoint_ops() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedbStore::open(dir.path(), &RedbStoreOptions::default()).unwrap();
        let mut checkpoints = 0;
        for n in 1..=(3 * CHECKPOINT_OPS as u64) {
            s.commit(&[grant(n)], false).unwrap();
            // A commit that checkpointed leaves nothing applied unsynced.
            if n > 1 && s.unsynced_ops == 0 {
                checkpoints += 1;
            }
        }
        assert_eq!(checkpoints, 2, "one checkpoint per {CHECKPOINT_OPS} ops");
    }
}
