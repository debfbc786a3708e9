//! The records as stored, in JSON (readable with the service's own tools: `etcdctl get`,
//! `zkCli.sh get`). The layout is the same in every store over a key-value service, so that
//! a record means the same wherever it is read.

use lockd_core::LeaseRecord;
use lockd_core::Op;
use serde::{Deserialize, Serialize};

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    /// 32 hex digits.
    pub lease_id: String,
    pub token: u64,
    pub holder: String,
    pub ttl_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// A reentrant lease's owner and holds (absent for the others, and in records written
    /// before reentrant leases existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reentrant: Option<ReentrantRecord>,
    /// A semaphore's permit: the semaphore's number of permits (absent for the others, and in
    /// records written before semaphores existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// A read-write lock's lease: `read` (a reader, on its slot) or `write` (the writer).
    /// Absent for the others, and in records written before read-write locks existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw: Option<RwSide>,
}

impl LockRecord {
    /// The record of a stored lease.
    pub fn of(r: &LeaseRecord) -> LockRecord {
        LockRecord {
            lease_id: r.lease_id.to_string(),
            token: r.token.get(),
            holder: r.holder.clone(),
            ttl_ms: r.ttl_ms,
            request_id: r.request_id.clone(),
            reentrant: r.reentrant.as_ref().map(ReentrantRecord::of),
            permits: r.permits,
            rw: r.rw.map(RwSide::of),
        }
    }

    /// The record with the holds a `Reenter` or `Unhold` sets (other ops, and a record
    /// without a reentrant part, leave it as it is).
    pub fn with_holds(&mut self, op: &Op) {
        let Some(r) = self.reentrant.as_mut() else {
            return;
        };
        if let Op::Reenter { holds, .. } | Op::Unhold { holds, .. } = op {
            r.holds = *holds;
        }
    }

    /// The request record remembering this grant of `resource`.
    pub fn remembered(&self, resource: &str) -> RequestRecord {
        RequestRecord {
            resource: resource.to_string(),
            lease_id: self.lease_id.clone(),
            token: self.token,
            holder: self.holder.clone(),
            ttl_ms: self.ttl_ms,
        }
    }
}

/// The side of a read-write lock a [`LockRecord`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RwSide {
    Read,
    Write,
}

impl RwSide {
    pub fn of(role: lockd_core::RwRole) -> RwSide {
        match role {
            lockd_core::RwRole::Read => RwSide::Read,
            lockd_core::RwRole::Write => RwSide::Write,
        }
    }

    pub fn to_core(self) -> lockd_core::RwRole {
        match self {
            RwSide::Read => lockd_core::RwRole::Read,
            RwSide::Write => lockd_core::RwRole::Write,
        }
    }
}

/// The reentrant part of a [`LockRecord`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReentrantRecord {
    pub owner: String,
    pub holds: u32,
}

impl ReentrantRecord {
    pub fn of(r: &lockd_core::Reentrant) -> ReentrantRecord {
        ReentrantRecord {
            owner: r.owner.clone(),
            holds: r.holds,
        }
    }

    pub fn to_core(&self) -> lockd_core::Reentrant {
        lockd_core::Reentrant {
            owner: self.owner.clone(),
            holds: self.holds,
        }
    }
}

/// A remembered request id, a grant's or a re-entry's (kept for
/// `limits.request_retention_ms` after the lease ends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub resource: String,
    pub lease_id: String,
    pub token: u64,
    pub holder: String,
    pub ttl_ms: u64,
}

/// The leader of a lockd cluster, as its leadership key or node holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// Random per process start: tells two lockd processes apart even on one address.
    pub id: String,
    /// The gRPC endpoint followers forward to, e.g. `http://10.0.0.5:7420`.
    pub address: String,
    /// When it started leading (Unix ms), for operators.
    pub since_unix_ms: u64,
}
