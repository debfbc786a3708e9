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

use fencing::ResourceName;
pub use lockd_store_kv::Key;
pub use lockd_store_kv::records::{
    LeaderRecord, LockRecord, ReentrantRecord, RequestRecord, RwSide,
};

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

    /// The key of a record's place.
    pub fn name(&self, key: &Key) -> String {
        match key {
            Key::HighWater => self.high_water.clone(),
            Key::Lock(resource) => self.lock(resource.as_str()),
            Key::Request(id) => self.request(id),
        }
    }

    /// The record's place `key` is (`None`: a key lockd keeps no record under).
    pub fn parse(&self, key: &str) -> Option<Result<Key, lockd_store::StoreError>> {
        if key == self.high_water {
            Some(Ok(Key::HighWater))
        } else if let Some(resource) = key.strip_prefix(self.locks.as_str()) {
            Some(
                ResourceName::new(resource)
                    .map(Key::Lock)
                    .map_err(|e| lockd_store::StoreError::Corrupt(format!("{key}: {e}"))),
            )
        } else {
            key.strip_prefix(self.requests.as_str())
                .map(|id| Ok(Key::Request(id.to_string())))
        }
    }
}
