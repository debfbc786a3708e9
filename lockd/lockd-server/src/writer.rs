//! The group-commit writer: whatever the driver queued since the last commit is committed to
//! the store in one batch, with one sync.
//!
//! While one batch is being synced, the next accumulates, so any number of concurrent grants
//! share one `fdatasync` (group commit) without a timer or a batch size to tune. Ops are queued
//! under the driver's lock, so they reach the store in exactly the order the core decided them.
//!
//! Who commits: a caller waiting for its grant to be durable commits the whole queue itself,
//! on its own thread, when no one else is committing (the *leader*); callers that arrive while
//! a commit runs wait for it to finish (*followers*), then one of those whose op it did not
//! include leads the next. A lone client thus pays no thread hand-off and a crowd shares syncs.
//! Ops nobody waits for (releases, expiries, forgotten request ids) ride along with the next
//! leader's batch; the writer thread commits them, and syncs them, when they have waited
//! `sync_interval`. The writer thread also lets the store do its deferred work
//! (`Store::tidy`) in quiet moments, and flushes everything on close. Where a caller cannot
//! block its thread (a single-threaded runtime), it asks the writer thread to commit instead.
//!
//! Sequence numbers: every queued op gets the next number. After a batch is committed, its last
//! number is published as *applied*. A batch is synced whenever it holds a grant, so
//! "applied ≥ n" means every grant numbered ≤ n is durable: that is what a reply waits for.
//!
//! A store error stops the writer for good (fail-stop): the state on disk is unknown, so no
//! further grant may be acknowledged. The failure callback decides what the process does.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lockd_core::Op;
use lockd_store::{Store, StoreError};
use tokio::runtime::RuntimeFlavor;
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
    /// When the oldest op now queued was queued.
    oldest: Option<Instant>,
    /// Someone is committing (only one at a time).
    committing: bool,
    /// A caller that cannot commit itself asks the writer thread to.
    requested: bool,
    closing: bool,
    /// When the oldest lazily committed batch was committed, if one is not yet durable.
    unsynced_since: Option<Instant>,
    /// When the store last committed, if its deferred work has not been done since.
    last_commit: Option<Instant>,
    /// The writer thread sleeps until the committing leader is done.
    thread_waits_for_leader: bool,
}

#[derive(Clone, Copy)]
struct Progress {
    applied: Seq,
    stopped: bool,
}

type FailureHook = Box<dyn FnOnce(&StoreError) + Send>;

struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    progress: watch::Sender<Progress>,
    /// The store (`None` once stopped). Taken by the committer, and by the writer thread for
    /// deferred work.
    store: Mutex<Option<Box<dyn Store>>>,
    /// The store's commit runs a runtime of its own (see `Store::commit_runs_a_runtime`).
    commit_runs_a_runtime: bool,
    on_failure: Mutex<Option<FailureHook>>,
    sync_interval: Duration,
}

/// Handle on the writer.
pub struct Writer {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    /// Starts the writer on `store`. `on_failure` runs (once) when a commit fails; the writer
    /// stops after it.
    pub fn start(
        store: Box<dyn Store>,
        sync_interval: Duration,
        on_failure: FailureHook,
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
                oldest: None,
                committing: false,
                requested: false,
                closing: false,
                unsynced_since: None,
                last_commit: None,
                thread_waits_for_leader: false,
            }),
            wake: Condvar::new(),
            progress,
            commit_runs_a_runtime: store.commit_runs_a_runtime(),
            store: Mutex::new(Some(store)),
            on_failure: Mutex::new(Some(on_failure)),
            sync_interval,
        });
        let thread_inner = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("lockd-writer".into())
            .spawn(move || run(&thread_inner))
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
            if q.oldest.is_none() {
                q.oldest = Some(Instant::now());
                // The writer thread sleeps until the oldest op is due; tell it there is one.
                self.inner.wake.notify_one();
            }
        }
        q.submitted
    }

    /// Waits until every grant numbered ≤ `seq` is durable, committing the queue itself when
    /// no one else is (see the module documentation).
    pub async fn wait(&self, seq: Seq) -> Result<(), WriterStopped> {
        let mut rx = self.inner.progress.subscribe();
        // Committing on this thread needs a runtime that can move its other tasks elsewhere.
        let (may_lead, lone_worker) = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                (true, h.metrics().num_workers() < 2)
            }
            _ => (false, false),
        };
        // With other workers to run the rest, the leader commits right here: `block_in_place`
        // hands this worker's queue to another thread first, a thread wake-up and more per
        // commit (BENCHMARKS.md, "lockd's per-call cost"). A lone worker hands it over, so
        // that the runtime goes on serving (renewals, releases) during the sync; so does a
        // store whose commit runs a runtime of its own, which tokio refuses on a worker.
        let hand_over = lone_worker || self.inner.commit_runs_a_runtime;
        loop {
            let p = *rx.borrow_and_update();
            if p.applied >= seq {
                return Ok(());
            }
            if p.stopped {
                return Err(WriterStopped);
            }
            let lead = {
                let mut q = self.inner.queue.lock().expect("writer queue lock");
                if q.committing {
                    false
                } else if may_lead {
                    q.committing = true;
                    true
                } else {
                    q.requested = true;
                    self.inner.wake.notify_one();
                    false
                }
            };
            if lead {
                if hand_over {
                    tokio::task::block_in_place(|| commit_as_leader(&self.inner, false));
                } else {
                    commit_as_leader(&self.inner, false);
                }
                continue;
            }
            rx.changed().await.map_err(|_| WriterStopped)?;
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

/// Commits everything queued, as the one committer (the caller set `committing`), then lets
/// followers go: clears `committing` and publishes.
fn commit_as_leader(inner: &Inner, force_sync: bool) {
    let mut store = inner.store.lock().expect("writer store lock");
    let committed = commit_queued(inner, &mut store, force_sync);
    let mut q = inner.queue.lock().expect("writer queue lock");
    q.committing = false;
    if committed {
        q.last_commit = Some(Instant::now());
    }
    if std::mem::take(&mut q.thread_waits_for_leader) {
        inner.wake.notify_one();
    }
    drop(q);
    drop(store);
    // Publish even when nothing was committed: followers re-check and one of them leads.
    inner.progress.send_modify(|_| {});
}

/// Commits the queue (synced if it holds a grant, if `force_sync`, or if lazy batches have
/// waited `sync_interval`) and publishes it. Returns whether anything was committed.
fn commit_queued(
    inner: &Inner,
    store: &mut MutexGuard<'_, Option<Box<dyn Store>>>,
    force_sync: bool,
) -> bool {
    let Some(s) = store.as_mut() else {
        return false;
    };
    let (ops, sync, seq) = {
        let mut q = inner.queue.lock().expect("writer queue lock");
        let due = q
            .unsynced_since
            .is_some_and(|t| t.elapsed() >= inner.sync_interval);
        let sync = std::mem::take(&mut q.sync) || force_sync || due;
        if q.ops.is_empty() && !(sync && q.unsynced_since.is_some()) {
            return false;
        }
        q.oldest = None;
        (std::mem::take(&mut q.ops), sync, q.submitted)
    };
    let started = Instant::now();
    if let Err(e) = s.commit(&ops, sync) {
        fail(inner, store, &e);
        return false;
    }
    if !ops.is_empty() {
        crate::metrics::get().committed(ops.len(), started.elapsed());
    }
    {
        let mut q = inner.queue.lock().expect("writer queue lock");
        if sync {
            q.unsynced_since = None;
        } else {
            q.unsynced_since.get_or_insert_with(Instant::now);
        }
    }
    inner
        .progress
        .send_modify(|p| p.applied = p.applied.max(seq));
    true
}

/// Stops for good: drops the store, ends every wait, runs the failure hook.
fn fail(inner: &Inner, store: &mut MutexGuard<'_, Option<Box<dyn Store>>>, e: &StoreError) {
    **store = None;
    inner.progress.send_modify(|p| p.stopped = true);
    if let Some(hook) = inner.on_failure.lock().expect("failure hook lock").take() {
        hook(e);
    }
}

/// What the writer thread wakes up for.
enum Chore {
    /// Commit the queue (asked for, or lazy ops due); sync it if `force_sync`.
    Commit {
        force_sync: bool,
    },
    /// Let the store do its deferred work.
    Tidy,
    Close,
}

/// The writer thread: commits nobody waits for, deferred work in quiet moments, the final flush.
fn run(inner: &Inner) {
    loop {
        let chore = {
            let mut q = inner.queue.lock().expect("writer queue lock");
            loop {
                if q.committing {
                    // A leader is at work; it wakes us when it is done.
                    q.thread_waits_for_leader = true;
                    q = inner.wake.wait(q).expect("writer queue lock");
                    continue;
                }
                if q.closing {
                    q.committing = true;
                    break Chore::Close;
                }
                let left = |since: Option<Instant>, after: Duration| {
                    since.map(|t| after.saturating_sub(t.elapsed()))
                };
                let lazy = [
                    left(q.oldest, inner.sync_interval),
                    left(q.unsynced_since, inner.sync_interval),
                ]
                .into_iter()
                .flatten()
                .min();
                if q.requested || lazy.is_some_and(|d| d.is_zero()) {
                    q.requested = false;
                    q.committing = true;
                    break Chore::Commit {
                        force_sync: lazy.is_some_and(|d| d.is_zero()),
                    };
                }
                // Deferred work waits for a quiet moment (no commit for a while), so that it
                // does not hold the store when a leader arrives.
                let quiet = left(q.last_commit, TIDY_AFTER_QUIET);
                if quiet.is_some_and(|d| d.is_zero()) {
                    q.last_commit = None;
                    break Chore::Tidy;
                }
                q = match [lazy, quiet].into_iter().flatten().min() {
                    None => inner.wake.wait(q).expect("writer queue lock"),
                    Some(d) => inner.wake.wait_timeout(q, d).expect("writer queue lock").0,
                };
            }
        };
        match chore {
            Chore::Commit { force_sync } => commit_as_leader(inner, force_sync),
            Chore::Tidy => {
                let mut store = inner.store.lock().expect("writer store lock");
                if let Some(s) = store.as_mut()
                    && let Err(e) = s.tidy()
                {
                    fail(inner, &mut store, &e);
                }
            }
            Chore::Close => {
                let mut store = inner.store.lock().expect("writer store lock");
                commit_queued(inner, &mut store, true);
                // Dropping the store flushes it (the redb store checkpoints).
                *store = None;
                inner.progress.send_modify(|p| p.stopped = true);
                return;
            }
        }
        if inner.store.lock().expect("writer store lock").is_none() {
            return; // failed: `fail` has ended every wait
        }
    }
}

/// How long the store must have been quiet before the writer thread does its deferred work.
const TIDY_AFTER_QUIET: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use lockd_store::MemoryStore;
    use lockd_store::conformance::sample_grant as grant;

    use super::*;

    /// A store whose first commit waits until the test lets it go, and which reports the size
    /// of every synced batch.
    struct Gate {
        inner: MemoryStore,
        entered: mpsc::Sender<()>,
        release: Option<mpsc::Receiver<()>>,
        synced_batches: mpsc::Sender<usize>,
    }

    impl Store for Gate {
        fn load(&mut self) -> Result<lockd_core::Snapshot, StoreError> {
            self.inner.load()
        }
        fn commit(&mut self, ops: &[Op], sync: bool) -> Result<(), StoreError> {
            if let Some(release) = self.release.take() {
                self.entered.send(()).unwrap();
                release.recv().unwrap();
            }
            if sync {
                self.synced_batches.send(ops.len()).unwrap();
            }
            self.inner.commit(ops, sync)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grants_that_arrive_during_a_sync_share_the_next_one() {
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let (batches_tx, batches) = mpsc::channel();
        let store = Gate {
            inner: MemoryStore::new(),
            entered: entered_tx,
            release: Some(release_rx),
            synced_batches: batches_tx,
        };
        let writer = Arc::new(Writer::start(
            Box::new(store),
            Duration::from_secs(60),
            Box::new(|e| panic!("store failed: {e}")),
        ));
        let first = writer.submit(vec![grant(1)]);
        let leader = {
            let writer = Arc::clone(&writer);
            tokio::spawn(async move { writer.wait(first).await })
        };
        // The leader is inside the first commit; 49 grants queue behind it.
        tokio::task::spawn_blocking(move || entered.recv())
            .await
            .unwrap()
            .unwrap();
        let mut last = first;
        for n in 2..=50 {
            last = writer.submit(vec![grant(n)]);
        }
        release.send(()).unwrap();
        leader.await.unwrap().unwrap();
        writer.wait(last).await.unwrap();
        writer.close();
        let sizes: Vec<usize> = batches.try_iter().collect();
        assert_eq!(
            sizes,
            vec![1, 49],
            "49 grants queued during one sync share the next"
        );
    }

    #[tokio::test]
    async fn a_runtime_that_cannot_block_gets_its_commits_from_the_writer_thread() {
        let writer = Writer::start(
            Box::new(MemoryStore::new()),
            Duration::from_secs(60),
            Box::new(|e| panic!("store failed: {e}")),
        );
        let seq = writer.submit(vec![grant(1)]);
        writer.wait(seq).await.unwrap();
    }

    /// The etcd store's commit runs a runtime of its own, which tokio refuses on a worker
    /// thread: its leader hands the worker's tasks over first (committing in place panicked
    /// with "Cannot start a runtime from within a runtime").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_whose_commit_runs_a_runtime_is_committed_off_the_workers() {
        struct OwnRuntime(MemoryStore);
        impl Store for OwnRuntime {
            fn load(&mut self) -> Result<lockd_core::Snapshot, StoreError> {
                self.0.load()
            }
            fn commit(&mut self, ops: &[Op], sync: bool) -> Result<(), StoreError> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async { self.0.commit(ops, sync) })
            }
            fn commit_runs_a_runtime(&self) -> bool {
                true
            }
        }
        let writer = Writer::start(
            Box::new(OwnRuntime(MemoryStore::new())),
            Duration::from_secs(60),
            Box::new(|e| panic!("store failed: {e}")),
        );
        for n in 1..=3 {
            let seq = writer.submit(vec![grant(n)]);
            writer.wait(seq).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_store_failure_ends_every_wait_and_calls_the_failure_hook() {
        struct Broken;
        impl Store for Broken {
            fn load(&mut self) -> Result<lockd_core::Snapshot, StoreError> {
                Ok(lockd_core::Snapshot::default())
            }
            fn commit(&mut self, _: &[Op], _: bool) -> Result<(), StoreError> {
                Err(StoreError::Io("disk on fire".into()))
            }
        }
        let (failed_tx, failed) = mpsc::channel();
        let writer = Writer::start(
            Box::new(Broken),
            Duration::from_secs(60),
            Box::new(move |e| failed_tx.send(e.to_string()).unwrap()),
        );
        let seq = writer.submit(vec![grant(1)]);
        assert!(
            writer.wait(seq).await.is_err(),
            "a grant is never reported durable after a failure"
        );
        assert!(failed.recv().unwrap().contains("disk on fire"));
    }
}
