//! The fence: which fenced requests may go to the upstream, and when.
//!
//! For each resource the fence keeps the highest accepted token (the *mark*) and counts the
//! requests in flight at the upstream. A request with token `t`:
//!
//! - below the mark: refused (stale; DESIGN.md invariant 3);
//! - equal to the mark: relayed at once, concurrently with the others of that token, once the
//!   mark is durable and no older-token request is still in flight;
//! - above the mark: raises the mark at once (from now on the older tokens are refused), makes it
//!   durable, waits until the older-token requests still in flight have finished (the
//!   *barrier*), then is relayed. The wait is bounded: past it the request is refused with
//!   "retry later" (the mark stays raised) rather than overtake an older request.
//!
//! "In flight" lasts until the upstream's response has been relayed completely (or the exchange
//! was abandoned): a request's [`Permit`] lives in its response body.
//!
//! A [`Fence`] is a trait so that the replicated mode (marks in PostgreSQL, several proxies in
//! front of one upstream) can enforce the same rule across processes; [`LocalFence`] is the
//! single-process fence over a [`MarkStore`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fencing::{Decision, FencingToken, ResourceName};
use tokio::sync::Notify;

use crate::marks::MarkTable;

/// A boxed future, for the object-safe traits of this module.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a fenced request may not go to the upstream.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The token is below the highest accepted one: the sender's lock was superseded.
    #[error("token {token} is below the highest accepted token {highest} of {resource}")]
    Stale {
        resource: ResourceName,
        token: FencingToken,
        highest: FencingToken,
    },
    /// Older-token requests were still in flight at the upstream when the wait ran out.
    #[error(
        "{older} request(s) with older tokens are still in flight at the upstream for {resource}; retry shortly"
    )]
    Barrier { resource: ResourceName, older: u32 },
    /// The fence holds the maximum number of resources.
    #[error("the proxy tracks the maximum number of resources ({max}); refusing new ones")]
    TooManyResources { max: usize },
    /// The mark could not be made durable (the proxy then stops).
    #[error("the high-water mark of {resource} could not be stored: {reason}")]
    Store {
        resource: ResourceName,
        reason: String,
    },
    /// The fence's shared store (PostgreSQL) could not be asked in time; nothing was decided.
    #[error("the fence could not decide for {resource}: {reason}")]
    Unavailable {
        resource: ResourceName,
        reason: String,
    },
}

/// Held while a fenced request is in flight; dropping it ends the request's hold on its
/// resource (the fence may then let a newer token through).
pub struct Permit {
    _hold: Box<dyn Send + Sync>,
}

impl Permit {
    pub fn new(hold: impl Send + Sync + 'static) -> Permit {
        Permit {
            _hold: Box::new(hold),
        }
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Permit")
    }
}

/// Decides whether and when a fenced request may go to the upstream.
pub trait Fence: Send + Sync + 'static {
    fn admit<'a>(
        &'a self,
        resource: &'a ResourceName,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Permit, Refusal>>;
}

/// Durable high-water marks for a [`LocalFence`].
pub trait MarkStore: Send + Sync + 'static {
    /// Makes `token` the durable mark of `resource` unless a higher one is stored. Resolves once
    /// it is durable. An error means the store's state is unknown.
    fn raise(
        &self,
        resource: ResourceName,
        token: FencingToken,
    ) -> BoxFuture<'static, Result<(), String>>;
}

/// Marks kept in memory only: for tests, and for deployments that accept losing them.
#[derive(Default)]
pub struct MemoryMarks;

impl MarkStore for MemoryMarks {
    fn raise(&self, _: ResourceName, _: FencingToken) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// The single-process fence. See the module documentation.
pub struct LocalFence {
    table: MarkTable,
    store: Arc<dyn MarkStore>,
    /// Woken whenever a mark becomes durable or a resource's older requests drain.
    changed: Notify,
    barrier_wait: Duration,
    resources_max: usize,
}

/// The limits of a [`LocalFence`].
#[derive(Clone, Debug)]
pub struct FenceLimits {
    /// Longest a request with a new token waits for older-token requests to finish.
    pub barrier_wait: Duration,
    /// Resources tracked at most (each costs memory and a stored mark).
    pub resources_max: usize,
}

impl Default for FenceLimits {
    fn default() -> FenceLimits {
        FenceLimits {
            barrier_wait: Duration::from_secs(5),
            resources_max: 10_000_000,
        }
    }
}

impl LocalFence {
    /// A fence over `store`, starting from the marks `stored` (all durable).
    pub fn new(
        store: Arc<dyn MarkStore>,
        stored: impl IntoIterator<Item = (impl AsRef<str>, FencingToken)>,
        limits: FenceLimits,
    ) -> Arc<LocalFence> {
        let table = MarkTable::new();
        for (resource, token) in stored {
            table.insert_stored(resource.as_ref(), token.get());
        }
        Arc::new(LocalFence {
            table,
            store,
            changed: Notify::new(),
            barrier_wait: limits.barrier_wait,
            resources_max: limits.resources_max,
        })
    }

    /// The highest accepted token of `resource`, if any.
    pub fn mark(&self, resource: &str) -> Option<FencingToken> {
        self.table
            .with(resource, |e| e.highest())
            .and_then(FencingToken::new)
    }

    /// Resources tracked.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    async fn admit_local(
        self: Arc<Self>,
        resource: ResourceName,
        token: FencingToken,
    ) -> Result<Permit, Refusal> {
        let deadline = tokio::time::Instant::now() + self.barrier_wait;
        let key = resource.as_str();
        let mut waited = false;
        loop {
            // Register for wake-ups before looking, so that no change is missed in between.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let decided = self.table.with_or_insert(key, self.resources_max, |e| {
                match fencing::check(FencingToken::new(e.highest()), token) {
                    Decision::Reject { highest } => Step::Stale(highest),
                    Decision::AcceptRaise => {
                        // From now on the older tokens are refused; their requests still in
                        // flight are the barrier.
                        e.older += e.current;
                        e.current = 0;
                        e.raise(token.get());
                        Step::Raised
                    }
                    Decision::AcceptSame if e.durable() && e.older == 0 => {
                        e.current += 1;
                        Step::Admitted
                    }
                    Decision::AcceptSame => Step::Wait {
                        older: e.older,
                        durable: e.durable(),
                    },
                }
            });
            let raised = match decided {
                Err(_) => {
                    return Err(Refusal::TooManyResources {
                        max: self.resources_max,
                    });
                }
                Ok(Step::Stale(highest)) => {
                    return Err(Refusal::Stale {
                        resource,
                        token,
                        highest,
                    });
                }
                Ok(Step::Admitted) => {
                    return Ok(Permit::new(Hold {
                        fence: Arc::clone(&self),
                        resource,
                        token: token.get(),
                    }));
                }
                Ok(Step::Raised) => true,
                Ok(Step::Wait { older, durable }) => {
                    if older > 0 {
                        tracing::debug!(%resource, %token, older, durable, "waiting for older-token requests in flight");
                        if !waited {
                            waited = true;
                            opskit::fence::get().barrier_wait(opskit::fence::Mode::Http);
                        }
                    }
                    false
                }
            };
            if raised {
                tracing::debug!(%resource, %token, "mark raised");
                opskit::fence::get().raised(opskit::fence::Mode::Http, key, token.get());
                self.persist(resource.clone(), token);
                continue; // look again: the mark may already be durable and nothing older in flight
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let older = self.table.with(key, |e| e.older).unwrap_or(0);
                return Err(Refusal::Barrier { resource, older });
            }
        }
    }

    /// Makes the raised mark durable in the background (it must complete even if the request
    /// that raised it goes away), then wakes the waiters.
    fn persist(self: &Arc<Self>, resource: ResourceName, token: FencingToken) {
        let fence = Arc::clone(self);
        tokio::spawn(async move {
            match fence.store.raise(resource.clone(), token).await {
                Ok(()) => {
                    fence
                        .table
                        .with(resource.as_str(), |e| e.stored_up_to(token.get()));
                    fence.changed.notify_waiters();
                }
                Err(reason) => {
                    // The store reports the failure itself (and the process stops); waiters
                    // time out at their barrier.
                    tracing::error!(%resource, %token, %reason, "the high-water mark could not be stored");
                }
            }
        });
    }
}

impl Fence for Arc<LocalFence> {
    fn admit<'a>(
        &'a self,
        resource: &'a ResourceName,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Permit, Refusal>> {
        Box::pin(Arc::clone(self).admit_local(resource.clone(), token))
    }
}

/// A request's hold on its resource.
struct Hold {
    fence: Arc<LocalFence>,
    resource: ResourceName,
    token: u64,
}

/// What the fence decided on one look at a resource.
enum Step {
    Stale(FencingToken),
    Raised,
    Admitted,
    Wait { older: u32, durable: bool },
}

impl Drop for Hold {
    fn drop(&mut self) {
        let drained = self.fence.table.with(self.resource.as_str(), |e| {
            // Every hold is counted in `current` while its token is the mark, and was moved to
            // `older` when the mark rose above it.
            if self.token == e.highest() {
                debug_assert!(e.current > 0);
                e.current = e.current.saturating_sub(1);
                false
            } else {
                debug_assert!(e.older > 0);
                e.older = e.older.saturating_sub(1);
                e.older == 0
            }
        });
        if drained == Some(true) {
            self.fence.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::oneshot;

    use super::*;

    fn r(name: &str) -> ResourceName {
        ResourceName::new(name).unwrap()
    }

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    const NO_MARKS: [(&str, FencingToken); 0] = [];

    fn fence(wait_ms: u64) -> Arc<LocalFence> {
        LocalFence::new(
            Arc::new(MemoryMarks),
            NO_MARKS,
            FenceLimits {
                barrier_wait: Duration::from_millis(wait_ms),
                resources_max: 100,
            },
        )
    }

    #[tokio::test]
    async fn lower_tokens_are_refused_equal_ones_share_higher_ones_raise() {
        let f = fence(1000);
        let a = f.admit(&r("x"), t(5)).await.unwrap();
        let b = f.admit(&r("x"), t(5)).await.unwrap(); // same token: concurrently
        assert!(
            matches!(f.admit(&r("x"), t(4)).await, Err(Refusal::Stale { highest, .. }) if highest == t(5))
        );
        drop((a, b));
        let _c = f.admit(&r("x"), t(9)).await.unwrap();
        assert_eq!(f.mark("x"), Some(t(9)));
        assert!(matches!(
            f.admit(&r("x"), t(5)).await,
            Err(Refusal::Stale { .. })
        ));
        // Resources are independent.
        let _d = f.admit(&r("y"), t(1)).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_token_waits_for_older_requests_in_flight() {
        let f = fence(60_000);
        let old = f.admit(&r("x"), t(1)).await.unwrap();
        let (tx, rx) = oneshot::channel();
        let f2 = Arc::clone(&f);
        let newer = tokio::spawn(async move {
            let p = f2.admit(&r("x"), t(2)).await;
            tx.send(()).unwrap();
            p
        });
        // The newer token is waiting: the mark is raised already, so token 1 is refused now.
        while f.mark("x") != Some(t(2)) {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            f.admit(&r("x"), t(1)).await,
            Err(Refusal::Stale { .. })
        ));
        let mut rx = rx;
        assert!(
            rx.try_recv().is_err(),
            "the newer token overtook an older request in flight"
        );
        drop(old);
        newer.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_barrier_wait_is_bounded() {
        let f = fence(100);
        let _old = f.admit(&r("x"), t(1)).await.unwrap();
        let refused = f.admit(&r("x"), t(2)).await;
        assert!(
            matches!(refused, Err(Refusal::Barrier { older: 1, .. })),
            "{refused:?}"
        );
        // The mark stays raised: the old token is refused from now on.
        assert!(matches!(
            f.admit(&r("x"), t(1)).await,
            Err(Refusal::Stale { .. })
        ));
    }

    /// A store that holds raises until the test lets them through.
    struct SlowMarks(Mutex<Vec<oneshot::Sender<()>>>);

    impl MarkStore for SlowMarks {
        fn raise(
            &self,
            _: ResourceName,
            _: FencingToken,
        ) -> BoxFuture<'static, Result<(), String>> {
            let (tx, rx) = oneshot::channel();
            self.0.lock().unwrap().push(tx);
            Box::pin(async move {
                rx.await.unwrap();
                Ok(())
            })
        }
    }

    #[tokio::test]
    async fn nothing_with_a_new_mark_passes_before_the_mark_is_durable() {
        let store = Arc::new(SlowMarks(Mutex::new(Vec::new())));
        let f = LocalFence::new(store.clone(), NO_MARKS, FenceLimits::default());
        let f2 = Arc::clone(&f);
        let first = tokio::spawn(async move { f2.admit(&r("x"), t(3)).await.map(|_| ()) });
        let f3 = Arc::clone(&f);
        let second = tokio::spawn(async move { f3.admit(&r("x"), t(3)).await.map(|_| ()) });
        while store.0.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        assert!(
            !first.is_finished() && !second.is_finished(),
            "relayed before the mark was durable"
        );
        for tx in store.0.lock().unwrap().drain(..) {
            tx.send(()).unwrap();
        }
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn the_number_of_resources_is_bounded() {
        let f = fence(1000);
        for i in 0..100 {
            f.admit(&r(&format!("r{i}")), t(1)).await.unwrap();
        }
        assert!(matches!(
            f.admit(&r("one-more"), t(1)).await,
            Err(Refusal::TooManyResources { max: 100 })
        ));
        f.admit(&r("r7"), t(2)).await.unwrap(); // known resources still work
    }
}
