//! What the core asks to be persisted, and what it is rebuilt from after a restart.
//!
//! The core emits [`Op`]s in the order it decides them; a store applies them in that order.
//! Only [`Op::Grant`] must be durable before the grant is answered (invariants 2 and 8); the
//! other ops may be synced lazily, because losing one only brings back a lease that then runs
//! out its TTL (a release) or keeps a request id a little longer (a forget). A durable commit
//! makes every op before it durable too, so a store never holds a lease whose release was
//! decided before a later grant of the same resource.

use fencing::{FencingToken, LeaseId, ResourceName};

/// One grant as stored: enough to rebuild the lease and to answer a retried request id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    pub resource: ResourceName,
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub holder: String,
    pub ttl_ms: u64,
    pub request_id: Option<String>,
    /// Set when the grant named an owner: the lease is reentrant.
    pub reentrant: Option<Reentrant>,
    /// Set for a semaphore's permit (`resource` is the permit's name, see `permits`): how
    /// many permits the semaphore has. Recovery rebuilds the semaphore from it, so that its
    /// number of permits stays fixed across a restart.
    pub permits: Option<u32>,
    /// Set for a read-write lock's lease: its writer's (on the lock's name) or a reader's (on
    /// a reader's slot, see `fencing::reader`). Recovery rebuilds the lock from it, so that a
    /// writer stays a writer, not an exclusive lock, across a restart.
    pub rw: Option<RwRole>,
}

/// Which side of a read-write lock a lease holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RwRole {
    Read,
    Write,
}

/// The reentrant part of a lease: who owns it, how many times it is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reentrant {
    pub owner: String,
    /// 1 ..= `limits::HOLDS_MAX`; 1 at the grant.
    pub holds: u32,
}

impl LeaseRecord {
    /// The record a store remembers under `request_id`: the grant a retry is answered with,
    /// without the holds (they are the lease's, and counted there while it is held), a
    /// permit's count (the semaphore's, needed only while the permit is held) or a
    /// read-write role (the lock's, likewise).
    pub fn remembered_as(&self, request_id: &str) -> LeaseRecord {
        LeaseRecord {
            request_id: Some(request_id.to_string()),
            reentrant: None,
            permits: None,
            rw: None,
            ..self.clone()
        }
    }
}

/// A change to persisted state, in decision order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A new lease. The store must hold no lease of the resource, `token` must be above every
    /// token stored before (it becomes the high-water), and when the record has a request id,
    /// it is remembered under that id too. Must be durable before the grant is answered.
    Grant(LeaseRecord),
    /// The lease ended (released or expired). It must be the stored lease of the resource.
    Remove {
        resource: ResourceName,
        lease_id: LeaseId,
    },
    /// The request id's retention ended: forget it.
    ForgetRequest { request_id: String },
    /// The owner of the reentrant lease of `resource` re-entered it: it holds it `holds`
    /// times now. It must be the stored lease (the core emits it only for reentrant ones).
    /// When `request_id` is set, the store remembers the lease's record under it too
    /// ([`LeaseRecord::remembered_as`]), as for a grant: a retried re-entry is answered as a
    /// duplicate, even after the lease has ended. Must be durable before the re-entry is
    /// answered: a lost one would let an inner release end a lease its outer holder still
    /// counts on.
    Reenter {
        resource: ResourceName,
        lease_id: LeaseId,
        holds: u32,
        request_id: Option<String>,
    },
    /// A hold of the reentrant lease of `resource` was released; `holds` (at least 1) are
    /// left. It must be the stored lease. Lazily synced: a lost one only keeps the lease held
    /// until its TTL runs out.
    Unhold {
        resource: ResourceName,
        lease_id: LeaseId,
        holds: u32,
    },
    /// Grants that land together or not at all: the leases of one atomic AcquireAll. Only
    /// [`Op::Grant`]s, at least one, never nested; each part's preconditions are a grant's,
    /// checked in order. A store commits the op in one transaction and never splits it (the
    /// journal writes it in one record, the etcd store in one transaction), so after a crash
    /// either every lease of the set is stored or none is. Must be durable before the grants
    /// are answered.
    Atomic(Vec<Op>),
}

impl Op {
    /// A stored lease record as a `Reenter` or `Unhold` leaves it (other ops, and a record
    /// without a reentrant part, are left as they are).
    pub fn apply_holds(&self, rec: &mut LeaseRecord) {
        let Some(r) = rec.reentrant.as_mut() else {
            return;
        };
        match self {
            Op::Reenter { holds, .. } | Op::Unhold { holds, .. } => r.holds = *holds,
            _ => {}
        }
    }

    /// Whether the op must be on disk before the decision it records is made known.
    pub fn needs_sync(&self) -> bool {
        matches!(self, Op::Grant(_) | Op::Reenter { .. } | Op::Atomic(_))
    }

    /// The ops this one applies, in order: an [`Op::Atomic`]'s parts, or the op itself. A
    /// store applies these; only its commit has to know that an atomic op is one unit.
    pub fn parts(&self) -> &[Op] {
        match self {
            Op::Atomic(parts) => parts,
            one => std::slice::from_ref(one),
        }
    }
}

/// Everything a store hands back on open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The highest token ever granted (`None` for a new store). Never goes down, even when
    /// every lease has been removed: it is what keeps tokens monotone across restarts.
    pub last_token: Option<FencingToken>,
    /// Leases that were granted and not removed, in no particular order.
    pub leases: Vec<LeaseRecord>,
    /// Remembered request ids with their grants (records whose `request_id` is set).
    pub requests: Vec<LeaseRecord>,
}
