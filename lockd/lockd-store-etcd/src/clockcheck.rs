//! Whether the leader's clock keeps etcd's time.
//!
//! A leader decides expiries by its own clock, and answers only while its term is in force by
//! that clock. A clock that jumps ahead (a hypervisor's or libfaketime's, or a stepped
//! `CLOCK_MONOTONIC` on a broken kernel) would expire leases early and commit the expiries
//! while its leader key is still valid in etcd; a clock that runs slow would keep the leader
//! answering after etcd has handed its leadership on. So each term checks its clock against
//! etcd's: it grants itself a *clock lease* (never kept alive) and, every few hundred
//! milliseconds, asks etcd how many seconds the lease has left. etcd counts the lease's time on
//! its leader's clock, so `TTL - remaining` is how long etcd's clock has run since the grant;
//! the leader compares that with how long its own clock ran (bounded by when it sent each
//! request and when the answer came). etcd reports whole seconds, rounded down, so the check
//! sees a disagreement of about one second or more ([`judge`]); a smaller jump, or a rate
//! error that has not yet added up to that, goes unnoticed (ARCHITECTURE.md's assumptions).
//!
//! An etcd leader change gives every lease a full TTL again; the raft term in the answer's
//! header shows it, and the check then starts again from a new clock lease.

use std::time::Duration;

/// The clock lease's TTL, in seconds; a new one is granted when half of it has run.
pub const CLOCK_LEASE_TTL_S: i64 = 600;

/// The rate difference the check allows between this clock and etcd's leader's (the margin
/// the term's own arithmetic assumes).
pub const RATE: f64 = 0.01;

/// Allowed for etcd's own timer and rounding, beyond the whole second it reports.
pub const SLACK: Duration = Duration::from_millis(20);

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
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The two clocks agree within the tolerance.
    Agrees,
    /// This clock counted at least `local` while etcd's counted at most `etcd`.
    Ahead { local: Duration, etcd: Duration },
    /// This clock counted at most `local` while etcd's counted at least `etcd`.
    Behind { local: Duration, etcd: Duration },
    /// The reading cannot be compared with the baseline (an etcd leader change lengthened the
    /// lease, the lease is gone, or half its TTL has run): start from a new clock lease.
    Rebase,
}

fn seconds(s: i64) -> Duration {
    Duration::from_secs(s.max(0) as u64)
}

/// Compares the clocks: the clock lease of `base` had `remaining_s` whole seconds left (etcd
/// rounds down) at some moment between `sent` and `answered`, read in raft term `raft_term`.
pub fn judge(
    base: &Baseline,
    sent: Duration,
    answered: Duration,
    remaining_s: i64,
    raft_term: u64,
) -> Verdict {
    if raft_term != base.raft_term
        || remaining_s < 0
        || remaining_s > base.ttl_s
        || remaining_s * 2 < base.ttl_s
    {
        return Verdict::Rebase;
    }
    // etcd's clock ran more than `counted - 1` and at most `counted` seconds.
    let counted = base.ttl_s - remaining_s;
    let etcd_most = seconds(counted).mul_f64(1.0 + RATE) + SLACK;
    let etcd_least = seconds(counted - 1)
        .mul_f64(1.0 - RATE)
        .saturating_sub(SLACK);
    // This clock ran at least from the grant's answer to the reading's sending, and at most
    // from the grant's sending to the reading's answer.
    let local_least = sent.saturating_sub(base.answered);
    let local_most = answered.saturating_sub(base.sent);
    if local_least > etcd_most {
        Verdict::Ahead {
            local: local_least,
            etcd: seconds(counted),
        }
    } else if local_most < etcd_least {
        Verdict::Behind {
            local: local_most,
            etcd: seconds(counted - 1),
        }
    } else {
        Verdict::Agrees
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A grant sent at 10.000 s and answered at 10.002 s (boot time), TTL 600 s.
    fn base() -> Baseline {
        Baseline {
            lease: 7,
            ttl_s: 600,
            sent: ms(10_000),
            answered: ms(10_002),
            raft_term: 3,
        }
    }

    /// A reading `after` the grant (by this clock), which took 2 ms, showing `remaining`.
    fn read(after: u64, remaining: i64) -> Verdict {
        let sent = ms(10_002 + after);
        judge(&base(), sent, sent + ms(2), remaining, 3)
    }

    #[test]
    fn clocks_that_keep_the_same_time_agree_at_every_rounding() {
        // etcd's clock ran `true_ms`; it reports the remaining time rounded down.
        for true_ms in [
            0u64, 1, 333, 999, 1_000, 1_001, 2_500, 9_999, 120_000, 299_999,
        ] {
            let remaining = 600 - true_ms.div_ceil(1000) as i64;
            assert_eq!(
                read(true_ms, remaining),
                Verdict::Agrees,
                "after {true_ms} ms"
            );
        }
    }

    #[test]
    fn a_clock_that_jumped_ahead_is_seen_once_the_jump_passes_a_second_and_a_bit() {
        // etcd: 2.3 s ran (597.7 s left, reported as 597).
        assert_eq!(read(2_300, 597), Verdict::Agrees);
        // This clock jumped 1.5 s: it counts 3.8 s where etcd counted at most 3 s.
        assert!(matches!(read(3_800, 597), Verdict::Ahead { .. }));
        // 60 s, the jump that expired leases in the outside tester's run.
        assert!(matches!(read(62_300, 597), Verdict::Ahead { .. }));
    }

    #[test]
    fn a_clock_that_runs_slow_or_fast_is_seen_within_seconds() {
        // Half speed: after 4 s of etcd's time (596 left) this clock counted 2 s.
        assert!(matches!(read(2_000, 596), Verdict::Behind { .. }));
        // Double speed: after 2 s of etcd's time (598 left) this clock counted 4 s.
        assert!(matches!(read(4_000, 598), Verdict::Ahead { .. }));
        // 0.5 % fast over five minutes is within the 1 % allowed.
        assert_eq!(read(301_500, 300), Verdict::Agrees);
    }

    #[test]
    fn an_etcd_leader_change_or_a_lease_gone_or_half_run_starts_again() {
        let sent = ms(12_000);
        // A new raft term: etcd gave every lease a full TTL again.
        assert_eq!(judge(&base(), sent, sent, 600, 4), Verdict::Rebase);
        assert_eq!(judge(&base(), sent, sent, 601, 3), Verdict::Rebase);
        assert_eq!(judge(&base(), sent, sent, -1, 3), Verdict::Rebase);
        assert_eq!(judge(&base(), sent, sent, 299, 3), Verdict::Rebase);
    }
}
