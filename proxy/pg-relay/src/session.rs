//! One client session: start-up, then two directions relayed concurrently (client to server and
//! server to client), sharing a small [`Flow`] state under a mutex.
//!
//! The client-to-server direction decides where the fence check goes. It pushes one
//! [`Expect`] per message that the server answers, in order, so that the server-to-client
//! direction can tell the replies to injected messages (hidden, but read for the check's result)
//! from the client's own (forwarded). A session whose text never mentions `fencing` has nothing
//! injected and everything forwarded.
//!
//! Where the check goes (only while the session may have a token):
//! - simple Query: before the first statement that may read or write data, and again before the
//!   next such statement after one that may end the transaction or change the settings;
//! - extended protocol: before the first Bind or Execute of a batch (up to Sync) that may run
//!   such a statement, and again after an Execute of a statement that may end the transaction
//!   or change the settings.
//!
//! Because the status after a batch is only known when its ReadyForQuery comes back, every new
//! batch is checked again unless the session is known to be idle inside a transaction that has
//! already been checked with the same settings.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use compact_str::CompactString;
use pg_wire::msg::{self, ErrorResponse};
use pg_wire::sql::{self, Class};
use pg_wire::{Header, Startup, WireError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::{Relay, sqlstate};

/// The prepared statements that hold the check on each server connection: the general check,
/// and the two halves of the fast path (see `schema.rs`).
const CHECK_STATEMENTS: [(&[u8], &[u8], &[u32]); 3] = [
    (b"__fence_proxy_check", crate::schema::CHECK_FULL, &[23]),
    (b"__fence_proxy_lock", crate::schema::CHECK_LOCK, &[]),
    (b"__fence_proxy_fast", crate::schema::CHECK_FAST, &[23]),
];
const FULL: usize = 0;
const LOCK: usize = 1;
const FAST: usize = 2;
/// Messages larger than this are streamed rather than held whole, where they may be (CopyData
/// from either side, DataRow from the server).
const STREAM_ABOVE: usize = 256 << 10;
/// How long a client may still write after its server connection ended (see `session`).
const DRAIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Largest server message held whole (everything but DataRow and CopyData is small).
const SERVER_MESSAGE_MAX: usize = 64 << 20;

pub(crate) async fn run(relay: Arc<Relay>, mut client: TcpStream, peer: SocketAddr) {
    let _ = client.set_nodelay(true);
    let open = relay.connections.fetch_add(1, Ordering::AcqRel) + 1;
    let _count = Decrement(&relay);
    if open > relay.config.connections_max {
        tracing::warn!(%peer, max = relay.config.connections_max, "refusing a connection: too many");
        let mut out = Vec::new();
        msg::error_response(
            &mut out,
            &ErrorResponse {
                severity: "FATAL",
                code: sqlstate::TOO_MANY_CONNECTIONS,
                message: &format!(
                    "fence-proxy: too many connections (connections_max = {})",
                    relay.config.connections_max
                ),
                detail: None,
                hint: None,
            },
        );
        let _ = client.write_all(&out).await;
        return;
    }
    match session(&relay, client, peer).await {
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
async fn fatal(client: &mut TcpStream, code: &str, message: String) -> std::io::Result<()> {
    let mut out = Vec::new();
    msg::error_response(
        &mut out,
        &ErrorResponse {
            severity: "FATAL",
            code,
            message: &message,
            detail: None,
            hint: None,
        },
    );
    let _ = client.write_all(&out).await;
    Err(std::io::Error::other(message))
}

async fn session(relay: &Relay, mut client: TcpStream, peer: SocketAddr) -> std::io::Result<()> {
    let max = relay.config.message_max_bytes;
    let mut buf = BytesMut::with_capacity(8 << 10);
    // Start-up: SSLRequest / GSSENCRequest are refused with 'N' (the client may go on in clear
    // text), a CancelRequest is forwarded, a StartupMessage opens the session.
    let startup = tokio::time::timeout(relay.config.startup_timeout, async {
        loop {
            let len = loop {
                match pg_wire::startup_len(&buf, max.min(64 << 10)) {
                    Ok(Some(len)) => break len,
                    Ok(None) => {
                        if client.read_buf(&mut buf).await? == 0 {
                            return Ok(None);
                        }
                    }
                    Err(e) => return Ok(Some(Err(e))),
                }
            };
            let packet = buf.split_to(len);
            match pg_wire::parse_startup(&packet) {
                Ok(Startup::Ssl | Startup::GssEnc) => client.write_all(b"N").await?,
                Ok(Startup::Cancel { pid, key }) => {
                    relay.cancel(pid, key).await;
                    return Ok(None);
                }
                Ok(Startup::Params { params, .. }) => {
                    let fenced = params.iter().any(|(_, v)| sql::mentions_fencing(v));
                    return Ok(Some(Ok((packet, fenced))));
                }
                Err(e) => return Ok(Some(Err(e))),
            }
        }
    })
    .await;
    let (packet, fenced) = match startup {
        Err(_) => return Err(std::io::Error::other("no start-up packet in time")),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(None)) => return Ok(()),
        Ok(Ok(Some(Err(e)))) => {
            let code = match e {
                WireError::UnsupportedVersion { .. } => sqlstate::FEATURE_NOT_SUPPORTED,
                _ => sqlstate::PROTOCOL_VIOLATION,
            };
            return fatal(
                &mut client,
                code,
                format!("fence-proxy: bad start-up packet: {e}"),
            )
            .await;
        }
        Ok(Ok(Some(Ok(p)))) => p,
    };

    let upstream = tokio::time::timeout(
        relay.config.connect_timeout,
        TcpStream::connect(&relay.config.upstream),
    )
    .await;
    let mut upstream = match upstream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(upstream = %relay.config.upstream, error = %e, "cannot reach PostgreSQL");
            return fatal(
                &mut client,
                sqlstate::CANNOT_CONNECT,
                format!(
                    "fence-proxy: cannot connect to PostgreSQL at {}: {e}",
                    relay.config.upstream
                ),
            )
            .await;
        }
        Err(_) => {
            return fatal(
                &mut client,
                sqlstate::CANNOT_CONNECT,
                format!(
                    "fence-proxy: connecting to PostgreSQL at {} timed out",
                    relay.config.upstream
                ),
            )
            .await;
        }
    };
    let _ = upstream.set_nodelay(true);
    upstream.write_all(&packet).await?;
    tracing::debug!(%peer, fenced, "session started");

    // Both directions run in this task (never at once); the mutex only satisfies Send.
    let flow = Mutex::new(Flow {
        fenced,
        ..Flow::default()
    });
    let (client_r, client_w) = client.into_split();
    let (upstream_r, upstream_w) = upstream.into_split();
    let mut to_server = ToServer {
        relay,
        flow: &flow,
        need_check: true,
        rejecting: false,
        batch_start: true,
        batch_settings: false,
        statements: HashMap::new(),
        unnamed_statement: Class::default(),
        portals: HashMap::new(),
        unnamed_portal: Class::default(),
    };
    let to_client = ToClient {
        relay,
        flow: &flow,
        cancel_pid: None,
        check_row: None,
    };
    let c2s = to_server.pump(client_r, upstream_w, buf);
    let s2c = to_client.pump(upstream_r, client_w);
    tokio::pin!(c2s, s2c);
    // Polled in this order, the client-to-server direction first: what it queues for the
    // client (Flow::local) is then usually written in the same wake-up.
    let result = tokio::select! {
        biased;
        r = &mut c2s => {
            // The client is gone or said Terminate: the server closes once it has read the
            // end, and its last words still reach the client.
            match tokio::time::timeout(relay.config.connect_timeout, &mut s2c).await {
                Ok(r2) => r.and(r2),
                Err(_) => r,
            }
        }
        r = &mut s2c => {
            // PostgreSQL is gone; its last words (a FATAL) went to the client. Keep taking what
            // the client still sends for a moment: closing at once would answer its next write
            // with a reset, which can make it drop that message unread (a paused client that
            // wakes up sends before it reads).
            let _ = tokio::time::timeout(DRAIN, &mut c2s).await;
            r
        }
    };
    result
}

/// What the server will answer next, in order.
#[derive(Debug)]
enum Expect {
    Parse {
        injected: bool,
    },
    Bind {
        injected: bool,
    },
    /// `check` is the settings generation the check was sent under, for an injected Execute.
    Execute {
        check: Option<u64>,
    },
    /// The injected Execute of the fast path's lock statement: its replies are hidden.
    Lock,
    Describe,
    /// `injected`: the relay's own Close, before it prepares its statements again.
    Close {
        injected: bool,
    },
    /// `settings`: the batch it closes holds a statement that may change the settings.
    /// `injected`: the relay's own Sync after a simple Query that followed the check's
    /// extended-protocol messages (its ReadyForQuery is hidden, unless the check failed and
    /// PostgreSQL skipped the Query: then it is the Query's).
    Sync {
        settings: bool,
        injected: bool,
    },
    /// A simple Query (or FunctionCall): its statements, run-length encoded. `after_check`: it
    /// was sent right after the check's extended-protocol messages, before an injected Sync.
    Query {
        units: VecDeque<Unit>,
        settings: bool,
        after_check: bool,
    },
}

impl Flow {
    /// Whether what the check of the batch being answered found can be remembered for the
    /// session: only when the batch began outside a transaction and changed no setting, so that
    /// no rollback can undo the settings it ran with.
    fn settled(&self) -> bool {
        self.status == b'I'
            && self
                .expect
                .iter()
                .find_map(|e| match e {
                    Expect::Sync { settings, .. } | Expect::Query { settings, .. } => {
                        Some(!settings)
                    }
                    _ => None,
                })
                .unwrap_or(false)
    }
}

impl Expect {
    /// A simple Query (or FunctionCall) relayed as it is: every reply is the client's.
    fn relayed(settings: bool) -> Expect {
        Expect::relayed_after(settings, false)
    }

    /// Like [`Expect::relayed`]; `after_check`: sent right after the check's messages.
    fn relayed_after(settings: bool, after_check: bool) -> Expect {
        Expect::Query {
            units: VecDeque::from([Unit {
                check: None,
                count: u32::MAX,
            }]),
            settings,
            after_check,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Unit {
    /// Settings generation, for the injected check.
    check: Option<u64>,
    /// Statements in this run (`u32::MAX`: all the rest).
    count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Prepared {
    #[default]
    No,
    Pending,
    Yes,
}

/// What the session knows about itself, shared by both directions.
#[derive(Default)]
struct Flow {
    expect: VecDeque<Expect>,
    /// Transaction status of the last ReadyForQuery.
    status: u8,
    /// The session may have a token: its start-up options or some statement mentioned `fencing`.
    /// Cleared when a check finds no token (and nothing has mentioned `fencing` since).
    fenced: bool,
    /// Bumped whenever a statement may have changed the fencing settings.
    generation: u64,
    prepared: Prepared,
    /// The resource and token of the last check and the generation it ran under.
    last: Option<(CompactString, i64, u64)>,
    /// Like `last`, but also after checks inside a transaction whose settings a rollback might
    /// undo: only a hint for the check (which verifies it), never a reason to refuse.
    passed: Option<(CompactString, i64, u64)>,
    /// The open transaction passed a check under this generation, with this resource and token.
    checked_txn: Option<(u64, CompactString, i64)>,
    /// What the client-to-server direction answers by itself, for the other direction to write
    /// to the client (in order, before anything PostgreSQL sends after it).
    local: VecDeque<Local>,
}

impl Flow {
    /// Notes a statement that may change the settings or drop our prepared check.
    fn note(&mut self, class: Class) {
        if class.settings {
            self.generation += 1;
        }
        if class.fencing {
            self.fenced = true;
        }
        if class.drops_statements {
            self.prepared = Prepared::No;
        }
    }

    fn idle(&self) -> bool {
        self.expect.is_empty()
    }

    /// The next DataRow (or CommandComplete) answers an injected check.
    fn next_is_hidden(&self) -> bool {
        match self.expect.front() {
            Some(Expect::Execute { check: Some(_) } | Expect::Lock) => true,
            Some(Expect::Query { units, .. }) => units.front().is_some_and(|u| u.check.is_some()),
            _ => false,
        }
    }

    /// Whether a check under `generation` may take the common path: a check with these same
    /// settings passed, and the cache's mark for the resource is still that token.
    fn known_current(&self, relay: &Relay, generation: u64) -> bool {
        self.passed
            .as_ref()
            .is_some_and(|(r, t, g)| *g == generation && relay.mark(r) == Some(*t))
    }

    /// A token the cache knows to be stale for the current settings: (resource, token, highest).
    fn known_stale(&self, relay: &Relay) -> Option<(CompactString, i64, i64)> {
        let (r, t, g) = self.last.as_ref()?;
        if *g != self.generation {
            return None;
        }
        let highest = relay.mark(r)?;
        (highest > *t).then(|| (r.clone(), *t, highest))
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

/// Client to server.
struct ToServer<'a> {
    relay: &'a Relay,
    flow: &'a Mutex<Flow>,
    need_check: bool,
    /// Dropping client messages up to Sync (a batch refused from the cache).
    rejecting: bool,
    batch_start: bool,
    /// The batch being sent holds a statement that may change the settings.
    batch_settings: bool,
    statements: HashMap<Vec<u8>, Class>,
    unnamed_statement: Class,
    portals: HashMap<Vec<u8>, Class>,
    unnamed_portal: Class,
}

/// What the server-to-client direction woke up for.
enum Event {
    Local(Local),
    /// Bytes read from PostgreSQL (0: it closed the connection).
    Read(usize),
}

/// Something the client-to-server direction wants written to the client.
enum Local {
    Reply(Vec<u8>),
    Fatal(Vec<u8>),
}

/// The class of a statement the relay never saw parsed: assume the worst.
const UNKNOWN: Class = Class {
    needs_check: true,
    recheck_after: true,
    drops_statements: false,
    settings: true,
    fencing: false,
    pipelinable: false,
};

impl ToServer<'_> {
    async fn pump(
        &mut self,
        mut client: OwnedReadHalf,
        mut server: OwnedWriteHalf,
        mut buf: BytesMut,
    ) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(16 << 10);
        let mut framer = Framer::default();
        let max = self.relay.config.message_max_bytes;
        loop {
            // What is in the buffer first (the start-up may have left whole messages in it).
            let mut terminate = false;
            let queued_local = {
                let mut flow = self.flow.lock().expect("flow lock");
                // CopyData is streamed as it comes.
                while let Some((head, message)) = framer
                    .next(&mut buf, &mut out, max, |tag| tag == b'd')
                    .map_err(|e| refuse(&mut flow, &describe(e)))?
                {
                    match self.on_message(&mut flow, head, &message, &mut out) {
                        Ok(true) => {}
                        Ok(false) => {
                            terminate = true;
                            break;
                        }
                        Err(e) => return Err(refuse(&mut flow, &e.to_string())),
                    }
                }
                !flow.local.is_empty()
            };
            if queued_local {
                // The other direction writes it; make sure it is polled again even if it was
                // polled before this one in this wake-up.
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
            if terminate {
                let _ = server.shutdown().await;
                return Ok(());
            }
            buf.reserve(16 << 10);
            if client.read_buf(&mut buf).await? == 0 {
                let _ = server.shutdown().await;
                return Ok(());
            }
        }
    }

    /// Handles one whole client message; `Ok(false)` after Terminate.
    fn on_message(
        &mut self,
        flow: &mut Flow,
        head: Header,
        message: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        let starts_batch = std::mem::replace(&mut self.batch_start, false);
        if self.rejecting {
            if head.tag == b'S' {
                self.rejecting = false;
                self.batch_start = true;
                self.need_check = true;
            }
            return Ok(head.tag != b'X');
        }
        // A batch inside a transaction that already passed a check under these same settings
        // needs none: that transaction holds the resource's lock shared until it ends (a raise
        // waits for it, or ends it).
        let checked_already = starts_batch
            && flow.idle()
            && flow.status == b'T'
            && flow
                .checked_txn
                .as_ref()
                .is_some_and(|c| c.0 == flow.generation);
        if checked_already {
            self.need_check = false;
        }
        match head.tag {
            b'Q' => {
                let text = msg::query_text(message)?;
                self.need_check = self.need_check || (starts_batch && !checked_already);
                self.on_query(flow, message, text, starts_batch, out);
                self.batch_start = true;
                self.need_check = true;
            }
            b'P' => {
                let (name, text) = msg::parse_parts(message)?;
                let class = sql::classify(text);
                flow.note(class);
                self.batch_settings |= class.settings;
                if name.is_empty() {
                    self.unnamed_statement = class;
                } else {
                    self.statements.insert(name.to_vec(), class);
                }
                flow.expect.push_back(Expect::Parse { injected: false });
                out.extend_from_slice(message);
            }
            b'B' => {
                let (portal, statement) = msg::bind_names(message)?;
                let class = if statement.is_empty() {
                    self.unnamed_statement
                } else {
                    self.statements.get(statement).copied().unwrap_or(UNKNOWN)
                };
                if self.check_before(flow, class, starts_batch, out) {
                    return Ok(true);
                }
                if portal.is_empty() {
                    self.unnamed_portal = class;
                } else {
                    self.portals.insert(portal.to_vec(), class);
                }
                flow.expect.push_back(Expect::Bind { injected: false });
                out.extend_from_slice(message);
            }
            b'E' => {
                let portal = msg::execute_portal(message)?;
                let class = if portal.is_empty() {
                    self.unnamed_portal
                } else {
                    self.portals.get(portal).copied().unwrap_or(UNKNOWN)
                };
                if self.check_before(flow, class, starts_batch, out) {
                    return Ok(true);
                }
                flow.expect.push_back(Expect::Execute { check: None });
                out.extend_from_slice(message);
                if class.recheck_after {
                    self.need_check = true;
                }
            }
            b'D' => {
                msg::target(message, "Describe")?;
                flow.expect.push_back(Expect::Describe);
                out.extend_from_slice(message);
            }
            b'C' => {
                let (kind, name) = msg::target(message, "Close")?;
                match (kind, name.is_empty()) {
                    (b'S', false) => {
                        self.statements.remove(name);
                    }
                    (b'P', false) => {
                        self.portals.remove(name);
                    }
                    _ => {}
                }
                flow.expect.push_back(Expect::Close { injected: false });
                out.extend_from_slice(message);
            }
            b'S' => {
                flow.expect.push_back(Expect::Sync {
                    settings: std::mem::take(&mut self.batch_settings),
                    injected: false,
                });
                out.extend_from_slice(message);
                self.batch_start = true;
                self.need_check = true;
            }
            b'F' => {
                // FunctionCall: answered like a simple Query, never checked (see docs).
                flow.expect.push_back(Expect::relayed(true));
                out.extend_from_slice(message);
                self.batch_start = true;
                self.need_check = true;
            }
            b'X' => {
                out.extend_from_slice(message);
                return Ok(false);
            }
            _ => {
                // Flush, CopyData/CopyDone/CopyFail, password and SASL messages, and anything
                // else: PostgreSQL judges them.
                self.batch_start = starts_batch;
                out.extend_from_slice(message);
            }
        }
        Ok(true)
    }

    /// Before a Bind or an Execute of a statement of `class`: refuses the batch from the cache
    /// (true: drop this message), or injects the check, when the statement needs one.
    fn check_before(
        &mut self,
        flow: &mut Flow,
        class: Class,
        starts_batch: bool,
        out: &mut Vec<u8>,
    ) -> bool {
        if !class.needs_check {
            return false;
        }
        if self.reject_from_cache(flow, starts_batch) {
            return true;
        }
        self.inject_extended(flow, out);
        false
    }

    /// At the first message of a batch, with nothing in flight: when the cache already knows
    /// the session's token is stale, refuse the batch here (its messages are dropped up to Sync,
    /// which is answered with the error), saving the round trip.
    fn reject_from_cache(&mut self, flow: &mut Flow, starts_batch: bool) -> bool {
        if !(starts_batch && flow.fenced && flow.idle() && flow.status == b'I') {
            return false;
        }
        let Some((resource, token, highest)) = flow.known_stale(self.relay) else {
            return false;
        };
        self.rejecting = true;
        let mut reply = Vec::new();
        stale_error(&mut reply, &resource, token, highest);
        msg::ready_for_query(&mut reply, b'I');
        flow.local.push_back(Local::Reply(reply));
        true
    }

    fn inject_extended(&mut self, flow: &mut Flow, out: &mut Vec<u8>) {
        if !(self.need_check && flow.fenced) {
            return;
        }
        self.need_check = false;
        self.push_check(flow, flow.generation, out);
    }

    /// The check in extended-protocol messages (prepared on first use): the fast path when the
    /// proxy believes the token is the mark, else the general check. Its replies are hidden.
    fn push_check(&self, flow: &mut Flow, generation: u64, out: &mut Vec<u8>) {
        if flow.prepared == Prepared::No {
            for (name, text, types) in CHECK_STATEMENTS {
                // Closing first: an earlier attempt may have prepared some of them (or a
                // DEALLOCATE dropped only some); closing a missing statement is no error.
                msg::close(out, b'S', name);
                flow.expect.push_back(Expect::Close { injected: true });
                msg::parse(out, name, text, types);
                flow.expect.push_back(Expect::Parse { injected: true });
            }
            flow.prepared = Prepared::Pending;
        }
        let current = flow.known_current(self.relay, generation);
        let wait = [self.relay.wait_param.as_bytes()];
        let mut execute = |statement: usize, params: &[&[u8]], expect: Expect| {
            msg::bind(out, b"", CHECK_STATEMENTS[statement].0, params);
            msg::execute(out, b"", 0);
            flow.expect.push_back(Expect::Bind { injected: true });
            flow.expect.push_back(expect);
        };
        let check = Expect::Execute {
            check: Some(generation),
        };
        if current {
            execute(LOCK, &[], Expect::Lock);
            execute(FAST, &wait, check);
        } else {
            execute(FULL, &wait, check);
        }
    }

    fn on_query(
        &mut self,
        flow: &mut Flow,
        message: &[u8],
        text: &[u8],
        starts_batch: bool,
        out: &mut Vec<u8>,
    ) {
        if !flow.fenced && flow.prepared == Prepared::No && !sql::mentions_fencing(text) {
            // No token and none to come from this text, and no prepared check for a DISCARD to
            // drop: nothing to inject or to note, so the text is not even split.
            flow.expect.push_back(Expect::relayed(true));
            out.extend_from_slice(message);
            return;
        }
        let statements = sql::split(text).unwrap_or_else(|| {
            // Not splittable: one statement as far as the relay is concerned.
            vec![sql::Statement {
                start: 0,
                end: text.len(),
                class: sql::classify(text),
            }]
        });
        // Where checks go (before statement i, under settings generation g).
        let generation_before = flow.generation;
        let settings = statements.iter().any(|s| s.class.settings);
        let mut checks: Vec<(usize, u64)> = Vec::new();
        let mut need = self.need_check;
        for (i, s) in statements.iter().enumerate() {
            if need && s.class.needs_check && flow.fenced {
                checks.push((i, flow.generation));
                need = false;
            }
            if s.class.recheck_after {
                need = true;
            }
            flow.note(s.class);
        }
        if checks.is_empty() {
            flow.expect.push_back(Expect::relayed(settings));
            out.extend_from_slice(message);
            return;
        }
        if checks[0] == (0, generation_before)
            && flow.generation == generation_before
            && flow.idle()
            && flow.status == b'I'
            && let Some((resource, token, highest)) = flow.known_stale(self.relay)
        {
            // Known stale, nothing in flight: answer here, as PostgreSQL would.
            let mut reply = Vec::new();
            stale_error(&mut reply, &resource, token, highest);
            msg::ready_for_query(&mut reply, b'I');
            flow.local.push_back(Local::Reply(reply));
            return;
        }
        if checks.len() == 1
            && checks[0].0 == 0
            && starts_batch
            && statements.iter().all(|s| s.class.pipelinable)
        {
            // The common case: one check, before everything. It goes as prepared statements
            // in extended-protocol messages ahead of the Query (PostgreSQL runs them in the
            // Query's transaction, without parsing or planning them again), and a Sync after
            // it ends what they began. Only for statements that read or write rows: a COPY
            // FROM STDIN would swallow the Sync.
            self.push_check(flow, checks[0].1, out);
            flow.expect.push_back(Expect::relayed_after(settings, true));
            out.extend_from_slice(message);
            msg::sync(out);
            flow.expect.push_back(Expect::Sync {
                settings,
                injected: true,
            });
            return;
        }
        let check = |current: bool| {
            format!(
                "SELECT * FROM fencing.check({}, {current}); ",
                self.relay.wait_param
            )
        };
        let mut new_text = Vec::with_capacity(text.len() + checks.len() * 64);
        let mut units = VecDeque::new();
        let mut copied = 0;
        let mut done = 0usize;
        for &(i, generation) in &checks {
            let start = statements[i].start;
            new_text.extend_from_slice(&text[copied..start]);
            copied = start;
            if i > done {
                units.push_back(Unit {
                    check: None,
                    count: (i - done) as u32,
                });
            }
            done = i;
            new_text
                .extend_from_slice(check(flow.known_current(self.relay, generation)).as_bytes());
            units.push_back(Unit {
                check: Some(generation),
                count: 1,
            });
        }
        new_text.extend_from_slice(&text[copied..]);
        units.push_back(Unit {
            check: None,
            count: u32::MAX,
        });
        flow.expect.push_back(Expect::Query {
            units,
            settings,
            after_check: false,
        });
        msg::query(out, &new_text);
    }
}

/// Closes the session over a malformed or oversized message, telling the client why.
fn refuse(flow: &mut Flow, why: &str) -> std::io::Error {
    tracing::info!(
        reason = why,
        "closing a client connection over a bad message"
    );
    let mut out = Vec::new();
    msg::error_response(
        &mut out,
        &ErrorResponse {
            severity: "FATAL",
            code: sqlstate::PROTOCOL_VIOLATION,
            message: &format!("fence-proxy: {why}"),
            detail: None,
            hint: None,
        },
    );
    flow.local.push_back(Local::Fatal(out));
    std::io::Error::other(why.to_string())
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

fn stale_error(out: &mut Vec<u8>, resource: &str, token: i64, highest: i64) {
    msg::error_response(
        out,
        &ErrorResponse {
            severity: "ERROR",
            code: sqlstate::STALE_TOKEN,
            message: &format!(
                "fencing token {token} for resource '{resource}' is stale: the highest accepted token is {highest}"
            ),
            detail: Some(&format!(
                "resource: {resource}, presented token: {token}, highest accepted token: {highest}"
            )),
            hint: Some("this client no longer holds the lock; acquire it again for a new token"),
        },
    );
}

/// Server to client.
struct ToClient<'a> {
    relay: &'a Relay,
    flow: &'a Mutex<Flow>,
    cancel_pid: Option<i32>,
    /// The row of the check being answered.
    check_row: Option<(CompactString, i64)>,
}

/// What to do with one server message.
enum Verdict {
    Forward,
    Hide,
    Replace(Vec<u8>),
}

impl Drop for ToClient<'_> {
    fn drop(&mut self) {
        if let Some(pid) = self.cancel_pid {
            self.relay.unregister_cancel(pid);
        }
    }
}

impl ToClient<'_> {
    async fn pump(
        mut self,
        mut server: OwnedReadHalf,
        mut client: OwnedWriteHalf,
    ) -> std::io::Result<()> {
        let mut buf = BytesMut::with_capacity(32 << 10);
        let mut out = Vec::with_capacity(32 << 10);
        let mut framer = Framer::default();
        loop {
            // What the other direction queued for the client comes first; otherwise what
            // PostgreSQL sends.
            let event = std::future::poll_fn(|cx| {
                if let Some(l) = self.flow.lock().expect("flow lock").local.pop_front() {
                    return std::task::Poll::Ready(Ok(Event::Local(l)));
                }
                std::pin::pin!(server.read_buf(&mut buf))
                    .poll(cx)
                    .map(|r| r.map(Event::Read))
            })
            .await?;
            match event {
                Event::Local(Local::Reply(bytes)) => client.write_all(&bytes).await?,
                Event::Local(Local::Fatal(bytes)) => {
                    if !framer.mid_message() {
                        let _ = client.write_all(&bytes).await;
                    }
                    let _ = client.shutdown().await;
                    return Ok(());
                }
                Event::Read(n) => {
                    if n == 0 {
                        let _ = client.shutdown().await;
                        return Ok(());
                    }
                    {
                        let mut flow = self.flow.lock().expect("flow lock");
                        // DataRow and CopyData are streamed, unless they answer the check.
                        while let Some((head, message)) = framer
                            .next(&mut buf, &mut out, SERVER_MESSAGE_MAX, |tag| {
                                matches!(tag, b'D' | b'd') && !flow.next_is_hidden()
                            })
                            .map_err(|e| std::io::Error::other(format!("PostgreSQL sent {e}")))?
                        {
                            match self.on_message(&mut flow, head, &message) {
                                Verdict::Forward => out.extend_from_slice(&message),
                                Verdict::Hide => {}
                                Verdict::Replace(bytes) => out.extend_from_slice(&bytes),
                            }
                        }
                    }
                    if !out.is_empty() {
                        client.write_all(&out).await?;
                        out.clear();
                    }
                }
            }
        }
    }

    fn on_message(&mut self, flow: &mut Flow, head: Header, message: &[u8]) -> Verdict {
        match head.tag {
            b'1' => match flow.expect.pop_front() {
                Some(Expect::Parse { injected: true }) => {
                    if flow.prepared == Prepared::Pending {
                        flow.prepared = Prepared::Yes;
                    }
                    Verdict::Hide
                }
                _ => Verdict::Forward,
            },
            b'2' => match flow.expect.pop_front() {
                Some(Expect::Bind { injected: true }) => Verdict::Hide,
                _ => Verdict::Forward,
            },
            b'3' => match flow.expect.pop_front() {
                Some(Expect::Close { injected: true }) => Verdict::Hide,
                _ => Verdict::Forward,
            },
            b'n' => {
                if matches!(flow.expect.front(), Some(Expect::Describe)) {
                    flow.expect.pop_front();
                }
                Verdict::Forward
            }
            b'T' => match flow.expect.front_mut() {
                Some(Expect::Describe) => {
                    flow.expect.pop_front();
                    Verdict::Forward
                }
                Some(Expect::Query { units, .. })
                    if units.front().is_some_and(|u| u.check.is_some()) =>
                {
                    Verdict::Hide
                }
                _ => Verdict::Forward,
            },
            b'D' => {
                if !flow.next_is_hidden() {
                    return Verdict::Forward;
                }
                if matches!(flow.expect.front(), Some(Expect::Lock)) {
                    return Verdict::Hide;
                }
                if let Ok(cols) = msg::data_row(message)
                    && let [Some(r), Some(t)] = cols[..]
                    && let (Ok(r), Some(t)) = (
                        std::str::from_utf8(r),
                        std::str::from_utf8(t)
                            .ok()
                            .and_then(|t| t.parse::<i64>().ok()),
                    )
                    && fencing::ResourceName::validate(r).is_ok()
                    && u64::try_from(t)
                        .ok()
                        .and_then(fencing::FencingToken::new)
                        .is_some()
                {
                    self.check_row = Some((r.into(), t));
                }
                Verdict::Hide
            }
            b'C' | b'I' | b's' => {
                if matches!(flow.expect.front(), Some(Expect::Lock)) {
                    flow.expect.pop_front();
                    return Verdict::Hide;
                }
                let check = match flow.expect.front_mut() {
                    Some(Expect::Execute { check }) => {
                        let c = *check;
                        flow.expect.pop_front();
                        c
                    }
                    Some(Expect::Query { units, .. }) => match units.front_mut() {
                        Some(u) => {
                            let c = u.check;
                            if u.count != u32::MAX {
                                u.count -= 1;
                                if u.count == 0 {
                                    units.pop_front();
                                }
                            }
                            c
                        }
                        None => None,
                    },
                    _ => None,
                };
                match check {
                    None => Verdict::Forward,
                    Some(generation) => {
                        self.check_done(flow, generation);
                        Verdict::Hide
                    }
                }
            }
            b'E' => self.on_error(flow, message),
            b'Z' => {
                let mut hide = false;
                while let Some(e) = flow.expect.pop_front() {
                    match e {
                        Expect::Sync { injected, .. } => {
                            hide = injected;
                            break;
                        }
                        Expect::Query { .. } => break,
                        _ => {}
                    }
                }
                if let Ok(s) = msg::ready_status(message) {
                    flow.status = s;
                    if s != b'T' {
                        flow.checked_txn = None;
                    }
                }
                if hide {
                    Verdict::Hide
                } else {
                    Verdict::Forward
                }
            }
            b'K' => match msg::backend_key(message) {
                Ok((pid, key)) => {
                    let (ours, our_key) = self.relay.register_cancel(pid, key);
                    if let Some(old) = self.cancel_pid.replace(ours) {
                        self.relay.unregister_cancel(old);
                    }
                    let mut out = Vec::new();
                    msg::backend_key_data(&mut out, ours, &our_key);
                    Verdict::Replace(out)
                }
                Err(_) => Verdict::Forward,
            },
            _ => Verdict::Forward,
        }
    }

    /// The injected check has answered without an error.
    fn check_done(&mut self, flow: &mut Flow, generation: u64) {
        match self.check_row.take() {
            Some((resource, token)) => {
                self.relay.raise_mark(&resource, token);
                flow.last = flow
                    .settled()
                    .then(|| (resource.clone(), token, generation));
                flow.passed = Some((resource.clone(), token, generation));
                flow.checked_txn = Some((generation, resource, token));
            }
            None => {
                // No token in the session's settings.
                if generation == flow.generation {
                    flow.fenced = false;
                }
                flow.last = None;
                flow.passed = None;
            }
        }
    }

    fn on_error(&mut self, flow: &mut Flow, message: &[u8]) -> Verdict {
        let from_check = match flow.expect.front_mut() {
            Some(Expect::Parse { injected: true }) => {
                flow.prepared = Prepared::No;
                true
            }
            Some(
                Expect::Bind { injected: true }
                | Expect::Execute { check: Some(_) }
                | Expect::Lock
                | Expect::Close { injected: true },
            ) => true,
            Some(Expect::Query { units, .. }) => {
                let c = units.front().is_some_and(|u| u.check.is_some());
                units.clear();
                c
            }
            _ => false,
        };
        let settled = flow.settled();
        // The server skips everything up to the next Sync.
        while matches!(
            flow.expect.front(),
            Some(
                Expect::Parse { .. }
                    | Expect::Bind { .. }
                    | Expect::Execute { .. }
                    | Expect::Lock
                    | Expect::Describe
                    | Expect::Close { .. }
            )
        ) {
            flow.expect.pop_front();
        }
        // A simple Query sent after the check's messages is skipped with them: the injected
        // Sync's ReadyForQuery is then the Query's.
        if from_check
            && matches!(
                flow.expect.front(),
                Some(Expect::Query {
                    after_check: true,
                    ..
                })
            )
        {
            flow.expect.pop_front();
            if let Some(Expect::Sync { injected, .. }) = flow.expect.front_mut() {
                *injected = false;
            }
        }
        self.check_row = None;
        let Ok(fields) = msg::error_fields(message) else {
            return Verdict::Forward;
        };
        if from_check {
            if fields.code == sqlstate::STALE_TOKEN.as_bytes()
                && let Some((resource, token, highest)) = parse_stale_detail(fields.detail)
            {
                self.relay.raise_mark(resource, highest);
                // Remembered only if no rollback can undo the settings it was checked with.
                flow.last = settled.then(|| (resource.into(), token, flow.generation));
            }
            if fields.code == b"42883" || fields.code == b"3F000" {
                let mut out = Vec::new();
                msg::error_response(
                    &mut out,
                    &ErrorResponse {
                        severity: "ERROR",
                        code: sqlstate::NOT_INSTALLED,
                        message: "fence-proxy: the fence check is not installed in this database (schema fencing)",
                        detail: Some(&String::from_utf8_lossy(fields.message)),
                        hint: Some(
                            "install it with `fence-proxy pg print-schema | psql ...`, or give fence-proxy a schema_urls entry for this database",
                        ),
                    },
                );
                return Verdict::Replace(out);
            }
            return Verdict::Forward;
        }
        if fields.severity == b"FATAL"
            && fields.code == b"57P01"
            && let Some((_, resource, token)) = &flow.checked_txn
        {
            let newer = self.relay.mark(resource).filter(|h| h > token);
            let why = match newer {
                Some(h) => format!("a newer token ({h}) for the resource waited for it"),
                None => "most likely a newer token for the resource waited for it (or the server is shutting down)".to_string(),
            };
            let mut out = Vec::new();
            msg::error_response(
                &mut out,
                &ErrorResponse {
                    severity: "FATAL",
                    code: sqlstate::FENCED_OUT,
                    message: &format!(
                        "fenced: PostgreSQL ended this session's open transaction with fencing token {token} for resource '{resource}': {why}"
                    ),
                    detail: Some("the transaction was rolled back; nothing it wrote was kept"),
                    hint: Some(
                        "this client no longer holds the lock; acquire it again for a new token",
                    ),
                },
            );
            return Verdict::Replace(out);
        }
        Verdict::Forward
    }
}

/// Reads "resource: R, presented token: T, highest accepted token: H" (the check's DETAIL).
fn parse_stale_detail(detail: &[u8]) -> Option<(&str, i64, i64)> {
    let d = std::str::from_utf8(detail).ok()?;
    let rest = d.strip_prefix("resource: ")?;
    let (resource, rest) = rest.split_once(", presented token: ")?;
    let (token, highest) = rest.split_once(", highest accepted token: ")?;
    Some((resource, token.parse().ok()?, highest.parse().ok()?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_check_detail_is_read_back() {
        assert_eq!(
            super::parse_stale_detail(
                b"resource: inv:1, presented token: 41, highest accepted token: 42"
            ),
            Some(("inv:1", 41, 42))
        );
        assert_eq!(super::parse_stale_detail(b"resource: x"), None);
    }
}
