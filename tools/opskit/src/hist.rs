//! A histogram of durations without a lock: a fixed array of atomic bucket counts, for the
//! fence's per-request observations (prometheus-client's histogram takes a mutex on every
//! observation, which the relay's threads would contend on). Buckets are
//! [`crate::seconds_buckets`]; the sum is kept in nanoseconds.

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

    /// Writes the histogram (its buckets, `_sum` and `_count`) to `encoder`.
    pub fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect();
        buckets.push((f64::INFINITY, self.counts[BUCKETS].load(Ordering::Relaxed)));
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
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
