//! The lease table: every held lease and every remembered request id, compactly.
//!
//! lockd must hold a million leases in a few hundred megabytes, so the table keeps each lease
//! once, in a slot of a slab, and indexes it with hash tables of 4-byte slot numbers (the key is
//! looked up in the slot itself), a B-tree of expiries, and a FIFO of request-id retention.
//! Names, holders and request ids are compact strings, inline up to 24 bytes.
//!
//! A slot lives while its lease is held *or* its request id is remembered: a retried request
//! must find its original grant after the lease has ended. So a slot is freed when the lease
//! has ended and its request id (if any) has been forgotten. A re-entry's request id is
//! remembered in a slot of its own, a copy of the lease's that is not held: the lease's own
//! slot has room for one request id, a reentrant lease is asked for under many.
//!
//! The table enforces no policy; `machine` decides. It does keep its own consistency: one held
//! slot per name, one slot per remembered request id, one expiry entry per held slot.

use std::collections::{BTreeSet, VecDeque};
use std::hash::{BuildHasher, RandomState};

use compact_str::CompactString;
use fencing::{FencingToken, LeaseId, ResourceName};
use hashbrown::HashTable;

use crate::types::{Holder, Millis, Owner, RequestId};

/// The reentrant part of a held lease (boxed in its slot: most leases have none, and pay 8
/// bytes for it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reentry {
    pub owner: Owner,
    pub holds: u32,
}

type SlotId = u32;

/// One lease (held, or ended but remembered for its request id).
pub(crate) struct Slot {
    name: CompactString,
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub expires_at: Millis,
    /// When it was granted (or, after a restart, recovered).
    pub granted_at: Millis,
    /// Lease length. Fits: `Limits::validate` bounds `ttl_max_ms` by `u32::MAX`.
    ttl_ms: u32,
    held: bool,
    pub holder: Holder,
    pub request: Option<RequestId>,
    pub reentry: Option<Box<Reentry>>,
}

impl Slot {
    pub fn name_str(&self) -> &str {
        &self.name
    }

    pub fn ttl_ms(&self) -> u64 {
        u64::from(self.ttl_ms)
    }

    pub fn name(&self) -> ResourceName {
        ResourceName::new(&self.name).expect("names are validated before they are stored")
    }
}

/// What is left of a lease that ended.
pub(crate) struct Ended {
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub holder: Holder,
    pub granted_at: Millis,
    pub expires_at: Millis,
}

/// A new lease.
pub(crate) struct NewLease {
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub holder: Holder,
    pub ttl_ms: u64,
    pub expires_at: Millis,
    pub granted_at: Millis,
    pub request: Option<RequestId>,
    pub reentry: Option<Box<Reentry>>,
}

#[derive(Default)]
pub(crate) struct LeaseTable {
    slab: Vec<Slot>,
    free: Vec<SlotId>,
    hasher: RandomState,
    /// Held slots, by name.
    by_name: HashTable<SlotId>,
    /// Slots whose request id is remembered, by request id.
    by_request: HashTable<SlotId>,
    /// (expiry, token, slot) of every held slot. The token orders equal expiries: the lease
    /// granted first expires first.
    expiries: BTreeSet<(Millis, FencingToken, SlotId)>,
    /// (grant time, token, slot) of every held slot not yet reported as held long, when that
    /// is asked for (`track_long_holds`).
    long: BTreeSet<(Millis, FencingToken, SlotId)>,
    pub track_long_holds: bool,
    /// (retention start, slot) of every remembered request id, oldest first.
    retention: VecDeque<(Millis, SlotId)>,
    held: usize,
}

impl LeaseTable {
    pub fn held_count(&self) -> usize {
        self.held
    }

    pub fn remembered_count(&self) -> usize {
        self.by_request.len()
    }

    fn slot(&self, id: SlotId) -> &Slot {
        &self.slab[id as usize]
    }

    fn find_held(&self, name: &str) -> Option<SlotId> {
        let hash = self.hasher.hash_one(name);
        self.by_name
            .find(hash, |&i| self.slab[i as usize].name == name)
            .copied()
    }

    fn find_request(&self, request: &RequestId) -> Option<SlotId> {
        let hash = self.hasher.hash_one(request.as_str());
        let slab = &self.slab;
        self.by_request
            .find(hash, |&i| {
                slab[i as usize].request.as_ref() == Some(request)
            })
            .copied()
    }

    /// The names of the held leases, in no order.
    pub fn held_names(&self) -> impl Iterator<Item = &str> {
        self.by_name
            .iter()
            .map(|&i| self.slab[i as usize].name.as_str())
    }

    /// The names of the slots whose request id is remembered (held or ended), in no order.
    pub fn remembered_names(&self) -> impl Iterator<Item = &str> {
        self.by_request
            .iter()
            .map(|&i| self.slab[i as usize].name.as_str())
    }

    /// Held slots from slot number `from` on, looking at `budget` slots at most: each with its
    /// number, and the number to go on from (`None`: the end).
    pub fn held_from(&self, from: u32, budget: usize) -> (Vec<(u32, &Slot)>, Option<u32>) {
        let start = from as usize;
        if start >= self.slab.len() {
            return (Vec::new(), None);
        }
        let end = start.saturating_add(budget).min(self.slab.len());
        let held = (start..end)
            .filter(|&i| self.slab[i].held)
            .map(|i| (i as u32, &self.slab[i]))
            .collect();
        let next = (end < self.slab.len()).then_some(end as u32);
        (held, next)
    }

    /// The held lease of `name`.
    pub fn held(&self, name: &str) -> Option<&Slot> {
        self.find_held(name).map(|i| self.slot(i))
    }

    /// The slot remembered under `request` (held or ended).
    pub fn remembered(&self, request: &RequestId) -> Option<&Slot> {
        self.find_request(request).map(|i| self.slot(i))
    }

    /// Adds a held lease of `name`, which must not be held. Remembers its request id from
    /// `now`, which must not be remembered.
    pub fn insert(&mut self, name: &ResourceName, lease: NewLease, now: Millis) {
        assert!(
            self.find_held(name.as_str()).is_none(),
            "granted {name} while it was held"
        );
        let request = lease.request.clone();
        let slot = Slot {
            name: CompactString::new(name.as_str()),
            lease_id: lease.lease_id,
            token: lease.token,
            expires_at: lease.expires_at,
            granted_at: lease.granted_at,
            ttl_ms: u32::try_from(lease.ttl_ms).expect("ttl_ms is bounded by u32::MAX"),
            held: true,
            holder: lease.holder,
            request: lease.request,
            reentry: lease.reentry,
        };
        let id = self.put(slot);
        let (slab, hasher) = (&self.slab, &self.hasher);
        self.by_name
            .insert_unique(hasher.hash_one(name.as_str()), id, |&i| {
                hasher.hash_one(slab[i as usize].name.as_str())
            });
        self.expiries.insert((lease.expires_at, lease.token, id));
        if self.track_long_holds {
            self.long.insert((lease.granted_at, lease.token, id));
        }
        self.held += 1;
        if let Some(request) = request {
            assert!(
                self.find_request(&request).is_none(),
                "request id {request} remembered twice"
            );
            self.remember(id, &request, now);
        }
    }

    /// Restores a remembered request id after a restart: attaches it to the held lease of
    /// `name` when that lease has `lease.token`, otherwise keeps it in a slot of its own (the
    /// lease ended). A request id already remembered is left as it is.
    pub fn restore_request(&mut self, name: &ResourceName, lease: NewLease, now: Millis) {
        let request = lease
            .request
            .clone()
            .expect("a remembered record has a request id");
        if self.find_request(&request).is_some() {
            return;
        }
        if let Some(id) = self.find_held(name.as_str())
            && self.slab[id as usize].token == lease.token
            && self.slab[id as usize].request.is_none()
        {
            self.slab[id as usize].request = Some(request.clone());
            self.remember(id, &request, now);
            return;
        }
        let id = self.put(Slot {
            name: CompactString::new(name.as_str()),
            lease_id: lease.lease_id,
            token: lease.token,
            expires_at: lease.expires_at,
            granted_at: lease.granted_at,
            ttl_ms: u32::try_from(lease.ttl_ms).unwrap_or(u32::MAX),
            held: false,
            holder: lease.holder,
            request: Some(request.clone()),
            reentry: None,
        });
        self.remember(id, &request, now);
    }

    /// Remembers `request`, which must not be remembered, as a re-entry of the held lease of
    /// `name`, from `now`: in a slot of its own, not held, a copy of the lease's.
    pub fn remember_reentry(&mut self, name: &str, request: &RequestId, now: Millis) {
        assert!(
            self.find_request(request).is_none(),
            "request id {request} remembered twice"
        );
        let held = self.slot(self.find_held(name).expect("a re-entry of a held lease"));
        let copy = Slot {
            name: held.name.clone(),
            lease_id: held.lease_id,
            token: held.token,
            expires_at: held.expires_at,
            granted_at: held.granted_at,
            ttl_ms: held.ttl_ms,
            held: false,
            holder: held.holder.clone(),
            request: Some(request.clone()),
            reentry: None,
        };
        let id = self.put(copy);
        self.remember(id, request, now);
    }

    /// Whether the slot's lease is the held lease of its name: the slot itself, or a copy
    /// remembered for a re-entry.
    fn lease_held(&self, id: SlotId) -> bool {
        let slot = self.slot(id);
        slot.held
            || self
                .find_held(&slot.name)
                .is_some_and(|h| self.slot(h).lease_id == slot.lease_id)
    }

    /// The held lease a remembered slot is (or is a copy of), if it is still held.
    pub fn current(&self, remembered: &Slot) -> Option<&Slot> {
        self.held(&remembered.name)
            .filter(|h| h.lease_id == remembered.lease_id)
    }

    /// Stores `slot` in a free slot or a new one.
    fn put(&mut self, slot: Slot) -> SlotId {
        match self.free.pop() {
            Some(id) => {
                self.slab[id as usize] = slot;
                id
            }
            None => {
                self.slab.push(slot);
                SlotId::try_from(self.slab.len() - 1).expect("fewer than 2^32 slots")
            }
        }
    }

    fn remember(&mut self, id: SlotId, request: &RequestId, now: Millis) {
        let (slab, hasher) = (&self.slab, &self.hasher);
        self.by_request
            .insert_unique(hasher.hash_one(request.as_str()), id, |&i| {
                hasher.hash_one(
                    slab[i as usize]
                        .request
                        .as_ref()
                        .expect("remembered slots have a request id")
                        .as_str(),
                )
            });
        self.retention.push_back((now, id));
    }

    /// Extends the held lease of `name` if `lease_id` is current; otherwise returns the current
    /// token, if any.
    pub fn renew(
        &mut self,
        name: &str,
        lease_id: LeaseId,
        now: Millis,
    ) -> Result<(Millis, u64), Option<FencingToken>> {
        let Some(id) = self.find_held(name) else {
            return Err(None);
        };
        let slot = &mut self.slab[id as usize];
        if slot.lease_id != lease_id {
            return Err(Some(slot.token));
        }
        let removed = self.expiries.remove(&(slot.expires_at, slot.token, id));
        debug_assert!(removed, "a held lease always has its expiry");
        slot.expires_at = now.saturating_add(u64::from(slot.ttl_ms));
        self.expiries.insert((slot.expires_at, slot.token, id));
        Ok((slot.expires_at, u64::from(slot.ttl_ms)))
    }

    /// The reentrant part of the held lease of `name`, if it has one, to count its holds.
    pub fn reentry_mut(&mut self, name: &str) -> Option<&mut Reentry> {
        let id = self.find_held(name)?;
        self.slab[id as usize].reentry.as_deref_mut()
    }

    /// Ends the held lease of `name` (which must be held).
    pub fn end(&mut self, name: &str) -> Ended {
        let id = self.find_held(name).expect("end of a held lease");
        self.end_slot(id)
    }

    fn end_slot(&mut self, id: SlotId) -> Ended {
        let hash = self.hasher.hash_one(self.slab[id as usize].name.as_str());
        match self.by_name.find_entry(hash, |&i| i == id) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => unreachable!("a held slot is indexed by name"),
        }
        let slot = &mut self.slab[id as usize];
        self.expiries.remove(&(slot.expires_at, slot.token, id));
        self.long.remove(&(slot.granted_at, slot.token, id));
        slot.held = false;
        slot.reentry = None;
        self.held -= 1;
        let ended = Ended {
            lease_id: slot.lease_id,
            token: slot.token,
            holder: slot.holder.clone(),
            granted_at: slot.granted_at,
            expires_at: slot.expires_at,
        };
        if slot.request.is_none() {
            self.release_slot(id);
        }
        ended
    }

    fn release_slot(&mut self, id: SlotId) {
        let slot = &mut self.slab[id as usize];
        slot.name = CompactString::default();
        slot.holder = Holder::default();
        slot.request = None;
        slot.reentry = None;
        self.free.push(id);
    }

    /// When the longest-held lease not yet reported will have been held `after_ms`.
    pub fn next_long_hold(&self, after_ms: u64) -> Option<Millis> {
        self.long
            .first()
            .map(|&(granted, _, _)| granted.saturating_add(after_ms))
    }

    /// The held lease granted earliest of those not yet reported, if it has been held
    /// `after_ms` by `now`: taken off the list (it is reported once).
    pub fn take_long_hold(&mut self, now: Millis, after_ms: u64) -> Option<&Slot> {
        let &(granted, _, id) = self.long.first()?;
        if granted.saturating_add(after_ms) > now {
            return None;
        }
        self.long.pop_first();
        Some(&self.slab[id as usize])
    }

    /// The earliest expiry, if any lease is held.
    pub fn next_expiry(&self) -> Option<Millis> {
        self.expiries.first().map(|&(at, _, _)| at)
    }

    /// Ends the earliest-expiring lease if it expires at or before `now`, returning its name.
    pub fn expire_next(&mut self, now: Millis) -> Option<(ResourceName, Ended)> {
        let &(at, _, id) = self.expiries.first()?;
        if at > now {
            return None;
        }
        let name = self.slot(id).name();
        Some((name, self.end_slot(id)))
    }

    /// Whether the slot's lease is held, or that of another member of the AcquireAll set its
    /// request id belongs to ([`RequestId::member`]): a set's ids are kept, and forgotten,
    /// together, so that a retry never finds part of a set (and a caller never reuses the id
    /// of a set that is partly remembered). Members are numbered from 0 without gaps.
    fn set_held(&self, id: SlotId) -> bool {
        if self.lease_held(id) {
            return true;
        }
        let own = self.slot(id).request.as_ref().expect("a remembered slot");
        let derived = own.set_base();
        let base = derived.as_ref().unwrap_or(own);
        // Member 0 is the base id itself; the others follow without gaps.
        if derived.is_some() && self.find_request(base).is_some_and(|m| self.lease_held(m)) {
            return true;
        }
        for k in 1..=crate::limits::SET_MAX {
            match self.find_request(&base.member(k)) {
                None => return false,
                Some(m) if m != id && self.lease_held(m) => return true,
                Some(_) => {}
            }
        }
        false
    }

    /// Forgets request ids whose retention started `retention_ms` before `now`, except those
    /// whose lease is still held, re-entries' included, or whose AcquireAll set has a member
    /// held (their retention starts over). Calls `forgotten` for each.
    pub fn forget_requests(
        &mut self,
        now: Millis,
        retention_ms: u64,
        mut forgotten: impl FnMut(&str, RequestId),
    ) {
        while let Some(&(since, id)) = self.retention.front() {
            if since.saturating_add(retention_ms) > now {
                break;
            }
            self.retention.pop_front();
            if self.set_held(id) {
                self.retention.push_back((now, id));
                continue;
            }
            let request = self.slab[id as usize]
                .request
                .clone()
                .expect("retained slots have a request id");
            let hash = self.hasher.hash_one(request.as_str());
            match self.by_request.find_entry(hash, |&i| i == id) {
                Ok(entry) => {
                    entry.remove();
                }
                Err(_) => unreachable!("a retained slot is indexed by request id"),
            }
            forgotten(self.slab[id as usize].name.as_str(), request);
            self.release_slot(id);
        }
    }
}
