//! Read-write locks: one writer or many readers, never both.
//!
//! - The writer's lease is on the lock's own name; each reader's is a lease of its own, with
//!   its own token, on a reader's slot (`fencing::reader`: `NAME@read-K`, the lowest slot
//!   freed first, else the next). Every grant, a reader's too, takes a new token from the one
//!   counter, so a reader's token lies between the write grants before and after it.
//! - One FIFO queue of readers and writers. A grant is made only to the head of the queue, or
//!   to an Acquire that finds the queue empty: so a waiting writer is never overtaken by
//!   readers that come after it (writer preference), and a waiting reader never by a writer.
//!   When the lock frees, the head is granted, and so is every reader right behind it; so too
//!   when a writer at the head leaves the queue and readers behind it are admitted. The head
//!   of a queue is always one the lock does not admit.
//! - Downgrade: the writer trades its write lease for a read lease in one decision, so no
//!   writer can come in between; the readers at the head of the queue then join it. There is
//!   no upgrade: two readers that both wait to upgrade would each wait for the other to
//!   leave, and a reader that releases and asks to write has let others in between, which is
//!   what it must know (a new write grant is a new token, so the fence tells it).
//! - A name is one kind at a time. Read-write leases are not reentrant.
//! - At most `limits::READERS_MAX` readers at once; more are busy, or wait.
//! - A hand-off grants the first waiter in the room the ended lease left; every further
//!   reader it grants needs room for one more lease (lockd's `leases_max`, the tenant's quota),
//!   as an Acquire does. Readers that the lock admits but that find no room keep their place;
//!   whenever any lease ends, such locks are served again, in name order.
//! - A lock exists while it has a writer, a reader, or a waiter.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use fencing::{LeaseId, ResourceName};

use super::{AcquireRequest, Core, Counted, Kind, Rw};
use crate::error::{AcquireError, InvalidArgument, RecoverError};
use crate::limits::READERS_MAX;
use crate::outcome::{AcquireOutcome, Busy, Effect};
use crate::persist::{Op, RwRole};
use crate::tenants::TenantIx;

/// A read-write lock in use.
#[derive(Clone, Debug, Default)]
pub(super) struct RwLock {
    /// Its writer holds the lease on the lock's name.
    pub writer: bool,
    /// Reader slots that hold a lease, with its lease id.
    pub readers: BTreeMap<u32, LeaseId>,
    /// The slot of each reader's lease id (to tell a reader's mistake from a stale writer).
    reader_slots: HashMap<LeaseId, u32>,
    /// Slots below `high` that are free, lowest first.
    free: BTreeSet<u32>,
    /// The highest slot used since the lock was last unused.
    high: u32,
}

impl RwLock {
    /// Whether a reader (`reads`) or the writer could be granted now, queue aside.
    fn admits(&self, reads: bool) -> bool {
        !self.writer
            && if reads {
                (self.readers.len() as u64) < u64::from(READERS_MAX)
            } else {
                self.readers.is_empty()
            }
    }
}

impl Core {
    /// The checks of a read-write Acquire that need no state.
    pub(super) fn check_rw_fields(req: &AcquireRequest, rw: Rw) -> Result<(), InvalidArgument> {
        let mode = match rw {
            Rw::Write => "write",
            Rw::Read | Rw::Downgrade(_) => "read",
        };
        if req.permits > 0 {
            return Err(InvalidArgument::ModeWith {
                mode,
                other: "permits",
            });
        }
        if req.owner.is_some() {
            return Err(InvalidArgument::ModeWith {
                mode,
                other: "owner",
            });
        }
        let room = fencing::reader::MARK.len() + READERS_MAX.to_string().len();
        let max = fencing::RESOURCE_NAME_LEN_MAX - room;
        if req.resource.as_str().len() > max {
            return Err(InvalidArgument::RwNameTooLong {
                resource: req.resource.clone(),
                max,
            });
        }
        Ok(())
    }

    /// An Acquire of a read-write lock (kind checked, no duplicate or waiter).
    pub(super) fn acquire_rw(
        &mut self,
        req: AcquireRequest,
        rw: Rw,
        (ttl_ms, wait_ms): (u64, u64),
        owner: Option<TenantIx>,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        let lock = req.resource.clone();
        self.rwlocks.entry(lock.clone()).or_default();
        let outcome = match rw {
            Rw::Downgrade(lease_id) => self.downgrade(req, lease_id, ttl_ms, fx),
            Rw::Read | Rw::Write => self.take_rw(req, rw == Rw::Read, ttl_ms, wait_ms, owner, fx),
        };
        // Whatever the outcome, a lock nobody holds or waits for is not kept.
        self.drop_unused_rw(&lock);
        outcome
    }

    fn take_rw(
        &mut self,
        req: AcquireRequest,
        reads: bool,
        ttl_ms: u64,
        wait_ms: u64,
        owner: Option<TenantIx>,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        let queued = self.queues.contains_key(&req.resource);
        if queued || !self.rwlocks[&req.resource].admits(reads) {
            if wait_ms == 0 {
                let busy = self.rw_busy(&req.resource);
                return Ok(AcquireOutcome::Busy(
                    busy.expect("a lock that admits nobody is held"),
                ));
            }
            self.check_quota(owner, Counted::Waiters, 1)?;
            return self.enqueue(req, (ttl_ms, wait_ms), reads);
        }
        self.check_grant_room(owner, &req)?;
        let grant = self.grant_rw(&req.resource, reads, req.request_id, req.holder, ttl_ms, fx)?;
        Ok(AcquireOutcome::Granted(grant))
    }

    /// The writer trades its lease for a reader's: the write lease ends and a read lease is
    /// granted in the same decision (the store applies both in order, the grant durable
    /// before it is answered), then the readers at the head of the queue join.
    fn downgrade(
        &mut self,
        req: AcquireRequest,
        lease_id: LeaseId,
        ttl_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        let lock = req.resource.clone();
        let writer = self.leases.held(lock.as_str());
        if !self.rwlocks[&lock].writer || writer.is_none_or(|l| l.lease_id != lease_id) {
            return Err(AcquireError::NotWriter {
                resource: lock,
                current: writer
                    .filter(|_| self.rwlocks[&req.resource].writer)
                    .map(|l| l.token),
            });
        }
        // One lease ends and one is granted: only a request id needs room, and the reader's
        // token must exist before the writer's lease is ended.
        self.check_request_room(&req)?;
        if self.last_token.is_some_and(|t| t.next().is_none()) {
            return Err(AcquireError::TokensExhausted);
        }
        let ended = self.leases.end(lock.as_str());
        self.count(lock.as_str(), Counted::Leases, -1);
        fx.push(Effect::Persist(Op::Remove {
            resource: lock.clone(),
            lease_id: ended.lease_id,
        }));
        self.rwlocks.get_mut(&lock).expect("in use").writer = false;
        let grant = self.grant_rw(&lock, true, req.request_id, req.holder, ttl_ms, fx)?;
        self.rw_hand_off(&lock, 0, fx);
        Ok(AcquireOutcome::Granted(grant))
    }

    /// Grants the writer's lease, or a reader's on the lowest free slot, of a lock that
    /// admits it.
    fn grant_rw(
        &mut self,
        lock: &ResourceName,
        reads: bool,
        request_id: Option<crate::types::RequestId>,
        holder: crate::types::Holder,
        ttl_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<crate::outcome::Grant, AcquireError> {
        if !reads {
            let grant = self.grant(lock, request_id, holder, Kind::Write, ttl_ms, fx)?;
            self.rwlocks.get_mut(lock).expect("in use").writer = true;
            return Ok(grant);
        }
        let slot = self.free_slot(lock);
        let name = fencing::reader::name(lock, slot).expect("checked: room for every slot");
        let grant = self.grant(&name, request_id, holder, Kind::Read, ttl_ms, fx)?;
        let rw = self.rwlocks.get_mut(lock).expect("in use");
        rw.free.remove(&slot);
        rw.high = rw.high.max(slot);
        rw.readers.insert(slot, grant.lease_id);
        rw.reader_slots.insert(grant.lease_id, slot);
        Ok(grant)
    }

    /// The lowest slot nobody holds: a freed one, else the next (past any held by a lease
    /// from before read-write locks, whose names were not reserved then).
    fn free_slot(&self, lock: &ResourceName) -> u32 {
        let rw = &self.rwlocks[lock];
        if let Some(&k) = rw.free.first() {
            return k;
        }
        let mut k = rw.high + 1;
        while fencing::reader::name(lock, k).is_some_and(|n| self.leases.held(n.as_str()).is_some())
        {
            k += 1;
        }
        k
    }

    /// The lock's head waiters that it admits now: the head, and every reader right behind
    /// it; a writer alone. The first `credit` grants take the room of leases that just ended;
    /// each further one needs room for one more lease, or the rest wait.
    pub(super) fn rw_hand_off(&mut self, lock: &ResourceName, credit: u32, fx: &mut Vec<Effect>) {
        let mut credit = credit;
        self.rw_room_wait.remove(lock);
        loop {
            let Some(&waiter) = self.queues.get(lock).and_then(VecDeque::front) else {
                return;
            };
            let reads = self.waiters[&waiter].reads;
            if !self.rwlocks[lock].admits(reads) {
                return;
            }
            if credit > 0 {
                credit -= 1;
            } else if !self.room_for_one_more(lock) {
                self.rw_room_wait.insert(lock.clone());
                return;
            }
            let w = self
                .waiters
                .remove(&waiter)
                .expect("queued waiters are known");
            self.forget_waiter(waiter, &w);
            match self.grant_rw(lock, reads, w.request_id, w.holder, w.ttl_ms, fx) {
                Ok(grant) => fx.push(Effect::Granted { waiter, grant }),
                Err(_) => return self.end_all_waits(waiter, lock, fx),
            }
            if !reads {
                return;
            }
        }
    }

    /// A lease of a read-write lock ended, if `resource` names one: its writer's or one of
    /// its readers'. The lock's queue is served, and the lock forgotten if unused.
    pub(super) fn rw_lease_ended(&mut self, resource: &ResourceName, fx: &mut Vec<Effect>) -> bool {
        let lock = match fencing::reader::reader_of(resource.as_str()) {
            Some((lock, k)) => match self.rwlocks.get_key_value(lock) {
                Some((name, rw)) if rw.readers.contains_key(&k) => {
                    let name = name.clone();
                    let rw = self.rwlocks.get_mut(&name).expect("found above");
                    let lease_id = rw.readers.remove(&k).expect("found above");
                    rw.reader_slots.remove(&lease_id);
                    rw.free.insert(k);
                    name
                }
                _ => return false,
            },
            None => match self.rwlocks.get_mut(resource) {
                Some(rw) if rw.writer => {
                    rw.writer = false;
                    resource.clone()
                }
                _ => return false,
            },
        };
        self.rw_hand_off(&lock, 1, fx);
        self.drop_unused_rw(&lock);
        true
    }

    /// A lease ended: the read-write locks whose readers wait for room are served again, in
    /// name order, while there is room.
    pub(super) fn serve_room_waiters(&mut self, fx: &mut Vec<Effect>) {
        let mut next = self.rw_room_wait.first().cloned();
        while let Some(lock) = next {
            if self.leases.held_count() >= self.limits.leases_max {
                return;
            }
            self.rw_hand_off(&lock, 0, fx);
            use std::ops::Bound::{Excluded, Unbounded};
            next = self
                .rw_room_wait
                .range::<ResourceName, _>((Excluded(&lock), Unbounded))
                .next()
                .cloned();
        }
    }

    /// Room for one more lease of `lock`: lockd's and its tenant's.
    fn room_for_one_more(&self, lock: &ResourceName) -> bool {
        self.leases.held_count() < self.limits.leases_max
            && self
                .check_quota(self.owner(lock), Counted::Leases, 1)
                .is_ok()
    }

    /// A waiter left `resource`'s queue (its wait ended, or it was cancelled). A writer that
    /// left the head of a read-write lock's queue may leave readers there that the lock
    /// admits: they are granted now, so that the head of a queue is always one that must wait.
    pub(super) fn rw_waiter_left(&mut self, resource: &ResourceName, fx: &mut Vec<Effect>) {
        if self.rwlocks.contains_key(resource) {
            self.rw_hand_off(resource, 0, fx);
            self.drop_unused_rw(resource);
        }
    }

    fn drop_unused_rw(&mut self, lock: &ResourceName) {
        if self
            .rwlocks
            .get(lock)
            .is_some_and(|rw| !rw.writer && rw.readers.is_empty())
            && !self.queues.contains_key(lock)
        {
            self.rwlocks.remove(lock);
        }
    }

    /// Who holds a read-write lock, as a busy answer: its writer, else the reader on the
    /// lowest slot (one look, however many readers: a busy answer must not cost a scan under
    /// the core's lock); with the lock's waiters. `None` when it is not in use or held by
    /// nobody.
    pub(super) fn rw_busy(&self, lock: &ResourceName) -> Option<Busy> {
        let rw = self.rwlocks.get(lock)?;
        let first = if rw.writer {
            self.leases.held(lock.as_str())
        } else {
            let (&k, _) = rw.readers.first_key_value()?;
            let name = fencing::reader::name(lock, k)?;
            self.leases.held(name.as_str())
        }?;
        Some(Busy {
            holder: first.holder.clone(),
            token: first.token,
            expires_at: first.expires_at,
            waiters: self.queues.get(lock).map_or(0, VecDeque::len),
        })
    }

    /// How many readers hold a read-write lock in use.
    pub(super) fn rw_readers(&self, lock: &ResourceName) -> Option<u32> {
        self.rwlocks.get(lock).map(|rw| rw.readers.len() as u32)
    }

    /// The slot of `lease_id` if it is a reader's lease of the read-write lock `resource`:
    /// then a renew or a release under the lock's name is that reader's mistake, not a lost
    /// lease.
    pub(super) fn reader_slot(&self, resource: &ResourceName, lease_id: LeaseId) -> Option<u32> {
        self.rwlocks
            .get(resource)?
            .reader_slots
            .get(&lease_id)
            .copied()
    }

    /// Rebuilds the read-write locks of the recovered leases that say they hold one.
    pub(super) fn recover_rwlocks(
        &mut self,
        roles: &[(ResourceName, RwRole, LeaseId)],
    ) -> Result<(), RecoverError> {
        for (resource, role, lease_id) in roles {
            let invalid = |reason: &str| RecoverError::InvalidRecord {
                resource: resource.clone(),
                reason: reason.to_string(),
            };
            match role {
                RwRole::Write => {
                    if fencing::is_reserved(resource.as_str()) {
                        return Err(invalid("a writer's lease on a reserved name"));
                    }
                    self.rwlocks.entry(resource.clone()).or_default().writer = true;
                }
                RwRole::Read => {
                    let Some((lock, k)) = fencing::reader::reader_of(resource.as_str())
                        .filter(|&(_, k)| k <= READERS_MAX)
                    else {
                        return Err(invalid("a reader's lease not on a reader's slot"));
                    };
                    let lock = ResourceName::new(lock).map_err(|e| invalid(&e.to_string()))?;
                    let rw = self.rwlocks.entry(lock).or_default();
                    rw.readers.insert(k, *lease_id);
                    rw.reader_slots.insert(*lease_id, k);
                    rw.high = rw.high.max(k);
                }
            }
        }
        let names: Vec<ResourceName> = self.rwlocks.keys().cloned().collect();
        for lock in names {
            let invalid = |reason: &str| RecoverError::InvalidRecord {
                resource: lock.clone(),
                reason: reason.to_string(),
            };
            let rw = &self.rwlocks[&lock];
            if rw.writer && !rw.readers.is_empty() {
                return Err(invalid("held by a writer and by readers"));
            }
            if !rw.writer && self.leases.held(lock.as_str()).is_some() {
                return Err(invalid(
                    "held as an exclusive lock and as a read-write lock",
                ));
            }
            if self.semaphores.contains_key(&lock) {
                return Err(invalid("held as a semaphore and as a read-write lock"));
            }
            let free: BTreeSet<u32> = (1..rw.high)
                .filter(|k| !rw.readers.contains_key(k))
                .filter(|&k| {
                    fencing::reader::name(&lock, k)
                        .is_some_and(|n| self.leases.held(n.as_str()).is_none())
                })
                .collect();
            self.rwlocks.get_mut(&lock).expect("listed").free = free;
        }
        Ok(())
    }
}
