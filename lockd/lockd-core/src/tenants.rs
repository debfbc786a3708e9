//! Tenants: who owns which resources, and each owner's quotas.
//!
//! A tenant owns every resource whose name starts with one of its prefixes. No prefix of one
//! tenant may start another tenant's prefix (or its own other one), so a resource has at most
//! one owner, found by one ordered lookup: the greatest prefix not above the name is the only
//! one that can start it. Because the owner is a function of the name, nothing about tenants is
//! persisted, and a hand-off (one lease of a resource ends, the next begins) never changes a
//! tenant's count of leases.
//!
//! The core counts, per tenant, the leases held and the waiters queued, and keeps a token
//! bucket of Acquire calls; [`crate::Core::set_tenancy`] recounts from the state it holds.

use std::collections::BTreeMap;

use crate::types::Millis;

/// Longest tenant name, in bytes (it appears in error messages and logs).
pub const TENANT_NAME_LEN_MAX: usize = 64;

/// One tenant, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    /// Name prefixes of the resources it owns; none empty.
    pub prefixes: Vec<String>,
    pub quota: Quota,
}

/// A tenant's own limits. `None` for a count is a fair share: lockd's global limit divided
/// by the number of tenants, so that no tenant can take what the others need by default.
/// `None` for the rate is no rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// Leases its resources may hold at once [default: `leases_max` / tenants].
    pub leases_max: Option<usize>,
    /// Waiters queued on its resources at once (the specification's per-tenant waiter cap)
    /// [default: `waiters_total_max` / tenants].
    pub waiters_max: Option<usize>,
    /// Request ids remembered for its resources at once [default: `requests_max` / tenants].
    pub requests_max: Option<usize>,
    /// Acquire calls per second, with a burst.
    pub acquire_rate: Option<Rate>,
}

/// A tenant's limits in force: its own, or its fair share of lockd's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    pub leases: usize,
    pub waiters: usize,
    pub requests: usize,
}

impl Caps {
    pub fn of(quota: &Quota, limits: &crate::Limits, tenants: usize) -> Caps {
        let share = |global: usize| (global / tenants.max(1)).max(1);
        Caps {
            leases: quota.leases_max.unwrap_or(share(limits.leases_max)),
            waiters: quota.waiters_max.unwrap_or(share(limits.waiters_total_max)),
            requests: quota.requests_max.unwrap_or(share(limits.requests_max)),
        }
    }
}

/// A token bucket: `per_second` calls refill it, and it holds at most `burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

/// Why a set of tenants cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TenancyError {
    #[error("tenant name {0:?} must be 1 ..= 64 bytes of letters, digits and . _ -")]
    Name(String),
    #[error("two tenants are named {0:?}")]
    DuplicateName(String),
    #[error("tenant {0:?} has no prefixes; give it at least one")]
    NoPrefixes(String),
    #[error("tenant {tenant:?} has an empty prefix; a prefix of \"\" would own every resource")]
    EmptyPrefix { tenant: String },
    #[error(
        "prefix {inner:?} of tenant {inner_tenant:?} starts with prefix {outer:?} of tenant {outer_tenant:?}: a resource must have one owner"
    )]
    Overlap {
        outer: String,
        outer_tenant: String,
        inner: String,
        inner_tenant: String,
    },
    #[error("tenant {tenant:?}: prefix {prefix:?} can start no resource name: {reason}")]
    BadPrefix {
        tenant: String,
        prefix: String,
        reason: String,
    },
    #[error("tenant {0:?}: leases_max, waiters_max and requests_max must be at least 1 when given")]
    ZeroLimit(String),
    #[error("tenant {0:?}: acquire_rate and acquire_burst must be at least 1")]
    ZeroRate(String),
}

/// Index of a tenant in its [`Tenancy`].
pub type TenantIx = usize;

/// A validated set of tenants.
#[derive(Clone, Debug)]
pub struct Tenancy {
    tenants: Vec<Tenant>,
    /// Every prefix, with its tenant.
    prefixes: BTreeMap<String, TenantIx>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TENANT_NAME_LEN_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Tenancy {
    pub fn new(tenants: Vec<Tenant>) -> Result<Tenancy, TenancyError> {
        let mut prefixes: BTreeMap<String, TenantIx> = BTreeMap::new();
        for (ix, t) in tenants.iter().enumerate() {
            if !valid_name(&t.name) {
                return Err(TenancyError::Name(t.name.clone()));
            }
            if tenants[..ix].iter().any(|o| o.name == t.name) {
                return Err(TenancyError::DuplicateName(t.name.clone()));
            }
            if t.prefixes.is_empty() {
                return Err(TenancyError::NoPrefixes(t.name.clone()));
            }
            let q = &t.quota;
            if q.leases_max == Some(0) || q.waiters_max == Some(0) || q.requests_max == Some(0) {
                return Err(TenancyError::ZeroLimit(t.name.clone()));
            }
            if q.acquire_rate
                .is_some_and(|r| r.per_second == 0 || r.burst == 0)
            {
                return Err(TenancyError::ZeroRate(t.name.clone()));
            }
            for p in &t.prefixes {
                if p.is_empty() {
                    return Err(TenancyError::EmptyPrefix {
                        tenant: t.name.clone(),
                    });
                }
                // A prefix that is not itself a valid name (a character names may not have,
                // or too long) would own nothing: a mistake, said at once.
                if let Err(e) = fencing::ResourceName::validate(p) {
                    return Err(TenancyError::BadPrefix {
                        tenant: t.name.clone(),
                        prefix: p.clone(),
                        reason: e.to_string(),
                    });
                }
                // Sorted, a prefix comes right before the strings it starts, so only the
                // neighbours need a look.
                let before = prefixes.range(..p.clone()).next_back();
                let after = prefixes.range(p.clone()..).next();
                let overlap = |(outer, o): (&String, &TenantIx), inner: &String, i: TenantIx| {
                    TenancyError::Overlap {
                        outer: outer.clone(),
                        outer_tenant: tenants[*o].name.clone(),
                        inner: inner.clone(),
                        inner_tenant: tenants[i].name.clone(),
                    }
                };
                if let Some(b) = before.filter(|(b, _)| p.starts_with(b.as_str())) {
                    return Err(overlap(b, p, ix));
                }
                if let Some((a, &aix)) = after.filter(|(a, _)| a.starts_with(p.as_str())) {
                    return Err(overlap((p, &ix), a, aix));
                }
                prefixes.insert(p.clone(), ix);
            }
        }
        Ok(Tenancy { tenants, prefixes })
    }

    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// The tenant that owns `resource`, if any.
    pub fn owner(&self, resource: &str) -> Option<&Tenant> {
        self.owner_ix(resource).map(|ix| &self.tenants[ix])
    }

    /// The index in [`Tenancy::tenants`] of the tenant that owns `resource`, if any. A
    /// semaphore's permit is its semaphore's tenant's (`crate::permits::owner_name`).
    pub fn owner_ix(&self, resource: &str) -> Option<TenantIx> {
        use std::ops::Bound;
        let resource = crate::permits::owner_name(resource);
        // Looked up on every call: borrowed as `str`, without an allocation.
        let (prefix, &ix) = self
            .prefixes
            .range::<str, _>((Bound::Unbounded, Bound::Included(resource)))
            .next_back()?;
        resource.starts_with(prefix.as_str()).then_some(ix)
    }

    pub(crate) fn tenant(&self, ix: TenantIx) -> &Tenant {
        &self.tenants[ix]
    }
}

/// What one tenant uses now.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    pub leases: usize,
    pub waiters: usize,
    pub requests: usize,
    /// Acquire calls left in the bucket, in thousandths.
    bucket_milli: u64,
    bucket_at: Option<Millis>,
}

impl Usage {
    /// Takes one call from the bucket at `now`; otherwise the milliseconds until one is there.
    pub fn take_call(&mut self, rate: Rate, now: Millis) -> Result<(), u64> {
        let cap = u64::from(rate.burst) * 1000;
        let refill = match self.bucket_at {
            None => cap,
            // `per_second` calls a second is `per_second` thousandths a millisecond.
            Some(at) => now
                .saturating_sub(at)
                .saturating_mul(u64::from(rate.per_second)),
        };
        self.bucket_milli = self.bucket_milli.saturating_add(refill).min(cap);
        self.bucket_at = Some(now);
        if self.bucket_milli >= 1000 {
            self.bucket_milli -= 1000;
            return Ok(());
        }
        let missing = 1000 - self.bucket_milli;
        Err(missing.div_ceil(u64::from(rate.per_second)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, prefixes: &[&str]) -> Tenant {
        Tenant {
            name: name.into(),
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            quota: Quota::default(),
        }
    }

    #[test]
    fn a_resource_has_the_owner_whose_prefix_starts_it() {
        let t = Tenancy::new(vec![
            tenant("pay", &["payments/", "ledger"]),
            tenant("inv", &["inventory/", "payments-archive/"]),
        ])
        .unwrap();
        let owner = |r: &str| t.owner(r).map(|t| t.name.as_str());
        assert_eq!(owner("payments/42"), Some("pay"));
        assert_eq!(owner("payments/"), Some("pay"));
        assert_eq!(owner("ledger"), Some("pay"));
        assert_eq!(owner("ledgers/x"), Some("pay"));
        assert_eq!(owner("payments-archive/1"), Some("inv"));
        assert_eq!(owner("inventory/sku-1"), Some("inv"));
        assert_eq!(owner("payments"), None);
        assert_eq!(owner("paymentsX"), None);
        assert_eq!(owner("inventory"), None);
        assert_eq!(owner("a"), None);
        assert_eq!(owner("zzz"), None);
        assert_eq!(owner(""), None);
    }

    #[test]
    fn overlapping_prefixes_are_refused_in_either_order() {
        for tenants in [
            vec![tenant("a", &["jobs/"]), tenant("b", &["jobs/nightly/"])],
            vec![tenant("b", &["jobs/nightly/"]), tenant("a", &["jobs/"])],
            vec![tenant("a", &["jobs/", "jobs/x"])],
            vec![tenant("a", &["jobs/"]), tenant("b", &["jobs/"])],
        ] {
            let e = Tenancy::new(tenants).unwrap_err();
            assert!(matches!(e, TenancyError::Overlap { .. }), "{e}");
            assert!(e.to_string().contains("one owner"), "{e}");
        }
        // Neighbours that do not start each other are fine.
        Tenancy::new(vec![
            tenant("a", &["jobs/"]),
            tenant("b", &["jobs0", "job/"]),
        ])
        .unwrap();
    }

    #[test]
    fn bad_tenants_are_refused_with_their_reason() {
        let cases: Vec<(Vec<Tenant>, &str)> = vec![
            (vec![tenant("", &["a"])], "tenant name"),
            (vec![tenant("a b", &["a"])], "tenant name"),
            (vec![tenant(&"t".repeat(65), &["a"])], "tenant name"),
            (
                vec![tenant("a", &["x"]), tenant("a", &["y"])],
                "two tenants",
            ),
            (vec![tenant("a", &[])], "no prefixes"),
            (vec![tenant("a", &[""])], "empty prefix"),
            (vec![tenant("a", &["t /"])], "can start no resource name"),
            (vec![tenant("a", &["é/"])], "can start no resource name"),
            (vec![tenant("a", &["t/\0"])], "can start no resource name"),
            (
                vec![tenant("a", &[&"p".repeat(257)])],
                "can start no resource name",
            ),
        ];
        for (tenants, expected) in cases {
            let e = Tenancy::new(tenants).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        }
        let mut zero = tenant("a", &["a/"]);
        zero.quota.waiters_max = Some(0);
        assert!(matches!(
            Tenancy::new(vec![zero]),
            Err(TenancyError::ZeroLimit(_))
        ));
        let mut zero = tenant("a", &["a/"]);
        zero.quota.acquire_rate = Some(Rate {
            per_second: 0,
            burst: 1,
        });
        assert!(matches!(
            Tenancy::new(vec![zero]),
            Err(TenancyError::ZeroRate(_))
        ));
    }

    #[test]
    fn the_bucket_starts_full_refills_at_the_rate_and_says_how_long_to_wait() {
        let rate = Rate {
            per_second: 10,
            burst: 3,
        };
        let mut u = Usage::default();
        for _ in 0..3 {
            assert_eq!(u.take_call(rate, 1_000), Ok(()));
        }
        // Empty: one call comes back every 100 ms.
        assert_eq!(u.take_call(rate, 1_000), Err(100));
        assert_eq!(u.take_call(rate, 1_040), Err(60));
        assert_eq!(u.take_call(rate, 1_100), Ok(()));
        // A long pause refills only up to the burst.
        for _ in 0..3 {
            assert_eq!(u.take_call(rate, 60_000), Ok(()));
        }
        assert!(u.take_call(rate, 60_000).is_err());
    }
}
