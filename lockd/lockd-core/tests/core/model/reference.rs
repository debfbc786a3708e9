//! The reference model: what the core must answer, written for obviousness, not speed.

use std::collections::BTreeMap;

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{
    AcquireAllOutcome, AcquireError, AcquireOutcome, Busy, Effect, Grant, Holder, InvalidArgument,
    LeaseRecord, Limits, Op, Reentrant, ReleaseOutcome, RenewError, Renewed, Rw, RwRole, WaiterId,
};

use crate::harness::lease_id;

#[derive(Clone)]
pub(crate) struct MLease {
    pub(crate) lease_id: LeaseId,
    pub(crate) token: FencingToken,
    pub(crate) holder: String,
    pub(crate) ttl: u64,
    pub(crate) expires: u64,
    pub(crate) granted: u64,
    /// (owner, holds) of a reentrant lease.
    pub(crate) owned: Option<(String, u32)>,
    /// The side of a read-write lock it holds.
    pub(crate) rw: Option<RwRole>,
}

pub(crate) struct MWaiter {
    pub(crate) id: u64,
    pub(crate) resource: String,
    pub(crate) request: Option<String>,
    pub(crate) holder: String,
    pub(crate) ttl: u64,
    pub(crate) deadline: u64,
    pub(crate) owner: Option<String>,
    pub(crate) permits: u32,
    /// Waits for a read-write lock: as a reader (`true`) or its writer.
    pub(crate) reads: Option<bool>,
}

#[derive(Clone)]
pub(crate) struct MRequest {
    pub(crate) resource: String,
    pub(crate) lease_id: LeaseId,
    pub(crate) token: FencingToken,
    pub(crate) ttl: u64,
    pub(crate) since: u64,
    pub(crate) seq: u64,
}

/// lease id, token, holder, TTL, the reentrant part, a permit's semaphore's permits, and a
/// read-write lock's side.
pub(crate) type StoredLease = (
    LeaseId,
    FencingToken,
    String,
    u64,
    Option<(String, u32)>,
    Option<u32>,
    Option<RwRole>,
);

#[derive(Clone, Default)]
pub(crate) struct MStore {
    pub(crate) last_token: Option<FencingToken>,
    pub(crate) leases: BTreeMap<String, StoredLease>,
    pub(crate) requests: BTreeMap<String, (String, LeaseId, FencingToken, u64)>,
}

pub(crate) struct Model {
    pub(crate) limits: Limits,
    pub(crate) now: u64,
    pub(crate) last_token: Option<FencingToken>,
    pub(crate) leases_issued: u64,
    pub(crate) next_waiter: u64,
    pub(crate) next_seq: u64,
    pub(crate) leases: BTreeMap<String, MLease>,
    pub(crate) waiters: Vec<MWaiter>,
    pub(crate) requests: BTreeMap<String, MRequest>,
    pub(crate) latest: MStore,
    pub(crate) durable: MStore,
    /// The permits of every semaphore granted a permit since the start (or the restart);
    /// only those in use count (`sem`).
    pub(crate) sems: BTreeMap<String, u32>,
}

/// The semaphore and number of a permit's name.
fn permit_of(r: &str) -> Option<(&str, u32)> {
    let (s, k) = r.rsplit_once("@permit-")?;
    Some((s, k.parse().ok()?))
}

fn permit_name(s: &str, k: u32) -> String {
    format!("{s}@permit-{k}")
}

use super::rw;

fn kind(permits: u32) -> String {
    match permits {
        0 => "an exclusive lock".to_string(),
        n => format!("a semaphore of {n} permits"),
    }
}

pub(crate) fn name(r: &str) -> ResourceName {
    ResourceName::new(r).unwrap()
}

pub(crate) fn holder(h: &str) -> Holder {
    Holder::new(h, &Limits::default()).unwrap()
}

impl Model {
    pub(crate) fn new(limits: Limits) -> Model {
        Model {
            limits,
            now: 0,
            last_token: None,
            leases_issued: 0,
            next_waiter: 1,
            next_seq: 0,
            leases: BTreeMap::new(),
            waiters: Vec::new(),
            requests: BTreeMap::new(),
            latest: MStore::default(),
            durable: MStore::default(),
            sems: BTreeMap::new(),
        }
    }

    pub(crate) fn queue_len(&self, resource: &str) -> usize {
        self.waiters
            .iter()
            .filter(|w| w.resource == resource)
            .count()
    }

    /// The permits of the semaphore `s`, and how many are held, while a permit is held or
    /// waited for.
    pub(crate) fn sem(&self, s: &str) -> Option<(u32, u32)> {
        let &n = self.sems.get(s)?;
        let held = (1..=n)
            .filter(|&k| self.leases.contains_key(&permit_name(s, k)))
            .count() as u32;
        let waited = self
            .waiters
            .iter()
            .any(|w| w.resource == s && w.permits > 0);
        (held > 0 || waited).then_some((n, held))
    }

    pub(crate) fn busy(&self, resource: &str) -> Busy {
        if let Some(busy) = self.rw_busy(resource) {
            return busy;
        }
        let first = self.sems.get(resource).and_then(|&n| {
            (1..=n)
                .filter_map(|k| self.leases.get(&permit_name(resource, k)))
                .min_by_key(|l| (l.expires, l.token))
        });
        let l = first.unwrap_or_else(|| &self.leases[resource]);
        Busy {
            holder: holder(&l.holder),
            token: l.token,
            expires_at: l.expires,
            waiters: self.queue_len(resource),
        }
    }

    pub(crate) fn advance(&mut self, now: u64, fx: &mut Vec<Effect>) {
        self.now = self.now.max(now);
        loop {
            // (time, 0 = lease / 1 = waiter, tie-break id)
            let lease = self
                .leases
                .iter()
                .filter(|(_, l)| l.expires <= self.now)
                .map(|(r, l)| (l.expires, 0, l.token.get(), r.clone()));
            let waiter = self
                .waiters
                .iter()
                .filter(|w| w.deadline <= self.now)
                .map(|w| (w.deadline, 1, w.id, w.resource.clone()));
            let Some((_, kind, id, resource)) = lease.chain(waiter).min() else {
                break;
            };
            if kind == 0 {
                let l = self.leases.remove(&resource).unwrap();
                self.store_remove(&resource, l.lease_id, fx);
                fx.push(Effect::Expired {
                    resource: name(&resource),
                    lease_id: l.lease_id,
                    token: l.token,
                    holder: holder(&l.holder),
                    held_ms: l.expires - l.granted,
                });
                self.hand_off(&resource, l.rw, fx);
            } else {
                let at = self.waiters.iter().position(|w| w.id == id).unwrap();
                let w = self.waiters.remove(at);
                fx.push(Effect::WaitTimedOut {
                    waiter: WaiterId(id),
                    busy: Some(self.busy(&resource)),
                });
                if w.reads.is_some() {
                    self.rw_hand_off(&resource, 0, fx);
                }
            }
        }
        let mut due: Vec<(u64, u64, String)> = self
            .requests
            .iter()
            .filter(|(_, r)| r.since + self.limits.request_retention_ms <= self.now)
            .map(|(id, r)| (r.since, r.seq, id.clone()))
            .collect();
        due.sort();
        for (_, _, id) in due {
            if self.set_held(&id) {
                let seq = self.seq();
                let r = self.requests.get_mut(&id).unwrap();
                r.since = self.now;
                r.seq = seq;
            } else {
                self.requests.remove(&id);
                self.latest.requests.remove(&id);
                fx.push(Effect::Persist(Op::ForgetRequest { request_id: id }));
            }
        }
    }

    /// Whether the lease of request id `id` is held, or that of another member of its
    /// AcquireAll set (`id`, `id 1`, `id 2`, ...): a set's ids are forgotten together.
    pub(crate) fn set_held(&self, id: &str) -> bool {
        let base = id.rsplit_once(' ').map_or(id, |(b, _)| b);
        let held = |m: &str| {
            self.requests.get(m).is_some_and(|r| {
                self.leases
                    .get(&r.resource)
                    .is_some_and(|l| l.token == r.token)
            })
        };
        held(base)
            || (1..)
                .map(|k| format!("{base} {k}"))
                .take_while(|m| self.requests.contains_key(m))
                .any(|m| held(&m))
    }

    /// The refusal of a reuse of a set's id: the members remembered, in the set's order.
    pub(crate) fn set_reused(&self, id: &str) -> AcquireError {
        let mut set = Vec::new();
        for k in 0..=lockd_core::limits::SET_MAX {
            let m = if k == 0 {
                id.to_string()
            } else {
                format!("{id} {k}")
            };
            match self.requests.get(&m) {
                Some(r) => set.push(name(&r.resource)),
                None if k > 0 => break,
                None => {}
            }
        }
        AcquireError::SetIdReused {
            request_id: id.to_string(),
            set,
        }
    }

    pub(crate) fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    pub(crate) fn store_remove(&mut self, resource: &str, lease_id: LeaseId, fx: &mut Vec<Effect>) {
        self.latest.leases.remove(resource);
        fx.push(Effect::Persist(Op::Remove {
            resource: name(resource),
            lease_id,
        }));
    }

    pub(crate) fn grant(
        &mut self,
        resource: &str,
        request: Option<String>,
        holder_: String,
        owner: Option<String>,
        (ttl, permits, rw): (u64, u32, Option<RwRole>),
        fx: &mut Vec<Effect>,
    ) -> Grant {
        let permits = (permits > 0).then_some(permits);
        if let (Some(n), Some((s, _))) = (permits, permit_of(resource)) {
            self.sems.insert(s.to_string(), n);
        }
        let token = FencingToken::new(self.last_token.map_or(1, |t| t.get() + 1)).unwrap();
        self.last_token = Some(token);
        self.leases_issued += 1;
        let lid = lease_id(self.leases_issued);
        let expires = self.now + ttl;
        if let Some(id) = &request {
            let seq = self.seq();
            self.requests.insert(
                id.clone(),
                MRequest {
                    resource: resource.to_string(),
                    lease_id: lid,
                    token,
                    ttl,
                    since: self.now,
                    seq,
                },
            );
            self.latest
                .requests
                .insert(id.clone(), (resource.to_string(), lid, token, ttl));
        }
        self.latest.last_token = Some(token);
        let owned = owner.map(|o| (o, 1));
        self.latest.leases.insert(
            resource.to_string(),
            (lid, token, holder_.clone(), ttl, owned.clone(), permits, rw),
        );
        self.durable = self.latest.clone();
        fx.push(Effect::Persist(Op::Grant(LeaseRecord {
            resource: name(resource),
            lease_id: lid,
            token,
            holder: holder_.clone(),
            ttl_ms: ttl,
            request_id: request,
            reentrant: owned.as_ref().map(|(o, _)| Reentrant {
                owner: o.clone(),
                holds: 1,
            }),
            permits,
            rw,
        })));
        assert!(
            self.leases
                .insert(
                    resource.to_string(),
                    MLease {
                        lease_id: lid,
                        token,
                        holder: holder_,
                        ttl,
                        expires,
                        granted: self.now,
                        owned,
                        rw,
                    }
                )
                .is_none()
        );
        Grant {
            resource: name(resource),
            lease_id: lid,
            token,
            ttl_ms: ttl,
            expires_at: expires,
            holds: 1,
        }
    }

    /// `resource` is free: its first waiter gets it, or, for a permit, its semaphore's; for a
    /// read-write lock's lease (`rw`), what the lock admits.
    pub(crate) fn hand_off(&mut self, resource: &str, rw: Option<RwRole>, fx: &mut Vec<Effect>) {
        self.hand_off_here(resource, rw, fx);
        self.serve_room_waiters(fx);
    }

    fn hand_off_here(&mut self, resource: &str, rw: Option<RwRole>, fx: &mut Vec<Effect>) {
        if rw.is_some() {
            return self.rw_hand_off(lockd_core::permits::owner_name(resource), 1, fx);
        }
        let (queue, permits) = match permit_of(resource) {
            Some((s, k)) if self.sems.get(s).is_some_and(|&n| k <= n) => (s, self.sems[s]),
            _ => (resource, 0),
        };
        if let Some(at) = self.waiters.iter().position(|w| w.resource == queue) {
            let w = self.waiters.remove(at);
            let kind = (w.ttl, permits, None);
            let grant = self.grant(resource, w.request, w.holder, w.owner, kind, fx);
            fx.push(Effect::Granted {
                waiter: WaiterId(w.id),
                grant,
            });
        }
    }

    pub(crate) fn acquire(
        &mut self,
        resource: &str,
        holder_: String,
        (request, owner): (Option<String>, Option<String>),
        (ttl, wait, permits): (u64, u64, u32),
        rw: Option<Rw>,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        self.advance(self.now, fx);
        let ttl = if ttl == 0 {
            self.limits.ttl_default_ms
        } else {
            ttl
        };
        if let Some(rw) = rw {
            let mode = if rw == Rw::Write { "write" } else { "read" };
            let other = match (permits, &owner) {
                (1.., _) => "permits",
                (0, Some(_)) => "owner",
                (0, None) => "",
            };
            if !other.is_empty() {
                return Err(AcquireError::Invalid(InvalidArgument::ModeWith {
                    mode,
                    other,
                }));
            }
        }
        let reads = matches!(rw, Some(Rw::Read | Rw::Downgrade(_)));
        if permits > 0 && owner.is_some() {
            return Err(AcquireError::Invalid(InvalidArgument::PermitsWithOwner));
        }
        if let Some(id) = &request {
            if let Some(r) = self.requests.get(id) {
                if self.requests.contains_key(&format!("{id} 1")) {
                    // The id names an AcquireAll's set of more than one.
                    return Err(self.set_reused(id));
                }
                let asked = match (permit_of(&r.resource), r.resource.rsplit_once("@read-")) {
                    (Some((s, _)), _) => permits > 0 && s == resource,
                    (None, Some((l, _))) => reads && l == resource,
                    (None, None) => permits == 0 && !reads && r.resource == resource,
                };
                if !asked {
                    return Err(AcquireError::RequestIdReused {
                        request_id: id.clone(),
                        original: name(&r.resource),
                        requested: name(resource),
                    });
                }
                let current = self.leases.get(&r.resource).filter(|l| l.token == r.token);
                // Held on the name itself: a writer's grant answers a write, a lock's a lock.
                if let Some(l) = current
                    && !reads
                    && (l.rw == Some(RwRole::Write)) != rw.is_some()
                {
                    let kind = |w: bool| match w {
                        true => "a read-write lock's writer",
                        false => "an exclusive lock",
                    };
                    let writer = l.rw == Some(RwRole::Write);
                    return Err(AcquireError::RequestIdUsedAs {
                        request_id: id.clone(),
                        resource: name(&r.resource),
                        used_as: kind(writer).to_string(),
                        asked_as: kind(!writer).to_string(),
                    });
                }
                let grant = Grant {
                    resource: name(&r.resource),
                    lease_id: r.lease_id,
                    token: r.token,
                    ttl_ms: r.ttl,
                    expires_at: current.map_or(self.now, |l| l.expires),
                    holds: current.and_then(|l| l.owned.as_ref()).map_or(1, |o| o.1),
                };
                return Ok(AcquireOutcome::Duplicate {
                    grant,
                    held: current.is_some(),
                });
            }
        }
        let asked_as = match rw {
            Some(_) => rw::READ_WRITE.to_string(),
            None => kind(permits),
        };
        let held_as = match self.sem(resource) {
            Some((n, _)) if rw.is_none() && permits > 0 && n != permits => {
                return Err(AcquireError::PermitsMismatch {
                    resource: name(resource),
                    permits: n,
                    asked: permits,
                });
            }
            Some((n, _)) => Some(kind(n)),
            None if self.rw_in_use(resource) => Some(rw::READ_WRITE.to_string()),
            None => self.leases.contains_key(resource).then(|| kind(0)),
        };
        if let Some(held_as) = held_as.filter(|h| *h != asked_as) {
            return Err(AcquireError::KindMismatch {
                resource: name(resource),
                held_as,
                asked_as,
            });
        }
        if let Some(id) = &request {
            if let Some(at) = self
                .waiters
                .iter()
                .position(|w| w.request.as_ref() == Some(id))
            {
                let w = &mut self.waiters[at];
                let waits_read = w.reads.unwrap_or(false);
                let downgrade = matches!(rw, Some(Rw::Downgrade(_)));
                if w.resource == resource && (waits_read != reads || downgrade) {
                    let side = |r: bool| if r { "a reader" } else { "its writer" };
                    return Err(AcquireError::RequestIdWaitsAs {
                        request_id: id.clone(),
                        resource: name(resource),
                        waits_as: side(waits_read),
                        asked_as: if downgrade {
                            "a downgrade (which never waits)"
                        } else {
                            side(reads)
                        },
                    });
                }
                if w.resource != resource {
                    return Err(AcquireError::RequestIdReused {
                        request_id: id.clone(),
                        original: name(&w.resource),
                        requested: name(resource),
                    });
                }
                w.deadline = self.now + wait;
                w.ttl = ttl;
                w.holder = holder_;
                w.owner = owner;
                w.permits = permits;
                let id = w.id;
                let position = self.waiters[..=at]
                    .iter()
                    .filter(|w| w.resource == resource)
                    .count();
                return Ok(AcquireOutcome::Rejoined {
                    waiter: WaiterId(id),
                    position,
                });
            }
        }
        let now = self.now;
        if let Some(l) = self.leases.get_mut(resource)
            && let Some((o, holds)) = &mut l.owned
            && Some(&*o) == owner.as_ref()
        {
            // A re-entry: the same lease, one more hold, its TTL from now; its request id
            // remembered as a grant's is. Synced, like a grant.
            if *holds >= lockd_core::limits::HOLDS_MAX {
                return Err(AcquireError::Invalid(InvalidArgument::HoldsExceeded {
                    resource: name(resource),
                    max: lockd_core::limits::HOLDS_MAX,
                }));
            }
            if request.is_some() && self.requests.len() >= self.limits.requests_max {
                return Err(AcquireError::RequestsExhausted {
                    max: self.limits.requests_max,
                });
            }
            *holds += 1;
            l.expires = now + l.ttl;
            let (lid, token, ttl, holds) = (l.lease_id, l.token, l.ttl, *holds);
            let grant = Grant {
                resource: name(resource),
                lease_id: lid,
                token,
                ttl_ms: ttl,
                expires_at: l.expires,
                holds,
            };
            let owned = l.owned.clone();
            let stored = self.latest.leases.get_mut(resource).unwrap();
            stored.4 = owned;
            if let Some(id) = &request {
                let seq = self.seq();
                self.requests.insert(
                    id.clone(),
                    MRequest {
                        resource: resource.to_string(),
                        lease_id: lid,
                        token,
                        ttl,
                        since: now,
                        seq,
                    },
                );
                self.latest
                    .requests
                    .insert(id.clone(), (resource.to_string(), lid, token, ttl));
            }
            self.durable = self.latest.clone();
            fx.push(Effect::Persist(Op::Reenter {
                resource: name(resource),
                lease_id: lid,
                holds,
                request_id: request,
            }));
            return Ok(AcquireOutcome::Reentered(grant));
        }
        if let Some(rw) = rw {
            return self.acquire_rw(resource, holder_, request, (ttl, wait), rw, fx);
        }
        // A semaphore is full when every permit is held: then it is busy, or waited for, as a
        // held lock is.
        let full = match permits {
            0 => self.leases.contains_key(resource),
            n => self.sem(resource).is_some_and(|(_, held)| held >= n),
        };
        if full {
            if wait == 0 {
                return Ok(AcquireOutcome::Busy(self.busy(resource)));
            }
            let w = (holder_, request, owner, permits, None);
            return self.enqueue(resource, w, (ttl, wait));
        }
        self.check_grant_room(&request)?;
        let on = match permits {
            0 => resource.to_string(),
            n => (1..=n)
                .map(|k| permit_name(resource, k))
                .find(|p| !self.leases.contains_key(p))
                .unwrap(),
        };
        Ok(AcquireOutcome::Granted(self.grant(
            &on,
            request,
            holder_,
            owner,
            (ttl, permits, None),
            fx,
        )))
    }

    /// Queues a waiter: (holder, request id, owner, permits, reads).
    #[allow(clippy::type_complexity)]
    pub(crate) fn enqueue(
        &mut self,
        resource: &str,
        (holder_, request, owner, permits, reads): (
            String,
            Option<String>,
            Option<String>,
            u32,
            Option<bool>,
        ),
        (ttl, wait): (u64, u64),
    ) -> Result<AcquireOutcome, AcquireError> {
        {
            if self.queue_len(resource) >= self.limits.waiters_per_resource_max {
                return Err(AcquireError::QueueFull {
                    resource: name(resource),
                    max: self.limits.waiters_per_resource_max,
                });
            }
            if self.waiters.len() >= self.limits.waiters_total_max {
                return Err(AcquireError::WaitersExhausted {
                    max: self.limits.waiters_total_max,
                });
            }
            if request.is_some() && self.requests.len() >= self.limits.requests_max {
                return Err(AcquireError::RequestsExhausted {
                    max: self.limits.requests_max,
                });
            }
            let id = self.next_waiter;
            self.next_waiter += 1;
            self.waiters.push(MWaiter {
                id,
                resource: resource.to_string(),
                request,
                holder: holder_,
                ttl,
                deadline: self.now + wait,
                owner,
                permits,
                reads,
            });
            Ok(AcquireOutcome::Queued {
                waiter: WaiterId(id),
                position: self.queue_len(resource),
            })
        }
    }

    /// Room for one more lease and, with a request id, for remembering it.
    pub(crate) fn check_grant_room(&self, request: &Option<String>) -> Result<(), AcquireError> {
        if self.leases.len() >= self.limits.leases_max {
            return Err(AcquireError::LeasesExhausted {
                max: self.limits.leases_max,
            });
        }
        if request.is_some() && self.requests.len() >= self.limits.requests_max {
            return Err(AcquireError::RequestsExhausted {
                max: self.limits.requests_max,
            });
        }
        Ok(())
    }

    /// The atomic AcquireAll, as the core's module documentation says it: checked whole,
    /// then granted whole, the grants in one atomic op.
    pub(crate) fn acquire_all(
        &mut self,
        resources: &[&str],
        holder_: String,
        request: Option<String>,
        ttl: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireAllOutcome, AcquireError> {
        self.advance(self.now, fx);
        let ttl = if ttl == 0 {
            self.limits.ttl_default_ms
        } else {
            ttl
        };
        let twice = resources
            .iter()
            .enumerate()
            .find(|(k, r)| resources[..*k].contains(r));
        if let Some((_, r)) = twice {
            return Err(AcquireError::Invalid(InvalidArgument::Set(format!(
                "the set names {r} twice; name each resource once"
            ))));
        }
        let member = |id: &str, k: usize| match k {
            0 => id.to_string(),
            k => format!("{id} {k}"),
        };
        let is_set = |id: &str| self.requests.contains_key(&format!("{id} 1"));
        let reused = |id: &str, original: &str, requested: &str| match is_set(id) {
            true => self.set_reused(id),
            false => AcquireError::RequestIdReused {
                request_id: id.to_string(),
                original: name(original),
                requested: name(requested),
            },
        };
        if let Some(id) = &request {
            if let Some(first) = self.requests.get(id) {
                let mut out = Vec::new();
                for (k, r) in resources.iter().enumerate() {
                    let Some(rem) = self.requests.get(&member(id, k)) else {
                        return Err(reused(id, &first.resource, r));
                    };
                    if rem.resource != *r {
                        return Err(reused(id, &rem.resource, r));
                    }
                    let current = self.leases.get(*r).filter(|l| l.token == rem.token);
                    out.push((
                        Grant {
                            resource: name(r),
                            lease_id: rem.lease_id,
                            token: rem.token,
                            ttl_ms: rem.ttl,
                            expires_at: current.map_or(self.now, |l| l.expires),
                            holds: 1,
                        },
                        current.is_some(),
                    ));
                }
                if let Some(more) = self.requests.get(&member(id, resources.len())) {
                    return Err(reused(id, &more.resource, resources[0]));
                }
                return Ok(AcquireAllOutcome::Duplicate(out));
            }
            if let Some(w) = self.waiters.iter().find(|w| w.request.as_ref() == Some(id)) {
                return Err(AcquireError::RequestIdReused {
                    request_id: id.clone(),
                    original: name(&w.resource),
                    requested: name(resources[0]),
                });
            }
        }
        for r in resources {
            let held_as = match self.sem(r) {
                Some((n, _)) => Some(kind(n)),
                None => self.rw_in_use(r).then(|| rw::READ_WRITE.to_string()),
            };
            if let Some(held_as) = held_as {
                return Err(AcquireError::KindMismatch {
                    resource: name(r),
                    held_as,
                    asked_as: kind(0),
                });
            }
            if self.leases.contains_key(*r) {
                return Ok(AcquireAllOutcome::Busy {
                    resource: name(r),
                    busy: self.busy(r),
                });
            }
        }
        if self.leases.len() + resources.len() > self.limits.leases_max {
            return Err(AcquireError::LeasesExhausted {
                max: self.limits.leases_max,
            });
        }
        if let Some(id) = &request {
            if self.requests.len() + resources.len() > self.limits.requests_max {
                return Err(AcquireError::RequestsExhausted {
                    max: self.limits.requests_max,
                });
            }
            if (1..=lockd_core::limits::SET_MAX).any(|k| self.requests.contains_key(&member(id, k)))
            {
                return Err(self.set_reused(id));
            }
        }
        let start = fx.len();
        let grants = resources
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let req = request.as_deref().map(|id| member(id, k));
                self.grant(r, req, holder_.clone(), None, (ttl, 0, None), fx)
            })
            .collect();
        let parts = fx
            .drain(start..)
            .map(|e| match e {
                Effect::Persist(op) => op,
                other => panic!("a grant's effect: {other:?}"),
            })
            .collect();
        fx.push(Effect::Persist(Op::Atomic(parts)));
        Ok(AcquireAllOutcome::Granted(grants))
    }

    pub(crate) fn renew(
        &mut self,
        resource: &str,
        lid: LeaseId,
        fx: &mut Vec<Effect>,
    ) -> Result<Renewed, RenewError> {
        self.advance(self.now, fx);
        let now = self.now;
        let semaphore = self.sem(resource).map(|(n, _)| n);
        let reader = self.reader_slot(resource, lid);
        match (self.leases.get_mut(resource), semaphore) {
            (Some(l), _) if l.lease_id == lid => {
                l.expires = now + l.ttl;
                Ok(Renewed {
                    expires_at: l.expires,
                    ttl_ms: l.ttl,
                })
            }
            _ if let Some(slot) = reader => Err(RenewError::Readers {
                resource: name(resource),
                slot,
            }),
            (_, Some(permits)) => Err(RenewError::Semaphore {
                resource: name(resource),
                permits,
            }),
            (other, None) => Err(RenewError::NotCurrent {
                resource: name(resource),
                current: other.map(|l| l.token),
            }),
        }
    }

    pub(crate) fn release(
        &mut self,
        resource: &str,
        lid: LeaseId,
        fx: &mut Vec<Effect>,
    ) -> ReleaseOutcome {
        self.advance(self.now, fx);
        let semaphore = self.sem(resource).map(|(n, _)| n);
        let reader_slot = self.reader_slot(resource, lid);
        match self.leases.get_mut(resource) {
            Some(l) if l.lease_id == lid && l.owned.as_ref().is_some_and(|o| o.1 > 1) => {
                let o = l.owned.as_mut().unwrap();
                o.1 -= 1;
                let holds = o.1;
                // Lazily synced: a crash may bring the hold back.
                self.latest.leases.get_mut(resource).unwrap().4 = l.owned.clone();
                fx.push(Effect::Persist(Op::Unhold {
                    resource: name(resource),
                    lease_id: lid,
                    holds,
                }));
                ReleaseOutcome::Unheld {
                    token: l.token,
                    holds,
                }
            }
            Some(l) if l.lease_id == lid => {
                let l = self.leases.remove(resource).unwrap();
                self.store_remove(resource, l.lease_id, fx);
                self.hand_off(resource, l.rw, fx);
                ReleaseOutcome::Released {
                    token: l.token,
                    held_ms: self.now - l.granted,
                }
            }
            other => ReleaseOutcome::NotHeld {
                semaphore,
                current: other.map(|l| l.token),
                reader_slot,
            },
        }
    }

    pub(crate) fn cancel(&mut self, id: u64, fx: &mut Vec<Effect>) -> bool {
        self.advance(self.now, fx);
        match self.waiters.iter().position(|w| w.id == id) {
            Some(at) => {
                let w = self.waiters.remove(at);
                if w.reads.is_some() {
                    self.rw_hand_off(&w.resource, 0, fx);
                }
                true
            }
            None => false,
        }
    }

    pub(crate) fn restart(&mut self, crash: bool) {
        if crash {
            self.latest = self.durable.clone();
        } else {
            self.durable = self.latest.clone();
        }
        self.last_token = self.latest.last_token;
        self.waiters.clear();
        self.next_waiter = 1;
        let now = self.now;
        self.leases = self
            .latest
            .leases
            .iter()
            .map(|(r, (lid, token, h, ttl, owned, _, rw))| {
                (
                    r.clone(),
                    MLease {
                        lease_id: *lid,
                        token: *token,
                        holder: h.clone(),
                        ttl: *ttl,
                        expires: now + ttl,
                        granted: now,
                        owned: owned.clone(),
                        rw: *rw,
                    },
                )
            })
            .collect();
        self.sems = self
            .latest
            .leases
            .iter()
            .filter_map(|(r, stored)| Some((permit_of(r)?.0.to_string(), stored.5?)))
            .collect();
        self.requests.clear();
        let stored: Vec<_> = self.latest.requests.clone().into_iter().collect();
        for (id, (resource, lid, token, ttl)) in stored {
            let seq = self.seq();
            self.requests.insert(
                id,
                MRequest {
                    resource,
                    lease_id: lid,
                    token,
                    ttl,
                    since: now,
                    seq,
                },
            );
        }
    }
}
