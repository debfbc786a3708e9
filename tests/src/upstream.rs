//! An HTTP service written for the tests: it records what reaches it, in order, and can hold a
//! request until the test lets it go.
//!
//! - any request: recorded on arrival (method, path, `Fencing-Resource`, `Fencing-Token`,
//!   forwarding headers); with `X-Hold: NAME` it waits for [`Upstream::release`]`(NAME)`;
//!   answers `200` with the arrival index;
//! - `POST /count`: reads the body as a stream and answers its length;
//! - `GET /download?bytes=N`: answers N bytes, generated as a stream.
//!
//! It runs on its own runtime thread, so that synchronous tests can use it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;

use crate::PATIENCE;
use crate::client::Generated;

/// One request as the upstream saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub resource: Option<String>,
    pub token: Option<u64>,
    pub headers: http::HeaderMap,
    /// Set when the upstream finished answering it.
    pub done: bool,
}

#[derive(Default)]
struct State {
    seen: Mutex<Vec<Seen>>,
    changed: Condvar,
    /// Per hold name: who waits, and whether it was released.
    holds: Mutex<HashMap<String, (Arc<Notify>, bool)>>,
}

/// The service; stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

type Body = BoxBody<Bytes, Infallible>;

impl Upstream {
    pub fn start() -> Upstream {
        Upstream::start_with(None)
    }

    /// The service in HTTPS with `tls`'s certificate (and its client CA, if any): a failed
    /// handshake closes that connection only.
    pub fn start_tls(tls: std::sync::Arc<tlsconf::Reloadable>) -> Upstream {
        Upstream::start_with(Some(tls))
    }

    fn start_with(tls: Option<std::sync::Arc<tlsconf::Reloadable>>) -> Upstream {
        let state = Arc::new(State::default());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let s = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    let (stream, _) = tokio::select! {
                        _ = &mut stopped => return,
                        a = listener.accept() => a.unwrap(),
                    };
                    let s = Arc::clone(&s);
                    let acceptor = tls.as_ref().map(|t| t.acceptor());
                    tokio::spawn(async move {
                        let service = service_fn(move |req| handle(Arc::clone(&s), req));
                        let _ = match acceptor {
                            None => {
                                http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await
                            }
                            Some(a) => match tlsconf::accept(&a, stream).await {
                                Ok(tls) => {
                                    http1::Builder::new()
                                        .serve_connection(TokioIo::new(tls), service)
                                        .await
                                }
                                Err(_) => return,
                            },
                        };
                    });
                }
            });
        });
        let addr = addr_rx.recv().unwrap();
        Upstream {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything that arrived so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Waits until `pred` holds for what arrived.
    pub fn wait_until(&self, what: &str, pred: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let deadline = Instant::now() + PATIENCE;
        let mut seen = self.state.seen.lock().unwrap();
        loop {
            if pred(&seen) {
                return seen.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "upstream: gave up waiting for {what}; seen: {:?}",
                *seen
            );
            seen = self.state.changed.wait_timeout(seen, left).unwrap().0;
        }
    }

    /// Lets the requests held under `name` answer.
    pub fn release(&self, name: &str) {
        let mut holds = self.state.holds.lock().unwrap();
        let (notify, released) = holds.entry(name.to_string()).or_default();
        // A request that arrives later with this hold passes at once.
        *released = true;
        notify.notify_waiters();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let path = req.uri().path().to_string();
    if path == "/count" {
        let mut body = req.into_body();
        let mut n: u64 = 0;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                Err(e) => return Ok(text(StatusCode::BAD_REQUEST, e.to_string())),
            }
        }
        return Ok(text(StatusCode::OK, n.to_string()));
    }
    if path == "/download" {
        let total: u64 = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("bytes="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let body = Generated::new(total).boxed();
        return Ok(Response::new(body));
    }
    let index = {
        let mut seen = state.seen.lock().unwrap();
        seen.push(Seen {
            method: req.method().to_string(),
            path: path.clone(),
            resource: header("fencing-resource"),
            token: header("fencing-token").and_then(|t| t.parse().ok()),
            headers: req.headers().clone(),
            done: false,
        });
        state.changed.notify_all();
        seen.len() - 1
    };
    if let Some(name) = header("x-hold") {
        let (notify, released) = {
            let mut holds = state.holds.lock().unwrap();
            let (n, r) = holds.entry(name).or_default();
            (Arc::clone(n), *r)
        };
        if !released {
            let wake = notify.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            // Checked again after registering, so that a release in between is not missed.
            let released_now = state
                .holds
                .lock()
                .unwrap()
                .values()
                .any(|(n, r)| Arc::ptr_eq(n, &notify) && *r);
            if !released_now {
                wake.await;
            }
        }
    }
    // Drain the body, and shuffle the scheduling a little so that concurrent requests finish in
    // varied orders (no sleeping: yields only).
    let _ = req.into_body().collect().await;
    for _ in 0..(index * 7919 % 13) {
        tokio::task::yield_now().await;
    }
    {
        let mut seen = state.seen.lock().unwrap();
        seen[index].done = true;
        state.changed.notify_all();
    }
    Ok(text(StatusCode::OK, index.to_string()))
}
