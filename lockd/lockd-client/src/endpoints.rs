//! One or several lockd endpoints: a channel each, made lazily, and the one calls go to now.
//!
//! Any lockd instance serves a call (a follower forwards to the leader), so a client given
//! several sends each call to the current one and, after a transient failure there, moves on to
//! the next. Calls that are safe to repeat (renew, describe, list) are tried on each endpoint in
//! turn within one call; a release is tried on another only when it was never sent (the
//! connection could not be made), since a repeated release would end one more hold of a
//! reentrant lease; an acquire is repeated with its request id by its own retry loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::ClientError;

/// The channels, in the order given, and the index of the current one.
#[derive(Clone, Debug)]
pub(crate) struct Endpoints {
    rpcs: Arc<[LockServiceClient<Channel>]>,
    current: Arc<AtomicUsize>,
    /// Some endpoint is plaintext to a host other than this one: no bearer token may go there.
    pub(crate) plaintext_remote: bool,
    /// Added to "unreachable" errors: over TLS without a client certificate, a lockd that
    /// requires one closes the connection, and the client may see only that.
    pub(crate) hint: Option<&'static str>,
}

impl Endpoints {
    /// `endpoints`: one URL, or several separated by commas, all of one scheme.
    pub(crate) fn new(
        endpoints: &str,
        tls: &tlsconf::ClientFiles,
    ) -> Result<Endpoints, ClientError> {
        let bad = |endpoint: &str, reason: String| ClientError::Endpoint {
            endpoint: endpoint.to_string(),
            reason,
        };
        let urls: Vec<&str> = endpoints.split(',').map(str::trim).collect();
        if urls.iter().any(|u| u.is_empty()) {
            return Err(bad(
                endpoints,
                "an empty endpoint; expected e.g. http://127.0.0.1:7420 (several: separated by commas)"
                    .to_string(),
            ));
        }
        let scheme_of = |u: &str| u.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        if urls.iter().any(|u| scheme_of(u) != scheme_of(urls[0])) {
            return Err(bad(
                endpoints,
                "the endpoints mix schemes: use one (http:// or https://)".to_string(),
            ));
        }
        let mut rpcs = Vec::with_capacity(urls.len());
        let mut plaintext_remote = false;
        // One scheme for all: the TLS settings, read and checked once, serve every endpoint.
        let tls_settings = match scheme_of(urls[0]).as_deref() {
            Some("https") => Some(crate::tls_config(tls)?),
            _ => None,
        };
        for url in &urls {
            let mut ep =
                Endpoint::from_shared(url.to_string()).map_err(|e| bad(url, e.to_string()))?;
            let Some(host) = ep.uri().host().map(str::to_string) else {
                return Err(bad(
                    url,
                    "no host; expected e.g. http://127.0.0.1:7420".to_string(),
                ));
            };
            let scheme = ep.uri().scheme_str().unwrap_or_default().to_string();
            match scheme.as_str() {
                "https" => {
                    let settings = tls_settings
                        .clone()
                        .ok_or_else(|| bad(url, "the endpoints mix schemes".to_string()))?;
                    ep = ep
                        .tls_config(settings)
                        .map_err(|e| bad(url, e.to_string()))?;
                }
                "http" if tls.any() => {
                    return Err(bad(
                        url,
                        "TLS files are given but the endpoint is http://; use https://".to_string(),
                    ));
                }
                "http" => {
                    plaintext_remote |=
                        !tlsconf::loopback_host(host.trim_start_matches('[').trim_end_matches(']'));
                }
                _ => {
                    return Err(bad(
                        url,
                        "the scheme must be http:// or https://".to_string(),
                    ));
                }
            }
            let channel = ep
                .tcp_nodelay(true)
                .connect_timeout(Duration::from_secs(3))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(20))
                .connect_lazy();
            rpcs.push(LockServiceClient::new(channel));
        }
        let hint = match (scheme_of(urls[0]).as_deref(), &tls.cert) {
            (Some("https"), None) => Some(
                "if the TLS connection was closed: when lockd requires client certificates (tls_client_ca), give --cert and --key",
            ),
            (Some("https"), Some(_)) => Some(
                "if the TLS connection was closed: lockd may not trust this client certificate (its tls_client_ca)",
            ),
            _ => Some("if lockd serves TLS: use an https:// endpoint, with --ca"),
        };
        Ok(Endpoints {
            rpcs: rpcs.into(),
            current: Arc::new(AtomicUsize::new(0)),
            plaintext_remote,
            hint,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.rpcs.len()
    }

    /// The endpoint calls go to now, and its index.
    pub(crate) fn rpc(&self) -> (usize, LockServiceClient<Channel>) {
        let i = self.current.load(Ordering::Relaxed) % self.rpcs.len();
        (i, self.rpcs[i].clone())
    }

    /// After `status` from endpoint `i`: a transient failure moves later calls to the next
    /// endpoint (unless another call already moved them).
    pub(crate) fn failed(&self, i: usize, status: &Status) {
        if self.rpcs.len() > 1 && crate::transient(status) {
            let next = (i + 1) % self.rpcs.len();
            let _ = self
                .current
                .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

/// An acquire in flight (its call, or the pause after a call whose answer was lost), and what
/// to do if its caller drops it before an answer: lockd may have granted it just as it was
/// dropped, a lease that nobody would renew or release until its TTL ran out. Dropped armed,
/// it asks once more in the background, under the same request id and without waiting, and
/// releases whatever that grants (the original grant, or a new one made because the original
/// was never granted and the lock is now free). A set's is the same AcquireAll again, each
/// member released.
pub(crate) struct Abandoned {
    armed: Option<(crate::Client, Asked)>,
}

enum Asked {
    One(pb::AcquireRequest),
    All(pb::AcquireAllRequest),
}

impl Abandoned {
    pub(crate) fn new(client: crate::Client, req: pb::AcquireRequest) -> Abandoned {
        Abandoned {
            armed: Some((client, Asked::One(req))),
        }
    }

    pub(crate) fn set(client: crate::Client, req: pb::AcquireAllRequest) -> Abandoned {
        Abandoned {
            armed: Some((client, Asked::All(req))),
        }
    }

    /// The call was answered: nothing to clean up.
    pub(crate) fn disarm(mut self) {
        self.armed = None;
    }

    /// The pause ended: the next call asks under the same id, with a guard of its own.
    pub(crate) fn next_call(guard: Option<Abandoned>) {
        if let Some(guard) = guard {
            guard.disarm();
        }
    }

    /// Disarmed when `call` was answered; otherwise still armed, through the pause before the
    /// next call (dropped armed if the acquire gives up then).
    pub(crate) fn unless_answered<T, E>(self, call: &Result<Result<T, Status>, E>) -> Option<Self> {
        match call {
            Ok(Ok(_)) => {
                self.disarm();
                None
            }
            _ => Some(self),
        }
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some((client, asked)) = self.armed.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left: the lease, if any, ends at its TTL
        };
        // Asked again whatever the resource looks like: the given-up call may still be on its
        // way to lockd, and a resource free now would be granted to it next. This call either
        // finds that grant, or comes first: granted (and released here), the late call then
        // finds that grant ended; busy, the late call joins the queue and its cancellation,
        // sent after it, takes it out.
        rt.spawn(async move {
            let granted: Vec<(String, String)> = match asked {
                Asked::One(mut req) => {
                    req.wait_timeout_ms = 0;
                    let answer = again(&client, |mut rpc| {
                        let req = client.request(req.clone());
                        async move { rpc.acquire(req).await }
                    });
                    match answer.await.and_then(|r| r.outcome) {
                        Some(pb::acquire_response::Outcome::Granted(l)) => {
                            vec![(or_asked(l.resource, &req.resource), l.lease_id)]
                        }
                        _ => Vec::new(),
                    }
                }
                Asked::All(req) => {
                    let answer = again(&client, |mut rpc| {
                        let req = client.request(req.clone());
                        async move { rpc.acquire_all(req).await }
                    });
                    match answer.await.and_then(|r| r.outcome) {
                        Some(pb::acquire_all_response::Outcome::Granted(set)) => req
                            .resources
                            .iter()
                            .zip(set.leases)
                            .map(|(r, l)| (or_asked(l.resource, r), l.lease_id))
                            .collect(),
                        _ => Vec::new(),
                    }
                }
            };
            if !granted.is_empty() {
                let refs: Vec<(&str, &str)> = granted
                    .iter()
                    .map(|(r, id)| (r.as_str(), id.as_str()))
                    .collect();
                let _ = tokio::time::timeout(crate::CALL_GRACE, client.release_many(&refs)).await;
            }
        });
    }
}

/// The clean-up's one call, its transport failures retried for [`CLEAN_UP_FOR`]: the given-up
/// call's connection may have just broken, and the first call on its channel fail. `None`
/// when it got no answer.
async fn again<T, F, Fut>(client: &crate::Client, call: F) -> Option<T>
where
    F: Fn(LockServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    let until = Instant::now() + CLEAN_UP_FOR;
    let mut backoff = crate::Backoff::new();
    loop {
        let (i, rpc) = client.endpoints.rpc();
        let status = match tokio::time::timeout(crate::CALL_GRACE, call(rpc)).await {
            Ok(Ok(resp)) => return Some(resp.into_inner()),
            Ok(Err(status)) => status,
            Err(_) => Status::deadline_exceeded("lockd did not answer in time"),
        };
        if !crate::transient(&status) || Instant::now() >= until {
            return None; // the lease, if any, ends at its TTL
        }
        client.endpoints.failed(i, &status);
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

fn or_asked(granted: String, asked: &str) -> String {
    if granted.is_empty() {
        asked.to_string()
    } else {
        granted
    }
}

/// How long the clean-up of a given-up acquire retries transport failures.
const CLEAN_UP_FOR: Duration = Duration::from_secs(10);

/// Whether a failed call was never sent: the connection to the endpoint could not be made.
pub(crate) fn never_sent(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            )
        }) || c.to_string().contains("tcp connect error")
        {
            return true;
        }
        cause = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use crate::Client;

    #[tokio::test]
    async fn several_endpoints_make_one_channel_each() {
        let ok = Client::connect("http://127.0.0.1:7420, http://[::1]:7421").unwrap();
        assert_eq!(ok.endpoints.len(), 2);
    }

    #[tokio::test]
    async fn no_bearer_token_when_any_endpoint_is_plaintext_to_another_host() {
        let c = Client::connect("http://127.0.0.1:7420,http://10.0.0.2:7420").unwrap();
        let err = c.with_token("secret").unwrap_err();
        assert!(err.to_string().contains("plaintext"), "{err}");
        let local = Client::connect("http://127.0.0.1:7420,http://localhost:7421").unwrap();
        assert!(local.with_token("secret").is_ok());
    }
}
