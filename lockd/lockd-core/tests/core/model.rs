//! The core against a simple reference model, over random interleavings of acquire, AcquireAll, renew,
//! release, expiry (time passing), cancellation (disconnect) and restart (clean or crash), with
//! and without an owner (reentrant leases).
//!
//! The model is written for obviousness, not speed: leases in a map, all waiters in one list in
//! arrival order (a resource's queue is that list filtered by resource), deadlines found by a
//! linear scan. After every step the core's answer and effects must equal the model's, and
//! across the whole run:
//! - at most one lease per resource (the model's map cannot hold two, and the core must agree);
//! - every grant's token is above every earlier grant's, restarts included;
//! - hand-offs go to waiters in FIFO order (the model grants the first waiter of the list);
//! - a reentrant lease is released only by as many releases as it was acquired, and a crash
//!   never loses a re-entry that was answered (it is synced), only a release of a hold;
//! - an atomic AcquireAll grants every resource of its set or none, its grants one atomic op,
//!   and a retry of its request id gets every member's original grant.

use std::collections::BTreeMap;

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{
    AcquireAllOutcome, AcquireAllRequest, AcquireError, AcquireOutcome, Busy, Effect, Grant,
    Holder, InvalidArgument, LeaseRecord, Limits, Op, Reentrant, ReleaseOutcome, RenewError,
    Renewed, RequestId, WaiterId,
};
use proptest::prelude::*;

use crate::harness::{Rig, lease_id};

const RESOURCES: [&str; 4] = ["r0", "r1", "r2", "r3"];

fn limits() -> Limits {
    Limits {
        ttl_min_ms: 100,
        ttl_default_ms: 200,
        ttl_max_ms: 1_000,
        wait_max_ms: 1_000,
        waiters_per_resource_max: 3,
        waiters_total_max: 6,
        leases_max: 3,
        request_retention_ms: 700,
        requests_max: 5,
        // Reports of long holds are not modelled (a transcript covers them).
        hold_warn_after_ms: 0,
        ..Limits::default()
    }
}

#[derive(Clone, Debug)]
enum Step {
    Acquire {
        resource: usize,
        holder: u8,
        request: Option<u8>,
        owner: Option<u8>,
        ttl_ms: u64,
        wait_ms: u64,
    },
    AcquireAll {
        resources: Vec<usize>,
        holder: u8,
        request: Option<u8>,
        ttl_ms: u64,
    },
    Renew {
        resource: usize,
        pick: usize,
    },
    Release {
        resource: usize,
        pick: usize,
    },
    Cancel {
        pick: usize,
    },
    Describe {
        resource: usize,
    },
    Advance {
        ms: u64,
    },
    Restart {
        crash: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..RESOURCES.len(), 0u8..4, proptest::option::of(0u8..8), proptest::option::of(0u8..2), prop_oneof![Just(0u64), Just(100), Just(250), Just(600)],
              prop_oneof![Just(0u64), Just(50), Just(300), Just(1000)])
            .prop_map(|(resource, holder, request, owner, ttl_ms, wait_ms)| Step::Acquire { resource, holder, request, owner, ttl_ms, wait_ms }),
        2 => (proptest::collection::vec(0..RESOURCES.len(), 1..4), 0u8..4, proptest::option::of(0u8..8), prop_oneof![Just(0u64), Just(250)])
            .prop_map(|(resources, holder, request, ttl_ms)| Step::AcquireAll { resources, holder, request, ttl_ms }),
        3 => (0..RESOURCES.len(), any::<usize>()).prop_map(|(resource, pick)| Step::Renew { resource, pick }),
        3 => (0..RESOURCES.len(), any::<usize>()).prop_map(|(resource, pick)| Step::Release { resource, pick }),
        1 => any::<usize>().prop_map(|pick| Step::Cancel { pick }),
        1 => (0..RESOURCES.len()).prop_map(|resource| Step::Describe { resource }),
        4 => (0u64..400).prop_map(|ms| Step::Advance { ms }),
        1 => any::<bool>().prop_map(|crash| Step::Restart { crash }),
    ]
}

// ---- the reference model ---------------------------------------------------------------------

#[derive(Clone)]
struct MLease {
    lease_id: LeaseId,
    token: FencingToken,
    holder: String,
    ttl: u64,
    expires: u64,
    granted: u64,
    /// (owner, holds) of a reentrant lease.
    owned: Option<(String, u32)>,
}

struct MWaiter {
    id: u64,
    resource: String,
    request: Option<String>,
    holder: String,
    ttl: u64,
    deadline: u64,
    owner: Option<String>,
}

#[derive(Clone)]
struct MRequest {
    resource: String,
    lease_id: LeaseId,
    token: FencingToken,
    ttl: u64,
    since: u64,
    seq: u64,
}

/// lease id, token, holder, TTL, and the reentrant part.
type StoredLease = (LeaseId, FencingToken, String, u64, Option<(String, u32)>);

#[derive(Clone, Default)]
struct MStore {
    last_token: Option<FencingToken>,
    leases: BTreeMap<String, StoredLease>,
    requests: BTreeMap<String, (String, LeaseId, FencingToken, u64)>,
}

struct Model {
    limits: Limits,
    now: u64,
    last_token: Option<FencingToken>,
    leases_issued: u64,
    next_waiter: u64,
    next_seq: u64,
    leases: BTreeMap<String, MLease>,
    waiters: Vec<MWaiter>,
    requests: BTreeMap<String, MRequest>,
    latest: MStore,
    durable: MStore,
}

fn name(r: &str) -> ResourceName {
    ResourceName::new(r).unwrap()
}

fn holder(h: &str) -> Holder {
    Holder::new(h, &Limits::default()).unwrap()
}

impl Model {
    fn new(limits: Limits) -> Model {
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
        }
    }

    fn queue_len(&self, resource: &str) -> usize {
        self.waiters
            .iter()
            .filter(|w| w.resource == resource)
            .count()
    }

    fn busy(&self, resource: &str) -> Busy {
        let l = &self.leases[resource];
        Busy {
            holder: holder(&l.holder),
            token: l.token,
            expires_at: l.expires,
            waiters: self.queue_len(resource),
        }
    }

    fn advance(&mut self, now: u64, fx: &mut Vec<Effect>) {
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
                self.hand_off(&resource, fx);
            } else {
                let at = self.waiters.iter().position(|w| w.id == id).unwrap();
                self.waiters.remove(at);
                fx.push(Effect::WaitTimedOut {
                    waiter: WaiterId(id),
                    busy: Some(self.busy(&resource)),
                });
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
    fn set_held(&self, id: &str) -> bool {
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
    fn set_reused(&self, id: &str) -> AcquireError {
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

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn store_remove(&mut self, resource: &str, lease_id: LeaseId, fx: &mut Vec<Effect>) {
        self.latest.leases.remove(resource);
        fx.push(Effect::Persist(Op::Remove {
            resource: name(resource),
            lease_id,
        }));
    }

    fn grant(
        &mut self,
        resource: &str,
        request: Option<String>,
        holder_: String,
        owner: Option<String>,
        ttl: u64,
        fx: &mut Vec<Effect>,
    ) -> Grant {
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
            (lid, token, holder_.clone(), ttl, owned.clone()),
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

    fn hand_off(&mut self, resource: &str, fx: &mut Vec<Effect>) {
        if let Some(at) = self.waiters.iter().position(|w| w.resource == resource) {
            let w = self.waiters.remove(at);
            let grant = self.grant(resource, w.request, w.holder, w.owner, w.ttl, fx);
            fx.push(Effect::Granted {
                waiter: WaiterId(w.id),
                grant,
            });
        }
    }

    fn acquire(
        &mut self,
        resource: &str,
        holder_: String,
        (request, owner): (Option<String>, Option<String>),
        ttl: u64,
        wait: u64,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, AcquireError> {
        self.advance(self.now, fx);
        let ttl = if ttl == 0 {
            self.limits.ttl_default_ms
        } else {
            ttl
        };
        if let Some(id) = &request {
            if let Some(r) = self.requests.get(id) {
                if self.requests.contains_key(&format!("{id} 1")) {
                    // The id names an AcquireAll's set of more than one.
                    return Err(self.set_reused(id));
                }
                if r.resource != resource {
                    return Err(AcquireError::RequestIdReused {
                        request_id: id.clone(),
                        original: name(&r.resource),
                        requested: name(resource),
                    });
                }
                let current = self.leases.get(resource).filter(|l| l.token == r.token);
                let grant = Grant {
                    resource: name(resource),
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
            if let Some(at) = self
                .waiters
                .iter()
                .position(|w| w.request.as_ref() == Some(id))
            {
                let w = &mut self.waiters[at];
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
        if self.leases.contains_key(resource) {
            if wait == 0 {
                return Ok(AcquireOutcome::Busy(self.busy(resource)));
            }
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
            });
            return Ok(AcquireOutcome::Queued {
                waiter: WaiterId(id),
                position: self.queue_len(resource),
            });
        }
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
        Ok(AcquireOutcome::Granted(
            self.grant(resource, request, holder_, owner, ttl, fx),
        ))
    }

    /// The atomic AcquireAll, as the core's module documentation says it: checked whole,
    /// then granted whole, the grants in one atomic op.
    fn acquire_all(
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
        if let Some(r) = resources.iter().find(|r| self.leases.contains_key(**r)) {
            return Ok(AcquireAllOutcome::Busy {
                resource: name(r),
                busy: self.busy(r),
            });
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
                self.grant(r, req, holder_.clone(), None, ttl, fx)
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

    fn renew(
        &mut self,
        resource: &str,
        lid: LeaseId,
        fx: &mut Vec<Effect>,
    ) -> Result<Renewed, RenewError> {
        self.advance(self.now, fx);
        let now = self.now;
        match self.leases.get_mut(resource) {
            Some(l) if l.lease_id == lid => {
                l.expires = now + l.ttl;
                Ok(Renewed {
                    expires_at: l.expires,
                    ttl_ms: l.ttl,
                })
            }
            other => Err(RenewError::NotCurrent {
                resource: name(resource),
                current: other.map(|l| l.token),
            }),
        }
    }

    fn release(&mut self, resource: &str, lid: LeaseId, fx: &mut Vec<Effect>) -> ReleaseOutcome {
        self.advance(self.now, fx);
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
                self.hand_off(resource, fx);
                ReleaseOutcome::Released {
                    token: l.token,
                    held_ms: self.now - l.granted,
                }
            }
            other => ReleaseOutcome::NotHeld {
                current: other.map(|l| l.token),
            },
        }
    }

    fn cancel(&mut self, id: u64, fx: &mut Vec<Effect>) -> bool {
        self.advance(self.now, fx);
        match self.waiters.iter().position(|w| w.id == id) {
            Some(at) => {
                self.waiters.remove(at);
                true
            }
            None => false,
        }
    }

    fn restart(&mut self, crash: bool) {
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
            .map(|(r, (lid, token, h, ttl, owned))| {
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
                    },
                )
            })
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

// ---- the property ----------------------------------------------------------------------------

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut rig = Rig::new(limits());
    let mut model = Model::new(limits());
    let mut seen_leases: Vec<LeaseId> = Vec::new();
    let mut last_granted: Option<FencingToken> = None;
    for (i, step) in steps.into_iter().enumerate() {
        let mut fx_core = Vec::new();
        let mut fx_model = Vec::new();
        let now = rig.now;
        let current = |m: &Model, r: &str| m.leases.get(r).map(|l| l.lease_id);
        let pick_lease = |m: &Model, r: &str, pick: usize, seen: &[LeaseId]| match current(m, r) {
            Some(l) if pick % 2 == 0 || seen.is_empty() => l,
            _ if seen.is_empty() => lease_id(999_999),
            _ => seen[pick / 2 % seen.len()],
        };
        match &step {
            Step::Acquire {
                resource,
                holder: h,
                request,
                owner,
                ttl_ms,
                wait_ms,
            } => {
                let r = RESOURCES[*resource];
                let h = format!("c{h}");
                let req = request.map(|q| format!("q{q}"));
                let owner = owner.map(|o| format!("o{o}"));
                let ids = (req.as_deref(), owner.as_deref());
                let core = rig.acquire(r, &h, ids, *ttl_ms, *wait_ms, &mut fx_core);
                let model = model.acquire(r, h, (req, owner), *ttl_ms, *wait_ms, &mut fx_model);
                prop_assert_eq!(core, model, "step {}: {:?}", i, step);
            }
            Step::AcquireAll {
                resources,
                holder: h,
                request,
                ttl_ms,
            } => {
                let set: Vec<&str> = resources.iter().map(|&r| RESOURCES[r]).collect();
                let before: Vec<Option<LeaseId>> = set.iter().map(|r| current(&model, r)).collect();
                let req = AcquireAllRequest {
                    resources: set.iter().map(|r| name(r)).collect(),
                    request_id: request
                        .map(|q| RequestId::new(&format!("q{q}"), &rig.limits).unwrap()),
                    holder: holder(&format!("c{h}")),
                    ttl_ms: *ttl_ms,
                };
                let core = rig.core.acquire_all(now, req, &mut fx_core);
                let req = request.map(|q| format!("q{q}"));
                let ours = model.acquire_all(&set, format!("c{h}"), req, *ttl_ms, &mut fx_model);
                prop_assert_eq!(&core, &ours, "step {}: {:?}", i, step);
                // All or none: every member held by its new lease, or nothing of the set
                // changed hands (a member's lease may only have expired on the way).
                match core {
                    Ok(AcquireAllOutcome::Granted(grants)) => {
                        for (g, r) in grants.iter().zip(&set) {
                            prop_assert_eq!(current(&model, r), Some(g.lease_id));
                        }
                    }
                    _ => {
                        for (was, r) in before.iter().zip(&set) {
                            let now_held = current(&model, r);
                            prop_assert!(
                                now_held.is_none() || now_held == *was,
                                "step {}: {} changed hands",
                                i,
                                r
                            );
                        }
                    }
                }
            }
            Step::Renew { resource, pick } => {
                let r = RESOURCES[*resource];
                let lid = pick_lease(&model, r, *pick, &seen_leases);
                let core = rig.core.renew(now, &name(r), lid, &mut fx_core);
                let model = model.renew(r, lid, &mut fx_model);
                prop_assert_eq!(core, model, "step {}: {:?}", i, step);
            }
            Step::Release { resource, pick } => {
                let r = RESOURCES[*resource];
                let lid = pick_lease(&model, r, *pick, &seen_leases);
                let core = rig.core.release(now, &name(r), lid, &mut fx_core);
                let model = model.release(r, lid, &mut fx_model);
                prop_assert_eq!(core, model, "step {}: {:?}", i, step);
            }
            Step::Cancel { pick } => {
                let id = if model.waiters.is_empty() {
                    1_000 + *pick as u64 % 5
                } else {
                    model.waiters[pick % model.waiters.len()].id
                };
                let core = rig.core.cancel(now, WaiterId(id), &mut fx_core);
                let model = model.cancel(id, &mut fx_model);
                prop_assert_eq!(core, model, "step {}: {:?}", i, step);
            }
            Step::Describe { resource } => {
                let r = RESOURCES[*resource];
                let d = rig.core.describe(now, &name(r), &mut fx_core);
                model.advance(now, &mut fx_model);
                prop_assert_eq!(
                    d.held.map(|h| (h.token, h.expires_at, h.holds)),
                    model.leases.get(r).map(|l| (
                        l.token,
                        l.expires,
                        l.owned.as_ref().map_or(1, |o| o.1)
                    ))
                );
                prop_assert_eq!(d.waiters, model.queue_len(r));
            }
            Step::Advance { ms } => {
                rig.now += ms;
                rig.core.tick(rig.now, &mut fx_core);
                model.advance(rig.now, &mut fx_model);
            }
            Step::Restart { crash } => {
                rig.restart(*crash);
                model.restart(*crash);
            }
        }
        prop_assert_eq!(&fx_core, &fx_model, "effects of step {}: {:?}", i, step);
        rig.persist(&fx_core);
        let persisted = fx_core.iter().filter_map(|e| match e {
            Effect::Persist(op) => Some(op.parts()),
            _ => None,
        });
        for op in persisted.flatten() {
            if let Op::Grant(rec) = op {
                prop_assert!(
                    Some(rec.token) > last_granted,
                    "token {} after {:?}",
                    rec.token,
                    last_granted
                );
                last_granted = Some(rec.token);
                seen_leases.push(rec.lease_id);
            }
        }
        let stats = rig.core.stats();
        prop_assert_eq!(stats.leases, model.leases.len());
        prop_assert_eq!(stats.waiters, model.waiters.len());
        prop_assert_eq!(stats.requests, model.requests.len());
        prop_assert_eq!(rig.core.last_token(), model.last_token);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn core_matches_the_reference_model(steps in proptest::collection::vec(step(), 1..120)) {
        run(steps)?;
    }
}
