//! The stored state as lockd reads it back from etcd: the high-water and the records, by key.
//! Built by a full read (a new leader's load) or kept current from a watch ([`Warm`]: a
//! follower's copy, so that it can take over without reading everything).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use fencing::{FencingToken, ResourceName};
use lockd_core::{LeaseRecord, Snapshot};
use lockd_store::StoreError;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::keys::{Keys, LockRecord, ReentrantRecord, RequestRecord, RwSide};
use crate::{Cluster, decimal};

/// Keys read per page when the state is read (about 3 MiB of records with the default
/// limits, 30 MiB at most).
const LOAD_PAGE: i64 = 10_000;

/// The largest page answer accepted (tonic's default of 4 MiB is too small for the longest
/// names, holders and request ids the limits allow).
const LOAD_PAGE_BYTES: usize = 64 << 20;

/// The records under a prefix, by key, and the stored high-water.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    high_water: u64,
    locks: HashMap<String, LeaseRecord>,
    requests: HashMap<String, LeaseRecord>,
}

impl Stored {
    /// Takes in a key's value (keys lockd does not store records under are ignored).
    pub fn put(&mut self, keys: &Keys, key: &str, value: &[u8]) -> Result<(), StoreError> {
        if key == keys.high_water() {
            self.high_water = decimal(key, value)?;
        } else if let Some(resource) = key.strip_prefix(keys.locks()) {
            let r: LockRecord = parse(key, value)?;
            let record = lease_record(
                key,
                resource,
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
            self.locks.insert(key.to_string(), record);
        } else if let Some(request_id) = key.strip_prefix(keys.requests()) {
            let r: RequestRecord = parse(key, value)?;
            let record = lease_record(
                key,
                &r.resource,
                &r.lease_id,
                r.token,
                r.holder,
                r.ttl_ms,
                Some(request_id.to_string()),
            )?;
            self.requests.insert(key.to_string(), record);
        }
        Ok(())
    }

    pub fn delete(&mut self, keys: &Keys, key: &str) {
        if key == keys.high_water() {
            self.high_water = 0;
        }
        self.locks.remove(key);
        self.requests.remove(key);
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

fn parse<T: serde::de::DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(value).map_err(|e| {
        StoreError::Corrupt(format!(
            "{key} does not hold what lockd writes ({e}): {:?}",
            String::from_utf8_lossy(value)
        ))
    })
}

fn lease_record(
    key: &str,
    resource: &str,
    lease_id: &str,
    token: u64,
    holder: String,
    ttl_ms: u64,
    request_id: Option<String>,
) -> Result<LeaseRecord, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("{key}: {what}"));
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

/// The end of the key range holding every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Cluster {
    /// Reads the whole state at one revision (the locks and the request records side by side,
    /// page by page); returns it with that revision.
    pub async fn read_state(&self) -> Result<(Stored, i64), StoreError> {
        let hw_key = self.keys.high_water();
        let first = self
            .get("reading the token high-water", hw_key.to_string(), None)
            .await?;
        let revision = first.header().map_or(0, |h| h.revision());
        let mut stored = Stored::default();
        if let Some(kv) = first.kvs().first() {
            stored.put(&self.keys, hw_key, kv.value())?;
        }
        let (locks, requests) = tokio::try_join!(
            self.range(self.keys.locks(), revision),
            self.range(self.keys.requests(), revision)
        )?;
        for (key, value) in locks.iter().chain(requests.iter()) {
            stored.put(&self.keys, key, value)?;
        }
        Ok((stored, revision))
    }

    /// Every key under `prefix` at `revision`, page by page.
    async fn range(
        &self,
        prefix: &str,
        revision: i64,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_string();
        let mut out = Vec::new();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LOAD_PAGE)
                .with_revision(revision);
            let r = self
                .etcd
                .call(self.deadline(), "loading the state", |c| {
                    let (from, options) = (from.clone(), options.clone());
                    async move {
                        let mut kv = c.kv_client().max_decoding_message_size(LOAD_PAGE_BYTES);
                        kv.get(from, Some(options)).await
                    }
                })
                .await?;
            for kv in r.kvs() {
                let key = kv.key_str().map_err(|_| {
                    StoreError::Corrupt(format!("a key under {prefix} is not UTF-8"))
                })?;
                out.push((key.to_string(), kv.value().to_vec()));
            }
            match (r.more(), r.kvs().last()) {
                (true, Some(last)) => {
                    let mut next = last.key().to_vec();
                    next.push(0);
                    from = String::from_utf8(next).expect("a UTF-8 key plus NUL");
                }
                _ => return Ok(out),
            }
        }
    }

    /// Keeps `warm` equal to the stored state: a full read, then every change from a watch of
    /// the prefix. Returns when the watch ends or fails (the caller starts it again) or
    /// `warm` is dropped by the instance taking over.
    pub async fn keep_warm(&self, warm: &Warm) -> Result<(), StoreError> {
        let (stored, revision) = self.read_state().await?;
        warm.set(stored, revision);
        let prefix = format!("{}/", self.keys.prefix());
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let mut client = self.etcd.any();
        let mut stream = client
            .watch(prefix, Some(options))
            .await
            .map_err(|e| StoreError::Unavailable(format!("watching the state: {e}")))?;
        loop {
            let Some(r) = stream
                .message()
                .await
                .map_err(|e| StoreError::Unavailable(format!("watching the state: {e}")))?
            else {
                return Ok(());
            };
            if r.canceled() {
                return Err(StoreError::Unavailable(format!(
                    "the watch of the state was cancelled (compacted at {}): {}",
                    r.compact_revision(),
                    r.cancel_reason()
                )));
            }
            let mut state = warm.state.lock().unwrap_or_else(|p| p.into_inner());
            let Some((stored, at)) = state.as_mut() else {
                return Ok(());
            };
            for e in r.events() {
                let Some(kv) = e.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                match e.event_type() {
                    EventType::Put => stored.put(&self.keys, key, kv.value())?,
                    EventType::Delete => stored.delete(&self.keys, key),
                }
                *at = (*at).max(kv.mod_revision());
            }
            let at = *at;
            drop(state);
            warm.seen.send_replace(at);
        }
    }
}

/// A follower's copy of the stored state, and the revision it reflects.
pub struct Warm {
    state: Mutex<Option<(Stored, i64)>>,
    seen: watch::Sender<i64>,
}

impl Default for Warm {
    fn default() -> Warm {
        Warm {
            state: Mutex::new(None),
            seen: watch::channel(0).0,
        }
    }
}

impl Warm {
    fn set(&self, stored: Stored, revision: i64) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some((stored, revision));
        self.seen.send_replace(revision);
    }

    /// The state as of `revision` or later, if the copy gets there within `within`; the copy
    /// is given up either way (the leader does not keep one).
    pub async fn take_at(&self, revision: i64, within: Duration) -> Option<Stored> {
        let mut seen = self.seen.subscribe();
        let deadline = Instant::now() + within;
        let reached = tokio::time::timeout_at(deadline, seen.wait_for(|at| *at >= revision))
            .await
            .is_ok_and(|r| r.is_ok());
        let taken = self.state.lock().unwrap_or_else(|p| p.into_inner()).take();
        match taken {
            Some((stored, at)) if reached && at >= revision => Some(stored),
            _ => None,
        }
    }
}
