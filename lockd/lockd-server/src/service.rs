//! The gRPC service `fencing.lock.v1.LockService`: validates and converts wire messages, calls
//! the driver, converts the answer back. No decisions are made here.

use std::sync::Arc;

use fencing::{LeaseId, ResourceName};
use lockd_core::{
    AcquireRequest, Busy, Holder, InvalidArgument, Limits, ReleaseOutcome, RequestId,
};
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_service_server::LockService;
use tonic::{Request, Response, Status};

use crate::driver::{AcquireReply, Driver};
use crate::status::{from_etcd, invalid_argument};
use lockd_store_etcd::{AcquireArgs, Acquired, BusyInfo, EtcdLocks};

/// Where the service's calls go.
pub enum Locks {
    /// The core in this process, over the embedded store.
    Embedded(Arc<Driver>),
    /// The etcd cluster (stateless lockd instances).
    Etcd(Arc<EtcdLocks>),
}

pub struct LockApi {
    locks: Locks,
    limits: Limits,
}

fn etcd_busy(reason: pb::not_granted::Reason, busy: Option<BusyInfo>) -> pb::AcquireResponse {
    let mut ng = pb::NotGranted {
        reason: reason as i32,
        ..Default::default()
    };
    if let Some(b) = busy {
        ng.holder = b.holder;
        ng.token = b.token.get();
        ng.expires_at_ms = b.expires_at_ms;
        ng.waiters = u32::try_from(b.waiters).unwrap_or(u32::MAX);
    }
    pb::AcquireResponse {
        outcome: Some(pb::acquire_response::Outcome::NotGranted(ng)),
    }
}

impl LockApi {
    pub fn new(locks: Locks, limits: Limits) -> LockApi {
        LockApi { locks, limits }
    }

    fn not_granted(
        driver: &Driver,
        reason: pb::not_granted::Reason,
        busy: Option<Busy>,
    ) -> pb::AcquireResponse {
        let mut ng = pb::NotGranted {
            reason: reason as i32,
            ..Default::default()
        };
        if let Some(b) = busy {
            ng.holder = b.holder.as_str().to_string();
            ng.token = b.token.get();
            ng.expires_at_ms = driver.wall_ms(b.expires_at);
            ng.waiters = u32::try_from(b.waiters).unwrap_or(u32::MAX);
        }
        pb::AcquireResponse {
            outcome: Some(pb::acquire_response::Outcome::NotGranted(ng)),
        }
    }
}

fn resource(name: &str) -> Result<ResourceName, Status> {
    ResourceName::new(name).map_err(|e| invalid_argument(&InvalidArgument::Resource(e)))
}

fn lease_id(text: &str) -> Result<LeaseId, Status> {
    text.parse().map_err(|e: fencing::ParseLeaseIdError| {
        invalid_argument(&InvalidArgument::LeaseId(e.to_string()))
    })
}

#[tonic::async_trait]
impl LockService for LockApi {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let r = request.into_inner();
        let request_id = match r.request_id.as_str() {
            "" => None,
            id => Some(RequestId::new(id, &self.limits).map_err(|e| invalid_argument(&e))?),
        };
        let resource = resource(&r.resource)?;
        let holder = Holder::new(&r.holder, &self.limits).map_err(|e| invalid_argument(&e))?;
        let driver = match &self.locks {
            Locks::Embedded(driver) => driver,
            Locks::Etcd(etcd) => {
                let args = AcquireArgs {
                    resource,
                    request_id,
                    holder,
                    ttl_ms: r.ttl_ms,
                    wait_ms: r.wait_timeout_ms,
                };
                let response = match etcd.acquire(args).await.map_err(|e| from_etcd(&e))? {
                    Acquired::Granted {
                        lease,
                        duplicate,
                        held,
                    } => pb::AcquireResponse {
                        outcome: Some(pb::acquire_response::Outcome::Granted(pb::Lease {
                            lease_id: lease.lease_id.to_string(),
                            token: lease.token.get(),
                            expires_at_ms: lease.expires_at_ms,
                            ttl_ms: lease.ttl_ms,
                            duplicate,
                            held,
                        })),
                    },
                    Acquired::Busy(b) => etcd_busy(pb::not_granted::Reason::Busy, b),
                    Acquired::TimedOut(b) => etcd_busy(pb::not_granted::Reason::WaitTimeout, b),
                };
                return Ok(Response::new(response));
            }
        };
        let req = AcquireRequest {
            resource,
            request_id,
            holder,
            ttl_ms: r.ttl_ms,
            wait_ms: r.wait_timeout_ms,
        };
        let response = match driver.acquire(req).await? {
            AcquireReply::Granted {
                grant,
                duplicate,
                held,
            } => pb::AcquireResponse {
                outcome: Some(pb::acquire_response::Outcome::Granted(pb::Lease {
                    lease_id: grant.lease_id.to_string(),
                    token: grant.token.get(),
                    expires_at_ms: driver.wall_ms(grant.expires_at),
                    ttl_ms: grant.ttl_ms,
                    duplicate,
                    held,
                })),
            },
            AcquireReply::Busy(busy) => {
                Self::not_granted(driver, pb::not_granted::Reason::Busy, Some(busy))
            }
            AcquireReply::TimedOut(busy) => {
                Self::not_granted(driver, pb::not_granted::Reason::WaitTimeout, busy)
            }
        };
        Ok(Response::new(response))
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let r = request.into_inner();
        let (resource, lease_id) = (resource(&r.resource)?, lease_id(&r.lease_id)?);
        let reply = match &self.locks {
            Locks::Embedded(driver) => {
                let renewed = driver.renew(&resource, lease_id).await?;
                pb::RenewResponse {
                    expires_at_ms: driver.wall_ms(renewed.expires_at),
                    ttl_ms: renewed.ttl_ms,
                }
            }
            Locks::Etcd(etcd) => {
                let lease = etcd
                    .renew(&resource, lease_id)
                    .await
                    .map_err(|e| from_etcd(&e))?;
                pb::RenewResponse {
                    expires_at_ms: lease.expires_at_ms,
                    ttl_ms: lease.ttl_ms,
                }
            }
        };
        Ok(Response::new(reply))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let r = request.into_inner();
        let (resource, lease_id) = (resource(&r.resource)?, lease_id(&r.lease_id)?);
        let outcome = match &self.locks {
            Locks::Embedded(driver) => driver.release(&resource, lease_id).await?,
            Locks::Etcd(etcd) => match etcd
                .release(&resource, lease_id)
                .await
                .map_err(|e| from_etcd(&e))?
            {
                None => ReleaseOutcome::Released {
                    token: fencing::FencingToken::MIN,
                },
                Some(current) => ReleaseOutcome::NotHeld { current },
            },
        };
        Ok(Response::new(match outcome {
            ReleaseOutcome::Released { .. } => pb::ReleaseResponse {
                released: true,
                current_token: 0,
            },
            ReleaseOutcome::NotHeld { current } => pb::ReleaseResponse {
                released: false,
                current_token: current.map_or(0, |t| t.get()),
            },
        }))
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        let r = request.into_inner();
        let resource = resource(&r.resource)?;
        let driver = match &self.locks {
            Locks::Embedded(driver) => driver,
            Locks::Etcd(etcd) => {
                let (held, waiters) = etcd.describe(&resource).await.map_err(|e| from_etcd(&e))?;
                let waiters = u32::try_from(waiters).unwrap_or(u32::MAX);
                return Ok(Response::new(match held {
                    Some(b) => pb::DescribeResponse {
                        held: true,
                        holder: b.holder,
                        token: b.token.get(),
                        expires_at_ms: b.expires_at_ms,
                        ttl_ms: b.ttl_ms,
                        waiters,
                    },
                    None => pb::DescribeResponse {
                        waiters,
                        ..Default::default()
                    },
                }));
            }
        };
        let d = driver.describe(&resource).await?;
        let waiters = u32::try_from(d.waiters).unwrap_or(u32::MAX);
        Ok(Response::new(match d.held {
            Some(h) => pb::DescribeResponse {
                held: true,
                holder: h.holder.as_str().to_string(),
                token: h.token.get(),
                expires_at_ms: driver.wall_ms(h.expires_at),
                ttl_ms: h.ttl_ms,
                waiters,
            },
            None => pb::DescribeResponse {
                waiters,
                ..Default::default()
            },
        }))
    }
}
