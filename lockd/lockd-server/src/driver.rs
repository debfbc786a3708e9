//! The driver: runs the core under one mutex, performs its effects, holds the reply channels
//! of queued waiters, and runs the expiry timer.
//!
//! Every core call happens with the mutex held and takes the clock's `now`; its persist ops are
//! queued to the writer before the mutex is released, so the store sees them in decision order.
//! The mutex is never held across an `.await`.
//!
//! # When a reply may leave
//!
//! A grant is answered only once it is durable (invariants 2 and 8). A reply that shows
//! another lease's token (busy, wait timeout, describe, a refused renew) also waits until
//! everything decided before it is durable, so that no token a crash could take back is ever
//! shown. Successful renewals are answered at once: they are not persisted at all (a restart
//! renews every lease). So are releases in the embedded mode, where only a crash of lockd in
//! the next few milliseconds loses one (which delays the next grant to the TTL). An HA
//! leader answers a release once etcd has it: its term can end, and take unsent batches
//! with it, without the process crashing.
//!
//! # Time (HA mode)
//!
//! The core is given the clock's time, but an HA leader lets leases expire only up to the
//! point etcd's clock has surely reached by its last clock check ([`Authority::expiry_limit`]):
//! a clock that jumps expires nothing beyond that point before the check that finds the jump
//! ends the term.
//!
//! # Waiters
//!
//! A queued Acquire parks on a oneshot channel registered under its `WaiterId`. The handler's
//! future owns a [`WaitGuard`]; if the future is dropped while still waiting (the client
//! cancelled the call, or its connection closed), the guard takes the waiter out of the queue.
//! A waiter whose client vanishes at the very moment it is granted keeps the grant: the lease
//! runs out its TTL unless the client retries with the same request id and picks it up.
//!
//! # Authority (HA mode)
//!
//! The leader of an etcd cluster answers only while its leadership term is surely in force
//! ([`Authority`]): every successful answer is vouched for at the moment it leaves, after the
//! decision (and its commit) is done. A leader that lost its term (paused past its lease, cut
//! off from etcd) answers UNAVAILABLE, so no renewal, grant or retried grant it answers can be
//! in force when another instance starts deciding.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fencing::{LeaseId, ResourceName};
use lockd_core::{
    AcquireAllOutcome, AcquireAllRequest, AcquireError, AcquireOutcome, AcquireRequest, Busy, Core,
    Description, Effect, Grant, LeaseIdSource, Millis, ReleaseOutcome, RenewError, Renewed, Stats,
    WaiterId,
};
use tokio::sync::{Notify, oneshot};
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::writer::{Seq, Writer, WriterStopped};

/// Lease ids from the operating system's CSPRNG (invariant 5: 128 unguessable bits).
pub struct OsLeaseIds;

impl LeaseIdSource for OsLeaseIds {
    fn next_lease_id(&mut self) -> LeaseId {
        let mut bytes = [0u8; 16];
        // The kernel's CSPRNG does not fail once the system has booted; if it ever did, lockd
        // must not hand out guessable capabilities, so it stops.
        getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
        LeaseId::from_bytes(bytes)
    }
}

/// Whether this lockd may still answer for its state (the etcd leader: while its term is surely
/// in force). The embedded mode has no authority to lose.
pub trait Authority: Send + Sync {
    fn in_force(&self) -> bool;

    /// Up to when leases may expire when the clock reads `now` (`None`: up to `now`). The
    /// etcd leader's: up to what its last check against etcd's clock proved, so that nothing
    /// expires by a clock that may have jumped since.
    fn expiry_limit(&self, _now: Millis) -> Option<Millis> {
        None
    }

    /// Resolves when the clock may be trusted further (the next passing check).
    fn trusted_again(&self) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(std::future::pending())
    }
}

/// The answer to an Acquire.
#[derive(Debug)]
pub enum AcquireReply {
    Granted {
        grant: Grant,
        duplicate: bool,
        held: bool,
    },
    Busy(Busy),
    TimedOut(Option<Busy>),
}

/// Why a call could not be served.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Acquire(#[from] AcquireError),
    #[error(transparent)]
    Renew(#[from] RenewError),
    #[error("a retry with the same request_id took over this waiting call")]
    Superseded,
    #[error("lockd is shutting down")]
    ShuttingDown,
    #[error("lockd's store has failed; no grant can be made durable")]
    StoreFailed,
    #[error("this lockd no longer leads the cluster; retry (any instance forwards to the leader)")]
    NotLeader,
}

enum WaitEnd {
    Granted { grant: Grant, seq: Seq },
    TimedOut(Option<Busy>),
    Superseded,
    Shutdown,
}

struct Slot {
    generation: u64,
    tx: oneshot::Sender<WaitEnd>,
}

struct State {
    core: Core,
    slots: HashMap<WaiterId, Slot>,
    next_generation: u64,
}

/// See the module documentation.
pub struct Driver {
    state: Mutex<State>,
    writer: Writer,
    clock: Clock,
    timer: Notify,
    /// The deadline the timer task sleeps until (`u64::MAX`: none).
    armed: AtomicU64,
    closed: AtomicBool,
    /// Closed because the leadership ended, not because the process stops.
    deposed: AtomicBool,
    authority: Option<Arc<dyn Authority>>,
}

enum Step {
    Reply(AcquireReply, Seq),
    Wait {
        waiter: WaiterId,
        generation: u64,
        rx: oneshot::Receiver<WaitEnd>,
    },
}

impl Driver {
    pub fn new(core: Core, writer: Writer, clock: Clock) -> Driver {
        Driver {
            state: Mutex::new(State {
                core,
                slots: HashMap::new(),
                next_generation: 1,
            }),
            writer,
            clock,
            timer: Notify::new(),
            armed: AtomicU64::new(u64::MAX),
            closed: AtomicBool::new(false),
            deposed: AtomicBool::new(false),
            authority: None,
        }
    }

    /// A driver that answers only while `authority` is in force (the HA leader).
    pub fn with_authority(mut self, authority: Arc<dyn Authority>) -> Driver {
        self.authority = Some(authority);
        self
    }

    /// Why calls are refused once the driver is closed.
    fn closed_error(&self) -> DriverError {
        if self.deposed.load(Ordering::Acquire) {
            DriverError::NotLeader
        } else {
            DriverError::ShuttingDown
        }
    }

    /// Waits until everything numbered up to `seq` is durable. When the store stops, a
    /// single lockd has failed; an HA leader has only lost its term (another instance takes
    /// over), which the client is told so that it retries.
    async fn durable(&self, seq: Seq) -> Result<(), DriverError> {
        self.writer.wait(seq).await.map_err(|WriterStopped| {
            if self.authority.is_some() {
                DriverError::NotLeader
            } else {
                DriverError::StoreFailed
            }
        })
    }

    /// Vouches for an answer about to leave (see the module documentation).
    fn vouch<T>(&self, answer: T) -> Result<T, DriverError> {
        match &self.authority {
            Some(a) if !a.in_force() => Err(DriverError::NotLeader),
            _ => Ok(answer),
        }
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn stats(&self) -> Stats {
        self.lock().core.stats()
    }

    /// What the core holds now, for the metrics.
    pub fn gauges(&self) -> crate::metrics::State {
        let st = self.lock();
        let s = st.core.stats();
        crate::metrics::State {
            leases: s.leases,
            waiters: s.waiters,
            requests: s.requests,
            last_token: st.core.last_token().map_or(0, |t| t.get()),
            longest_queues: st
                .core
                .longest_queues(crate::metrics::TOP_N)
                .into_iter()
                .map(|(r, n)| (r.as_str().to_string(), n))
                .collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock means an invariant assertion fired; the state is not to be
        // trusted, so every later call fails loudly too.
        let mut st = self
            .state
            .lock()
            .expect("lockd core poisoned by an earlier invariant violation");
        if let Some(a) = &self.authority {
            // Before every core call: how far leases may expire (see Authority).
            let limit = a.expiry_limit(self.clock.now());
            st.core.limit_expiry(limit);
        }
        st
    }

    fn check_open(&self) -> Result<(), DriverError> {
        if self.closed.load(Ordering::Acquire) {
            Err(self.closed_error())
        } else {
            Ok(())
        }
    }

    pub async fn acquire(&self, req: AcquireRequest) -> Result<AcquireReply, DriverError> {
        self.check_open()?;
        let resource = req.resource.clone();
        let step = {
            let mut st = self.lock();
            let mut fx = Vec::new();
            let outcome = st.core.acquire(self.clock.now(), req, &mut fx);
            let seq = self.apply(&mut st, fx);
            match outcome? {
                AcquireOutcome::Granted(grant) => Step::Reply(
                    AcquireReply::Granted {
                        grant,
                        duplicate: false,
                        held: true,
                    },
                    seq,
                ),
                AcquireOutcome::Reentered(grant) => {
                    debug!(%resource, token = %grant.token, holds = grant.holds, "re-entered");
                    // Answered once the re-entry (and all before it) is durable, as a grant.
                    Step::Reply(
                        AcquireReply::Granted {
                            grant,
                            duplicate: false,
                            held: true,
                        },
                        seq,
                    )
                }
                AcquireOutcome::Duplicate { grant, held } => {
                    debug!(%resource, token = %grant.token, held, "duplicate request");
                    Step::Reply(
                        AcquireReply::Granted {
                            grant,
                            duplicate: true,
                            held,
                        },
                        seq,
                    )
                }
                AcquireOutcome::Busy(busy) => {
                    crate::metrics::get().contended(resource.as_str());
                    Step::Reply(AcquireReply::Busy(busy), seq)
                }
                AcquireOutcome::Queued { waiter, position } => {
                    crate::metrics::get().contended(resource.as_str());
                    debug!(%resource, waiter = waiter.0, position, "queued");
                    let (generation, rx) = st.register(waiter);
                    Step::Wait {
                        waiter,
                        generation,
                        rx,
                    }
                }
                AcquireOutcome::Rejoined { waiter, position } => {
                    debug!(%resource, waiter = waiter.0, position, "rejoined by a retry");
                    if let Some(old) = st.slots.remove(&waiter) {
                        let _ = old.tx.send(WaitEnd::Superseded);
                    }
                    let (generation, rx) = st.register(waiter);
                    Step::Wait {
                        waiter,
                        generation,
                        rx,
                    }
                }
            }
        };
        match step {
            Step::Reply(reply, seq) => {
                self.durable(seq).await?;
                self.granted(&resource, self.vouch(reply)?)
            }
            Step::Wait {
                waiter,
                generation,
                rx,
            } => {
                let mut guard = WaitGuard {
                    driver: self,
                    waiter,
                    generation,
                    armed: true,
                };
                let end = rx.await;
                guard.armed = false;
                match end {
                    Ok(WaitEnd::Granted { grant, seq }) => {
                        self.durable(seq).await?;
                        let reply = self.vouch(AcquireReply::Granted {
                            grant,
                            duplicate: false,
                            held: true,
                        })?;
                        self.granted(&resource, reply)
                    }
                    Ok(WaitEnd::TimedOut(busy)) => {
                        self.durable(self.writer.submit(Vec::new())).await?;
                        self.vouch(AcquireReply::TimedOut(busy))
                    }
                    Ok(WaitEnd::Superseded) => Err(DriverError::Superseded),
                    Ok(WaitEnd::Shutdown) | Err(_) => Err(self.closed_error()),
                }
            }
        }
    }

    /// Takes every resource of a set at once, or none (`Core::acquire_all`). Answered once
    /// the set's grants, one atomic op, are durable; a busy answer too (it names the current
    /// holder's token).
    pub async fn acquire_all(
        &self,
        req: AcquireAllRequest,
    ) -> Result<AcquireAllOutcome, DriverError> {
        self.check_open()?;
        let (outcome, seq) = {
            let mut st = self.lock();
            let mut fx = Vec::new();
            let outcome = st.core.acquire_all(self.clock.now(), req, &mut fx);
            (outcome, self.apply(&mut st, fx))
        };
        let outcome = outcome?;
        self.durable(seq).await?;
        let outcome = self.vouch(outcome)?;
        match &outcome {
            AcquireAllOutcome::Granted(grants) => {
                for g in grants {
                    debug!(resource = %g.resource, token = %g.token, "granted in a set");
                }
            }
            AcquireAllOutcome::Duplicate(_) => debug!("duplicate set request"),
            AcquireAllOutcome::Busy { resource, busy } => {
                crate::metrics::get().contended(resource.as_str());
                debug!(%resource, token = %busy.token, "set busy");
            }
        }
        Ok(outcome)
    }

    pub async fn renew(
        &self,
        resource: &ResourceName,
        lease_id: LeaseId,
    ) -> Result<Renewed, DriverError> {
        self.check_open()?;
        let (result, seq) = {
            let mut st = self.lock();
            let mut fx = Vec::new();
            let result = st.core.renew(self.clock.now(), resource, lease_id, &mut fx);
            (result, self.apply(&mut st, fx))
        };
        if result.is_err() {
            // The error names the current holder's token: show it only once it is durable.
            self.durable(seq).await?;
        }
        let renewed = self.vouch(result?)?;
        // Logged once answered: a deposed leader's core may renew, but never says so.
        debug!(%resource, expires_at = renewed.expires_at, "renewed");
        Ok(renewed)
    }

    /// `reply`, answered: a fresh grant is logged (only now: a grant a deposed leader's core
    /// decided never leaves, and its log must not say it was made).
    fn granted(
        &self,
        resource: &ResourceName,
        reply: AcquireReply,
    ) -> Result<AcquireReply, DriverError> {
        if let AcquireReply::Granted {
            grant,
            duplicate: false,
            ..
        } = &reply
        {
            debug!(%resource, token = %grant.token, "granted");
        }
        Ok(reply)
    }

    pub async fn release(
        &self,
        resource: &ResourceName,
        lease_id: LeaseId,
    ) -> Result<ReleaseOutcome, DriverError> {
        let mut outcomes = self.release_many(&[(resource.clone(), lease_id)]).await?;
        Ok(outcomes.pop().expect("one outcome per lease"))
    }

    /// Renews each of `leases` (see [`Driver::renew`]) under one hold of the core, so that
    /// a batch costs one lock and one wake-up however long it is. A lease that is not current
    /// is that lease's answer, not the call's.
    pub async fn renew_many(
        &self,
        leases: &[(ResourceName, LeaseId)],
    ) -> Result<Vec<Result<Renewed, RenewError>>, DriverError> {
        self.check_open()?;
        let (results, seq) = {
            let mut st = self.lock();
            let mut fx = Vec::new();
            let now = self.clock.now();
            let results: Vec<_> = leases
                .iter()
                .map(|(resource, id)| st.core.renew(now, resource, *id, &mut fx))
                .collect();
            (results, self.apply(&mut st, fx))
        };
        if results.iter().any(Result::is_err) {
            // A refusal names the current holder's token: shown only once it is durable.
            self.durable(seq).await?;
        }
        self.vouch(results)
    }

    /// Releases each of `leases` (see [`Driver::release`]) under one hold of the core: their
    /// removals, and the grants they hand to waiters, go to the store as one batch, one
    /// commit.
    pub async fn release_many(
        &self,
        leases: &[(ResourceName, LeaseId)],
    ) -> Result<Vec<ReleaseOutcome>, DriverError> {
        self.check_open()?;
        let (outcomes, seq) = {
            let mut st = self.lock();
            let mut fx = Vec::new();
            let now = self.clock.now();
            let outcomes: Vec<_> = leases
                .iter()
                .map(|(resource, id)| st.core.release(now, resource, *id, &mut fx))
                .collect();
            (outcomes, self.apply(&mut st, fx))
        };
        let mut not_held = false;
        for ((resource, _), outcome) in leases.iter().zip(&outcomes) {
            match outcome {
                ReleaseOutcome::Released { token, held_ms } => {
                    crate::metrics::get().lease_ended(*held_ms, false);
                    debug!(%resource, %token, "released");
                }
                ReleaseOutcome::Unheld { token, holds } => {
                    debug!(%resource, %token, holds, "released one hold");
                }
                // It names the current holder's token: shown only once it is durable.
                ReleaseOutcome::NotHeld { .. } => not_held = true,
            }
        }
        // An HA leader answers a release only once etcd has it: a release it answered and
        // then lost with its term (quorum lost, say) would leave the lock held for a TTL by
        // a client that let it go (see the module documentation).
        if not_held || self.authority.is_some() {
            self.durable(seq).await?;
        }
        self.vouch(outcomes)
    }

    /// One page of the held locks (see `Core::list`), the places to look at bounded so that
    /// the core is held only briefly.
    pub async fn list(
        &self,
        from: u32,
        limit: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Result<lockd_core::Page, DriverError> {
        self.check_open()?;
        let (page, seq) = {
            let mut st = self.lock();
            let mut fx = Vec::new();
            // Places looked at per page: a few milliseconds under the lock at most.
            let budget = limit.saturating_mul(64).max(65_536);
            let page = st
                .core
                .list(self.clock.now(), from, limit, budget, keep, &mut fx);
            (page, self.apply(&mut st, fx))
        };
        self.durable(seq).await?;
        self.vouch(page)
    }

    pub async fn describe(&self, resource: &ResourceName) -> Result<Description, DriverError> {
        self.check_open()?;
        let (description, seq) = {
            let mut st = self.lock();
            let mut fx = Vec::new();
            let description = st.core.describe(self.clock.now(), resource, &mut fx);
            (description, self.apply(&mut st, fx))
        };
        self.durable(seq).await?;
        self.vouch(description)
    }

    /// Whether it still takes calls (not shut down, not deposed, the store not failed).
    pub fn serving(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }

    /// Ends every wait with "shutting down" and refuses new calls, so that a graceful shutdown
    /// does not wait minutes for queued Acquires.
    pub fn shutdown(&self) {
        self.close();
    }

    /// Like [`Driver::shutdown`], because the leadership ended: calls are refused as
    /// "not the leader", so that clients retry (and are forwarded to the next leader).
    pub fn depose(&self) {
        self.deposed.store(true, Ordering::Release);
        self.close();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut st = self.lock();
        for (_, slot) in st.slots.drain() {
            let _ = slot.tx.send(WaitEnd::Shutdown);
        }
        self.timer.notify_one();
    }

    /// Flushes and stops the writer (after the server has stopped serving).
    pub fn close_store(&self) {
        self.writer.close();
    }

    /// Expires leases and ends waits when they fall due. Runs until [`Driver::shutdown`].
    pub async fn run_timer(&self) {
        while !self.closed.load(Ordering::Acquire) {
            let next = {
                let st = self.lock();
                let next = st.core.next_deadline();
                self.armed
                    .store(next.unwrap_or(u64::MAX), Ordering::Release);
                next
            };
            match next {
                None => self.timer.notified().await,
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(self.clock.instant(at).into()) => {
                            let trusted_again = self.authority.as_ref().map(|a| a.trusted_again());
                            let now = self.clock.now();
                            let held_back = {
                                let mut st = self.lock();
                                let mut fx = Vec::new();
                                st.core.tick(now, &mut fx);
                                self.apply(&mut st, fx);
                                st.core.next_deadline().is_some_and(|d| d <= now)
                            };
                            // An expiry due by the clock but beyond what etcd's clock has
                            // proved waits for the next clock check.
                            if held_back && let Some(again) = trusted_again {
                                tokio::select! {
                                    () = again => {}
                                    () = self.timer.notified() => {}
                                }
                            }
                        }
                        () = self.timer.notified() => {}
                    }
                }
            }
        }
    }

    /// Performs the effects of one core call (with the lock held) and returns the writer
    /// position that covers everything decided so far.
    fn apply(&self, st: &mut State, fx: Vec<Effect>) -> Seq {
        let mut ops = Vec::new();
        let mut granted = Vec::new();
        for effect in fx {
            match effect {
                Effect::Persist(op) => ops.push(op),
                Effect::Granted { waiter, grant } => granted.push((waiter, grant)),
                Effect::WaitTimedOut { waiter, busy } => {
                    debug!(waiter = waiter.0, "wait timed out");
                    if let Some(slot) = st.slots.remove(&waiter) {
                        let _ = slot.tx.send(WaitEnd::TimedOut(busy));
                    }
                }
                Effect::Expired {
                    resource,
                    lease_id,
                    token,
                    holder,
                    held_ms,
                } => {
                    crate::metrics::get().lease_ended(held_ms, true);
                    crate::audit::lease_event(
                        "expiry", &resource, lease_id, token, &holder, held_ms,
                    );
                    crate::metrics::get()
                        .lease_news(|| news("expiry", &resource, token, &holder, held_ms));
                    info!(%resource, %token, holder = holder.as_str(), "lease expired without renewal");
                }
                Effect::HeldLong {
                    resource,
                    lease_id,
                    token,
                    holder,
                    held_ms,
                } => {
                    crate::metrics::get().held_long();
                    crate::metrics::get()
                        .lease_news(|| news("long_hold", &resource, token, &holder, held_ms));
                    crate::audit::lease_event(
                        "long_hold",
                        &resource,
                        lease_id,
                        token,
                        &holder,
                        held_ms,
                    );
                    warn!(%resource, %token, holder = holder.as_str(), held_ms, "lease held longer than hold_warn_after_ms (renewed all along): is its holder stuck?");
                }
            }
        }
        let seq = self.writer.submit(ops);
        for (waiter, grant) in granted {
            debug!(resource = %grant.resource, token = %grant.token, waiter = waiter.0, "handed over to waiter");
            if let Some(slot) = st.slots.remove(&waiter) {
                let _ = slot.tx.send(WaitEnd::Granted { grant, seq });
            }
        }
        if let Some(next) = st.core.next_deadline()
            && next < self.armed.load(Ordering::Acquire)
        {
            self.armed.store(next, Ordering::Release);
            self.timer.notify_one();
        }
        seq
    }

    /// Called by a dropped [`WaitGuard`]: the waiting call went away.
    fn abandon(&self, waiter: WaiterId, generation: u64) {
        let mut st = self.lock();
        if st
            .slots
            .get(&waiter)
            .is_none_or(|s| s.generation != generation)
        {
            return; // answered already, or taken over by a retry
        }
        st.slots.remove(&waiter);
        let mut fx = Vec::new();
        let was_waiting = st.core.cancel(self.clock.now(), waiter, &mut fx);
        self.apply(&mut st, fx);
        if was_waiting {
            crate::metrics::get().call_without_answer("acquire", "cancelled");
        }
        debug!(
            waiter = waiter.0,
            was_waiting, "waiter left: call cancelled or client disconnected"
        );
    }

    /// Converts core time to Unix milliseconds for replies.
    pub fn wall_ms(&self, at: Millis) -> u64 {
        self.clock.wall_ms(at)
    }
}

impl State {
    fn register(&mut self, waiter: WaiterId) -> (u64, oneshot::Receiver<WaitEnd>) {
        let (tx, rx) = oneshot::channel();
        let generation = self.next_generation;
        self.next_generation += 1;
        self.slots.insert(waiter, Slot { generation, tx });
        (generation, rx)
    }
}

/// Takes a waiter out of its queue when the waiting call's future is dropped.
struct WaitGuard<'a> {
    driver: &'a Driver,
    waiter: WaiterId,
    generation: u64,
    armed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.driver.abandon(self.waiter, self.generation);
        }
    }
}

/// An expiry or a long hold, as the status page lists it.
fn news(
    kind: &'static str,
    resource: &fencing::ResourceName,
    token: fencing::FencingToken,
    holder: &lockd_core::Holder,
    held_ms: u64,
) -> crate::metrics::LeaseNews {
    crate::metrics::LeaseNews {
        kind,
        resource: resource.as_str().to_string(),
        token: token.get(),
        holder: holder.as_str().to_string(),
        held_ms,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use lockd_core::{Holder, Limits, RequestId};
    use lockd_store::MemoryStore;

    use super::*;

    /// An authority a test switches off, as a leader's term running out does.
    struct Switch(AtomicBool);

    impl Authority for Switch {
        fn in_force(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
    }

    fn request(resource: &str, request_id: &str) -> AcquireRequest {
        let limits = Limits::default();
        AcquireRequest {
            resource: ResourceName::new(resource).unwrap(),
            request_id: Some(RequestId::new(request_id, &limits).unwrap()),
            holder: Holder::new("test", &limits).unwrap(),
            ttl_ms: 10_000,
            wait_ms: 0,
            owner: None,
            permits: 0,
            rw: None,
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn without_authority_nothing_is_answered_as_done() {
        let clock = Clock::new();
        let core = Core::new(Limits::default(), Box::new(OsLeaseIds));
        let writer = Writer::start(
            Box::new(MemoryStore::new()),
            Duration::from_millis(10),
            Box::new(|e| panic!("store failed: {e}")),
        );
        let authority = Arc::new(Switch(AtomicBool::new(true)));
        let driver = Driver::new(core, writer, clock).with_authority(authority.clone());
        let AcquireReply::Granted { grant, .. } = driver.acquire(request("a", "q1")).await.unwrap()
        else {
            panic!("a free resource is granted");
        };
        let resource = ResourceName::new("a").unwrap();
        driver.renew(&resource, grant.lease_id).await.unwrap();

        // The term is over: a renewal, a retried grant, a new grant, a release, a describe and
        // the batches are all refused, though the core could answer each.
        authority.0.store(false, Ordering::Release);
        let not_leader = |r: Result<(), DriverError>, what: &str| {
            assert!(
                matches!(r, Err(DriverError::NotLeader)),
                "{what} was answered without authority: {r:?}"
            );
        };
        not_leader(
            driver.renew(&resource, grant.lease_id).await.map(drop),
            "a renewal",
        );
        not_leader(
            driver.acquire(request("a", "q1")).await.map(drop),
            "a retried grant",
        );
        not_leader(
            driver.acquire(request("b", "q2")).await.map(drop),
            "a new grant",
        );
        not_leader(
            driver.release(&resource, grant.lease_id).await.map(drop),
            "a release",
        );
        not_leader(driver.describe(&resource).await.map(drop), "a describe");
        let batch = [(resource.clone(), grant.lease_id)];
        not_leader(
            driver.renew_many(&batch).await.map(drop),
            "a batch of renewals",
        );
        not_leader(
            driver.release_many(&batch).await.map(drop),
            "a batch of releases",
        );
        driver.shutdown();
        driver.close_store();
    }
}
