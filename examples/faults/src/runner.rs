//! The runner: starts the system, the clients and the fault proxies, injects the faults of the
//! seed one after another, stops the clients, reads the store's final state, and checks the
//! history.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use e2e::pg::Postgres;
use e2e::{FenceProxy, Lockd, free_loopback_addr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::faultproxy::FaultProxy;
use crate::ha::Ha;
use crate::store::Counters;
use crate::{Backend, Cli, Fault, Mode};

/// What a client process said.
enum Msg {
    Event(Value),
    PausePoint,
    Exit,
}

struct ClientProc {
    name: String,
    pid: i32,
    child: std::process::Child,
    stdin: ChildStdin,
    exited: bool,
}

/// The runner's view of the run, kept up to date from the clients' messages.
struct World {
    clients: Vec<ClientProc>,
    inbox: Receiver<(usize, Msg)>,
    events: Vec<Value>,
    /// The lease each client believes it holds (resource, token).
    holding: Vec<Option<(String, u64)>>,
    /// The highest token of an acknowledged write, per resource.
    highest_ok: HashMap<String, u64>,
    /// The client asked to stop before its next write, and whether it has.
    expecting_point: Option<usize>,
    at_point: bool,
}

impl World {
    fn handle(&mut self, i: usize, msg: Msg) {
        match msg {
            Msg::Event(e) => {
                let res = e["resource"].as_str().unwrap_or_default().to_string();
                let token = e["token"].as_u64();
                match (e["type"].as_str(), e["f"].as_str()) {
                    (Some("ok"), Some("acquire")) => {
                        self.holding[i] = token.map(|t| (res, t));
                    }
                    (_, Some("acquire")) | (Some("invoke"), Some("release")) => {
                        self.holding[i] = None;
                    }
                    (Some("ok"), Some("write")) => {
                        let best = self.highest_ok.entry(res).or_default();
                        *best = (*best).max(token.unwrap_or(0));
                    }
                    _ => {}
                }
                self.events.push(e);
            }
            Msg::PausePoint => {
                if self.expecting_point == Some(i) {
                    self.at_point = true;
                } else {
                    // Asked earlier and given up on: let it carry on.
                    self.send(i, "go");
                }
            }
            Msg::Exit => self.clients[i].exited = true,
        }
    }

    /// Takes in the clients' messages until `done` says so or `deadline` passes; returns
    /// whether `done` said so.
    fn pump_until(&mut self, deadline: Instant, done: impl Fn(&World) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.inbox.recv_timeout(left) {
                Ok((i, msg)) => self.handle(i, msg),
                Err(RecvTimeoutError::Timeout) => return done(self),
                Err(RecvTimeoutError::Disconnected) => return done(self),
            }
        }
    }

    /// Lets the run go on for `d` (the faults' pacing and durations).
    fn run_for(&mut self, d: Duration) {
        self.pump_until(Instant::now() + d, |_| false);
    }

    fn send(&mut self, i: usize, line: &str) {
        // A client that exited cannot read; that is fine.
        let _ = writeln!(self.clients[i].stdin, "{line}");
    }

    fn live(&self) -> Vec<usize> {
        (0..self.clients.len())
            .filter(|&i| !self.clients[i].exited)
            .collect()
    }

    fn record(&mut self, i: usize, f: &str) {
        let resource = self.holding[i]
            .as_ref()
            .map_or("-".to_string(), |(r, _)| r.clone());
        let e = e2e::history_event("info", &self.clients[i].name, f, &resource, json!({}));
        self.events.push(e);
    }
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child, which is not reaped before the run ends.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// lockd: one on its embedded store, or instances over etcd.
enum Lockds {
    One {
        lockd: Lockd,
        dir: std::path::PathBuf,
        addr: String,
    },
    Ha(Ha),
}

/// The store the clients protect.
enum Store {
    Http(Arc<Counters>, std::net::SocketAddr),
    Pg(Postgres),
}

fn proxy_config(store: &Store, listen: &str, data_dir: &Path, keys: &Path) -> String {
    let head = format!(
        "data_dir = \"{}\"\n[signing]\nkeys = \"{}\"\n",
        data_dir.display(),
        keys.display()
    );
    match store {
        Store::Http(_, addr) => format!(
            "{head}[fence]\nbarrier_wait_ms = 2000\n[[http]]\nlisten = \"{listen}\"\nupstream = \"http://{addr}\"\n"
        ),
        Store::Pg(pg) => format!(
            "{head}[[pg]]\nlisten = \"{listen}\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nfence_wait_ms = 500\n",
            pg.port,
            pg.url()
        ),
    }
}

fn start_proxy(dir: &Path, config: &str, mode: Mode) -> FenceProxy {
    match mode {
        Mode::Http => FenceProxy::start_with(dir, config, 1, 0),
        Mode::Pg => FenceProxy::start_with(dir, config, 0, 1),
    }
}

pub fn run(cli: &Cli) -> anyhow::Result<bool> {
    let seed = cli.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let kinds: Vec<Fault> = if cli.faults.is_empty() {
        let mut all = vec![
            Fault::Pause,
            Fault::Lockd,
            Fault::Proxy,
            Fault::Delay,
            Fault::Cut,
        ];
        if cli.mode == Mode::Pg {
            all.push(Fault::Postgres);
        }
        if cli.backend == Backend::Etcd {
            all.extend(Fault::HA);
        }
        all
    } else {
        let mut k = cli.faults.clone();
        k.sort();
        k.dedup();
        k
    };
    if kinds.contains(&Fault::Postgres) && cli.mode != Mode::Pg {
        bail!("--faults postgres needs --mode pg");
    }
    if let Some(k) = kinds.iter().find(|k| k.needs_etcd())
        && cli.backend != Backend::Etcd
    {
        bail!("--faults {} needs --backend etcd", fault_name(*k));
    }
    let ttl = Duration::from_millis(cli.ttl_ms);
    let replay = replay_command(cli, seed, &kinds);
    println!(
        "faults: mode {:?}, backend {}, seed {seed}, {} clients, {} counters, TTL {} ms, {} faults from {:?}, fencing {}",
        cli.mode,
        match cli.backend {
            Backend::Embedded => "embedded".to_string(),
            Backend::Etcd => format!(
                "etcd (3 members, {} lockd instances, leadership TTL {} ms)",
                cli.lockds, cli.leader_ttl_ms
            ),
        },
        cli.clients,
        cli.resources,
        cli.ttl_ms,
        cli.fault_count,
        kinds,
        if cli.no_fencing {
            "OFF (writes bypass fence-proxy)"
        } else {
            "on"
        }
    );

    let tmp = tempfile::tempdir()?;
    let out_dir = cli.out.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("faults-{seed}-{}", std::process::id()))
    });
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    // The store, lockd and fence-proxy.
    let mut store = match cli.mode {
        Mode::Http => {
            let (counters, addr) = rt.block_on(Counters::start())?;
            Store::Http(counters, addr)
        }
        Mode::Pg => {
            let pg = Postgres::start();
            let rows: Vec<String> = (1..=cli.resources)
                .map(|k| format!("('counter:{k}', 0, 0)"))
                .collect();
            pg.psql(&format!(
                "CREATE TABLE counters (resource text PRIMARY KEY, value bigint NOT NULL, n bigint NOT NULL);
                 CREATE TABLE applied (resource text NOT NULL, id text PRIMARY KEY, token bigint NOT NULL, n bigint NOT NULL);
                 CREATE FUNCTION fencing_declare(r text, t text) RETURNS void LANGUAGE sql AS
                   $$ SELECT set_config('fencing.resource', r, false), set_config('fencing.token', t, false) $$;
                 INSERT INTO counters VALUES {}",
                rows.join(", ")
            ));
            Store::Pg(pg)
        }
    };
    // lockd signs every token and fence-proxy lets only signed ones through, with a key made
    // for this run.
    let keys = e2e::keys::write_key_file(
        tmp.path(),
        "fence-keys.toml",
        &[(
            "faults",
            fencing::signed::KeyState::Active,
            Some(&fencing::signed::secret_hex(&rand::random())),
        )],
    );
    let keys_arg = keys.to_str().context("a UTF-8 temporary path")?.to_string();
    let lockd_args = ["--fence-keys", keys_arg.as_str()];
    let mut lockds = match cli.backend {
        Backend::Embedded => {
            let dir = tmp.path().join("lockd");
            let addr = free_loopback_addr();
            let lockd = Lockd::start_on(&dir, &addr, &lockd_args);
            Lockds::One { lockd, dir, addr }
        }
        Backend::Etcd => Lockds::Ha(Ha::start(
            &rt,
            tmp.path(),
            cli.lockds as usize,
            Duration::from_millis(cli.leader_ttl_ms),
            &lockd_args,
            kinds.contains(&Fault::Clock),
        )?),
    };
    let lockd_addrs = match &lockds {
        Lockds::One { addr, .. } => vec![addr.clone()],
        Lockds::Ha(ha) => ha.addrs(),
    };
    let proxy_dir = tmp.path().join("proxy");
    std::fs::create_dir_all(&proxy_dir)?;
    let proxy_listen = free_loopback_addr();
    let config = proxy_config(&store, &proxy_listen, &tmp.path().join("marks"), &keys);
    let mut proxy = start_proxy(&proxy_dir, &config, cli.mode);

    // The clients' paths, through fault proxies.
    let store_target = match (&store, cli.no_fencing) {
        (_, false) => proxy_listen.clone(),
        (Store::Http(_, addr), true) => addr.to_string(),
        (Store::Pg(pg), true) => format!("127.0.0.1:{}", pg.port),
    };
    let to_lockd = lockd_addrs
        .iter()
        .map(|a| rt.block_on(FaultProxy::start(a.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let to_store = rt.block_on(FaultProxy::start(store_target))?;
    let mut paths: Vec<(String, &FaultProxy)> = to_lockd
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let name = if to_lockd.len() == 1 {
                "lockd".to_string()
            } else {
                format!("lockd {i}")
            };
            (name, p)
        })
        .collect();
    paths.push(("store".to_string(), &to_store));

    let (tx, inbox) = channel();
    let mut clients = Vec::new();
    for id in 1..=cli.clients {
        clients.push(spawn_client(
            cli,
            seed,
            id,
            &to_lockd,
            &to_store,
            tx.clone(),
        )?);
    }
    drop(tx);
    let mut world = World {
        holding: vec![None; clients.len()],
        clients,
        inbox,
        events: Vec::new(),
        highest_ok: HashMap::new(),
        expecting_point: None,
        at_point: false,
    };

    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for n in 1..=cli.fault_count {
        let gap = Duration::from_millis(rng.random_range(100..=500));
        world.run_for(gap);
        let fault = kinds[rng.random_range(0..kinds.len())];
        let what = match fault {
            Fault::Pause => {
                let live = world.live();
                if live.is_empty() {
                    bail!("every client has exited; see their errors above");
                }
                let v = live[rng.random_range(0..live.len())];
                let at_write = rng.random_bool(0.5);
                pause(&mut world, v, at_write, ttl, &mut counts)
            }
            Fault::Lockd => match &mut lockds {
                Lockds::One { lockd, dir, addr } => {
                    lockd.kill9();
                    *lockd = Lockd::start_on(dir, addr, &lockd_args);
                    "lockd: kill -9, restarted".to_string()
                }
                Lockds::Ha(ha) => ha.kill(true, &mut rng)?,
            },
            Fault::Proxy => {
                proxy.kill9();
                proxy = start_proxy(&proxy_dir, &config, cli.mode);
                "fence-proxy: kill -9, restarted".to_string()
            }
            Fault::Postgres => {
                let Store::Pg(pg) = &mut store else {
                    unreachable!("checked: postgres faults need --mode pg")
                };
                pg.restart();
                "PostgreSQL: crashed (immediate shutdown), restarted".to_string()
            }
            Fault::Delay => {
                let (name, path) = &paths[rng.random_range(0..paths.len())];
                let delay = Duration::from_millis(rng.random_range(20..=2 * cli.ttl_ms));
                let lasting = Duration::from_millis(rng.random_range(300..=1500));
                path.set_delay(delay);
                world.run_for(lasting);
                path.set_delay(Duration::ZERO);
                format!("delay on the path to {name}: {delay:?} per chunk for {lasting:?}")
            }
            Fault::Cut => {
                let (name, path) = &paths[rng.random_range(0..paths.len())];
                path.cut_all();
                format!("cut every connection on the path to {name}")
            }
            // The high-availability faults (`Fault::HA`).
            _ => {
                let Lockds::Ha(ha) = &mut lockds else {
                    unreachable!("checked: these faults need --backend etcd")
                };
                let mut wait = |d: Duration| world.run_for(d);
                match fault {
                    Fault::LeaderPause => ha.pause_leader(&mut rng, &mut wait),
                    Fault::Follower => ha.kill(false, &mut rng)?,
                    Fault::Member => ha.kill_member(&mut rng, &mut wait),
                    Fault::Quorum => ha.lose_quorum(&mut rng, &mut wait),
                    Fault::Isolate => ha.isolate_leader(&mut rng, &mut wait),
                    Fault::EtcdDelay => ha.delay_leader(&mut rng, &mut wait),
                    Fault::Clock => ha.jump_clock(&mut rng, &mut wait)?,
                    other => unreachable!("{other:?} has its own arm above"),
                }
            }
        };
        *counts.entry(fault_name(fault)).or_default() += 1;
        println!("fault {n}/{}: {what}", cli.fault_count);
    }

    // The end: every client finishes its round and exits.
    for i in 0..world.clients.len() {
        world.send(i, "stop");
    }
    let all_out = world.pump_until(Instant::now() + e2e::PATIENCE, |w| w.live().is_empty());
    if !all_out {
        bail!("clients did not stop within {:?}", e2e::PATIENCE);
    }
    for c in &mut world.clients {
        let status = c.child.wait()?;
        if !status.success() {
            bail!("client {} failed: {status}", c.name);
        }
    }

    // The store's final state, read directly.
    let mut finals: Vec<(String, Vec<String>)> = Vec::new();
    for k in 1..=cli.resources {
        let resource = format!("counter:{k}");
        let applied = match &store {
            Store::Http(counters, _) => counters.applied(&k.to_string()),
            Store::Pg(pg) => {
                let ids = pg.psql(&format!(
                    "SELECT id FROM applied WHERE resource = 'counter:{k}' ORDER BY n"
                ));
                ids.lines().map(str::to_string).collect()
            }
        };
        finals.push((resource, applied));
    }
    for (resource, applied) in &finals {
        // An unknown-outcome write that the store holds gets its place in the store's order.
        for e in world.events.iter_mut() {
            if e["type"] == "info"
                && e["f"] == "write"
                && e["resource"] == resource.as_str()
                && let Some(p) = applied
                    .iter()
                    .position(|id| e["value"].as_str() == Some(id.as_str()))
            {
                e["index"] = json!(p + 1);
            }
        }
        let read = e2e::history_event("ok", "runner", "read", resource, json!({"value": applied}));
        world.events.push(read);
    }

    if let Lockds::Ha(ha) = &lockds {
        println!("lockd terms ended (why: how many):");
        for (why, n) in ha.terms_ended() {
            println!("  {why:<36} {n}");
        }
    }
    report(&mut world.events, &out_dir, &counts, &replay)
}

/// Pauses client `v` (before its next write when `at_write`) past its lease: until another
/// client's write to the resource it holds is acknowledged with a newer token, or a bound.
fn pause(
    world: &mut World,
    v: usize,
    at_write: bool,
    ttl: Duration,
    counts: &mut BTreeMap<String, u32>,
) -> String {
    let name = world.clients[v].name.clone();
    let mut at_point = false;
    if at_write {
        world.expecting_point = Some(v);
        world.at_point = false;
        world.send(v, "pause");
        at_point = world.pump_until(Instant::now() + Duration::from_secs(10), |w| {
            w.at_point || w.clients[v].exited
        }) && world.at_point;
        if !at_point {
            world.expecting_point = None;
        }
    }
    signal(world.clients[v].pid, libc::SIGSTOP);
    world.record(v, "pause");
    let held = world.holding[v].clone();
    let outcome = match &held {
        Some((resource, token)) => {
            let bound = (ttl * 5).max(Duration::from_secs(3));
            let taken = world.pump_until(Instant::now() + bound, |w| {
                w.highest_ok.get(resource).is_some_and(|t| t > token)
            });
            if taken {
                format!(
                    "held {resource} with token {token}; resumed after a newer token's write was acknowledged"
                )
            } else {
                format!("held {resource} with token {token}; nobody took it over within {bound:?}")
            }
        }
        None => {
            world.run_for(ttl * 3 / 2);
            "held no lock".to_string()
        }
    };
    signal(world.clients[v].pid, libc::SIGCONT);
    world.record(v, "resume");
    if at_point {
        world.send(v, "go");
        world.expecting_point = None;
        world.at_point = false;
        *counts
            .entry("pause before a write".to_string())
            .or_default() += 1;
    }
    format!(
        "SIGSTOP {name}{}: {outcome}; SIGCONT",
        if at_point { " just before a write" } else { "" }
    )
}

fn spawn_client(
    cli: &Cli,
    seed: u64,
    id: u32,
    to_lockd: &[FaultProxy],
    to_store: &FaultProxy,
    tx: Sender<(usize, Msg)>,
) -> anyhow::Result<ClientProc> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "client",
            "--id",
            &id.to_string(),
            "--seed",
            &seed.to_string(),
            "--mode",
            match cli.mode {
                Mode::Http => "http",
                Mode::Pg => "pg",
            },
            "--lockd",
            &to_lockd
                .iter()
                .map(|p| format!("http://{}", p.addr))
                .collect::<Vec<_>>()
                .join(","),
            "--store",
            &to_store.addr.to_string(),
            "--resources",
            &cli.resources.to_string(),
            "--ttl-ms",
            &cli.ttl_ms.to_string(),
        ])
        .args((cli.backend == Backend::Etcd).then_some("--ha"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting a client")?;
    let stdout = child.stdout.take().context("stdout is piped")?;
    let stdin = child.stdin.take().context("stdin is piped")?;
    let i = (id - 1) as usize;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let msg = if let Some(json) = line.strip_prefix("EVENT ") {
                match serde_json::from_str(json) {
                    Ok(v) => Msg::Event(v),
                    Err(_) => continue,
                }
            } else if line == "PAUSEPOINT" {
                Msg::PausePoint
            } else {
                continue;
            };
            if tx.send((i, msg)).is_err() {
                return;
            }
        }
        let _ = tx.send((i, Msg::Exit));
    });
    Ok(ClientProc {
        name: format!("c{id}"),
        pid: child.id() as i32,
        child,
        stdin,
        exited: false,
    })
}

/// A fault's name as `--faults` takes it.
fn fault_name(fault: Fault) -> String {
    use clap::ValueEnum;
    fault
        .to_possible_value()
        .map_or_else(|| format!("{fault:?}"), |v| v.get_name().to_string())
}

fn replay_command(cli: &Cli, seed: u64, kinds: &[Fault]) -> String {
    let kinds: Vec<String> = kinds.iter().map(|k| fault_name(*k)).collect();
    let backend = match cli.backend {
        Backend::Embedded => String::new(),
        Backend::Etcd => format!(
            " --backend etcd --lockds {} --leader-ttl-ms {}",
            cli.lockds, cli.leader_ttl_ms
        ),
    };
    format!(
        "target/debug/faults --mode {}{backend} --seed {seed} --clients {} --resources {} --fault-count {} --faults {} --ttl-ms {}{}",
        match cli.mode {
            Mode::Http => "http",
            Mode::Pg => "pg",
        },
        cli.clients,
        cli.resources,
        cli.fault_count,
        kinds.join(","),
        cli.ttl_ms,
        if cli.no_fencing { " --no-fencing" } else { "" }
    )
}

/// Writes the history and the timeline, prints the verdict and the counts; true when the
/// history holds every property.
fn report(
    events: &mut [Value],
    out_dir: &Path,
    faults: &BTreeMap<String, u32>,
    replay: &str,
) -> anyhow::Result<bool> {
    events.sort_by_key(|e| e["time"].as_u64());
    let text: String = events.iter().map(|e| format!("{e}\n")).collect();
    let history_path = out_dir.join("history.jsonl");
    std::fs::write(&history_path, &text)?;
    let history = verifier::parse(text.as_bytes()).context("the recorded history")?;
    let report = verifier::check(&history);
    let timeline = out_dir.join("timeline.html");
    std::fs::write(&timeline, verifier::timeline::html(&history, &report))?;

    println!("\nfaults injected:");
    for (k, n) in faults {
        println!("  {k:<22} {n}");
    }
    let mut ops: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut fenced = 0;
    for e in events.iter() {
        let (Some(kind), Some(f)) = (e["type"].as_str(), e["f"].as_str()) else {
            continue;
        };
        if kind == "invoke" || f == "pause" || f == "resume" || f == "read" {
            continue;
        }
        *ops.entry((f.to_string(), kind.to_string())).or_default() += 1;
        let note = e["note"].as_str().unwrap_or_default();
        if f == "write" && kind == "fail" && (note.contains("HTTP 409") || note.contains("FN00")) {
            fenced += 1;
        }
    }
    println!("operations (ok / fail / info = outcome unknown):");
    for f in ["acquire", "write", "release"] {
        let n = |k: &str| {
            ops.get(&(f.to_string(), k.to_string()))
                .copied()
                .unwrap_or(0)
        };
        println!(
            "  {f:<8} {:>6} ok {:>6} fail {:>6} info",
            n("ok"),
            n("fail"),
            n("info")
        );
    }
    println!("writes refused by the fence: {fenced}");
    println!("\n{report}");
    println!(
        "history:  {}\ntimeline: {}\nreplay:   {replay}",
        history_path.display(),
        timeline.display()
    );
    Ok(report.ok())
}
