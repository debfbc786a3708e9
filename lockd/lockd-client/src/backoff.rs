//! Retry delays: 50 ms doubling to 1 s, with jitter so that clients that failed together do
//! not retry together.

use std::time::Duration;

use rand::Rng;

/// First delay.
pub const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Largest delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Delays for successive retries: each is drawn uniformly from the upper half of a base that
/// starts at [`BACKOFF_MIN`] and doubles up to [`BACKOFF_MAX`] ("equal jitter": never less
/// than half the base, so retries do back off, never synchronised).
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff { base: BACKOFF_MIN }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.base;
        self.base = (base * 2).min(BACKOFF_MAX);
        let half = base / 2;
        half + rand::rng().random_range(Duration::ZERO..=half)
    }

    /// Starts over (after a success).
    pub fn reset(&mut self) {
        self.base = BACKOFF_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_50ms_to_1s_with_jitter_in_the_upper_half() {
        for _ in 0..200 {
            let mut b = Backoff::new();
            let bases = [50, 100, 200, 400, 800, 1000, 1000, 1000];
            for base in bases {
                let d = b.next_delay();
                let base = Duration::from_millis(base);
                assert!(
                    d >= base / 2 && d <= base,
                    "{d:?} outside [{:?}, {base:?}]",
                    base / 2
                );
            }
            b.reset();
            assert!(b.next_delay() <= BACKOFF_MIN);
        }
    }

    #[test]
    fn jitter_spreads_the_delays() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            seen.insert(Backoff::new().next_delay());
        }
        assert!(seen.len() > 10, "delays are not jittered: {seen:?}");
    }
}
