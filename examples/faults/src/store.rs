//! The HTTP mode's protected store: a counter service that checks nothing (fence-proxy does).
//!
//! - `GET /counter/{name}` → the value, as text.
//! - `PUT /counter/{name}` with the new value as the body and the write's name in `X-Write-Id`
//!   → the write's position in this counter's order (1, 2, ...), as text.
//!
//! It runs inside the runner, which reads the final state directly (not over HTTP).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[derive(Default)]
struct Counter {
    value: i64,
    applied: Vec<String>,
}

#[derive(Default)]
pub struct Counters {
    state: Mutex<HashMap<String, Counter>>,
}

impl Counters {
    /// Serves on a free loopback port.
    pub async fn start() -> std::io::Result<(Arc<Counters>, SocketAddr)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let state = Arc::clone(&counters);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, Infallible>(state.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok((counters, addr))
    }

    /// The names of the writes applied to `name`, in order.
    pub fn applied(&self, name: &str) -> Vec<String> {
        let state = self.state.lock().expect("counter state");
        state
            .get(name)
            .map(|c| c.applied.clone())
            .unwrap_or_default()
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let Some(name) = req
            .uri()
            .path()
            .strip_prefix("/counter/")
            .map(str::to_string)
        else {
            return answer(StatusCode::NOT_FOUND, "no such path".to_string());
        };
        let method = req.method().clone();
        let id = req
            .headers()
            .get("x-write-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let Ok(body) = req.into_body().collect().await else {
            return answer(StatusCode::BAD_REQUEST, "body cut short".to_string());
        };
        let body = String::from_utf8_lossy(&body.to_bytes()).into_owned();
        let mut state = self.state.lock().expect("counter state");
        let counter = state.entry(name).or_default();
        match method {
            Method::GET => answer(StatusCode::OK, counter.value.to_string()),
            Method::PUT => {
                let (Some(id), Ok(value)) = (id, body.trim().parse()) else {
                    return answer(
                        StatusCode::BAD_REQUEST,
                        "PUT needs X-Write-Id and a whole number".to_string(),
                    );
                };
                counter.value = value;
                counter.applied.push(id);
                answer(StatusCode::OK, counter.applied.len().to_string())
            }
            _ => answer(StatusCode::METHOD_NOT_ALLOWED, "GET or PUT".to_string()),
        }
    }
}

fn answer(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r
}
