//! The stored state as lockd reads it back: the high-water and the records, by key. Built by
//! a full read (a new leader's load) or kept current from a watch (a follower's warm copy).

use std::collections::HashMap;

use fencing::{FencingToken, ResourceName};
use lockd_core::{LeaseRecord, Snapshot};
use lockd_store::StoreError;

use crate::Key;
use crate::records::{LockRecord, ReentrantRecord, RequestRecord, RwSide};

/// The records read back, by key, and the stored high-water.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    high_water: u64,
    locks: HashMap<ResourceName, LeaseRecord>,
    requests: HashMap<String, LeaseRecord>,
}

impl Stored {
    /// Takes in the value of `key`, read from the service's `name` for it (named in errors).
    pub fn put(&mut self, key: &Key, name: &str, value: &[u8]) -> Result<(), StoreError> {
        match key {
            Key::HighWater => self.high_water = high_water_value(name, value)?,
            Key::Lock(resource) => {
                let r: LockRecord = parse(name, value)?;
                let record = lease_record(
                    name,
                    resource.as_str(),
                    &r.lease_id,
                    r.token,
                    r.holder,
                    r.ttl_ms,
                    r.request_id,
                )?;
                let record = LeaseRecord {
                    reentrant: r.reentrant.as_ref().map(ReentrantRecord::to_core),
                    permits: r.permits,
                    rw: r.rw.map(RwSide::to_core),
                    ..record
                };
                self.locks.insert(resource.clone(), record);
            }
            Key::Request(id) => {
                let r: RequestRecord = parse(name, value)?;
                let record = lease_record(
                    name,
                    &r.resource,
                    &r.lease_id,
                    r.token,
                    r.holder,
                    r.ttl_ms,
                    Some(id.clone()),
                )?;
                self.requests.insert(id.clone(), record);
            }
        }
        Ok(())
    }

    pub fn delete(&mut self, key: &Key) {
        match key {
            Key::HighWater => self.high_water = 0,
            Key::Lock(resource) => {
                self.locks.remove(resource);
            }
            Key::Request(id) => {
                self.requests.remove(id);
            }
        }
    }

    /// The snapshot, and the highest token stored anywhere (the high-water key, or a record).
    pub fn snapshot(&self) -> (Snapshot, u64) {
        let tokens = self.locks.values().chain(self.requests.values());
        let stored = tokens
            .map(|r| r.token.get())
            .fold(self.high_water, u64::max);
        let snapshot = Snapshot {
            last_token: FencingToken::new(stored),
            leases: self.locks.values().cloned().collect(),
            requests: self.requests.values().cloned().collect(),
        };
        (snapshot, stored)
    }
}

/// The high-water stored under `name`: a decimal token (0 for none).
pub fn high_water_value(name: &str, value: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v <= FencingToken::MAX.get())
        .ok_or_else(|| {
            StoreError::Corrupt(format!(
                "{name} does not hold a token (a decimal up to {}): {:?}",
                FencingToken::MAX,
                String::from_utf8_lossy(value)
            ))
        })
}

fn parse<T: serde::de::DeserializeOwned>(name: &str, value: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(value).map_err(|e| {
        StoreError::Corrupt(format!(
            "{name} does not hold what lockd writes ({e}): {:?}",
            String::from_utf8_lossy(value)
        ))
    })
}

fn lease_record(
    name: &str,
    resource: &str,
    lease_id: &str,
    token: u64,
    holder: String,
    ttl_ms: u64,
    request_id: Option<String>,
) -> Result<LeaseRecord, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("{name}: {what}"));
    Ok(LeaseRecord {
        resource: ResourceName::new(resource).map_err(|e| corrupt(e.to_string()))?,
        lease_id: lease_id
            .parse()
            .map_err(|e: fencing::ParseLeaseIdError| corrupt(e.to_string()))?,
        token: FencingToken::new(token).ok_or_else(|| corrupt(format!("token {token}")))?,
        holder,
        ttl_ms,
        request_id,
        reentrant: None,
        permits: None,
        rw: None,
    })
}
