//! A small HTTP client for the tests (hyper), and a generated body of any size.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// `n` bytes of 'z', produced 64 KiB at a time as they are read (never held whole).
pub struct Generated {
    left: u64,
    chunk: Bytes,
}

impl Generated {
    pub fn new(n: u64) -> Generated {
        Generated {
            left: n,
            chunk: Bytes::from(vec![b'z'; 64 * 1024]),
        }
    }

    /// As a request body (sent chunked: its length is not declared).
    pub fn boxed_body(self) -> Body {
        self.boxed()
    }
}

impl hyper::body::Body for Generated {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(self.chunk.len() as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }
}

/// A request body.
pub type Body = BoxBody<Bytes, Infallible>;

/// A response, read whole (or only counted, see [`send_counting`]).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub type HttpClient = Client<HttpConnector, Body>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub fn body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

fn request(method: &str, url: &str, headers: &[(&str, &str)], body: Body) -> Request<Body> {
    let mut req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(body).unwrap()
}

/// Sends a request and reads the whole answer.
pub async fn send(
    client: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    b: Body,
) -> Answer {
    let response = client
        .request(request(method, url, headers, b))
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: reading the body: {e}"))
        .to_bytes();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

/// Sends a request and counts the answer's body bytes as they stream in.
pub async fn send_counting(client: &HttpClient, method: &str, url: &str, b: Body) -> (u16, u64) {
    let response = client
        .request(request(method, url, &[], b))
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut n = 0;
    while let Some(frame) = body.frame().await {
        n += frame.unwrap().data_ref().map_or(0, |d| d.len() as u64);
    }
    (status, n)
}
