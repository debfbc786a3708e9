//! `verify check HISTORY.jsonl [--html TIMELINE.html]`: judges a recorded history (and draws
//! it); `verify model`: the protocol explored for a small scope. Exit status 0 when no property
//! is violated, 1 when one is, 2 when the input cannot be read. See docs/history.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Checks recorded histories of the lock service and its fenced stores for the safety
/// invariants, draws them, and models the protocol.
///
/// Exit status: 0 no violation (or no counterexample), 1 a violation (or a counterexample),
/// 2 bad input (an unreadable history, a usage error).
#[derive(Parser)]
#[command(name = "verify", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Judges a recorded history (docs/history.md): single holder, monotone tokens, fencing,
    /// acknowledged writes present, refused writes absent.
    Check {
        /// The history, JSON Lines.
        history: PathBuf,
        /// Also draws the timeline into this HTML file.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Explores the protocol's model exhaustively for a small scope.
    Model {
        /// Models stores that do not check the token: a counterexample is expected.
        #[arg(long)]
        no_fencing: bool,
        /// Clients in the model.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=4))]
        clients: u8,
    },
}

fn main() -> ExitCode {
    cli_docs::generate_if_asked(Cli::command);
    match Cli::parse().command {
        Command::Check { history, html } => check(&history, html.as_deref()),
        Command::Model {
            no_fencing,
            clients,
        } => model(clients, !no_fencing),
    }
}

fn check(history: &Path, html: Option<&Path>) -> ExitCode {
    let path = history.display();
    let file = match std::fs::File::open(history) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("verify: cannot open {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let events = match verifier::parse(std::io::BufReader::new(file)) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("verify: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let report = verifier::check(&events);
    println!("{report}");
    if let Some(out) = html {
        if let Err(e) = std::fs::write(out, verifier::timeline::html(&events, &report)) {
            eprintln!("verify: cannot write {}: {e}", out.display());
            return ExitCode::from(2);
        }
        println!("timeline: {}", out.display());
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `verify model`: explores the protocol's model; exit status 1 when a counterexample is found.
fn model(clients: u8, fence: bool) -> ExitCode {
    let scope = verifier::model::Scope {
        clients: clients.into(),
        grants: 3,
        writes: 2,
        fence,
    };
    let outcome = verifier::model::explore(scope);
    println!(
        "model: {} clients, up to {} grants and {} writes each, fence {}",
        scope.clients,
        scope.grants,
        scope.writes,
        if scope.fence { "on" } else { "off" }
    );
    println!("{outcome}");
    if outcome.counterexample.is_some() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
