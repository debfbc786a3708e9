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
}

impl Op {
    /// Whether the op must be on disk before the decision it records is made known.
    pub fn needs_sync(&self) -> bool {
        matches!(self, Op::Grant(_))
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
