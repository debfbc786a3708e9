//! The lock state machine.
//!
//! # States of a resource
//!
//! - **free**: no lease, no waiters (and no entry in any map: free resources cost nothing);
//! - **held**: one lease (invariant 1) and a FIFO queue of zero or more waiters.
//!
//! A resource with waiters is always held: whenever a lease ends (release or expiry) the head
//! of the queue is granted at once (hand-off), so no client ever races another for a free lock
//! that has waiters, and no wake-up storm happens.
//!
//! # Irreversible steps
//!
//! - Issuing a token: `last_token` only grows; a token is never issued twice (invariant 2).
//! - Ending a lease (release or expiry): the lease id is dead for good, a later renew or
//!   release with it is refused or ignored (invariant 5).
//! - A request id's grant: until its retention ends, the same id returns the same grant
//!   (invariant 6).
//!
//! # Time
//!
//! Every call takes `now` and first *advances* the machine to it: lease expiries and wait
//! deadlines that fell due are processed in deadline order, as if each had been processed at its
//! own time (so a lease that expired at 5 is handed to a waiter whose deadline is 8 even when the
//! first call after both is at 10). At equal deadlines a lease expiry comes before a waiter's
//! timeout, so a waiter still waiting at the instant the lock frees gets it. Grants made while
//! advancing are given their full TTL from `now`, the moment the driver can actually deliver
//! them.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use fencing::{FencingToken, LeaseId, ResourceName};

use crate::error::{AcquireError, InvalidArgument, RecoverError, RenewError};
use crate::leases::{LeaseTable, NewLease, Reentry};
use crate::limits::Limits;
use crate::outcome::{
    AcquireOutcome, Busy, Description, Effect, Grant, HeldBy, Listed, Page, ReleaseOutcome, Renewed,
};
use crate::persist::{LeaseRecord, Op, Reentrant, RwRole, Snapshot};
use crate::tenants::{Caps, Tenancy, Usage};

use crate::types::{Holder, Millis, Owner, RequestId, WaiterId};

mod multi;
mod queue;
mod quota;
mod rwlock;
mod semaphore;
pub use multi::{AcquireAllOutcome, AcquireAllRequest};
use quota::Counted;

/// Where lease ids come from. The server draws them from the operating system's CSPRNG
/// (invariant 5: unguessable); tests use a counter so that transcripts are stable.
pub trait LeaseIdSource: Send {
    fn next_lease_id(&mut self) -> LeaseId;
}

impl<F: FnMut() -> LeaseId + Send> LeaseIdSource for F {
    fn next_lease_id(&mut self) -> LeaseId {
        self()
    }
}

/// An Acquire whose text fields have been validated by the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    pub resource: ResourceName,
    pub request_id: Option<RequestId>,
    pub holder: Holder,
    /// 0 = the default TTL.
    pub ttl_ms: u64,
    /// 0 = try-lock.
    pub wait_ms: u64,
    /// Makes the lease reentrant for this owner (see [`AcquireOutcome::Reentered`]).
    pub owner: Option<Owner>,
    /// 0 = an exclusive lock; N = one of the N permits of the semaphore `resource` (granted
    /// on the permit's own name, see `crate::permits`).
    pub permits: u32,
    /// Set: a side of the read-write lock `resource` (a reader's lease is granted on a
    /// reader's own slot, see `fencing::reader`).
    pub rw: Option<Rw>,
}

/// What an Acquire asks of a read-write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rw {
    /// A reader's lease: shared with other readers, never with the writer.
    Read,
    /// The writer's lease: alone.
    Write,
    /// A reader's lease for the holder of this write lease, which ends in the same decision.
    Downgrade(LeaseId),
}

/// What kind of lease a grant makes, as its record says.
#[derive(Clone, Debug)]
enum Kind {
    /// An exclusive lock, reentrant with an owner.
    Lock(Option<Owner>),
    /// A permit of a semaphore of this many permits.
    Permit(u32),
    Read,
    Write,
}

/// Sizes, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub leases: usize,
    pub waiters: usize,
    pub requests: usize,
}

struct Waiter {
    resource: ResourceName,
    request_id: Option<RequestId>,
    holder: Holder,
    ttl_ms: u64,
    deadline: Millis,
    owner: Option<Owner>,
    /// A reader of a read-write lock (a waiter's queue says which kind it waits for; only a
    /// read-write lock's has two sides).
    reads: bool,
}

/// The lock state machine. See the module documentation.
pub struct Core {
    limits: Limits,
    ids: Box<dyn LeaseIdSource>,
    now: Millis,
    last_token: Option<FencingToken>,
    leases: LeaseTable,
    /// Only resources with waiters have an entry; every entry is non-empty.
    queues: HashMap<ResourceName, VecDeque<WaiterId>>,
    waiters: HashMap<WaiterId, Waiter>,
    waiting_requests: HashMap<RequestId, WaiterId>,
    next_waiter: u64,
    /// Every waiter's deadline, exactly once (removed eagerly when a waiter leaves).
    wait_deadlines: BTreeSet<(Millis, WaiterId)>,
    /// Who owns which resources, if a policy says so; `usage` has one entry per tenant.
    tenancy: Option<Arc<Tenancy>>,
    usage: Vec<Usage>,
    caps: Vec<Caps>,
    /// Semaphores in use (a permit held or waited for), by name.
    semaphores: HashMap<ResourceName, semaphore::Semaphore>,
    /// Read-write locks in use (held or waited for), by name.
    rwlocks: HashMap<ResourceName, rwlock::RwLock>,
    /// Read-write locks whose first waiter is a reader the lock admits, waiting for room for
    /// one more lease (lockd's or the tenant's): served, in name order, when a lease ends.
    rw_room_wait: BTreeSet<ResourceName>,
    /// Leases expire only up to this time, when set ([`Core::limit_expiry`]).
    expiry_limit: Option<Millis>,
}

impl Core {
    /// An empty machine, as for a new data directory. `limits` must have been validated.
    pub fn new(limits: Limits, ids: Box<dyn LeaseIdSource>) -> Core {
        let mut leases = LeaseTable::default();
        leases.track_long_holds = limits.hold_warn_after_ms > 0;
        Core {
            limits,
            ids,
            now: 0,
            last_token: None,
            leases,
            queues: HashMap::new(),
            waiters: HashMap::new(),
            waiting_requests: HashMap::new(),
            next_waiter: 1,
            wait_deadlines: BTreeSet::new(),
            tenancy: None,
            usage: Vec::new(),
            caps: Vec::new(),
            semaphores: HashMap::new(),
            rwlocks: HashMap::new(),
            rw_room_wait: BTreeSet::new(),
            expiry_limit: None,
        }
    }

    /// Lets leases expire only up to `limit` (`None`: up to each call's `now`). An HA leader
    /// holds expiry back at the last moment its clock was checked against etcd's, so that a
    /// clock that jumps ahead expires nothing early; new deadlines are still counted from the
    /// calls' `now`, and waits still time out by it. A lease past its deadline but not yet
    /// expired is held as before (renewed by its holder, refused to others).
    pub fn limit_expiry(&mut self, limit: Option<Millis>) {
        self.expiry_limit = limit;
    }

    /// Rebuilds the machine from persisted state after a restart. Every lease gets its full
    /// TTL from `now` and every request id a full retention: lockd cannot know how long it was
    /// down, so it errs on the side of the old holder, never of granting early.
    pub fn recover(
        limits: Limits,
        ids: Box<dyn LeaseIdSource>,
        snapshot: Snapshot,
        now: Millis,
    ) -> Result<Core, RecoverError> {
        let mut core = Core::new(limits, ids);
        core.now = now;
        core.last_token = snapshot.last_token;
        let mut tokens = HashSet::new();
        let permits: Vec<(ResourceName, u32)> = snapshot
            .leases
            .iter()
            .filter_map(|r| Some((r.resource.clone(), r.permits?)))
            .collect();
        let roles: Vec<(ResourceName, RwRole, LeaseId)> = snapshot
            .leases
            .iter()
            .filter_map(|r| Some((r.resource.clone(), r.rw?, r.lease_id)))
            .collect();
        for rec in snapshot.leases {
            let invalid = |reason: &str| RecoverError::InvalidRecord {
                resource: rec.resource.clone(),
                reason: reason.to_string(),
            };
            if Some(rec.token) > snapshot.last_token {
                return Err(RecoverError::TokenAboveHighWater {
                    resource: rec.resource,
                    token: rec.token,
                    last_token: snapshot.last_token,
                });
            }
            if !tokens.insert(rec.token) {
                return Err(RecoverError::DuplicateToken { token: rec.token });
            }
            if core.leases.held(rec.resource.as_str()).is_some() {
                return Err(RecoverError::DuplicateResource {
                    resource: rec.resource,
                });
            }
            if rec.ttl_ms == 0 || rec.ttl_ms > u64::from(u32::MAX) {
                return Err(invalid("ttl_ms is 0 or above u32::MAX"));
            }
            if rec
                .request_id
                .as_deref()
                .is_some_and(|id| RequestId::from_persisted(id).is_none())
            {
                return Err(invalid("bad request id"));
            }
            let reentry = match &rec.reentrant {
                None => None,
                Some(r) => Some(Box::new(Reentry {
                    owner: Owner::from_persisted(&r.owner).ok_or_else(|| invalid("bad owner"))?,
                    holds: match r.holds {
                        1..=crate::limits::HOLDS_MAX => r.holds,
                        _ => return Err(invalid("holds is 0 or above limits::HOLDS_MAX")),
                    },
                })),
            };
            let lease = NewLease {
                lease_id: rec.lease_id,
                token: rec.token,
                holder: Holder::from_persisted(&rec.holder),
                ttl_ms: rec.ttl_ms,
                expires_at: now.saturating_add(rec.ttl_ms),
                granted_at: now,
                request: None,
                reentry,
            };
            core.leases.insert(&rec.resource, lease, now);
        }
        core.recover_semaphores(&permits)?;
        core.recover_rwlocks(&roles)?;
        for rec in snapshot.requests {
            let id = rec
                .request_id
                .as_deref()
                .and_then(RequestId::from_persisted);
            let Some(id) = id else {
                return Err(RecoverError::InvalidRecord {
                    resource: rec.resource,
                    reason: "remembered request without a valid request id".to_string(),
                });
            };
            if Some(rec.token) > snapshot.last_token {
                return Err(RecoverError::TokenAboveHighWater {
                    resource: rec.resource,
                    token: rec.token,
                    last_token: snapshot.last_token,
                });
            }
            let lease = NewLease {
                lease_id: rec.lease_id,
                token: rec.token,
                holder: Holder::from_persisted(&rec.holder),
                ttl_ms: rec.ttl_ms,
                expires_at: now,
                granted_at: now,
                request: Some(id),
                reentry: None,
            };
            core.leases.restore_request(&rec.resource, lease, now);
        }
        Ok(core)
    }

    /// Puts tenants' quotas in force (or none), counting what each holds and queues now.
    /// Calls already refused or granted stay so; the counts may start above a quota, which
    /// then refuses new leases or waiters until they fall below it.
    pub fn set_tenancy(&mut self, tenancy: Option<Arc<Tenancy>>) {
        let n = tenancy.as_ref().map_or(0, |t| t.tenants().len());
        self.usage = vec![Usage::default(); n];
        self.caps = tenancy.as_ref().map_or(Vec::new(), |t| {
            t.tenants()
                .iter()
                .map(|tenant| Caps::of(&tenant.quota, &self.limits, n))
                .collect()
        });
        self.tenancy = tenancy;
        let Some(t) = self.tenancy.clone() else {
            return;
        };
        for name in self.leases.held_names() {
            if let Some(ix) = t.owner_ix(name) {
                self.usage[ix].leases += 1;
            }
        }
        for name in self.leases.remembered_names() {
            if let Some(ix) = t.owner_ix(name) {
                self.usage[ix].requests += 1;
            }
        }
        for w in self.waiters.values() {
            if let Some(ix) = t.owner_ix(w.resource.as_str()) {
                self.usage[ix].waiters += 1;
            }
        }
    }

    /// Each tenant's name, leases held, waiters queued and request ids remembered (for metrics
    /// and tests).
    pub fn tenant_usage(&self) -> impl Iterator<Item = (&str, usize, usize, usize)> {
        let tenants = self.tenancy.as_ref().map_or(&[][..], |t| t.tenants());
        tenants
            .iter()
            .zip(&self.usage)
            .map(|(t, u)| (t.name.as_str(), u.leases, u.waiters, u.requests))
    }

    /// The `n` resources with the longest queues, longest first (ties by name), for metrics.
    /// Looks at every queue: meant for a scrape every few seconds, not for every call.
    pub fn longest_queues(&self, n: usize) -> Vec<(ResourceName, usize)> {
        let mut all: Vec<(&ResourceName, usize)> =
            self.queues.iter().map(|(r, q)| (r, q.len())).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        all.into_iter()
            .take(n)
            .map(|(r, len)| (r.clone(), len))
            .collect()
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The latest time the machine has been advanced to.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// The highest token issued so far.
    pub fn last_token(&self) -> Option<FencingToken> {
        self.last_token
    }

    pub fn stats(&self) -> Stats {
        Stats {
            leases: self.leases.held_count(),
            waiters: self.waiters.len(),
            requests: self.leases.remembered_count(),
        }
    }

    /// When the driver must call [`Core::tick`] next (the earliest lease expiry or wait
    /// deadline), if anything is pending. Request-id retention is not a deadline: forgetting is
    /// done on the way, by whatever call comes next.
    pub fn next_deadline(&self) -> Option<Millis> {
        let lease = self.leases.next_expiry();
        let wait = self.wait_deadlines.first().map(|&(at, _)| at);
        let long = match self.limits.hold_warn_after_ms {
            0 => None,
            after => self.leases.next_long_hold(after),
        };
        [lease, wait, long].into_iter().flatten().min()
    }

    /// Advances the machine to `now`: expires leases, hands locks to waiters, ends waits.
    pub fn tick(&mut self, now: Millis, fx: &mut Vec<Effect>) {
        self.advance(now, fx);
    }

    /// Asks for the lock of a resource.
    pub fn acquire(
        &mut self,
        now: Millis,
        req: AcquireRequest,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        self.advance(now, fx);
        let ttl_ms = self.limits.ttl(req.ttl_ms)?;
        let wait_ms = self.limits.wait(req.wait_ms)?;
        Core::check_kind_fields(&req)?;
        if let Some(id) = &req.request_id
            && let Some(outcome) = self.duplicate(id, &req)
        {
            return outcome;
        }
        self.check_kind(&req)?;
        if let Some(id) = &req.request_id {
            if let Some(&waiter) = self.waiting_requests.get(id) {
                return self.rejoin(waiter, req, ttl_ms, wait_ms);
            }
        }
        let owner = self.owner(&req.resource);
        self.take_call(owner)?;
        if let Some(reentered) = self.reenter(&req, fx)? {
            return Ok(reentered);
        }
        if let Some(rw) = req.rw {
            return self.acquire_rw(req, rw, (ttl_ms, wait_ms), owner, fx);
        }
        if req.permits > 0 {
            return self.acquire_permit(req, ttl_ms, wait_ms, owner, fx);
        }
        if self.leases.held(req.resource.as_str()).is_some() {
            if wait_ms == 0 {
                return Ok(AcquireOutcome::Busy(
                    self.busy(&req.resource).expect("held"),
                ));
            }
            self.check_quota(owner, Counted::Waiters, 1)?;
            return self.enqueue(req, (ttl_ms, wait_ms), false);
        }
        self.check_grant_room(owner, &req)?;
        let grant = self.grant(
            &req.resource,
            req.request_id,
            req.holder,
            Kind::Lock(req.owner),
            ttl_ms,
            fx,
        )?;
        Ok(AcquireOutcome::Granted(grant))
    }

    /// Extends the lease by its TTL from `now`, if `lease_id` is the current lease.
    pub fn renew(
        &mut self,
        now: Millis,
        resource: &ResourceName,
        lease_id: LeaseId,
        fx: &mut Vec<Effect>,
    ) -> Result<Renewed, RenewError> {
        self.advance(now, fx);
        match self.leases.renew(resource.as_str(), lease_id, self.now) {
            Ok((expires_at, ttl_ms)) => Ok(Renewed { expires_at, ttl_ms }),
            Err(_) if let Some(slot) = self.reader_slot(resource, lease_id) => {
                Err(RenewError::Readers {
                    resource: resource.clone(),
                    slot,
                })
            }
            Err(current) => Err(match self.semaphores.get(resource) {
                Some(sem) => RenewError::Semaphore {
                    resource: resource.clone(),
                    permits: sem.permits,
                },
                None => RenewError::NotCurrent {
                    resource: resource.clone(),
                    current,
                },
            }),
        }
    }

    /// Ends the lease if `lease_id` is current, and hands the lock to the next waiter.
    pub fn release(
        &mut self,
        now: Millis,
        resource: &ResourceName,
        lease_id: LeaseId,
        fx: &mut Vec<Effect>,
    ) -> ReleaseOutcome {
        self.advance(now, fx);
        match self.leases.held(resource.as_str()) {
            Some(lease) if lease.lease_id == lease_id => {}
            other => {
                return ReleaseOutcome::NotHeld {
                    current: other.map(|l| l.token),
                    semaphore: self.semaphores.get(resource).map(|s| s.permits),
                    reader_slot: self.reader_slot(resource, lease_id),
                };
            }
        }
        if let Some(r) = self.leases.reentry_mut(resource.as_str())
            && r.holds > 1
        {
            r.holds -= 1;
            let holds = r.holds;
            fx.push(Effect::Persist(Op::Unhold {
                resource: resource.clone(),
                lease_id,
                holds,
            }));
            let token = self.leases.held(resource.as_str()).expect("held").token;
            return ReleaseOutcome::Unheld { token, holds };
        }
        let ended = self.leases.end(resource.as_str());
        self.count(resource.as_str(), Counted::Leases, -1);
        fx.push(Effect::Persist(Op::Remove {
            resource: resource.clone(),
            lease_id: ended.lease_id,
        }));
        self.lease_ended(resource, fx);
        ReleaseOutcome::Released {
            token: ended.token,
            held_ms: self.now.saturating_sub(ended.granted_at),
        }
    }

    /// Takes a waiter out of its queue (its client cancelled or disconnected). Returns `false`
    /// when it was no longer waiting: already granted, timed out, or unknown.
    pub fn cancel(&mut self, now: Millis, waiter: WaiterId, fx: &mut Vec<Effect>) -> bool {
        self.advance(now, fx);
        match self.waiters.remove(&waiter) {
            None => false,
            Some(w) => {
                self.forget_waiter(waiter, &w);
                self.rw_waiter_left(&w.resource, fx);
                true
            }
        }
    }

    /// Reports who holds a resource and how many wait for it.
    pub fn describe(
        &mut self,
        now: Millis,
        resource: &ResourceName,
        fx: &mut Vec<Effect>,
    ) -> Description {
        self.advance(now, fx);
        Description {
            held: self.leases.held(resource.as_str()).map(|l| HeldBy {
                holder: l.holder.clone(),
                token: l.token,
                expires_at: l.expires_at,
                ttl_ms: l.ttl_ms(),
                holds: l.reentry.as_ref().map_or(1, |r| r.holds),
            }),
            // A permit's waiters are its semaphore's, a reader's its lock's.
            waiters: self
                .queues
                .get(fencing::owner_name(resource.as_str()))
                .map_or(0, VecDeque::len),
            permits: self.semaphore_use(resource),
            readers: self.rw_readers(resource),
        }
    }

    /// Up to `limit` held locks from the place `from` (0: the start; a page's `next` after
    /// that) on, of those `keep` accepts, looking at `budget` places at most, so that one page
    /// holds the machine only briefly (it may then have fewer than `limit`, and a `next`). A
    /// lock held all through a listing appears in it exactly once; one granted meanwhile may
    /// or may not.
    pub fn list(
        &mut self,
        now: Millis,
        from: u32,
        limit: usize,
        budget: usize,
        keep: impl Fn(&str) -> bool,
        fx: &mut Vec<Effect>,
    ) -> Page {
        self.advance(now, fx);
        let mut locks = Vec::new();
        let mut at = from;
        loop {
            let (held, next) = self.leases.held_from(at, budget.clamp(1, 4096));
            for (slot, lease) in held {
                if !keep(lease.name_str()) {
                    continue;
                }
                if locks.len() == limit {
                    return Page {
                        locks,
                        next: Some(slot),
                    };
                }
                let resource = lease.name();
                // A permit's waiters are its semaphore's, a reader's its lock's.
                let queue = fencing::owner_name(resource.as_str());
                let waiters = self.queues.get(queue).map_or(0, VecDeque::len);
                locks.push(Listed {
                    resource,
                    holder: lease.holder.clone(),
                    token: lease.token,
                    expires_at: lease.expires_at,
                    ttl_ms: lease.ttl_ms(),
                    granted_at: lease.granted_at,
                    waiters,
                });
            }
            match next {
                Some(n) if (n - from) as usize >= budget => {
                    return Page {
                        locks,
                        next: Some(n),
                    };
                }
                Some(n) => at = n,
                None => return Page { locks, next: None },
            }
        }
    }

    // ---- internals -------------------------------------------------------------------------

    fn advance(&mut self, now: Millis, fx: &mut Vec<Effect>) {
        self.now = self.now.max(now);
        loop {
            // The earliest of the next expiry and the next wait deadline; at equal times the
            // expiry first (see the module docs).
            let until = self.expiry_limit.map_or(self.now, |l| l.min(self.now));
            let expiry = self.leases.next_expiry().filter(|&at| at <= until);
            let wait = self
                .wait_deadlines
                .first()
                .copied()
                .filter(|&(at, _)| at <= self.now);
            match (expiry, wait) {
                (Some(e), Some((w, _))) if e <= w => self.expire_next(fx),
                (Some(_), None) => self.expire_next(fx),
                (_, Some((_, waiter))) => self.time_out(waiter, fx),
                (None, None) => break,
            }
        }
        let now = self.now;
        let after = self.limits.hold_warn_after_ms;
        while after > 0
            && let Some(lease) = self.leases.take_long_hold(now, after)
        {
            fx.push(Effect::HeldLong {
                resource: lease.name(),
                lease_id: lease.lease_id,
                token: lease.token,
                holder: lease.holder.clone(),
                held_ms: now.saturating_sub(lease.granted_at),
            });
        }
        let mut forgotten = Vec::new();
        let counting = self.tenancy.is_some();
        self.leases
            .forget_requests(now, self.limits.request_retention_ms, |name, id| {
                fx.push(Effect::Persist(Op::ForgetRequest {
                    request_id: id.as_str().to_string(),
                }));
                if counting {
                    forgotten.push(compact_str::CompactString::new(name));
                }
            });
        for name in forgotten {
            self.count(&name, Counted::Requests, -1);
        }
    }

    fn expire_next(&mut self, fx: &mut Vec<Effect>) {
        let until = self.expiry_limit.map_or(self.now, |l| l.min(self.now));
        let (resource, ended) = self.leases.expire_next(until).expect("an expiry is due");
        self.count(resource.as_str(), Counted::Leases, -1);
        fx.push(Effect::Persist(Op::Remove {
            resource: resource.clone(),
            lease_id: ended.lease_id,
        }));
        fx.push(Effect::Expired {
            resource: resource.clone(),
            lease_id: ended.lease_id,
            token: ended.token,
            holder: ended.holder,
            held_ms: ended.expires_at.saturating_sub(ended.granted_at),
        });
        self.lease_ended(&resource, fx);
    }

    fn time_out(&mut self, waiter: WaiterId, fx: &mut Vec<Effect>) {
        let w = self
            .waiters
            .remove(&waiter)
            .expect("a wait deadline always names a waiter");
        self.forget_waiter(waiter, &w);
        let busy = self.busy(&w.resource);
        debug_assert!(busy.is_some(), "waiters wait only on held resources");
        fx.push(Effect::WaitTimedOut { waiter, busy });
        self.rw_waiter_left(&w.resource, fx);
    }

    /// Grants `grant_on` (free now) to the head of `queue`'s waiters, if any: the lock they
    /// wait for, or a permit of the semaphore they wait for (`permits` > 0).
    fn hand_off(
        &mut self,
        queue: &ResourceName,
        grant_on: &ResourceName,
        permits: u32,
        fx: &mut Vec<Effect>,
    ) {
        let resource = queue;
        let Some(queue) = self.queues.get_mut(resource) else {
            return;
        };
        let waiter = queue.pop_front().expect("queues in the map are non-empty");
        let w = self
            .waiters
            .remove(&waiter)
            .expect("queued waiters are known");
        self.forget_waiter(waiter, &w);
        let kind = match permits {
            0 => Kind::Lock(w.owner),
            n => Kind::Permit(n),
        };
        match self.grant(grant_on, w.request_id, w.holder, kind, w.ttl_ms, fx) {
            Ok(grant) => fx.push(Effect::Granted { waiter, grant }),
            Err(_) => self.end_all_waits(waiter, resource, fx),
        }
    }

    /// A grant to `waiter`, taken out of `queue`, failed: only token exhaustion can fail a
    /// grant, so nobody can be granted any more, and every waiter of the queue ends its wait
    /// now rather than wait in vain.
    fn end_all_waits(&mut self, waiter: WaiterId, queue: &ResourceName, fx: &mut Vec<Effect>) {
        fx.push(Effect::WaitTimedOut { waiter, busy: None });
        for other in self.queues.get(queue).cloned().unwrap_or_default() {
            let w = self
                .waiters
                .remove(&other)
                .expect("queued waiters are known");
            self.forget_waiter(other, &w);
            fx.push(Effect::WaitTimedOut {
                waiter: other,
                busy: None,
            });
        }
    }

    /// Makes a new lease on a free resource: the only place tokens are issued.
    fn grant(
        &mut self,
        resource: &ResourceName,
        request_id: Option<RequestId>,
        holder: Holder,
        kind: Kind,
        ttl_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<Grant, AcquireError> {
        let (owner, permits, rw) = match kind {
            Kind::Lock(owner) => (owner, 0, None),
            Kind::Permit(n) => (None, n, None),
            Kind::Read => (None, 0, Some(RwRole::Read)),
            Kind::Write => (None, 0, Some(RwRole::Write)),
        };
        let token = match self.last_token {
            None => FencingToken::MIN,
            Some(last) => last.next().ok_or(AcquireError::TokensExhausted)?,
        };
        self.last_token = Some(token);
        let lease_id = self.ids.next_lease_id();
        let expires_at = self.now.saturating_add(ttl_ms);
        let remembered = request_id.is_some();
        fx.push(Effect::Persist(Op::Grant(LeaseRecord {
            resource: resource.clone(),
            lease_id,
            token,
            holder: holder.as_str().to_string(),
            ttl_ms,
            request_id: request_id.as_ref().map(|id| id.as_str().to_string()),
            reentrant: owner.as_ref().map(|o| Reentrant {
                owner: o.as_str().to_string(),
                holds: 1,
            }),
            permits: (permits > 0).then_some(permits),
            rw,
        })));
        // Invariant 1 (single holder): the table asserts the resource is free. A breach is a
        // bug: stop rather than hand out a second lock.
        let lease = NewLease {
            lease_id,
            token,
            holder,
            ttl_ms,
            expires_at,
            granted_at: self.now,
            request: request_id,
            reentry: owner.map(|owner| Box::new(Reentry { owner, holds: 1 })),
        };
        self.leases.insert(resource, lease, self.now);
        if permits > 0 {
            self.permit_granted(resource);
        }
        self.count(resource.as_str(), Counted::Leases, 1);
        if remembered {
            self.count(resource.as_str(), Counted::Requests, 1);
        }
        Ok(Grant {
            resource: resource.clone(),
            lease_id,
            token,
            ttl_ms,
            expires_at,
            holds: 1,
        })
    }

    /// A re-entry: `req` names the owner of the resource's current, reentrant lease. `None`
    /// when it does not (the lock is free, not reentrant, or another owner's). A retried
    /// re-entry does not come here: its request id is remembered, and answered as a duplicate.
    fn reenter(
        &mut self,
        req: &AcquireRequest,
        fx: &mut Vec<Effect>,
    ) -> Result<Option<AcquireOutcome>, AcquireError> {
        let (Some(owner), name) = (&req.owner, req.resource.as_str()) else {
            return Ok(None);
        };
        match self.leases.held(name).and_then(|l| l.reentry.as_deref()) {
            Some(r) if r.owner == *owner => {
                if r.holds >= crate::limits::HOLDS_MAX {
                    return Err(AcquireError::Invalid(InvalidArgument::HoldsExceeded {
                        resource: req.resource.clone(),
                        max: crate::limits::HOLDS_MAX,
                    }));
                }
            }
            _ => return Ok(None),
        }
        self.check_request_room(req)?;
        let r = self
            .leases
            .reentry_mut(name)
            .expect("checked: a reentrant lease");
        r.holds += 1;
        let holds = r.holds;
        let (lease_id, token) = {
            let l = self
                .leases
                .held(name)
                .expect("a lease with a reentry is held");
            (l.lease_id, l.token)
        };
        let (expires_at, ttl_ms) = self
            .leases
            .renew(name, lease_id, self.now)
            .expect("the current lease renews");
        if let Some(id) = &req.request_id {
            self.leases.remember_reentry(name, id, self.now);
            self.count(name, Counted::Requests, 1);
        }
        fx.push(Effect::Persist(Op::Reenter {
            resource: req.resource.clone(),
            lease_id,
            holds,
            request_id: req.request_id.as_ref().map(|id| id.as_str().to_string()),
        }));
        let grant = Grant {
            resource: req.resource.clone(),
            lease_id,
            token,
            ttl_ms,
            expires_at,
            holds,
        };
        Ok(Some(AcquireOutcome::Reentered(grant)))
    }

    /// The original answer to a retried request id, if it is remembered: a grant's or a
    /// re-entry's, with the lease as it is now if it is still held.
    fn duplicate(
        &self,
        id: &RequestId,
        req: &AcquireRequest,
    ) -> Option<Result<AcquireOutcome, AcquireError>> {
        let resource = &req.resource;
        let rem = self.leases.remembered(id)?;
        if let Some(reused) = self.names_a_set(id) {
            return Some(Err(reused));
        }
        let original = rem.name();
        // A permit's grant answers a retry for its semaphore, a reader's one for its lock
        // (read, or a downgrade), a lock's or a writer's one for its name.
        let reads = matches!(req.rw, Some(Rw::Read | Rw::Downgrade(_)));
        let asked = match (
            crate::permits::permit_of(original.as_str()),
            fencing::reader::reader_of(original.as_str()),
        ) {
            (Some((semaphore, _)), _) => req.permits > 0 && semaphore == resource.as_str(),
            (None, Some((lock, _))) => reads && lock == resource.as_str(),
            (None, None) => req.permits == 0 && !reads && original == *resource,
        };
        if !asked {
            return Some(Err(AcquireError::RequestIdReused {
                request_id: id.as_str().to_string(),
                original,
                requested: resource.clone(),
            }));
        }
        let current = self.leases.current(rem);
        // A grant on the name itself, still held, says which kind it is: a writer's when the
        // name is a read-write lock in use, else a lock's.
        let writer = self.rwlocks.get(&original).is_some_and(|rw| rw.writer);
        if current.is_some() && !reads && writer != req.rw.is_some() {
            let kind = |writer| match writer {
                true => "a read-write lock's writer",
                false => "an exclusive lock",
            };
            return Some(Err(AcquireError::RequestIdUsedAs {
                request_id: id.as_str().to_string(),
                resource: original,
                used_as: kind(writer).to_string(),
                asked_as: kind(!writer).to_string(),
            }));
        }
        let grant = Grant {
            resource: original,
            lease_id: rem.lease_id,
            token: rem.token,
            ttl_ms: rem.ttl_ms(),
            expires_at: current.map_or(self.now, |l| l.expires_at),
            holds: current
                .and_then(|l| l.reentry.as_ref())
                .map_or(1, |r| r.holds),
        };
        Some(Ok(AcquireOutcome::Duplicate {
            grant,
            held: current.is_some(),
        }))
    }

    /// Room for one more lease (lockd's and the owner's) and, with a request id, for
    /// remembering it.
    fn check_grant_room(
        &self,
        owner: Option<crate::tenants::TenantIx>,
        req: &AcquireRequest,
    ) -> Result<(), AcquireError> {
        if self.leases.held_count() >= self.limits.leases_max {
            return Err(AcquireError::LeasesExhausted {
                max: self.limits.leases_max,
            });
        }
        self.check_quota(owner, Counted::Leases, 1)?;
        self.check_request_room(req)
    }

    fn busy(&self, resource: &ResourceName) -> Option<Busy> {
        if self.semaphores.contains_key(resource) {
            return self.semaphore_busy(resource);
        }
        if self.rwlocks.contains_key(resource) {
            return self.rw_busy(resource);
        }
        let lease = self.leases.held(resource.as_str())?;
        Some(Busy {
            holder: lease.holder.clone(),
            token: lease.token,
            expires_at: lease.expires_at,
            waiters: self.queues.get(resource).map_or(0, VecDeque::len),
        })
    }
}
