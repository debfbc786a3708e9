//! The embedded, durable store: one redb file, `lockd.redb`, in the data directory.
//!
//! Tables: `leases` (resource → lease record), `requests` (request id → lease record) and `meta`
//! (`format_version`, `last_token`). A grant is one write transaction that inserts the lease,
//! remembers its request id and raises `last_token`; the server batches many grants into one
//! transaction and commits it with [`Durability::Immediate`] (one `fdatasync` under redb's
//! default 1PC+checksum commit): that is the group commit. Batches without a grant commit with
//! [`Durability::None`], which redb makes durable with the next immediate commit.
//!
//! The file is locked by redb while open, so two lockd processes cannot share a directory.

use std::path::{Path, PathBuf};

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{Op, Snapshot};
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    Table, TableDefinition,
};

use crate::check::{View, check_batch};
use crate::encoding::{decode, encode};
use crate::{Store, StoreError};

const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
const REQUESTS: TableDefinition<&str, &[u8]> = TableDefinition::new("requests");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const META_FORMAT_VERSION: &str = "format_version";
const META_LAST_TOKEN: &str = "last_token";
/// Bumped when the layout of the tables or records changes incompatibly.
const FORMAT_VERSION: u64 = 1;

/// The file name inside the data directory.
pub const DATA_FILE: &str = "lockd.redb";

/// Tuning of the redb store.
#[derive(Clone, Debug)]
pub struct RedbStoreOptions {
    /// redb's page cache, in bytes. redb's own default (1 GiB) would dominate lockd's memory;
    /// the working set of a commit is a few pages, and a restart reads the file once.
    pub cache_size_bytes: usize,
}

impl Default for RedbStoreOptions {
    fn default() -> RedbStoreOptions {
        RedbStoreOptions {
            cache_size_bytes: 32 << 20,
        }
    }
}

/// See the module documentation.
pub struct RedbStore {
    db: Option<Database>,
    path: PathBuf,
    /// Batches were committed since the last durable commit.
    unsynced: bool,
}

impl RedbStore {
    /// Opens (creating if needed) the store in `dir`.
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
        let tx = db.begin_write()?;
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
                        path: shown,
                        found,
                        supported: FORMAT_VERSION,
                    });
                }
            }
        }
        tx.commit()?;
        Ok(RedbStore {
            db: Some(db),
            path,
            unsynced: false,
        })
    }

    /// The data file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes every committed batch durable (done on a clean shutdown, and periodically by the
    /// server so that lazily synced releases do not pile up).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        if self.unsynced {
            self.commit(&[], true)?;
        }
        Ok(())
    }

    /// Whether batches were committed since the last durable commit.
    pub fn has_unsynced(&self) -> bool {
        self.unsynced
    }

    /// Closes the store *without* flushing, like a crash would leave it (for tests).
    pub fn abandon(mut self) {
        self.unsynced = false;
        drop(self.db.take());
    }

    fn db(&self) -> &Database {
        self.db.as_ref().expect("the database is open until drop")
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        if self.db.is_some() {
            // Best effort: a failure here is reported by the next open (redb recovers to the
            // last durable commit).
            let _ = self.flush();
        }
    }
}

struct TxView<'a, 'txn> {
    leases: &'a Table<'txn, &'static str, &'static [u8]>,
    requests: &'a Table<'txn, &'static str, &'static [u8]>,
    meta: &'a Table<'txn, &'static str, u64>,
}

impl View for TxView<'_, '_> {
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
        let mut tx = self.db().begin_write()?;
        tx.set_durability(if sync {
            Durability::Immediate
        } else {
            Durability::None
        })?;
        {
            let mut leases = tx.open_table(LEASES)?;
            let mut requests = tx.open_table(REQUESTS)?;
            let mut meta = tx.open_table(META)?;
            let view = TxView {
                leases: &leases,
                requests: &requests,
                meta: &meta,
            };
            let before = view.last_token()?;
            // On a refused batch the transaction is dropped uncommitted: nothing of it lands.
            let after = check_batch(&view, ops)?;
            for op in ops {
                match op {
                    Op::Grant(rec) => {
                        let bytes = encode(rec);
                        leases.insert(rec.resource.as_str(), bytes.as_slice())?;
                        if let Some(id) = &rec.request_id {
                            requests.insert(id.as_str(), bytes.as_slice())?;
                        }
                    }
                    Op::Remove { resource, .. } => {
                        leases.remove(resource.as_str())?;
                    }
                    Op::ForgetRequest { request_id } => {
                        requests.remove(request_id.as_str())?;
                    }
                }
            }
            if after != before {
                let raw = after.expect("the high-water only rises").get();
                meta.insert(META_LAST_TOKEN, raw)?;
            }
        }
        tx.commit()?;
        self.unsynced = !sync;
        Ok(())
    }
}
