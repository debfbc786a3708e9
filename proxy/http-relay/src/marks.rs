//! The in-memory table of marks: one entry per resource ever fenced, compactly.
//!
//! A million resources must fit in well under the proxy's 150 MB budget, and a general
//! concurrent map costs 126 MiB for that (measured: `DashMap<CompactString, 16 bytes>`, most of
//! it power-of-two slack in its buckets). Here each shard keeps its entries in a vector that
//! grows by a quarter at a time (name inline up to 24 bytes, 16 bytes of state) and indexes them
//! with a hash table of 4-byte positions, so the slack is in the small index. Entries are never
//! removed: marks only rise, they never go away.
//!
//! 64 shards, each behind its own mutex held for a few instructions: requests for different
//! resources rarely meet.

use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use compact_str::CompactString;
use hashbrown::HashTable;

const SHARDS: usize = 64;

/// What the fence keeps per resource.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The mark (0 = none yet) in the low 63 bits; the top bit says it is durable. Tokens never
    /// use the top bit (they are at most `i64::MAX`).
    mark: u64,
    /// In flight with token == the mark.
    pub current: u32,
    /// In flight with a token below the mark (admitted before the last raise).
    pub older: u32,
}

const DURABLE: u64 = 1 << 63;

impl Entry {
    pub fn stored(token: u64) -> Entry {
        Entry {
            mark: token | DURABLE,
            current: 0,
            older: 0,
        }
    }

    pub fn highest(&self) -> u64 {
        self.mark & !DURABLE
    }

    pub fn durable(&self) -> bool {
        self.mark & DURABLE != 0
    }

    /// A new, not yet durable, mark.
    pub fn raise(&mut self, token: u64) {
        self.mark = token;
    }

    /// `token` is stored: the mark is durable if it is still `token` (a higher raise has its own
    /// store request on the way).
    pub fn stored_up_to(&mut self, token: u64) {
        if self.highest() == token {
            self.mark |= DURABLE;
        }
    }
}

#[derive(Default)]
struct Shard {
    index: HashTable<u32>,
    entries: Vec<(CompactString, Entry)>,
}

/// The table is full (`resources_max`).
#[derive(Debug)]
pub(crate) struct Full;

pub(crate) struct MarkTable {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    len: AtomicUsize,
}

impl MarkTable {
    pub fn new() -> MarkTable {
        MarkTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            len: AtomicUsize::new(0),
        }
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn locate(&self, key: &str) -> (u64, &Mutex<Shard>) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[(hash >> 58) as usize % SHARDS])
    }

    /// Runs `f` on the entry of `key`, if there is one.
    pub fn with<R>(&self, key: &str, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let (hash, shard) = self.locate(key);
        let mut guard = shard.lock().expect("mark table shard");
        let s = &mut *guard;
        let at = *s.index.find(hash, |&i| s.entries[i as usize].0 == key)?;
        Some(f(&mut s.entries[at as usize].1))
    }

    /// Runs `f` on the entry of `key`, creating it (empty) if there is none and the table holds
    /// fewer than `max` entries.
    pub fn with_or_insert<R>(
        &self,
        key: &str,
        max: usize,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> Result<R, Full> {
        let (hash, shard) = self.locate(key);
        let mut guard = shard.lock().expect("mark table shard");
        let s = &mut *guard;
        let at = match s.index.find(hash, |&i| s.entries[i as usize].0 == key) {
            Some(&at) => at,
            None => {
                if self.len.load(Ordering::Relaxed) >= max {
                    return Err(Full);
                }
                self.len.fetch_add(1, Ordering::Relaxed);
                insert(s, &self.hasher, hash, key, Entry::default())
            }
        };
        Ok(f(&mut s.entries[at as usize].1))
    }

    /// Adds a stored mark (at start-up; a name seen twice keeps the higher mark).
    pub fn insert_stored(&self, key: &str, token: u64) {
        let _ = self.with_or_insert(key, usize::MAX, |e| {
            if token > e.highest() {
                *e = Entry::stored(token);
            }
        });
    }
}

fn insert(s: &mut Shard, hasher: &RandomState, hash: u64, key: &str, entry: Entry) -> u32 {
    if s.entries.len() == s.entries.capacity() {
        // Grow by a quarter, not by double: most of the memory is here.
        s.entries.reserve_exact((s.entries.len() / 4).max(16));
    }
    let at = u32::try_from(s.entries.len()).expect("fewer than 2^32 resources per shard");
    s.entries.push((CompactString::new(key), entry));
    let entries = &s.entries;
    s.index.insert_unique(hash, at, |&i| {
        hasher.hash_one(entries[i as usize].0.as_str())
    });
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_created_and_bounded() {
        let t = MarkTable::new();
        assert_eq!(t.with("a", |e| e.highest()), None);
        t.with_or_insert("a", 2, |e| e.raise(5)).unwrap();
        t.with_or_insert("b", 2, |e| e.raise(7)).unwrap();
        assert!(
            t.with_or_insert("c", 2, |_| ()).is_err(),
            "the table is full"
        );
        assert_eq!(
            t.with_or_insert("a", 2, |e| e.highest()).unwrap(),
            5,
            "existing entries still work when full"
        );
        assert_eq!(
            t.with("b", |e| (e.highest(), e.durable())),
            Some((7, false))
        );
        t.with("b", |e| e.stored_up_to(7));
        assert_eq!(t.with("b", |e| e.durable()), Some(true));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn many_entries_survive_growth() {
        let t = MarkTable::new();
        for i in 0..100_000u64 {
            t.insert_stored(&format!("r{i}"), i + 1);
        }
        for i in (0..100_000u64).step_by(997) {
            assert_eq!(
                t.with(&format!("r{i}"), |e| (e.highest(), e.durable())),
                Some((i + 1, true))
            );
        }
        t.insert_stored("r5", 3); // lower: kept at 6
        assert_eq!(t.with("r5", |e| e.highest()), Some(6));
        assert_eq!(t.len(), 100_000);
    }
}
