//! The stored state as lockd reads it back from etcd: the high-water and the records, by key.
//! Built by a full read (a new leader's load) or kept current from a watch ([`Warm`]: a
//! follower's copy, so that it can take over without reading everything).

use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use lockd_store::StoreError;
pub use lockd_store_kv::Stored;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Cluster;
use crate::keys::Keys;

/// Keys read per page when the state is read (about 3 MiB of records with the default
/// limits, 30 MiB at most).
const LOAD_PAGE: i64 = 10_000;

/// The largest page answer accepted (tonic's default of 4 MiB is too small for the longest
/// names, holders and request ids the limits allow).
const LOAD_PAGE_BYTES: usize = 64 << 20;

/// Takes the value of `key` into `stored` (keys lockd keeps no record under are ignored).
fn put(stored: &mut Stored, keys: &Keys, key: &str, value: &[u8]) -> Result<(), StoreError> {
    match keys.parse(key) {
        Some(k) => stored.put(&k?, key, value),
        None => Ok(()),
    }
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
            put(&mut stored, &self.keys, hw_key, kv.value())?;
        }
        let (locks, requests) = tokio::try_join!(
            self.range(self.keys.locks(), revision),
            self.range(self.keys.requests(), revision)
        )?;
        for (key, value) in locks.iter().chain(requests.iter()) {
            put(&mut stored, &self.keys, key, value)?;
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
                    EventType::Put => put(stored, &self.keys, key, kv.value())?,
                    EventType::Delete => {
                        if let Some(Ok(k)) = self.keys.parse(key) {
                            stored.delete(&k);
                        }
                    }
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
