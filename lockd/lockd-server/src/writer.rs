//! The group-commit writer: one thread owns the store and commits whatever the driver queued
//! since its last commit, in one transaction.
//!
//! While one batch is being synced, the next accumulates, so any number of concurrent grants
//! share one `fdatasync` (group commit) without a timer or a batch size to tune. Ops are queued
//! under the driver's lock, so they reach the store in exactly the order the core decided them.
//!
//! Sequence numbers: every queued op gets the next number. After a batch is committed, the
//! writer publishes its last number as *applied*, and only then lets the store do its deferred
//! work (`Store::tidy`). A batch is synced whenever it holds a grant,
//! so "applied ≥ n" means every grant numbered ≤ n is durable: that is what a reply waits for.
//! Batches without grants (releases, expiries, forgotten request ids) are committed lazily and
//! made durable by the next synced commit, or by a flush at most `sync_interval` later.
//!
//! A store error stops the writer for good (fail-stop): the state on disk is unknown, so no
//! further grant may be acknowledged. The failure callback decides what the process does.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lockd_core::Op;
use lockd_store::{Store, StoreError};
use tokio::sync::watch;

/// Position in the writer's queue.
pub type Seq = u64;

/// The writer has stopped (store failure or shutdown): nothing more will become durable.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the store writer has stopped")]
pub struct WriterStopped;

struct Queue {
    ops: Vec<Op>,
    sync: bool,
    submitted: Seq,
    closing: bool,
}

#[derive(Clone, Copy)]
struct Progress {
    applied: Seq,
    stopped: bool,
}

struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    progress: watch::Sender<Progress>,
}

/// Handle on the writer thread.
pub struct Writer {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    /// Starts the writer thread on `store`. `on_failure` runs on the writer thread when a
    /// commit fails; the writer stops after it.
    pub fn start(
        store: Box<dyn Store>,
        sync_interval: Duration,
        on_failure: Box<dyn FnOnce(&StoreError) + Send>,
    ) -> Writer {
        let (progress, _) = watch::channel(Progress {
            applied: 0,
            stopped: false,
        });
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                ops: Vec::new(),
                sync: false,
                submitted: 0,
                closing: false,
            }),
            wake: Condvar::new(),
            progress,
        });
        let thread_inner = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("lockd-writer".into())
            .spawn(move || run(thread_inner, store, sync_interval, on_failure))
            .expect("spawning the writer thread");
        Writer {
            inner,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues `ops` (in order) and returns the sequence number of the last of them, or of the
    /// last op queued before when `ops` is empty.
    pub fn submit(&self, ops: Vec<Op>) -> Seq {
        let mut q = self.inner.queue.lock().expect("writer queue lock");
        if !ops.is_empty() {
            q.sync |= ops.iter().any(Op::needs_sync);
            q.submitted += ops.len() as Seq;
            q.ops.extend(ops);
            self.inner.wake.notify_one();
        }
        q.submitted
    }

    /// Waits until every grant numbered ≤ `seq` is durable.
    pub async fn wait(&self, seq: Seq) -> Result<(), WriterStopped> {
        let mut rx = self.inner.progress.subscribe();
        let p = rx
            .wait_for(|p| p.applied >= seq || p.stopped)
            .await
            .map_err(|_| WriterStopped)?;
        if p.applied >= seq {
            Ok(())
        } else {
            Err(WriterStopped)
        }
    }

    /// Flushes everything queued, stops the thread and waits for it.
    pub fn close(&self) {
        {
            let mut q = self.inner.queue.lock().expect("writer queue lock");
            q.closing = true;
            self.inner.wake.notify_one();
        }
        if let Some(thread) = self.thread.lock().expect("writer thread lock").take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

fn run(
    inner: Arc<Inner>,
    store: Box<dyn Store>,
    sync_interval: Duration,
    on_failure: Box<dyn FnOnce(&StoreError) + Send>,
) {
    commit_loop(&inner, store, sync_interval, on_failure);
    // Whatever the reason, nothing more becomes durable: end every wait.
    inner.progress.send_modify(|p| p.stopped = true);
}

fn commit_loop(
    inner: &Inner,
    mut store: Box<dyn Store>,
    sync_interval: Duration,
    on_failure: Box<dyn FnOnce(&StoreError) + Send>,
) {
    // When the oldest lazily committed batch was committed, if one is not yet durable.
    let mut unsynced_since: Option<Instant> = None;
    loop {
        let (ops, mut sync, seq, closing) = {
            let mut q = inner.queue.lock().expect("writer queue lock");
            loop {
                if !q.ops.is_empty() || q.closing {
                    break;
                }
                match unsynced_since {
                    None => q = inner.wake.wait(q).expect("writer queue lock"),
                    Some(since) => {
                        let left = sync_interval.saturating_sub(since.elapsed());
                        if left.is_zero() {
                            break;
                        }
                        q = inner
                            .wake
                            .wait_timeout(q, left)
                            .expect("writer queue lock")
                            .0;
                    }
                }
            }
            (
                std::mem::take(&mut q.ops),
                std::mem::take(&mut q.sync),
                q.submitted,
                q.closing,
            )
        };
        // Sync lazy batches that have waited long enough, and everything on the way out.
        sync |= closing || unsynced_since.is_some_and(|since| since.elapsed() >= sync_interval);
        if !ops.is_empty() || (sync && unsynced_since.is_some()) {
            if let Err(e) = store.commit(&ops, sync) {
                on_failure(&e);
                return;
            }
            if sync {
                unsynced_since = None;
            } else {
                unsynced_since.get_or_insert_with(Instant::now);
            }
        }
        inner.progress.send_modify(|p| p.applied = seq);
        // Deferred work (applying the journal to redb) happens after the answers are out.
        if let Err(e) = store.tidy() {
            on_failure(&e);
            return;
        }
        if closing {
            let q = inner.queue.lock().expect("writer queue lock");
            if q.ops.is_empty() {
                return;
            }
        }
    }
}
