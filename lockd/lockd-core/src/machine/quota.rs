//! What tenants' quotas count, and the checks against them (see `crate::tenants`).

use fencing::ResourceName;

use super::Core;
use crate::error::AcquireError;
use crate::tenants::TenantIx;

/// What a tenant's usage counts.
#[derive(Clone, Copy)]
pub(super) enum Counted {
    Leases,
    Waiters,
    Requests,
}

impl Core {
    /// The owner of `resource`, if tenants are in force and one owns it.
    pub(super) fn owner(&self, resource: &ResourceName) -> Option<TenantIx> {
        self.tenancy.as_ref()?.owner_ix(resource.as_str())
    }

    /// The tenant's acquire rate, if it has one: takes one call from its bucket.
    pub(super) fn take_call(&mut self, owner: Option<TenantIx>) -> Result<(), AcquireError> {
        let (Some(ix), Some(t)) = (owner, &self.tenancy) else {
            return Ok(());
        };
        let tenant = t.tenant(ix);
        let Some(rate) = tenant.quota.acquire_rate else {
            return Ok(());
        };
        self.usage[ix]
            .take_call(rate, self.now)
            .map_err(|retry_after_ms| AcquireError::TenantRateLimited {
                tenant: tenant.name.clone(),
                per_second: rate.per_second,
                retry_after_ms,
            })
    }

    /// Whether the owner may have `n` more of `what`.
    pub(super) fn check_quota(
        &self,
        owner: Option<TenantIx>,
        what: Counted,
        n: usize,
    ) -> Result<(), AcquireError> {
        let (Some(ix), Some(t)) = (owner, &self.tenancy) else {
            return Ok(());
        };
        let (tenant, usage, caps) = (t.tenant(ix), &self.usage[ix], &self.caps[ix]);
        let name = || tenant.name.clone();
        match what {
            Counted::Leases if usage.leases + n > caps.leases => {
                Err(AcquireError::TenantLeasesExhausted {
                    tenant: name(),
                    max: caps.leases,
                })
            }
            Counted::Waiters if usage.waiters + n > caps.waiters => {
                Err(AcquireError::TenantWaitersExhausted {
                    tenant: name(),
                    max: caps.waiters,
                })
            }
            Counted::Requests if usage.requests + n > caps.requests => {
                Err(AcquireError::TenantRequestsExhausted {
                    tenant: name(),
                    max: caps.requests,
                })
            }
            _ => Ok(()),
        }
    }

    /// Counts one of `what` of `resource` in (`delta` 1) or out (-1) of its owner's usage.
    pub(super) fn count(&mut self, resource: &str, what: Counted, delta: isize) {
        let Some(ix) = self.tenancy.as_ref().and_then(|t| t.owner_ix(resource)) else {
            return;
        };
        let u = &mut self.usage[ix];
        let n = match what {
            Counted::Leases => &mut u.leases,
            Counted::Waiters => &mut u.waiters,
            Counted::Requests => &mut u.requests,
        };
        *n = n
            .checked_add_signed(delta)
            .expect("usage counts never go below zero");
    }
}
