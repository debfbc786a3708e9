//! Where things live in etcd, under one prefix (`/lockd` by default):
//!
//! | key | value | etcd lease |
//! |---|---|---|
//! | `{p}/locks/{resource}` | the lease id (32 hex digits) | the grant's own lease (TTL = the lock's TTL) |
//! | `{p}/meta/{resource}` | [`Meta`] as JSON | the grant's lease |
//! | `{p}/waiters/{resource}#{name}` | [`Waiter`] as JSON | the session lease of the lockd instance serving the wait |
//! | `{p}/requests/{request_id}` | [`RequestRecord`] as JSON | a retention lease (at least `request_retention_ms`) |
//! | `{p}/token-offset` | decimal | none |
//!
//! The lock and meta keys are written in one transaction, so their create revision is the
//! grant's revision; the token is that revision plus the offset recorded in the meta (and in
//! the request record). Resource names never contain `#`, so a resource's waiter prefix
//! `{p}/waiters/{resource}#` cannot match another resource's waiters.

use serde::{Deserialize, Serialize};

pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    pub fn lock(&self, resource: &str) -> String {
        format!("{}/locks/{resource}", self.prefix)
    }

    pub fn meta(&self, resource: &str) -> String {
        format!("{}/meta/{resource}", self.prefix)
    }

    /// The prefix of a resource's waiters.
    pub fn waiters(&self, resource: &str) -> String {
        format!("{}/waiters/{resource}#", self.prefix)
    }

    pub fn waiter(&self, resource: &str, name: &str) -> String {
        format!("{}{name}", self.waiters(resource))
    }

    pub fn request(&self, request_id: &str) -> String {
        format!("{}/requests/{request_id}", self.prefix)
    }

    pub fn offset(&self) -> String {
        format!("{}/token-offset", self.prefix)
    }
}

/// What is kept next to a lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub holder: String,
    pub ttl_ms: u64,
    /// Added to the grant's revision to make the token.
    pub offset: u64,
    /// The etcd lease the lock lives under (renewals keep it alive; a release revokes it).
    pub etcd_lease: i64,
}

/// A queued Acquire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Waiter {
    pub holder: String,
}

/// A granted request id, for retries (invariant 6).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestRecord {
    pub resource: String,
    pub lease_id: String,
    pub ttl_ms: u64,
    pub offset: u64,
}
