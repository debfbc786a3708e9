//! `verify check HISTORY.jsonl [--html TIMELINE.html]`: judges a recorded history (and draws
//! it); exit status 0 when no property is
//! violated, 1 when one is, 2 when the history cannot be read. See docs/history.md.

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: verify check HISTORY.jsonl [--html TIMELINE.html]   (see docs/history.md)\n       verify model [--no-fencing] [--clients N]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, html) = match args.as_slice() {
        [cmd, path] if cmd == "check" => (path, None),
        [cmd, path, flag, out] if cmd == "check" && flag == "--html" => (path, Some(out)),
        [cmd, rest @ ..] if cmd == "model" => return model(rest),
        [flag] if flag == "--help" || flag == "-h" => {
            println!(
                "verify check HISTORY.jsonl: checks a recorded history for the safety invariants"
            );
            return ExitCode::SUCCESS;
        }
        _ => return usage(),
    };
    let file = match std::fs::File::open(path) {
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
            eprintln!("verify: cannot write {out}: {e}");
            return ExitCode::from(2);
        }
        println!("timeline: {out}");
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `verify model [--no-fencing] [--clients N]`: explores the protocol's model; exit status 1
/// when a counterexample is found.
fn model(args: &[String]) -> ExitCode {
    let mut scope = verifier::model::Scope {
        clients: 2,
        grants: 3,
        writes: 2,
        fence: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--no-fencing" => scope.fence = false,
            "--clients" => match it.next().and_then(|n| n.parse().ok()) {
                Some(n @ 1..=4) => scope.clients = n,
                _ => {
                    eprintln!("verify model: --clients takes 1 to 4");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!("verify model: unknown argument {other:?}");
                return usage();
            }
        }
    }
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
