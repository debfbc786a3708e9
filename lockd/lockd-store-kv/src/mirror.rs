//! The leader's mirror of what the store holds, and the changes a batch makes to it.

use std::collections::{BTreeMap, HashMap, HashSet};

use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{Op, Snapshot};
use lockd_store::{StoreError, View};

use crate::records::LockRecord;

/// A record's place, whatever the service calls it (a key, a path).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// The highest token ever granted, as a decimal.
    HighWater,
    /// The lease held on a resource ([`LockRecord`]).
    Lock(ResourceName),
    /// The grant a request id got ([`RequestRecord`](crate::records::RequestRecord)).
    Request(String),
}

/// The value put under a key, or its deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Put(String),
    Delete,
}

impl Change {
    /// Bytes of the value sent.
    pub fn bytes(&self) -> usize {
        match self {
            Change::Put(v) => v.len(),
            Change::Delete => 0,
        }
    }
}

/// A prefix-closed piece of a batch: its ops up to `end` (exclusive), as one change per key
/// (a later change of a key replaces an earlier one).
pub struct Piece {
    pub end: usize,
    pub changes: BTreeMap<Key, Change>,
}

/// What the store holds, as far as the preconditions and the changes need it (the leader is
/// the only writer, so this mirror is exact while its term lasts).
#[derive(Default)]
pub struct Mirror {
    leases: HashMap<ResourceName, LeaseId>,
    /// The stored record of every reentrant lease: a change of its holds rewrites it whole.
    reentrant: HashMap<ResourceName, LockRecord>,
    requests: HashSet<String>,
    last_token: Option<FencingToken>,
}

impl View for Mirror {
    fn lease(&self, resource: &ResourceName) -> Result<Option<LeaseId>, StoreError> {
        Ok(self.leases.get(resource).copied())
    }
    fn has_request(&self, request_id: &str) -> Result<bool, StoreError> {
        Ok(self.requests.contains(request_id))
    }
    fn last_token(&self) -> Result<Option<FencingToken>, StoreError> {
        Ok(self.last_token)
    }
}

impl Mirror {
    /// The mirror of a loaded state.
    pub fn of(snapshot: &Snapshot) -> Mirror {
        Mirror {
            leases: snapshot
                .leases
                .iter()
                .map(|r| (r.resource.clone(), r.lease_id))
                .collect(),
            requests: snapshot
                .requests
                .iter()
                .filter_map(|r| r.request_id.clone())
                .collect(),
            reentrant: snapshot
                .leases
                .iter()
                .filter(|r| r.reentrant.is_some())
                .map(|r| (r.resource.clone(), LockRecord::of(r)))
                .collect(),
            last_token: snapshot.last_token,
        }
    }

    /// The highest token stored.
    pub fn high_water(&self) -> Option<FencingToken> {
        self.last_token
    }

    /// Whether a record is stored under `key` now. The high-water is always stored: a store
    /// writes it when it sets itself up.
    pub fn holds(&self, key: &Key) -> bool {
        match key {
            Key::HighWater => true,
            Key::Lock(resource) => self.leases.contains_key(resource),
            Key::Request(id) => self.requests.contains(id),
        }
    }

    /// Takes in a committed op.
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Atomic(parts) => parts.iter().for_each(|p| self.apply(p)),
            Op::Grant(r) => {
                self.last_token = Some(r.token);
                self.leases.insert(r.resource.clone(), r.lease_id);
                if let Some(id) = &r.request_id {
                    self.requests.insert(id.clone());
                }
                if r.reentrant.is_some() {
                    self.reentrant.insert(r.resource.clone(), LockRecord::of(r));
                }
            }
            Op::Remove { resource, .. } => {
                self.leases.remove(resource);
                self.reentrant.remove(resource);
            }
            Op::ForgetRequest { request_id } => {
                self.requests.remove(request_id);
            }
            Op::Reenter { resource, .. } | Op::Unhold { resource, .. } => {
                if let Some(rec) = self.reentrant.get_mut(resource) {
                    rec.with_holds(op);
                }
                if let Op::Reenter {
                    request_id: Some(id),
                    ..
                } = op
                {
                    self.requests.insert(id.clone());
                }
            }
        }
    }

    /// The next piece of `ops` from `start` that fits one transaction: at most `max_changes`
    /// keys and `max_bytes` of keys (as `key_len` counts them) and values, and at least one op
    /// whatever its size (an atomic op is never split). A grant's lock, request record and
    /// high-water always travel together. The mirror must hold the ops before `start`.
    pub fn piece(
        &self,
        ops: &[Op],
        start: usize,
        max_changes: usize,
        max_bytes: usize,
        key_len: impl Fn(&Key) -> usize,
    ) -> Piece {
        let mut changes = BTreeMap::new();
        let (mut end, mut bytes) = (start, 0);
        while end < ops.len() {
            let mut next = BTreeMap::new();
            self.changes_of(&ops[end], &changes, &mut next);
            let fresh = next.keys().filter(|k| !changes.contains_key(*k)).count();
            let more: usize = next.iter().map(|(k, c)| key_len(k) + c.bytes()).sum();
            if end > start && (changes.len() + fresh > max_changes || bytes + more > max_bytes) {
                break;
            }
            changes.extend(next);
            bytes += more;
            end += 1;
        }
        Piece { end, changes }
    }

    /// The key changes of `op`, into `changes`. `before` holds the changes of the ops before
    /// it in the piece, which the mirror does not show yet.
    fn changes_of(
        &self,
        op: &Op,
        before: &BTreeMap<Key, Change>,
        changes: &mut BTreeMap<Key, Change>,
    ) {
        match op {
            // One op, so one transaction: its grants' keys are distinct (check_batch made
            // sure every part is a grant of another free resource).
            Op::Atomic(parts) => {
                for part in parts {
                    self.changes_of(part, before, changes);
                }
            }
            Op::Grant(r) => {
                let lock = LockRecord::of(r);
                if let Some(id) = &r.request_id {
                    changes.insert(
                        Key::Request(id.clone()),
                        put(&lock.remembered(r.resource.as_str())),
                    );
                }
                changes.insert(Key::Lock(r.resource.clone()), put(&lock));
                changes.insert(Key::HighWater, Change::Put(r.token.get().to_string()));
            }
            Op::Remove { resource, .. } => {
                changes.insert(Key::Lock(resource.clone()), Change::Delete);
            }
            Op::ForgetRequest { request_id } => {
                changes.insert(Key::Request(request_id.clone()), Change::Delete);
            }
            Op::Reenter { resource, .. } | Op::Unhold { resource, .. } => {
                // The record as the batch left it so far: put earlier in this piece, or as
                // the mirror has it (check_batch made sure it is the stored lease).
                let key = Key::Lock(resource.clone());
                let earlier = match before.get(&key) {
                    Some(Change::Put(v)) => serde_json::from_str(v).ok(),
                    _ => None,
                };
                let Some(mut rec) = earlier.or_else(|| self.reentrant.get(resource).cloned())
                else {
                    return;
                };
                rec.with_holds(op);
                if let Op::Reenter {
                    request_id: Some(id),
                    ..
                } = op
                {
                    // Remembered as a grant's is: a retried re-entry is a duplicate.
                    changes.insert(
                        Key::Request(id.clone()),
                        put(&rec.remembered(resource.as_str())),
                    );
                }
                changes.insert(key, put(&rec));
            }
        }
    }
}

fn put(record: &impl serde::Serialize) -> Change {
    Change::Put(serde_json::to_string(record).expect("a record serialises"))
}
