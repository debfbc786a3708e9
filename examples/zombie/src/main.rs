//! The zombie demo. Starts lockd (temporary directory), a small HTTP inventory service and
//! fence-proxy in front of it. Client A (a separate process) takes the lock and writes; it is
//! then paused for real (SIGSTOP) past its lease; client B takes the lock, gets a newer token
//! and writes; A is resumed and writes with its old token; fence-proxy refuses it. The story is
//! told step by step, the history written, checked with `verify`'s checker, and drawn.
//!
//!     cargo build --bins && target/debug/zombie [--postgres] [--out DIR]
//!
//! With `--postgres` the same story runs through fence-proxy's PostgreSQL mode in front of a
//! throwaway PostgreSQL (PostgreSQL 15 installed): A is paused inside an open transaction, B's
//! write waits for it at most the fence wait, PostgreSQL ends A's transaction, and A's COMMIT
//! fails with the fenced error.
//!
//! Runs the real `lockd`, `lockctl` and `fence-proxy` binaries from the same build directory.
//! Exit status 0 when the story went as it should (A refused, no violation).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use serde_json::{Value, json};

const RESOURCE: &str = "inventory:sku-1";
const PATH: &str = "/inventory/sku-1";
/// A's lease: short, so that the demo does not wait long for it to run out.
const A_TTL: &str = "1s";
const A_TTL_MS: u64 = 1000;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("client") => return client(&args[1..]),
        Some("client-pg") => return client_pg(&args[1..]),
        _ => {}
    }
    let mut postgres = false;
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--postgres" => postgres = true,
            "--out" => out = Some(PathBuf::from(it.next().context("--out takes a directory")?)),
            _ => bail!("usage: zombie [--postgres] [--out DIR]"),
        }
    }
    demo(out, postgres)
}

fn event(kind: &str, process: &str, f: &str, extra: Value) -> Value {
    e2e::history_event(kind, process, f, RESOURCE, extra)
}

fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} not found: build everything first with `cargo build --bins`",
            path.display()
        );
    }
    Ok(path)
}

/// A grant as the demo uses it: the token's number (for the story and the history) and the
/// token to present to fence-proxy (the signed form lockd gave).
#[derive(Clone, Debug)]
struct Grant {
    number: u64,
    fence: String,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number)
    }
}

/// `lockctl acquire --json`: the grant.
fn acquire(endpoint: &str, holder: &str, ttl: &str, wait: &str) -> anyhow::Result<Grant> {
    let out = Command::new(bin("lockctl")?)
        .env("LOCKD_ENDPOINT", endpoint)
        .args([
            "acquire", RESOURCE, "--ttl", ttl, "--wait", wait, "--holder", holder, "--json",
        ])
        .output()
        .context("running lockctl")?;
    if !out.status.success() {
        bail!(
            "lockctl acquire failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("lockctl's JSON")?;
    Ok(Grant {
        number: v["token"].as_u64().context("lockctl's JSON has a token")?,
        fence: v["signed_token"]
            .as_str()
            .context("lockd signs its tokens here: lockctl's JSON has a signed token")?
            .to_string(),
    })
}

/// One HTTP/1.1 request; returns the status and the body.
fn http(
    addr: &str,
    method: &str,
    headers: &[(&str, String)],
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let mut req = format!(
        "{method} {PATH} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("an HTTP status line")?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A write through fence-proxy with `token`, named `id` for the history.
fn write_stock(proxy: &str, token: &Grant, id: &str, count: u32) -> anyhow::Result<(u16, String)> {
    http(
        proxy,
        "PUT",
        &[
            ("Fencing-Token", token.fence.clone()),
            ("X-Write-Id", id.to_string()),
        ],
        &format!("count={count}"),
    )
}

/// A client's event for the history, on its standard output.
fn emit_event(e: Value) {
    println!("EVENT {e}");
}

/// Client A's first step in both stories: the lock, with a short lease.
fn a_takes_the_lock(endpoint: &str) -> anyhow::Result<Grant> {
    emit_event(event("invoke", "A", "acquire", json!({})));
    let token = acquire(endpoint, "A", A_TTL, "5s")?;
    emit_event(event(
        "ok",
        "A",
        "acquire",
        json!({"token": token.number, "ttl_ms": A_TTL_MS}),
    ));
    println!("A: I hold {RESOURCE} with token {token} (lease {A_TTL})");
    let shown: String = token.fence.chars().take(24).collect();
    println!("A: lockd signed it for {RESOURCE}: {shown}... (fence-proxy takes no other)");
    Ok(token)
}

/// Client A, as its own process so that it can be paused for real. Prints `EVENT {json}` lines
/// for the history and plain lines for the story; waits for a line on stdin before its second
/// write.
fn client(args: &[String]) -> anyhow::Result<()> {
    let [endpoint, proxy] = args else {
        bail!("usage: zombie client LOCKD_ENDPOINT PROXY_ADDR");
    };
    let token = a_takes_the_lock(endpoint)?;
    emit_event(event(
        "invoke",
        "A",
        "write",
        json!({"token": token.number, "value": "a1"}),
    ));
    let (status, _) = write_stock(proxy, &token, "a1", 7)?;
    emit_event(event(
        if status == 200 { "ok" } else { "fail" },
        "A",
        "write",
        json!({"token": token.number, "value": "a1"}),
    ));
    println!("A: wrote count=7 with token {token}: HTTP {status}");
    println!("A: READY for my next write");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    // Here A was paused; it does not know. It still believes it holds the lock.
    println!("A: (resumed, unaware) writing count=3 with token {token}");
    emit_event(event(
        "invoke",
        "A",
        "write",
        json!({"token": token.number, "value": "a2"}),
    ));
    let (status, body) = write_stock(proxy, &token, "a2", 3)?;
    let kind = if status == 200 { "ok" } else { "fail" };
    emit_event(event(
        kind,
        "A",
        "write",
        json!({"token": token.number, "value": "a2", "note": format!("HTTP {status}")}),
    ));
    println!("A: HTTP {status}: {}", body.trim());
    Ok(())
}

/// The inventory service: keeps the count of sku-1 and the names of the writes it applied.
fn inventory() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    let state = Arc::new(Mutex::new((0u32, Vec::<String>::new())));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let state = Arc::clone(&state);
            std::thread::spawn(move || {
                let _ = serve(stream, &state);
            });
        }
    });
    Ok(addr)
}

fn serve(stream: TcpStream, state: &Mutex<(u32, Vec<String>)>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    loop {
        let mut head = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let header = |name: &str| {
            head.iter()
                .find_map(|h| {
                    h.split_once(':')
                        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                })
                .map(|(_, v)| v.trim().to_string())
        };
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body)?;
        let body = String::from_utf8_lossy(&body);
        let reply = {
            let mut s = state.lock().expect("inventory state");
            if head.first().is_some_and(|l| l.starts_with("PUT")) {
                if let Some(n) = body
                    .strip_prefix("count=")
                    .and_then(|n| n.trim().parse().ok())
                {
                    s.0 = n;
                }
                s.1.push(header("x-write-id").unwrap_or_default());
            }
            json!({"count": s.0, "writes": s.1}).to_string()
        };
        let mut out = stream.try_clone()?;
        write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        )?;
        if header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
            return Ok(());
        }
    }
}

/// Reads `child`'s stdout lines until one contains `until` (or the end), telling the story and
/// collecting the events.
fn follow(
    out: &mut BufReader<ChildStdout>,
    until: Option<&str>,
    events: &mut Vec<Value>,
) -> anyhow::Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line)? == 0 {
            return match until {
                Some(u) => bail!("client A ended before saying {u:?}"),
                None => Ok(()),
            };
        }
        if let Some(json) = line.strip_prefix("EVENT ") {
            events.push(serde_json::from_str(json)?);
        } else {
            print!("   {line}");
            if until.is_some_and(|u| line.contains(u)) {
                return Ok(());
            }
        }
    }
}

fn say(text: &str) {
    println!("\n== {text}");
}

/// Starts a process and reads its stderr until a JSON log line with `message`; returns that
/// line's `addr`. The rest of its log is drained in the background.
fn start(mut cmd: Command, message: &str) -> anyhow::Result<(Child, String)> {
    let mut child = cmd.stderr(Stdio::piped()).stdout(Stdio::null()).spawn()?;
    let err = child.stderr.take().context("stderr is piped")?;
    let mut lines = BufReader::new(err).lines();
    let addr = loop {
        let line = lines
            .next()
            .context("the process ended before it listened")??;
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v["message"] == message
        {
            break v["addr"].as_str().context("an addr")?.to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Ok((child, addr))
}

struct Killed(Vec<Child>);
impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

enum Store {
    Http(String),
    Postgres(e2e::pg::Postgres),
}

fn pg_conninfo(proxy: &str, token: &Grant) -> anyhow::Result<String> {
    let (host, port) = proxy.rsplit_once(':').context("host:port")?;
    Ok(format!(
        "host={host} port={port} user=postgres dbname=postgres options='-c fencing.resource={RESOURCE} -c fencing.token={}'",
        token.fence
    ))
}

/// Client A of the PostgreSQL story: writes once, then opens a transaction, writes, and waits
/// (inside the transaction) for a line on stdin before its COMMIT.
fn client_pg(args: &[String]) -> anyhow::Result<()> {
    let [endpoint, proxy] = args else {
        bail!("usage: zombie client-pg LOCKD_ENDPOINT PROXY_ADDR");
    };
    let token = a_takes_the_lock(endpoint)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let conninfo = pg_conninfo(proxy, &token)?;
        let (db, connection) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await?;
        let connection = tokio::spawn(connection);
        emit_event(event("invoke", "A", "write", json!({"token": token.number, "value": "a1"})));
        db.batch_execute(
            "BEGIN; UPDATE stock SET count = 7 WHERE sku = 'sku-1'; INSERT INTO applied VALUES ('a1'); COMMIT",
        )
        .await?;
        emit_event(event("ok", "A", "write", json!({"token": token.number, "value": "a1"})));
        println!("A: UPDATE stock SET count = 7 committed with token {token}");
        emit_event(event("invoke", "A", "write", json!({"token": token.number, "value": "a2"})));
        db.batch_execute(
            "BEGIN; UPDATE stock SET count = 3 WHERE sku = 'sku-1'; INSERT INTO applied VALUES ('a2')",
        )
        .await?;
        println!("A: began a transaction: UPDATE stock SET count = 3 (not committed yet)");
        println!("A: READY to commit");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        println!("A: (resumed, unaware) COMMIT");
        match db.batch_execute("COMMIT").await {
            Ok(()) => {
                emit_event(event("ok", "A", "write", json!({"token": token.number, "value": "a2"})));
                println!("A: COMMIT succeeded");
            }
            Err(e) => {
                // The reason: the COMMIT's own error, or the one that ended the connection
                // (FN003 either way when fence-proxy ended the session).
                let db = |e: &tokio_postgres::Error| {
                    e.as_db_error()
                        .map(|d| format!("{}: {}", d.code().code(), d.message()))
                };
                let why = match db(&e) {
                    Some(why) => why,
                    None => match connection.await {
                        Ok(Err(ended)) => db(&ended).unwrap_or_else(|| ended.to_string()),
                        _ => e.to_string(),
                    },
                };
                emit_event(event(
                    "fail",
                    "A",
                    "write",
                    json!({"token": token.number, "value": "a2", "note": why}),
                ));
                println!("A: COMMIT failed: {why}");
            }
        }
        Ok::<(), anyhow::Error>(())
    })
}

/// B's write in the PostgreSQL story: one transaction through fence-proxy with `token`.
fn pg_write(proxy: &str, token: &Grant) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (db, connection) =
            tokio_postgres::connect(&pg_conninfo(proxy, token)?, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        db.batch_execute(
            "BEGIN; UPDATE stock SET count = 5 WHERE sku = 'sku-1'; INSERT INTO applied VALUES ('b1'); COMMIT",
        )
        .await?;
        Ok(())
    })
}

fn demo(out_dir: Option<PathBuf>, postgres: bool) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let out_dir = match out_dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("zombie-{}", std::process::id())),
    };
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut procs = Killed(Vec::new());

    // The protected store: the inventory service behind fence-proxy's HTTP mode, or a table
    // in PostgreSQL behind its PostgreSQL mode.
    let store = if postgres {
        say(
            "starting lockd, a throwaway PostgreSQL, and fence-proxy (PostgreSQL mode) in front of it",
        );
        let pg = e2e::pg::Postgres::start();
        pg.psql(
            "CREATE TABLE stock (sku text PRIMARY KEY, count int); INSERT INTO stock VALUES ('sku-1', 10); CREATE TABLE applied (id text PRIMARY KEY)",
        );
        Store::Postgres(pg)
    } else {
        say("starting lockd, an inventory service, and fence-proxy in front of the service");
        Store::Http(inventory()?)
    };
    // lockd signs its tokens and fence-proxy lets only those through: a key made for this run.
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).context("drawing a key")?;
    let keys = e2e::keys::write_key_file(
        tmp.path(),
        "fence-keys.toml",
        &[(
            "demo",
            fencing::signed::KeyState::Active,
            Some(&fencing::signed::secret_hex(&secret)),
        )],
    );
    let mut cmd = Command::new(bin("lockd")?);
    cmd.arg("--fence-keys").arg(&keys);
    cmd.arg("--data-dir").arg(tmp.path().join("lockd")).args([
        "--listen",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ]);
    let (lockd, lockd_addr) = start(cmd, "listening")?;
    procs.0.push(lockd);
    let endpoint = format!("http://{lockd_addr}");
    let listener = match &store {
        Store::Http(service) => format!(
            "[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{service}\"\n[[http.routes]]\nmethods = [\"PUT\", \"POST\"]\npath = \"/inventory/{{sku}}\"\nresource = \"inventory:{{sku}}\"\n"
        ),
        Store::Postgres(pg) => format!(
            "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nfence_wait_ms = 1000\n",
            pg.port,
            pg.url()
        ),
    };
    let config = tmp.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\nlog_format = \"json\"\n[signing]\nkeys = \"{}\"\n{listener}",
            tmp.path().join("marks").display(),
            keys.display()
        ),
    )?;
    let mut cmd = Command::new(bin("fence-proxy")?);
    cmd.arg("--config").arg(&config);
    let listening = if postgres {
        "listening (pg)"
    } else {
        "listening (http)"
    };
    let (proxy, proxy_addr) = start(cmd, listening)?;
    procs.0.push(proxy);
    match &store {
        Store::Http(service) => println!(
            "   lockd {endpoint}, inventory http://{service}, fence-proxy http://{proxy_addr} (fences PUT {PATH} as {RESOURCE})"
        ),
        Store::Postgres(pg) => println!(
            "   lockd {endpoint}, PostgreSQL on port {}, fence-proxy on {proxy_addr} (sessions set fencing.resource = '{RESOURCE}')",
            pg.port
        ),
    }

    let mut events: Vec<Value> = Vec::new();
    say("client A (its own process) takes the lock and writes");
    let mut a = Command::new(std::env::current_exe()?)
        .args([
            if postgres { "client-pg" } else { "client" },
            &endpoint,
            &proxy_addr,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let pid = a.id() as i32;
    let mut a_out = BufReader::new(a.stdout.take().context("stdout is piped")?);
    follow(&mut a_out, Some("READY"), &mut events)?;

    say(&format!(
        "A is paused for real (SIGSTOP to pid {pid}), past its {A_TTL} lease{}",
        if postgres {
            ", inside its open transaction"
        } else {
            ""
        }
    ));
    events.push(event("info", "A", "pause", json!({})));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };

    say("client B asks for the lock; lockd grants it once A's lease has run out");
    events.push(event("invoke", "B", "acquire", json!({})));
    let b_token = acquire(&endpoint, "B", "30s", "10s")?;
    events.push(event(
        "ok",
        "B",
        "acquire",
        json!({"token": b_token.number, "ttl_ms": 30_000}),
    ));
    println!("   B: I hold {RESOURCE} with token {b_token}; A, paused, still believes it holds it");
    events.push(event(
        "invoke",
        "B",
        "write",
        json!({"token": b_token.number, "value": "b1"}),
    ));
    let ok = match &store {
        Store::Http(_) => {
            let (status, _) = write_stock(&proxy_addr, &b_token, "b1", 5)?;
            println!("   B: wrote count=5 with token {b_token}: HTTP {status}");
            status == 200
        }
        Store::Postgres(_) => {
            println!(
                "   B: UPDATE stock SET count = 5 with token {b_token} (it waits for A's open transaction, at most the fence wait)"
            );
            let r = pg_write(&proxy_addr, &b_token);
            match &r {
                Ok(()) => println!("   B: committed; PostgreSQL ended A's transaction"),
                Err(e) => println!("   B: failed: {e}"),
            }
            r.is_ok()
        }
    };
    events.push(event(
        if ok { "ok" } else { "fail" },
        "B",
        "write",
        json!({"token": b_token.number, "value": "b1"}),
    ));

    say(if postgres {
        "A is resumed (SIGCONT) and, unaware, commits its transaction"
    } else {
        "A is resumed (SIGCONT) and, unaware, writes with its old token"
    });
    events.push(event("info", "A", "resume", json!({})));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    a.stdin
        .as_mut()
        .context("stdin is piped")?
        .write_all(b"go\n")?;
    follow(&mut a_out, None, &mut events)?;
    let a_status = a.wait()?;
    if !a_status.success() {
        bail!("client A failed: {a_status}");
    }

    say("the store's final state");
    let applied: Value = match &store {
        Store::Http(service) => {
            let (_, state) = http(service, "GET", &[], "")?;
            let state: Value = serde_json::from_str(state.trim())?;
            println!("   {state}");
            state["writes"].clone()
        }
        Store::Postgres(pg) => {
            println!("   count = {}", pg.psql("SELECT count FROM stock"));
            let ids = pg.psql("SELECT id FROM applied ORDER BY id");
            println!("   applied writes: {}", ids.replace('\n', ", "));
            Value::from(ids.lines().map(str::to_string).collect::<Vec<_>>())
        }
    };
    events.push(event("ok", "demo", "read", json!({"value": applied})));

    say("checking the history");
    let history = out_dir.join("history.jsonl");
    events.sort_by_key(|e| e["time"].as_u64());
    let text: String = events.iter().map(|e| format!("{e}\n")).collect();
    std::fs::write(&history, &text)?;
    let parsed = verifier::parse(text.as_bytes())?;
    let report = verifier::check(&parsed);
    println!("{report}");
    let timeline = out_dir.join("timeline.html");
    std::fs::write(&timeline, verifier::timeline::html(&parsed, &report))?;
    println!(
        "\nhistory:  {}\ntimeline: {}",
        history.display(),
        timeline.display()
    );
    println!(
        "(check it again with: verify check {} --html {})",
        history.display(),
        timeline.display()
    );

    let refused = parsed
        .iter()
        .any(|e| e.process == "A" && e.kind == verifier::EventType::Fail);
    if !refused || !report.ok() {
        bail!("the zombie's write was not refused, or the history breaks a property");
    }
    say(if postgres {
        "A's transaction was ended and its COMMIT refused: the fencing token did its job"
    } else {
        "A's late write was refused: the fencing token did its job"
    });
    Ok(())
}
