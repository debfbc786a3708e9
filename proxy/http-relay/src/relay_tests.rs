//! The relay over real sockets, against a scripted upstream that records what reaches it and
//! answers byte for byte what each test needs (framings, interim answers, closes).

use std::future::pending;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, oneshot};

use super::*;
use crate::fence::{FenceLimits, LocalFence, MemoryMarks};
use crate::routes::Unmatched;
use crate::server::{ServerLimits, serve};

/// Longest any awaited event may take before the test fails (not a pace: events come sooner).
const PATIENCE: Duration = Duration::from_secs(20);

/// What the scripted upstream does with a request, decided from its head.
enum Plan {
    /// Reads the body, then replies.
    Read(Reply),
    /// Answers `100 Continue`, reads the body, then replies.
    Continue(Reply),
    /// Replies at once without reading the body, then closes.
    Early(&'static str),
}

enum Reply {
    /// `200 OK` with this body.
    Ok(&'static str),
    /// `200 OK` with the request's body.
    Echo,
    /// These bytes, the connection kept.
    Raw(&'static str),
    /// These bytes, then the connection closed.
    RawThenClose(&'static str),
    /// Closes the connection without answering.
    Silent,
    /// `200 OK` once this is notified.
    After(Arc<Notify>),
}

#[derive(Debug)]
enum Event {
    Request {
        conn: usize,
        head: String,
        body: Vec<u8>,
    },
    Closed {
        conn: usize,
    },
}

type Script = Arc<dyn Fn(usize, usize, &str) -> Plan + Send + Sync>;

/// Starts the scripted upstream: `script(connection, request index on it, head)`.
async fn upstream(
    script: impl Fn(usize, usize, &str) -> Plan + Send + Sync + 'static,
) -> (SocketAddr, mpsc::UnboundedReceiver<Event>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let script: Script = Arc::new(script);
    tokio::spawn(async move {
        for conn in 0.. {
            let (stream, _) = listener.accept().await.unwrap();
            let (tx, script) = (tx.clone(), Arc::clone(&script));
            tokio::spawn(async move {
                upstream_connection(conn, stream, &*script, &tx).await;
                let _ = tx.send(Event::Closed { conn });
            });
        }
    });
    (addr, rx)
}

async fn upstream_connection(
    conn: usize,
    mut stream: TcpStream,
    script: &(dyn Fn(usize, usize, &str) -> Plan + Send + Sync),
    events: &mpsc::UnboundedSender<Event>,
) {
    let mut buf = BytesMut::new();
    for nth in 0.. {
        let Some((head, framing)) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let plan = script(conn, nth, &head);
        let reply = match plan {
            Plan::Early(bytes) => {
                let _ = events.send(Event::Request {
                    conn,
                    head,
                    body: Vec::new(),
                });
                let _ = stream.write_all(bytes.as_bytes()).await;
                return;
            }
            Plan::Continue(reply) => {
                stream
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .unwrap();
                reply
            }
            Plan::Read(reply) => reply,
        };
        let Some(body) = read_body(&mut stream, &mut buf, framing).await else {
            return;
        };
        let echo = matches!(reply, Reply::Echo).then(|| ok(&body));
        let _ = events.send(Event::Request { conn, head, body });
        let close = matches!(reply, Reply::RawThenClose(_) | Reply::Silent);
        let answer = match reply {
            Reply::Ok(text) => ok(text.as_bytes()),
            Reply::Echo => echo.expect("made above"),
            Reply::Raw(text) | Reply::RawThenClose(text) => text.as_bytes().to_vec(),
            Reply::Silent => Vec::new(),
            Reply::After(release) => {
                release.notified().await;
                ok(b"late")
            }
        };
        if stream.write_all(&answer).await.is_err() || close {
            return;
        }
    }
}

fn ok(body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// Reads a request or response head; its text and how its body is framed (Content-Length or
/// chunked; `None` for neither).
async fn read_head(stream: &mut TcpStream, buf: &mut BytesMut) -> Option<(String, Option<u64>)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf.split_to(end + 4).to_vec()).unwrap();
            let lower = head.to_ascii_lowercase();
            let framing = if lower.contains("transfer-encoding: chunked") {
                Some(u64::MAX)
            } else {
                lower
                    .split("\r\n")
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map(|n| n.trim().parse().unwrap())
            };
            return Some((head, framing));
        }
        if stream.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

/// Reads a body: `Some(u64::MAX)` chunked, `Some(n)` that many bytes, `None` nothing.
async fn read_body(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    framing: Option<u64>,
) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    match framing {
        None => {}
        Some(u64::MAX) => {
            let mut decoder = h1::Chunked::default();
            loop {
                match decoder.decode(buf).expect("well-formed chunks") {
                    Decoded::Data(n) => {
                        body.extend_from_slice(&buf[..n]);
                        buf.advance(n);
                        decoder.took(n);
                    }
                    Decoded::End => break,
                    Decoded::Need => {
                        if stream.read_buf(buf).await.ok()? == 0 {
                            return None;
                        }
                    }
                }
            }
        }
        Some(n) => {
            while (buf.len() as u64) < n {
                if stream.read_buf(buf).await.ok()? == 0 {
                    return None;
                }
            }
            body = buf.split_to(n as usize).to_vec();
        }
    }
    Some(body)
}

/// A response as the client got it.
#[derive(Debug)]
struct Got {
    head: String,
    body: Vec<u8>,
}

impl Got {
    fn status(&self) -> u16 {
        self.head[9..12].parse().unwrap()
    }

    fn assert_has(&self, line: &str) {
        assert!(self.head.contains(line), "{line:?} not in {}", self.head);
    }

    fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        v["type"].as_str().unwrap().to_string()
    }
}

/// Reads one response: framed by its length, by chunks, or by the close.
async fn response(stream: &mut TcpStream, buf: &mut BytesMut, head_request: bool) -> Got {
    let (head, framing) = tokio::time::timeout(PATIENCE, read_head(stream, buf))
        .await
        .expect("a response in time")
        .expect("a response head");
    let body = if head_request {
        Vec::new()
    } else if framing.is_none() && head.to_ascii_lowercase().contains("connection: close") {
        let mut rest = buf.split().to_vec();
        stream.read_to_end(&mut rest).await.unwrap();
        rest
    } else {
        read_body(stream, buf, framing).await.expect("a whole body")
    };
    Got { head, body }
}

/// The proxy in front of `upstream`, relaying everything unfenced, never shut down.
async fn proxy(
    upstream: SocketAddr,
    tweak: impl FnOnce(&mut RelayConfig, &mut ServerLimits),
) -> SocketAddr {
    proxy_until(upstream, tweak, pending()).await.0
}

/// The proxy in front of `upstream` until `shutdown`; its address and its serving task.
async fn proxy_until(
    upstream: SocketAddr,
    tweak: impl FnOnce(&mut RelayConfig, &mut ServerLimits),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let mut config = RelayConfig {
        upstream: format!("http://{upstream}").parse().unwrap(),
        body_max_bytes: 1 << 20,
        upstream_timeout: PATIENCE,
        connect_timeout: PATIENCE,
        pool_idle_per_host: 16,
        pool_idle_timeout: Duration::from_secs(600),
        signing: Default::default(),
        upstream_tls: None,
        path_reading: Default::default(),
    };
    let mut limits = ServerLimits {
        header_read_timeout: Duration::from_secs(600),
        ..ServerLimits::default()
    };
    tweak(&mut config, &mut limits);
    let routes = Routes::new(&[], Some(Unmatched::Pass)).unwrap();
    let fence = LocalFence::new(
        Arc::new(MemoryMarks),
        [("x", FencingToken::new(1).unwrap())],
        FenceLimits::default(),
    );
    let relay = Arc::new(Relay::new(routes, Arc::new(fence), config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(serve(
        shards::Listener::single(listener),
        relay,
        limits,
        None,
        shutdown,
    ));
    (addr, serving)
}

async fn next(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(PATIENCE, events.recv())
        .await
        .expect("an upstream event in time")
        .expect("the upstream runs")
}

/// The next request the upstream saw: its connection, head and body.
async fn next_request(events: &mut mpsc::UnboundedReceiver<Event>) -> (usize, String, Vec<u8>) {
    match next(events).await {
        Event::Request { conn, head, body } => (conn, head, body),
        e => panic!("expected a request, got {e:?}"),
    }
}

async fn eof(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest)).await,
        Ok(Ok(_))
    ) && rest.is_empty()
}

#[tokio::test]
async fn a_client_connections_requests_share_one_upstream_connection_and_pipelined_ones_stay_in_order()
 {
    let (mut c, mut buf, mut events, _) = start(|_, _, _| Plan::Read(Reply::Echo)).await;
    c.write_all(b"POST /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\none")
        .await
        .unwrap();
    assert_eq!(response(&mut c, &mut buf, false).await.body, b"one");
    // Two requests in one write, the second's body split over two more.
    c.write_all(b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\nPUT /3 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nth")
        .await
        .unwrap();
    c.write_all(b"ree").await.unwrap();
    assert_eq!(response(&mut c, &mut buf, false).await.body, b"");
    assert_eq!(response(&mut c, &mut buf, false).await.body, b"three");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (conn, head, _) = next_request(&mut events).await;
        seen.push((conn, head.lines().next().unwrap().to_string()));
    }
    assert_eq!(
        seen,
        vec![
            (0, "POST /1 HTTP/1.1".to_string()),
            (0, "GET /2 HTTP/1.1".to_string()),
            (0, "PUT /3 HTTP/1.1".to_string())
        ]
    );
}

#[tokio::test]
async fn chunked_bodies_are_relayed_both_ways_and_decoded_for_http_1_0() {
    let (mut c, mut buf, mut events, px) = start(|_, _, head| {
        if head.starts_with("GET") {
            Plan::Read(Reply::Raw(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\nT: 1\r\n\r\n",
            ))
        } else {
            Plan::Read(Reply::Echo)
        }
    })
    .await;
    c.write_all(
        b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext\r\nhello\r\n",
    )
    .await
    .unwrap();
    c.write_all(b"5\r\nworld\r\n0\r\nTrailer-Field: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut c, &mut buf, false).await.body, b"helloworld");
    let (_, head, body) = next_request(&mut events).await;
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert_eq!(body, b"helloworld");

    c.write_all(b"GET /c HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let got = response(&mut c, &mut buf, false).await;
    got.assert_has("transfer-encoding: chunked\r\n");
    assert_eq!(got.body, b"abcdefg");

    // HTTP/1.0 knows no chunks: the decoded body, delimited by the close.
    let mut old = TcpStream::connect(px).await.unwrap();
    old.write_all(b"GET /c HTTP/1.0\r\n\r\n").await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(PATIENCE, old.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    let all = String::from_utf8(all).unwrap();
    assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all}");
    assert!(all.contains("connection: close\r\n"), "{all}");
    assert!(all.ends_with("\r\n\r\nabcdefg"), "{all}");
}

#[tokio::test]
async fn a_response_without_length_is_relayed_until_the_upstream_closes() {
    let (mut c, _buf, _events, _) =
        start(|_, _, _| Plan::Read(Reply::RawThenClose("HTTP/1.1 200 OK\r\n\r\nuntil the end")))
            .await;
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let got = response(&mut c, &mut BytesMut::new(), false).await;
    got.assert_has("connection: close\r\n");
    assert_eq!(got.body, b"until the end");
}

#[tokio::test]
async fn head_responses_have_no_body_and_the_connection_goes_on() {
    let (mut c, mut buf, _events, _) = start(|_, _, head| {
        if head.starts_with("HEAD") {
            Plan::Read(Reply::Raw(
                "HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n",
            ))
        } else {
            Plan::Read(Reply::Ok("after"))
        }
    })
    .await;
    c.write_all(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let got = response(&mut c, &mut buf, true).await;
    got.assert_has("content-length: 1000\r\n");
    assert_eq!(response(&mut c, &mut buf, false).await.body, b"after");
}

#[tokio::test]
async fn expect_100_continue_passes_through() {
    let (mut c, mut buf, mut events, _) = start(|_, _, _| Plan::Continue(Reply::Echo)).await;
    c.write_all(b"PUT /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        .await
        .unwrap();
    // The client sends its body only after the upstream's 100 came through.
    let interim = response(&mut c, &mut buf, true).await;
    assert_eq!(interim.status(), 100, "{}", interim.head);
    c.write_all(b"body").await.unwrap();
    let got = response(&mut c, &mut buf, false).await;
    assert_eq!((got.status(), got.body.as_slice()), (200, &b"body"[..]));
    let (_, head, _) = next_request(&mut events).await;
    assert!(head.contains("Expect: 100-continue\r\n"), "{head}");
}

#[tokio::test]
async fn an_answer_before_the_body_is_relayed_and_both_connections_close() {
    let (mut c, _buf, mut events, _) = start(|_, _, _| {
        Plan::Early("HTTP/1.1 413 Payload Too Large\r\ncontent-length: 4\r\n\r\nbig!")
    })
    .await;
    c.write_all(b"POST /big HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\nsome of it")
        .await
        .unwrap();
    let got = response(&mut c, &mut BytesMut::new(), false).await;
    assert_eq!((got.status(), got.body.as_slice()), (413, &b"big!"[..]));
    got.assert_has("connection: close\r\n");
    assert!(eof(&mut c).await, "the client connection closes");
    next_request(&mut events).await;
    assert!(matches!(next(&mut events).await, Event::Closed { conn: 0 }));
}

#[tokio::test]
async fn a_kept_connection_closed_before_answering_is_retried_only_for_idempotent_requests() {
    // Every upstream connection closes without answering its second request.
    let (mut c, mut buf, mut events, _) = start(|_, nth, _| {
        Plan::Read(if nth == 1 {
            Reply::Silent
        } else {
            Reply::Ok("ok")
        })
    })
    .await;
    c.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut c, &mut buf, false).await.status(), 200);
    // GET: the kept connection closes on it; sent again on a new one.
    c.write_all(b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut c, &mut buf, false).await.status(), 200);
    // POST on the (new) kept connection, which closes on it: not repeated, 502.
    c.write_all(b"POST /3 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx")
        .await
        .unwrap();
    let got = response(&mut c, &mut buf, false).await;
    assert_eq!(got.status(), 502);
    assert_eq!(
        got.problem_type(),
        "urn:fencing:problem:upstream-unreachable"
    );
    // The client connection goes on: the request was read whole.
    c.write_all(b"GET /4 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut c, &mut buf, false).await.status(), 200);

    let mut requests = Vec::new();
    while requests.len() < 5 {
        if let Event::Request { conn, head, .. } = next(&mut events).await {
            requests.push((conn, head.lines().next().unwrap().to_string()));
        }
    }
    assert_eq!(
        requests,
        vec![
            (0, "GET /1 HTTP/1.1".to_string()),
            (0, "GET /2 HTTP/1.1".to_string()),
            (1, "GET /2 HTTP/1.1".to_string()),
            (1, "POST /3 HTTP/1.1".to_string()),
            (2, "GET /4 HTTP/1.1".to_string()),
        ]
    );
}

#[tokio::test]
async fn a_kept_connection_the_upstream_closed_while_idle_is_replaced() {
    // Each upstream connection answers one request (keep-alive by its head) and closes.
    let (mut c, mut buf, mut events, _) = start(|_, _, _| {
        Plan::Read(Reply::RawThenClose(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ))
    })
    .await;
    for conn in 0..3 {
        // A POST is never sent twice: it must go out on a live connection.
        c.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx")
            .await
            .unwrap();
        assert_eq!(response(&mut c, &mut buf, false).await.status(), 200);
        assert!(matches!(next(&mut events).await, Event::Request { conn: n, .. } if n == conn));
        assert!(matches!(next(&mut events).await, Event::Closed { conn: n } if n == conn));
    }
}

/// The scripted upstream, the proxy in front of it with default settings, and a client
/// connection to the proxy with its read buffer.
async fn start(
    script: impl Fn(usize, usize, &str) -> Plan + Send + Sync + 'static,
) -> (
    TcpStream,
    BytesMut,
    mpsc::UnboundedReceiver<Event>,
    SocketAddr,
) {
    let (up, events) = upstream(script).await;
    let px = proxy(up, |_, _| {}).await;
    let c = TcpStream::connect(px).await.unwrap();
    (c, BytesMut::new(), events, px)
}

/// Sends `GET path` on `c`, expects 200, and returns the upstream connection that served it.
async fn get(
    c: &mut TcpStream,
    buf: &mut BytesMut,
    events: &mut mpsc::UnboundedReceiver<Event>,
    path: &str,
) -> usize {
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(response(c, buf, false).await.status(), 200);
    next_request(events).await.0
}

#[tokio::test]
async fn idle_upstream_connections_are_bounded() {
    let (up, mut events) = upstream(|_, _, _| Plan::Read(Reply::Ok("ok"))).await;
    let px = proxy(up, |c, _| c.pool_idle_per_host = 1).await;
    let mut a = TcpStream::connect(px).await.unwrap();
    let mut b = TcpStream::connect(px).await.unwrap();
    let (mut abuf, mut bbuf) = (BytesMut::new(), BytesMut::new());
    assert_eq!(get(&mut a, &mut abuf, &mut events, "/a").await, 0);
    // a keeps its connection, the one idle allowed: b's is closed after its request.
    assert_eq!(get(&mut b, &mut bbuf, &mut events, "/b").await, 1);
    assert!(matches!(next(&mut events).await, Event::Closed { conn: 1 }));
    assert_eq!(get(&mut a, &mut abuf, &mut events, "/a").await, 0);
    // When a goes away, its connection goes with it, and b's next one may be kept.
    drop(a);
    assert!(matches!(next(&mut events).await, Event::Closed { conn: 0 }));
    assert_eq!(get(&mut b, &mut bbuf, &mut events, "/b").await, 2);
    assert_eq!(get(&mut b, &mut bbuf, &mut events, "/b").await, 2);
}

#[tokio::test]
async fn an_idle_upstream_connection_is_closed_after_the_idle_timeout_and_replaced() {
    let (up, mut events) = upstream(|_, _, _| Plan::Read(Reply::Ok("ok"))).await;
    let px = proxy(up, |c, _| c.pool_idle_timeout = Duration::from_millis(50)).await;
    let mut c = TcpStream::connect(px).await.unwrap();
    let mut buf = BytesMut::new();
    assert_eq!(get(&mut c, &mut buf, &mut events, "/").await, 0);
    // Closed by the proxy while the client connection stays open and idle.
    assert!(matches!(next(&mut events).await, Event::Closed { conn: 0 }));
    assert_eq!(get(&mut c, &mut buf, &mut events, "/").await, 1);
}

#[tokio::test]
async fn malformed_oversized_and_unsupported_requests_get_their_answers_and_close() {
    let (up, _events) = upstream(|_, _, _| Plan::Read(Reply::Ok("ok"))).await;
    let px = proxy(up, |c, _| c.body_max_bytes = 10).await;
    let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(h1::HEAD_MAX));
    // No blank line at all: refused once the limit is reached.
    let endless = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(h1::HEAD_MAX));
    let cases: [(&[u8], u16, &str); 7] = [
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400, "bad-request"),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "bad-request",
        ),
        (long.as_bytes(), 431, "head-too-large"),
        (endless.as_bytes(), 431, "head-too-large"),
        (b"CONNECT a:443 HTTP/1.1\r\n\r\n", 501, "not-relayed"),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n",
            413,
            "body-too-large",
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nsix b.\r\n6\r\nsix b.\r\n0\r\n\r\n",
            413,
            "body-too-large",
        ),
    ];
    for (raw, status, kind) in cases {
        let mut c = TcpStream::connect(px).await.unwrap();
        c.write_all(raw).await.unwrap();
        let got = response(&mut c, &mut BytesMut::new(), false).await;
        assert_eq!(
            (got.status(), got.problem_type()),
            (status, format!("urn:fencing:problem:{kind}")),
            "{}",
            String::from_utf8_lossy(&raw[..raw.len().min(80)])
        );
        got.assert_has("connection: close\r\n");
        assert!(eof(&mut c).await, "closed after {status}");
    }
}

#[tokio::test]
async fn a_malformed_upstream_answer_gets_502() {
    let (mut c, _buf, _events, _) = start(|_, _, _| {
        Plan::Read(Reply::Raw(
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nxy",
        ))
    })
    .await;
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let got = response(&mut c, &mut BytesMut::new(), false).await;
    assert_eq!(
        (got.status(), got.problem_type().as_str()),
        (502, "urn:fencing:problem:upstream-bad-response")
    );
}

#[tokio::test]
async fn a_client_that_does_not_finish_its_head_in_time_is_disconnected() {
    let (up, _events) = upstream(|_, _, _| Plan::Read(Reply::Ok("ok"))).await;
    let px = proxy(up, |_, l| {
        l.header_read_timeout = Duration::from_millis(100)
    })
    .await;
    let mut c = TcpStream::connect(px).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost:").await.unwrap();
    assert!(eof(&mut c).await, "closed without an answer");
}

#[tokio::test]
async fn on_shutdown_idle_connections_close_and_requests_in_progress_finish() {
    let release = Arc::new(Notify::new());
    let held = Arc::clone(&release);
    let (up, mut events) = upstream(move |_, _, head| {
        Plan::Read(if head.starts_with("GET /slow") {
            Reply::After(Arc::clone(&held))
        } else {
            Reply::Ok("ok")
        })
    })
    .await;
    let (stop, stopped) = oneshot::channel::<()>();
    let (px, serving) = proxy_until(up, |_, _| {}, async {
        let _ = stopped.await;
    })
    .await;
    let mut idle = TcpStream::connect(px).await.unwrap();
    let mut idle_buf = BytesMut::new();
    get(&mut idle, &mut idle_buf, &mut events, "/fast").await;
    let mut busy = TcpStream::connect(px).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    next_request(&mut events).await;
    // The slow request is at the upstream: shut down.
    stop.send(()).unwrap();
    assert!(eof(&mut idle).await, "an idle connection closes at once");
    release.notify_one();
    let got = response(&mut busy, &mut BytesMut::new(), false).await;
    assert_eq!((got.status(), got.body.as_slice()), (200, &b"late"[..]));
    got.assert_has("connection: close\r\n");
    assert!(eof(&mut busy).await, "closed after its response");
    tokio::time::timeout(PATIENCE, serving)
        .await
        .expect("serve returns once its connections are done")
        .unwrap();
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_relayed() {
    let (mut c, mut buf, _events, _) = start(|_, _, _| Plan::Read(Reply::Ok("ok"))).await;
    for b in b"GET /slowly HTTP/1.1\r\nHost: a\r\n\r\n" {
        c.write_all(&[*b]).await.unwrap();
        c.flush().await.unwrap();
    }
    assert_eq!(response(&mut c, &mut buf, false).await.body, b"ok");
}
