//! Whether the leader's clock keeps etcd's time.
//!
//! A leader decides expiries and how long its term holds by its own clock. A clock that jumps
//! ahead (a hypervisor's or libfaketime's, or a stepped clock on a broken kernel) would expire
//! leases early and commit the expiries while its leader key is still valid in etcd; a clock
//! that runs slow would keep the leader answering after etcd has handed its leadership on. So
//! each term checks its clock against etcd's: it grants itself a *clock lease* (never kept
//! alive) and, every [`CHECK_EVERY`], asks etcd how many seconds the lease has left. etcd
//! counts the lease's time on its leader's clock, so `TTL - remaining` is how long etcd's
//! clock has run since the grant.
//!
//! etcd reports whole seconds, rounded down, so one reading says little: etcd's time is known
//! to within a second. But the offset between the two clocks, `D = local elapsed - etcd
//! elapsed`, stays put while they keep the same time, and every reading bounds it; the
//! [`Witness`] keeps the intersection of all the bounds (widened by the rate difference
//! allowed, [`RATE`], as time passes). Readings a tenth of a second apart catch each second's
//! change of the reported value within a tenth of a second, so the intersection narrows to
//! about [`CHECK_EVERY`] plus the round trip. A jump of the local clock moves `D` by the jump;
//! once a reading's bounds miss the intersection, the clocks disagree. A jump smaller than the
//! intersection's width, or one in the first second after a clock lease was granted (the
//! width is then a second), can go unseen.
//!
//! Before half of a clock lease's TTL has run, the leader grants the next one and reads both
//! for [`OVERLAP`] before it lets the old one go, so that no moment goes unchecked. An etcd
//! leader change gives every lease a full TTL again; the raft term in the answer's header
//! shows it, and the check then starts again from a new clock lease (the moment of the change
//! is the one interval not compared).

use std::time::Duration;

/// The clock lease's TTL, in seconds; the next one is granted when half of it has run.
pub const CLOCK_LEASE_TTL_S: i64 = 600;

/// How long the next clock lease is read beside the old one before the old one is let go:
/// long enough for its bounds to narrow (each second's change of the rounded value).
pub const OVERLAP: Duration = Duration::from_secs(3);

/// How often the leader reads its clock lease.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The rate difference the check allows between this clock and etcd's leader's (the margin
/// the term's own arithmetic assumes; NTP keeps rates within 0.05 %).
pub const RATE: f64 = 0.01;

/// Allowed for etcd's own timers, beyond what the readings bound.
pub const SLACK: Duration = Duration::from_millis(10);

/// A grant of the clock lease: etcd started counting its TTL somewhere between `sent` and
/// `answered` (boot times on this machine), in the raft term `raft_term`.
#[derive(Clone, Copy, Debug)]
pub struct Baseline {
    pub lease: i64,
    pub ttl_s: i64,
    pub sent: Duration,
    pub answered: Duration,
    pub raft_term: u64,
}

/// What one reading of the clock lease shows.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// The two clocks agree within what the readings can tell; etcd's clock has surely
    /// passed the moment this clock read `proven` (boot time).
    Agrees { proven: Duration },
    /// This clock has run ahead of etcd's by at least `by` since the readings before.
    Ahead { by: Duration },
    /// This clock has fallen behind etcd's by at least `by`.
    Behind { by: Duration },
    /// The reading cannot be compared with the baseline (an etcd leader change lengthened the
    /// lease, or the lease is gone): start from a new clock lease.
    Rebase,
}

/// What the readings of one clock lease have established (see the module documentation).
#[derive(Clone, Debug)]
pub struct Witness {
    base: Baseline,
    /// Bounds on `D`, in seconds, as of local elapsed `at` (seconds since `base.sent`).
    lo: f64,
    hi: f64,
    at: f64,
    /// Seconds left at the last reading.
    remaining_s: i64,
}

impl Witness {
    pub fn new(base: Baseline) -> Witness {
        // At the grant etcd's elapsed time was 0, somewhere within the grant's round trip.
        let rtt = base.answered.saturating_sub(base.sent).as_secs_f64();
        Witness {
            base,
            lo: 0.0,
            hi: rtt,
            at: 0.0,
            remaining_s: base.ttl_s,
        }
    }

    pub fn baseline(&self) -> &Baseline {
        &self.base
    }

    /// Whether half of the clock lease's TTL has run: time to grant the next one.
    pub fn aging(&self) -> bool {
        self.remaining_s * 2 < self.base.ttl_s
    }

    /// How wide the bounds on the clocks' offset are: roughly the smallest jump the next
    /// reading would catch.
    #[cfg(test)]
    pub fn width(&self) -> Duration {
        Duration::from_secs_f64((self.hi - self.lo).max(0.0))
    }

    /// Takes a reading: the clock lease had `remaining_s` whole seconds left (etcd rounds
    /// down) at some moment between `sent` and `answered`, in raft term `raft_term`.
    pub fn judge(
        &mut self,
        sent: Duration,
        answered: Duration,
        remaining_s: i64,
        raft_term: u64,
    ) -> Verdict {
        let base = &self.base;
        if raft_term != base.raft_term || remaining_s < 0 || remaining_s > base.ttl_s {
            return Verdict::Rebase;
        }
        // etcd's clock ran more than `counted - 1` and at most `counted` seconds; this one ran
        // from `base.sent` to somewhere between `sent` and `answered`.
        let counted = (base.ttl_s - remaining_s) as f64;
        let local_least = sent.saturating_sub(base.sent).as_secs_f64();
        let local_most = answered.saturating_sub(base.sent).as_secs_f64();
        let slack = SLACK.as_secs_f64();
        let new_lo = local_least - counted - slack;
        let new_hi = local_most - (counted - 1.0).max(0.0) + slack;
        // What was known drifts apart by at most RATE of the time since.
        let drift = RATE * (local_most - self.at).max(0.0);
        let (lo, hi) = (self.lo - drift, self.hi + drift);
        if new_lo > hi {
            return Verdict::Ahead {
                by: Duration::from_secs_f64(new_lo - hi),
            };
        }
        if new_hi < lo {
            return Verdict::Behind {
                by: Duration::from_secs_f64(lo - new_hi),
            };
        }
        self.lo = lo.max(new_lo);
        self.hi = hi.min(new_hi);
        self.at = local_most;
        self.remaining_s = remaining_s;
        // etcd's clock has run more than `counted - 1` s; this clock read that moment at
        // least `lo` later (a jump since can have raised `lo` by no more than the width).
        let proven = (counted - 1.0).max(0.0) + self.lo;
        Verdict::Agrees {
            proven: base.sent + Duration::from_secs_f64(proven.max(0.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A grant sent at 10.000 s and answered at 10.002 s (boot time), TTL 600 s; etcd's
    /// clock started at 10.001 s.
    fn witness() -> Witness {
        Witness::new(Baseline {
            lease: 7,
            ttl_s: 600,
            sent: ms(10_000),
            answered: ms(10_002),
            raft_term: 3,
        })
    }

    /// Readings every 100 ms (each taking 2 ms) from `from_ms` to `to_ms` of real time after
    /// the grant was sent, on a local clock that reads `skew(real)` ms; etcd reports whole
    /// seconds left, rounded down. The first verdict that is not `Agrees`, if any, and how far
    /// (ms) the latest `proven` ran ahead of etcd's own time, read on the local clock as it
    /// was before any skew.
    fn readings(
        w: &mut Witness,
        from_ms: u64,
        to_ms: u64,
        skew: impl Fn(u64) -> u64,
    ) -> (Option<(u64, Verdict)>, i64) {
        let mut real = from_ms;
        let mut ahead = i64::MIN;
        while real <= to_ms {
            // etcd reads the lease 1 ms after the sending and began counting 1 ms after the
            // grant was sent: its elapsed time at the reading is `real`.
            let remaining = 600 - real.div_ceil(1000) as i64;
            let sent = ms(10_000 + skew(real));
            match w.judge(sent, sent + ms(2), remaining, 3) {
                Verdict::Agrees { proven } => {
                    // etcd's time `real` is local `10_001 + real` on an unskewed clock.
                    ahead = ahead.max(proven.as_millis() as i64 - (10_001 + real as i64));
                }
                v => return (Some((real, v)), ahead),
            }
            real += 100;
        }
        (None, ahead)
    }

    #[test]
    fn clocks_that_keep_the_same_time_agree_and_nothing_is_proven_early() {
        let mut w = witness();
        let (v, ahead) = readings(&mut w, 1, 20_000, |r| r);
        assert_eq!(v, None);
        assert!(ahead <= 0, "proven {ahead} ms ahead of etcd's time");
        // A tenth of a second apart, the readings pin the offset down to about that.
        assert!(w.width() < ms(150), "{:?}", w.width());
        // 0.5 % fast for five minutes is within the 1 % allowed.
        let (v, _) = readings(&mut w, 20_001, 299_000, |r| r + (r - 20_000) / 200);
        assert_eq!(v, None);
    }

    #[test]
    fn a_jump_ahead_of_a_quarter_second_is_seen_within_a_second_and_proves_nothing_early() {
        for jump in [250, 900, 1_500, 60_000] {
            let mut w = witness();
            assert_eq!(readings(&mut w, 1, 5_000, |r| r).0, None);
            let width = w.width().as_millis() as i64;
            let (seen, ahead) = readings(&mut w, 5_001, 10_000, |r| r + jump);
            let (at, v) = seen.unwrap_or_else(|| panic!("a jump of {jump} ms is not seen"));
            assert!(matches!(v, Verdict::Ahead { .. }), "{v:?}");
            assert!(at <= 6_100, "a jump of {jump} ms seen at {at} ms only");
            // Until it is seen, what the readings prove runs ahead by less than the bounds'
            // width: expiry is held back there.
            assert!(
                ahead < width + 20,
                "{jump} ms: proven {ahead} ms ahead, width {width}"
            );
        }
    }

    #[test]
    fn the_edge_a_jump_under_the_bounds_width_is_not_seen() {
        // Settled bounds are about a tenth of a second wide: a 50 ms jump passes, and what
        // is proven runs up to that much ahead.
        let mut w = witness();
        assert_eq!(readings(&mut w, 1, 5_000, |r| r).0, None);
        let (v, ahead) = readings(&mut w, 5_001, 10_000, |r| r + 50);
        assert_eq!(v, None);
        assert!(ahead <= 50, "{ahead}");
    }

    #[test]
    fn a_clock_that_runs_slow_or_fast_is_seen_within_a_second_or_so() {
        let mut w = witness();
        let (at, v) = readings(&mut w, 1, 10_000, |r| r / 2)
            .0
            .expect("half speed is seen");
        assert!(
            matches!(v, Verdict::Behind { .. }) && at < 2_000,
            "{at} {v:?}"
        );
        let mut w = witness();
        let (at, v) = readings(&mut w, 1, 10_000, |r| r * 2)
            .0
            .expect("double speed is seen");
        assert!(
            matches!(v, Verdict::Ahead { .. }) && at < 2_000,
            "{at} {v:?}"
        );
    }

    #[test]
    fn an_etcd_leader_change_or_a_lease_gone_starts_again() {
        let sent = ms(12_000);
        for (remaining, term) in [(600, 4), (601, 3), (-1, 3)] {
            assert_eq!(
                witness().judge(sent, sent, remaining, term),
                Verdict::Rebase,
                "{remaining} s left in raft term {term}"
            );
        }
    }

    #[test]
    fn half_way_through_a_clock_lease_the_next_one_is_due() {
        let mut w = witness();
        assert_eq!(readings(&mut w, 1, 299_000, |r| r).0, None);
        assert!(!w.aging());
        assert_eq!(readings(&mut w, 300_001, 301_000, |r| r).0, None);
        assert!(w.aging());
    }
}
