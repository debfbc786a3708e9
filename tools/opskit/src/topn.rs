//! The top N keys by count, in bounded memory: the space-saving algorithm. At most `tracked`
//! keys are counted; a new key, when the table is full, replaces the least counted one and
//! inherits its count, so a count may be over the truth by the evicted one's, never under it,
//! and a key that becomes hot is always found.

use std::collections::HashMap;
use std::sync::Mutex;

pub struct TopN {
    tracked: usize,
    counts: Mutex<HashMap<String, u64>>,
}

impl TopN {
    /// Counts `tracked` keys at most.
    pub fn new(tracked: usize) -> TopN {
        TopN {
            tracked: tracked.max(1),
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// One more for `key`.
    pub fn add(&self, key: &str) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(key) {
            *n += 1;
            return;
        }
        let mut start = 0;
        if counts.len() >= self.tracked
            && let Some((least, n)) = counts
                .iter()
                .min_by_key(|(_, n)| **n)
                .map(|(k, n)| (k.clone(), *n))
        {
            counts.remove(&least);
            start = n;
        }
        counts.insert(key.to_string(), start + 1);
    }

    /// The `n` most counted keys, most first (ties by key).
    pub fn top(&self, n: usize) -> Vec<(String, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(String, u64)> = counts.iter().map(|(k, v)| (k.clone(), *v)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// Keys counted now (at most `tracked`).
    pub fn len(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sketch_keeps_the_hot_keys_within_its_bound() {
        let c = TopN::new(256);
        for i in 0..10_000 {
            c.add(&format!("cold-{i}"));
            if i % 10 == 0 {
                c.add("hot");
            }
            if i % 20 == 0 {
                c.add("warm");
            }
        }
        assert!(c.len() <= 256);
        let top = c.top(2);
        assert_eq!(top[0].0, "hot");
        assert_eq!(top[1].0, "warm");
        assert!(top[0].1 >= 1_000, "never under the truth: {top:?}");
    }
}
