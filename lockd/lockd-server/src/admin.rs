//! The admin listener (`admin_listen`): plain HTTP/1.1 for operators and their tools.
//!
//! - `GET /metrics`: Prometheus text exposition format (crate::metrics);
//! - `GET /healthz`: 200 while the process serves at all;
//! - `GET /readyz`: 200 when calls can be served (the embedded store open; over etcd, a leader
//!   known: this instance or another), 503 otherwise, with the reason in the body.
//!
//! Connections are bounded in number, and a request head must arrive within a few seconds.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::metrics::Gauges;
use crate::service::Routes;

/// Admin connections open at once.
const CONNECTIONS_MAX: usize = 64;
/// Longest a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// What the admin endpoints read.
pub struct Admin {
    routes: Routes,
    registry: prometheus_client::registry::Registry,
}

/// Whether calls can be served, and if not, why.
pub fn readiness(routes: &Routes) -> Result<(), &'static str> {
    match routes {
        Routes::Single(driver) if driver.serving() => Ok(()),
        Routes::Single(_) => Err("lockd is shutting down"),
        Routes::Cluster(ha) if ha.ready() => Ok(()),
        Routes::Cluster(_) => {
            Err("no leader is known (an election is under way, or etcd is out of reach)")
        }
    }
}

/// The gauges the core holds now.
fn gauges(routes: &Routes) -> Gauges {
    match routes {
        Routes::Single(driver) => Gauges {
            state: Some(driver.gauges()),
            leader: None,
        },
        Routes::Cluster(ha) => match ha.leading() {
            Some(driver) => Gauges {
                state: Some(driver.gauges()),
                leader: Some(true),
            },
            None => Gauges {
                state: None,
                leader: Some(false),
            },
        },
    }
}

impl Admin {
    pub fn new(routes: Routes) -> Admin {
        let for_gauges = routes.clone();
        let registry = crate::metrics::get().registry(Box::new(move || gauges(&for_gauges)));
        Admin { routes, registry }
    }

    /// Whether calls can be served (for grpc.health.v1 too).
    pub fn ready(&self) -> bool {
        readiness(&self.routes).is_ok()
    }

    fn answer(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let reply = |status: StatusCode, content_type: &str, body: String| {
            Response::builder()
                .status(status)
                .header("content-type", content_type)
                .header("cache-control", "no-store")
                .body(Full::new(Bytes::from(body)))
                .expect("a valid response")
        };
        let text = "text/plain; charset=utf-8";
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return reply(
                StatusCode::METHOD_NOT_ALLOWED,
                text,
                "only GET and HEAD\n".into(),
            );
        }
        match req.uri().path() {
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                crate::metrics::render(&self.registry),
            ),
            "/healthz" => reply(StatusCode::OK, text, "ok\n".into()),
            "/readyz" => match readiness(&self.routes) {
                Ok(()) => reply(StatusCode::OK, text, "ready\n".into()),
                Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, text, format!("{why}\n")),
            },
            _ => reply(
                StatusCode::NOT_FOUND,
                text,
                "not found; try /metrics, /healthz or /readyz\n".into(),
            ),
        }
    }
}

/// Serves `admin` on `listener` for as long as the process runs.
pub fn serve(listener: TcpListener, admin: Arc<Admin>) {
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let (socket, _) = crate::tls::accept(&listener).await;
            let admin = Arc::clone(&admin);
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let answer = admin.answer(&req);
                    async move { Ok::<_, Infallible>(answer) }
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
