//! A store in memory, for tests and simulations.
//!
//! Handles made by [`MemoryStore::reopen`] share the same data, like a server restarting on the
//! same directory. Dropping a handle is a clean close: it flushes, as the redb store does.
//! [`MemoryStore::crash`] models a power cut: batches committed since the last sync are lost,
//! nothing else.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{LeaseRecord, Op, Snapshot};

use crate::check::{View, check_batch};
use crate::{Store, StoreError};

#[derive(Clone, Default)]
struct Tables {
    last_token: Option<FencingToken>,
    leases: BTreeMap<ResourceName, LeaseRecord>,
    requests: BTreeMap<String, LeaseRecord>,
}

impl Tables {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Atomic(parts) => parts.iter().for_each(|p| self.apply(p)),
            Op::Grant(rec) => {
                self.last_token = Some(rec.token);
                self.leases.insert(rec.resource.clone(), rec.clone());
                if let Some(id) = &rec.request_id {
                    self.requests.insert(id.clone(), rec.remembered_as(id));
                }
            }
            Op::Remove { resource, .. } => {
                self.leases.remove(resource);
            }
            Op::ForgetRequest { request_id } => {
                self.requests.remove(request_id);
            }
            Op::Reenter { resource, .. } | Op::Unhold { resource, .. } => {
                if let Some(rec) = self.leases.get_mut(resource) {
                    op.apply_holds(rec);
                    if let Op::Reenter {
                        request_id: Some(id),
                        ..
                    } = op
                    {
                        self.requests.insert(id.clone(), rec.remembered_as(id));
                    }
                }
            }
        }
    }
}

impl View for Tables {
    fn lease(&self, resource: &ResourceName) -> Result<Option<LeaseId>, StoreError> {
        Ok(self.leases.get(resource).map(|r| r.lease_id))
    }
    fn has_request(&self, request_id: &str) -> Result<bool, StoreError> {
        Ok(self.requests.contains_key(request_id))
    }
    fn last_token(&self) -> Result<Option<FencingToken>, StoreError> {
        Ok(self.last_token)
    }
}

#[derive(Default)]
struct Shared {
    /// What survives a crash.
    durable: Tables,
    /// What a reader sees: `durable` plus `unsynced`.
    latest: Tables,
    unsynced: Vec<Op>,
}

/// See the module documentation.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Mutex<Shared>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Another handle on the same data, as after a clean restart.
    pub fn reopen(&self) -> MemoryStore {
        self.clone()
    }

    /// Loses every batch committed since the last sync, as a crash may.
    pub fn crash(&self) {
        let mut s = self.shared.lock().expect("memory store lock");
        s.latest = s.durable.clone();
        s.unsynced.clear();
    }

    /// Makes every committed batch durable.
    pub fn flush(&self) {
        let mut s = self.shared.lock().expect("memory store lock");
        let Shared {
            durable, unsynced, ..
        } = &mut *s;
        for op in unsynced.drain(..) {
            durable.apply(&op);
        }
    }
}

impl Drop for MemoryStore {
    fn drop(&mut self) {
        // A poisoned lock means a test already failed; do not panic again while unwinding.
        if !std::thread::panicking() {
            self.flush();
        }
    }
}

impl Store for MemoryStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let s = self.shared.lock().expect("memory store lock");
        Ok(Snapshot {
            last_token: s.latest.last_token,
            leases: s.latest.leases.values().cloned().collect(),
            requests: s.latest.requests.values().cloned().collect(),
        })
    }

    fn commit(&mut self, ops: &[Op], sync: bool) -> Result<(), StoreError> {
        let mut s = self.shared.lock().expect("memory store lock");
        check_batch(&s.latest, ops)?;
        for op in ops {
            s.latest.apply(op);
        }
        s.unsynced.extend_from_slice(ops);
        drop(s);
        if sync {
            self.flush();
        }
        Ok(())
    }
}
