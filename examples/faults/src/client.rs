//! A client of the fault run, as its own process (so that SIGSTOP pauses it for real).
//!
//! Loops until told to stop: picks a counter at random (from its seed), takes its lock from
//! lockd (no renewal: the work is short unless a fault intervenes), reads the counter and
//! writes it plus one with the token, through fence-proxy (or straight to the store with
//! `--no-fencing`), then releases. It never checks whether its lease is still valid before
//! writing: a real client's check would be racy anyway, and the fence is what is under test.
//!
//! Talks to the runner over its standard streams: stdout carries `EVENT {json}` lines for the
//! history and `PAUSEPOINT` when it stopped before a write as asked; stdin carries `pause` (stop
//! before the next write and wait), `go` (carry on) and `stop` (finish this round and exit).

use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lockd_client::{AcquireOptions, Acquired, Client, ClientError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::Mode;

/// Longest a single store operation may take before its outcome is given up as unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long)]
    pub id: u32,
    #[arg(long)]
    pub seed: u64,
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// lockd's endpoint (through the fault proxy).
    #[arg(long)]
    pub lockd: String,
    /// The store's address, host:port (through the fault proxy).
    #[arg(long)]
    pub store: String,
    #[arg(long)]
    pub resources: u32,
    #[arg(long)]
    pub ttl_ms: u64,
    /// lockd runs over etcd: a release it acknowledges is in etcd (recorded `durable`), and
    /// one acquire in three is a try-lock, whose refusal names the holder's token, so that a
    /// lost release would show.
    #[arg(long)]
    pub ha: bool,
}

enum Command {
    Pause,
    Go,
    Stop,
}

/// How a write ended, for the history.
enum Outcome {
    /// Applied, at this position in the counter's own order.
    Ok(u64),
    /// Certainly not applied (the reason).
    Fail(String),
    /// Unknown (the reason).
    Info(String),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(main_loop(args))
}

async fn main_loop(args: Args) -> anyhow::Result<()> {
    let name = format!("c{}", args.id);
    let mut rng = StdRng::seed_from_u64(args.seed.wrapping_mul(1000).wrapping_add(args.id.into()));
    let lockd = Client::connect(&args.lockd).context("lockd endpoint")?;
    let mut store = Store::new(&args);
    let (tx, mut commands) = mpsc::unbounded_channel();
    // Commands from the runner, read by a thread (a blocking read of stdin).
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            let c = match line.trim() {
                "pause" => Command::Pause,
                "go" => Command::Go,
                _ => Command::Stop,
            };
            if tx.send(c).is_err() {
                return;
            }
        }
        // The runner went away: stop.
        let _ = tx.send(Command::Stop);
    });
    let ttl = Duration::from_millis(args.ttl_ms);
    let mut pause_requested = false;
    for round in 1.. {
        // Commands that arrived since the last round.
        loop {
            match commands.try_recv() {
                Ok(Command::Pause) => pause_requested = true,
                Ok(Command::Go) => {}
                Ok(Command::Stop) | Err(mpsc::error::TryRecvError::Disconnected) => return Ok(()),
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        let resource = format!("counter:{}", rng.random_range(1..=args.resources));
        let event = |kind: &str, f: &str, extra: Value| {
            println!(
                "EVENT {}",
                e2e::history_event(kind, &name, f, &resource, extra)
            );
        };

        event("invoke", "acquire", json!({}));
        let try_lock = args.ha && rng.random_ratio(1, 3);
        let opts = AcquireOptions {
            ttl: Some(ttl),
            wait: if try_lock {
                Duration::ZERO
            } else {
                Duration::from_secs(3)
            },
            holder: name.clone(),
            request_id: None,
            owner: None,
            permits: 0,
            mode: lockd_client::Mode::Exclusive,
        };
        let lease = match lockd.acquire(&resource, opts).await {
            Ok(Acquired::Granted(guard)) => {
                // No renewal: the lease runs its TTL unless released.
                let lease = guard.detach().await;
                event(
                    "ok",
                    "acquire",
                    json!({"token": lease.token, "ttl_ms": args.ttl_ms}),
                );
                lease
            }
            Ok(Acquired::NotGranted(why)) => {
                let mut extra = json!({"note": why.to_string()});
                if let Some(t) = why.token {
                    extra["current_token"] = json!(t);
                }
                event("fail", "acquire", extra);
                continue;
            }
            Err(e @ ClientError::Unavailable(_)) => {
                // Perhaps granted, perhaps not: it may hold the lock until the TTL runs out.
                event("info", "acquire", json!({"note": e.to_string()}));
                continue;
            }
            Err(e) => {
                event("fail", "acquire", json!({"note": e.to_string()}));
                continue;
            }
        };

        if pause_requested {
            pause_requested = false;
            println!("PAUSEPOINT");
            loop {
                match commands.recv().await {
                    Some(Command::Go) => break,
                    Some(Command::Pause) => {}
                    // Still write: a stop must not prevent the zombie write being made.
                    Some(Command::Stop) | None => break,
                }
            }
        }

        let write_id = format!("{name}.{round}");
        let token = lease.token;
        // What the writes present: the token lockd signed for this resource.
        let fence_token = lease.fence_token();
        event(
            "invoke",
            "write",
            json!({"token": token, "value": write_id}),
        );
        match store
            .read_modify_write(&resource, token, &fence_token, &write_id)
            .await
        {
            Outcome::Ok(index) => event(
                "ok",
                "write",
                json!({"token": token, "value": write_id, "index": index}),
            ),
            Outcome::Fail(why) => event(
                "fail",
                "write",
                json!({"token": token, "value": write_id, "note": why}),
            ),
            Outcome::Info(why) => event(
                "info",
                "write",
                json!({"token": token, "value": write_id, "note": why}),
            ),
        }

        event("invoke", "release", json!({"token": token}));
        match lockd.release(&resource, &lease.lease_id).await {
            Ok(true) if args.ha => event("ok", "release", json!({"token": token, "durable": true})),
            Ok(true) => event("ok", "release", json!({"token": token})),
            Ok(false) => event(
                "fail",
                "release",
                json!({"token": token, "note": "the lease was no longer current"}),
            ),
            Err(e @ ClientError::Unavailable(_)) => event(
                "info",
                "release",
                json!({"token": token, "note": e.to_string()}),
            ),
            Err(e) => event(
                "fail",
                "release",
                json!({"token": token, "note": e.to_string()}),
            ),
        }
    }
    Ok(())
}

/// The store a client writes to: over HTTP, or a PostgreSQL session.
enum Store {
    Http {
        base: String,
        client: HttpClient<HttpConnector, Full<Bytes>>,
    },
    Pg {
        conninfo: String,
        session: Option<tokio_postgres::Client>,
    },
}

impl Store {
    fn new(args: &Args) -> Store {
        match args.mode {
            Mode::Http => Store::Http {
                base: format!("http://{}", args.store),
                client: HttpClient::builder(TokioExecutor::new()).build_http(),
            },
            Mode::Pg => {
                let (host, port) = args.store.rsplit_once(':').unwrap_or((&args.store, "5432"));
                Store::Pg {
                    conninfo: format!(
                        "host={host} port={port} user=postgres dbname=postgres connect_timeout=5"
                    ),
                    session: None,
                }
            }
        }
    }

    /// `token`: the number (the history's, and the log row's); `fence`: what the write
    /// presents (the signed form).
    async fn read_modify_write(
        &mut self,
        resource: &str,
        token: u64,
        fence: &str,
        id: &str,
    ) -> Outcome {
        match self {
            Store::Http { base, client } => http_rmw(client, base, resource, fence, id).await,
            Store::Pg { conninfo, session } => {
                let outcome = pg_rmw(conninfo, session, resource, token, fence, id).await;
                let broken = match &outcome {
                    Outcome::Ok(_) => false,
                    Outcome::Fail(why) => !why.starts_with("SQLSTATE"),
                    Outcome::Info(_) => true,
                };
                if broken
                    || session
                        .as_ref()
                        .is_some_and(tokio_postgres::Client::is_closed)
                {
                    // The session may be closed or mid-transaction: start afresh next time.
                    *session = None;
                }
                outcome
            }
        }
    }
}

async fn http_rmw(
    client: &HttpClient<HttpConnector, Full<Bytes>>,
    base: &str,
    resource: &str,
    fence: &str,
    id: &str,
) -> Outcome {
    let name = resource.strip_prefix("counter:").unwrap_or(resource);
    let url = format!("{base}/counter/{name}");
    let get = hyper::Request::get(&url)
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let value: i64 = match send(client, get).await {
        Ok(Some((status, text))) if status.is_success() => match text.trim().parse() {
            Ok(v) => v,
            Err(_) => return Outcome::Fail(format!("read: not a number: {text:?}")),
        },
        // Nothing was written yet.
        Ok(Some((status, text))) => return Outcome::Fail(format!("read: HTTP {status}: {text}")),
        Err(why) => return Outcome::Fail(format!("read failed: {why}")),
        Ok(None) => return Outcome::Fail("read timed out".to_string()),
    };
    let put = hyper::Request::put(&url)
        .header("Fencing-Resource", resource)
        .header("Fencing-Token", fence)
        .header("X-Write-Id", id)
        .body(Full::new(Bytes::from((value + 1).to_string())))
        .expect("a valid request");
    match send(client, put).await {
        Ok(Some((status, body))) if status.is_success() => match body.trim().parse() {
            Ok(index) => Outcome::Ok(index),
            Err(_) => Outcome::Info(format!("HTTP {status} with an unreadable body {body:?}")),
        },
        // fence-proxy's own refusals: nothing reached the store.
        Ok(Some((status, body))) if [400, 403, 409, 428].contains(&status.as_u16()) => {
            Outcome::Fail(format!("HTTP {status}: {}", body.trim()))
        }
        // 502, 504, anything else: the store may or may not have applied it.
        Ok(Some((status, body))) => Outcome::Info(format!("HTTP {status}: {}", body.trim())),
        Err(why) => Outcome::Info(why),
        Ok(None) => Outcome::Info("no answer in time".to_string()),
    }
}

/// One request and its whole answer: `Ok(None)` when none came within [`OP_TIMEOUT`].
async fn send(
    client: &HttpClient<HttpConnector, Full<Bytes>>,
    req: hyper::Request<Full<Bytes>>,
) -> Result<Option<(hyper::StatusCode, String)>, String> {
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok((
            status,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        ))
    };
    match tokio::time::timeout(OP_TIMEOUT, exchange).await {
        Ok(answer) => answer.map(Some),
        Err(_) => Ok(None),
    }
}

/// How a client declares its token to the PostgreSQL mode: each write takes the next way in
/// turn (by its token), so that a run mixes them all. Every way ends in the same settings; the
/// proxy must fence them alike (invariant 9).
#[derive(Clone, Copy, Debug)]
enum Declare {
    /// `SET fencing.resource = ...; SET fencing.token = ...; BEGIN` in one simple Query.
    Set,
    /// `SELECT set_config($1, $2, false)` with bound values (extended protocol), then `BEGIN`.
    BoundSetConfig,
    /// A new connection with `options='-c fencing.resource=... -c fencing.token=...'`.
    StartupOptions,
    /// `BEGIN`, then a helper function of the database (`fencing_declare`) inside the writing
    /// transaction.
    HelperInTransaction,
}

impl Declare {
    fn for_token(token: u64) -> Declare {
        match token % 4 {
            0 => Declare::Set,
            1 => Declare::BoundSetConfig,
            2 => Declare::StartupOptions,
            _ => Declare::HelperInTransaction,
        }
    }
}

/// One transaction: read the counter, write it plus one, log the write. Outcomes: a
/// transaction that failed before its COMMIT was sent did not commit (`Fail`); an error or
/// silence after COMMIT was sent is `Info`.
async fn pg_rmw(
    conninfo: &str,
    session: &mut Option<tokio_postgres::Client>,
    resource: &str,
    token: u64,
    fence: &str,
    id: &str,
) -> Outcome {
    let why = |e: tokio_postgres::Error| match e.as_db_error() {
        Some(d) => format!("SQLSTATE {}: {}", d.code().code(), d.message()),
        None => e.to_string(),
    };
    let way = Declare::for_token(token);
    let conninfo = match way {
        Declare::StartupOptions => {
            *session = None;
            format!("{conninfo} options='-c fencing.resource={resource} -c fencing.token={fence}'")
        }
        _ => conninfo.to_string(),
    };
    if session.is_none() {
        match tokio::time::timeout(
            OP_TIMEOUT,
            tokio_postgres::connect(&conninfo, tokio_postgres::NoTls),
        )
        .await
        {
            Ok(Ok((client, connection))) => {
                tokio::spawn(connection);
                *session = Some(client);
            }
            Ok(Err(e)) => return Outcome::Fail(format!("connect: {}", why(e))),
            Err(_) => return Outcome::Fail("connect timed out".to_string()),
        }
    }
    let db = session.as_ref().expect("connected just above");
    let t = fence.to_string();
    let before_commit = async {
        match way {
            // The resource and token are ours (`counter:N`, and digits, a key id and hex), safe
            // to quote as literals.
            Declare::Set => {
                db.batch_execute(&format!(
                    "SET fencing.resource = '{resource}'; SET fencing.token = '{fence}'; BEGIN"
                ))
                .await?
            }
            Declare::BoundSetConfig => {
                db.execute(
                    "SELECT set_config('fencing.resource', $1, false), set_config('fencing.token', $2, false)",
                    &[&resource, &t],
                )
                .await?;
                db.batch_execute("BEGIN").await?;
            }
            Declare::StartupOptions => db.batch_execute("BEGIN").await?,
            Declare::HelperInTransaction => {
                db.batch_execute("BEGIN").await?;
                db.execute("SELECT fencing_declare($1, $2)", &[&resource, &t])
                    .await?;
            }
        }
        let value: i64 = db
            .query_one(
                "SELECT value FROM counters WHERE resource = $1",
                &[&resource],
            )
            .await?
            .get(0);
        let n: i64 = db
            .query_one(
                "UPDATE counters SET value = $2, n = n + 1 WHERE resource = $1 RETURNING n",
                &[&resource, &(value + 1)],
            )
            .await?
            .get(0);
        db.execute(
            "INSERT INTO applied (resource, id, token, n) VALUES ($1, $2, $3, $4)",
            &[&resource, &id, &(token as i64), &n],
        )
        .await?;
        Ok::<i64, tokio_postgres::Error>(n)
    };
    let n = match tokio::time::timeout(OP_TIMEOUT, before_commit).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            let w = why(e);
            if w.starts_with("SQLSTATE") {
                // The session is usable; leave the failed transaction.
                let _ = tokio::time::timeout(OP_TIMEOUT, db.batch_execute("ROLLBACK")).await;
            }
            return Outcome::Fail(w);
        }
        Err(_) => return Outcome::Fail("timed out before COMMIT".to_string()),
    };
    match tokio::time::timeout(OP_TIMEOUT, db.batch_execute("COMMIT")).await {
        Ok(Ok(())) => Outcome::Ok(n as u64),
        // An error answering COMMIT (a stale token at the commit point, or FN003: the
        // transaction was ended for a newer token) means it did not commit.
        Ok(Err(e)) if e.as_db_error().is_some() => Outcome::Fail(why(e)),
        Ok(Err(e)) => Outcome::Info(format!("COMMIT: {}", why(e))),
        Err(_) => Outcome::Info("COMMIT: no answer in time".to_string()),
    }
}
