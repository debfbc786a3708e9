//! High-water marks in an embedded redb file (`marks.redb` in the data directory), made
//! durable with group commit: every raise that arrives while a commit is being synced joins the
//! next one.
//!
//! A raise only ever raises: the stored mark of a resource is the maximum of every token
//! raised to (invariant 4: marks never go down, across restarts and `kill -9`). A failed commit
//! stops the writer for good and runs the failure hook (the proxy exits): the file's state is
//! then unknown, and no request may be relayed on a mark that might not be stored.

use std::path::Path;
use std::sync::mpsc;

use compact_str::CompactString;
use fencing::{FencingToken, ResourceName};
use http_relay::{BoxFuture, MarkStore};
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};
use tokio::sync::oneshot;

pub(crate) const MARKS: TableDefinition<&str, u64> = TableDefinition::new("marks");

/// The file's name inside the data directory.
pub const MARKS_FILE: &str = "marks.redb";

type Raise = (
    ResourceName,
    FencingToken,
    oneshot::Sender<Result<(), String>>,
);

/// See the module documentation. Dropping it waits for the writer to finish and close the file.
pub struct RedbMarks {
    tx: Option<mpsc::Sender<Raise>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RedbMarks {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens the marks in `dir`, returning the store and every stored mark.
pub fn open(
    dir: &Path,
    cache_bytes: usize,
    on_failure: Box<dyn FnOnce(&str) + Send>,
) -> anyhow::Result<(RedbMarks, Vec<(CompactString, FencingToken)>)> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create the data directory {}: {e}", dir.display()))?;
    let path = dir.join(MARKS_FILE);
    let db = Database::builder()
        .set_cache_size(cache_bytes)
        .create(&path)
        .map_err(|e| match e {
            DatabaseError::DatabaseAlreadyOpen => {
                anyhow::anyhow!(
                    "the data directory {} is in use by another fence-proxy; stop it first",
                    dir.display()
                )
            }
            other => anyhow::anyhow!("cannot open {}: {other}", path.display()),
        })?;
    let tx = db.begin_write()?;
    tx.open_table(MARKS)?;
    tx.commit()?;
    let read = db.begin_read()?;
    let table = read.open_table(MARKS)?;
    let mut marks = Vec::with_capacity(table.len()? as usize);
    for entry in table.iter()? {
        let (k, v) = entry?;
        ResourceName::validate(k.value()).map_err(|e| {
            anyhow::anyhow!(
                "{}: stored resource {:?} is invalid: {e}",
                path.display(),
                k.value()
            )
        })?;
        let resource = CompactString::new(k.value());
        let token = FencingToken::new(v.value()).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: stored mark {} of {resource} is out of range",
                path.display(),
                v.value()
            )
        })?;
        marks.push((resource, token));
    }
    drop(table);
    drop(read);
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("marks-writer".into())
        .spawn(move || writer(db, rx, on_failure))
        .expect("spawning the marks writer");
    Ok((
        RedbMarks {
            tx: Some(tx),
            thread: Some(thread),
        },
        marks,
    ))
}

impl MarkStore for RedbMarks {
    fn raise(
        &self,
        resource: ResourceName,
        token: FencingToken,
    ) -> BoxFuture<'static, Result<(), String>> {
        let (done, wait) = oneshot::channel();
        let sent = self.tx.as_ref().map(|tx| tx.send((resource, token, done)));
        Box::pin(async move {
            match sent {
                Some(Ok(())) => {}
                _ => return Err("the marks writer has stopped".to_string()),
            }
            wait.await
                .map_err(|_| "the marks writer has stopped".to_string())?
        })
    }
}

fn writer(db: Database, rx: mpsc::Receiver<Raise>, on_failure: Box<dyn FnOnce(&str) + Send>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        match commit(&db, &batch) {
            Ok(()) => {
                for (_, _, done) in batch {
                    let _ = done.send(Ok(()));
                }
            }
            Err(e) => {
                let reason = e.to_string();
                for (_, _, done) in batch {
                    let _ = done.send(Err(reason.clone()));
                }
                on_failure(&reason);
                return;
            }
        }
    }
}

fn commit(db: &Database, batch: &[Raise]) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)?;
    {
        let mut table = tx.open_table(MARKS)?;
        for (resource, token, _) in batch {
            let stored = table.get(resource.as_str())?.map(|v| v.value());
            if stored.is_none_or(|s| s < token.get()) {
                table.insert(resource.as_str(), token.get())?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: &str) -> ResourceName {
        ResourceName::new(n).unwrap()
    }

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    #[tokio::test]
    async fn marks_only_rise_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (marks, stored) = open(dir.path(), 1 << 20, Box::new(|e| panic!("{e}"))).unwrap();
            assert!(stored.is_empty());
            marks.raise(r("a"), t(5)).await.unwrap();
            marks.raise(r("a"), t(3)).await.unwrap(); // lower: no change
            marks.raise(r("b"), t(1)).await.unwrap();
            let many: Vec<_> = (0..100)
                .map(|i| marks.raise(r(&format!("c{i}")), t(i + 1)))
                .collect();
            for m in many {
                m.await.unwrap();
            }
        }
        let (_, mut stored) = open(dir.path(), 1 << 20, Box::new(|e| panic!("{e}"))).unwrap();
        stored.sort();
        assert_eq!(stored.len(), 102);
        assert!(stored.contains(&("a".into(), t(5))));
        assert!(stored.contains(&("b".into(), t(1))));
    }
}
