//! The relay: one task per client connection, owning the client socket and the upstream
//! connection its last request used; each request's head is parsed in place, written on as
//! bytes with the hop-by-hop headers left out ([`crate::h1`]), and the response comes back the
//! same way. Bodies stream through a bounded buffer, never held whole.
//!
//! A fenced request's [`Permit`] is held until its response has been relayed completely, or
//! until the exchange is abandoned (the client went away, the upstream broke or timed out):
//! that is the end of "in flight" for the fence.
//!
//! Upstream connections: a client connection keeps the one its last request used (HTTP/1.1
//! serves one request at a time per connection, so one is enough) and sends its next request on
//! it. At most `pool_idle_per_host` are kept idle at once per listener thread; an idle one is
//! closed after `pool_idle_timeout`, when the upstream closes it, or with its client connection.
//! Before a kept connection is reused it is checked for a close the upstream sent meanwhile; if
//! the upstream closes it anyway before answering, a request with an idempotent method whose
//! body the relay still has is sent once more on a new connection, anything else gets 502.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use fencing::{FencingToken, ResourceName};
use http::{Method, Uri};
use tlsconf::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::fence::{Fence, Permit};
use crate::h1::{self, Decoded, Framing};
use crate::problem::Problem;
use crate::routes::{Classification, Routes};
use crate::upstream::{self, Upstream, alive, kept_readable};
use opskit::fence::{self as obs, Mode, UpstreamError};

/// Bytes read from a socket at a time.
pub(crate) const READ_CHUNK: usize = 16 * 1024;
/// Relayed body bytes gathered before they are written.
const WRITE_CHUNK: usize = 64 * 1024;
/// After refusing a request whose body was not read, how long and how much of it is read and
/// discarded before the connection closes, so that the client reads the answer instead of a
/// reset.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 4 << 20;

/// Settings of a relay.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Where requests go: `http://host:port` or `https://host:port`, optionally with a path
    /// prefix.
    pub upstream: Uri,
    /// TLS to an `https://` upstream: the CA that verifies it, perhaps a client certificate.
    pub upstream_tls: Option<Arc<tlsconf::ClientTls>>,
    /// Largest request body relayed, in bytes.
    pub body_max_bytes: u64,
    /// Longest wait for the upstream's response headers (from the connection on, with the
    /// request body's upload).
    pub upstream_timeout: Duration,
    /// Longest wait for a connection to the upstream.
    pub connect_timeout: Duration,
    /// Idle upstream connections kept at once (each client connection keeps the one its last
    /// request used).
    pub pool_idle_per_host: usize,
    /// How long an idle upstream connection is kept.
    pub pool_idle_timeout: Duration,
    /// Which tokens must be signed, and the keys that verify them.
    pub signing: Arc<fencing::signed::Policy>,
    /// How the upstream reads request paths, and so how the routes read them.
    pub path_reading: crate::path::PathReading,
}

/// Checks an upstream URL: HTTP or HTTPS, with a host, no query.
pub fn parse_upstream(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!(
            "{url:?}: the upstream must be an http:// or https:// URL"
        ));
    }
    if uri.authority().is_none() {
        return Err(format!("{url:?}: the upstream URL has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{url:?}: the upstream URL must not have a query"));
    }
    Ok(uri)
}

/// A reverse proxy for one upstream, fencing the routes that say so. One per listener thread.
pub struct Relay {
    routes: Routes,
    fence: Arc<dyn Fence>,
    pub(crate) config: RelayConfig,
    /// The upstream URL's path, without a trailing `/`.
    prefix: String,
    /// `host:port` to connect to.
    pub(crate) address: String,
    /// The name an `https://` upstream's certificate must carry (its URL's host).
    pub(crate) server_name: Option<tlsconf::rustls::pki_types::ServerName<'static>>,
    /// `Host` for requests that came without one.
    host: String,
    /// Upstream connections kept idle right now.
    idle: AtomicUsize,
}

impl Relay {
    pub fn new(routes: Routes, fence: Arc<dyn Fence>, config: RelayConfig) -> Relay {
        let https = config.upstream.scheme_str() == Some("https");
        let host = config.upstream.host().unwrap_or_default();
        let address = format!(
            "{host}:{}",
            config
                .upstream
                .port_u16()
                .unwrap_or(if https { 443 } else { 80 })
        );
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = https
            .then(|| tlsconf::rustls::pki_types::ServerName::try_from(bare.to_string()).ok())
            .flatten();
        let prefix = config.upstream.path().trim_end_matches('/').to_string();
        let host = config
            .upstream
            .authority()
            .map_or_else(|| "localhost".to_string(), |a| a.to_string());
        Relay {
            routes,
            fence,
            config,
            prefix,
            address,
            server_name,
            host,
            idle: AtomicUsize::new(0),
        }
    }

    /// Serves one client connection until it closes, a request says so, its head does not
    /// arrive within `header_read_timeout` (counted from when the relay starts waiting for it,
    /// so also for an idle kept-alive connection), or `stop` changes (between requests).
    /// `start` counts the connection against its address until its first request head has
    /// come.
    pub async fn serve_connection(
        &self,
        client: Stream,
        peer: SocketAddr,
        header_read_timeout: Duration,
        stop: watch::Receiver<bool>,
        start: tlsconf::PeerSlot,
    ) {
        let mut start = Some(start);
        let mut conn = Conn {
            relay: self,
            client,
            peer,
            forwarded_for: h1::Peer::new(peer),
            input: BytesMut::with_capacity(READ_CHUNK),
            out: Vec::with_capacity(1024),
            kept: None,
            stop,
        };
        while let Some(req) = conn.next_request(header_read_timeout).await {
            start.take();
            if !conn.exchange(req).await {
                break;
            }
        }
    }
}

/// One client connection.
struct Conn<'r> {
    relay: &'r Relay,
    client: Stream,
    peer: SocketAddr,
    /// `peer` as the forwarding headers name it.
    forwarded_for: h1::Peer,
    /// Bytes from the client not yet relayed.
    input: BytesMut,
    /// Bytes to write: a head towards the upstream (with the body, when it was all there),
    /// then the response head and body towards the client.
    out: Vec<u8>,
    /// The upstream connection kept idle for the next request, and since when.
    kept: Option<(Upstream, Instant)>,
    stop: watch::Receiver<bool>,
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        self.release_kept();
    }
}

/// Why an exchange with the upstream failed before a response head arrived.
pub(crate) enum SendError {
    /// The client went away (while its body was read, or while a 1xx was written to it).
    ClientGone,
    /// The request body went above the limit.
    TooLarge,
    /// The connection failed before any byte of a response arrived.
    Closed(String),
    /// The connection failed after that, or could not be made.
    Unreachable(String),
    /// The upstream's answer cannot be relayed.
    BadResponse(String),
}

/// The request body still to relay.
struct BodyIn {
    framing: Framing,
    /// Bytes left of a Content-Length body.
    left: u64,
    chunked: h1::Chunked,
    /// Body bytes relayed so far (the limit counts them).
    sent: u64,
    /// The whole body has been sent to the upstream (before the exchange: it is in
    /// `Conn::out` with the head).
    done: bool,
}

impl Conn<'_> {
    /// Waits for the next request head. `None`: the connection is to close (the client closed
    /// it, its head timed out, shutdown, or its head was refused and answered).
    async fn next_request(&mut self, header_read_timeout: Duration) -> Option<h1::Request> {
        let deadline = Instant::now() + header_read_timeout;
        // Bytes of the head already searched for its end.
        let mut searched = 0;
        loop {
            if !self.input.is_empty() {
                let ctx = h1::Context {
                    prefix: &self.relay.prefix,
                    host: &self.relay.host,
                    peer: &self.forwarded_for,
                    reading: self.relay.config.path_reading,
                };
                let parsed = if h1::may_be_complete(&self.input, searched) {
                    h1::request(&self.input, &ctx, &mut self.out)
                } else if self.input.len() >= h1::HEAD_MAX {
                    Err(h1::Reject::TooLarge)
                } else {
                    Ok(None)
                };
                searched = self.input.len();
                match parsed {
                    Ok(Some(req)) => return Some(req),
                    Ok(None) => {}
                    Err(reject) => {
                        let problem = Problem::from(reject);
                        self.answer(&problem, true).await;
                        self.close(false).await;
                        return None;
                    }
                }
            } else if *self.stop.borrow() {
                return None;
            }
            let idle_until = self
                .kept
                .as_ref()
                .map(|(_, since)| *since + self.relay.config.pool_idle_timeout);
            let wake = idle_until.map_or(deadline, |t| t.min(deadline));
            self.input.reserve(READ_CHUNK);
            tokio::select! {
                biased;
                read = self.client.read_buf(&mut self.input) => match read {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                },
                () = kept_readable(&self.kept) => {
                    // The upstream closed its idle connection (or sent what it must not).
                    if self.kept.as_ref().is_some_and(|(up, _)| !alive(up.stream.tcp())) {
                        self.release_kept();
                    }
                }
                () = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= deadline {
                        tracing::debug!(peer = %self.peer, "no request head within the header read timeout");
                        return None;
                    }
                    self.release_kept();
                }
                _ = self.stop.changed(), if self.input.is_empty() => return None,
            }
        }
    }

    /// Relays one request and its response. Returns whether the connection stays open.
    async fn exchange(&mut self, req: h1::Request) -> bool {
        let relay = self.relay;
        let path = match &req.normalized {
            Some(p) => p.as_str(),
            None => std::str::from_utf8(&self.input[req.path.clone()]).unwrap_or("/"),
        };
        let path = if path.is_empty() { "/" } else { path };
        let named = req.named_in(&self.input);
        let reading = relay.config.path_reading;
        let class = (relay.routes).classify_request(&req.method, path, named, reading);
        let admission = match class {
            Classification::Pass => None,
            Classification::FenceByHeader => Some(self.fence_args(&req, None)),
            Classification::FenceNamed(name) => Some(self.fence_args(&req, Some(name))),
            Classification::Ambiguous(reason) => Some(Err(Problem::BadRequest { reason })),
        };
        // A refusal is tallied before the head (its method and path) leaves the buffer.
        let permit: Option<Permit> = match admission {
            None => {
                self.input.advance(req.head_len);
                None
            }
            Some(Err(problem)) => {
                crate::tally::refused(&problem, self.peer, &req.method, path);
                self.input.advance(req.head_len);
                return self.refuse(problem, &req).await;
            }
            Some(Ok((resource, token))) => {
                // The admission's duration is a metric: the clock is read only when one is kept.
                let started = obs::observing().then(Instant::now);
                let admitted = relay.fence.admit(&resource, token).await;
                let admitted = admitted.map_err(Problem::Refused);
                if let Err(problem) = &admitted {
                    crate::tally::refused(problem, self.peer, &req.method, path);
                }
                self.input.advance(req.head_len);
                match admitted {
                    Ok(permit) => {
                        obs::get().passed(Mode::Http, started.map(|s| s.elapsed()));
                        Some(permit)
                    }
                    Err(problem) => {
                        if let Some(s) = started {
                            obs::get().check_took(Mode::Http, s.elapsed());
                        }
                        return self.refuse(problem, &req).await;
                    }
                }
            }
        };
        let limit = relay.config.body_max_bytes;
        let mut body = BodyIn {
            framing: req.framing,
            left: 0,
            chunked: h1::Chunked::default(),
            sent: 0,
            done: false,
        };
        match req.framing {
            Framing::Length(n) if n > limit => {
                return self.refuse(Problem::BodyTooLarge { limit }, &req).await;
            }
            // All of it is here already: it goes out with the head, in one write.
            Framing::Length(n) if self.input.len() as u64 >= n => {
                let n = n as usize;
                self.out.extend_from_slice(&self.input[..n]);
                self.input.advance(n);
                body.done = true;
            }
            Framing::Length(n) => body.left = n,
            Framing::Empty => body.done = true,
            Framing::Chunked | Framing::UntilClose => {}
        }

        let timeout = relay.config.upstream_timeout;
        let sent = tokio::time::timeout(timeout, self.send(&req, &mut body)).await;
        let (mut up, response) = match sent {
            Ok(Ok(sent)) => sent,
            Ok(Err(e)) => {
                crate::tally::send_failed(&e);
                let problem = match e {
                    SendError::ClientGone => return false,
                    SendError::TooLarge => Problem::BodyTooLarge { limit },
                    SendError::Closed(reason) | SendError::Unreachable(reason) => {
                        Problem::UpstreamUnreachable { reason }
                    }
                    SendError::BadResponse(reason) => Problem::UpstreamBadResponse { reason },
                };
                let close = !body.done || !req.keep_alive;
                self.answer(&problem, close).await;
                if close {
                    self.close(body.done).await;
                }
                return !close;
            }
            Err(_) => {
                obs::get().upstream_error(Mode::Http, UpstreamError::Timeout);
                let problem = Problem::UpstreamTimeout {
                    after_ms: timeout.as_millis() as u64,
                };
                self.answer(&problem, true).await;
                self.close(body.done).await;
                return false;
            }
        };
        let closing = response.closing;
        if self
            .relay_response(&mut up, &response, req.http10)
            .await
            .is_err()
        {
            return false;
        }
        drop(permit);
        if response.keep_alive
            && response.framing != Framing::UntilClose
            && body.done
            && up.input.is_empty()
        {
            self.keep(up);
        }
        if closing {
            self.close(body.done).await;
        }
        !closing
    }

    /// The validated resource and token of a fenced request, from its headers (and the route's
    /// resource name, when it names one).
    fn fence_args(
        &self,
        req: &h1::Request,
        named: Option<String>,
    ) -> Result<(ResourceName, FencingToken), Problem> {
        let value = |r: &Option<std::ops::Range<usize>>| r.clone().map(|r| &self.input[r]);
        let token = value(&req.token);
        let header_resource = value(&req.resource);
        let by_header = named.is_none();
        let resource_text: Option<&str> = match &named {
            Some(n) => Some(n.as_str()),
            None => match header_resource {
                Some(v) => Some(visible(v).ok_or_else(|| Problem::MalformedResource {
                    value: String::from_utf8_lossy(v).into_owned(),
                    reason: "the header is not visible ASCII".into(),
                })?),
                None => None,
            },
        };
        let (token, resource_text) = match (token, resource_text) {
            (Some(t), Some(r)) => (t, r),
            (None, Some(_)) => {
                return Err(Problem::Required {
                    missing: "Fencing-Token",
                });
            }
            (Some(_), None) => {
                return Err(Problem::Required {
                    missing: "Fencing-Resource",
                });
            }
            (None, None) => {
                return Err(Problem::Required {
                    missing: "Fencing-Token and Fencing-Resource",
                });
            }
        };
        let token_text = visible(token).ok_or_else(|| Problem::MalformedToken {
            value: String::from_utf8_lossy(token).into_owned(),
            reason: "the header is not visible ASCII".into(),
        })?;
        if req.tokens > 1 {
            return Err(Problem::MalformedToken {
                value: token_text.to_string(),
                reason: "more than one Fencing-Token header".into(),
            });
        }
        if by_header && req.resources > 1 {
            return Err(Problem::MalformedResource {
                value: resource_text.to_string(),
                reason: "more than one Fencing-Resource header".into(),
            });
        }
        let presented =
            fencing::signed::Presented::parse(token_text).map_err(|e| Problem::MalformedToken {
                value: token_text.to_string(),
                reason: e.to_string(),
            })?;
        let resource =
            ResourceName::new(resource_text).map_err(|e| Problem::MalformedResource {
                value: resource_text.to_string(),
                reason: e.to_string(),
            })?;
        // Before the fence sees it: a token that is not lockd's for this resource neither
        // passes nor raises a mark (invariant 10).
        let token: FencingToken = self
            .relay
            .config
            .signing
            .admit(&resource, &presented)
            .map_err(|refusal| Problem::Signature {
                resource: resource.as_str().to_string(),
                value: token_text.to_string(),
                refusal,
            })?;
        Ok((resource, token))
    }

    /// Answers `problem` instead of relaying `req` (whose head has been consumed). The
    /// connection stays open if the request's body, if any, is already here (it is skipped).
    async fn refuse(&mut self, problem: Problem, req: &h1::Request) -> bool {
        let body_here = match req.framing {
            Framing::Empty => true,
            Framing::Length(n) if self.input.len() as u64 >= n => {
                self.input.advance(n as usize);
                true
            }
            _ => false,
        };
        let close = !body_here || !req.keep_alive;
        if !self.answer(&problem, close).await {
            return false;
        }
        if close {
            self.close(body_here).await;
        }
        !close
    }

    /// Writes the proxy's own answer. Returns whether it was written.
    async fn answer(&mut self, problem: &Problem, close: bool) -> bool {
        if problem.status().is_server_error() {
            tracing::warn!(status = problem.status().as_u16(), ?problem, peer = %self.peer, "answered by the proxy");
        } else {
            tracing::debug!(status = problem.status().as_u16(), ?problem, peer = %self.peer, "answered by the proxy");
        }
        self.out.clear();
        problem.write_response(&mut self.out, close);
        self.client.write_all(&self.out).await.is_ok()
    }

    /// Closes the client connection after an answer. When part of the request was not read
    /// (`request_read` false), it then reads and discards what the client still sends (bounded
    /// in time and bytes), so that its kernel does not meet unread data and reset the
    /// connection before the client has read the answer.
    async fn close(&mut self, request_read: bool) {
        if self.client.shutdown().await.is_err() || request_read {
            return;
        }
        let mut discarded = 0usize;
        let _ = tokio::time::timeout(LINGER, async {
            loop {
                self.input.clear();
                self.input.reserve(READ_CHUNK);
                match self.client.read_buf(&mut self.input).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => discarded += n,
                }
                if discarded > LINGER_BYTES {
                    return;
                }
            }
        })
        .await;
    }

    /// Sends the request and waits for the final response head, whose head towards the client
    /// is then in `self.out`. A request on a kept connection that the upstream closed before
    /// answering is sent once more on a new connection if that is safe (idempotent method, the
    /// whole request still here).
    async fn send(
        &mut self,
        req: &h1::Request,
        body: &mut BodyIn,
    ) -> Result<(Upstream, h1::Response), SendError> {
        // The whole request is in `self.out` (and can go again) when its body went with it.
        let replayable = body.done;
        let (mut up, reused) = match self.take_kept() {
            Some(up) => (up, true),
            None => (
                upstream::connect(self.relay)
                    .await
                    .map_err(SendError::Unreachable)?,
                false,
            ),
        };
        match self.send_on(&mut up, req, body).await {
            Ok(response) => Ok((up, response)),
            Err(SendError::Closed(reason)) if reused && replayable && idempotent(&req.method) => {
                tracing::debug!(%reason, "the upstream closed a kept connection; sending the request again");
                let mut up = upstream::connect(self.relay)
                    .await
                    .map_err(SendError::Unreachable)?;
                let response = self.send_on(&mut up, req, body).await?;
                Ok((up, response))
            }
            Err(e) => Err(e),
        }
    }

    async fn send_on(
        &mut self,
        up: &mut Upstream,
        req: &h1::Request,
        body: &mut BodyIn,
    ) -> Result<h1::Response, SendError> {
        if let Err(e) = up.stream.write_all(&self.out).await {
            return Err(SendError::Closed(format!("writing the request: {e}")));
        }
        let to = h1::ResponseTo {
            head_request: req.method == Method::HEAD,
            http10: req.http10,
            closing: !req.keep_alive,
        };
        if !body.done {
            // The body streams up while the answer is awaited: an upstream may answer early (an
            // error, or a 100 Continue the client waits for before it sends the body). An answer
            // before the body was all sent is relayed, then both connections close (the rest of
            // the body is not read).
            let limit = self.relay.config.body_max_bytes;
            let to_early = h1::ResponseTo {
                closing: true,
                ..to
            };
            let mut early_out = Vec::new();
            let early = {
                let (mut client_read, mut client_write) = tokio::io::split(&mut self.client);
                let (mut up_read, mut up_write) = tokio::io::split(&mut up.stream);
                let copy = copy_body(
                    &mut client_read,
                    &mut self.input,
                    &mut up_write,
                    body,
                    limit,
                );
                let head = read_head(
                    &mut up_read,
                    &mut up.input,
                    &mut client_write,
                    to_early,
                    &self.stop,
                    &mut early_out,
                );
                tokio::pin!(copy, head);
                let mut copying = true;
                loop {
                    tokio::select! {
                        biased;
                        copied = &mut copy, if copying => {
                            copying = false;
                            match copied {
                                Ok(()) => break None,
                                Err(CopyError::ClientGone) => break Some(Err(SendError::ClientGone)),
                                Err(CopyError::TooLarge) => break Some(Err(SendError::TooLarge)),
                                // The upstream stopped reading: its answer may still come.
                                Err(CopyError::UpstreamWrite) => {}
                            }
                        }
                        response = &mut head => break Some(response),
                    }
                }
            };
            if let Some(response) = early {
                let response = response?;
                self.out = early_out;
                return Ok(response);
            }
        }
        // The body is all sent (what a dropped head future had read is in `up.input`).
        read_head(
            &mut up.stream,
            &mut up.input,
            &mut self.client,
            to,
            &self.stop,
            &mut self.out,
        )
        .await
    }

    /// Relays the response body (its head is in `self.out`).
    async fn relay_response(
        &mut self,
        up: &mut Upstream,
        response: &h1::Response,
        http10: bool,
    ) -> Result<(), ()> {
        match response.framing {
            Framing::Empty => self.write_out().await,
            Framing::Length(n) => {
                let mut left = n;
                let here = (up.input.len() as u64).min(left) as usize;
                self.out.extend_from_slice(&up.input[..here]);
                up.input.advance(here);
                left -= here as u64;
                self.write_out().await?;
                while left > 0 {
                    fill(&mut up.stream, &mut up.input).await?;
                    let here = (up.input.len() as u64).min(left) as usize;
                    self.client
                        .write_all(&up.input[..here])
                        .await
                        .map_err(|_| ())?;
                    up.input.advance(here);
                    left -= here as u64;
                }
                Ok(())
            }
            Framing::Chunked => {
                let mut decoder = h1::Chunked::default();
                loop {
                    match decoder.decode(&mut up.input) {
                        Ok(Decoded::Data(n)) => {
                            if http10 {
                                self.out.extend_from_slice(&up.input[..n]);
                            } else {
                                h1::encode_chunk(&mut self.out, &up.input[..n]);
                            }
                            up.input.advance(n);
                            decoder.took(n);
                            if self.out.len() >= WRITE_CHUNK {
                                self.write_out().await?;
                            }
                        }
                        Ok(Decoded::Need) => {
                            if !self.out.is_empty() {
                                self.write_out().await?;
                            }
                            fill(&mut up.stream, &mut up.input).await?;
                        }
                        Ok(Decoded::End) => {
                            if !http10 {
                                self.out.extend_from_slice(h1::LAST_CHUNK);
                            }
                            return self.write_out().await;
                        }
                        Err(reason) => {
                            tracing::warn!(
                                reason,
                                "malformed chunked response from the upstream; closing"
                            );
                            return Err(());
                        }
                    }
                }
            }
            Framing::UntilClose => {
                self.out.extend_from_slice(&up.input);
                up.input.clear();
                self.write_out().await?;
                loop {
                    up.input.reserve(READ_CHUNK);
                    match up.stream.read_buf(&mut up.input).await {
                        Ok(0) => return Ok(()),
                        Ok(_) => {
                            self.client.write_all(&up.input).await.map_err(|_| ())?;
                            up.input.clear();
                        }
                        Err(_) => return Err(()),
                    }
                }
            }
        }
    }

    async fn write_out(&mut self) -> Result<(), ()> {
        let written = self.client.write_all(&self.out).await;
        self.out.clear();
        written.map_err(|_| ())
    }

    /// Takes the kept upstream connection if it is still usable.
    fn take_kept(&mut self) -> Option<Upstream> {
        let (up, since) = self.release_kept()?;
        if since.elapsed() >= self.relay.config.pool_idle_timeout || !alive(up.stream.tcp()) {
            return None;
        }
        Some(up)
    }

    fn release_kept(&mut self) -> Option<(Upstream, Instant)> {
        let kept = self.kept.take()?;
        self.relay.idle.fetch_sub(1, Ordering::AcqRel);
        Some(kept)
    }

    /// Keeps `up` for the next request, if the bound on idle connections allows.
    fn keep(&mut self, up: Upstream) {
        if self.relay.idle.fetch_add(1, Ordering::AcqRel) >= self.relay.config.pool_idle_per_host {
            self.relay.idle.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        self.release_kept();
        self.kept = Some((up, Instant::now()));
    }
}

enum CopyError {
    ClientGone,
    TooLarge,
    UpstreamWrite,
}

/// Streams the rest of the request body from the client to the upstream.
async fn copy_body<R, W>(
    client: &mut R,
    input: &mut BytesMut,
    upstream: &mut W,
    body: &mut BodyIn,
    limit: u64,
) -> Result<(), CopyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match body.framing {
        Framing::Length(_) => {
            while body.left > 0 {
                if input.is_empty() {
                    fill(client, input)
                        .await
                        .map_err(|()| CopyError::ClientGone)?;
                }
                let here = (input.len() as u64).min(body.left) as usize;
                upstream
                    .write_all(&input[..here])
                    .await
                    .map_err(|_| CopyError::UpstreamWrite)?;
                input.advance(here);
                body.left -= here as u64;
                body.sent += here as u64;
            }
        }
        Framing::Chunked => {
            let mut out = Vec::new();
            loop {
                match body.chunked.decode(input) {
                    Ok(Decoded::Data(n)) => {
                        body.sent += n as u64;
                        if body.sent > limit {
                            return Err(CopyError::TooLarge);
                        }
                        h1::encode_chunk(&mut out, &input[..n]);
                        input.advance(n);
                        body.chunked.took(n);
                        if out.len() >= WRITE_CHUNK {
                            upstream
                                .write_all(&out)
                                .await
                                .map_err(|_| CopyError::UpstreamWrite)?;
                            out.clear();
                        }
                    }
                    Ok(Decoded::Need) => {
                        if !out.is_empty() {
                            upstream
                                .write_all(&out)
                                .await
                                .map_err(|_| CopyError::UpstreamWrite)?;
                            out.clear();
                        }
                        fill(client, input)
                            .await
                            .map_err(|()| CopyError::ClientGone)?;
                    }
                    Ok(Decoded::End) => {
                        out.extend_from_slice(h1::LAST_CHUNK);
                        upstream
                            .write_all(&out)
                            .await
                            .map_err(|_| CopyError::UpstreamWrite)?;
                        break;
                    }
                    Err(reason) => {
                        // The client's framing is broken: nothing more of it can be trusted.
                        tracing::debug!(reason, "malformed chunked request body");
                        return Err(CopyError::ClientGone);
                    }
                }
            }
        }
        Framing::Empty | Framing::UntilClose => {}
    }
    body.done = true;
    Ok(())
}

/// Reads from `from` into `input`; `Err` at the end of the stream or on an error.
async fn fill<R: AsyncRead + Unpin>(from: &mut R, input: &mut BytesMut) -> Result<(), ()> {
    input.reserve(READ_CHUNK);
    match from.read_buf(input).await {
        Ok(0) | Err(_) => Err(()),
        Ok(_) => Ok(()),
    }
}

/// Reads the upstream's response head, passing interim (1xx) responses to the client, and
/// writes the final one's head towards the client into `out`; the client connection closes
/// after it if `to` says so or the proxy is shutting down (`stop`).
async fn read_head<R, W>(
    upstream: &mut R,
    input: &mut BytesMut,
    client: &mut W,
    to: h1::ResponseTo,
    stop: &watch::Receiver<bool>,
    out: &mut Vec<u8>,
) -> Result<h1::Response, SendError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut answered = false;
    // Bytes of the head already searched for its end.
    let mut searched = 0;
    loop {
        if !input.is_empty() {
            if h1::may_be_complete(input, searched) {
                let to = h1::ResponseTo {
                    closing: to.closing || *stop.borrow(),
                    ..to
                };
                match h1::response(input, to, out) {
                    Ok(Some(response)) if response.status < 200 => {
                        // Taken from the input before it is written: if this future is
                        // dropped mid-write, the interim answer is cut short, never sent twice.
                        let interim = input.split_to(response.head_len);
                        answered = true;
                        searched = 0;
                        if !to.http10 {
                            client
                                .write_all(&interim)
                                .await
                                .map_err(|_| SendError::ClientGone)?;
                        }
                        continue;
                    }
                    Ok(Some(response)) => {
                        input.advance(response.head_len);
                        return Ok(response);
                    }
                    Ok(None) => {}
                    Err(reason) => return Err(SendError::BadResponse(reason)),
                }
            } else if input.len() >= h1::HEAD_MAX {
                return Err(SendError::BadResponse(format!(
                    "a response head longer than {} bytes",
                    h1::HEAD_MAX
                )));
            }
            searched = input.len();
        }
        input.reserve(READ_CHUNK);
        let read = upstream.read_buf(input).await;
        let failed = match read {
            Ok(0) => "the upstream closed the connection".to_string(),
            Ok(_) => continue,
            Err(e) => format!("reading the response: {e}"),
        };
        return Err(if answered || !input.is_empty() {
            SendError::Unreachable(format!("{failed} in the middle of a response"))
        } else {
            SendError::Closed(format!("{failed} before answering"))
        });
    }
}

/// RFC 9110 §9.2.2: methods a client may repeat automatically.
fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The header value as text if it is visible ASCII (and spaces).
fn visible(v: &[u8]) -> Option<&str> {
    v.iter()
        .all(|&b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
        .then(|| std::str::from_utf8(v).expect("ASCII"))
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn upstream_urls_are_checked() {
        assert!(parse_upstream("http://127.0.0.1:8080").is_ok());
        assert!(parse_upstream("http://svc:8080/api").is_ok());
        assert!(parse_upstream("https://svc").is_ok());
        assert!(
            parse_upstream("ftp://svc")
                .unwrap_err()
                .contains("https://")
        );
        assert!(parse_upstream("svc:8080").is_err());
        assert!(
            parse_upstream("http://svc/?x=1")
                .unwrap_err()
                .contains("query")
        );
        assert!(parse_upstream("not a url").is_err());
    }
}
