//! Semaphores: N permits per resource, each permit its own lease and token on its own name
//! (`crate::permits`), so that a store fences each permit as it fences a lock.
//!
//! - A semaphore exists while a permit is held or waited for. Its number of permits is fixed
//!   by the Acquire that found it unused, written in every permit's grant, and rebuilt by
//!   recovery; an Acquire asking for another number is refused (`PermitsMismatch`).
//! - An Acquire gets the lowest free permit. When every permit is held it is busy (try-lock)
//!   or waits in the semaphore's FIFO queue. A permit that ends goes to the head of the queue
//!   at once, as a lock does, so nobody waits while a permit is free.
//! - A name is one kind at a time: an exclusive lock and a semaphore never share one
//!   (`KindMismatch`). Permits are not reentrant.
//! - `held` counts the permits' names that hold a lease, however it was granted (a lease on
//!   such a name from before semaphores existed included), so a semaphore is full exactly
//!   when none of its permits is free.

use std::collections::VecDeque;

use fencing::ResourceName;

use super::{AcquireRequest, Core, Counted};
use crate::error::{AcquireError, InvalidArgument, RecoverError};
use crate::leases::Slot;
use crate::outcome::{AcquireOutcome, Busy, Effect, SemaphoreUse};
use crate::permits;
use crate::tenants::TenantIx;

/// A semaphore in use.
#[derive(Clone, Copy, Debug)]
pub(super) struct Semaphore {
    pub permits: u32,
    /// Permits (1 ..= `permits`) that hold a lease.
    pub held: u32,
}

/// The kind of lock a name is in use as, or an Acquire asks for. Compared as is; put in
/// words only for an error, so that an Acquire's kind check allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LockKind {
    Exclusive,
    Semaphore(u32),
    ReadWrite,
}

impl LockKind {
    /// The kind `req` asks for.
    pub(super) fn asked(req: &AcquireRequest) -> LockKind {
        match (req.rw, req.permits) {
            (Some(_), _) => LockKind::ReadWrite,
            (None, 0) => LockKind::Exclusive,
            (None, n) => LockKind::Semaphore(n),
        }
    }
}

impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockKind::Exclusive => f.write_str("an exclusive lock"),
            LockKind::Semaphore(n) => write!(f, "a semaphore of {n} permits"),
            LockKind::ReadWrite => f.write_str("a read-write lock"),
        }
    }
}

/// The error for a name lockd reserves for the slots it hands out, if `resource` is one.
pub(super) fn reserved(resource: &ResourceName) -> Option<InvalidArgument> {
    let resource = resource.clone();
    if permits::parse(resource.as_str()).is_some() {
        Some(InvalidArgument::ReservedName { resource })
    } else if fencing::reader::is_reserved(resource.as_str()) {
        Some(InvalidArgument::ReservedReaderName { resource })
    } else {
        None
    }
}

impl Core {
    /// The checks of an Acquire's kind that need no state.
    pub(super) fn check_kind_fields(req: &AcquireRequest) -> Result<(), InvalidArgument> {
        if let Some(reserved) = reserved(&req.resource) {
            return Err(reserved);
        }
        if let Some(rw) = req.rw {
            return Core::check_rw_fields(req, rw);
        }
        if req.permits == 0 {
            return Ok(());
        }
        if req.owner.is_some() {
            return Err(InvalidArgument::PermitsWithOwner);
        }
        permits::check(&req.resource, req.permits)
    }

    /// What kind of lock a name is in use as; `None` when it is not in use.
    pub(super) fn held_as(&self, resource: &ResourceName) -> Option<LockKind> {
        if let Some(sem) = self.semaphores.get(resource) {
            Some(LockKind::Semaphore(sem.permits))
        } else if self.rwlocks.contains_key(resource) {
            Some(LockKind::ReadWrite)
        } else {
            self.leases
                .held(resource.as_str())
                .map(|_| LockKind::Exclusive)
        }
    }

    /// Whether the resource is in use as the kind of lock `req` asks for (or not in use).
    pub(super) fn check_kind(&self, req: &AcquireRequest) -> Result<(), AcquireError> {
        if let Some(sem) = self.semaphores.get(&req.resource)
            && req.permits > 0
            && req.rw.is_none()
            && sem.permits != req.permits
        {
            return Err(AcquireError::PermitsMismatch {
                resource: req.resource.clone(),
                permits: sem.permits,
                asked: req.permits,
            });
        }
        let asked_as = LockKind::asked(req);
        match self.held_as(&req.resource) {
            Some(held_as) if held_as != asked_as => Err(AcquireError::KindMismatch {
                resource: req.resource.clone(),
                held_as: held_as.to_string(),
                asked_as: asked_as.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// An Acquire of a permit (`req.permits > 0`, kind checked, no duplicate or waiter).
    pub(super) fn acquire_permit(
        &mut self,
        req: AcquireRequest,
        ttl_ms: u64,
        wait_ms: u64,
        owner: Option<TenantIx>,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        let semaphore = req.resource.clone();
        if !self.semaphores.contains_key(&semaphore) {
            let held = self.held_permits(&semaphore, req.permits);
            let sem = Semaphore {
                permits: req.permits,
                held,
            };
            self.semaphores.insert(semaphore.clone(), sem);
        }
        let outcome = self.take_permit(req, ttl_ms, wait_ms, owner, fx);
        // Whatever the outcome, a semaphore nobody holds or waits for is not kept.
        self.drop_unused(&semaphore);
        outcome
    }

    fn take_permit(
        &mut self,
        req: AcquireRequest,
        ttl_ms: u64,
        wait_ms: u64,
        owner: Option<TenantIx>,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        let sem = self.semaphores[&req.resource];
        if sem.held >= sem.permits {
            if wait_ms == 0 {
                let busy = self.semaphore_busy(&req.resource);
                return Ok(AcquireOutcome::Busy(busy.expect("a full semaphore")));
            }
            self.check_quota(owner, Counted::Waiters, 1)?;
            return self.enqueue(req, (ttl_ms, wait_ms), false);
        }
        self.check_grant_room(owner, &req)?;
        let mut free = None;
        self.visit_permits(&req.resource, sem.permits, |k, lease| {
            if lease.is_none() {
                free = Some(k);
            }
            free.is_none()
        });
        let free = free.expect("a semaphore that is not full has a free permit");
        let permit = permits::name(&req.resource, free);
        let grant = self.grant(
            &permit,
            req.request_id,
            req.holder,
            super::Kind::Permit(req.permits),
            ttl_ms,
            fx,
        )?;
        Ok(AcquireOutcome::Granted(grant))
    }

    /// How many of the first `permits` permits of `semaphore` hold a lease.
    fn held_permits(&self, semaphore: &ResourceName, permits: u32) -> u32 {
        let mut held = 0;
        self.visit_permits(semaphore, permits, |_, lease| {
            held += u32::from(lease.is_some());
            true
        });
        held
    }

    /// Calls `visit` with each permit 1 ..= `permits` of `semaphore` and its lease, if held,
    /// until it returns `false`. The names are spelled in one buffer: a look at each permit
    /// costs a hash lookup, no allocation (it runs under the core's lock, up to
    /// `PERMITS_MAX` times a call).
    fn visit_permits<'a>(
        &'a self,
        semaphore: &ResourceName,
        permits: u32,
        mut visit: impl FnMut(u32, Option<&'a Slot>) -> bool,
    ) {
        use std::fmt::Write;
        let mut name = String::with_capacity(semaphore.as_str().len() + permits::MARK.len() + 4);
        name.push_str(semaphore.as_str());
        name.push_str(permits::MARK);
        let base = name.len();
        for k in 1..=permits {
            name.truncate(base);
            write!(name, "{k}").expect("writing to a String");
            if !visit(k, self.leases.held(&name)) {
                return;
            }
        }
    }

    /// A permit was granted on `resource` (a permit's name).
    pub(super) fn permit_granted(&mut self, resource: &ResourceName) {
        let (semaphore, _) = permits::permit_of(resource.as_str()).expect("a permit's name");
        let sem = self
            .semaphores
            .get_mut(semaphore)
            .expect("a permit is granted by its semaphore");
        sem.held += 1;
    }

    /// A lease ended (released or expired): the next waiter gets it, a permit's semaphore's
    /// next waiter gets the permit, a read-write lock's head waiters get what it admits.
    pub(super) fn lease_ended(&mut self, resource: &ResourceName, fx: &mut Vec<Effect>) {
        self.lease_ended_here(resource, fx);
        if !self.rw_room_wait.is_empty() {
            self.serve_room_waiters(fx);
        }
    }

    fn lease_ended_here(&mut self, resource: &ResourceName, fx: &mut Vec<Effect>) {
        if self.rw_lease_ended(resource, fx) {
            return;
        }
        let semaphore = permits::permit_of(resource.as_str()).and_then(|(s, k)| {
            let (name, sem) = self.semaphores.get_key_value(s)?;
            (k <= sem.permits).then(|| (name.clone(), sem.permits))
        });
        let Some((semaphore, n)) = semaphore else {
            return self.hand_off(resource, resource, 0, fx);
        };
        self.semaphores
            .get_mut(&semaphore)
            .expect("found above")
            .held -= 1;
        self.hand_off(&semaphore, resource, n, fx);
        self.drop_unused(&semaphore);
    }

    /// Forgets the semaphore if no permit is held and nobody waits.
    fn drop_unused(&mut self, semaphore: &ResourceName) {
        if self.semaphores.get(semaphore).is_some_and(|s| s.held == 0)
            && !self.queues.contains_key(semaphore)
        {
            self.semaphores.remove(semaphore);
        }
    }

    /// Who holds a full semaphore's permits, as a busy answer: the permit that ends first,
    /// and the semaphore's waiters. `None` when the name is not a semaphore in use.
    pub(super) fn semaphore_busy(&self, semaphore: &ResourceName) -> Option<Busy> {
        let sem = self.semaphores.get(semaphore)?;
        let mut first: Option<&Slot> = None;
        self.visit_permits(semaphore, sem.permits, |_, lease| {
            if let Some(l) = lease
                && first.is_none_or(|f| (l.expires_at, l.token) < (f.expires_at, f.token))
            {
                first = Some(l);
            }
            true
        });
        let first = first?;
        Some(Busy {
            holder: first.holder.clone(),
            token: first.token,
            expires_at: first.expires_at,
            waiters: self.queues.get(semaphore).map_or(0, VecDeque::len),
        })
    }

    /// The permits and held permits of a semaphore in use.
    pub(super) fn semaphore_use(&self, semaphore: &ResourceName) -> Option<SemaphoreUse> {
        self.semaphores.get(semaphore).map(|s| SemaphoreUse {
            permits: s.permits,
            held: s.held,
        })
    }

    /// Rebuilds the semaphores of the recovered leases that are permits: each permit's name,
    /// with its semaphore's number of permits as stored.
    pub(super) fn recover_semaphores(
        &mut self,
        permit_leases: &[(ResourceName, u32)],
    ) -> Result<(), RecoverError> {
        for (resource, n) in permit_leases {
            let n = *n;
            let invalid = |reason: String| RecoverError::InvalidRecord {
                resource: resource.clone(),
                reason,
            };
            let semaphore = match permits::permit_of(resource.as_str()) {
                Some((s, k)) if (1..=n).contains(&k) => {
                    ResourceName::new(s).map_err(|e| invalid(e.to_string()))?
                }
                _ => return Err(invalid(format!("not the name of one of {n} permits"))),
            };
            permits::check(&semaphore, n).map_err(|e| invalid(e.to_string()))?;
            let sem = self.semaphores.entry(semaphore).or_insert(Semaphore {
                permits: n,
                held: 0,
            });
            if sem.permits != n {
                return Err(invalid(format!(
                    "a permit of {n}, where another permit says {}",
                    sem.permits
                )));
            }
        }
        let names: Vec<ResourceName> = self.semaphores.keys().cloned().collect();
        for semaphore in names {
            if self.leases.held(semaphore.as_str()).is_some() {
                return Err(RecoverError::InvalidRecord {
                    resource: semaphore,
                    reason: "held as an exclusive lock and as a semaphore".to_string(),
                });
            }
            let n = self.semaphores[&semaphore].permits;
            let held = self.held_permits(&semaphore, n);
            self.semaphores.get_mut(&semaphore).expect("listed").held = held;
        }
        Ok(())
    }
}
