//! Several locks at once: all or none in one call to lockd ([`Client::acquire_all`]), or one
//! after another in a fixed order ([`Client::acquire_ordered`]).
//!
//! Which to use:
//! - `acquire_all` when the set must be taken whole or not at all, and is small (at most 32
//!   resources). lockd grants it in one decision and one commit; it never waits in a queue
//!   (a set that waited would hold some members while it waits for the others), so with a
//!   wait the SDK asks again, with backoff, until the wait ends.
//! - `acquire_ordered` to wait for each lock in its FIFO queue. The locks are taken in
//!   canonical (sorted) order, so two callers that both use it never deadlock, whatever order
//!   they name the resources in; one deadline covers the whole set, and on any failure the
//!   locks taken so far are released, last first.

use fencing::ResourceName;
use lockd_proto::v1 as pb;
use tokio::time::Instant;

use crate::retried::{self, GiveBack, ask_again_after};
use crate::{
    AcquireOptions, Acquired, Backoff, CALL_GRACE, Client, ClientError, Lease, LockGuard,
    NotGranted, Renewal, answered_each, endpoints, lease_of, new_request_id, not_granted,
};

/// The result of taking a set of locks.
#[derive(Debug)]
pub enum AcquiredAll {
    /// Every lock, one guard each, in the order asked (`acquire_all`) or in sorted order
    /// (`acquire_ordered`).
    Granted(Vec<LockGuard>),
    /// Nothing is held. `resource` is a member that could not be taken, and `why` says who
    /// held it.
    NotGranted { resource: String, why: NotGranted },
}

impl Client {
    /// Takes every resource of `resources` at once, or none: one lease and token each, granted
    /// in one commit at lockd (see the module documentation). `opts.request_id` names the
    /// whole set; `opts.owner` must be `None` (set leases are not reentrant).
    pub async fn acquire_all(
        &self,
        resources: &[&str],
        opts: AcquireOptions,
    ) -> Result<AcquiredAll, ClientError> {
        if opts.owner.is_some() {
            return Err(ClientError::InvalidArgument(
                "a set's leases are not reentrant: acquire_all takes no owner".to_string(),
            ));
        }
        if opts.permits > 0 {
            return Err(ClientError::InvalidArgument(
                "a set is of exclusive locks: acquire_all takes no permits".to_string(),
            ));
        }
        check_names(resources)?;
        let ttl_ms = opts.ttl.map_or(0, |t| t.as_millis() as u64);
        let mut request_id = opts.request_id.clone().unwrap_or_else(new_request_id);
        let deadline = Instant::now() + opts.wait;
        let mut backoff = Backoff::new();
        loop {
            let req = pb::AcquireAllRequest {
                resources: resources.iter().map(|r| r.to_string()).collect(),
                request_id: request_id.clone(),
                ttl_ms,
                holder: opts.holder.clone(),
            };
            // A fresh grant in the reply was made after this moment.
            let sent = std::time::Instant::now();
            let (endpoint, mut rpc) = self.endpoints.rpc();
            // Dropped while the call is out or after it failed, the set may have been granted,
            // the answer lost: the guard asks again and releases it (endpoints::Abandoned).
            let abandoned = endpoints::Abandoned::set(self.clone(), req.clone());
            let call = tokio::time::timeout(CALL_GRACE, rpc.acquire_all(self.request(req))).await;
            let abandoned = abandoned.unless_answered(&call);
            let status = match call {
                Ok(Ok(resp)) => {
                    let resp = resp.into_inner();
                    match resp.outcome {
                        Some(pb::acquire_all_response::Outcome::Granted(set)) => {
                            answered_each(resources.len(), set.leases.len())?;
                            let duplicate = set.leases.iter().any(|l| l.duplicate);
                            let all_held = set.leases.iter().all(|l| l.held);
                            let leases: Vec<Lease> = resources
                                .iter()
                                .zip(set.leases)
                                .map(|(r, l)| lease_of(r, l, None))
                                .collect();
                            if !duplicate {
                                return Ok(self.guards(leases, sent));
                            }
                            // An earlier attempt's grant whose reply was lost: renew every
                            // lease to learn a safe deadline, or give back what is left of
                            // it and ask anew. Under the caller's own id the grant may have been
                            // an earlier run's, used and partly ended: never granted twice, and
                            // what is left of it is left to its TTL.
                            if all_held {
                                // Given up meanwhile, the set is released (`retried::GiveBack`).
                                let give_back = GiveBack::new(self, &leases);
                                let outcome = match self.renewed(&leases).await {
                                    Ok(found) => Ok((found, false)),
                                    Err(e) => ask_again_after(e, deadline.into_std(), &mut backoff)
                                        .await
                                        .map(|()| (None, true)),
                                };
                                give_back.disarm();
                                match outcome? {
                                    (Some(guards), _) => return Ok(guards),
                                    (None, true) => continue,
                                    (None, false) => {}
                                }
                            }
                            retried::unless_own(&opts, &request_id)?;
                            self.give_back(&leases).await;
                            request_id = new_request_id();
                            continue;
                        }
                        Some(pb::acquire_all_response::Outcome::NotGranted(ng)) => {
                            if Instant::now() >= deadline {
                                return Ok(AcquiredAll::NotGranted {
                                    resource: resp.busy_resource,
                                    why: not_granted(&ng, !opts.wait.is_zero()),
                                });
                            }
                            None
                        }
                        None => Some(tonic::Status::internal(
                            "lockd sent an empty AcquireAllResponse",
                        )),
                    }
                }
                Ok(Err(status)) => Some(status),
                Err(_) => Some(tonic::Status::deadline_exceeded(
                    "lockd did not answer in time",
                )),
            };
            let busy = status.is_none();
            if let Some(status) = status {
                self.endpoints.failed(endpoint, &status);
                self.retry_or_fail(status, deadline.into_std())?;
            }
            // Busy: ask again after the backoff, and once more at the deadline. A retry of an
            // error: after the backoff.
            let mut until = Instant::now() + backoff.next_delay();
            if busy {
                until = until.min(deadline);
            }
            tokio::time::sleep_until(until).await;
            endpoints::Abandoned::next_call(abandoned);
        }
    }

    /// Takes each of `resources` in sorted order (a name given twice is taken once), each
    /// waiting in its FIFO queue, all within `opts.wait` from now. On a lock not granted in
    /// time, or an error, the locks taken so far are released in reverse order. Each lock gets
    /// its own request id (`opts.request_id` must be `None`); `opts.owner`, if set, makes each
    /// one reentrant for that owner.
    pub async fn acquire_ordered(
        &self,
        resources: &[&str],
        opts: AcquireOptions,
    ) -> Result<AcquiredAll, ClientError> {
        if opts.request_id.is_some() {
            return Err(ClientError::InvalidArgument(
                "acquire_ordered makes one request id per lock: leave request_id empty".to_string(),
            ));
        }
        if opts.permits > 0 {
            return Err(ClientError::InvalidArgument(
                "acquire_ordered takes exclusive locks: it takes no permits".to_string(),
            ));
        }
        // Every name checked before anything is taken.
        check_names(resources)?;
        let mut order: Vec<&str> = resources.to_vec();
        order.sort_unstable();
        order.dedup();
        let deadline = Instant::now() + opts.wait;
        let mut held: Vec<LockGuard> = Vec::with_capacity(order.len());
        for resource in order {
            let each = AcquireOptions {
                wait: deadline.saturating_duration_since(Instant::now()),
                ..opts.clone()
            };
            let failed = match self.acquire(resource, each).await {
                Ok(Acquired::Granted(guard)) => {
                    held.push(guard);
                    continue;
                }
                Ok(Acquired::NotGranted(why)) => Ok(AcquiredAll::NotGranted {
                    resource: resource.to_string(),
                    why,
                }),
                Err(e) => Err(e),
            };
            while let Some(guard) = held.pop() {
                let name = guard.resource().to_string();
                if let Err(e) = guard.release().await {
                    tracing::warn!(
                        resource = name,
                        "releasing after a failed set: {e} (the lease will expire)"
                    );
                }
            }
            return failed;
        }
        Ok(AcquiredAll::Granted(held))
    }

    fn guards(&self, leases: Vec<Lease>, extended_at: std::time::Instant) -> AcquiredAll {
        AcquiredAll::Granted(
            leases
                .into_iter()
                .map(|l| LockGuard::start(self.clone(), l, extended_at))
                .collect(),
        )
    }

    /// Guards for a retried set's leases, if every one still renews.
    async fn renewed(&self, leases: &[Lease]) -> Result<Option<AcquiredAll>, ClientError> {
        let refs: Vec<(&str, &str)> = leases
            .iter()
            .map(|l| (l.resource.as_str(), l.lease_id.as_str()))
            .collect();
        let sent = std::time::Instant::now();
        let renewals = self.renew_many(&refs).await?;
        Ok(renewals
            .iter()
            .all(|r| matches!(r, Renewal::Renewed(_)))
            .then(|| self.guards(leases.to_vec(), sent)))
    }

    /// Releases what is left of a set that will not be used.
    pub(crate) async fn give_back(&self, leases: &[Lease]) {
        let refs: Vec<(&str, &str)> = leases
            .iter()
            .map(|l| (l.resource.as_str(), l.lease_id.as_str()))
            .collect();
        if let Err(e) = self.release_many(&refs).await {
            tracing::warn!("releasing an unused set failed (its leases will expire): {e}");
        }
    }
}

/// Each of `resources` is a valid name; the first that is not is named in the error.
fn check_names(resources: &[&str]) -> Result<(), ClientError> {
    for r in resources {
        ResourceName::new(r).map_err(|e| ClientError::InvalidArgument(format!("{r:?}: {e}")))?;
    }
    Ok(())
}
