//! The fault runner (`faults`), short runs with fixed seeds: in each fence-proxy mode the
//! history holds, and with fencing off the checker must find the zombie writes; over etcd
//! (`--backend etcd`), runs of the high-availability faults hold.
//!
//! The seeds were chosen so that their schedules include every fault kind of the mode and at
//! least one pause just before a write; the schedule follows from the seed alone, so these
//! runs inject the same faults every time (the interleaving of the processes still varies).

use std::process::Command;

use e2e::{bin, output};

/// Seeds whose schedules of eight faults over etcd have every kind their tests ask for.
const SEED_LEADER: &str = "2";
const SEED_ETCD: &str = "1";

/// Runs `faults` with `args`; returns its exit code and output.
fn faults(args: &[&str]) -> (Option<i32>, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin("faults"));
    cmd.args(args).arg("--out").arg(dir.path());
    let (status, stdout, stderr) = output(cmd);
    (status.code(), format!("{stdout}\n{stderr}"), dir)
}

/// The count printed for a fault kind (0 when absent).
fn injected(out: &str, kind: &str) -> u32 {
    out.lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix(kind)
                .filter(|rest| rest.starts_with(' '))
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn refused(out: &str) -> u32 {
    out.lines()
        .find_map(|l| l.strip_prefix("writes refused by the fence: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of refused writes:\n{out}"))
}

/// A run with fencing on holds, injected every kind, and the fence refused a zombie's write.
fn holds(out: &str, dir: &tempfile::TempDir, kinds: &[&str]) {
    assert!(out.contains("verdict: no violation"), "{out}");
    for kind in kinds {
        assert!(injected(out, kind) >= 1, "no {kind} fault injected:\n{out}");
    }
    assert!(injected(out, "pause before a write") >= 1, "{out}");
    assert!(refused(out) >= 1, "the fence refused nothing:\n{out}");
    // The history it judged is there, with the pauses in it.
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    assert!(history.contains("\"f\":\"pause\""), "no pause recorded");
    assert!(dir.path().join("timeline.html").is_file());
}

#[test]
fn a_fault_run_through_the_http_mode_holds() {
    let (code, out, dir) = faults(&["--mode", "http", "--seed", "1", "--fault-count", "8"]);
    assert_eq!(code, Some(0), "{out}");
    holds(&out, &dir, &["pause", "lockd", "proxy", "delay", "cut"]);
    assert!(
        out.contains("replay:   target/debug/faults --mode http --seed 1 "),
        "{out}"
    );
}

#[test]
fn a_fault_run_through_the_postgres_mode_holds() {
    let (code, out, dir) = faults(&["--mode", "pg", "--seed", "6", "--fault-count", "10"]);
    assert_eq!(code, Some(0), "{out}");
    holds(
        &out,
        &dir,
        &["pause", "lockd", "proxy", "postgres", "delay", "cut"],
    );
}

#[test]
fn a_fault_run_through_the_postgres_mode_without_fencing_is_caught() {
    // The clients declare their tokens four ways in turn (SET, bound set_config, start-up
    // options, a helper function in the transaction): with the proxy in the way the run above
    // holds; without it, the zombies' writes land and the checker must say so.
    let (code, out, _dir) = faults(&[
        "--mode",
        "pg",
        "--seed",
        "6",
        "--fault-count",
        "10",
        "--no-fencing",
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("VIOLATED  fencing"), "{out}");
}

#[test]
fn a_fault_run_without_fencing_is_caught_by_the_checker() {
    let (code, out, _dir) = faults(&[
        "--mode",
        "http",
        "--seed",
        "1",
        "--fault-count",
        "8",
        "--no-fencing",
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("VIOLATED  fencing"), "{out}");
    assert!(out.contains("verdict: VIOLATION"), "{out}");
    assert!(
        out.contains("--no-fencing"),
        "the replay command keeps the flag:\n{out}"
    );
}

/// A run over etcd (`extra` adds the mode, seed and faults) holds, injected every kind of
/// `kinds`, and judged its durable releases against the try-locks' refusals.
fn over_etcd_holds(extra: &[&str], kinds: &str) {
    let mut args = vec!["--backend", "etcd", "--fault-count", "8", "--faults", kinds];
    args.extend_from_slice(extra);
    let (code, out, dir) = faults(&args);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("verdict: no violation"), "{out}");
    for kind in kinds.split(',') {
        assert!(
            injected(&out, kind) >= 1,
            "no {kind} fault injected:\n{out}"
        );
    }
    assert!(out.contains("holds     releases kept"), "{out}");
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    assert!(
        history.contains("\"durable\":true"),
        "no durable release recorded"
    );
    assert!(
        history.contains("\"current_token\""),
        "no refusal naming a holder"
    );
    assert!(
        out.contains(" --backend etcd --lockds 3 --leader-ttl-ms 2000 "),
        "{out}"
    );
}

/// The leading lockd paused past its term, killed and cut off from etcd; a follower killed.
#[test]
fn a_fault_run_over_etcd_holds_when_the_leader_fails() {
    over_etcd_holds(
        &["--mode", "http", "--seed", SEED_LEADER],
        "leader-pause,lockd,follower,isolate",
    );
}

/// etcd members killed (one, and two: no quorum), the leader slowed on its way to etcd, and
/// its clock jumping; through the PostgreSQL mode.
#[test]
fn a_fault_run_over_etcd_holds_when_etcd_and_clocks_fail() {
    over_etcd_holds(
        &["--mode", "pg", "--seed", SEED_ETCD],
        "member,quorum,etcd-delay,clock",
    );
}

#[test]
fn the_fault_runner_refuses_options_that_do_not_fit() {
    let (code, out, _dir) = faults(&["--mode", "http", "--faults", "postgres"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--faults postgres needs --mode pg"), "{out}");
    let (code, out, _dir) = faults(&["--faults", "quorum"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("--faults quorum needs --backend etcd"),
        "{out}"
    );
    let (code, out, _dir) = faults(&["--backend", "etcd", "--leader-ttl-ms", "500"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--leader-ttl-ms"), "{out}");
    let (code, out, _dir) = faults(&["--clients", "0"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--clients"), "{out}");
}
