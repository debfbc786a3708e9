//! Per-request counting without contention: a histogram of durations with atomic buckets
//! (prometheus-client's takes a mutex on every observation), and [`PerThread`], one copy of a
//! set of counters per thread (on its own cache lines), summed when scraped, so that the
//! relay's threads never write to the same line. Buckets are [`crate::seconds_buckets`]; the
//! sum is kept in nanoseconds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{MetricEncoder, NoLabelSet};

const BUCKETS: usize = 20;

pub struct AtomicHistogram {
    bounds: [f64; BUCKETS],
    /// Observations at or below `bounds[i]` and above the bound before; the last slot holds
    /// those above every bound (`+Inf`).
    counts: [AtomicU64; BUCKETS + 1],
    sum_ns: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> AtomicHistogram {
        let mut bounds = [0.0; BUCKETS];
        for (b, v) in bounds.iter_mut().zip(crate::seconds_buckets()) {
            *b = v;
        }
        AtomicHistogram {
            bounds,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl AtomicHistogram {
    pub fn observe(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = self.bounds.iter().position(|b| s <= *b).unwrap_or(BUCKETS);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Writes the sum of `parts` (their buckets, `_sum` and `_count`) to `encoder`.
    pub fn encode<'a>(
        parts: impl Iterator<Item = &'a AtomicHistogram>,
        mut encoder: MetricEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let mut counts = [0u64; BUCKETS + 1];
        let mut sum_ns = 0u64;
        let mut bounds = [0.0; BUCKETS];
        for h in parts {
            bounds = h.bounds;
            for (total, c) in counts.iter_mut().zip(&h.counts) {
                *total += c.load(Ordering::Relaxed);
            }
            sum_ns = sum_ns.wrapping_add(h.sum_ns.load(Ordering::Relaxed));
        }
        let mut buckets: Vec<(f64, u64)> = bounds.iter().copied().zip(counts).collect();
        buckets.push((f64::INFINITY, counts[BUCKETS]));
        let count = counts.iter().sum();
        encoder.encode_histogram::<NoLabelSet>(sum_ns as f64 / 1e9, count, &buckets, None)
    }
}

/// Copies of `T` kept apart per thread: a thread writes only to its own (threads beyond
/// [`SHARDS`] share), and a reader sums them.
pub struct PerThread<T> {
    shards: Box<[Padded<T>]>,
}

/// Copies at most; the relays run one thread per CPU.
pub const SHARDS: usize = 16;

/// One copy, on cache lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

impl<T: Default> Default for PerThread<T> {
    fn default() -> PerThread<T> {
        PerThread {
            shards: (0..SHARDS).map(|_| Padded::default()).collect(),
        }
    }
}

impl<T> PerThread<T> {
    /// This thread's copy.
    pub fn local(&self) -> &T {
        use std::sync::atomic::AtomicUsize;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
        }
        &self.shards[INDEX.with(|i| *i)].0
    }

    /// Every copy.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.shards.iter().map(|p| &p.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_the_text_is_cumulative() {
        let h = AtomicHistogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(150));
        h.observe(Duration::from_secs(100));
        assert_eq!(h.count(), 3);
        assert_eq!(h.counts[0].load(Ordering::Relaxed), 1);
        assert_eq!(h.counts[1].load(Ordering::Relaxed), 1);
        assert_eq!(h.counts[BUCKETS].load(Ordering::Relaxed), 1);
    }
}
