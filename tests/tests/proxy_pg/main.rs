//! fence-proxy's PostgreSQL mode end to end: the real binary between real clients (psql,
//! pgbench, tokio-postgres) and a throwaway PostgreSQL (`e2e::pg`), over real sockets.
//!
//! - `clients`: psql scripts, pgbench (-i, simple, extended, prepared), the extended protocol
//!   with pipelining, COPY both ways, cancel, NOTIFY, md5 and SCRAM passwords;
//! - `fencing`: stale tokens, the zombie in a transaction and in autocommit, many sessions with
//!   interleaved tokens, settings through start-up options, RESET;
//! - `commit_point`: held cursors, deferred triggers, the completion of an implicit
//!   transaction, and which transactions a raise may end;
//! - `replicas`: two proxies in front of one database, and a restart;
//! - `input`: malformed and oversized messages, an upstream down, the connection limit;
//! - `combined`: one process with a PostgreSQL and an HTTP listener;
//! - `pool`: server connections reused across clients (`pool_size`): the reset, the bound,
//!   SCRAM in the proxy, cancel keys, fencing through reused connections;
//! - `hook`, `fast_check`, `remembered`: the commit hook, its check in C of a token that is the
//!   mark, and the passes it uses again while the fence's tables are unchanged;
//! - `tls`: TLS on both hops with psql, every failure, channel binding, SIGHUP.
//!
//! Needs the binaries: `cargo build --bins` first; PostgreSQL 15 in /usr/lib/postgresql/15/bin.

mod bypass;
mod clients;
mod combined;
mod commit_point;
mod drivers;
mod fast_check;
mod fencing;
mod foreign;
mod freeze;
mod hook;
mod input;
mod observe;
mod pool;
mod protected;
mod remembered;
mod replicas;
mod signed;
mod tls;

use std::io::{Read, Write};
use std::net::TcpStream;

use e2e::FenceProxy;
use e2e::pg::Postgres;
use pg_wire::msg;
use tokio_postgres::{Client, NoTls};

/// A throwaway PostgreSQL and a fence-proxy in front of it that installed the check.
pub struct Setup {
    pub pg: Postgres,
    pub proxy: FenceProxy,
    pub dir: tempfile::TempDir,
}

pub fn setup(fence_wait_ms: u64) -> Setup {
    setup_with(Postgres::start(), fence_wait_ms, "")
}

pub fn setup_with(pg: Postgres, fence_wait_ms: u64, extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(&dir, &pg, fence_wait_ms, extra);
    Setup { pg, proxy, dir }
}

pub fn start_proxy(
    dir: &tempfile::TempDir,
    pg: &Postgres,
    fence_wait_ms: u64,
    extra: &str,
) -> FenceProxy {
    let config = format!(
        "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nfence_wait_ms = {fence_wait_ms}\n{extra}\n",
        pg.port,
        pg.url()
    );
    FenceProxy::start_with(dir.path(), &config, 0, 1)
}

impl Setup {
    pub fn addr(&self) -> &str {
        &self.proxy.pg[0]
    }
}

/// Connects raw with the start-up keys `extra` besides user and database, completes start-up (trust), and returns the stream after ReadyForQuery.
pub fn raw_session(addr: &str, extra: &[(&[u8], &[u8])]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut start = Vec::new();
    let mut params: Vec<(&[u8], &[u8])> = vec![(b"user", b"postgres"), (b"database", b"postgres")];
    params.extend_from_slice(extra);
    msg::startup(&mut start, &params);
    s.write_all(&start).unwrap();
    read_until(&mut s, b'Z');
    s
}

/// Reads messages until one with `tag`; returns all the messages read.
pub fn read_until(s: &mut TcpStream, tag: u8) -> Vec<(u8, Vec<u8>)> {
    let mut got = Vec::new();
    loop {
        let mut head = [0u8; 5];
        s.read_exact(&mut head)
            .expect("the proxy closed before answering");
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len - 4];
        s.read_exact(&mut body).unwrap();
        let mut whole = head.to_vec();
        whole.extend_from_slice(&body);
        got.push((head[0], whole));
        if head[0] == tag {
            return got;
        }
    }
}

pub fn error_of(messages: &[(u8, Vec<u8>)]) -> (String, String, String) {
    let (_, m) = messages
        .iter()
        .find(|(t, _)| *t == b'E')
        .expect("an ErrorResponse");
    let f = msg::error_fields(m).unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (s(f.severity), s(f.code), s(f.message))
}

pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

/// Sends `sql` as a simple Query on a raw session; returns the messages up to ReadyForQuery.
pub fn raw_query(s: &mut TcpStream, sql: &str) -> Vec<(u8, Vec<u8>)> {
    let mut q = Vec::new();
    msg::query(&mut q, sql.as_bytes());
    s.write_all(&q).unwrap();
    read_until(s, b'Z')
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

/// A libpq-style connection string for `addr` (host:port).
pub fn conninfo(addr: &str, extra: &str) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    format!("host={host} port={port} user=postgres dbname=postgres {extra}")
}

/// A tokio-postgres client through `addr`; the connection's own task is returned too, so that
/// a test can read the error that ended it.
pub async fn connect_with(
    addr: &str,
    extra: &str,
) -> (
    Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, connection) = tokio_postgres::connect(&conninfo(addr, extra), NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting through {addr}: {e}"));
    (client, tokio::spawn(connection))
}

pub async fn connect(addr: &str) -> Client {
    connect_with(addr, "").await.0
}

/// A session through `addr` that holds `token` for `resource` (session-level settings).
pub async fn holder(addr: &str, resource: &str, token: i64) -> Client {
    let c = connect(addr).await;
    c.batch_execute(&format!(
        "SET fencing.resource = '{resource}'; SET fencing.token = '{token}'"
    ))
    .await
    .unwrap();
    c
}

/// The mark PostgreSQL holds for `resource`, as psql prints it.
pub fn mark(pg: &Postgres, resource: &str) -> String {
    pg.psql(&format!(
        "SELECT token FROM fencing.tokens WHERE resource = '{resource}'"
    ))
}

/// Runs `sql` (a count) through `client` until it answers `n`: each look is a round trip,
/// bounded by the harness's patience.
pub async fn wait_count(client: &Client, what: &str, sql: &str, n: i64) {
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    loop {
        let got: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
        if got == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for {what}: {sql:?} answers {got}"
        );
    }
}

/// Waits until B's wait for a lock has started twice: its first wait ran out (fence_wait_ms),
/// it looked for older transactions to end, and it waits again.
pub async fn until_the_wait_restarts(watcher: &tokio_postgres::Client) {
    let wait_started = "SELECT coalesce(max(waitstart)::text, '') FROM pg_locks \
                        WHERE locktype = 'advisory' AND NOT granted";
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    let mut first = String::new();
    loop {
        let w: String = watcher.query_one(wait_started, &[]).await.unwrap().get(0);
        if first.is_empty() {
            first = w;
        } else if !w.is_empty() && w != first {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no second wait for the lock: the waiter ended the holder (or never waited)"
        );
    }
}

/// The SQLSTATE of a database error (panics on any other error).
pub fn code(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .unwrap_or_else(|| panic!("not a database error: {e:?}"))
        .code()
        .code()
        .to_string()
}

/// psql through `addr`, running `script` from standard input; returns (success, stdout, stderr).
pub fn psql(addr: &str, script: &str, extra_env: &[(&str, &str)]) -> (bool, String, String) {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut cmd = Postgres::client_tool("psql");
    cmd.args([
        "-h", host, "-p", port, "-U", "postgres", "-d", "postgres", "-X", "-tA",
    ])
    .args(["-v", "VERBOSITY=verbose"])
    .envs(extra_env.iter().copied())
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .expect("running psql (apt-get install postgresql-client-15)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Installs the fence check in database `db` by hand, as a DBA would: `fence-proxy pg
/// print-schema` piped to psql, as `postgres`.
pub fn install_schema(pg: &Postgres, db: &str) {
    let schema = std::process::Command::new(e2e::bin("fence-proxy"))
        .args(["pg", "print-schema"])
        .output()
        .unwrap();
    assert!(schema.status.success(), "fence-proxy pg print-schema");
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", pg.port);
    let mut psql = std::process::Command::new("psql");
    psql.args([&url, "-q", "-X", "-v", "ON_ERROR_STOP=1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let mut child = psql.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&schema.stdout)
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "installing the schema in {db}"
    );
}
