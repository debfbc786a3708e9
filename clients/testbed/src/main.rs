//! The SDKs' test bed: every server the conformance suite (clients/conformance) needs, started
//! throwaway, described as one JSON line on stdout, and stopped when stdin closes.
//!
//! ```text
//! testbed [--no-pg]
//! ```
//!
//! What it starts (all on loopback, in one temporary directory):
//! - `lockd`: plaintext, signing tokens with the key file `keys` (so every grant carries its
//!   signed form);
//! - `pausable`: a second plaintext lockd for the scenarios that pause it (SIGSTOP);
//! - `secure`: lockd over TLS that wants a client certificate or a bearer token, with a policy
//!   of two tenants: `pay` (resources `pay/…`, a bearer token file) and `inv` (`inv/…`, a client
//!   certificate);
//! - `lossy`: a TCP forwarder to `lockd` that, when told, cuts the connection instead of
//!   passing on lockd's next answer (an answer lost on the way: the grant was made);
//! - `dead`: an endpoint nothing listens on;
//! - unless `--no-pg`: PostgreSQL with the table `conformance (k text primary key, v text)`,
//!   and fence-proxy in front of it (`pg`) and in front of a recording HTTP service (`http`),
//!   both verifying lockd's signed tokens.
//!
//! Commands, one per line on stdin, each answered by one line on stdout (`ok`, or `error: …`):
//! `pause NAME` and `resume NAME` (SIGSTOP and SIGCONT to a lockd: `lockd`, `pausable`,
//! `secure`), `drop-next-answer [N]` (arms `lossy`: it passes N answers, 0 by default, and cuts
//! the connection at the next), `cut-renewals on|off` (`lossy` cuts the connection instead of
//! passing any answer to a Renew), `wait-cuts N` (answers `ok` once `lossy` has cut N
//! connections since the last `cut-renewals`; an error after 60 s), `hold-next-call [N]`
//! (`lossy` lets N calls begin, 0 by default, then holds back the request of the next call a
//! client begins, and passes it on, without the call's cancellation, once lockd has answered
//! a later call on that connection: lockd handles a call after the client gave it up and its
//! clean-up had begun), `wait-held` and `wait-held-answered` (answer once a call is held, and
//! once lockd began its answer to the held call after it was passed on; errors after 60 s),
//! `sql STATEMENT` (psql, directly to PostgreSQL: `ok ` and the unaligned output on one line).

use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use e2e::certs::Ca;
use e2e::keys::{SECRET_B, write_key_file};
use e2e::pg::Postgres;
use e2e::upstream::Upstream;
use e2e::{FenceProxy, Lockd};
use fencing::signed::KeyState;
use serde_json::json;

/// The `pay` tenant's bearer token (its SHA-256 is in the policy).
const PAY_TOKEN: &str = "c0nf0rmance-pay-7d1e4b9a2f63c805";

fn main() {
    let with_pg = !std::env::args().any(|a| a == "--no-pg");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let keys = write_key_file(
        d,
        "fence-keys.toml",
        &[("k1", KeyState::Active, Some(SECRET_B))],
    );
    let keys_arg = keys.to_str().expect("a UTF-8 path");

    let mut lockd = Lockd::start(&d.join("lockd"), &["--fence-keys", keys_arg]);
    let mut pausable = Lockd::start(&d.join("pausable"), &[]);

    let ca = Ca::new(d, "conformance");
    let server = ca.issue(d, "lockd", &["localhost", "127.0.0.1"], false);
    let inv = ca.issue(d, "inv-worker", &["inv-worker.internal"], false);
    let token_file = d.join("pay.token");
    std::fs::write(&token_file, format!("{PAY_TOKEN}\n")).expect("writing the token file");
    let policy = d.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tenant]]\nname = \"pay\"\nprefixes = [\"pay/\"]\n[[tenant]]\nname = \"inv\"\nprefixes = [\"inv/\"]\n\
             [[identity]]\nname = \"pay-api\"\ntenant = \"pay\"\ntoken_sha256 = \"{}\"\n\
             [[identity]]\nname = \"inv-worker\"\ntenant = \"inv\"\ncert = \"DNS:inv-worker.internal\"\n",
            e2e::sha256_hex(PAY_TOKEN)
        ),
    )
    .expect("writing the policy");
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    let mut secure = Lockd::start(
        &d.join("secure"),
        &[
            "--tls-cert",
            &path(&server.cert),
            "--tls-key",
            &path(&server.key),
            "--tls-client-ca",
            &path(&ca.pem),
            "--policy",
            &path(&policy),
        ],
    );

    let cuts = Arc::new(Cuts::default());
    let lossy = lossy_forwarder(
        lockd.endpoint.trim_start_matches("http://"),
        Arc::clone(&cuts),
    );
    let dead = e2e::free_loopback_addr();

    let mut description = json!({
        "lockd": {"endpoint": lockd.endpoint, "pid": lockd.process.pid},
        "pausable": {"endpoint": pausable.endpoint, "pid": pausable.process.pid},
        "secure": {
            "endpoint": secure.endpoint,
            "ca": path(&ca.pem),
            "tenants": {
                "pay": {"prefix": "pay/", "token_file": path(&token_file)},
                "inv": {"prefix": "inv/", "cert": path(&inv.cert), "key": path(&inv.key)},
            },
        },
        "lossy": {"endpoint": format!("http://{lossy}")},
        "dead": {"endpoint": format!("http://{dead}")},
        "keys": path(&keys),
    });

    // Kept alive until stdin closes.
    let mut _servers: Option<(Postgres, Upstream, FenceProxy)> = None;
    if with_pg {
        let pg = Postgres::start();
        pg.psql("CREATE TABLE conformance (k text PRIMARY KEY, v text)");
        let upstream = Upstream::start();
        let config = format!(
            "data_dir = \"{}\"\n[signing]\nkeys = \"{keys_arg}\"\n\
             [[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nfence_wait_ms = 1000\n\
             [[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n",
            d.join("proxy-data").display(),
            pg.port,
            pg.url(),
            upstream.url()
        );
        let proxy = FenceProxy::start_with(d, &config, 1, 1);
        let (host, port) = proxy.pg[0].rsplit_once(':').expect("host:port");
        description["pg"] = json!({
            "host": host,
            "port": port.parse::<u16>().expect("a port"),
            "user": "postgres",
            "database": "postgres",
            "dsn": format!("postgresql://postgres@{}/postgres", proxy.pg[0]),
            "direct_dsn": pg.url(),
            "table": "conformance",
        });
        description["http"] = json!({"url": proxy.urls[0]});
        _servers = Some((pg, upstream, proxy));
    }

    let mut out = std::io::stdout().lock();
    writeln!(out, "{description}").expect("stdout");
    out.flush().expect("stdout");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (verb, arg) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let answer = match verb {
            "pause" | "resume" => {
                let sig = if verb == "pause" {
                    libc::SIGSTOP
                } else {
                    libc::SIGCONT
                };
                let target = match arg {
                    "lockd" => Some(&mut lockd),
                    "pausable" => Some(&mut pausable),
                    "secure" => Some(&mut secure),
                    _ => None,
                };
                match target {
                    Some(l) => {
                        l.process.signal(sig);
                        Ok(String::new())
                    }
                    None => Err(format!("no lockd named {arg:?}")),
                }
            }
            "drop-next-answer" => match arg.trim() {
                "" => {
                    cuts.armed.store(0, Ordering::SeqCst);
                    Ok(String::new())
                }
                n => match n.parse::<u32>() {
                    Ok(n) => {
                        cuts.armed.store(i64::from(n), Ordering::SeqCst);
                        Ok(String::new())
                    }
                    Err(_) => Err(format!(
                        "drop-next-answer takes a count of answers to pass, not {n:?}"
                    )),
                },
            },
            "cut-renewals" => match arg.trim() {
                "on" | "off" => {
                    // `wait-cuts` counts from here.
                    *cuts.made.lock().unwrap() = 0;
                    cuts.renewals.store(arg.trim() == "on", Ordering::SeqCst);
                    Ok(String::new())
                }
                other => Err(format!("cut-renewals takes on or off, not {other:?}")),
            },
            "wait-cuts" => match arg.trim().parse::<u64>() {
                Ok(want) => {
                    let made = cuts.made.lock().unwrap();
                    let (made, _) = cuts
                        .cut
                        .wait_timeout_while(made, std::time::Duration::from_secs(60), |n| *n < want)
                        .unwrap();
                    if *made >= want {
                        Ok(String::new())
                    } else {
                        Err(format!("{made} cuts in 60 s, not {want}"))
                    }
                }
                Err(_) => Err(format!("wait-cuts takes a count, not {arg:?}")),
            },
            "hold-next-call" => match arg.trim() {
                "" => Ok(0),
                n => n.parse::<u32>().map_err(|_| {
                    format!("hold-next-call takes a count of calls to pass first, not {n:?}")
                }),
            }
            .map(|skip| {
                *cuts.hold.lock().unwrap() = Hold {
                    armed: true,
                    skip,
                    ..Hold::default()
                };
                String::new()
            }),
            "wait-held" => cuts.wait_hold(|h| h.stream.is_some(), "no call held"),
            "wait-held-answered" => cuts.wait_hold(
                |h| h.answered,
                "lockd has not answered the held call after passing it on (was a later call on \
                 its connection answered?)",
            ),
            "sql" => match &_servers {
                Some((pg, _, _)) => Ok(pg.psql(arg).replace('\n', " ")),
                None => Err("started with --no-pg".to_string()),
            },
            "" => continue,
            other => Err(format!("unknown command {other:?}")),
        };
        match answer {
            Ok(text) if text.is_empty() => writeln!(out, "ok"),
            Ok(text) => writeln!(out, "ok {text}"),
            Err(e) => writeln!(out, "error: {e}"),
        }
        .and_then(|()| out.flush())
        .expect("stdout");
    }
    // stdin closed: a paused lockd is resumed so that it can be stopped.
    for l in [&mut lockd, &mut pausable, &mut secure] {
        l.process.signal(libc::SIGCONT);
    }
}

/// What `lossy` cuts, and how often it has.
struct Cuts {
    /// `drop-next-answer N`: disarmed below 0; armed, the answers to pass before the cut.
    armed: AtomicI64,
    /// `cut-renewals on`: every answer to a Renew is cut (no other call's).
    renewals: AtomicBool,
    /// Connections cut since the last `cut-renewals`, and its change (`wait-cuts`).
    made: Mutex<u64>,
    cut: Condvar,
    /// `hold-next-call`, and its changes.
    hold: Mutex<Hold>,
    held: Condvar,
}

/// A call whose request `lossy` holds back (`hold-next-call`).
#[derive(Default)]
struct Hold {
    /// The next call a client begins is held (after `skip` more have begun).
    armed: bool,
    skip: u32,
    /// The held call: its connection's number and its stream.
    stream: Option<(u64, u32)>,
    /// lockd began its answer to the held call, after the call was passed on.
    answered: bool,
}

impl Cuts {
    /// Answers once `done` holds of the hold (bounded: an error after 60 s).
    fn wait_hold(&self, done: impl Fn(&Hold) -> bool, otherwise: &str) -> Result<String, String> {
        let hold = self.hold.lock().unwrap();
        let (hold, _) = self
            .held
            .wait_timeout_while(hold, std::time::Duration::from_secs(60), |h| !done(h))
            .unwrap();
        if done(&hold) {
            Ok(String::new())
        } else {
            Err(format!("{otherwise} in 60 s"))
        }
    }

    fn hold_changed(&self, change: impl FnOnce(&mut Hold)) {
        change(&mut self.hold.lock().unwrap());
        self.held.notify_all();
    }
}

/// One connection through `lossy`: what the two directions share.
struct Conn {
    number: u64,
    /// lockd's side, written frame by frame by either direction.
    to_server: Mutex<TcpStream>,
    /// The held call's stream and its frames not passed on yet; `None` once passed on.
    held: Mutex<Option<(u32, Vec<u8>)>>,
}

impl Default for Cuts {
    fn default() -> Cuts {
        Cuts {
            armed: AtomicI64::new(-1),
            renewals: AtomicBool::new(false),
            made: Mutex::new(0),
            cut: Condvar::new(),
            hold: Mutex::new(Hold::default()),
            held: Condvar::new(),
        }
    }
}

/// A TCP forwarder to `target` on a free loopback port (returned). Plaintext HTTP/2 (h2c):
/// lockd's side is read frame by frame. While `cuts.armed` (0 or more), each frame that begins
/// an answer (the first HEADERS on a stream) counts it down, and the one that finds it at 0 is
/// not passed on: the client's connection is cut instead. While `cuts.renewals`, an answer is
/// held back until its message shows what it answers, and a Renew's is cut.
fn lossy_forwarder(target: &str, cuts: Arc<Cuts>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the forwarder");
    let addr = listener.local_addr().expect("its address").to_string();
    let target = target.to_string();
    std::thread::spawn(move || {
        for (number, client) in (0u64..).zip(listener.incoming()) {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                (Ok(c), Ok(s)) => (c, s),
                _ => continue,
            };
            let conn = Arc::new(Conn {
                number,
                to_server: Mutex::new(s2),
                held: Mutex::new(None),
            });
            let (cuts2, conn2) = (Arc::clone(&cuts), Arc::clone(&conn));
            std::thread::spawn(move || requests(c2, &conn2, &cuts2));
            let cuts = Arc::clone(&cuts);
            std::thread::spawn(move || answers(server, client, &conn, &cuts));
        }
    });
    addr
}

/// One HTTP/2 frame: its 9-byte head and its payload, or `None` at the end of the stream.
fn frame(from: &mut TcpStream) -> Option<([u8; 9], Vec<u8>)> {
    let mut head = [0u8; 9];
    from.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    from.read_exact(&mut payload).ok()?;
    Some((head, payload))
}

fn stream_of(head: &[u8; 9]) -> u32 {
    u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;

/// The client's frames to lockd, one at a time, until either side closes. The call a client
/// begins while `hold-next-call` is armed is held: its HEADERS pass (header compression
/// depends on their order), its DATA frames wait in `conn.held`, and its cancellation
/// (RST_STREAM) is dropped, so that lockd handles the call to its end once it is passed on.
fn requests(mut client: TcpStream, conn: &Conn, cuts: &Cuts) {
    let mut preface = [0u8; 24];
    let mut held_stream = None;
    let mut last_stream = 0;
    let passed = client.read_exact(&mut preface).is_ok()
        && conn.to_server.lock().unwrap().write_all(&preface).is_ok();
    while passed && let Some((head, payload)) = frame(&mut client) {
        let stream = stream_of(&head);
        if head[3] == HEADERS && stream > last_stream {
            last_stream = stream;
            let mut hold = cuts.hold.lock().unwrap();
            if hold.armed && hold.skip > 0 {
                hold.skip -= 1;
            } else if std::mem::take(&mut hold.armed) {
                hold.stream = Some((conn.number, stream));
                held_stream = Some(stream);
                *conn.held.lock().unwrap() = Some((stream, Vec::new()));
                cuts.held.notify_all();
            }
        }
        if held_stream == Some(stream) && head[3] == RST_STREAM {
            continue;
        }
        // The held frames and these go to lockd in order: `answers` passes the held ones on
        // under the same lock.
        let mut held = conn.held.lock().unwrap();
        if let Some((s, frames)) = held.as_mut()
            && *s == stream
            && head[3] == DATA
        {
            frames.extend_from_slice(&head);
            frames.extend_from_slice(&payload);
            continue;
        }
        let mut server = conn.to_server.lock().unwrap();
        if server
            .write_all(&head)
            .and_then(|()| server.write_all(&payload))
            .is_err()
        {
            break;
        }
    }
    let _ = conn
        .to_server
        .lock()
        .unwrap()
        .shutdown(std::net::Shutdown::Both);
}

/// lockd's frames to the client, one at a time, until a cut. The first answer to another call
/// on a connection whose call is held passes the held call on; lockd's answer to the held call
/// marks the hold answered.
fn answers(mut server: TcpStream, mut client: TcpStream, conn: &Conn, cuts: &Cuts) {
    const END_STREAM: u8 = 0x1;
    // Streams whose answer has begun: their trailers (HEADERS again) are not a new answer.
    let mut begun = std::collections::HashSet::new();
    // An answer held back until its first message (the stream, and the frames since, in
    // order: header compression depends on it).
    let mut held: Option<(u32, Vec<u8>)> = None;
    let cut = loop {
        let Some((head, payload)) = frame(&mut server) else {
            break false;
        };
        let stream = stream_of(&head);
        if head[3] == HEADERS && stream != 0 && !begun.contains(&stream) {
            let mut held = conn.held.lock().unwrap();
            match held.as_ref().map(|(s, _)| *s) {
                Some(s) if s != stream => {
                    let (_, frames) = held.take().expect("matched");
                    if conn.to_server.lock().unwrap().write_all(&frames).is_err() {
                        break false;
                    }
                }
                _ => {}
            }
            // lockd's answer to the held call once it has the request (an answer before, to
            // headers alone, is the call's deadline passing: it was never handled).
            let delivered = held.is_none();
            drop(held);
            let this = Some((conn.number, stream));
            if delivered && cuts.hold.lock().unwrap().stream == this {
                cuts.hold_changed(|h| h.answered = true);
            }
        }
        if head[3] == HEADERS && stream != 0 && begun.insert(stream) {
            let left = cuts
                .armed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n >= 0).then(|| n - 1)
                });
            if left == Ok(0) {
                break true;
            }
            if held.is_none() && head[4] & END_STREAM == 0 && cuts.renewals.load(Ordering::SeqCst) {
                held = Some((stream, Vec::new()));
            }
        }
        if let Some((held_stream, frames)) = &mut held {
            frames.extend_from_slice(&head);
            frames.extend_from_slice(&payload);
            if head[3] != DATA || stream != *held_stream {
                continue;
            }
            // RenewResponse: field 1 (expires_at_ms) a varint of several bytes, after gRPC's
            // five-byte prefix. Release and Describe answers begin 0x08 0x01 at most.
            let message = payload.get(5..).unwrap_or_default();
            if message.len() >= 2
                && message[0] == 0x08
                && message[1] & 0x80 != 0
                && cuts.renewals.load(Ordering::SeqCst)
            {
                break true;
            }
            let frames = std::mem::take(frames);
            held = None;
            if client.write_all(&frames).is_err() {
                break false;
            }
            continue;
        }
        if client
            .write_all(&head)
            .and_then(|()| client.write_all(&payload))
            .is_err()
        {
            break false;
        }
    };
    if cut {
        *cuts.made.lock().unwrap() += 1;
        cuts.cut.notify_all();
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = server.shutdown(std::net::Shutdown::Both);
}
