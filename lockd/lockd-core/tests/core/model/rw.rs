//! The reference model of read-write locks: the lock's state read off its leases and waiters
//! every time, the queue served from its head only.

use lockd_core::{AcquireError, AcquireOutcome, Busy, Effect, Rw, RwRole, WaiterId};

use super::reference::{MLease, Model, holder, name};

pub(crate) const READ_WRITE: &str = "a read-write lock";

fn reader_name(lock: &str, k: u32) -> String {
    format!("{lock}@read-{k}")
}

impl Model {
    /// The writer's lease of `lock`, if it has one.
    fn writer(&self, lock: &str) -> Option<&MLease> {
        self.leases
            .get(lock)
            .filter(|l| l.rw == Some(RwRole::Write))
    }

    /// The leases of `lock`'s readers.
    fn readers(&self, lock: &str) -> Vec<&MLease> {
        self.leases
            .iter()
            .filter(|(r, l)| {
                l.rw == Some(RwRole::Read)
                    && r.rsplit_once("@read-").is_some_and(|(n, _)| n == lock)
            })
            .map(|(_, l)| l)
            .collect()
    }

    /// Whether `lock` is a read-write lock in use: held by its writer or a reader, or waited
    /// for as one.
    pub(crate) fn rw_in_use(&self, lock: &str) -> bool {
        self.writer(lock).is_some()
            || !self.readers(lock).is_empty()
            || self
                .waiters
                .iter()
                .any(|w| w.resource == lock && w.reads.is_some())
    }

    /// The slot of `lid` if it is the lease of one of `lock`'s readers.
    pub(crate) fn reader_slot(&self, lock: &str, lid: fencing::LeaseId) -> Option<u32> {
        self.leases.iter().find_map(|(r, l)| {
            let (owner, k) = r.rsplit_once("@read-")?;
            (owner == lock && l.rw == Some(RwRole::Read) && l.lease_id == lid)
                .then(|| k.parse().expect("a slot's number"))
        })
    }

    /// Whether there is room for one more lease.
    fn room(&self) -> bool {
        self.leases.len() < self.limits.leases_max
    }

    /// Readers of a read-write lock in use, for Describe.
    pub(crate) fn rw_readers(&self, lock: &str) -> Option<u32> {
        self.rw_in_use(lock)
            .then(|| self.readers(lock).len() as u32)
    }

    /// Whether some read-write lock's first waiter could be granted now: nobody may wait for
    /// a lock that would take them (a writer that left the head must not strand readers).
    pub(crate) fn rw_head_admitted(&self) -> Option<&str> {
        self.waiters
            .iter()
            .filter(|w| w.reads.is_some())
            .find(|w| {
                let head = self.waiters.iter().find(|h| h.resource == w.resource);
                head.is_some_and(|h| h.id == w.id)
                    && self.admits(&w.resource, w.reads == Some(true))
                    && self.room()
            })
            .map(|w| w.resource.as_str())
    }

    fn admits(&self, lock: &str, reads: bool) -> bool {
        let readers = self.readers(lock).len();
        self.writer(lock).is_none()
            && match reads {
                true => readers < lockd_core::limits::READERS_MAX as usize,
                false => readers == 0,
            }
    }

    pub(crate) fn rw_busy(&self, lock: &str) -> Option<Busy> {
        if !self.rw_in_use(lock) {
            return None;
        }
        // The writer, else the reader on the lowest slot.
        let l = self.writer(lock).or_else(|| {
            (1..=lockd_core::limits::READERS_MAX)
                .find_map(|k| self.leases.get(&reader_name(lock, k)))
        })?;
        Some(Busy {
            holder: holder(&l.holder),
            token: l.token,
            expires_at: l.expires,
            waiters: self.queue_len(lock),
        })
    }

    /// Grants the writer's lease on `lock`, or a reader's on its lowest free slot.
    fn grant_rw(
        &mut self,
        lock: &str,
        reads: bool,
        (request, holder_, ttl): (Option<String>, String, u64),
        fx: &mut Vec<Effect>,
    ) -> lockd_core::Grant {
        let on = match reads {
            false => lock.to_string(),
            true => (1..)
                .map(|k| reader_name(lock, k))
                .find(|r| !self.leases.contains_key(r))
                .unwrap(),
        };
        let role = if reads { RwRole::Read } else { RwRole::Write };
        self.grant(&on, request, holder_, None, (ttl, 0, Some(role)), fx)
    }

    /// Serves `lock`'s queue from its head while the lock admits the head: the first
    /// `credit` grants in the room of leases that just ended, the others while there is room.
    pub(crate) fn rw_hand_off(&mut self, lock: &str, credit: u32, fx: &mut Vec<Effect>) {
        let mut credit = credit;
        while let Some(at) = self.waiters.iter().position(|w| w.resource == lock) {
            let reads = self.waiters[at].reads.expect("a read-write lock's waiter");
            if !self.admits(lock, reads) {
                return;
            }
            if credit > 0 {
                credit -= 1;
            } else if !self.room() {
                return;
            }
            let w = self.waiters.remove(at);
            let grant = self.grant_rw(lock, reads, (w.request, w.holder, w.ttl), fx);
            fx.push(Effect::Granted {
                waiter: WaiterId(w.id),
                grant,
            });
            if !reads {
                return;
            }
        }
    }

    /// A lease ended, so there may be room: every read-write lock with waiters, in name order,
    /// serves its head while it admits it and there is room.
    pub(crate) fn serve_room_waiters(&mut self, fx: &mut Vec<Effect>) {
        let locks: std::collections::BTreeSet<String> = self
            .waiters
            .iter()
            .filter(|w| w.reads.is_some())
            .map(|w| w.resource.clone())
            .collect();
        for lock in locks {
            if !self.room() {
                return;
            }
            self.rw_hand_off(&lock, 0, fx);
        }
    }

    pub(crate) fn acquire_rw(
        &mut self,
        lock: &str,
        holder_: String,
        request: Option<String>,
        (ttl, wait): (u64, u64),
        rw: Rw,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        if let Rw::Downgrade(lid) = rw {
            let writer = self.writer(lock).map(|l| (l.lease_id, l.token));
            if writer.is_none_or(|(l, _)| l != lid) {
                return Err(AcquireError::NotWriter {
                    resource: name(lock),
                    current: writer.map(|(_, t)| t),
                });
            }
            if request.is_some() && self.requests.len() >= self.limits.requests_max {
                return Err(AcquireError::RequestsExhausted {
                    max: self.limits.requests_max,
                });
            }
            self.leases.remove(lock);
            self.store_remove(lock, lid, fx);
            let grant = self.grant_rw(lock, true, (request, holder_, ttl), fx);
            self.rw_hand_off(lock, 0, fx);
            return Ok(AcquireOutcome::Granted(grant));
        }
        let reads = rw == Rw::Read;
        if self.queue_len(lock) > 0 || !self.admits(lock, reads) {
            if wait == 0 {
                return Ok(AcquireOutcome::Busy(self.busy(lock)));
            }
            return self.enqueue(lock, (holder_, request, None, 0, Some(reads)), (ttl, wait));
        }
        self.check_grant_room(&request)?;
        let grant = self.grant_rw(lock, reads, (request, holder_, ttl), fx);
        Ok(AcquireOutcome::Granted(grant))
    }
}
