//! `lockbench`: load for lockd, etcd and Redis, side by side.
//!
//! - `closed`: N clients, each acquiring and releasing its own resource in a loop, as fast as
//!   answers come (throughput of durable acquire+release pairs, latency of each step); or
//!   sets of locks all or none (`--set`), one shared semaphore's permits (`--permits`), one
//!   shared read-write lock read `--read-percent` of the time (`--rw`).
//! - `open`: fixed rates of acquires, renewals and releases over a pool of held locks; each
//!   latency is measured from the moment the request was *due*, so a stall shows up in the
//!   percentiles instead of silently lowering the rate (no coordinated omission).
//! - `baseline`: the floor of a durable acquire on this machine: a loopback TCP round trip and
//!   one `fdatasync` of a small write, each measured.
//! - `fill`: acquires N leases and keeps them, then reports the server's resident memory.
//!
//! Results print as a short text block and, with `--json`, as one JSON object per run.

mod backend;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use backend::{Backend, Held, Target};
use clap::{Args, Parser, Subcommand};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::time::Instant;

#[derive(Parser)]
#[command(
    name = "lockbench",
    about = "Load generator for lockd, etcd and Redis locks."
)]
struct Cli {
    /// Print one JSON object per run on stdout (in addition to the text on stderr).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Args, Clone)]
struct TargetArgs {
    /// System under test.
    #[arg(long, value_enum, default_value = "lockd")]
    target: Target,
    /// Its endpoint (lockd: http://127.0.0.1:7420, etcd: http://127.0.0.1:2379, redis: redis://127.0.0.1:6379); lockd and etcd take several, comma-separated.
    #[arg(long)]
    endpoint: String,
    /// Connections to open (requests are spread over them).
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// lockd over TLS (an https:// endpoint): the CA that signed its certificate.
    #[arg(long, value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    /// lockd with mutual TLS: a client certificate (PEM), with --key.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// lockd with a policy: a file holding the bearer token to present on every call.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Lease length asked for.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
}

impl TargetArgs {
    fn auth(&self) -> backend::Auth<'_> {
        backend::Auth {
            ca: self.ca.as_deref(),
            identity: self.cert.as_deref().zip(self.key.as_deref()),
            token_file: self.token_file.as_deref(),
        }
    }
}

#[derive(Subcommand)]
enum Mode {
    /// Closed loop: N clients acquire and release their own resource as fast as they can.
    Closed {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Excluded from the results.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        /// Each client takes a set of this many resources at once, all or none, and releases
        /// them together (1: a single lock).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=32))]
        set: u64,
        /// Every client takes one of this many permits of one shared semaphore (waiting for
        /// one, up to 10 s), and releases it (0: each client its own lock).
        #[arg(long, default_value_t = 0, conflicts_with = "set", value_parser = clap::value_parser!(u32).range(0..=1000))]
        permits: u32,
        /// Every client takes one shared read-write lock (waiting up to 10 s), as a reader
        /// `--read-percent` of the time and as its writer otherwise, and releases it.
        #[arg(long, conflicts_with_all = ["set", "permits"])]
        rw: bool,
        /// With --rw: the share of acquires that read.
        #[arg(long, default_value_t = 90, requires = "rw", value_parser = clap::value_parser!(u8).range(0..=100))]
        read_percent: u8,
    },
    /// Open loop: fixed rates of acquires, renewals and releases.
    Open {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, default_value_t = 2000)]
        acquire_rate: u64,
        #[arg(long, default_value_t = 2000)]
        renew_rate: u64,
        #[arg(long, default_value_t = 2000)]
        release_rate: u64,
        /// Locks held before the measurement starts (renewals and releases pick among them).
        #[arg(long, default_value_t = 20_000)]
        held: usize,
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        duration: Duration,
    },
    /// The floor: loopback TCP round trip and fdatasync, measured.
    Baseline {
        /// Directory on the file system to measure fdatasync on (use the server's data directory).
        #[arg(long)]
        dir: std::path::PathBuf,
        #[arg(long, default_value_t = 5000)]
        iterations: usize,
    },
    /// Acquire COUNT leases, keep them, and report the server's resident memory.
    Fill {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, default_value_t = 1_000_000)]
        count: u64,
        #[arg(long, default_value_t = 64)]
        concurrency: u64,
        /// The server's process id, to read its memory from /proc.
        #[arg(long)]
        pid: u32,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = match cli.mode {
        Mode::Closed {
            target,
            clients,
            duration,
            warmup,
            set,
            permits,
            rw,
            read_percent,
        } => rt.block_on(closed(
            target,
            clients,
            (duration, warmup),
            set as usize,
            (permits, rw.then_some(read_percent)),
        ))?,
        Mode::Open {
            target,
            acquire_rate,
            renew_rate,
            release_rate,
            held,
            duration,
        } => rt.block_on(open(
            target,
            [acquire_rate, renew_rate, release_rate],
            held,
            duration,
        ))?,
        Mode::Baseline { dir, iterations } => baseline(&dir, iterations)?,
        Mode::Fill {
            target,
            count,
            concurrency,
            pid,
        } => rt.block_on(fill(target, count, concurrency, pid))?,
    };
    if cli.json {
        println!("{result}");
    }
    Ok(())
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// p50 / p99 / p99.9 / max in microseconds.
fn summary(h: &Histogram<u64>) -> Value {
    json!({
        "count": h.len(),
        "p50_us": h.value_at_quantile(0.5),
        "p99_us": h.value_at_quantile(0.99),
        "p999_us": h.value_at_quantile(0.999),
        "max_us": h.max(),
    })
}

fn show(name: &str, h: &Histogram<u64>) {
    eprintln!(
        "  {name:<8} n={:<8} p50={:>7}us p99={:>7}us p99.9={:>7}us max={:>8}us",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    );
}

fn us(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

fn run_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

async fn closed(
    t: TargetArgs,
    clients: usize,
    (duration, warmup): (Duration, Duration),
    set: usize,
    (permits, rw): (u32, Option<u8>),
) -> anyhow::Result<Value> {
    let backend =
        Arc::new(Backend::connect(t.target, &t.endpoint, t.connections, &t.auth()).await?);
    let ttl_ms = t.ttl.as_millis() as u64;
    let run = run_id();
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let backend = Arc::clone(&backend);
        let resource = format!("bench-{run}-{c}");
        let members: Vec<String> = (0..set).map(|k| format!("{resource}-{k}")).collect();
        let semaphore = format!("bench-{run}-semaphore");
        let rw_lock = format!("bench-{run}-rw");
        tasks.push(tokio::spawn(async move {
            let (mut acq, mut rel, mut pair) = (histogram(), histogram(), histogram());
            let (mut acq_read, mut acq_write) = (histogram(), histogram());
            let mut errors = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let mut reads = None;
                let released = if let Some(percent) = rw {
                    let read = rand::random::<u8>() % 100 < percent;
                    reads = Some(read);
                    let wait = Duration::from_secs(10);
                    let held = match backend.acquire_rw(&rw_lock, read, ttl_ms, wait).await {
                        Ok(Some(h)) => h,
                        Ok(None) | Err(_) => {
                            errors += 1;
                            continue;
                        }
                    };
                    (Instant::now(), backend.release(held).await)
                } else if permits > 0 {
                    let wait = Duration::from_secs(10);
                    let held = match backend
                        .acquire_permit(&semaphore, permits, ttl_ms, wait)
                        .await
                    {
                        Ok(Some(h)) => h,
                        Ok(None) | Err(_) => {
                            errors += 1;
                            continue;
                        }
                    };
                    (Instant::now(), backend.release(held).await)
                } else if set == 1 {
                    let held = match backend.acquire(&resource, ttl_ms).await {
                        Ok(Some(h)) => h,
                        Ok(None) | Err(_) => {
                            errors += 1;
                            continue;
                        }
                    };
                    (Instant::now(), backend.release(held).await)
                } else {
                    let held = match backend.acquire_set(&members, ttl_ms).await {
                        Ok(Some(h)) => h,
                        Ok(None) | Err(_) => {
                            errors += 1;
                            continue;
                        }
                    };
                    (Instant::now(), backend.release_set(held).await)
                };
                let t1 = released.0;
                if released.1.is_err() {
                    errors += 1;
                }
                let t2 = Instant::now();
                if t0 >= measure_from && t2 <= end {
                    acq.record(us(t1 - t0)).ok();
                    rel.record(us(t2 - t1)).ok();
                    pair.record(us(t2 - t0)).ok();
                    match reads {
                        Some(true) => acq_read.record(us(t1 - t0)).ok(),
                        Some(false) => acq_write.record(us(t1 - t0)).ok(),
                        None => None,
                    };
                }
            }
            (acq, rel, pair, errors, (acq_read, acq_write))
        }));
    }
    let (mut acq, mut rel, mut pair, mut errors) = (histogram(), histogram(), histogram(), 0);
    let (mut acq_read, mut acq_write) = (histogram(), histogram());
    for task in tasks {
        let (a, r, p, e, (ar, aw)) = task.await?;
        acq.add(a)?;
        rel.add(r)?;
        pair.add(p)?;
        acq_read.add(ar)?;
        acq_write.add(aw)?;
        errors += e;
    }
    let pairs_per_s = pair.len() as f64 / duration.as_secs_f64();
    eprintln!(
        "closed loop {:?}, {clients} clients, sets of {set}, permits {permits}, rw {rw:?}, {duration:?}: {pairs_per_s:.0} acquire+release pairs/s, {errors} errors",
        t.target
    );
    show("acquire", &acq);
    if rw.is_some() {
        show("read", &acq_read);
        show("write", &acq_write);
    }
    show("release", &rel);
    show("pair", &pair);
    Ok(json!({
        "mode": "closed", "target": format!("{:?}", t.target).to_lowercase(), "clients": clients, "set": set, "permits": permits,
        "read_percent": rw, "duration_s": duration.as_secs_f64(), "pairs_per_s": pairs_per_s, "errors": errors,
        "acquire": summary(&acq), "release": summary(&rel), "pair": summary(&pair),
        "acquire_read": summary(&acq_read), "acquire_write": summary(&acq_write),
    }))
}

/// Outstanding requests past which the open loop counts new ones as failures rather than pile
/// them up without bound (the server is not keeping up).
const OPEN_OUTSTANDING_MAX: u64 = 20_000;

type Pool = Arc<std::sync::Mutex<std::collections::VecDeque<Held>>>;

async fn open(
    t: TargetArgs,
    rates: [u64; 3],
    held: usize,
    duration: Duration,
) -> anyhow::Result<Value> {
    let backend =
        Arc::new(Backend::connect(t.target, &t.endpoint, t.connections, &t.auth()).await?);
    let ttl_ms = t.ttl.as_millis() as u64;
    let run = run_id();
    let pool: Pool = Arc::default();
    let counter = Arc::new(AtomicU64::new(0));
    // Fill the pool (not measured).
    let mut fillers = Vec::new();
    for _ in 0..64u64 {
        let (backend, pool, counter, run) =
            (backend.clone(), pool.clone(), counter.clone(), run.clone());
        let per = (held as u64).div_ceil(64);
        fillers.push(tokio::spawn(async move {
            for _ in 0..per {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                if let Ok(Some(h)) = backend.acquire(&format!("open-{run}-{i}"), ttl_ms).await {
                    pool.lock().unwrap().push_back(h);
                }
            }
        }));
    }
    for f in fillers {
        f.await?;
    }
    eprintln!(
        "open loop {:?}: {} locks held before the run",
        t.target,
        pool.lock().unwrap().len()
    );

    // A scheduler thread releases each request at its due time: std::thread::sleep is precise
    // to tens of microseconds, tokio's timer to a millisecond, which would add generator
    // lateness to every latency measured from the due time.
    let (tx, mut due_rx) = tokio::sync::mpsc::unbounded_channel::<(usize, std::time::Instant)>();
    let start = std::time::Instant::now() + Duration::from_millis(50);
    std::thread::spawn(move || {
        let intervals: Vec<Option<Duration>> = rates
            .iter()
            .map(|&r| (r > 0).then(|| Duration::from_secs_f64(1.0 / r as f64)))
            .collect();
        let mut next: Vec<Option<std::time::Instant>> =
            intervals.iter().map(|i| i.map(|_| start)).collect();
        let end = start + duration;
        while let Some((op, due)) = next
            .iter()
            .enumerate()
            .filter_map(|(op, d)| d.map(|d| (op, d)))
            .min_by_key(|&(_, d)| d)
        {
            if due >= end {
                break;
            }
            let now = std::time::Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if tx.send((op, due)).is_err() {
                break;
            }
            next[op] = Some(due + intervals[op].expect("scheduled ops have an interval"));
        }
    });
    let hists: Arc<std::sync::Mutex<[Histogram<u64>; 3]>> = Arc::new(std::sync::Mutex::new([
        histogram(),
        histogram(),
        histogram(),
    ]));
    let errors: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let outstanding = Arc::new(AtomicU64::new(0));
    let mut inflight = Vec::new();
    while let Some((op, due)) = due_rx.recv().await {
        if outstanding.load(Ordering::Relaxed) >= OPEN_OUTSTANDING_MAX {
            errors[op].fetch_add(1, Ordering::Relaxed);
            continue;
        }
        outstanding.fetch_add(1, Ordering::Relaxed);
        let (backend, pool, counter, run) =
            (backend.clone(), pool.clone(), counter.clone(), run.clone());
        let (hists, errors, outstanding) = (hists.clone(), errors.clone(), outstanding.clone());
        inflight.push(tokio::spawn(async move {
            let ok = match op {
                0 => {
                    let i = counter.fetch_add(1, Ordering::Relaxed);
                    match backend.acquire(&format!("open-{run}-{i}"), ttl_ms).await {
                        Ok(Some(h)) => {
                            pool.lock().unwrap().push_back(h);
                            true
                        }
                        _ => false,
                    }
                }
                1 => {
                    let pick = {
                        let p = pool.lock().unwrap();
                        (!p.is_empty()).then(|| p[rand::random::<u64>() as usize % p.len()].clone())
                    };
                    match pick {
                        Some(h) => backend.renew(&h, ttl_ms).await.is_ok(),
                        None => false,
                    }
                }
                _ => {
                    let pick = pool.lock().unwrap().pop_front();
                    match pick {
                        Some(h) => backend.release(h).await.is_ok(),
                        None => false,
                    }
                }
            };
            if ok {
                hists.lock().unwrap()[op].record(us(due.elapsed())).ok();
            } else {
                errors[op].fetch_add(1, Ordering::Relaxed);
            }
            outstanding.fetch_sub(1, Ordering::Relaxed);
        }));
    }
    for t in inflight {
        let _ = t.await;
    }
    let mut out = json!({"mode": "open", "target": format!("{:?}", t.target).to_lowercase(), "duration_s": duration.as_secs_f64(), "held_before": held});
    eprintln!(
        "open loop {:?}, {duration:?} at {rates:?} acquire/renew/release per second:",
        t.target
    );
    let hists = hists.lock().unwrap();
    for (op, name) in ["acquire", "renew", "release"].into_iter().enumerate() {
        show(name, &hists[op]);
        let failed = errors[op].load(Ordering::Relaxed);
        if failed > 0 {
            eprintln!("  {name}: {failed} failed or dropped");
        }
        let mut v = summary(&hists[op]);
        v["errors"] = json!(failed);
        v["rate_per_s"] = json!(rates[op]);
        out[name] = v;
    }
    Ok(out)
}

fn baseline(dir: &std::path::Path, iterations: usize) -> anyhow::Result<Value> {
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::fs::FileExt;
    // Loopback round trip: one byte there and back, Nagle off, the two ends pinned to
    // different CPUs. Left to the scheduler, both ends sometimes share a CPU and hand over
    // without a wake-up (5 us instead of about 60), which no client and server pair sees.
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        pin_to_cpu(0);
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() {
            s.write_all(&b)?;
        }
        Ok(())
    });
    pin_to_cpu(1 % cpus);
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut rtt = histogram();
    let mut b = [7u8; 1];
    for i in 0..iterations + 100 {
        let t0 = std::time::Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        if i >= 100 {
            rtt.record(us(t0.elapsed())).ok();
        }
    }
    drop(s);
    let _ = echo.join();
    unpin(cpus);
    // fdatasync of a 4 KiB overwrite in the given directory.
    std::fs::create_dir_all(dir)?;
    let path = dir.join("lockbench-fdatasync.tmp");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .context("fdatasync file")?;
    let page = [0x5au8; 4096];
    f.write_all_at(&page, 0)?;
    f.sync_all()?;
    let mut sync = histogram();
    for i in 0..iterations.min(5000) + 50 {
        let t0 = std::time::Instant::now();
        f.write_all_at(&page, 0)?;
        f.sync_data()?;
        if i >= 50 {
            sync.record(us(t0.elapsed())).ok();
        }
    }
    drop(f);
    std::fs::remove_file(&path)?;
    eprintln!("baseline:");
    show("rtt", &rtt);
    show("fdatasync", &sync);
    let floor = rtt.value_at_quantile(0.5) + sync.value_at_quantile(0.5);
    eprintln!("  floor of a durable acquire (p50 rtt + p50 fdatasync): {floor}us");
    Ok(
        json!({"mode": "baseline", "rtt": summary(&rtt), "fdatasync": summary(&sync), "floor_p50_us": floor}),
    )
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it; the call only
    // changes this thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn unpin(cpus: usize) {
    // SAFETY: as in `pin_to_cpu`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn rss_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(name).map(|v| {
                    v.trim()
                        .trim_end_matches(" kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0)
                })
            })
            .unwrap_or(0)
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

async fn fill(t: TargetArgs, count: u64, concurrency: u64, pid: u32) -> anyhow::Result<Value> {
    let backend =
        Arc::new(Backend::connect(t.target, &t.endpoint, t.connections, &t.auth()).await?);
    let ttl_ms = t.ttl.as_millis() as u64;
    let (rss_before, _) = rss_kib(pid)?;
    let run = run_id();
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (backend, next, failed, run) =
            (backend.clone(), next.clone(), failed.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            let mut kept = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                match backend.acquire(&format!("fill-{run}-{i:07}"), ttl_ms).await {
                    Ok(Some(h)) => kept.push(h),
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            kept.len()
        }));
    }
    let mut held = 0;
    for t in tasks {
        held += t.await?;
    }
    let elapsed = start.elapsed();
    let (rss_after, hwm) = rss_kib(pid)?;
    let mib = |k: u64| k as f64 / 1024.0;
    eprintln!(
        "fill {:?}: {held} leases held ({} failed) in {:.1}s ({:.0}/s); server RSS {:.0} MiB -> {:.0} MiB (peak {:.0} MiB)",
        t.target,
        failed.load(Ordering::Relaxed),
        elapsed.as_secs_f64(),
        held as f64 / elapsed.as_secs_f64(),
        mib(rss_before),
        mib(rss_after),
        mib(hwm)
    );
    Ok(json!({
        "mode": "fill", "target": format!("{:?}", t.target).to_lowercase(), "held": held,
        "failed": failed.load(Ordering::Relaxed), "seconds": elapsed.as_secs_f64(),
        "rss_before_mib": mib(rss_before), "rss_after_mib": mib(rss_after), "rss_peak_mib": mib(hwm),
    }))
}
