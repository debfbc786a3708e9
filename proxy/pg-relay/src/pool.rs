//! Server connections reused across client connections, as PgBouncer's session pool: a client
//! gets a connection of its database and user for as long as it stays connected; when it
//! leaves with nothing in flight and no transaction open, the connection is reset (`DISCARD
//! ALL`: settings, prepared statements, cursors, temporary tables, advisory locks, LISTEN) and
//! waits for the next client whose start-up packet is the same. Anything else (a client gone
//! mid-transaction or mid-query, a reset that fails, a database with dblink, whose named
//! connections survive `DISCARD ALL`, a start-up packet that sets a `fencing.` setting) closes
//! the server connection instead.
//!
//! A pooled client cannot be authenticated by PostgreSQL (its server connection may be logged
//! in already), so the proxy authenticates it: SCRAM-SHA-256 against `auth_file` (PgBouncer's
//! userlist format), or `trust`. New server connections log in with the password from
//! `auth_file`, or with the ClientKey the client just proved (see [`crate::scram`]).
//!
//! At most `size` server connections per database and user, in use or idle; a client that
//! finds them all in use waits up to `wait` and is then refused with 53300. Idle connections
//! are closed after `idle`, and beyond `connections_max` idle ones in all.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pg_wire::Backend;
use tlsconf::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, RwLock, Semaphore};

use crate::machine::{BASE_STATEMENTS, STATEMENTS, parsed_mask, probe_len};
use crate::scram::{self, ClientExchange, Credential, ScramError, Secret, ServerExchange};
use std::net::SocketAddr;

use crate::{PgRelayConfig, Relay, session, sqlstate, upstream};

/// Databases and users whose permits are kept before unused ones are forgotten.
const PERMITS_KEPT: usize = 1024;
/// Largest message read while authenticating or resetting (nothing there is larger).
const AUTH_MESSAGE_MAX: usize = 64 << 10;

/// How the pool's clients prove who they are.
#[derive(Clone, Debug)]
pub enum PoolAuth {
    /// No proof: anyone who reaches the listener is whoever they say. Only where PostgreSQL
    /// would trust the same clients.
    Trust,
    /// SCRAM-SHA-256 against the users of an auth file.
    Scram(Arc<AuthFile>),
}

/// Server connection pooling of a listener.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Server connections per database and user, in use or idle.
    pub size: usize,
    /// Longest a client waits for one when they are all in use.
    pub wait: Duration,
    /// Idle server connections are closed after this.
    pub idle: Duration,
    pub auth: PoolAuth,
}

/// A user of the auth file.
#[derive(Clone, Debug)]
enum Entry {
    /// A password: the proxy checks clients against a secret made from it, and logs in to
    /// PostgreSQL with it (any method PostgreSQL asks for that takes a password).
    Password(Box<str>, Secret),
    /// PostgreSQL's SCRAM secret (`pg_authid.rolpassword`): clients are checked against it
    /// and their ClientKey logs in.
    Secret(Secret),
}

/// The users of an auth file: `"name" "password or SCRAM secret"` per line, PgBouncer's
/// `userlist.txt` (a `"` inside quotes is doubled; lines starting with `;` or `#` and empty
/// lines are skipped).
pub struct AuthFile {
    users: HashMap<String, Entry>,
    /// Answers for users not in the file, so that a stranger's exchange looks like a wrong
    /// password's (as PostgreSQL's mock authentication).
    mock: Secret,
}

impl std::fmt::Debug for AuthFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthFile({} users)", self.users.len())
    }
}

impl AuthFile {
    pub fn load(path: &Path) -> Result<AuthFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read auth_file {}: {e}", path.display()))?;
        AuthFile::parse(&text).map_err(|e| format!("auth_file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<AuthFile, String> {
        let mut users = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            let (user, rest) =
                quoted(line).ok_or(format!("line {}: expected \"user\" \"password\"", n + 1))?;
            let (password, rest) = quoted(rest.trim_start())
                .ok_or(format!("line {}: expected \"user\" \"password\"", n + 1))?;
            if !rest.trim().is_empty() || user.is_empty() {
                return Err(format!("line {}: expected \"user\" \"password\"", n + 1));
            }
            let entry = if password.starts_with("SCRAM-SHA-256$") {
                Entry::Secret(
                    Secret::parse(&password)
                        .ok_or(format!("line {}: a malformed SCRAM-SHA-256 secret", n + 1))?,
                )
            } else if password.len() == 35 && password.starts_with("md5") {
                return Err(format!(
                    "line {}: md5 hashes cannot check SCRAM-SHA-256 clients; give the SCRAM secret (pg_authid.rolpassword after password_encryption = scram-sha-256) or the password",
                    n + 1
                ));
            } else if password.is_empty() {
                return Err(format!("line {}: an empty password", n + 1));
            } else {
                let secret = Secret::from_password(&password);
                Entry::Password(password.into(), secret)
            };
            if users.insert(user.clone(), entry).is_some() {
                return Err(format!("line {}: user {user:?} appears twice", n + 1));
            }
        }
        if users.is_empty() {
            return Err("it lists no users, so nobody could log in through the pool".into());
        }
        Ok(AuthFile {
            users,
            mock: Secret::from_password(&format!("{:x}", rand_u64())),
        })
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the operating system's random number generator");
    u64::from_le_bytes(b)
}

/// A `"..."` field at the start of `s` (`""` is a quote) and what follows it.
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut rest = s.strip_prefix('"')?;
    let mut out = String::new();
    loop {
        let i = rest.find('"')?;
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        match rest.strip_prefix('"') {
            Some(r) => {
                out.push('"');
                rest = r;
            }
            None => return Some((out, rest)),
        }
    }
}

/// A logged-in server connection.
pub(crate) struct ServerConn {
    stream: Stream,
    meta: Meta,
}

/// What the pool knows of a server connection.
pub(crate) struct Meta {
    /// What PostgreSQL said after AuthenticationOk up to its first ReadyForQuery
    /// (ParameterStatus, BackendKeyData), given again to every client of this connection.
    startup: Vec<u8>,
    /// Held (shared) by a cancel request being forwarded to this connection's backend; the
    /// reset takes it exclusively, so that no cancel meant for one client reaches the next.
    gate: Arc<RwLock<()>>,
    packet: Vec<u8>,
    idle_since: Instant,
    /// The backend's pid and cancel key.
    backend: Option<(i32, Vec<u8>)>,
    /// The worker thread whose runtime the connection is registered with.
    thread: std::thread::ThreadId,
    /// Our statements, as the pool prepared them.
    pub(crate) probe: Probe,
    /// A client found the session's defaults to declare no token (`Machine::defaults_tokenless`).
    pub(crate) tokenless: bool,
}

/// What preparing our statements found: the check is installed (all of them parsed), and
/// which are prepared now (`Machine::probed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Probe {
    pub(crate) installed: bool,
    pub(crate) prepared: u8,
    /// The commit hook's check in C exists here (see `machine::BASE_STATEMENTS`).
    pub(crate) hooked: bool,
}

impl Meta {
    pub(crate) fn gate(&self) -> Arc<RwLock<()>> {
        Arc::clone(&self.gate)
    }

    pub(crate) fn join(self, stream: Stream) -> ServerConn {
        ServerConn { stream, meta: self }
    }
}

impl ServerConn {
    pub(crate) fn split(self) -> (Stream, Meta) {
        (self.stream, self.meta)
    }

    /// Whether an idle connection is still open and silent: PostgreSQL says nothing to an
    /// idle session unless it ends it (a FATAL, then the end of the stream). Asked of the
    /// socket itself (a non-blocking `MSG_PEEK`), not of the runtime's readiness, which learns
    /// of the FATAL only at its reactor's next turn: a connection ended a moment ago was
    /// handed out so (an e2e pool test saw it).
    fn alive(&self) -> bool {
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match socket2::SockRef::from(self.stream.tcp()).peek(&mut byte) {
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    }

    /// The bytes the session's machine reads as the start-up's answer: AuthenticationOk, the
    /// reports and key, ReadyForQuery.
    pub(crate) fn replay(&self) -> BytesMut {
        let mut out = Vec::with_capacity(self.meta.startup.len() + 16);
        out.extend_from_slice(b"R\0\0\0\x08\0\0\0\0");
        out.extend_from_slice(&self.meta.startup);
        pg_wire::msg::ready_for_query(&mut out, b'I');
        BytesMut::from(&out[..])
    }
}

#[derive(Default)]
struct Slot {
    idle: Vec<ServerConn>,
    /// Connections of this database and user, in use or idle.
    open: usize,
}

/// The server connections of one listener.
pub(crate) struct Pool {
    pub(crate) config: PoolConfig,
    /// Per (database, user): the permits bound the connections in use.
    permits: Mutex<HashMap<(String, String), Arc<Semaphore>>>,
    slots: Mutex<HashMap<(String, String), Slot>>,
    idle_max: usize,
    /// A worker runs the reaper already (each worker's `serve` would start one).
    pub(crate) reaping: std::sync::atomic::AtomicBool,
}

/// A client's right to one server connection of its database and user.
pub(crate) struct Lease {
    key: (String, String),
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    pub(crate) fn new(config: PoolConfig, idle_max: usize) -> Pool {
        Pool {
            config,
            permits: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
            idle_max,
            reaping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Waits (up to `wait`) for a server connection of `database` and `user` to be free.
    pub(crate) async fn lease(&self, database: &str, user: &str) -> Option<Lease> {
        let key = (database.to_string(), user.to_string());
        let semaphore = {
            let mut permits = self.permits.lock().expect("the pool's permits");
            if permits.len() >= PERMITS_KEPT && !permits.contains_key(&key) {
                // Every database and user ever named would stay here: forget those nobody
                // holds or waits for.
                let size = self.config.size;
                permits.retain(|_, s| s.available_permits() < size);
            }
            Arc::clone(
                permits
                    .entry(key.clone())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.config.size))),
            )
        };
        let permit = tokio::time::timeout(self.config.wait, semaphore.acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(Lease {
            key,
            _permit: permit,
        })
    }

    /// An idle connection opened with this start-up packet, if there is one. Makes room for
    /// a new one otherwise (closing the oldest idle connection of another packet when this
    /// database and user are at `size`), and counts it as open.
    pub(crate) fn take(&self, lease: &Lease, packet: &[u8]) -> Option<ServerConn> {
        let mut slots = self.slots.lock().expect("the pool's slots");
        let slot = slots.entry(lease.key.clone()).or_default();
        let now = Instant::now();
        let before = slot.idle.len();
        slot.idle
            .retain(|c| now.duration_since(c.meta.idle_since) < self.config.idle);
        slot.open -= before - slot.idle.len();
        // The most recently used first, and one opened on this thread before others: a
        // connection is registered with the runtime of the worker that opened it, and used from
        // another worker every read and write wakes that one's thread too.
        let here = std::thread::current().id();
        loop {
            let same = |c: &ServerConn| c.meta.packet == packet;
            let found = slot
                .idle
                .iter()
                .rposition(|c| same(c) && c.meta.thread == here)
                .or_else(|| slot.idle.iter().rposition(same));
            let Some(i) = found else { break };
            let conn = slot.idle.remove(i);
            if conn.alive() {
                return Some(conn);
            }
            // PostgreSQL ended it while it was idle (a restart, pg_terminate_backend).
            slot.open -= 1;
        }
        if slot.open >= self.config.size && !slot.idle.is_empty() {
            slot.idle.remove(0);
            slot.open -= 1;
        }
        slot.open += 1;
        None
    }

    /// A connection's client left: keep it for the next (it was reset) or forget it.
    pub(crate) fn give_back(&self, lease: &Lease, conn: Option<ServerConn>) {
        let mut slots = self.slots.lock().expect("the pool's slots");
        let idle_total: usize = slots.values().map(|s| s.idle.len()).sum();
        let slot = slots.entry(lease.key.clone()).or_default();
        match conn {
            Some(mut c) if idle_total < self.idle_max => {
                c.meta.idle_since = Instant::now();
                slot.idle.push(c);
            }
            _ => slot.open = slot.open.saturating_sub(1),
        }
    }

    /// Closes idle connections past `idle` (run now and then).
    pub(crate) fn reap(&self) {
        let now = Instant::now();
        let mut slots = self.slots.lock().expect("the pool's slots");
        for slot in slots.values_mut() {
            let before = slot.idle.len();
            slot.idle
                .retain(|c| now.duration_since(c.meta.idle_since) < self.config.idle);
            slot.open -= before - slot.idle.len();
        }
        slots.retain(|_, s| s.open > 0);
    }
}

/// One client's use of the pool: its lease, and the connection counted for it once taken.
/// Dropped without [`Checkout::finish`], the connection is forgotten (closed).
pub(crate) struct Checkout<'a> {
    pool: &'a Pool,
    lease: Lease,
    /// The connection may serve another client afterwards (its start-up sets no fencing).
    reuse: bool,
    counted: bool,
}

impl<'a> Checkout<'a> {
    pub(crate) fn new(pool: &'a Pool, lease: Lease, reuse: bool) -> Checkout<'a> {
        Checkout {
            pool,
            lease,
            reuse,
            counted: false,
        }
    }

    /// An idle connection opened with `packet`, or `None` (then one is to be opened, and is
    /// counted already).
    pub(crate) fn take(&mut self, packet: &[u8]) -> Option<ServerConn> {
        self.counted = true;
        self.pool.take(&self.lease, packet)
    }

    /// The client left: `conn` is reset and kept when it may be reused, else retired; the
    /// client's place is free only then.
    pub(crate) async fn finish(
        mut self,
        conn: Option<ServerConn>,
        reusable: bool,
        config: &PgRelayConfig,
    ) {
        let conn = match conn {
            Some(c) if self.reuse && reusable => reset(c, config.connect_timeout).await,
            Some(c) => {
                retire(c, config).await;
                None
            }
            None => None,
        };
        self.counted = false;
        self.pool.give_back(&self.lease, conn);
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.pool.give_back(&self.lease, None);
        }
    }
}

/// What the pool needs of a client's start-up packet, read where the relay reads it.
pub(crate) struct Startup {
    pub(crate) user: String,
    /// As PostgreSQL defaults it: the user's name when none is given.
    pub(crate) database: String,
    /// It sets a `fencing.` setting (see [`declares_fencing`]).
    pub(crate) declares_fencing: bool,
}

/// Whether a start-up packet sets a fencing setting (as a parameter or in `options`): such a
/// connection's token would be its default for ever, so it is never reused.
pub(crate) fn declares_fencing(params: &[(&[u8], &[u8])]) -> bool {
    params.iter().any(|(k, v)| {
        let k = k.to_ascii_lowercase();
        let v: Vec<u8> = v
            .iter()
            .filter(|b| **b != b'\\')
            .map(u8::to_ascii_lowercase)
            .collect();
        k.starts_with(b"fencing.") || (k == b"options" && v.windows(8).any(|w| w == b"fencing."))
    })
}

async fn read_message(stream: &mut Stream, buf: &mut BytesMut) -> std::io::Result<BytesMut> {
    loop {
        match pg_wire::header(buf, AUTH_MESSAGE_MAX) {
            Ok(Some(h)) if buf.len() >= h.total => return Ok(buf.split_to(h.total)),
            Ok(_) => {
                if stream.read_buf(buf).await? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the connection closed",
                    ));
                }
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    e.to_string(),
                ));
            }
        }
    }
}

/// A client's message while authenticating; `None` if it is larger than any of them may be.
async fn read_client(client: &mut Stream, buf: &mut BytesMut) -> std::io::Result<Option<BytesMut>> {
    if let Err(pg_wire::WireError::TooLarge { .. }) = pg_wire::header(buf, AUTH_MESSAGE_MAX) {
        return Ok(None);
    }
    match read_message(client, buf).await {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Ok(None),
        r => r.map(Some),
    }
}

fn authentication(out: &mut Vec<u8>, code: i32, data: &[u8]) {
    out.push(b'R');
    out.extend_from_slice(&(8 + data.len() as u32).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(data);
}

/// Why a client was not let in: the FATAL's SQLSTATE and message.
pub(crate) type Refusal = (&'static str, String);

/// Authenticates a pooled client; on success, the ClientKey it proved (SCRAM) for logging in
/// to PostgreSQL when its secret is PostgreSQL's. `buf` holds what the client sent after its
/// start-up packet.
pub(crate) async fn authenticate(
    auth: &PoolAuth,
    client: &mut Stream,
    buf: &mut BytesMut,
    user: &str,
) -> std::io::Result<Result<Option<[u8; 32]>, Refusal>> {
    let file = match auth {
        PoolAuth::Trust => return Ok(Ok(None)),
        PoolAuth::Scram(file) => file,
    };
    let known = file.users.get(user);
    let secret = match known {
        Some(Entry::Password(_, s) | Entry::Secret(s)) => s,
        None => &file.mock,
    };
    let failed = || {
        Ok(Err((
            sqlstate::INVALID_PASSWORD,
            format!("password authentication failed for user \"{user}\""),
        )))
    };
    let mut out = Vec::new();
    authentication(&mut out, 10, format!("{}\0\0", scram::MECHANISM).as_bytes());
    client.write_all(&out).await?;
    // SASLInitialResponse: the mechanism, then the data's length and the data.
    let malformed = |what: &str| {
        Ok(Err((
            sqlstate::PROTOCOL_VIOLATION,
            format!("fence-proxy: {what}"),
        )))
    };
    let Some(first) = read_client(client, buf).await? else {
        return malformed("a SASL message larger than 64 KiB");
    };
    let mut r = pg_wire::msg::Reader::body(&first);
    if first[0] != b'p' {
        return malformed("expected a SASLInitialResponse");
    }
    let mechanism = r.cstr("SASLInitialResponse").unwrap_or_default();
    if mechanism != scram::MECHANISM.as_bytes() {
        return malformed("the only mechanism offered is SCRAM-SHA-256");
    }
    let declared = r.i32("SASLInitialResponse");
    let data = r.rest();
    if declared.ok() != i32::try_from(data.len()).ok() {
        return malformed("a malformed SASLInitialResponse");
    }
    let (exchange, server_first) = match ServerExchange::start(secret, data) {
        Ok(x) => x,
        Err(ScramError::Malformed(m)) => return malformed(m),
        Err(ScramError::Refused) => return failed(),
    };
    out.clear();
    authentication(&mut out, 11, server_first.as_bytes());
    client.write_all(&out).await?;
    let Some(fin) = read_client(client, buf).await? else {
        return malformed("a SASL message larger than 64 KiB");
    };
    if fin[0] != b'p' {
        return malformed("expected a SASLResponse");
    }
    match exchange.finish(&fin[5..]) {
        Ok((server_final, key)) if known.is_some() => {
            out.clear();
            authentication(&mut out, 12, server_final.as_bytes());
            client.write_all(&out).await?;
            Ok(Ok(Some(key)))
        }
        Ok(_) | Err(ScramError::Refused) => failed(),
        Err(ScramError::Malformed(m)) => malformed(m),
    }
}

/// Why a login to PostgreSQL failed.
pub(crate) enum LoginError {
    /// PostgreSQL's own error (the bytes of its ErrorResponse), for the client as it is.
    Server(Vec<u8>),
    Other(String),
}

/// Opens and logs in a server connection with the client's start-up packet.
pub(crate) async fn login(
    config: &PgRelayConfig,
    auth: &PoolAuth,
    packet: &[u8],
    user: &str,
    client_key: Option<&[u8; 32]>,
) -> Result<ServerConn, LoginError> {
    let mut stream = upstream::connect(config).await.map_err(LoginError::Other)?;
    let io = |e: std::io::Error| LoginError::Other(format!("logging in to PostgreSQL: {e}"));
    stream.write_all(packet).await.map_err(io)?;
    let entry = match auth {
        PoolAuth::Scram(file) => file.users.get(user),
        PoolAuth::Trust => None,
    };
    let password = match entry {
        Some(Entry::Password(p, _)) => Some(&**p),
        _ => None,
    };
    let mut buf = BytesMut::with_capacity(4096);
    let mut startup = Vec::new();
    let mut backend = None;
    let mut expected = None;
    let no_password = |what: &str| {
        LoginError::Other(format!(
            "PostgreSQL asks for {what} for user \"{user}\", and auth_file has no password for it"
        ))
    };
    loop {
        let m = read_message(&mut stream, &mut buf).await.map_err(io)?;
        let mut out = Vec::new();
        match m[0] {
            b'R' if m.len() >= 9 => {
                let code = i32::from_be_bytes([m[5], m[6], m[7], m[8]]);
                let data = &m[9..];
                match code {
                    0 => {}
                    3 => {
                        let p = password.ok_or_else(|| no_password("a cleartext password"))?;
                        out.push(b'p');
                        out.extend_from_slice(&(5 + p.len() as u32).to_be_bytes());
                        out.extend_from_slice(p.as_bytes());
                        out.push(0);
                    }
                    10 => {
                        let offered = data
                            .split(|b| *b == 0)
                            .any(|m| m == scram::MECHANISM.as_bytes());
                        if !offered {
                            return Err(LoginError::Other(
                                "PostgreSQL offers no SCRAM-SHA-256".into(),
                            ));
                        }
                        let credential = match (password, client_key, entry) {
                            (Some(p), _, _) => Credential::Password(p),
                            (None, Some(k), Some(Entry::Secret(s))) => Credential::ClientKey(k, s),
                            _ => return Err(no_password("SCRAM-SHA-256")),
                        };
                        let (exchange, first) = ClientExchange::start(credential);
                        out.push(b'p');
                        let len = 4 + scram::MECHANISM.len() + 1 + 4 + first.len();
                        out.extend_from_slice(&(len as u32).to_be_bytes());
                        out.extend_from_slice(scram::MECHANISM.as_bytes());
                        out.push(0);
                        out.extend_from_slice(&(first.len() as u32).to_be_bytes());
                        out.extend_from_slice(first.as_bytes());
                        stream.write_all(&out).await.map_err(io)?;
                        let m = read_message(&mut stream, &mut buf).await.map_err(io)?;
                        if m[0] == b'E' {
                            return Err(LoginError::Server(m.to_vec()));
                        }
                        if m[0] != b'R' || m.get(5..9) != Some(&11i32.to_be_bytes()[..]) {
                            return Err(LoginError::Other(
                                "PostgreSQL did not go on with SCRAM".into(),
                            ));
                        }
                        let (fin, check) = exchange.respond(&m[9..]).map_err(LoginError::Other)?;
                        out.clear();
                        out.push(b'p');
                        out.extend_from_slice(&(4 + fin.len() as u32).to_be_bytes());
                        out.extend_from_slice(fin.as_bytes());
                        expected = Some(check);
                    }
                    12 => {
                        let check = expected
                            .take()
                            .ok_or_else(|| LoginError::Other("an unasked SASL outcome".into()))?;
                        check.check(data).map_err(LoginError::Other)?;
                    }
                    other => {
                        return Err(LoginError::Other(format!(
                            "PostgreSQL asks for an authentication the pool does not speak (code {other}): use scram-sha-256, password or trust for fence-proxy's address"
                        )));
                    }
                }
            }
            b'R' => {
                return Err(LoginError::Other(
                    "PostgreSQL sent a malformed message".into(),
                ));
            }
            b'E' => return Err(LoginError::Server(m.to_vec())),
            b'S' => startup.extend_from_slice(&m),
            b'K' => {
                if let Ok((pid, key)) = pg_wire::msg::backend_key(&m) {
                    backend = Some((pid, key.to_vec()));
                }
                startup.extend_from_slice(&m);
            }
            b'Z' => break,
            // NegotiateProtocolVersion, notices: nothing for the pool.
            _ => {}
        }
        if !out.is_empty() {
            stream.write_all(&out).await.map_err(io)?;
        }
    }
    let mut out = Vec::new();
    let n = probe_len(reports_hook(&startup));
    prepare(&mut out, n);
    stream.write_all(&out).await.map_err(io)?;
    let probe = read_prepared(&mut stream, &mut buf, n)
        .await
        .map_err(io)?
        .ok_or_else(|| LoginError::Other("PostgreSQL failed our statements oddly".into()))?;
    Ok(ServerConn {
        stream,
        meta: Meta {
            startup,
            gate: Arc::new(RwLock::new(())),
            packet: packet.to_vec(),
            idle_since: Instant::now(),
            backend,
            thread: std::thread::current().id(),
            probe,
            tokenless: false,
        },
    })
}

/// Whether the start-up's reports (ParameterStatus messages) say `fence_hook.active = on`.
/// Only the probe's extent follows it: whether the proxy relies on the hook is the session's
/// machine's decision, from the same report.
fn reports_hook(startup: &[u8]) -> bool {
    let mut rest = startup;
    while let Ok(Some(h)) = pg_wire::header(rest, usize::MAX) {
        if rest.len() < h.total {
            break;
        }
        let (m, tail) = rest.split_at(h.total);
        if m[0] == b'S' && m.get(5..) == Some(&b"fence_hook.active\0on\0"[..]) {
            return true;
        }
        rest = tail;
    }
    false
}

/// The first `n` of our statements, as the probe sends them (the bare form first: it needs
/// nothing of ours, so it is there even when the rest fails), and a Sync.
fn prepare(out: &mut Vec<u8>, n: usize) {
    for (name, text, types) in &STATEMENTS[..n] {
        pg_wire::msg::parse(out, name, text, types);
    }
    pg_wire::msg::sync(out);
}

/// Reads the answer to `prepare`: what it found, or `None` when PostgreSQL said something
/// else.
async fn read_prepared(
    stream: &mut Stream,
    buf: &mut BytesMut,
    sent: usize,
) -> std::io::Result<Option<Probe>> {
    let mut parsed = 0;
    loop {
        let m = read_message(stream, buf).await?;
        match m[0] {
            b'1' => parsed += 1,
            // A statement failed: the check is not installed here (the rest were skipped).
            b'E' => {}
            b'Z' => {
                return Ok(Some(Probe {
                    installed: parsed >= BASE_STATEMENTS,
                    prepared: parsed_mask(parsed),
                    hooked: parsed == sent && sent > BASE_STATEMENTS,
                }));
            }
            // Notices, reports.
            b'N' | b'S' => {}
            _ => return Ok(None),
        }
    }
}

/// Ends a server connection that cannot be reused, and waits (up to `connect_timeout`) until
/// its backend is gone, so that `pool_size` bounds backends, not only connections: a client
/// that left mid-query would otherwise leave its backend running the query with its place
/// already given to the next. Its query is cancelled, then Terminate and the end of the stream
/// (never a Sync: that would commit what the client left unsynced); PostgreSQL then rolls back
/// whatever was open and ends the backend, and the stream's end says it did.
async fn retire(mut conn: ServerConn, config: &PgRelayConfig) {
    let deadline = tokio::time::Instant::now() + config.connect_timeout;
    if let Some((pid, key)) = &conn.meta.backend {
        upstream::cancel(config, *pid, key).await;
    }
    let mut out = Vec::new();
    pg_wire::msg::terminate(&mut out);
    let _ = tokio::time::timeout_at(deadline, async {
        conn.stream.write_all(&out).await?;
        conn.stream.shutdown().await?;
        let mut rest = [0u8; 8192];
        while conn.stream.read(&mut rest).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Resets a connection whose client left with nothing in flight and no transaction open;
/// `None` if it cannot be made clean (then it is closed). `DISCARD ALL` drops our prepared
/// statements with the client's (so nothing a client put in their place outlives it); the next
/// client's checks prepare the ones they need.
pub(crate) async fn reset(mut conn: ServerConn, timeout: Duration) -> Option<ServerConn> {
    // No cancel forwarded for the last client may still be on its way.
    let gate = conn.meta.gate();
    let _closed = gate.write().await;
    let mut out = Vec::new();
    pg_wire::msg::query(&mut out, b"DISCARD ALL");
    // dblink's named connections are not discarded: a database with dblink keeps none.
    pg_wire::msg::query(
        &mut out,
        b"SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'dblink'",
    );
    let clean = tokio::time::timeout(timeout, async {
        conn.stream.write_all(&out).await.ok()?;
        let mut buf = BytesMut::with_capacity(1024);
        let (mut ready, mut discarded, mut dblink) = (0, false, false);
        while ready < 2 {
            let m = read_message(&mut conn.stream, &mut buf).await.ok()?;
            match Backend::decode(&m).ok()? {
                Backend::CommandComplete { tag } => discarded |= tag == b"DISCARD ALL",
                Backend::DataRow { .. } => dblink = true,
                Backend::Error(_) => return None,
                Backend::ReadyForQuery { status: b'I' } => ready += 1,
                Backend::ReadyForQuery { .. } => return None,
                _ => {}
            }
        }
        (discarded && !dblink && buf.is_empty()).then_some(())
    })
    .await;
    let clean = matches!(clean, Ok(Some(())));
    tracing::debug!(clean, "reset a pooled server connection");
    conn.meta.probe.prepared = 0;
    clean.then_some(conn)
}

/// A pooled session's start: the client authenticated by the proxy, then a server connection
/// of its database and user, idle or new. `None`: the client was refused (and told why).
pub(crate) async fn open<'a>(
    relay: &'a Relay,
    the_pool: &'a Pool,
    client: &mut Stream,
    buf: &mut BytesMut,
    packet: &[u8],
    startup: &Startup,
    peer: SocketAddr,
) -> std::io::Result<Option<(ServerConn, Checkout<'a>)>> {
    let Startup { user, database, .. } = startup;
    if user.is_empty() {
        session::fatal(
            client,
            sqlstate::INVALID_AUTHORIZATION,
            "fence-proxy: no user name in the start-up packet".into(),
        )
        .await
        .ok();
        return Ok(None);
    }
    let authenticated = tokio::time::timeout(
        relay.config.startup_timeout,
        authenticate(&the_pool.config.auth, client, buf, user),
    )
    .await
    .unwrap_or_else(|_| {
        Ok(Err((
            sqlstate::PROTOCOL_VIOLATION,
            "fence-proxy: canceling authentication due to timeout (startup_timeout_ms)".into(),
        )))
    })?;
    let client_key = match authenticated {
        Ok(key) => key,
        Err((code, message)) => {
            tracing::info!(%peer, %user, reason = %message, "a pooled client was not authenticated");
            session::fatal(client, code, message).await.ok();
            return Ok(None);
        }
    };
    let Some(lease) = the_pool.lease(database, user).await else {
        let size = the_pool.config.size;
        tracing::warn!(%peer, %database, %user, size, "refusing a client: its pool stayed full");
        session::fatal(client, sqlstate::TOO_MANY_CONNECTIONS, format!(
            "fence-proxy: every server connection of database \"{database}\" and user \"{user}\" stayed in use for pool_wait_ms (pool_size = {size})"
        )).await.ok();
        return Ok(None);
    };
    let mut checkout = Checkout::new(the_pool, lease, !startup.declares_fencing);
    if let Some(conn) = checkout.take(packet) {
        return Ok(Some((conn, checkout)));
    }
    // A PostgreSQL that stalls in the login holds the client's place no longer than a
    // connection and a start-up may take.
    let limit = relay.config.connect_timeout + relay.config.startup_timeout;
    let logged_in = tokio::time::timeout(
        limit,
        login(
            &relay.config,
            &the_pool.config.auth,
            packet,
            user,
            client_key.as_ref(),
        ),
    )
    .await
    .unwrap_or_else(|_| {
        Err(LoginError::Other(format!(
            "logging in to PostgreSQL took more than {} ms",
            limit.as_millis()
        )))
    });
    match logged_in {
        Ok(conn) => Ok(Some((conn, checkout))),
        Err(LoginError::Server(error)) => {
            client.write_all(&error).await.ok();
            Ok(None)
        }
        Err(LoginError::Other(m)) => session::cannot_connect(client, peer, m)
            .await
            .map(|()| None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_auth_file_is_pgbouncers_userlist() {
        let f = AuthFile::parse(
            "; comment\n# comment\n\n\"app\" \"pw\"\n  \"we\"\"ird\"   \"p\"\"w\"  \n\"scram\" \"SCRAM-SHA-256$4096:c2FsdA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"\n",
        )
        .unwrap();
        assert!(matches!(f.users.get("app"), Some(Entry::Password(p, _)) if &**p == "pw"));
        assert!(matches!(f.users.get("we\"ird"), Some(Entry::Password(p, _)) if &**p == "p\"w"));
        assert!(matches!(f.users.get("scram"), Some(Entry::Secret(s)) if s.iterations == 4096));
        for (bad, why) in [
            ("app pw", "expected"),
            ("\"app\"", "expected"),
            ("\"app\" \"pw\" extra", "expected"),
            ("\"app\" \"pw", "expected"),
            ("\"\" \"pw\"", "expected"),
            ("\"app\" \"\"", "empty password"),
            ("\"a\" \"x\"\n\"a\" \"y\"", "twice"),
            ("\"a\" \"SCRAM-SHA-256$x\"", "malformed SCRAM"),
            ("\"a\" \"md5a3556571e93b0d20722ba62be61e8c2d\"", "md5"),
        ] {
            let e = AuthFile::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn only_fencing_settings_in_a_start_up_keep_a_connection_out_of_the_pool() {
        let yes: [&[(&[u8], &[u8])]; 4] = [
            &[(b"fencing.token", b"5")],
            &[(b"FENCING.resource", b"r")],
            &[(b"options", b"-c fencing.token=5")],
            &[(b"options", b"--FENCING\\.token=5")],
        ];
        for p in yes {
            assert!(declares_fencing(p), "{p:?}");
        }
        let no: [&[(&[u8], &[u8])]; 3] = [
            &[(b"database", b"fencing.db")],
            &[(b"options", b"-c search_path=fencing")],
            &[(b"application_name", b"fencing.app")],
        ];
        for p in no {
            assert!(!declares_fencing(p), "{p:?}");
        }
    }
}
