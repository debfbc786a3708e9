//! The gRPC service `fencing.lock.v1.LockService`: validates and converts wire messages, calls
//! the driver, converts the answer back. No decisions are made here.
//!
//! Over etcd, a call that reaches an instance that does not lead is forwarded to the leader
//! as it came (with its deadline), and the leader's answer goes back unchanged.
//!
//! With a policy, every call is first authenticated and authorised (`crate::policy`), on the
//! instance it reaches and again on the leader, which learns the caller from the forwarded
//! bearer token or, for a caller known by its certificate, from the forwarding peer.

use std::sync::Arc;
use std::time::Duration;

use fencing::{LeaseId, ResourceName};
use lockd_core::{
    AcquireError, AcquireRequest, Busy, Grant, Holder, InvalidArgument, Limits, Owner,
    ReleaseOutcome, RequestId,
};
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_service_server::LockService;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::driver::{AcquireReply, Driver, DriverError};
use crate::ha::{FORWARDED_METADATA, Ha, INSTANCE_METADATA, PROBE_METADATA, Route};
use crate::policy::{FORWARDED_IDENTITY_METADATA, Identity, Policy};
use crate::status::invalid_argument;

mod sets;

/// Where the service's calls go.
#[derive(Clone)]
pub enum Routes {
    /// The core in this process, over the embedded store.
    Single(Arc<Driver>),
    /// An etcd cluster: the core of whichever instance leads.
    Cluster(Arc<Ha>),
}

pub struct LockApi {
    routes: Routes,
    limits: Limits,
    /// Signs each grant's token (`fence_keys`), if set.
    keys: Option<Arc<fencing::signed::Keyring>>,
    /// Who may call, and on what (`policy`), if set.
    policy: Option<Arc<Policy>>,
}

type Leader = lockd_proto::v1::lock_service_client::LockServiceClient<tonic::transport::Channel>;

/// How a call is served: here, or by the leader.
enum Served<T, R> {
    Local(Arc<Driver>, T),
    Remote(Response<R>),
}

/// A status that no lockd sent (every lockd status carries its code): the forwarded call did
/// not reach the leader, or its connection broke (a leader killed mid-call resets its streams:
/// `UNKNOWN` or `CANCELLED`, or `INTERNAL` for a protocol error).
fn from_transport(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::Internal
    ) && !s.metadata().contains_key(lockd_proto::ERROR_CODE_METADATA)
}

/// The call's own deadline (`grpc-timeout`), if it has one.
fn grpc_timeout<T>(request: &Request<T>) -> Option<Duration> {
    let v = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Who made a call, as the leader must learn it: the caller's bearer token, or the name of
/// the identity its certificate proved here.
#[derive(Clone)]
enum Caller {
    Anyone,
    Token(tonic::metadata::AsciiMetadataValue),
    Named(tonic::metadata::AsciiMetadataValue),
}

/// A request as it goes on to the leader: the same message and deadline, marked forwarded,
/// with its caller.
fn forwarded<T>(message: T, timeout: Option<Duration>, caller: &Caller) -> Request<T> {
    let mut out = Request::new(message);
    if let Some(t) = timeout {
        out.set_timeout(t);
    }
    let m = out.metadata_mut();
    m.insert(FORWARDED_METADATA, MetadataValue::from_static("1"));
    match caller {
        Caller::Anyone => {}
        Caller::Token(v) => {
            m.insert("authorization", v.clone());
        }
        Caller::Named(v) => {
            m.insert(FORWARDED_IDENTITY_METADATA, v.clone());
        }
    }
    out
}

impl LockApi {
    pub fn new(
        routes: Routes,
        limits: Limits,
        keys: Option<Arc<fencing::signed::Keyring>>,
        policy: Option<Arc<Policy>>,
    ) -> LockApi {
        LockApi {
            routes,
            limits,
            keys,
            policy,
        }
    }

    /// Who makes `request`, and whether it may use `resource` (a listing names none): `None`
    /// without a policy.
    fn admit<T>(
        &self,
        request: &Request<T>,
        resource: Option<&str>,
    ) -> Result<Option<Arc<Identity>>, Status> {
        let Some(policy) = &self.policy else {
            return Ok(None);
        };
        let certs = request.peer_certs();
        let who = policy.authenticate(request.metadata(), certs.as_deref().map(Vec::as_slice))?;
        if let Some(resource) = resource {
            policy.authorize(who, resource)?;
        }
        Ok(Some(Arc::clone(who)))
    }

    /// Who makes `request`, and whether it may use every one of `resources` (a batch): `None`
    /// without a policy. One resource it may not use refuses the whole call.
    fn admit_all<'a, T>(
        &self,
        request: &Request<T>,
        resources: impl Iterator<Item = &'a str>,
    ) -> Result<Option<Arc<Identity>>, Status> {
        let who = self.admit(request, None)?;
        if let (Some(policy), Some(who)) = (&self.policy, &who) {
            for resource in resources {
                policy.authorize(who, resource)?;
            }
        }
        Ok(who)
    }

    /// Where `request` is served: here (its message, with the driver), or by the leader (its
    /// answer, passed back unchanged). A forwarded call that does not reach the leader, or
    /// whose leader is replaced while it runs (it died, or was paused), goes once more to
    /// whoever leads next, here included: every call is safe to repeat (a grant only under
    /// its request id, which a retry finds).
    async fn serve<T, R, F, Fut>(
        &self,
        request: Request<T>,
        who: Option<&Identity>,
        call: F,
    ) -> Result<Served<T, R>, Status>
    where
        T: Clone,
        F: Fn(Leader, Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<R>, Status>>,
    {
        let ha = match &self.routes {
            Routes::Single(driver) => {
                return Ok(Served::Local(Arc::clone(driver), request.into_inner()));
            }
            Routes::Cluster(ha) => ha,
        };
        let was_forwarded = request.metadata().contains_key(FORWARDED_METADATA);
        let timeout = grpc_timeout(&request);
        let caller = match (&self.policy, request.metadata().get("authorization")) {
            (None, _) => Caller::Anyone,
            (Some(_), Some(token)) => Caller::Token(token.clone()),
            (Some(_), None) => match who.map(|w| MetadataValue::try_from(w.name.as_str())) {
                Some(Ok(name)) => Caller::Named(name),
                _ => Caller::Anyone,
            },
        };
        let message = request.into_inner();
        let mut route = ha.route(was_forwarded).await?;
        for attempt in 0..2 {
            let (leader, address) = match route {
                Route::Local(driver) => return Ok(Served::Local(driver, message)),
                Route::Forward(leader, address) => (leader, address),
            };
            let answer = tokio::select! {
                answer = call(leader, forwarded(message.clone(), timeout, &caller)) => Some(answer),
                () = ha.moved_from(&address) => None,
            };
            match answer {
                Some(Err(s)) if from_transport(&s) && attempt == 0 => {}
                Some(answer) => return answer.map(Served::Remote),
                None if attempt == 0 => {}
                None => break,
            }
            route = ha.reroute(&address).await?;
        }
        Err(crate::status::not_leader(
            "the leadership moved twice during the call; retry".to_string(),
        ))
    }

    /// A request's id as lockd keeps it: checked, then the caller's own. Another identity's
    /// retry of the same id is another request, and learns nothing of the first (identity
    /// names have no `/`; see `scoped`). `None` when the request has none.
    fn request_id(&self, text: &str, scope: &str) -> Result<Option<RequestId>, Status> {
        if text.is_empty() {
            return Ok(None);
        }
        RequestId::new(text, &self.limits).map_err(|e| invalid_argument(&e))?;
        Ok(RequestId::from_persisted(&scoped(scope, text)))
    }

    /// A request's holder, checked; with a policy, the authenticated identity first, then the
    /// client's own description.
    fn holder(&self, text: &str, who: Option<&Identity>) -> Result<Holder, Status> {
        let holder = Holder::new(text, &self.limits).map_err(|e| invalid_argument(&e))?;
        Ok(match who {
            Some(who) => Holder::from_persisted(&who.holder(text)),
            None => holder,
        })
    }

    /// A grant as the holder gets it: with its signed token, if lockd signs.
    fn lease(&self, driver: &Driver, grant: &Grant, duplicate: bool, held: bool) -> pb::Lease {
        pb::Lease {
            lease_id: grant.lease_id.to_string(),
            token: grant.token.get(),
            signed_token: self
                .keys
                .as_ref()
                .and_then(|k| k.sign(grant.resource.as_str(), grant.token))
                .unwrap_or_default(),
            expires_at_ms: driver.wall_ms(grant.expires_at),
            ttl_ms: grant.ttl_ms,
            duplicate,
            held,
            holds: grant.holds,
            resource: grant.resource.as_str().to_string(),
        }
    }

    /// Who holds a lock that was asked for, as the wire says it.
    fn busy(
        driver: &Driver,
        reason: pb::not_granted::Reason,
        busy: Option<Busy>,
    ) -> pb::NotGranted {
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
        ng
    }

    fn not_granted(
        driver: &Driver,
        reason: pb::not_granted::Reason,
        busy: Option<Busy>,
    ) -> pb::AcquireResponse {
        pb::AcquireResponse {
            outcome: Some(pb::acquire_response::Outcome::NotGranted(Self::busy(
                driver, reason, busy,
            ))),
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

/// The leases of a RenewMany or ReleaseMany, each checked: the first bad entry, named by its
/// index, refuses the whole batch before anything is done.
fn batch(leases: &[pb::LeaseRef]) -> Result<Vec<(ResourceName, LeaseId)>, Status> {
    let bad = |why: String| invalid_argument(&InvalidArgument::Batch(why));
    let max = lockd_core::limits::BATCH_MAX;
    if leases.is_empty() {
        return Err(bad("leases is empty: name at least one lease".to_string()));
    }
    if leases.len() > max {
        return Err(bad(format!(
            "{} leases in one call; the limit is {max} (send several calls)",
            leases.len()
        )));
    }
    leases
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let resource = ResourceName::new(&l.resource)
                .map_err(|e| bad(format!("leases[{i}]: invalid resource name: {e}")))?;
            let id = l
                .lease_id
                .parse()
                .map_err(|e: fencing::ParseLeaseIdError| {
                    bad(format!("leases[{i}]: lease_id is not a lease id: {e}"))
                })?;
            Ok((resource, id))
        })
        .collect()
}

/// An Acquire's side of a read-write lock, from its `mode` and `downgrade_lease_id`.
fn rw_mode(mode: i32, downgrade: &str) -> Result<Option<lockd_core::Rw>, Status> {
    use pb::acquire_request::Mode;
    let mode = Mode::try_from(mode).map_err(|_| invalid_argument(&InvalidArgument::Mode(mode)))?;
    Ok(match (mode, downgrade) {
        (Mode::Unspecified, "") => None,
        (Mode::Read, "") => Some(lockd_core::Rw::Read),
        (Mode::Write, "") => Some(lockd_core::Rw::Write),
        (Mode::Read, lease) => {
            let lease = lease.parse().map_err(|e: fencing::ParseLeaseIdError| {
                invalid_argument(&InvalidArgument::DowngradeLeaseId(e.to_string()))
            })?;
            Some(lockd_core::Rw::Downgrade(lease))
        }
        (_, _) => return Err(invalid_argument(&InvalidArgument::DowngradeNotRead)),
    })
}

impl LockApi {
    async fn acquire_here(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<(Response<pb::AcquireResponse>, &'static str), Status> {
        let who = self.admit(&request, Some(&request.get_ref().resource))?;
        let peer = request.remote_addr();
        let (driver, r) = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.acquire(r).await
            })
            .await?
        {
            Served::Local(driver, r) => (driver, r),
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let scope = who.as_ref().map_or("", |w| w.name.as_str());
        let request_id = self.request_id(&r.request_id, scope)?;
        let resource = resource(&r.resource)?;
        let holder = self.holder(&r.holder, who.as_deref())?;
        let holder_text = holder.as_str().to_string();
        let mut owner = match r.owner.as_str() {
            "" => None,
            o => Some(Owner::new(o).map_err(|e| invalid_argument(&e))?),
        };
        if let Some(o) = &owner {
            // Owners are the caller's own, as request ids are: another identity naming the
            // same owner is another owner, and cannot re-enter.
            owner = Owner::from_persisted(&scoped(scope, o.as_str()));
        }
        let req = AcquireRequest {
            resource,
            request_id,
            holder,
            ttl_ms: r.ttl_ms,
            wait_ms: r.wait_timeout_ms,
            owner,
            permits: r.permits,
            rw: rw_mode(r.mode, &r.downgrade_lease_id)?,
        };
        let reply = driver
            .acquire(req)
            .await
            .map_err(|e| as_spelled(e, &r.request_id))?;
        let outcome = match &reply {
            AcquireReply::Granted {
                duplicate: false,
                grant,
                ..
            } if grant.holds > 1 => "reentered",
            AcquireReply::Granted {
                duplicate: false, ..
            } => "granted",
            AcquireReply::Granted { .. } => "duplicate",
            AcquireReply::Busy(_) => "busy",
            AcquireReply::TimedOut(_) => "wait_timeout",
        };
        if let AcquireReply::Granted { grant, .. } = &reply {
            audit_grant(grant, &holder_text, who.as_deref(), peer, outcome, None);
        }
        let response = match reply {
            AcquireReply::Granted {
                grant,
                duplicate,
                held,
            } => pb::AcquireResponse {
                outcome: Some(pb::acquire_response::Outcome::Granted(
                    self.lease(&driver, &grant, duplicate, held),
                )),
            },
            AcquireReply::Busy(busy) => {
                Self::not_granted(&driver, pb::not_granted::Reason::Busy, Some(busy))
            }
            AcquireReply::TimedOut(busy) => {
                Self::not_granted(&driver, pb::not_granted::Reason::WaitTimeout, busy)
            }
        };
        Ok((Response::new(response), outcome))
    }

    async fn renew_here(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<(Response<pb::RenewResponse>, &'static str), Status> {
        let who = self.admit(&request, Some(&request.get_ref().resource))?;
        let (driver, r) = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.renew(r).await
            })
            .await?
        {
            Served::Local(driver, r) => (driver, r),
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let (resource, lease_id) = (resource(&r.resource)?, lease_id(&r.lease_id)?);
        let renewed = driver.renew(&resource, lease_id).await?;
        let answer = Response::new(pb::RenewResponse {
            expires_at_ms: driver.wall_ms(renewed.expires_at),
            ttl_ms: renewed.ttl_ms,
        });
        Ok((answer, "renewed"))
    }

    async fn release_here(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<(Response<pb::ReleaseResponse>, &'static str), Status> {
        let who = self.admit(&request, Some(&request.get_ref().resource))?;
        let peer = request.remote_addr();
        let (driver, r) = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.release(r).await
            })
            .await?
        {
            Served::Local(driver, r) => (driver, r),
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let (resource, lease_id) = (resource(&r.resource)?, lease_id(&r.lease_id)?);
        let released = driver.release(&resource, lease_id).await?;
        // A client bug, not an idempotent release: its permit, or its reader's lease, is
        // still held under its own name.
        match released {
            ReleaseOutcome::NotHeld {
                semaphore: Some(permits),
                ..
            } => {
                let e = lockd_core::RenewError::Semaphore { resource, permits };
                return Err(crate::status::from_driver(&DriverError::Renew(e)));
            }
            ReleaseOutcome::NotHeld {
                reader_slot: Some(slot),
                ..
            } => {
                let e = lockd_core::RenewError::Readers { resource, slot };
                return Err(crate::status::from_driver(&DriverError::Renew(e)));
            }
            _ => {}
        }
        let asked = pb::LeaseRef {
            resource: r.resource,
            lease_id: r.lease_id,
        };
        audit_release(&asked, &released, who.as_deref(), peer);
        let outcome = match released {
            ReleaseOutcome::Released { .. } => "released",
            ReleaseOutcome::Unheld { .. } => "unheld",
            ReleaseOutcome::NotHeld { .. } => "not_held",
        };
        Ok((Response::new(release_response(&released)), outcome))
    }

    async fn renew_many_here(
        &self,
        request: Request<pb::RenewManyRequest>,
    ) -> Result<(Response<pb::RenewManyResponse>, &'static str), Status> {
        // Checked first, so that a malformed batch is told so, and before any authorising.
        let leases = batch(&request.get_ref().leases)?;
        let names = leases.iter().map(|(r, _)| r.as_str());
        let who = self.admit_all(&request, names)?;
        let driver = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.renew_many(r).await
            })
            .await?
        {
            Served::Local(driver, _) => driver,
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let results = driver.renew_many(&leases).await?;
        let results = results
            .into_iter()
            .map(|result| match result {
                Ok(renewed) => Ok(pb::RenewResult {
                    renewed: true,
                    expires_at_ms: driver.wall_ms(renewed.expires_at),
                    ttl_ms: renewed.ttl_ms,
                    current_token: 0,
                }),
                Err(lockd_core::RenewError::NotCurrent { current, .. }) => Ok(pb::RenewResult {
                    current_token: current.map_or(0, |t| t.get()),
                    ..Default::default()
                }),
                // A semaphore's or a read-write lock's own name in a batch: that entry is not
                // renewed.
                Err(
                    lockd_core::RenewError::Semaphore { .. }
                    | lockd_core::RenewError::Readers { .. },
                ) => Ok(pb::RenewResult::default()),
                Err(lockd_core::RenewError::Invalid(e)) => Err(invalid_argument(&e)),
            })
            .collect::<Result<_, Status>>()?;
        let answer = Response::new(pb::RenewManyResponse { results });
        Ok((answer, "renewed"))
    }

    async fn release_many_here(
        &self,
        request: Request<pb::ReleaseManyRequest>,
    ) -> Result<(Response<pb::ReleaseManyResponse>, &'static str), Status> {
        let leases = batch(&request.get_ref().leases)?;
        let names = leases.iter().map(|(r, _)| r.as_str());
        let who = self.admit_all(&request, names)?;
        let peer = request.remote_addr();
        let (driver, r) = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.release_many(r).await
            })
            .await?
        {
            Served::Local(driver, r) => (driver, r),
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let outcomes = driver.release_many(&leases).await?;
        let results = outcomes
            .iter()
            .zip(&r.leases)
            .map(|(outcome, asked)| {
                audit_release(asked, outcome, who.as_deref(), peer);
                release_response(outcome)
            })
            .collect();
        let answer = Response::new(pb::ReleaseManyResponse { results });
        Ok((answer, "released"))
    }

    async fn describe_here(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<(Response<pb::DescribeResponse>, &'static str), Status> {
        // A leader checking that its advertised address reaches it: answered here, by name.
        if let (Routes::Cluster(ha), true) = (
            &self.routes,
            request.metadata().contains_key(PROBE_METADATA),
        ) {
            let mut answer = Response::new(pb::DescribeResponse::default());
            if let Ok(id) = MetadataValue::try_from(ha.instance_id()) {
                answer.metadata_mut().insert(INSTANCE_METADATA, id);
            }
            return Ok((answer, "probe"));
        }
        let who = self.admit(&request, Some(&request.get_ref().resource))?;
        let (driver, r) = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.describe(r).await
            })
            .await?
        {
            Served::Local(driver, r) => (driver, r),
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let resource = resource(&r.resource)?;
        let d = driver.describe(&resource).await?;
        let waiters = u32::try_from(d.waiters).unwrap_or(u32::MAX);
        // Any name's waiters and read-write use; a lease's holder, or a semaphore's permits.
        let common = pb::DescribeResponse {
            waiters,
            read_write: d.readers.is_some(),
            readers: d.readers.unwrap_or(0),
            ..Default::default()
        };
        let answer = Response::new(match d.held {
            Some(h) => pb::DescribeResponse {
                held: true,
                holder: h.holder.as_str().to_string(),
                token: h.token.get(),
                expires_at_ms: driver.wall_ms(h.expires_at),
                ttl_ms: h.ttl_ms,
                holds: h.holds,
                ..common
            },
            None => pb::DescribeResponse {
                permits: d.permits.map_or(0, |p| p.permits),
                permits_held: d.permits.map_or(0, |p| p.held),
                ..common
            },
        });
        Ok((answer, "described"))
    }
}

impl LockApi {
    async fn list_here(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<(Response<pb::ListResponse>, &'static str), Status> {
        let who = self.admit(&request, None)?;
        let (driver, r) = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.list(r).await
            })
            .await?
        {
            Served::Local(driver, r) => (driver, r),
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let bad = |why: String| invalid_argument(&InvalidArgument::List(why));
        let limit = match r.page_size as usize {
            0 => lockd_core::limits::LIST_PAGE_DEFAULT,
            n if n > lockd_core::limits::LIST_PAGE_MAX => {
                return Err(bad(format!(
                    "page_size {n} is above the maximum {}",
                    lockd_core::limits::LIST_PAGE_MAX
                )));
            }
            n => n,
        };
        let from = match r.page_token.as_str() {
            "" => 0,
            t => t.parse::<u32>().map_err(|_| {
                bad("page_token is not one lockd gave (pass next_page_token as it came)".into())
            })?,
        };
        if !r.prefix.is_empty() {
            ResourceName::validate(&r.prefix).map_err(|e| bad(format!("prefix: {e}")))?;
        }
        let (policy, prefix) = (self.policy.clone(), r.prefix.clone());
        let keep = move |name: &str| {
            name.starts_with(prefix.as_str())
                && match (&policy, &who) {
                    (Some(p), Some(w)) => p.owns(w, name),
                    _ => true,
                }
        };
        let page = driver.list(from, limit, keep).await?;
        let now = driver.clock().now();
        let locks = page
            .locks
            .into_iter()
            .map(|l| pb::HeldLock {
                resource: l.resource.as_str().to_string(),
                holder: l.holder.as_str().to_string(),
                token: l.token.get(),
                expires_at_ms: driver.wall_ms(l.expires_at),
                ttl_ms: l.ttl_ms,
                held_for_ms: now.saturating_sub(l.granted_at),
                waiters: u32::try_from(l.waiters).unwrap_or(u32::MAX),
            })
            .collect();
        let answer = pb::ListResponse {
            locks,
            next_page_token: page.next.map(|n| n.to_string()).unwrap_or_default(),
        };
        Ok((Response::new(answer), "listed"))
    }
}

/// The audit record of one release (alone or in a batch).
/// A refused reuse of a request id, named as the caller spelled the id, not as lockd keeps
/// it (`scoped`).
fn as_spelled(e: DriverError, spelled: &str) -> DriverError {
    let DriverError::Acquire(mut a) = e else {
        return e;
    };
    match &mut a {
        AcquireError::RequestIdReused { request_id, .. }
        | AcquireError::SetIdReused { request_id, .. }
        | AcquireError::RequestIdWaitsAs { request_id, .. }
        | AcquireError::RequestIdUsedAs { request_id, .. } => *request_id = spelled.to_string(),
        _ => {}
    }
    DriverError::Acquire(a)
}

/// The audit log's record of a grant answered (`set`: the size of the AcquireAll it is
/// part of).
fn audit_grant(
    grant: &Grant,
    holder: &str,
    who: Option<&Identity>,
    peer: Option<std::net::SocketAddr>,
    result: &str,
    set: Option<usize>,
) {
    if !crate::audit::on() {
        return;
    }
    crate::audit::record(
        "grant",
        serde_json::json!({
            "resource": grant.resource.as_str(),
            "lease": crate::audit::lease_fingerprint(&grant.lease_id.to_string()),
            "token": grant.token.get(),
            "holder": holder,
            "identity": who.map(|w| w.name.as_str()),
            "peer": peer.map(|p| p.to_string()),
            "result": result,
            "set": set,
        }),
    );
}

fn audit_release(
    asked: &pb::LeaseRef,
    outcome: &ReleaseOutcome,
    who: Option<&Identity>,
    peer: Option<std::net::SocketAddr>,
) {
    crate::audit::record(
        "release",
        serde_json::json!({
            "resource": asked.resource.as_str(),
            "lease": crate::audit::lease_fingerprint(&asked.lease_id),
            "token": match outcome {
                ReleaseOutcome::Released { token, .. } | ReleaseOutcome::Unheld { token, .. } => {
                    Some(token.get())
                }
                ReleaseOutcome::NotHeld { .. } => None,
            },
            "identity": who.map(|w| w.name.as_str()),
            "peer": peer.map(|p| p.to_string()),
            "result": match outcome {
                ReleaseOutcome::Released { .. } => "released",
                ReleaseOutcome::Unheld { .. } => "unheld",
                ReleaseOutcome::NotHeld { .. } => "not_held",
            },
            "holds_left": match outcome {
                ReleaseOutcome::Unheld { holds, .. } => Some(*holds),
                _ => None,
            },
        }),
    );
}

fn release_response(outcome: &ReleaseOutcome) -> pb::ReleaseResponse {
    match outcome {
        ReleaseOutcome::Released { .. } => pb::ReleaseResponse {
            released: true,
            current_token: 0,
            holds: 0,
        },
        ReleaseOutcome::Unheld { token, holds } => pb::ReleaseResponse {
            released: true,
            current_token: token.get(),
            holds: *holds,
        },
        ReleaseOutcome::NotHeld { current, .. } => pb::ReleaseResponse {
            released: false,
            current_token: current.map_or(0, |t| t.get()),
            holds: 0,
        },
    }
}

/// The outcome label of a refused call, from its stable code (docs/operations.md).
fn refused(s: &Status) -> &'static str {
    use crate::status::codes;
    let code = s
        .metadata()
        .get(lockd_proto::ERROR_CODE_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match code {
        codes::INVALID_ARGUMENT | codes::REQUEST_ID_REUSED => "invalid",
        codes::LEASE_NOT_CURRENT => "not_current",
        codes::QUEUE_FULL => "queue_full",
        codes::TENANT_WAITERS_EXHAUSTED
        | codes::TENANT_LEASES_EXHAUSTED
        | codes::TENANT_REQUESTS_EXHAUSTED
        | codes::TENANT_RATE_LIMITED => "tenant_quota",
        codes::WAITERS_EXHAUSTED
        | codes::LEASES_EXHAUSTED
        | codes::REQUESTS_EXHAUSTED
        | codes::TOKENS_EXHAUSTED => "exhausted",
        codes::UNAUTHENTICATED | codes::PERMISSION_DENIED => "denied",
        codes::SUPERSEDED => "superseded",
        _ => "unavailable",
    }
}

/// What the audit log says of a call that is refused.
struct Call {
    method: &'static str,
    resource: String,
    peer: Option<std::net::SocketAddr>,
}

impl Call {
    fn of<T>(method: &'static str, request: &Request<T>, resource: &str) -> Call {
        Call {
            method,
            resource: if crate::audit::on() || crate::metrics::on() {
                resource.to_string()
            } else {
                String::new()
            },
            peer: request.remote_addr(),
        }
    }
}

/// `answer` as the call's result, counted under `method` with its outcome and duration, and
/// a refusal written to the audit log.
fn counted<R>(
    call: Call,
    started: std::time::Instant,
    answer: Result<(Response<R>, &'static str), Status>,
) -> Result<Response<R>, Status> {
    let method = call.method;
    let outcome = match &answer {
        Ok((_, outcome)) => outcome,
        Err(s) => {
            let outcome = refused(s);
            crate::metrics::get().refused(|| crate::metrics::Refused {
                method,
                resource: call.resource.clone(),
                peer: call.peer,
                outcome,
                reason: s.message().to_string(),
            });
            crate::audit::record(
                "refusal",
                serde_json::json!({
                    "method": method,
                    "resource": call.resource,
                    "peer": call.peer.map(|p| p.to_string()),
                    "result": outcome,
                    "reason": s.message(),
                }),
            );
            outcome
        }
    };
    crate::metrics::get().call(method, outcome, started.elapsed());
    answer.map(|(r, _)| r)
}

#[tonic::async_trait]
impl LockService for LockApi {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("acquire", &request, &request.get_ref().resource);
        counted(call, started, self.acquire_here(request).await)
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("renew", &request, &request.get_ref().resource);
        counted(call, started, self.renew_here(request).await)
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("release", &request, &request.get_ref().resource);
        counted(call, started, self.release_here(request).await)
    }

    async fn renew_many(
        &self,
        request: Request<pb::RenewManyRequest>,
    ) -> Result<Response<pb::RenewManyResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("renew_many", &request, "");
        counted(call, started, self.renew_many_here(request).await)
    }

    async fn release_many(
        &self,
        request: Request<pb::ReleaseManyRequest>,
    ) -> Result<Response<pb::ReleaseManyResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("release_many", &request, "");
        counted(call, started, self.release_many_here(request).await)
    }

    async fn acquire_all(
        &self,
        request: Request<pb::AcquireAllRequest>,
    ) -> Result<Response<pb::AcquireAllResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("acquire_all", &request, "");
        counted(call, started, self.acquire_all_here(request).await)
    }

    async fn describe(
        &self,
        request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("describe", &request, &request.get_ref().resource);
        counted(call, started, self.describe_here(request).await)
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let started = std::time::Instant::now();
        let call = Call::of("list", &request, &request.get_ref().prefix);
        counted(call, started, self.list_here(request).await)
    }
}

/// A caller's request id or owner as lockd keeps it: `identity/id`, and `/id` without a policy
/// (an anonymous caller). Identity names are not empty and have no `/`, so no two callers'
/// spellings meet, across a change of policy too: an anonymous `a/x` is `/a/x`, identity a's
/// `x` is `a/x`.
fn scoped(identity: &str, id: &str) -> String {
    format!("{identity}/{id}")
}
