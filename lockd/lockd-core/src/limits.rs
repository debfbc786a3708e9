//! Every limit lockd enforces, in one place, each with its reason.
//!
//! The resource-name limits live in the `fencing` crate (they are shared with the proxy) and are
//! re-exported here so that this module stays the single list a reader needs. All other limits
//! are fields of [`Limits`], whose defaults are the documented defaults of the server's
//! configuration (`docs/config.md` lists them again for operators).

use crate::error::{InvalidArgument, LimitsError};
pub use fencing::RESOURCE_NAME_LEN_MAX;

/// Locks in one page of a listing when the request gives no size.
pub const LIST_PAGE_DEFAULT: usize = 100;
/// Locks in one page of a listing at most: a page is built under the core's lock, so it stays
/// short (lockctl lists everything a page at a time).
pub const LIST_PAGE_MAX: usize = 1000;
/// Holds of one reentrant lease at most: an owner that re-enters deeper than this is far more
/// likely looping than nesting, and the count must stay small enough to persist as a `u32`.
pub const HOLDS_MAX: u32 = 1000;
/// Longest owner id of a reentrant Acquire, in bytes (a UUID is 36; with a policy lockd puts
/// the identity's name before it).
pub const OWNER_LEN_MAX: usize = 128;
/// Leases in one RenewMany or ReleaseMany call at most. The batch is decided under the core's
/// lock in one go, so it stays short (a few milliseconds); a worker with more leases sends
/// several batches. 1000 leases are about 300 kB on the wire, well within gRPC's 4 MB.
pub const BATCH_MAX: usize = 1000;
/// Resources in one atomic AcquireAll at most. Its grants land in one store transaction, and
/// etcd's transactions carry at most `--max-txn-ops` operations (128 by default): a set takes
/// two per resource (the lock and its request record) and one for the token high-water, so
/// 32 fit with room to spare. Sets larger than this are rarely all-or-none by nature; take
/// them in order instead (the SDK's ordered helper).
pub const SET_MAX: usize = 32;
/// The fewest operations per etcd transaction lockd can work with: an atomic set of
/// [`SET_MAX`] resources is one transaction (a lock and a request record per resource, the
/// token high-water, and the batch's own key, `{p}/batch`).
pub const TXN_OPS_MIN: usize = 2 * SET_MAX + 2;
/// Most permits a semaphore may have (`permits` of an Acquire). Bounds the scan for a free
/// permit, and the length a permit's number adds to the semaphore's name.
pub const PERMITS_MAX: u32 = 1000;
/// Most readers a read-write lock has at once; more readers are busy, or wait, as for a full
/// semaphore. Bounds the length a reader's slot number adds to the lock's name
/// (`NAME@read-K`), and a lock's free-slot list.
pub const READERS_MAX: u32 = 10_000;

/// Bounds on what clients may ask for and on what lockd holds in memory.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Shortest lease a client may ask for. Below ~100 ms a renewal cannot make it across a
    /// network and a scheduler hiccup in time, so leases would flap for no one's benefit.
    pub ttl_min_ms: u64,
    /// Longest lease. A holder that dies without releasing blocks everyone else this long, so it
    /// is bounded; long jobs renew instead (the client SDK does it for them).
    pub ttl_max_ms: u64,
    /// Lease length when a request gives none (`ttl_ms = 0`): the specification's 30 s.
    pub ttl_default_ms: u64,
    /// Longest a waiting Acquire may wait. A waiter holds memory and a connection; clients that
    /// want to wait longer ask again (the SDK does).
    pub wait_max_ms: u64,
    /// Waiters queued on one resource. A hot lock with thousands of waiters wants a queue, not a
    /// lock; past this the Acquire fails at once with RESOURCE_EXHAUSTED.
    pub waiters_per_resource_max: usize,
    /// Waiters queued in total, so that no set of clients can exhaust lockd's memory by waiting.
    pub waiters_total_max: usize,
    /// Leases held at once (the specification needs 20,000 active locks; the default leaves
    /// room for 100x that). Bounds memory and restart time.
    pub leases_max: usize,
    /// How long a request id is remembered after its grant, so that a retry returns the original
    /// grant (invariant 6). Retries later than this are new requests. Entries of leases that are
    /// still held are kept as long as the lease is.
    pub request_retention_ms: u64,
    /// Request ids remembered at once; past this an Acquire that carries a request id fails with
    /// RESOURCE_EXHAUSTED rather than silently forgetting an older one.
    pub requests_max: usize,
    /// Longest request id, in bytes (a UUID is 36).
    pub request_id_len_max: usize,
    /// Longest holder description, in bytes (host name, process id, purpose).
    pub holder_len_max: usize,
    /// A lease held longer than this (renewed all along) is reported once: a log line and a
    /// metric, the specification's inspection of over-long holds. Holds that long are mostly
    /// holders that renew but never finish. 0 turns it off.
    pub hold_warn_after_ms: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            ttl_min_ms: 100,
            ttl_max_ms: 3_600_000,
            ttl_default_ms: 30_000,
            wait_max_ms: 300_000,
            waiters_per_resource_max: 1_000,
            waiters_total_max: 100_000,
            leases_max: 2_000_000,
            request_retention_ms: 600_000,
            requests_max: 4_000_000,
            request_id_len_max: 128,
            holder_len_max: 128,
            hold_warn_after_ms: 3_600_000,
        }
    }
}

impl Limits {
    /// Checks that the limits make sense together (a configuration error otherwise).
    pub fn validate(&self) -> Result<(), LimitsError> {
        let fail = |what: &str| Err(LimitsError(what.to_string()));
        if self.ttl_min_ms == 0 {
            return fail("ttl_min_ms must be at least 1");
        }
        if !(self.ttl_min_ms <= self.ttl_default_ms && self.ttl_default_ms <= self.ttl_max_ms) {
            return fail("ttl_min_ms <= ttl_default_ms <= ttl_max_ms must hold");
        }
        // Lease lengths travel as 32-bit milliseconds in persisted records (about 49 days).
        if self.ttl_max_ms > u64::from(u32::MAX) {
            return fail("ttl_max_ms must be at most 4294967295 (about 49 days)");
        }
        if self.request_retention_ms == 0 {
            return fail("request_retention_ms must be at least 1");
        }
        if self.waiters_per_resource_max == 0 || self.waiters_total_max == 0 || self.leases_max == 0
        {
            return fail(
                "waiters_per_resource_max, waiters_total_max and leases_max must be at least 1",
            );
        }
        if self.request_id_len_max == 0 || self.request_id_len_max > 1024 {
            return fail("request_id_len_max must be 1 ..= 1024");
        }
        if self.holder_len_max > 1024 {
            return fail("holder_len_max must be at most 1024");
        }
        Ok(())
    }

    /// The lease length for a requested `ttl_ms` (0 = the default).
    pub fn ttl(&self, requested_ms: u64) -> Result<u64, InvalidArgument> {
        if requested_ms == 0 {
            return Ok(self.ttl_default_ms);
        }
        if requested_ms < self.ttl_min_ms || requested_ms > self.ttl_max_ms {
            return Err(InvalidArgument::Ttl {
                requested_ms,
                min_ms: self.ttl_min_ms,
                max_ms: self.ttl_max_ms,
            });
        }
        Ok(requested_ms)
    }

    /// The wait for a requested `wait_timeout_ms` (0 = try-lock).
    pub fn wait(&self, requested_ms: u64) -> Result<u64, InvalidArgument> {
        if requested_ms > self.wait_max_ms {
            return Err(InvalidArgument::Wait {
                requested_ms,
                max_ms: self.wait_max_ms,
            });
        }
        Ok(requested_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_consistent() {
        Limits::default().validate().unwrap();
    }

    #[test]
    fn inconsistent_limits_are_refused() {
        let bad = Limits {
            ttl_min_ms: 50_000,
            ..Limits::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("ttl_min_ms <= ttl_default_ms")
        );
        let bad = Limits {
            ttl_max_ms: u64::MAX,
            ..Limits::default()
        };
        assert!(bad.validate().is_err());
        let bad = Limits {
            waiters_total_max: 0,
            ..Limits::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn ttl_and_wait_ranges() {
        let l = Limits::default();
        assert_eq!(l.ttl(0), Ok(30_000));
        assert_eq!(l.ttl(100), Ok(100));
        assert!(l.ttl(99).is_err());
        assert!(l.ttl(3_600_001).is_err());
        assert_eq!(l.wait(0), Ok(0));
        assert_eq!(l.wait(300_000), Ok(300_000));
        let e = l.wait(300_001).unwrap_err().to_string();
        assert!(e.contains("300000"), "{e}");
    }
}
