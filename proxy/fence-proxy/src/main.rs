//! `fence-proxy`: see `fence-proxy --help` and docs/fence-proxy.md.

mod config;
mod fence_pg;
mod marks_redb;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use config::{Cli, Config, LogFormat, MarksStore};
use http_relay::{Fence, LocalFence, Relay};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// Exit status when the marks store fails (EX_IOERR of sysexits.h).
const EXIT_STORE_FAILED: i32 = 74;

fn main() -> ExitCode {
    let cli = Cli::parse();
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

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    for h in &config.http {
        let listener = tokio::net::TcpListener::bind(h.listen)
            .await
            .with_context(|| format!("cannot listen on {}", h.listen))?;
        let addr = listener.local_addr()?;
        tracing::info!(%addr, upstream = %h.upstream, routes = h.routes.len(), "listening (http)");
        let relay = Arc::new(Relay::new(h.routes()?, Arc::clone(&fence), h.relay()?));
        let mut stop = stop_rx.clone();
        servers.push(tokio::spawn(http_relay::serve(
            listener,
            relay,
            h.server(),
            async move {
                let _ = stop.changed().await;
            },
        )));
    }
    shutdown_signal().await;
    tracing::info!("shutting down: finishing requests in progress");
    let _ = stop_tx.send(true);
    for s in servers {
        let _ = s.await;
    }
    tracing::info!("stopped");
    Ok(())
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
