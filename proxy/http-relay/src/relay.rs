//! The relay: one request in, one request to the upstream, its response back, streaming.
//!
//! Bodies are never held whole: request and response bodies are passed on frame by frame, so
//! memory per request is bounded by hyper's buffers whatever the body size. Hop-by-hop headers
//! (RFC 9110 §7.6.1: `Connection` and the headers it names, `Keep-Alive`, `Proxy-*`, `TE`,
//! `Trailer`, `Transfer-Encoding`, `Upgrade`) are removed in both directions; `X-Forwarded-For`
//! and `Forwarded` are appended. The client's `Host` is kept. Connection upgrades (WebSocket)
//! are not relayed.
//!
//! A fenced request's [`Permit`] travels in its response body and is dropped when the body has
//! been relayed completely, or when the exchange is abandoned (the client went away): that is
//! the end of "in flight" for the fence.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fencing::wire::{HTTP_HEADER_RESOURCE, HTTP_HEADER_TOKEN};
use fencing::{FencingToken, ResourceName};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::fence::{Fence, Permit};
use crate::problem::Problem;
use crate::routes::{Classification, Routes};
use crate::upstream::{Held, Slot, Upstream};

/// The error type of relayed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A relayed body.
pub type RelayBody = BoxBody<Bytes, BoxError>;

/// Settings of a relay.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Where requests go: `http://host:port`, optionally with a path prefix.
    pub upstream: Uri,
    /// Largest request body relayed, in bytes.
    pub body_max_bytes: u64,
    /// Longest wait for the upstream's response headers.
    pub upstream_timeout: Duration,
    /// Longest wait for a connection to the upstream.
    pub connect_timeout: Duration,
    /// Idle upstream connections kept at once (each client connection keeps the one its last
    /// request used, see [`crate::upstream`]).
    pub pool_idle_per_host: usize,
    /// How long an idle upstream connection is kept.
    pub pool_idle_timeout: Duration,
}

/// Checks an upstream URL: plain HTTP, with a host, no query.
pub fn parse_upstream(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{url:?}: the upstream must be an http:// URL (TLS to the upstream is not supported)"
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

/// A reverse proxy for one upstream, fencing the routes that say so.
pub struct Relay {
    routes: Routes,
    fence: Arc<dyn Fence>,
    upstream: Arc<Upstream>,
    config: RelayConfig,
    prefix: String,
    /// The upstream's `host:port`, for requests that came without `Host`.
    host: HeaderValue,
}

impl Relay {
    pub fn new(routes: Routes, fence: Arc<dyn Fence>, config: RelayConfig) -> Relay {
        let address = format!(
            "{}:{}",
            config.upstream.host().unwrap_or_default(),
            config.upstream.port_u16().unwrap_or(80)
        );
        let upstream = Arc::new(Upstream::new(
            address,
            config.connect_timeout,
            config.pool_idle_timeout,
            config.pool_idle_per_host,
        ));
        let prefix = config.upstream.path().trim_end_matches('/').to_string();
        let host = config
            .upstream
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| HeaderValue::from_static("localhost"));
        Relay {
            routes,
            fence,
            upstream,
            config,
            prefix,
            host,
        }
    }

    /// The upstream side of a new client connection: pass it to every [`Relay::handle`] of
    /// that connection.
    pub fn slot(&self) -> Arc<Slot> {
        Arc::new(Slot::new(Arc::clone(&self.upstream)))
    }

    /// Handles one request from `peer` on the client connection that `slot` belongs to. Never
    /// fails: every failure is an answer.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        slot: &Arc<Slot>,
    ) -> Result<Response<RelayBody>, Infallible> {
        Ok(match self.route(req, peer, slot).await {
            Ok(response) => response,
            Err(problem) => {
                if problem.status().is_server_error() {
                    tracing::warn!(
                        status = problem.status().as_u16(),
                        ?problem,
                        "answered by the proxy"
                    );
                } else {
                    tracing::debug!(
                        status = problem.status().as_u16(),
                        ?problem,
                        "answered by the proxy"
                    );
                }
                problem
                    .response::<Full<Bytes>>()
                    .map(|b| b.map_err(|never| match never {}).boxed())
            }
        })
    }

    async fn route(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        slot: &Arc<Slot>,
    ) -> Result<Response<RelayBody>, Problem> {
        let permit = match self.routes.classify(req.method(), req.uri().path()) {
            Classification::Pass => None,
            Classification::FenceByHeader => Some(self.admit(req.headers(), None).await?),
            Classification::FenceNamed(name) => Some(self.admit(req.headers(), Some(name)).await?),
        };
        self.forward(req, peer, permit, slot).await
    }

    async fn admit(&self, headers: &HeaderMap, named: Option<String>) -> Result<Permit, Problem> {
        let token = headers.get(HTTP_HEADER_TOKEN);
        let resource_header = headers.get(HTTP_HEADER_RESOURCE);
        let resource_text = match (&named, resource_header) {
            (Some(n), _) => Some(n.as_str()),
            (None, Some(v)) => Some(v.to_str().map_err(|_| Problem::MalformedResource {
                value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
                reason: "the header is not visible ASCII".into(),
            })?),
            (None, None) => None,
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
        let token_text = token.to_str().map_err(|_| Problem::MalformedToken {
            value: String::from_utf8_lossy(token.as_bytes()).into_owned(),
            reason: "the header is not visible ASCII".into(),
        })?;
        let token: FencingToken =
            token_text
                .parse()
                .map_err(|e: fencing::ParseTokenError| Problem::MalformedToken {
                    value: token_text.to_string(),
                    reason: e.to_string(),
                })?;
        let resource =
            ResourceName::new(resource_text).map_err(|e| Problem::MalformedResource {
                value: resource_text.to_string(),
                reason: e.to_string(),
            })?;
        self.fence
            .admit(&resource, token)
            .await
            .map_err(Problem::Refused)
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        permit: Option<Permit>,
        slot: &Arc<Slot>,
    ) -> Result<Response<RelayBody>, Problem> {
        let limit = self.config.body_max_bytes;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(Problem::BodyTooLarge { limit });
        }
        let (mut parts, body) = req.into_parts();
        parts.uri = self.upstream_uri(&parts.uri);
        // A clone of a header value shares its bytes: no copy.
        let host = parts.headers.get(header::HOST).cloned();
        if host.is_none() {
            parts.headers.insert(header::HOST, self.host.clone());
        }
        strip_hop_by_hop(&mut parts.headers);
        add_forwarded(
            &mut parts.headers,
            peer,
            host.as_ref().and_then(|h| h.to_str().ok()),
        );
        let body = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)).boxed();
        let upstream = Request::from_parts(parts, body);
        let timeout = self.config.upstream_timeout;
        let (response, held) = match tokio::time::timeout(timeout, slot.send(upstream)).await {
            Err(_) => {
                return Err(Problem::UpstreamTimeout {
                    after_ms: timeout.as_millis() as u64,
                });
            }
            Ok(Err(e)) => {
                if source_is::<http_body_util::LengthLimitError>(&*e) {
                    return Err(Problem::BodyTooLarge { limit });
                }
                return Err(Problem::UpstreamUnreachable {
                    reason: describe(&*e),
                });
            }
            Ok(Ok(r)) => r,
        };
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(
            parts,
            HoldingBody {
                inner: body,
                permit,
                reuse: Some((held, Arc::clone(slot))),
            }
            .boxed(),
        ))
    }

    /// The request target towards the upstream, in origin form (`/path?query`).
    fn upstream_uri(&self, original: &Uri) -> Uri {
        let path_and_query = match original.path_and_query() {
            // Without a prefix the request's path and query are reused as they are (shared
            // bytes, no parsing).
            Some(pq) if self.prefix.is_empty() => pq.clone(),
            pq => format!("{}{}", self.prefix, pq.map_or("/", |pq| pq.as_str()))
                .parse()
                .expect("a prefix and a request's path and query form a path"),
        };
        Uri::from(path_and_query)
    }
}

fn source_is<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<E>() {
            return true;
        }
        cur = err.source();
    }
    false
}

fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cur = err.source();
    }
    text
}

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Removes the hop-by-hop headers, including those the `Connection` header names.
/// (`Transfer-Encoding` is hyper's: it frames each hop itself.)
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
}

/// Appends the client to `X-Forwarded-For` and `Forwarded` (RFC 7239).
fn add_forwarded(headers: &mut HeaderMap, peer: SocketAddr, host: Option<&str>) {
    use std::fmt::Write;
    // Each value is built in one string and handed to the header map without a copy.
    let ip = peer.ip();
    let mut xff = String::with_capacity(64);
    if let Some(previous) = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        let _ = write!(xff, "{previous}, ");
    }
    let _ = write!(xff, "{ip}");
    if let Ok(v) = HeaderValue::try_from(xff) {
        headers.insert("x-forwarded-for", v);
    }
    let mut fwd = String::with_capacity(96);
    if let Some(previous) = headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        let _ = write!(fwd, "{previous}, ");
    }
    let _ = if peer.is_ipv6() {
        write!(fwd, "for=\"[{ip}]\";proto=http")
    } else {
        write!(fwd, "for={ip};proto=http")
    };
    if let Some(h) = host.filter(|h| h.bytes().all(|b| b.is_ascii_graphic() && b != b'"')) {
        let _ = write!(fwd, ";host=\"{h}\"");
    }
    if let Ok(v) = HeaderValue::try_from(fwd) {
        headers.insert(header::FORWARDED, v);
    }
}

/// The upstream's response body, holding the request's permit until it has been relayed
/// completely (or dropped), and its upstream connection, which goes back to the client
/// connection's slot once the body has been read to its end.
struct HoldingBody {
    inner: Incoming,
    permit: Option<Permit>,
    reuse: Option<(Held, Arc<Slot>)>,
}

impl Drop for HoldingBody {
    fn drop(&mut self) {
        // hyper stops polling a body that says it has ended; a body dropped before its end
        // leaves its connection mid-response, and the connection is closed with it.
        if let Some((held, slot)) = self.reuse.take()
            && self.inner.is_end_stream()
        {
            slot.put_back(held);
        }
    }
}

impl Body for HoldingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                self.permit = None;
                if let Some((held, slot)) = self.reuse.take() {
                    slot.put_back(held);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                self.permit = None;
                self.reuse = None;
            }
            _ => {}
        }
        polled.map(|frame| frame.map(|r| r.map_err(BoxError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("fencing-token", HeaderValue::from_static("7"));
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, vec!["content-type", "fencing-token"]);
    }

    #[test]
    fn forwarding_headers_are_appended() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        add_forwarded(
            &mut h,
            "192.0.2.7:5555".parse().unwrap(),
            Some("shop.example"),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
        assert_eq!(
            h["forwarded"],
            "for=192.0.2.7;proto=http;host=\"shop.example\""
        );
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, "[2001:db8::1]:80".parse().unwrap(), None);
        assert_eq!(h["forwarded"], "for=\"[2001:db8::1]\";proto=http");
    }

    #[test]
    fn upstream_urls_are_checked() {
        assert!(parse_upstream("http://127.0.0.1:8080").is_ok());
        assert!(parse_upstream("http://svc:8080/api").is_ok());
        assert!(parse_upstream("https://svc").unwrap_err().contains("TLS"));
        assert!(parse_upstream("svc:8080").is_err());
        assert!(
            parse_upstream("http://svc/?x=1")
                .unwrap_err()
                .contains("query")
        );
        assert!(parse_upstream("not a url").is_err());
    }
}
