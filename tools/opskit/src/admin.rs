//! The admin listener: plain HTTP/1.1 for operators and their tools.
//!
//! - `GET /metrics`: Prometheus text exposition format;
//! - `GET /healthz`: 200 while the process serves at all;
//! - `GET /readyz`: 200 when the process can do its work, 503 otherwise, with the reason in
//!   the body;
//! - every other path is the service's ([`Endpoints::page`]): its status pages.
//!
//! Connections are bounded in number, a request head must arrive within a few seconds, and
//! only GET and HEAD are answered.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Admin connections open at once.
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
                "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:",
            )
            .header("x-frame-options", "DENY");
    }
    builder
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

/// The answer to `req`.
pub async fn answer<E: Endpoints + ?Sized>(
    endpoints: &E,
    method: &Method,
    path: &str,
    query: &str,
) -> Response<Full<Bytes>> {
    let text = "text/plain; charset=utf-8";
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

/// Serves `endpoints` on `listener` for as long as the runtime runs.
pub fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>) {
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let (socket, _) = accept(&listener).await;
            let endpoints = Arc::clone(&endpoints);
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let endpoints = Arc::clone(&endpoints);
                    async move {
                        let query = req.uri().query().unwrap_or("").to_string();
                        Ok::<_, Infallible>(
                            answer(&*endpoints, req.method(), req.uri().path(), &query).await,
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
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
    fn query_params_are_found_by_key() {
        assert_eq!(super::query_param("a=1&b=2", "b"), Some("2"));
        assert_eq!(super::query_param("a=1&b", "b"), Some(""));
        assert_eq!(super::query_param("a=1", "c"), None);
    }
}
