//! `lockd`: see `lockd --help` and docs/config.md.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use lockd_server::config::{Cli, Config, LogFormat};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    cli_docs::generate_if_asked(Cli::command);
    let cli = Cli::parse();
    if cli.hash_token {
        return hash_token();
    }
    let config = match Config::from_cli(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lockd: {e:#}");
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
            eprintln!("lockd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(lockd_server::server::run(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("lockd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--hash-token`: the token on stdin (one line), hashed for the policy file.
fn hash_token() -> ExitCode {
    let mut line = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut line) {
        eprintln!("lockd: cannot read the token from stdin: {e}");
        return ExitCode::FAILURE;
    }
    let token = line.trim_end_matches(['\r', '\n']);
    let min = lockd_server::policy::TOKEN_LEN_MIN;
    if token.len() < min || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        eprintln!(
            "lockd: a bearer token is at least {min} characters without spaces, e.g. from `openssl rand -hex 32`"
        );
        return ExitCode::from(2);
    }
    println!(
        "token_sha256 = \"{}\"",
        lockd_server::policy::token_sha256(token)
    );
    ExitCode::SUCCESS
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
