//! Where lockd keeps its state in etcd, under one prefix (`/lockd` by default). Everything is
//! readable with `etcdctl get --prefix /lockd`:
//!
//! | key | value | etcd lease |
//! |---|---|---|
//! | `{p}/leader` | [`LeaderRecord`] as JSON: who leads, and where to reach it | the leader's leadership lease |
//! | `{p}/high-water` | the highest token ever granted, decimal | none |
//! | `{p}/batch` | the last committed batch, `{term revision}:{store nonce}:{number}` (it orders one term's batches: each is conditional on the one before) | none |
//! | `{p}/locks/{resource}` | [`LockRecord`] as JSON: the lease held on the resource | none |
//! | `{p}/requests/{request_id}` | [`RequestRecord`] as JSON: the grant a request id got | none |
//!
//! Only the leader writes, and every write of the leader is a transaction conditional on
//! `{p}/leader` being its own key (its create revision). Locks carry no etcd lease: the
//! leader's core decides expiry, and a new leader gives every stored lock a full TTL. Waiters
//! are not stored: they live in the leader's memory, with the calls that wait.
//!
//! The records hold the lease id, which is the holder's capability to renew and release:
//! whoever may read this prefix may act as any holder (give etcd access to lockd alone).

use serde::{Deserialize, Serialize};

/// The keys under one prefix, computed once (they are looked up for every watched change and
/// every key of a full read).
pub struct Keys {
    prefix: String,
    leader: String,
    high_water: String,
    batch: String,
    locks: String,
    requests: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        let prefix = prefix.trim_end_matches('/').to_string();
        Keys {
            leader: format!("{prefix}/leader"),
            high_water: format!("{prefix}/high-water"),
            batch: format!("{prefix}/batch"),
            locks: format!("{prefix}/locks/"),
            requests: format!("{prefix}/requests/"),
            prefix,
        }
    }

    /// The prefix, without a trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn leader(&self) -> &str {
        &self.leader
    }

    pub fn high_water(&self) -> &str {
        &self.high_water
    }

    /// The last committed batch: every batch of a term is conditional on its mod revision
    /// being that of the batch before, so a late attempt of an earlier batch changes nothing.
    pub fn batch(&self) -> &str {
        &self.batch
    }

    /// The prefix of every lock key.
    pub fn locks(&self) -> &str {
        &self.locks
    }

    pub fn lock(&self, resource: &str) -> String {
        format!("{}{resource}", self.locks)
    }

    /// The prefix of every request record.
    pub fn requests(&self) -> &str {
        &self.requests
    }

    pub fn request(&self, request_id: &str) -> String {
        format!("{}{request_id}", self.requests)
    }
}

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

/// The leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// Random per process start: tells two lockd processes apart even on one address.
    pub id: String,
    /// The gRPC endpoint followers forward to, e.g. `http://10.0.0.5:7420`.
    pub address: String,
    /// When it started leading (Unix ms), for operators.
    pub since_unix_ms: u64,
}
