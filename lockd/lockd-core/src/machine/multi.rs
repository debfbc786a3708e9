//! The atomic AcquireAll: a set of free resources granted in one decision and one commit, or
//! none of them.
//!
//! - Try-only: a set waits for nothing (a waiting set would hold some resources while it waits
//!   for others, which is the deadlock the ordered helper of the SDK avoids on the client).
//! - Each member gets its own lease and token, issued in the order the set names them, and the
//!   grants reach the store as one [`Op::Atomic`]: after a crash every lease of the set is
//!   stored, or none is.
//! - A request id names the whole set. Member `k` is remembered under
//!   [`RequestId::member`]`(k)`, so a retry finds every lease of the set, held or not, as a
//!   single Acquire's retry finds its one (invariant 6); a set whose members are not all
//!   remembered as this set is a reused request id, never a second grant.
//! - Set leases are not reentrant. A member held by anyone, the caller included, makes the set
//!   busy.

use std::collections::HashSet;

use fencing::{FencingToken, ResourceName};

use super::semaphore::LockKind;
use super::{Core, Counted};
use crate::error::{AcquireError, InvalidArgument};
use crate::limits::SET_MAX;
use crate::outcome::{Busy, Effect, Grant};
use crate::persist::Op;
use crate::tenants::TenantIx;
use crate::types::{Holder, Millis, RequestId};

/// An AcquireAll whose text fields have been validated by the caller (the set itself is
/// checked here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireAllRequest {
    pub resources: Vec<ResourceName>,
    pub request_id: Option<RequestId>,
    pub holder: Holder,
    /// 0 = the default TTL; every lease of the set gets the same.
    pub ttl_ms: u64,
}

/// The answer to an AcquireAll that was served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireAllOutcome {
    /// Every resource, in the order asked, with a new lease each. The driver must make the
    /// `Op::Atomic` effect durable before answering.
    Granted(Vec<Grant>),
    /// A retry of a request id that was granted before: the original grants in the order
    /// asked, each with whether it is still the current lease of its resource.
    Duplicate(Vec<(Grant, bool)>),
    /// A member is held (the first one in the order asked): nothing was granted.
    Busy { resource: ResourceName, busy: Busy },
}

impl Core {
    /// Asks for the locks of every resource of a set at once: all granted, or none.
    pub fn acquire_all(
        &mut self,
        now: Millis,
        req: AcquireAllRequest,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireAllOutcome, AcquireError> {
        self.advance(now, fx);
        let ttl_ms = self.limits.ttl(req.ttl_ms)?;
        check_set(&req.resources)?;
        if let Some(id) = &req.request_id {
            if let Some(outcome) = self.duplicate_set(id, &req.resources) {
                return outcome;
            }
            if let Some(w) = self.waiting_requests.get(id) {
                return Err(AcquireError::RequestIdReused {
                    request_id: id.as_str().to_string(),
                    original: self.waiters[w].resource.clone(),
                    requested: req.resources[0].clone(),
                });
            }
        }
        let owners: Vec<Option<TenantIx>> = req.resources.iter().map(|r| self.owner(r)).collect();
        let mut tenants: Vec<TenantIx> = owners.iter().flatten().copied().collect();
        tenants.sort_unstable();
        tenants.dedup();
        for &t in &tenants {
            self.take_call(Some(t))?;
        }
        for resource in &req.resources {
            if let Some(held_as) = self.held_as(resource)
                && held_as != LockKind::Exclusive
            {
                return Err(AcquireError::KindMismatch {
                    resource: resource.clone(),
                    held_as: held_as.to_string(),
                    asked_as: LockKind::Exclusive.to_string(),
                });
            }
            if let Some(busy) = self.busy(resource) {
                return Ok(AcquireAllOutcome::Busy {
                    resource: resource.clone(),
                    busy,
                });
            }
        }
        self.check_set_room(&req, &owners, &tenants)?;
        // Every token the set needs must exist before the first is issued: a set is never
        // granted in part.
        let mut last = self.last_token;
        for _ in &req.resources {
            last = Some(match last {
                None => FencingToken::MIN,
                Some(t) => t.next().ok_or(AcquireError::TokensExhausted)?,
            });
        }
        let start = fx.len();
        let mut grants = Vec::with_capacity(req.resources.len());
        for (k, resource) in req.resources.iter().enumerate() {
            let request = req.request_id.as_ref().map(|id| id.member(k));
            grants.push(self.grant(
                resource,
                request,
                req.holder.clone(),
                super::Kind::Lock(None),
                ttl_ms,
                fx,
            )?);
        }
        // `grant` emits exactly one effect, its `Op::Grant`: the set's become one atomic op.
        let parts = fx
            .drain(start..)
            .map(|e| match e {
                Effect::Persist(op @ Op::Grant(_)) => op,
                other => unreachable!("a grant emits only its Op::Grant, not {other:?}"),
            })
            .collect();
        fx.push(Effect::Persist(Op::Atomic(parts)));
        Ok(AcquireAllOutcome::Granted(grants))
    }

    /// The original answer to a retried set, if its request id is remembered: every member
    /// must be remembered as this set names it, else the id was used for another request.
    fn duplicate_set(
        &self,
        id: &RequestId,
        resources: &[ResourceName],
    ) -> Option<Result<AcquireAllOutcome, AcquireError>> {
        let first = self.leases.remembered(id)?;
        let is_set = self.leases.remembered(&id.member(1)).is_some();
        let reused = |original: ResourceName, requested: &ResourceName| {
            Some(Err(match is_set {
                true => self.set_reused(id),
                // The id is a single Acquire's (or a set of one's).
                false => AcquireError::RequestIdReused {
                    request_id: id.as_str().to_string(),
                    original,
                    requested: requested.clone(),
                },
            }))
        };
        let mut grants = Vec::with_capacity(resources.len());
        for (k, resource) in resources.iter().enumerate() {
            let rem = match k {
                0 => first,
                k => match self.leases.remembered(&id.member(k)) {
                    Some(rem) => rem,
                    // The original named fewer resources (or was a single Acquire).
                    None => return reused(first.name(), resource),
                },
            };
            if rem.name_str() != resource.as_str() {
                return reused(rem.name(), resource);
            }
            let current = self.leases.current(rem);
            grants.push((
                Grant {
                    resource: resource.clone(),
                    lease_id: rem.lease_id,
                    token: rem.token,
                    ttl_ms: rem.ttl_ms(),
                    expires_at: current.map_or(self.now, |l| l.expires_at),
                    holds: 1,
                },
                current.is_some(),
            ));
        }
        // The original named more resources than this retry does.
        if let Some(more) = self.leases.remembered(&id.member(resources.len())) {
            return reused(more.name(), &resources[0]);
        }
        Some(Ok(AcquireAllOutcome::Duplicate(grants)))
    }

    /// The refusal of an Acquire whose request id names an AcquireAll's set of more than one
    /// resource (a set of one is an Acquire by another name): whichever member it names, the
    /// id is another request's.
    pub(super) fn names_a_set(&self, id: &RequestId) -> Option<AcquireError> {
        self.leases.remembered(&id.member(1))?;
        Some(self.set_reused(id))
    }

    /// The refusal of a reuse of `id`, which names a set: with its members that are
    /// remembered, in the set's order.
    fn set_reused(&self, id: &RequestId) -> AcquireError {
        let mut set = Vec::new();
        for k in 0..=SET_MAX {
            match self.leases.remembered(&id.member(k)) {
                Some(m) => set.push(m.name()),
                None if k > 0 => break,
                None => {}
            }
        }
        AcquireError::SetIdReused {
            request_id: id.as_str().to_string(),
            set,
        }
    }

    /// Whether lockd, and each tenant of the set, can take every lease (and request id) of
    /// the set; also that no member's request id is still remembered (a set whose first
    /// member was forgotten before the others is not granted again).
    fn check_set_room(
        &self,
        req: &AcquireAllRequest,
        owners: &[Option<TenantIx>],
        tenants: &[TenantIx],
    ) -> Result<(), AcquireError> {
        let n = req.resources.len();
        if self.leases.held_count() + n > self.limits.leases_max {
            return Err(AcquireError::LeasesExhausted {
                max: self.limits.leases_max,
            });
        }
        let of = |t: TenantIx| owners.iter().filter(|&&o| o == Some(t)).count();
        for &t in tenants {
            self.check_quota(Some(t), Counted::Leases, of(t))?;
        }
        let Some(id) = &req.request_id else {
            return Ok(());
        };
        if self.leases.remembered_count() + n > self.limits.requests_max {
            return Err(AcquireError::RequestsExhausted {
                max: self.limits.requests_max,
            });
        }
        for &t in tenants {
            self.check_quota(Some(t), Counted::Requests, of(t))?;
        }
        if (1..=SET_MAX).any(|k| self.leases.remembered(&id.member(k)).is_some()) {
            return Err(self.set_reused(id));
        }
        Ok(())
    }
}

/// A set is 1 ..= [`SET_MAX`] distinct resources.
fn check_set(resources: &[ResourceName]) -> Result<(), InvalidArgument> {
    if resources.is_empty() {
        return Err(InvalidArgument::Set(format!(
            "the set names no resource; name 1 ..= {SET_MAX}"
        )));
    }
    if resources.len() > SET_MAX {
        return Err(InvalidArgument::Set(format!(
            "the set names {} resources, more than the {SET_MAX} one AcquireAll takes; take larger sets in order (Client::acquire_ordered, lockctl run --lock)",
            resources.len()
        )));
    }
    if let Some((i, reserved)) = resources
        .iter()
        .enumerate()
        .find_map(|(i, r)| Some((i, super::semaphore::reserved(r)?)))
    {
        return Err(InvalidArgument::Set(format!("resources[{i}]: {reserved}")));
    }
    let mut seen = HashSet::with_capacity(resources.len());
    if let Some(twice) = resources.iter().find(|r| !seen.insert(r.as_str())) {
        return Err(InvalidArgument::Set(format!(
            "the set names {twice} twice; name each resource once"
        )));
    }
    Ok(())
}
