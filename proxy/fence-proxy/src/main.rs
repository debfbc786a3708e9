//! `fence-proxy`: see `fence-proxy --help` and docs/fence-proxy.md.

mod admin;
mod cli;
mod config;
mod fence_pg;
mod marks_redb;
mod ops;
mod signing;
mod tls;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use config::{Cli, Config, LogFormat, MarksStore};
use http_relay::{Fence, LocalFence, Relay};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// Exit status when the marks store fails (EX_IOERR of sysexits.h).
const EXIT_STORE_FAILED: i32 = 74;

fn main() -> ExitCode {
    cli_docs::generate_if_asked(Cli::command);
    tame_malloc();
    let cli = Cli::parse();
    if let Some(config::Mode::Pg(config::PgArgs {
        action: Some(action),
        ..
    })) = &cli.mode
    {
        match action {
            config::PgAction::PrintSchema => print!("{}", pg_relay::schema::SQL),
            config::PgAction::PrintChecks => {
                for (name, text) in pg_relay::schema::prepared_statements() {
                    println!("{name}\t{text}");
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    if let Some(config::Mode::Marks(m)) = &cli.mode {
        return marks(&m.action);
    }
    let config = match Config::from_cli(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fence-proxy: {e:#}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    let filter = EnvFilter::try_new(&config.log).expect("validated with the config");
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fence-proxy: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("fence-proxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = config.workers();
    for what in config.plaintext() {
        tracing::warn!(%what, "plaintext off loopback (insecure = true): tokens and data travel unencrypted");
    }
    if let Some(target) = &config.audit_log {
        opskit::audit::start(target, "fence-proxy-audit").map_err(anyhow::Error::msg)?;
        tracing::info!(audit_log = %target, "writing the audit log");
    }
    let ops = match config.admin_listen {
        None => None,
        Some(addr) => {
            // Before any listener: every session records from its start.
            opskit::fence::enable();
            let ops = Arc::new(ops::Ops::new());
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("admin_listen: cannot listen on {addr}"))?;
            tracing::info!(addr = %listener.local_addr()?, "admin listening: /metrics, /healthz, /readyz, / (status page)");
            opskit::admin::serve(
                listener,
                Arc::clone(&ops) as Arc<dyn opskit::admin::Endpoints>,
            );
            Some(ops)
        }
    };
    // What SIGHUP reads again: every listener's certificate and every upstream's TLS files.
    let mut reloads: Vec<Arc<dyn tlsconf::Reload>> = Vec::new();
    let signing = Arc::new(config.signing_policy()?);
    match signing.keys() {
        Some(keys) => tracing::info!(
            keys = ?keys.keys().iter().map(|k| k.id()).collect::<Vec<_>>(),
            required_prefixes = ?signing.required_prefixes(),
            "verifying signed fencing tokens"
        ),
        None => tracing::info!("fencing tokens are not verified (no [signing] keys)"),
    }
    let mut pg_threads = Vec::new();
    for p in &config.pg {
        let mut relay_config = p.relay(config.fence.resources_max, config.signing.is_some());
        (relay_config.tls, relay_config.upstream_tls) = p.tls()?;
        relay_config.pool = p.pool()?;
        if let Some(t) = &relay_config.tls {
            reloads.push(Arc::clone(&t.server) as Arc<dyn tlsconf::Reload>);
        }
        if let Some(t) = &relay_config.upstream_tls {
            reloads.push(Arc::clone(&t.client) as Arc<dyn tlsconf::Reload>);
        }
        for url in &p.schema_urls {
            let wait = std::time::Duration::from_millis(p.schema_wait_ms);
            let policy = config.signing.is_some().then_some(&*signing);
            pg_relay::schema::install_waiting(url, wait, relay_config.connect_timeout, policy)
                .await?;
            tracing::info!(url = %pg_relay::schema::redact(url), "installed the fence check");
        }
        if p.schema_urls.is_empty() {
            tracing::info!(
                "no schema_urls: the fence check must have been installed by a DBA (fence-proxy pg print-schema)"
            );
        }
        let shards = shards::bind(p.listen, workers)
            .with_context(|| format!("cannot listen on {}", p.listen))?;
        let addr = shards[0].local_addr()?;
        if let Some(ops) = &ops {
            ops.listening(format!("pg {addr} → {}", p.upstream));
        }
        tracing::info!(%addr, upstream = %p.upstream, tls = p.tls_cert.is_some(), upstream_tls = ?p.upstream_tls, fence_wait_ms = p.fence_wait_ms, workers, "listening (pg)");
        // One relay (limits, map of marks, cancel keys) for all the listener's threads; each
        // thread runs its own event loop, and a session stays on the thread that accepted it
        // (the thread with the fewest sessions accepts the next).
        let relay = Arc::new(pg_relay::Relay::new(relay_config));
        for (i, shard) in shards.into_iter().enumerate() {
            let relay = Arc::clone(&relay);
            let mut stop = stop_rx.clone();
            pg_threads.push(spawn_worker(
                format!("pg-{}-{i}", addr.port()),
                shard,
                move |listener| async move {
                    pg_relay::serve(listener, relay, async move {
                        let _ = stop.changed().await;
                    })
                    .await
                },
            )?);
        }
    }
    let mut threads = if config.http.is_empty() {
        Vec::new()
    } else {
        start_http(&config, &stop_rx, &signing, &mut reloads, ops.as_deref()).await?
    };
    threads.extend(pg_threads);
    tlsconf::reload_on_sighup(reloads);
    if let Some(ops) = &ops {
        ops.started();
        let urls = config
            .pg
            .iter()
            .flat_map(|p| p.schema_urls.clone())
            .collect();
        ops.probe(urls, std::time::Duration::from_secs(5));
    }
    shutdown_signal().await;
    tracing::info!("shutting down: finishing requests in progress");
    let _ = stop_tx.send(true);
    tokio::task::spawn_blocking(move || {
        for t in threads {
            if let Ok(Err(e)) = t.join() {
                tracing::warn!(error = %e, "a listener thread ended with an error");
            }
        }
    })
    .await?;
    tracing::info!("stopped");
    Ok(())
}

/// Opens the marks store of the HTTP mode and starts its listener threads.
async fn start_http(
    config: &Config,
    stop_rx: &watch::Receiver<bool>,
    signing: &Arc<fencing::signed::Policy>,
    reloads: &mut Vec<Arc<dyn tlsconf::Reload>>,
    ops: Option<&ops::Ops>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<std::io::Result<()>>>> {
    let fence: Arc<dyn Fence> = match config.fence.store {
        MarksStore::Redb => {
            let (marks, stored) = marks_redb::open(
                &config.data_dir,
                config.fence.cache_size_mb << 20,
                Box::new(|reason| {
                    // Fail-stop: a mark that may not be stored must not let a request through.
                    tracing::error!(%reason, "the marks store failed; fence-proxy stops");
                    eprintln!("fence-proxy: the marks store failed, stopping: {reason}");
                    std::process::exit(EXIT_STORE_FAILED);
                }),
            )?;
            tracing::info!(data_dir = %config.data_dir.display(), marks = stored.len(), "loaded the high-water marks");
            Arc::new(LocalFence::new(
                Arc::new(marks),
                stored,
                config.fence.limits(),
            ))
        }
        MarksStore::Postgres => {
            let url = config
                .fence
                .postgres_url
                .as_deref()
                .expect("validated with the config");
            let fence = fence_pg::PgFence::connect(
                url,
                config.fence.postgres_pool_size,
                config.fence.limits().barrier_wait,
            )
            .await?;
            tracing::info!(
                marks = fence.count().await?,
                "using the high-water marks in PostgreSQL"
            );
            Arc::new(fence)
        }
    };

    let workers = config.workers();
    let mut threads = Vec::new();
    for h in &config.http {
        let shards = shards::bind(h.listen, workers)
            .with_context(|| format!("cannot listen on {}", h.listen))?;
        let addr = shards[0].local_addr()?;
        let (tls, upstream_tls) = (h.listener_tls()?, h.upstream_tls()?);
        reloads.extend(
            tls.iter()
                .map(|t| Arc::clone(t) as Arc<dyn tlsconf::Reload>),
        );
        reloads.extend(
            upstream_tls
                .iter()
                .map(|t| Arc::clone(t) as Arc<dyn tlsconf::Reload>),
        );
        if let Some(ops) = ops {
            ops.listening(format!("http {addr} → {}", h.upstream));
        }
        tracing::info!(%addr, upstream = %h.upstream, tls = tls.is_some(), routes = h.routes.len(), workers, "listening (http)");
        let mut limits = h.server();
        limits.connections_max = limits.connections_max.div_ceil(workers);
        limits.startups_per_peer_max = limits.startups_per_peer_max.div_ceil(workers);
        for (i, shard) in shards.into_iter().enumerate() {
            let (fence, routes, mut relay, limits, tls) = (
                Arc::clone(&fence),
                h.routes()?,
                h.relay(Arc::clone(signing), upstream_tls.clone())?,
                limits.clone(),
                tls.clone(),
            );
            // Like connections_max, the bound on idle upstream connections is the listener's.
            relay.pool_idle_per_host = relay.pool_idle_per_host.div_ceil(workers);
            let mut stop = stop_rx.clone();
            threads.push(spawn_worker(
                format!("http-{}-{i}", addr.port()),
                shard,
                move |listener| async move {
                    let relay = Arc::new(Relay::new(routes, fence, relay));
                    http_relay::serve(listener, relay, limits, tls, async move {
                        let _ = stop.changed().await;
                    })
                    .await
                },
            )?);
        }
    }
    Ok(threads)
}

/// A listener thread: its own single-threaded runtime serving `shard` with `serve`, so that a
/// connection and the work it causes (an upstream exchange, a PostgreSQL session) stay on one
/// thread (see http_relay::server).
fn spawn_worker<F, Fut>(
    name: String,
    shard: shards::Shard,
    serve: F,
) -> std::io::Result<std::thread::JoinHandle<std::io::Result<()>>>
where
    F: FnOnce(shards::Listener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::Builder::new().name(name).spawn(move || {
        // Sockets and timers only: signals are the main runtime's, and a runtime with the
        // signal driver also looks for orphaned child processes every time it parks.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        rt.block_on(async move {
            serve(shard.listen()?).await;
            Ok(())
        })
    })
}

/// `fence-proxy marks ...` (admin.rs).
fn marks(action: &admin::MarksAction) -> ExitCode {
    use admin::MarksAction;
    let usage = |e: String| {
        eprintln!("fence-proxy marks: {e}");
        ExitCode::from(2)
    };
    let (target, resource, what, change) = match action {
        MarksAction::Show { target, resource } => {
            (target, resource.as_deref(), admin::Action::Show, None)
        }
        MarksAction::Lower {
            target,
            resource,
            to,
            change,
        } => match to.parse::<fencing::FencingToken>() {
            Ok(t) => (
                target,
                Some(resource.as_str()),
                admin::Action::Lower(t),
                Some(change),
            ),
            Err(e) => return usage(format!("--to {to:?}: {e}")),
        },
        MarksAction::Reset {
            target,
            resource,
            change,
        } => (
            target,
            Some(resource.as_str()),
            admin::Action::Reset,
            Some(change),
        ),
    };
    let resource = match resource.map(fencing::ResourceName::new).transpose() {
        Ok(r) => r,
        Err(e) => return usage(e.to_string()),
    };
    let change = match change {
        None => None,
        Some(c) if !c.force => {
            return usage(
                "lowering or resetting a mark lets writes with older tokens through again (a zombie's too): pass --force".into(),
            );
        }
        Some(c) if c.reason.trim().is_empty() => return usage("--reason must say why".into()),
        Some(c) => Some(admin::Change {
            actor: c.by.clone().unwrap_or_else(login_name),
            reason: c.reason.clone(),
            wait: std::time::Duration::from_millis(c.wait_ms),
        }),
    };
    let target = match (&target.data_dir, &target.marks_url, &target.database_url) {
        (Some(d), _, _) => admin::Target::Redb(d.clone()),
        (_, Some(u), _) => admin::Target::HttpPostgres(u.clone()),
        (_, _, Some(u)) => admin::Target::PgMode(u.clone()),
        _ => return usage("give --data-dir, --marks-url or --database-url".into()),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fence-proxy: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(admin::run(
        &target,
        resource.as_ref(),
        what,
        change.as_ref(),
    )) {
        Ok(out) => {
            print!("{out}");
            if !out.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fence-proxy marks: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Who runs this command, for the record: `$USER`, `$LOGNAME`, or the user id.
fn login_name() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| {
            // SAFETY: getuid cannot fail.
            format!("uid {}", unsafe { libc::getuid() })
        })
}

/// glibc raises its mmap threshold after a large block is freed, after which the growing
/// vectors of the marks table are carved from the heap and their old buffers stay there: with a
/// million marks that tripled the resident memory. A fixed threshold keeps large buffers in
/// their own mappings, returned to the system when freed.
fn tame_malloc() {
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
