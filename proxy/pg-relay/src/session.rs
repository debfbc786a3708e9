//! One client session's I/O: the start-up packet, the connection to PostgreSQL, and the two
//! directions relayed concurrently in one task. Every decision about the messages is the
//! [`Machine`]'s; this module frames bytes into messages, feeds them to it and writes what it
//! says.
//!
//! - Start-up: with a certificate configured, an SSLRequest is answered `S` and the session
//!   goes on in TLS (bytes sent after the SSLRequest and before the handshake are refused: a
//!   man in the middle could have put them there), and a connection that opens with a TLS
//!   handshake (libpq's `sslnegotiation=direct`, ALPN `postgresql`) is taken too. Without
//!   one, SSLRequest is answered `N`; GSSENCRequest always is. A CancelRequest is forwarded.
//!   A StartupMessage opens the session, unless the listener requires TLS and the session is
//!   in plaintext (28000), the listener is full (53300, sent after the SSLRequest was
//!   answered, so that a libpq client with `sslmode=prefer` reads it) or the client asks for a
//!   replication connection (0A000: a walsender takes no extended-protocol checks).
//! - TLS on both sides with different certificates breaks SCRAM channel binding (the client
//!   binds to our certificate, PostgreSQL to its own): a client that chooses
//!   SCRAM-SHA-256-PLUS is told so (28000), instead of PostgreSQL's bare "channel binding
//!   check failed".
//! - Relaying: what the client direction answers by itself (a refusal from memory, a FATAL
//!   over a bad message) is queued in the machine and written by the other direction, in
//!   order; what the server direction wants sent to the server (the start-up probe) is written
//!   by the client direction, before any client bytes.
//! - A fenced session that was idle when PostgreSQL ended it gets its FN003 error in answer to
//!   the next thing it sends (held for at most `fenced_hold`), not unasked.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use pg_wire::backend::Backend;
use pg_wire::frontend::tag;
use pg_wire::{Header, Startup, WireError};
use tlsconf::Stream;
use tlsconf::rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::machine::{Local, Machine, Step, Verdict};
use crate::pool;
use crate::tally::Who;
use crate::{ListenerTls, Marks, Relay, sqlstate, upstream};

/// Messages larger than this are streamed rather than held whole, where they may be (CopyData
/// from either side, DataRow from the server).
const STREAM_ABOVE: usize = 256 << 10;
/// How long a client may still write after its server connection ended (see `session`).
const DRAIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Largest server message held whole (everything but DataRow and CopyData is small).
const SERVER_MESSAGE_MAX: usize = 64 << 20;
/// Largest start-up packet (PostgreSQL's own limit is 10000 bytes).
const STARTUP_MAX: usize = 64 << 10;
/// The first byte of a TLS handshake record, where a start-up packet's length would begin (a
/// length that no start-up packet may have).
const TLS_HANDSHAKE: u8 = 0x16;
/// The ALPN protocol of PostgreSQL (a direct TLS handshake must offer it).
pub(crate) const ALPN: &[u8] = b"postgresql";

pub(crate) async fn run(relay: Arc<Relay>, client: TcpStream, peer: SocketAddr) {
    let _ = client.set_nodelay(true);
    let open = relay.connections.fetch_add(1, Ordering::AcqRel) + 1;
    let _count = (
        Decrement(&relay),
        opskit::fence::get().connection(opskit::fence::Mode::Pg),
    );
    let full = open > relay.config.connections_max;
    let Some(starting) = relay.starting.take(peer.ip()) else {
        let max = relay.starting.max();
        tracing::info!(%peer, max, "refusing a connection: too many in start-up from this address");
        let mut out = Vec::new();
        sqlstate::fatal(
            &mut out,
            sqlstate::TOO_MANY_CONNECTIONS,
            &format!(
                "fence-proxy: too many connections in start-up from this address (startups_per_peer_max = {max})"
            ),
        );
        let _ = client.try_write(&out);
        return;
    };
    match session(&relay, client, peer, full, starting).await {
        Ok(()) => tracing::debug!(%peer, "session ended"),
        Err(e) => tracing::debug!(%peer, error = %e, "session ended"),
    }
}

struct Decrement<'a>(&'a Relay);
impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Writes a FATAL error to the client (best effort) and returns the error to end the session.
pub(crate) async fn fatal(client: &mut Stream, code: &str, message: String) -> std::io::Result<()> {
    let mut out = Vec::new();
    sqlstate::fatal(&mut out, code, &message);
    let _ = client.write_all(&out).await;
    Err(std::io::Error::other(message))
}

/// What the start-up exchange ended with.
enum Opened {
    /// A StartupMessage: its bytes, and whether it asks for replication.
    Session {
        packet: BytesMut,
        replication: bool,
        database: String,
        /// What a pool needs of the start-up packet (see [`pool::Startup`]).
        startup: pool::Startup,
    },
    /// A CancelRequest (forwarded) or a client that left.
    Done,
    Bad(WireError),
    /// A start-up packet the relay will not pass on (why).
    Refused(&'static str),
    /// An SSLRequest was answered `S`: the TLS handshake comes next.
    Tls,
}

/// The start-up exchange, TLS handshakes included: the connection as the session goes on, how
/// the exchange ended, and the certificate we presented if the connection is in TLS.
async fn open(
    relay: &Relay,
    tcp: TcpStream,
    buf: &mut BytesMut,
    peer: SocketAddr,
) -> std::io::Result<(Stream, Opened, Option<CertificateDer<'static>>)> {
    let mut client = Stream::Plain(tcp);
    let mut leaf = None;
    if let Some(tls) = &relay.config.tls {
        let mut first = [0u8; 1];
        if client.tcp().peek(&mut first).await? == 1 && first[0] == TLS_HANDSHAKE {
            let (stream, ours) = handshake(tls, plain(client)?, peer, true).await?;
            (client, leaf) = (stream, Some(ours));
        }
    }
    loop {
        match read_startup(relay, &mut client, buf).await? {
            Opened::Tls => {
                let tls = relay
                    .config
                    .tls
                    .as_ref()
                    .expect("S is answered only with TLS");
                let (stream, ours) = handshake(tls, plain(client)?, peer, false).await?;
                (client, leaf) = (stream, Some(ours));
            }
            opened => return Ok((client, opened, leaf)),
        }
    }
}

/// The TCP connection of a plaintext stream.
fn plain(client: Stream) -> std::io::Result<TcpStream> {
    match client {
        Stream::Plain(tcp) => Ok(tcp),
        _ => Err(std::io::Error::other(
            "a second TLS handshake on a TLS connection",
        )),
    }
}

/// The server side of a client's TLS handshake; `direct`: the connection opened with it (no
/// SSLRequest), which PostgreSQL takes only with ALPN `postgresql`. A failure is one log line.
async fn handshake(
    tls: &ListenerTls,
    tcp: TcpStream,
    peer: SocketAddr,
    direct: bool,
) -> std::io::Result<(Stream, CertificateDer<'static>)> {
    let (acceptor, leaf) = tls.server.acceptor_and_leaf();
    match tlsconf::accept(&acceptor, tcp).await {
        Ok(s) if direct && s.get_ref().1.alpn_protocol() != Some(ALPN) => {
            tracing::info!(%peer, "a direct TLS handshake without ALPN \"postgresql\"; connection closed");
            Err(std::io::Error::other("direct TLS without ALPN postgresql"))
        }
        Ok(s) => Ok((Stream::Server(Box::new(s)), leaf)),
        Err(e) => {
            tracing::info!(%peer, reason = %tlsconf::handshake_error(&e), "TLS handshake failed; connection closed");
            Err(e)
        }
    }
}

/// Reads start-up packets until one opens a session or asks for TLS (answering GSSENCRequest,
/// and SSLRequest without TLS, with `N`; forwarding a CancelRequest).
async fn read_startup(
    relay: &Relay,
    client: &mut Stream,
    buf: &mut BytesMut,
) -> std::io::Result<Opened> {
    loop {
        let len = loop {
            match pg_wire::startup_len(buf, STARTUP_MAX) {
                Ok(Some(len)) => break len,
                Ok(None) => {
                    if client.read_buf(buf).await? == 0 {
                        return Ok(Opened::Done);
                    }
                }
                Err(e) => return Ok(Opened::Bad(e)),
            }
        };
        let packet = buf.split_to(len);
        match pg_wire::parse_startup(&packet) {
            Ok(Startup::Ssl | Startup::GssEnc) if client.is_tls() => {
                return Ok(Opened::Refused(
                    "fence-proxy: an encryption request on a connection already in TLS",
                ));
            }
            Ok(Startup::Ssl) if relay.config.tls.is_some() => {
                if !buf.is_empty() {
                    // Sent in clear before the handshake, so anyone on the path could have
                    // written them (CVE-2021-23214 in PostgreSQL).
                    return Ok(Opened::Refused(
                        "fence-proxy: received unencrypted data after SSLRequest",
                    ));
                }
                client.write_all(b"S").await?;
                return Ok(Opened::Tls);
            }
            Ok(Startup::Ssl | Startup::GssEnc) => client.write_all(b"N").await?,
            Ok(Startup::Cancel { pid, key }) => {
                relay.cancel(pid, key).await;
                return Ok(Opened::Done);
            }
            Ok(Startup::Params { params, .. }) => {
                let replication = params.iter().any(|(k, v)| {
                    *k == b"replication"
                        && !["false", "off", "no", "0"]
                            .iter()
                            .any(|f| v.eq_ignore_ascii_case(f.as_bytes()))
                });
                // PostgreSQL takes the last of two keys of one name; what the relay reads
                // (the database decides whether tokens are verified there) must be what
                // PostgreSQL uses, so two are refused rather than guessed at.
                let twice = |name: &[u8]| params.iter().filter(|(k, _)| *k == name).count() > 1;
                if twice(b"database") || twice(b"user") {
                    return Ok(Opened::Refused(
                        "fence-proxy: the start-up packet names the database or the user twice",
                    ));
                }
                let param = |name: &[u8]| {
                    params
                        .iter()
                        .find(|(k, _)| *k == name)
                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                };
                // PostgreSQL's default database is the user's name.
                let database = param(b"database")
                    .filter(|d| !d.is_empty())
                    .or_else(|| param(b"user"))
                    .unwrap_or_default();
                let startup = pool::Startup {
                    user: param(b"user").unwrap_or_default(),
                    database: database.clone(),
                    declares_fencing: pool::declares_fencing(&params),
                };
                return Ok(Opened::Session {
                    packet,
                    replication,
                    database,
                    startup,
                });
            }
            Err(e) => return Ok(Opened::Bad(e)),
        }
    }
}

async fn session(
    relay: &Relay,
    tcp: TcpStream,
    peer: SocketAddr,
    full: bool,
    starting: tlsconf::PeerSlot,
) -> std::io::Result<()> {
    let mut buf = BytesMut::with_capacity(8 << 10);
    let (mut client, opened, leaf) = tokio::time::timeout(
        relay.config.startup_timeout,
        open(relay, tcp, &mut buf, peer),
    )
    .await
    .map_err(|_| std::io::Error::other("no start-up packet in time"))??;
    drop(starting);
    let client = &mut client;
    let (packet, database, startup) = match opened {
        Opened::Done => {
            // A cancel request (in TLS, libpq 17's): TLS ends with close_notify, or the client
            // reports an unexpected end although its cancel was forwarded.
            let _ = client.shutdown().await;
            return Ok(());
        }
        Opened::Bad(e) => {
            let code = match e {
                WireError::UnsupportedVersion { .. } => sqlstate::FEATURE_NOT_SUPPORTED,
                _ => sqlstate::PROTOCOL_VIOLATION,
            };
            return fatal(
                client,
                code,
                format!("fence-proxy: bad start-up packet: {e}"),
            )
            .await;
        }
        Opened::Refused(why) => {
            return fatal(client, sqlstate::PROTOCOL_VIOLATION, why.to_string()).await;
        }
        Opened::Tls => unreachable!("open() goes on in TLS"),
        Opened::Session { .. }
            if !client.is_tls() && relay.config.tls.as_ref().is_some_and(|t| t.required) =>
        {
            tracing::info!(%peer, "refusing a plaintext session: this listener requires TLS");
            return fatal(
                client,
                sqlstate::INVALID_AUTHORIZATION,
                "fence-proxy: this listener accepts TLS sessions only: connect with sslmode=require or stronger".into(),
            )
            .await;
        }
        Opened::Session { .. } if full => {
            let max = relay.config.connections_max;
            tracing::warn!(%peer, max, "refusing a connection: too many");
            return fatal(
                client,
                sqlstate::TOO_MANY_CONNECTIONS,
                format!("fence-proxy: too many connections (connections_max = {max})"),
            )
            .await;
        }
        Opened::Session {
            replication: true, ..
        } => {
            return fatal(
                client,
                sqlstate::FEATURE_NOT_SUPPORTED,
                "fence-proxy does not relay replication connections: connect to PostgreSQL directly"
                    .into(),
            )
            .await;
        }
        Opened::Session {
            packet,
            database,
            startup,
            ..
        } => (packet, database, startup),
    };
    let marks = relay.marks_of(&database);
    let (upstream, mut from_server, mut pooled) = match &relay.pool {
        Some(pool) => {
            match pool::open(relay, pool, client, &mut buf, &packet, &startup, peer).await? {
                Some((conn, checkout)) => {
                    let replay = conn.replay();
                    let (stream, meta) = conn.split();
                    (stream, replay, Some((checkout, meta)))
                }
                None => return Ok(()),
            }
        }
        None => {
            let mut upstream = match upstream::connect(&relay.config).await {
                Ok(s) => s,
                Err(m) => return cannot_connect(client, peer, m).await,
            };
            upstream.write_all(&packet).await?;
            (upstream, BytesMut::new(), None)
        }
    };
    let gate = pooled.as_ref().map(|(_, meta)| meta.gate());
    tracing::debug!(%peer, tls = client.is_tls(), upstream_tls = upstream.is_tls(), pooled = pooled.is_some(), "session started");

    let mut machine = Machine::new(relay.config.fence_wait.as_millis());
    if opskit::fence::observing() {
        machine.observe();
    }
    if !relay.config.trust_commit_hook {
        machine.ignore_hook();
    }
    let who = Who { peer, database };
    if let Some((_, meta)) = &pooled {
        machine.keep_server();
        machine.probed(meta.probe.installed, meta.probe.prepared, meta.probe.hooked);
        if meta.tokenless {
            machine.assume_tokenless_defaults();
        }
    }
    if let Some(ours) = &leaf
        && pooled.is_none()
        && upstream.is_tls()
        && upstream.peer_certificates().and_then(|c| c.first()) != Some(ours)
    {
        machine.refuse_channel_binding();
    }
    if let Some(verified) = &relay.config.verified_databases
        && !verified.contains(&who.database)
    {
        tracing::debug!(%peer, database = %who.database, "signed tokens are on and this database has no keys of this proxy: tokens are refused here");
        machine.refuse_tokens();
    }
    let shared = Shared {
        machine: Mutex::new(machine),
        progress: Notify::new(),
        client_spoke: Notify::new(),
        server_read: Notify::new(),
    };
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (upstream_r, upstream_w) = Half::pair(upstream);
    let server = Arc::clone(&upstream_r.0);
    let keep = pooled.is_some();
    let mut framer = Framer::default();
    let ended = {
        let c2s = to_server(relay, &marks, &shared, &mut client_r, upstream_w, buf, keep);
        let s2c = to_client(
            relay,
            (&marks, &who, gate),
            &shared,
            upstream_r,
            &mut client_w,
            (&mut from_server, &mut framer),
        );
        tokio::pin!(c2s, s2c);
        // Polled in this order, the client-to-server direction first: what it queues for the
        // client is then usually written in the same wake-up.
        tokio::select! {
            biased;
            r = &mut c2s => {
                if keep {
                    // Pooled: the server connection stays open and says nothing more.
                    Ended::Client(r)
                } else {
                // The client is gone or said Terminate: the server closes once it has read the
                // end, and its last words still reach the client.
                match tokio::time::timeout(relay.config.connect_timeout, &mut s2c).await {
                    Ok(r2) => Ended::Server(r.and(r2)),
                    Err(_) => Ended::Server(r),
                }
                }
            }
            r = &mut s2c => {
                // PostgreSQL is gone; its last words (a FATAL) went to the client. Keep taking
                // what the client still sends for a moment: closing at once would answer its
                // next write with a reset, which can make it drop that message unread (a
                // paused client that wakes up sends before it reads).
                let _ = tokio::time::timeout(DRAIN, &mut c2s).await;
                Ended::Server(r)
            }
        }
    };
    match ended {
        Ended::Server(r) => r,
        Ended::Client(r) => {
            // Pooled, and the client left: the connection goes back if nothing of this
            // client's is left on it (nothing in flight, no transaction, nothing half read).
            let reusable =
                shared.machine().reusable() && from_server.is_empty() && !framer.mid_message();
            tracing::debug!(%peer, reusable, "a pooled client left");
            if let Some((checkout, mut meta)) = pooled.take() {
                meta.tokenless |= shared.machine().defaults_tokenless();
                let stream = Arc::try_unwrap(server)
                    .ok()
                    .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()));
                checkout
                    .finish(stream.map(|s| meta.join(s)), reusable, &relay.config)
                    .await;
            }
            r
        }
    }
}

/// How a session's two directions ended.
enum Ended {
    /// The client left, with its server connection pooled.
    Client(std::io::Result<()>),
    Server(std::io::Result<()>),
}

pub(crate) async fn cannot_connect(
    client: &mut Stream,
    peer: SocketAddr,
    m: String,
) -> std::io::Result<()> {
    tracing::warn!(%peer, error = %m, "cannot open a session with PostgreSQL");
    opskit::fence::get().upstream_error(
        opskit::fence::Mode::Pg,
        opskit::fence::UpstreamError::Connect,
    );
    fatal(
        client,
        sqlstate::CANNOT_CONNECT,
        format!("fence-proxy: {m}"),
    )
    .await
}

/// The connection to PostgreSQL, shared by the two directions of a session (which run in one
/// task, never at once: the lock is never contended), each holding one.
struct Half(Arc<Mutex<Stream>>);

impl Half {
    fn pair(stream: Stream) -> (Half, Half) {
        let shared = Arc::new(Mutex::new(stream));
        (Half(Arc::clone(&shared)), Half(shared))
    }

    fn stream(&self) -> std::sync::MutexGuard<'_, Stream> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AsyncRead for Half {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.stream()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Half {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.stream()).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.stream()).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.stream()).poll_shutdown(cx)
    }
}

/// What both directions share. Both run in one task (never at once); the mutex only
/// satisfies the borrow checker.
struct Shared {
    machine: Mutex<Machine>,
    /// The server direction made progress the client direction may be waiting for: bytes to
    /// send for it, or nothing in flight any more.
    progress: Notify,
    /// The client sent something while a held error waited for it.
    client_spoke: Notify,
    /// The server direction read from PostgreSQL (or found it closed).
    server_read: Notify,
}

impl Shared {
    fn machine(&self) -> std::sync::MutexGuard<'_, Machine> {
        self.machine.lock().expect("the session's machine")
    }
}

/// Splits a byte stream into protocol messages. A message larger than `STREAM_ABOVE` that the
/// caller lets be streamed goes to the output as its bytes come, never held whole.
#[derive(Default)]
struct Framer {
    /// Bytes of a streamed message still to pass through.
    passthrough: usize,
}

impl Framer {
    /// In the middle of a streamed message: nothing else may be written to that output now.
    fn mid_message(&self) -> bool {
        self.passthrough > 0
    }

    /// The next whole message in `buf`, or `None` when more bytes are needed (the bytes of a
    /// streamed message go to `out` meanwhile). `stream` says which message types may be
    /// streamed; any other message longer than `max` is an error.
    fn next(
        &mut self,
        buf: &mut BytesMut,
        out: &mut Vec<u8>,
        max: usize,
        stream: impl Fn(u8) -> bool,
    ) -> Result<Option<(Header, BytesMut)>, WireError> {
        loop {
            if self.passthrough > 0 {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = self.passthrough.min(buf.len());
                out.extend_from_slice(&buf[..n]);
                buf.advance(n);
                self.passthrough -= n;
                continue;
            }
            let Some(head) = pg_wire::header(buf, usize::MAX)? else {
                return Ok(None);
            };
            if head.total > STREAM_ABOVE && stream(head.tag) {
                self.passthrough = head.total;
                continue;
            }
            if head.total > max {
                return Err(WireError::TooLarge {
                    len: head.total,
                    max,
                });
            }
            if buf.len() < head.total {
                buf.reserve(head.total - buf.len());
                return Ok(None);
            }
            return Ok(Some((head, buf.split_to(head.total))));
        }
    }
}

/// A framing error in words; an oversized message names the setting that bounds it.
fn describe(e: WireError) -> String {
    match e {
        WireError::TooLarge { len, max } => {
            format!("a message of {len} bytes exceeds message_max_bytes ({max})")
        }
        other => other.to_string(),
    }
}

/// Closes the session over a malformed or oversized client message, telling the client why.
fn refuse(machine: &mut Machine, why: &str) -> std::io::Error {
    tracing::info!(
        reason = why,
        "closing a client connection over a bad message"
    );
    machine.refuse(why);
    std::io::Error::other(why.to_string())
}

/// What the client-to-server direction found in its buffer.
enum Fed {
    /// Everything whole was handled.
    All,
    Terminate,
    /// This message must wait until nothing is in flight.
    Deferred(BytesMut),
}

/// Client to server.
async fn to_server(
    relay: &Relay,
    marks: &Marks,
    shared: &Shared,
    client: &mut (impl AsyncRead + Unpin),
    mut server: Half,
    mut buf: BytesMut,
    keep: bool,
) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(16 << 10);
    let mut framer = Framer::default();
    let mut deferred: Option<BytesMut> = None;
    loop {
        let may_hold = !buf.is_empty() && shared.machine().may_hold();
        if may_hold && upstream_pending(&server).await {
            // PostgreSQL said something before it could have seen these bytes (perhaps the end
            // of the session, said as FN003 only while nothing is in flight): the other
            // direction reads it first.
            shared.server_read.notified().await;
            continue;
        }
        let (fed, queued_local) = {
            let mut m = shared.machine();
            if m.held() {
                // PostgreSQL is gone and an error waits for the client: it spoke.
                shared.client_spoke.notify_one();
                return Ok(());
            }
            out.extend_from_slice(&m.take_to_server());
            let fed = feed(
                relay,
                marks,
                &mut m,
                &mut framer,
                &mut deferred,
                &mut buf,
                &mut out,
            )?;
            (fed, m.has_local())
        };
        if queued_local {
            // The other direction writes it: make sure it is polled again in this wake-up.
            std::future::poll_fn(|cx| {
                cx.waker().wake_by_ref();
                std::task::Poll::Ready(())
            })
            .await;
        }
        if !out.is_empty() {
            server.write_all(&out).await?;
            out.clear();
        }
        match fed {
            Fed::Terminate => {
                if !keep {
                    let _ = server.shutdown().await;
                }
                return Ok(());
            }
            Fed::Deferred(message) => {
                deferred = Some(message);
                shared.progress.notified().await;
                continue;
            }
            Fed::All => {}
        }
        buf.reserve(16 << 10);
        tokio::select! {
            read = client.read_buf(&mut buf) => {
                if read? == 0 {
                    if !keep {
                        let _ = server.shutdown().await;
                    }
                    return Ok(());
                }
            }
            () = shared.progress.notified() => {}
        }
    }
}

/// Whether bytes from PostgreSQL wait unread in the socket (without taking them). Polled with
/// the session task's own waker: a peek that finds nothing registers it for the socket's next
/// bytes, in the slot the other direction's read uses (the same task).
///
/// In TLS these are records, not yet messages: the other direction's read may find no message
/// in them (a session ticket), and then says so by `server_read` all the same. A message
/// already decrypted and left in the TLS buffer is not seen here; the other direction reads
/// it in the same wake-up (reads take all there is).
async fn upstream_pending(server: &Half) -> bool {
    std::future::poll_fn(|cx| {
        let mut byte = [0u8; 1];
        let mut probe = tokio::io::ReadBuf::new(&mut byte);
        std::task::Poll::Ready(matches!(
            server.stream().tcp().poll_peek(cx, &mut probe),
            std::task::Poll::Ready(Ok(n)) if n > 0
        ))
    })
    .await
}

/// Feeds the whole messages in `buf` (a deferred one first) to the machine.
fn feed(
    relay: &Relay,
    marks: &Marks,
    m: &mut Machine,
    framer: &mut Framer,
    deferred: &mut Option<BytesMut>,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
) -> std::io::Result<Fed> {
    let max = relay.config.message_max_bytes;
    loop {
        let message = match deferred.take() {
            Some(message) => message,
            None => {
                let next = framer
                    .next(buf, out, max, |t| t == tag::COPY_DATA)
                    .map_err(|e| refuse(m, &describe(e)))?;
                match next {
                    Some((_, message)) => message,
                    None => return Ok(Fed::All),
                }
            }
        };
        match m.client(&message, out, marks) {
            Ok(Step::Done) => {}
            Ok(Step::Terminate) => return Ok(Fed::Terminate),
            Ok(Step::Defer) => return Ok(Fed::Deferred(message)),
            Err(e) => return Err(refuse(m, &e.to_string())),
        }
    }
}

/// What the server-to-client direction woke up for.
enum Event {
    Local(Local),
    /// Bytes read from PostgreSQL (0: it closed the connection).
    Read(usize),
}

/// The cancel key handed to the client, removed from the relay's registry with the session.
struct CancelKey<'a> {
    relay: &'a Relay,
    pid: Option<i32>,
    /// The pooled server connection's gate, registered with the key.
    gate: Option<Arc<tokio::sync::RwLock<()>>>,
}

impl Drop for CancelKey<'_> {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            self.relay.unregister_cancel(pid);
        }
    }
}

/// Server to client.
async fn to_client(
    relay: &Relay,
    (marks, who, gate): (&Marks, &Who, Option<Arc<tokio::sync::RwLock<()>>>),
    shared: &Shared,
    mut server: Half,
    client: &mut (impl AsyncWrite + Unpin),
    (buf, framer): (&mut BytesMut, &mut Framer),
) -> std::io::Result<()> {
    buf.reserve(32 << 10);
    let mut out = Vec::with_capacity(32 << 10);
    let mut cancel = CancelKey {
        relay,
        pid: None,
        gate,
    };
    // A pooled connection's start-up, given again: read as if PostgreSQL had just sent it.
    let mut replayed = !buf.is_empty();
    loop {
        // What the other direction queued for the client comes first; otherwise what
        // PostgreSQL sends.
        let event = std::future::poll_fn(|cx| {
            if let Some(l) = shared.machine().take_local() {
                return std::task::Poll::Ready(Ok(Event::Local(l)));
            }
            if std::mem::take(&mut replayed) {
                return std::task::Poll::Ready(Ok(Event::Read(buf.len())));
            }
            let read = std::pin::pin!(server.read_buf(&mut *buf)).poll(cx);
            if read.is_pending() {
                // Nothing to relay, and nothing unread in the socket either (TLS may have taken
                // records that held no message): the other direction need not wait for us.
                shared.server_read.notify_one();
            }
            read.map(|r| r.map(Event::Read))
        })
        .await;
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                // A reset, or PostgreSQL's TLS refusing us (a client certificate it does not
                // take is said after the handshake): the client learns why.
                let why = tlsconf::client_handshake_error(&e);
                tracing::warn!(error = %why, "the connection to PostgreSQL failed");
                opskit::fence::get()
                    .upstream_error(opskit::fence::Mode::Pg, opskit::fence::UpstreamError::Lost);
                if !framer.mid_message() {
                    let mut out = Vec::new();
                    sqlstate::fatal(
                        &mut out,
                        sqlstate::CONNECTION_FAILURE,
                        &format!("fence-proxy: the connection to PostgreSQL failed: {why}"),
                    );
                    let _ = client.write_all(&out).await;
                }
                let _ = client.shutdown().await;
                return Err(e);
            }
        };
        match event {
            Event::Local(Local::Fatal(bytes)) => {
                if !framer.mid_message() {
                    let _ = client.write_all(&bytes).await;
                }
                let _ = client.shutdown().await;
                return Ok(());
            }
            Event::Read(0) => {
                shared.server_read.notify_one();
                let held = shared.machine().held_error();
                if let Some(bytes) = held {
                    let spoke = tokio::time::timeout(
                        relay.config.fenced_hold,
                        shared.client_spoke.notified(),
                    )
                    .await;
                    if spoke.is_ok() {
                        let _ = client.write_all(&bytes).await;
                    }
                }
                let _ = client.shutdown().await;
                return Ok(());
            }
            Event::Read(_) => {
                let wake = {
                    let mut m = shared.machine();
                    relay_server_messages(marks, &mut m, framer, buf, &mut out, &mut cancel)?;
                    if !m.events.is_empty() {
                        crate::tally::record(&mut m.events, who);
                    }
                    m.wants_progress()
                };
                if !out.is_empty() {
                    client.write_all(&out).await?;
                    out.clear();
                }
                if wake {
                    shared.progress.notify_one();
                }
                shared.server_read.notify_one();
            }
        }
    }
}

/// Passes the whole server messages in `buf` through the machine into `out`.
fn relay_server_messages(
    marks: &Marks,
    m: &mut Machine,
    framer: &mut Framer,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    cancel: &mut CancelKey<'_>,
) -> std::io::Result<()> {
    let relay = cancel.relay;
    loop {
        // DataRow and CopyData are streamed, unless they answer a check of ours.
        let next = framer
            .next(buf, out, SERVER_MESSAGE_MAX, |tag| {
                Backend::may_stream(tag) && !m.next_is_hidden()
            })
            .map_err(|e| std::io::Error::other(format!("PostgreSQL sent {e}")))?;
        let Some((_, message)) = next else {
            return Ok(());
        };
        // Only a BackendKeyData is decoded here (the machine decodes the rest once).
        if message.first() == Some(&b'K')
            && let Ok(Backend::BackendKeyData { pid, key }) = Backend::decode(&message)
        {
            // The client gets a key of ours; its CancelRequest is forwarded with the real one.
            let (ours, our_key) = relay.register_cancel(pid, key, cancel.gate.clone());
            if let Some(old) = cancel.pid.replace(ours) {
                relay.unregister_cancel(old);
            }
            pg_wire::msg::backend_key_data(out, ours, &our_key);
            continue;
        }
        match m.server(&message, marks) {
            Verdict::Forward => out.extend_from_slice(&message),
            Verdict::Hide => {}
            Verdict::Replace(bytes) => out.extend_from_slice(&bytes),
            Verdict::Hold(bytes) => m.hold(bytes),
        }
    }
}
