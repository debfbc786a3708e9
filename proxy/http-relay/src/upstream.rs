//! Connections to the upstream: each client connection keeps the upstream connection its last
//! request used, and its next request goes out on it again, with no pool to look up and no
//! other task's queue in between (HTTP/1.1 serves one request at a time per connection, so one
//! upstream connection per client connection is enough).
//!
//! Bounds: at most `pool_idle_per_host` upstream connections are kept idle at once per listener
//! (one more finished request closes its connection instead); an idle one is closed after
//! `pool_idle_timeout`, and with its client connection. A kept connection that the upstream
//! closed meanwhile is replaced; a request that a dying connection did not send is sent once
//! more on a new connection (nothing of it reached the upstream, so that is safe for any
//! method).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::relay::{BoxError, RelayBody};

/// What a listener's upstream connections share.
pub(crate) struct Upstream {
    /// `host:port` to connect to.
    authority: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle_max: usize,
    /// Connections kept idle in slots right now.
    idle: AtomicUsize,
    /// The clock of the idle timestamps.
    epoch: Instant,
}

/// The upstream connection of one client connection, kept between its requests.
pub struct Slot {
    upstream: Arc<Upstream>,
    held: Mutex<Option<Held>>,
}

/// An upstream connection kept idle in a slot.
pub(crate) struct Held {
    sender: SendRequest<RelayBody>,
    /// Milliseconds since `epoch` when it went idle; `BUSY` while a request uses it. Its
    /// connection task closes it after `idle_timeout` of idleness.
    idle_since: Arc<AtomicU64>,
}

const BUSY: u64 = u64::MAX;

impl Upstream {
    pub(crate) fn new(
        authority: String,
        connect_timeout: Duration,
        idle_timeout: Duration,
        idle_max: usize,
    ) -> Upstream {
        Upstream {
            authority,
            connect_timeout,
            idle_timeout,
            idle_max,
            idle: AtomicUsize::new(0),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(BUSY - 1)
    }

    /// Opens a connection; its task closes it when it has been idle for `idle_timeout`.
    async fn connect(self: &Arc<Self>) -> Result<Held, BoxError> {
        let stream = tokio::time::timeout(
            self.connect_timeout,
            tokio::net::TcpStream::connect(self.authority.as_str()),
        )
        .await
        .map_err(|_| {
            format!(
                "connecting to {} timed out after {} ms",
                self.authority,
                self.connect_timeout.as_millis()
            )
        })?
        .map_err(|e| format!("cannot connect to {}: {e}", self.authority))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let idle_since = Arc::new(AtomicU64::new(BUSY));
        let watch = Arc::clone(&idle_since);
        let upstream = Arc::clone(self);
        tokio::spawn(async move {
            tokio::pin!(conn);
            let mut wait = upstream.idle_timeout;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "upstream connection ended");
                        }
                        return;
                    }
                    () = tokio::time::sleep(wait) => {
                        let since = watch.load(Ordering::Acquire);
                        let now = upstream.now_ms();
                        let idle_for = Duration::from_millis(now.saturating_sub(since));
                        if since != BUSY && idle_for >= upstream.idle_timeout {
                            // Dropping the connection closes it; the slot finds it closed.
                            return;
                        }
                        wait = if since == BUSY {
                            upstream.idle_timeout
                        } else {
                            upstream.idle_timeout - idle_for
                        };
                    }
                }
            }
        });
        Ok(Held { sender, idle_since })
    }
}

impl Slot {
    pub(crate) fn new(upstream: Arc<Upstream>) -> Slot {
        Slot {
            upstream,
            held: Mutex::new(None),
        }
    }

    fn take(&self) -> Option<Held> {
        let held = self.held.lock().expect("slot lock").take()?;
        self.upstream.idle.fetch_sub(1, Ordering::AcqRel);
        held.idle_since.store(BUSY, Ordering::Release);
        Some(held)
    }

    /// Keeps `held` for the next request, if the listener's bound on idle connections allows.
    pub(crate) fn put_back(&self, held: Held) {
        if held.sender.is_closed() {
            return;
        }
        let was = self.upstream.idle.fetch_add(1, Ordering::AcqRel);
        if was >= self.upstream.idle_max {
            self.upstream.idle.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        held.idle_since
            .store(self.upstream.now_ms(), Ordering::Release);
        if let Some(old) = self.held.lock().expect("slot lock").replace(held) {
            // Not expected (one request at a time per client connection), but keep the count.
            drop(old);
            self.upstream.idle.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Sends `req` on the kept connection, or on a new one; returns the response and the
    /// connection, to be put back once the response body has been relayed.
    pub(crate) async fn send(
        &self,
        req: Request<RelayBody>,
    ) -> Result<(Response<Incoming>, Held), BoxError> {
        let mut kept = self.take();
        if let Some(h) = kept.as_mut()
            && h.sender.ready().await.is_err()
        {
            // The upstream closed it meanwhile.
            kept = None;
        }
        let mut held = match kept {
            Some(h) => h,
            None => self.upstream.connect().await?,
        };
        match held.sender.try_send_request(req).await {
            Ok(response) => Ok((response, held)),
            Err(mut e) => match e.take_message() {
                // The connection closed before the request went out: once more, afresh.
                Some(req) => {
                    tracing::debug!(error = %e.error(), "upstream connection closed; reconnecting");
                    let mut held = self.upstream.connect().await?;
                    let response = held.sender.send_request(req).await?;
                    Ok((response, held))
                }
                None => Err(e.into_error().into()),
            },
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self
            .held
            .get_mut()
            .map(|h| h.take().is_some())
            .unwrap_or(false)
        {
            self.upstream.idle.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny HTTP/1.1 upstream that answers every request with "ok"; counts the connections
    /// it accepted, and those that ended (on the channel).
    async fn upstream() -> (
        String,
        Arc<AtomicUsize>,
        tokio::sync::watch::Receiver<usize>,
    ) {
        upstream_with(true).await
    }

    async fn upstream_with(
        keep_alive: bool,
    ) -> (
        String,
        Arc<AtomicUsize>,
        tokio::sync::watch::Receiver<usize>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let (ended_tx, ended) = tokio::sync::watch::channel(0usize);
        let ended_tx = Arc::new(ended_tx);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::AcqRel);
                let ended_tx = Arc::clone(&ended_tx);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(b"ok"),
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    ended_tx.send_modify(|n| *n += 1);
                });
            }
        });
        (addr, accepted, ended)
    }

    fn request(addr: &str) -> Request<RelayBody> {
        use http_body_util::BodyExt;
        Request::builder()
            .uri("/x")
            .header("host", addr)
            .body(
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap()
    }

    /// The listener side for `addr`, with these idle bounds.
    fn shared(addr: &str, idle_timeout: Duration, idle_max: usize) -> Arc<Upstream> {
        Arc::new(Upstream::new(
            addr.to_string(),
            Duration::from_secs(5),
            idle_timeout,
            idle_max,
        ))
    }

    async fn exchange(slot: &Slot, addr: &str) {
        use http_body_util::BodyExt;
        let (response, held) = slot.send(request(addr)).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        slot.put_back(held);
    }

    #[tokio::test]
    async fn a_client_connection_reuses_its_upstream_connection_within_the_bounds() {
        let (addr, accepted, _) = upstream().await;
        let shared = shared(&addr, Duration::from_secs(60), 1);
        let a = Slot::new(Arc::clone(&shared));
        for _ in 0..3 {
            exchange(&a, &addr).await;
        }
        assert_eq!(
            accepted.load(Ordering::Acquire),
            1,
            "one connection for three requests"
        );
        assert_eq!(shared.idle.load(Ordering::Acquire), 1);
        // A second client connection: the bound of one idle connection is taken, so its
        // connection is closed after each request and every request opens a new one.
        let b = Slot::new(Arc::clone(&shared));
        exchange(&b, &addr).await;
        exchange(&b, &addr).await;
        assert_eq!(accepted.load(Ordering::Acquire), 3);
        assert_eq!(shared.idle.load(Ordering::Acquire), 1);
        // The first client connection goes away: its kept connection no longer counts.
        drop(a);
        assert_eq!(shared.idle.load(Ordering::Acquire), 0);
        exchange(&b, &addr).await;
        exchange(&b, &addr).await;
        assert_eq!(accepted.load(Ordering::Acquire), 4);
    }

    #[tokio::test]
    async fn an_idle_upstream_connection_is_closed_after_the_idle_timeout_and_replaced() {
        let (addr, accepted, mut ended) = upstream().await;
        let shared = shared(&addr, Duration::from_millis(500), 8);
        let slot = Slot::new(Arc::clone(&shared));
        exchange(&slot, &addr).await;
        assert_eq!(accepted.load(Ordering::Acquire), 1);
        // The kept connection idles: its task closes it after the idle timeout, and the
        // upstream sees it end (waited for as an event, not a duration).
        ended.wait_for(|n| *n == 1).await.unwrap();
        assert!(
            slot.held
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .sender
                .is_closed()
        );
        // The next request finds it closed and opens another.
        exchange(&slot, &addr).await;
        assert_eq!(accepted.load(Ordering::Acquire), 2);
    }

    #[tokio::test]
    async fn connections_the_upstream_says_it_closes_are_not_kept() {
        // This upstream answers with `Connection: close` and closes every connection after one
        // response: each request needs a new connection, and none fails.
        let (addr, accepted, _) = upstream_with(false).await;
        let shared = shared(&addr, Duration::from_secs(60), 8);
        let slot = Slot::new(Arc::clone(&shared));
        for _ in 0..3 {
            exchange(&slot, &addr).await;
        }
        assert_eq!(accepted.load(Ordering::Acquire), 3);
    }
}
