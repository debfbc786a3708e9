//! `verify check HISTORY.jsonl`: judges a recorded history; exit status 0 when no property is
//! violated, 1 when one is, 2 when the history cannot be read. See docs/history.md.

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: verify check HISTORY.jsonl   (see docs/history.md)");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.as_slice() {
        [cmd, path] if cmd == "check" => path,
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
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
