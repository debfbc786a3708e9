//! The lock guard: renews the lease in the background and says when it is lost.
//!
//! States: *held* → *lost* (lockd refused a renewal, or the local deadline passed) — or
//! *released* / *detached* (by the owner). Lost is final: the guard never renews again, and
//! the owner must stop working under the token.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use crate::{Backoff, Client, ClientError, Lease};

/// How much earlier than lockd the guard considers its lease over: a tenth of the TTL, at
/// least 10 ms. It covers the rate difference between this machine's clock and lockd's (far
/// below 1 % on real hardware) and the time the owner needs to notice and stop.
pub fn safety_margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(10))
}

/// Why a lease was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The local deadline passed without a successful renewal (lockd unreachable or slow).
    DeadlinePassed,
    /// lockd said the lease is not current any more.
    NotCurrent(String),
    /// A renewal was refused for another reason.
    RenewRefused(String),
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::DeadlinePassed => {
                f.write_str("no successful renewal before the lease's local deadline")
            }
            LostReason::NotCurrent(m) => write!(f, "lockd: {m}"),
            LostReason::RenewRefused(m) => write!(f, "renewal refused: {m}"),
        }
    }
}

/// A held lock. See the module and crate documentation.
#[derive(Debug)]
pub struct LockGuard {
    lease: Lease,
    client: Client,
    lost: watch::Receiver<Option<LostReason>>,
    deadline: watch::Receiver<Instant>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl LockGuard {
    /// Starts renewing `lease`, whose TTL on lockd started no earlier than `extended_at`.
    pub(crate) fn start(
        client: Client,
        lease: Lease,
        extended_at: std::time::Instant,
    ) -> LockGuard {
        let deadline = Instant::from_std(extended_at) + lease.ttl - safety_margin(lease.ttl);
        let (lost_tx, lost) = watch::channel(None);
        let (deadline_tx, deadline_rx) = watch::channel(deadline);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(renew_loop(
            client.clone(),
            lease.clone(),
            lost_tx,
            deadline_tx,
            stop_rx,
        ));
        LockGuard {
            lease,
            client,
            lost,
            deadline: deadline_rx,
            stop,
            task: Some(task),
        }
    }

    /// The fencing token's number.
    pub fn token(&self) -> u64 {
        self.lease.token
    }

    /// The token to attach to every write the lock protects: the signed form when lockd signs
    /// tokens, the number otherwise ([`Lease::fence_token`]).
    pub fn fence_token(&self) -> String {
        self.lease.fence_token()
    }

    /// The lease id (the capability to renew and release; keep it to yourself).
    pub fn lease_id(&self) -> &str {
        &self.lease.lease_id
    }

    pub fn resource(&self) -> &str {
        &self.lease.resource
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// When the guard will consider the lease lost unless a renewal succeeds before.
    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Resolves when the lease is lost; stop working under the token then.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.lost.clone();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().expect("waited for Some"),
                // The renewal task ended without a verdict: only when the guard was released
                // or detached, after which nobody may work under the token anyway.
                Err(_) => LostReason::RenewRefused("the guard was released".to_string()),
            }
        }
    }

    /// Takes the lock once more, nested in this hold (a reentrant lease: acquired with an
    /// [`AcquireOptions::owner`](crate::AcquireOptions::owner)): the same lease and token,
    /// one more hold at lockd, and a guard of its own that renews it and releases that one
    /// hold when released or dropped. The lease ends when every guard has released.
    ///
    /// `LeaseNotCurrent` when the lease has ended meanwhile (an ended lease is never renewed
    /// into a new one: a new lease, if granted, is released at once), `InvalidArgument` for a
    /// lease that is not reentrant.
    pub async fn reenter(&self) -> Result<LockGuard, ClientError> {
        let Some(owner) = self.lease.owner.clone() else {
            return Err(ClientError::InvalidArgument(format!(
                "the lease of {} has no owner: acquire it with an owner to nest it",
                self.lease.resource
            )));
        };
        let opts = crate::AcquireOptions {
            ttl: Some(self.lease.ttl),
            owner: Some(owner),
            ..crate::AcquireOptions::default()
        };
        let lost = || {
            ClientError::LeaseNotCurrent(format!(
                "the lease of {} with token {} has ended: it cannot be re-entered",
                self.lease.resource, self.lease.token
            ))
        };
        match self.client.acquire(&self.lease.resource, opts).await? {
            crate::Acquired::Granted(inner) if inner.lease.lease_id == self.lease.lease_id => {
                Ok(inner)
            }
            crate::Acquired::Granted(other) => {
                // Free again, and granted anew: not the hold this guard nests in.
                let _ = other.release().await;
                Err(lost())
            }
            crate::Acquired::NotGranted(_) => Err(lost()),
        }
    }

    /// Trades this write lease of a read-write lock ([`Mode::Write`](crate::Mode::Write)) for
    /// a read lease, in one step at lockd: no writer can take the lock in between, and the
    /// readers waiting at the head of its queue join this one. The new guard's lease is on a
    /// reader's slot, with a new token. There is no upgrade (docs/api.md says why).
    ///
    /// This guard stops renewing first. `LeaseNotCurrent` when the write lease had ended; on
    /// any error the write lease is released, best effort. Dropped before its answer, it
    /// leaves nothing held: the downgrade is asked again in the background and the reader
    /// released.
    pub async fn downgrade(mut self) -> Result<LockGuard, ClientError> {
        self.stop_renewing().await;
        self.task = None;
        let client = self.client.clone();
        let (resource, lease_id) = (&self.lease.resource, &self.lease.lease_id);
        let downgraded = client
            .downgrade(resource, lease_id, Some(self.lease.ttl))
            .await;
        if downgraded.is_err() {
            let _ = client.release(resource, lease_id).await;
        }
        downgraded
    }

    /// How many times the owner held the lease when this guard got it (1, or more for a
    /// guard from [`LockGuard::reenter`]).
    pub fn holds(&self) -> u32 {
        self.lease.holds
    }

    /// Stops renewing and releases the lease. `Ok(false)`: it was no longer current.
    pub async fn release(mut self) -> Result<bool, ClientError> {
        self.stop_renewing().await;
        let released = self
            .client
            .release(&self.lease.resource, &self.lease.lease_id)
            .await;
        self.task = None;
        released
    }

    /// Stops renewing without releasing and hands the lease over (for callers that manage it
    /// themselves, such as `lockctl acquire`).
    pub async fn detach(mut self) -> Lease {
        self.stop_renewing().await;
        self.task = None;
        self.lease.clone()
    }

    async fn stop_renewing(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.as_mut() {
            let _ = task.await;
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        let _ = self.stop.send(true);
        task.abort();
        if self.is_lost() {
            return;
        }
        // Best effort: release in the background if a runtime is still there. If not, the
        // lease simply runs out its TTL.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let (resource, lease_id) = (self.lease.resource.clone(), self.lease.lease_id.clone());
            rt.spawn(async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    client.release(&resource, &lease_id),
                )
                .await;
            });
        }
    }
}

fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(rand::rng().random_range(0.9..=1.1))
}

async fn renew_loop(
    client: Client,
    lease: Lease,
    lost: watch::Sender<Option<LostReason>>,
    deadline_tx: watch::Sender<Instant>,
    mut stop: watch::Receiver<bool>,
) {
    let interval = lease.ttl / 3;
    let margin = safety_margin(lease.ttl);
    let mut deadline = *deadline_tx.borrow();
    let mut next = Instant::now() + jittered(interval);
    let mut backoff = Backoff::new();
    let verdict = loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = sleep_until(deadline) => break LostReason::DeadlinePassed,
            () = sleep_until(next) => {}
        }
        let sent = Instant::now();
        let result = tokio::select! {
            _ = stop.changed() => return,
            () = sleep_until(deadline) => break LostReason::DeadlinePassed,
            r = client.renew(&lease.resource, &lease.lease_id) => r,
        };
        match result {
            Ok(_) => {
                deadline = sent + lease.ttl - margin;
                let _ = deadline_tx.send(deadline);
                backoff.reset();
                next = sent + jittered(interval);
            }
            Err(ClientError::LeaseNotCurrent(m)) => break LostReason::NotCurrent(m),
            Err(ClientError::Unavailable(m)) => {
                tracing::warn!(resource = %lease.resource, error = %m, "renewal failed; retrying until the lease's local deadline");
                next = Instant::now() + backoff.next_delay();
            }
            Err(other) => break LostReason::RenewRefused(other.to_string()),
        }
    };
    tracing::warn!(resource = %lease.resource, token = lease.token, reason = %verdict, "lease lost");
    let _ = lost.send(Some(verdict));
}
