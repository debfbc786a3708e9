//! The preconditions of a batch, checked the same way by every store before anything of it is
//! applied (so a refused batch changes nothing).

use std::collections::HashMap;

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::Op;

use crate::StoreError;

/// Read access to the state a batch applies to (a store's tables, or a mirror of them).
pub trait View {
    fn lease(&self, resource: &ResourceName) -> Result<Option<LeaseId>, StoreError>;
    fn has_request(&self, request_id: &str) -> Result<bool, StoreError>;
    fn last_token(&self) -> Result<Option<FencingToken>, StoreError>;
}

/// Checks `ops` in order against `view` plus the effects of the ops before each one. Returns
/// the high-water after the batch.
pub fn check_batch(view: &impl View, ops: &[Op]) -> Result<Option<FencingToken>, StoreError> {
    let mut leases: HashMap<&ResourceName, Option<LeaseId>> = HashMap::new();
    let mut requests: HashMap<&str, bool> = HashMap::new();
    let mut last = view.last_token()?;
    for op in ops {
        if let Op::Atomic(parts) = op
            && (parts.is_empty() || !parts.iter().all(|p| matches!(p, Op::Grant(_))))
        {
            return Err(StoreError::AtomicNotGrants);
        }
    }
    for op in ops.iter().flat_map(Op::parts) {
        match op {
            Op::Atomic(_) => unreachable!("parts are never atomic ops"),
            Op::Grant(rec) => {
                let current = match leases.get(&rec.resource) {
                    Some(l) => *l,
                    None => view.lease(&rec.resource)?,
                };
                if current.is_some() {
                    return Err(StoreError::GrantWhileHeld {
                        resource: rec.resource.clone(),
                    });
                }
                if Some(rec.token) <= last {
                    return Err(StoreError::TokenNotIncreasing {
                        token: rec.token,
                        last,
                    });
                }
                last = Some(rec.token);
                leases.insert(&rec.resource, Some(rec.lease_id));
                if let Some(id) = &rec.request_id {
                    remember(view, &mut requests, id)?;
                }
            }
            Op::Remove { resource, lease_id } => {
                let current = match leases.get(resource) {
                    Some(l) => *l,
                    None => view.lease(resource)?,
                };
                if current != Some(*lease_id) {
                    return Err(StoreError::RemoveNotStored {
                        resource: resource.clone(),
                        lease_id: *lease_id,
                    });
                }
                leases.insert(resource, None);
            }
            Op::Reenter {
                resource, lease_id, ..
            }
            | Op::Unhold {
                resource, lease_id, ..
            } => {
                let current = match leases.get(resource) {
                    Some(l) => *l,
                    None => view.lease(resource)?,
                };
                if current != Some(*lease_id) {
                    return Err(StoreError::HoldsNotStored {
                        resource: resource.clone(),
                        lease_id: *lease_id,
                    });
                }
                if let Op::Reenter {
                    request_id: Some(id),
                    ..
                } = op
                {
                    remember(view, &mut requests, id)?;
                }
            }
            Op::ForgetRequest { request_id } => {
                let known = match requests.get(request_id.as_str()) {
                    Some(k) => *k,
                    None => view.has_request(request_id)?,
                };
                if !known {
                    return Err(StoreError::ForgetUnknown {
                        request_id: request_id.clone(),
                    });
                }
                requests.insert(request_id, false);
            }
        }
    }
    Ok(last)
}

/// A grant or re-entry remembers `id`: it must not be remembered already.
fn remember<'a>(
    view: &impl View,
    requests: &mut HashMap<&'a str, bool>,
    id: &'a str,
) -> Result<(), StoreError> {
    let known = match requests.get(id) {
        Some(k) => *k,
        None => view.has_request(id)?,
    };
    if known {
        return Err(StoreError::RequestRemembered {
            request_id: id.to_string(),
        });
    }
    requests.insert(id, true);
    Ok(())
}

/// Ops a store has made durable elsewhere (the redb store's journal) but not yet applied to the
/// tables a [`View`] reads, and what they change there: checking a new batch against
/// [`Pending::over`] the tables is checking it against the tables with these ops applied.
#[derive(Default)]
pub(crate) struct Pending {
    ops: Vec<Op>,
    /// Ops counted as [`Op::parts`].
    parts: usize,
    leases: HashMap<ResourceName, Option<LeaseId>>,
    requests: HashMap<String, bool>,
    last_token: Option<FencingToken>,
}

impl Pending {
    /// Adds `ops`, which [`check_batch`] accepted against [`Pending::over`] the tables.
    pub(crate) fn push(&mut self, ops: &[Op]) {
        for op in ops.iter().flat_map(Op::parts) {
            self.parts += 1;
            match op {
                Op::Atomic(_) => unreachable!("parts are never atomic ops"),
                Op::Grant(rec) => {
                    self.last_token = Some(rec.token);
                    self.leases.insert(rec.resource.clone(), Some(rec.lease_id));
                    if let Some(id) = &rec.request_id {
                        self.requests.insert(id.clone(), true);
                    }
                }
                Op::Remove { resource, .. } => {
                    self.leases.insert(resource.clone(), None);
                }
                Op::ForgetRequest { request_id } => {
                    self.requests.insert(request_id.clone(), false);
                }
                Op::Reenter { request_id, .. } => {
                    if let Some(id) = request_id {
                        self.requests.insert(id.clone(), true);
                    }
                }
                Op::Unhold { .. } => {}
            }
        }
        self.ops.extend_from_slice(ops);
    }

    /// How many ops (counted as parts) are pending.
    pub(crate) fn len(&self) -> usize {
        self.parts
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The pending ops, in order.
    pub(crate) fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// `tables` as they will be once the pending ops are applied to them.
    pub(crate) fn over<'a, V: View>(&'a self, tables: &'a V) -> impl View + 'a {
        Over {
            pending: self,
            tables,
        }
    }
}

struct Over<'a, V> {
    pending: &'a Pending,
    tables: &'a V,
}

impl<V: View> View for Over<'_, V> {
    fn lease(&self, resource: &ResourceName) -> Result<Option<LeaseId>, StoreError> {
        match self.pending.leases.get(resource) {
            Some(lease) => Ok(*lease),
            None => self.tables.lease(resource),
        }
    }
    fn has_request(&self, request_id: &str) -> Result<bool, StoreError> {
        match self.pending.requests.get(request_id) {
            Some(known) => Ok(*known),
            None => self.tables.has_request(request_id),
        }
    }
    fn last_token(&self) -> Result<Option<FencingToken>, StoreError> {
        match self.pending.last_token {
            Some(token) => Ok(Some(token)),
            None => self.tables.last_token(),
        }
    }
}
