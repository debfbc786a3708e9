//! lockd's clock: monotonic milliseconds for every decision, wall-clock time only for display.
//!
//! Expiry is decided by the monotonic clock (`CLOCK_MONOTONIC` through `std::time::Instant`),
//! which no administrator, NTP step or leap second moves. Assumption: it runs at the rate of
//! real time within a small drift (well under 0.1 %); the client SDK's safety margin covers the
//! drift between lockd's clock and the client's. The wall clock only turns a monotonic deadline
//! into the `expires_at_ms` shown to users.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockd_core::Millis;

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Milliseconds since the clock was made (the core's time).
    pub fn now(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }

    /// The instant at which core time `at` arrives.
    pub fn instant(&self, at: Millis) -> Instant {
        self.origin + Duration::from_millis(at)
    }

    /// Core time `at` as Unix milliseconds, for display.
    pub fn wall_ms(&self, at: Millis) -> u64 {
        let now = self.now();
        let wall_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if at >= now {
            wall_now.saturating_add(at - now)
        } else {
            wall_now.saturating_sub(now - at)
        }
    }
}
