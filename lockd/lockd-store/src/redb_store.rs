//! The embedded, durable store: a redb file (`lockd.redb`) behind two journals
//! (`lockd.journal` and `lockd.journal.2`), all in the data directory.
//!
//! redb tables: `leases` (resource → lease record), `requests` (request id → lease record) and
//! `meta` (`format_version`, `last_token`, `applied_seq`).
//!
//! A batch is made durable by appending it to the active journal and syncing that (one small
//! write, one `fdatasync`); then it is answered. Journaled batches are kept in memory, with
//! what they change (`Pending`), and given to redb together by a checkpoint: one redb
//! transaction, committed durably with the number of the last journal record it holds. A
//! checkpoint starts every `checkpoint_ops` ops and when the active journal is half full. It
//! runs on a thread of its own: the active journal is synced and the other one becomes active,
//! so commits go on during the checkpoint; its journal starts over once redb holds its ops. A
//! clean close waits for a last checkpoint. On open, the records of both journals numbered above
//! redb's `applied_seq` are replayed in order; a gap in their numbers is synced data lost, and
//! opening fails. The server batches many grants into one journal append (group commit).
//!
//! Batches are checked before they are journaled, against redb with the ops of a running
//! checkpoint and the pending ones over it (see `check`), so a refused batch reaches no file.
//! The files are locked by redb while open, so two lockd processes cannot share a directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{Op, Snapshot};
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};

use crate::check::{Pending, View, check_batch};
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
/// Journaled ops given to redb together, in one durable transaction (a checkpoint); see
/// [`RedbStoreOptions::checkpoint_ops`]. Measured with `examples/checkpoint_cost.rs` (20,000
/// held leases, a release and a grant per commit), a checkpoint's cost per commit falls from
/// 295 us (every commit) to 14 us (every 64), 8 us (every 256) and 5 us (every 512); the
/// closed loop at 64 clients gained little past 1,024 (BENCHMARKS.md, "lockd's per-call cost").
pub const CHECKPOINT_OPS: usize = 1024;

/// The redb file's name inside the data directory.
pub const DATA_FILE: &str = "lockd.redb";
/// The journal's file name inside the data directory.
pub const JOURNAL_FILE: &str = "lockd.journal";
/// The second journal's file name (the journals take turns: see the module documentation).
pub const SECOND_JOURNAL_FILE: &str = "lockd.journal.2";

/// Tuning of the redb store.
#[derive(Clone, Debug)]
pub struct RedbStoreOptions {
    /// redb's page cache, in bytes. redb's own default (1 GiB) would dominate lockd's memory;
    /// the working set of a commit is a few pages, and a restart reads the file once.
    pub cache_size_bytes: usize,
    /// Size of the two journal files together (half each). A checkpoint starts when the one
    /// being written is half full: bigger means fewer checkpoints and a longer replay after a
    /// crash (about a second per 32 MiB).
    pub journal_bytes: u64,
    /// Journaled ops that start a checkpoint. A checkpoint costs a redb transaction and its
    /// sync, shared by the ops it gives to redb, on a thread of its own; the ops are kept in
    /// memory until it ends.
    pub checkpoint_ops: usize,
}

impl Default for RedbStoreOptions {
    fn default() -> RedbStoreOptions {
        RedbStoreOptions {
            cache_size_bytes: 32 << 20,
            journal_bytes: 32 << 20,
            checkpoint_ops: CHECKPOINT_OPS,
        }
    }
}

/// See the module documentation.
pub struct RedbStore {
    db: Option<Arc<Database>>,
    /// Ops are appended to the active journal while a checkpoint gives the other one's ops to
    /// redb, on a thread of its own.
    journals: [Journal; 2],
    active: usize,
    path: PathBuf,
    /// Journaled in the active journal, not yet given to redb.
    pending: Pending,
    /// The ops of the checkpoint in progress (empty when none is): in the other journal, and
    /// in redb once it ends.
    frozen: Arc<Pending>,
    running: Option<JoinHandle<Result<(), StoreError>>>,
    /// Number of the last journal record written.
    last_seq: u64,
    checkpoint_ops: usize,
}

impl RedbStore {
    /// Opens (creating if needed) the store in `dir`, replaying the journals if the last run
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
        let each = options.journal_bytes / 2;
        let (first, mut records) = Journal::open(&dir.join(JOURNAL_FILE), each, applied_seq)?;
        let (second, more) = Journal::open(&dir.join(SECOND_JOURNAL_FILE), each, applied_seq)?;
        records.extend(more);
        records.retain(|r| r.seq > applied_seq);
        records.sort_by_key(|r| r.seq);
        let mut store = RedbStore {
            db: Some(Arc::new(db)),
            journals: [first, second],
            active: 0,
            path,
            pending: Pending::default(),
            frozen: Arc::default(),
            running: None,
            last_seq: applied_seq,
            checkpoint_ops: options.checkpoint_ops.max(1),
        };
        for record in records {
            if record.seq != store.last_seq + 1 {
                // A journal is synced before the other one takes records, and each one's run
                // ends at its first damaged record: a gap is synced data lost.
                return Err(StoreError::Corrupt(format!(
                    "the journals hold record {} but not record {}: acknowledged data was lost; restore the data directory from a backup",
                    record.seq,
                    store.last_seq + 1
                )));
            }
            store.check(&record.ops).map_err(|e| {
                StoreError::Corrupt(format!(
                    "journal record {} does not apply to the stored state: {e}",
                    record.seq
                ))
            })?;
            store.pending.push(&record.ops);
            store.last_seq = record.seq;
        }
        store.checkpoint()?;
        for journal in &mut store.journals {
            journal.restart();
            journal.continue_from(store.last_seq);
        }
        Ok(store)
    }

    /// The redb file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives everything journaled to redb, durably, and waits for it; the journals start
    /// over. Done on a clean close.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        self.checkpoint()
    }

    /// Closes the store *without* a checkpoint, as a crash would leave it (for tests). A
    /// checkpoint already running ends first.
    pub fn abandon(mut self) {
        let _ = self.finish_checkpoint(true);
        drop(self.db.take());
    }

    fn db(&self) -> &Arc<Database> {
        self.db.as_ref().expect("the database is open until drop")
    }

    fn journal(&self) -> &Journal {
        &self.journals[self.active]
    }

    /// Checks `ops` against redb with the ops of a running checkpoint and the pending ones
    /// over it (see `check`).
    fn check(&self, ops: &[Op]) -> Result<(), StoreError> {
        let tx = self.db().begin_read()?;
        let (leases, requests, meta) = (
            tx.open_table(LEASES)?,
            tx.open_table(REQUESTS)?,
            tx.open_table(META)?,
        );
        let tables = TxView {
            leases: &leases,
            requests: &requests,
            meta: &meta,
        };
        let checkpointed = self.frozen.over(&tables);
        check_batch(&self.pending.over(&checkpointed), ops).map(|_| ())
    }

    fn checkpoint_due(&self) -> bool {
        self.pending.len() >= self.checkpoint_ops || self.journal().half_full()
    }

    /// Gives every journaled op to redb, durably, and waits for it.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        self.finish_checkpoint(true)?;
        self.start_checkpoint()?;
        self.finish_checkpoint(true)
    }

    /// Starts giving the pending ops to redb, on a thread of its own; new ops go to the other
    /// journal meanwhile. Call only when no checkpoint is running.
    fn start_checkpoint(&mut self) -> Result<(), StoreError> {
        debug_assert!(self.running.is_none(), "one checkpoint at a time");
        if self.pending.is_empty() {
            return Ok(());
        }
        self.switch_journals()?;
        let (db, ops, seq) = (
            Arc::clone(self.db()),
            Arc::clone(&self.frozen),
            self.last_seq,
        );
        let thread = std::thread::Builder::new()
            .name("lockd-checkpoint".into())
            .spawn(move || apply(&db, ops.ops(), seq))
            .map_err(|e| StoreError::Io(format!("cannot start a checkpoint's thread: {e}")))?;
        self.running = Some(thread);
        Ok(())
    }

    /// The pending ops become the checkpoint's, and new ops go to the other journal.
    fn switch_journals(&mut self) -> Result<(), StoreError> {
        // Every record of this journal is durable before the other one takes any: a crash
        // never keeps a later record and loses an earlier one.
        self.journals[self.active].sync()?;
        self.frozen = Arc::new(std::mem::take(&mut self.pending));
        self.active = 1 - self.active;
        self.journals[self.active].continue_from(self.last_seq);
        Ok(())
    }

    /// Ends the running checkpoint, if any: waits for it when `wait`, else only when it is
    /// done. Its journal then starts over.
    fn finish_checkpoint(&mut self, wait: bool) -> Result<(), StoreError> {
        let Some(running) = self.running.take_if(|r| wait || r.is_finished()) else {
            return Ok(());
        };
        running
            .join()
            .unwrap_or_else(|_| Err(StoreError::Io("the checkpoint's thread panicked".into())))?;
        self.frozen = Arc::default();
        self.journals[1 - self.active].restart();
        Ok(())
    }
}

/// A checkpoint: applies `ops` to redb in one transaction, committed durably with
/// `applied_seq`, the number of the last journal record they came from.
fn apply(db: &Database, ops: &[Op], applied_seq: u64) -> Result<(), StoreError> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)?;
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
                        let plain =
                            rec.reentrant.is_none() && rec.permits.is_none() && rec.rw.is_none();
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
        meta.insert(META_APPLIED_SEQ, applied_seq)?;
    }
    tx.commit()?;
    Ok(())
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
        self.checkpoint()?;
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
            return if sync {
                self.journals[self.active].sync()
            } else {
                Ok(())
            };
        }
        self.tidy()?;
        self.check(ops)?;
        if !self.journal().could_ever_fit(ops) {
            // Larger than a whole journal: straight into redb, durably.
            self.pending.push(ops);
            self.last_seq += 1;
            return self.checkpoint();
        }
        if !self.journal().fits(ops) {
            // This journal is full: its ops go to redb, and the other one takes this batch
            // once its own checkpoint has ended.
            self.finish_checkpoint(true)?;
            self.start_checkpoint()?;
        }
        let active = &mut self.journals[self.active];
        self.last_seq = active.append(self.last_seq + 1, ops)?;
        if sync {
            active.sync()?;
        }
        self.pending.push(ops);
        Ok(())
    }

    fn tidy(&mut self) -> Result<(), StoreError> {
        self.finish_checkpoint(false)?;
        if self.running.is_none() && self.checkpoint_due() {
            self.start_checkpoint()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::sample_grant as grant;

    use crate::conformance::sample_remove as remove;

    /// A checkpoint costs a redb sync: it must come every `CHECKPOINT_OPS` ops, not after each
    /// commit once the first one has run.
    #[test]
    fn checkpoints_come_once_per_checkpoint_ops() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedbStore::open(dir.path(), &RedbStoreOptions::default()).unwrap();
        let mut checkpoints = 0;
        for n in 1..=(3 * CHECKPOINT_OPS as u64) {
            s.commit(&[grant(n)], false).unwrap();
            if s.running.is_some() {
                // It started on this commit, which it does not hold.
                assert_eq!(s.pending.len(), 1);
                assert_eq!(s.frozen.len(), CHECKPOINT_OPS);
                checkpoints += 1;
                s.finish_checkpoint(true).unwrap();
            }
        }
        assert_eq!(checkpoints, 2, "one checkpoint per {CHECKPOINT_OPS} ops");
    }

    /// Options whose checkpoints never start by themselves.
    fn by_hand() -> RedbStoreOptions {
        RedbStoreOptions {
            checkpoint_ops: usize::MAX,
            ..RedbStoreOptions::default()
        }
    }

    /// The state a crash leaves while a checkpoint runs: records 1 to 3 in the journal `first`
    /// (synced when the other took over), 4 and 5 in the other, none of them in redb.
    fn crash_during_a_checkpoint(dir: &Path, first: usize) {
        let mut s = RedbStore::open(dir, &by_hand()).unwrap();
        s.active = first;
        s.commit(&[grant(1)], true).unwrap();
        s.commit(&[grant(2)], false).unwrap();
        s.commit(&[remove(1)], false).unwrap();
        // What start_checkpoint does before its thread writes redb.
        s.switch_journals().unwrap();
        s.commit(&[grant(3)], true).unwrap();
        s.commit(&[remove(2)], true).unwrap();
        s.abandon();
    }

    /// Both journals are replayed, in the order of their records, whichever file holds the
    /// first ones.
    #[test]
    fn a_crash_during_a_checkpoint_replays_both_journals_in_order() {
        for first in [0, 1] {
            let dir = tempfile::tempdir().unwrap();
            crash_during_a_checkpoint(dir.path(), first);
            let mut s = RedbStore::open(dir.path(), &by_hand()).unwrap();
            let snap = s.load().unwrap();
            assert_eq!(snap.last_token, FencingToken::new(3));
            let held: Vec<u64> = snap.leases.iter().map(|l| l.token.get()).collect();
            assert_eq!(held, vec![3], "1 and 2 were removed after their grants");
            // Both journals were given to redb: a second crash and open finds the same.
            s.abandon();
            let snap = RedbStore::open(dir.path(), &by_hand())
                .unwrap()
                .load()
                .unwrap();
            assert_eq!(snap.leases.len(), 1);
        }
    }

    /// A record missing between the two journals is synced data lost: opening refuses.
    #[test]
    fn a_record_lost_between_the_journals_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        crash_during_a_checkpoint(dir.path(), 0);
        // Damage the first journal's last record (record 3, synced before record 4 was
        // written): its run then ends at record 2.
        let path = dir.path().join(JOURNAL_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let mut at = 0;
        for _ in 0..2 {
            let len = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            at += 28 + len;
        }
        bytes[at + 30] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let err = RedbStore::open(dir.path(), &by_hand())
            .err()
            .expect("open must fail");
        let msg = err.to_string();
        assert!(msg.contains("hold record 4 but not record 3"), "{msg}");
    }

    /// After a restart, a journal's new run starts at offset 0, before the earlier cycle's
    /// records (all in redb). Its first record torn by a crash is a torn tail: the store
    /// opens without it, whatever those older records say was synced.
    #[test]
    fn a_torn_first_record_after_a_restart_is_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedbStore::open(dir.path(), &by_hand()).unwrap();
        for n in 1..=20 {
            s.commit(&[grant(n)], true).unwrap();
            if n == 10 {
                s.checkpoint().unwrap();
            }
        }
        s.abandon();
        // Both journals hold records, each synced one saying that those before it were; all
        // are in redb after the next open, and a journal starts over with record 21.
        let mut s = RedbStore::open(dir.path(), &by_hand()).unwrap();
        s.commit(&[grant(21)], true).unwrap();
        let active = [JOURNAL_FILE, SECOND_JOURNAL_FILE][s.active];
        s.abandon();
        let path = dir.path().join(active);
        let mut bytes = std::fs::read(&path).unwrap();
        let len = u32::from_be_bytes(bytes[4..8].try_into().unwrap()) as usize;
        bytes[28 + len - 8..28 + len].fill(0);
        std::fs::write(&path, bytes).unwrap();
        let snap = RedbStore::open(dir.path(), &by_hand())
            .expect("a torn tail is not corruption")
            .load()
            .unwrap();
        assert_eq!(snap.leases.len(), 20);
        assert_eq!(snap.last_token, FencingToken::new(20));
    }
}
