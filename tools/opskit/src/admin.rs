//! The admin listener: plain HTTP/1.1 for operators and their tools.
//!
//! - `GET /metrics`: Prometheus text exposition format;
//! - `GET /healthz`: 200 while the process serves at all;
//! - `GET /readyz`: 200 when the process can do its work, 503 otherwise, with the reason in
//!   the body;
//! - every other path is the service's ([`Endpoints::page`]): its status pages.
//!
//! Connections are bounded in number: when all are taken, a new one closes the oldest, so
//! that idle or slow connections cannot lock a health probe out. A request head must arrive
//! within a few seconds, and only GET and HEAD are answered. On a loopback address only
//! requests for a loopback host (`localhost`, `127.0.0.1:PORT`, `[::1]`) are answered: a web
//! page that rebinds its DNS name to 127.0.0.1 cannot read the pages through the operator's
//! browser.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Admin connections open at once; one more closes the oldest.
const CONNECTIONS_MAX: usize = 64;
/// Longest a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// A boxed future, for the object-safe [`Endpoints`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a service shows on its admin listener.
pub trait Endpoints: Send + Sync + 'static {
    /// The metrics, in the text exposition format.
    fn metrics(&self) -> String;
    /// Whether the service can do its work, and if not, why.
    fn ready(&self) -> Result<(), String>;
    /// The page at `path` (with the query string `query`), as HTML; `None`: not found.
    fn page<'a>(&'a self, path: &'a str, query: &'a str) -> BoxFuture<'a, Option<String>>;
    /// The paths of the pages, for the answer to an unknown path.
    fn pages(&self) -> &'static str;
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut builder = Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff");
    if content_type.starts_with("text/html") {
        // The pages have no external assets; their one script and style are inline.
        builder = builder
            .header(
                "content-security-policy",
                format!(
                    "default-src 'none'; style-src 'unsafe-inline'; script-src {}; img-src data:",
                    crate::html::script_source()
                ),
            )
            .header("x-frame-options", "DENY");
    }
    builder
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// Whether a request's `Host` names this machine's loopback (`localhost`, `127.0.0.1`,
/// `[::1]`, with or without a port). No `Host` (HTTP/1.0) counts as loopback.
pub fn loopback_host(host: Option<&str>) -> bool {
    let Some(host) = host else {
        return true;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => match host.rsplit_once(':') {
            Some((name, port))
                if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) =>
            {
                name
            }
            _ => host,
        },
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The answer to a request; `host` is its `Host` header, and `loopback` whether the listener
/// is on a loopback address.
pub async fn answer<E: Endpoints + ?Sized>(
    endpoints: &E,
    method: &Method,
    path: &str,
    query: &str,
    host: Option<&str>,
    loopback: bool,
) -> Response<Full<Bytes>> {
    let text = "text/plain; charset=utf-8";
    if loopback && !loopback_host(host) {
        return reply(
            StatusCode::MISDIRECTED_REQUEST,
            text,
            "this admin listener answers only requests for localhost or its loopback address\n"
                .into(),
        );
    }
    if method != Method::GET && method != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            "only GET and HEAD\n".into(),
        );
    }
    match path {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            endpoints.metrics(),
        ),
        "/healthz" => reply(StatusCode::OK, text, "ok\n".into()),
        "/readyz" => match endpoints.ready() {
            Ok(()) => reply(StatusCode::OK, text, "ready\n".into()),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, text, format!("{why}\n")),
        },
        _ => match endpoints.page(path, query).await {
            Some(html) => reply(StatusCode::OK, "text/html; charset=utf-8", html),
            None => reply(
                StatusCode::NOT_FOUND,
                text,
                format!(
                    "not found; try /metrics, /healthz, /readyz or {}\n",
                    endpoints.pages()
                ),
            ),
        },
    }
}

/// Accepts `listener`'s next connection; an accept that fails (out of file descriptors, most
/// likely) is logged, and the next one tried after a pause.
pub async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The admin connections open, oldest first, each with the means to close it.
type Open = Arc<Mutex<VecDeque<(u64, oneshot::Sender<()>)>>>;

/// Serves `endpoints` on `listener` for as long as the runtime runs.
pub fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>) {
    let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    let open: Open = Arc::default();
    tokio::spawn(async move {
        let mut next = 0u64;
        loop {
            let (socket, _) = accept(&listener).await;
            let (close, closed) = oneshot::channel();
            let id = next;
            next += 1;
            {
                let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
                if open.len() >= CONNECTIONS_MAX
                    && let Some((_, oldest)) = open.pop_front()
                {
                    let _ = oldest.send(());
                }
                open.push_back((id, close));
            }
            let (endpoints, open) = (Arc::clone(&endpoints), Arc::clone(&open));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let endpoints = Arc::clone(&endpoints);
                    async move {
                        let query = req.uri().query().unwrap_or("").to_string();
                        let host = req
                            .headers()
                            .get(hyper::header::HOST)
                            .map(|h| h.to_str().unwrap_or("\u{fffd}"));
                        Ok::<_, Infallible>(
                            answer(
                                &*endpoints,
                                req.method(),
                                req.uri().path(),
                                &query,
                                host,
                                loopback,
                            )
                            .await,
                        )
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .serve_connection(TokioIo::new(socket), service);
                // Closed by a newer connection when all are taken: dropping it closes it.
                tokio::select! {
                    _ = connection => {}
                    _ = closed => {}
                }
                open.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(i, _)| *i != id);
            });
        }
    });
}

/// The value of `key` in the query string `query` (`a=1&b=2`), percent-decoding left out:
/// the pages' parameters are plain words and numbers.
pub fn query_param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_hosts_pass_on_a_loopback_listener() {
        use super::loopback_host;
        for ok in [
            None,
            Some("localhost"),
            Some("LOCALHOST:8421"),
            Some("localhost."),
            Some("127.0.0.1:8421"),
            Some("127.9.9.9"),
            Some("[::1]:8421"),
            Some("[::1]"),
        ] {
            assert!(loopback_host(ok), "{ok:?}");
        }
        for bad in [
            Some("rebind.attacker.example"),
            Some("rebind.attacker.example:8421"),
            Some("localhost.attacker.example"),
            Some("10.0.0.1:8421"),
            Some("[::2]:1"),
            Some(""),
            Some("127.0.0.1:80:80"),
        ] {
            assert!(!loopback_host(bad), "{bad:?}");
        }
    }

    #[test]
    fn query_params_are_found_by_key() {
        assert_eq!(super::query_param("a=1&b=2", "b"), Some("2"));
        assert_eq!(super::query_param("a=1&b", "b"), Some(""));
        assert_eq!(super::query_param("a=1", "c"), None);
    }
}
