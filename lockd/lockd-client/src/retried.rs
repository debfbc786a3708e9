//! A grant answered as a *duplicate*: lockd had granted this request id before (an earlier
//! attempt whose reply was lost, or, under the caller's own id, an earlier call). Nobody has
//! renewed it and when it was made is unknown, so the SDK renews it to learn a safe deadline:
//! - renewed: it is the caller's lock;
//! - answered "not current": it has ended. Under an id the SDK made, it was an earlier
//!   attempt's, never used: the acquire asks anew. Under the caller's own id it may have been
//!   used: the acquire fails ([`grant_ended`]), one request is granted once;
//! - the renewal did not get through: the grant was not seen to end, so the acquire asks
//!   again under the same id, as after a transport failure of its own.
//!
//! Given up meanwhile (the future dropped), the grant is released in the background, as after
//! a wait given up (`endpoints::Abandoned`).

use std::time::Instant;

use lockd_proto::v1 as pb;

use crate::{AcquireOptions, Backoff, Client, ClientError, Lease, TRANSPORT_RETRY_FOR, endpoints};

/// What became of a grant answered as a duplicate.
pub(crate) enum Retried {
    /// Renewed: the lease is the caller's, its deadline counted from this moment.
    Renewed(Instant),
    /// It has ended.
    Ended,
    /// The renewal did not get through: ask again under the same id (after the pause).
    AskAgain,
}

impl Client {
    /// Renews `lease`, the grant answered as a duplicate to `req` (`held`: lockd still holds
    /// it), within the acquire's transport budget (`TRANSPORT_RETRY_FOR` past `deadline`).
    pub(crate) async fn recheck(
        &self,
        lease: &mut Lease,
        held: bool,
        req: &pb::AcquireRequest,
        deadline: Instant,
        backoff: &mut Backoff,
    ) -> Result<Retried, ClientError> {
        if !held {
            return Ok(Retried::Ended);
        }
        let abandoned = endpoints::Abandoned::new(self.clone(), req.clone());
        let renew_sent = Instant::now();
        let result = match self.renew(&lease.resource, &lease.lease_id).await {
            Ok(r) => {
                lease.expires_at_ms = r.expires_at_ms;
                Ok(Retried::Renewed(renew_sent))
            }
            Err(ClientError::LeaseNotCurrent(_)) => Ok(Retried::Ended),
            Err(e) => ask_again_after(e, deadline, backoff)
                .await
                .map(|()| Retried::AskAgain),
        };
        abandoned.disarm();
        result
    }
}

/// After the renewal of a grant answered as a duplicate did not get through (`e`): the grant
/// was not seen to end, so the acquire asks again under the same id, after a pause, while
/// transport failures are retried (`TRANSPORT_RETRY_FOR` past `deadline`); otherwise `e` is
/// the acquire's error (the grant may still be held: the same id asked again returns it).
pub(crate) async fn ask_again_after(
    e: ClientError,
    deadline: Instant,
    backoff: &mut Backoff,
) -> Result<(), ClientError> {
    match e {
        ClientError::Unavailable(_) if Instant::now() < deadline + TRANSPORT_RETRY_FOR => {
            tracing::debug!(
                "renewing a retried grant failed ({e}); asking again with the same request id"
            );
            tokio::time::sleep(backoff.next_delay()).await;
            Ok(())
        }
        e => Err(e),
    }
}

/// A grant answered as a duplicate has ended: under an id the SDK made, the acquire asks anew;
/// under the caller's own id it fails ([`grant_ended`]).
pub(crate) fn unless_own(opts: &AcquireOptions, request_id: &str) -> Result<(), ClientError> {
    match opts.request_id {
        Some(_) => Err(grant_ended(request_id)),
        None => Ok(()),
    }
}

/// The error for an acquire under the caller's own request id whose grant has ended since:
/// acquiring again under that id would be a second grant of one request (docs/api.md,
/// `request_id`), so it is refused; a new request id asks anew.
pub(crate) fn grant_ended(request_id: &str) -> ClientError {
    ClientError::InvalidArgument(format!(
        "request id {request_id:?} was granted before and that grant has ended (released or \
         expired): acquiring under it again would grant the same request twice; use a new \
         request id to acquire again"
    ))
}

/// A set answered as a duplicate whose renewal is being retried: dropped meanwhile (the caller
/// gave up), its leases are released in the background instead of left to their TTL.
pub(crate) struct GiveBack {
    armed: Option<(Client, Vec<Lease>)>,
}

impl GiveBack {
    pub(crate) fn new(client: &Client, leases: &[Lease]) -> GiveBack {
        GiveBack {
            armed: Some((client.clone(), leases.to_vec())),
        }
    }

    pub(crate) fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        let Some((client, leases)) = self.armed.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left: the leases end at their TTL
        };
        rt.spawn(async move { client.give_back(&leases).await });
    }
}
