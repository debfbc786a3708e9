//! lockctl against lockd.

use e2e::{Lockd, Spawned, output, process_exists};

use crate::json;

fn acquire_json(lockd: &Lockd, args: &[&str]) -> serde_json::Value {
    let mut cmd = lockd.lockctl();
    cmd.args(["--json", "acquire"]).args(args);
    let (status, stdout, stderr) = output(cmd);
    assert!(
        status.success(),
        "acquire {args:?} failed: {status}\n{stderr}"
    );
    json(&stdout)
}

fn release(lockd: &Lockd, resource: &str, lease: &serde_json::Value) {
    let mut cmd = lockd.lockctl();
    cmd.args(["release", resource, lease["lease_id"].as_str().unwrap()]);
    let (status, stdout, stderr) = output(cmd);
    assert!(
        status.success() && stdout.starts_with("released"),
        "{status} {stdout} {stderr}"
    );
}

fn describe(lockd: &Lockd, resource: &str) -> serde_json::Value {
    let mut cmd = lockd.lockctl();
    cmd.args(["--json", "describe", resource]);
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "{stderr}");
    json(&stdout)
}

/// A `lockctl run` whose command prints `pid $$` first: the running lockctl and the command's
/// pid, once it has started.
fn started(cmd: std::process::Command) -> (Spawned, i32) {
    let run = Spawned::spawn(cmd);
    let line = run
        .stdout
        .wait_for("the command to start", |l| l.starts_with("pid "));
    let pid = line[4..].trim().parse().expect("a pid");
    (run, pid)
}

fn token(v: &serde_json::Value) -> u64 {
    v["token"].as_u64().expect("token")
}

#[test]
fn contention_waiting_and_fifo_hand_off() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let a = acquire_json(&lockd, &["fifo", "--ttl", "60s", "--holder", "A"]);

    // Contention is an outcome with its own exit code, naming the holder.
    let mut busy = lockd.lockctl();
    busy.args(["acquire", "fifo", "--holder", "X"]);
    let (status, _, stderr) = output(busy);
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("busy")
            && stderr.contains("\"A\"")
            && stderr.contains(&format!("token {}", token(&a))),
        "{stderr}"
    );

    // B, C and D queue in that order.
    let mut waiters: Vec<Spawned> = Vec::new();
    for (i, holder) in ["B", "C", "D"].iter().enumerate() {
        let mut cmd = lockd.lockctl();
        cmd.args([
            "--json", "acquire", "fifo", "--ttl", "60s", "--wait", "60s", "--holder", holder,
        ]);
        waiters.push(Spawned::spawn(cmd));
        lockd.wait_event("queued", |e| {
            e["resource"] == "fifo" && e["position"] == i as u64 + 1
        });
    }
    let d = describe(&lockd, "fifo");
    assert_eq!(
        (d["holder"].as_str(), d["waiters"].as_u64()),
        (Some("A"), Some(3))
    );

    // Each release hands the lock to the head of the queue, and only to it.
    let mut previous = a;
    for (i, holder) in ["B", "C", "D"].iter().enumerate() {
        release(&lockd, "fifo", &previous);
        let status = waiters[i].wait();
        assert!(status.success(), "{holder}: {}", waiters[i].stderr.text());
        let granted = json(&waiters[i].stdout.text());
        assert!(
            token(&granted) > token(&previous),
            "tokens rise with each hand-off"
        );
        for later in &mut waiters[i + 1..] {
            assert!(later.running(), "a later waiter was served before {holder}");
        }
        let d = describe(&lockd, "fifo");
        assert_eq!(d["holder"].as_str(), Some(*holder));
        assert_eq!(d["token"], granted["token"]);
        assert_eq!(d["waiters"].as_u64(), Some(2 - i as u64));
        previous = granted;
    }
    release(&lockd, "fifo", &previous);
    assert_eq!(describe(&lockd, "fifo")["held"], false);
}

#[test]
fn several_leases_are_renewed_and_released_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let a = acquire_json(&lockd, &["batch/a", "--ttl", "60s"]);
    let b = acquire_json(&lockd, &["batch/b", "--ttl", "60s"]);
    let id = |v: &serde_json::Value| v["lease_id"].as_str().unwrap().to_string();
    let (a_id, b_id) = (id(&a), id(&b));
    release(&lockd, "batch/b", &b);

    let mut renew = lockd.lockctl();
    renew.args(["--json", "renew", "batch/a", &a_id, "batch/b", &b_id]);
    let (status, stdout, stderr) = output(renew);
    assert_eq!(
        status.code(),
        Some(4),
        "a lease that is not current is exit 4: {stdout} {stderr}"
    );
    let lines: Vec<serde_json::Value> = stdout.lines().map(json).collect();
    assert_eq!(lines.len(), 2, "a line per lease: {stdout}");
    assert_eq!(lines[0]["resource"], "batch/a");
    assert_eq!(lines[0]["renewed"], true);
    assert_eq!(lines[0]["ttl_ms"], 60_000);
    assert_eq!(lines[1]["resource"], "batch/b");
    assert_eq!(lines[1]["renewed"], false);

    let mut odd = lockd.lockctl();
    odd.args(["release", "batch/a", &a_id, "batch/b"]);
    let (status, _, stderr) = output(odd);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("batch/b has no LEASE_ID"), "{stderr}");
    assert_eq!(
        describe(&lockd, "batch/a")["held"],
        true,
        "nothing released"
    );

    let mut both = lockd.lockctl();
    both.args(["release", "batch/a", &a_id, "batch/b", &b_id]);
    let (status, stdout, stderr) = output(both);
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "released batch/a",
            "batch/b: that lease was not current (already released or expired); nothing to do"
        ],
        "{stdout}"
    );
    assert_eq!(describe(&lockd, "batch/a")["held"], false);
}

#[test]
fn a_reentrant_lock_is_acquired_again_by_its_owner_and_released_hold_by_hold() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let first = acquire_json(&lockd, &["nightly", "--owner", "job-7", "--ttl", "60s"]);
    let again = acquire_json(&lockd, &["nightly", "--owner", "job-7", "--ttl", "60s"]);
    assert_eq!(first["holds"], 1);
    assert_eq!(again["holds"], 2, "{again}");
    assert_eq!(again["lease_id"], first["lease_id"]);
    assert_eq!(token(&again), token(&first));
    assert_eq!(describe(&lockd, "nightly")["holds"], 2);
    let mut other = lockd.lockctl();
    other.args(["acquire", "nightly", "--owner", "job-8"]);
    let (status, _, stderr) = output(other);
    assert_eq!(status.code(), Some(3), "another owner is busy: {stderr}");

    let id = first["lease_id"].as_str().unwrap();
    let mut release = lockd.lockctl();
    release.args(["release", "nightly", id]);
    let (status, stdout, stderr) = output(release);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "released one hold of nightly; 1 left");
    assert_eq!(describe(&lockd, "nightly")["held"], true);
    release_text(&lockd, "nightly", id, "released nightly");
    assert_eq!(describe(&lockd, "nightly")["held"], false);
}

fn release_text(lockd: &Lockd, resource: &str, lease_id: &str, expected: &str) {
    let mut cmd = lockd.lockctl();
    cmd.args(["release", resource, lease_id]);
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), expected);
}

#[test]
fn a_retried_request_id_returns_the_original_grant() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let first = acquire_json(&lockd, &["dedup", "--request-id", "job-42", "--ttl", "60s"]);
    let retry = acquire_json(&lockd, &["dedup", "--request-id", "job-42", "--ttl", "60s"]);
    assert_eq!(first["lease_id"], retry["lease_id"]);
    assert_eq!(first["token"], retry["token"]);
    assert_eq!(
        (first["duplicate"].as_bool(), retry["duplicate"].as_bool()),
        (Some(false), Some(true))
    );
    // The same id for another resource is a client bug, refused with a clear message.
    let mut other = lockd.lockctl();
    other.args(["acquire", "elsewhere", "--request-id", "job-42"]);
    let (status, _, stderr) = output(other);
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("already used to acquire dedup"), "{stderr}");
}

#[test]
fn a_request_id_whose_grant_ended_is_not_granted_again() {
    // A cron slot named by its request id: once its run released the lock, a second run of the
    // same slot (a retry, a duplicate timer) is told so; it does not take the lock anew.
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let first = acquire_json(
        &lockd,
        &["nightly", "--request-id", "slot-0600", "--ttl", "60s"],
    );
    release(&lockd, "nightly", &first);
    let mut again = lockd.lockctl();
    again.args([
        "acquire",
        "nightly",
        "--request-id",
        "slot-0600",
        "--ttl",
        "60s",
    ]);
    let (status, stdout, stderr) = output(again);
    assert_eq!(status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("\"slot-0600\" was granted before and that grant has ended"),
        "{stderr}"
    );
    assert_eq!(describe(&lockd, "nightly")["held"], false);
    // A new slot acquires, with a newer token.
    let next = acquire_json(
        &lockd,
        &["nightly", "--request-id", "slot-0700", "--ttl", "60s"],
    );
    assert!(
        next["token"].as_u64() > first["token"].as_u64(),
        "{next} after {first}"
    );
}

#[test]
fn a_killed_waiter_leaves_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let holder = acquire_json(&lockd, &["gone", "--ttl", "60s"]);
    let mut cmd = lockd.lockctl();
    cmd.args(["acquire", "gone", "--wait", "60s"]);
    let mut waiter = Spawned::spawn(cmd);
    let queued = lockd.wait_event("queued", |e| e["resource"] == "gone");
    assert_eq!(describe(&lockd, "gone")["waiters"].as_u64(), Some(1));

    waiter.signal(libc::SIGKILL);
    waiter.wait();
    lockd.wait_event("waiter left: call cancelled or client disconnected", |e| {
        e["waiter"] == queued["waiter"]
    });
    assert_eq!(describe(&lockd, "gone")["waiters"].as_u64(), Some(0));
    // Released now, the lock goes to nobody: the dead waiter is not granted.
    release(&lockd, "gone", &holder);
    assert_eq!(describe(&lockd, "gone")["held"], false);
}

#[test]
fn run_gives_the_command_its_token_and_returns_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let mut cmd = lockd.lockctl();
    cmd.args([
        "run",
        "cron:nightly",
        "--",
        "sh",
        "-c",
        "echo \"$FENCING_RESOURCE $FENCING_TOKEN\"; exit 7",
    ]);
    let (status, stdout, stderr) = output(cmd);
    assert_eq!(status.code(), Some(7), "{stderr}");
    let (resource, tok) = stdout.trim().split_once(' ').expect("resource and token");
    assert_eq!(resource, "cron:nightly");
    assert!(tok.parse::<u64>().unwrap() >= 1);
    assert_eq!(
        describe(&lockd, "cron:nightly")["held"],
        false,
        "released when the command ended"
    );

    // Busy: the command does not run, and the exit code says "not granted".
    let _held = acquire_json(&lockd, &["cron:nightly", "--ttl", "60s"]);
    let marker = dir.path().join("ran");
    let mut cmd = lockd.lockctl();
    cmd.args(["run", "cron:nightly", "--", "touch"])
        .arg(&marker);
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(!marker.exists(), "the command ran without the lock");
}

#[test]
fn run_stops_the_command_when_the_lease_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut lockd = Lockd::start(dir.path(), &[]);
    let mut cmd = lockd.lockctl();
    // `exec` keeps the pid: the printed pid is the long-running command itself.
    cmd.args([
        "run",
        "lost",
        "--ttl",
        "1s",
        "--grace",
        "200ms",
        "--",
        "sh",
        "-c",
        "echo pid $$; exec sleep 600",
    ]);
    let (mut run, pid) = started(cmd);
    assert!(process_exists(pid));

    // lockd stops answering: no renewal succeeds, the local deadline passes, the command stops.
    lockd.process.signal(libc::SIGSTOP);
    let status = run.wait();
    lockd.process.signal(libc::SIGCONT);
    assert_eq!(status.code(), Some(4), "{}", run.stderr.text());
    assert!(
        run.stderr.text().contains("has not confirmed a renewal"),
        "{}",
        run.stderr.text()
    );
    assert!(
        !process_exists(pid),
        "the command is still running after its lease was lost"
    );

    // lockd, resumed, expires the lease on its own clock.
    lockd.wait_event("lease expired without renewal", |e| e["resource"] == "lost");
    assert_eq!(describe(&lockd, "lost")["held"], false);
    lockd.kill9();
}

/// Issue 19: with lockd paused, a command that ignores SIGTERM is dead (SIGKILL, reaped)
/// before the lease could have expired at lockd: before the last renewal lockd confirmed,
/// plus the TTL.
#[test]
fn run_kills_a_command_that_ignores_sigterm_before_the_lease_could_expire_at_lockd() {
    let dir = tempfile::tempdir().unwrap();
    let mut lockd = Lockd::start(dir.path(), &[]);
    let ttl = std::time::Duration::from_secs(6);
    let mut cmd = lockd.lockctl();
    cmd.args([
        "run",
        "cron:stubborn",
        "--ttl",
        "6s",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo pid $$; while :; do sleep 0.1; done",
    ]);
    let (mut run, pid) = started(cmd);
    // A renewal confirmed, then lockd stops answering (and logging) for good.
    lockd.wait_event("renewed", |e| e["resource"] == "cron:stubborn");
    lockd.process.signal(libc::SIGSTOP);
    let status = run.wait();
    let stopped = std::time::SystemTime::now();
    lockd.process.signal(libc::SIGCONT);
    assert_eq!(status.code(), Some(4), "{}", run.stderr.text());
    assert!(!process_exists(pid), "the command outlived its lease");
    // The last renewal lockd confirmed: logged before its answer was sent.
    let log = lockd.process.stderr.text();
    let last = log
        .lines()
        .filter_map(e2e::event)
        .filter(|e| e["message"] == "renewed" && e["resource"] == "cron:stubborn")
        .filter_map(|e| e["timestamp"].as_str().map(str::to_string))
        .next_back()
        .expect("a confirmed renewal");
    let last = humantime::parse_rfc3339(&last).unwrap();
    let expiry = last + ttl;
    assert!(
        stopped < expiry,
        "lockctl exited {:?} after the lease could have expired at lockd",
        stopped.duration_since(expiry).unwrap_or_default()
    );
    let said = run.stderr.text();
    assert!(said.contains("SIGKILL after 1s"), "{said}");
    lockd.kill9();
}

#[test]
fn a_grace_that_does_not_fit_the_ttl_is_refused_before_the_lock_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let marker = dir.path().join("ran");
    let mut cmd = lockd.lockctl();
    cmd.args([
        "run", "cron:g", "--ttl", "2s", "--grace", "1s", "--", "touch",
    ])
    .arg(&marker);
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("must fit in half the TTL"), "{stderr}");
    assert!(!marker.exists());
    assert_eq!(describe(&lockd, "cron:g")["held"], false);
    // Without --ttl, lockd's default (30 s) decides, after the grant, and the lock is released.
    let mut cmd = lockd.lockctl();
    cmd.args(["run", "cron:g", "--grace", "20s", "--", "touch"])
        .arg(&marker);
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("does not fit a lease of 30s"), "{stderr}");
    assert!(!marker.exists());
    assert_eq!(describe(&lockd, "cron:g")["held"], false);
}

#[test]
fn bad_input_gets_a_clear_error_and_the_documented_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let long = "x".repeat(300);
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["acquire", "has space"], 1, "allowed are"),
        (vec!["acquire", &long], 1, "limit is 256 bytes"),
        (
            vec!["acquire", "r", "--ttl", "10ms"],
            1,
            "outside the allowed range 100",
        ),
        (
            vec!["acquire", "r", "--holder", "a\u{7}b"],
            1,
            "control characters",
        ),
        (
            vec!["renew", "r", "not-a-lease"],
            1,
            "32 hexadecimal digits",
        ),
        (
            vec!["renew", "r", "0123456789abcdef0123456789abcdef"],
            4,
            "not the current lease",
        ),
        (
            vec!["acquire", "r", "--wait", "forever"],
            2,
            "invalid value",
        ),
    ];
    for (args, code, needle) in cases {
        let mut cmd = lockd.lockctl();
        cmd.args(&args);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    // lockd is unharmed.
    acquire_json(&lockd, &["still-serving"]);
}

/// Issue 19: `run --lock a --lock b` holds every lock while the command runs and gives it
/// every token (FENCING_TOKENS); in sorted order, or all at once with --atomic; a set not
/// granted runs nothing and holds nothing.
#[test]
fn run_with_several_locks_passes_every_token() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let script = "echo \"$FENCING_TOKENS|${FENCING_TOKEN-unset}\"; exit 5";
    let tokens = |args: &[&str]| -> Vec<(String, u64)> {
        let mut cmd = lockd.lockctl();
        cmd.arg("run").args(args).args(["--", "sh", "-c", script]);
        let (status, stdout, stderr) = output(cmd);
        assert_eq!(status.code(), Some(5), "{stderr}");
        let (pairs, single) = stdout.trim().split_once('|').expect("two fields");
        assert_eq!(
            single, "unset",
            "with several locks FENCING_TOKEN would be a guess"
        );
        pairs
            .split(',')
            .map(|p| {
                let (r, t) = p.split_once('=').expect("RESOURCE=TOKEN");
                (r.to_string(), t.parse().expect("a token"))
            })
            .collect()
    };
    let ordered = tokens(&["--lock", "job:b", "--lock", "job:a", "--lock", "job:b"]);
    let names: Vec<&str> = ordered.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(names, ["job:a", "job:b"], "sorted, each once");
    assert!(
        ordered[0].1 < ordered[1].1,
        "taken one after the other: {ordered:?}"
    );
    let atomic = tokens(&[
        "--atomic", "--lock", "job:b", "--lock", "job:a", "--lock", "job:b",
    ]);
    let names: Vec<&str> = atomic.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(names, ["job:b", "job:a"], "in the order given");
    assert!(
        atomic[0].1 > ordered[1].1 && atomic[1].1 == atomic[0].1 + 1,
        "{atomic:?}"
    );
    for r in ["job:a", "job:b"] {
        assert_eq!(
            describe(&lockd, r)["held"],
            false,
            "{r} released when the command ended"
        );
    }

    // job:b is held: neither way runs the command, and job:a is not kept.
    let _held = acquire_json(&lockd, &["job:b", "--ttl", "60s"]);
    let marker = dir.path().join("ran");
    for atomic in [false, true] {
        let mut cmd = lockd.lockctl();
        cmd.args(["run", "--lock", "job:a", "--lock", "job:b"]);
        if atomic {
            cmd.arg("--atomic");
        }
        cmd.args(["--", "touch"]).arg(&marker);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(3), "{stderr}");
        assert!(stderr.contains("job:b not granted"), "{stderr}");
        assert!(!marker.exists(), "the command ran without every lock");
        assert_eq!(
            describe(&lockd, "job:a")["held"],
            false,
            "job:a was given back"
        );
    }

    // A bad name is named, before anything is taken.
    for atomic in [false, true] {
        let mut cmd = lockd.lockctl();
        cmd.args(["run", "--lock", "job:a", "--lock", "job:x=1"]);
        if atomic {
            cmd.arg("--atomic");
        }
        cmd.args(["--", "true"]);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(1), "an invalid argument: {stderr}");
        assert!(stderr.contains("\"job:x=1\""), "{stderr}");
        assert_eq!(describe(&lockd, "job:a")["held"], false);
    }

    // A resource and --lock together, or --atomic alone, are refused as usage errors.
    for args in [
        &["run", "x", "--lock", "y", "--", "true"][..],
        &["run", "--atomic", "x", "--", "true"],
    ] {
        let mut cmd = lockd.lockctl();
        cmd.args(args);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
    }
}

/// Issue 19: a command run under several locks is stopped when one of them can no longer be
/// renewed, as under one.
#[test]
fn run_with_several_locks_stops_the_command_when_a_lease_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut lockd = Lockd::start(dir.path(), &[]);
    let mut cmd = lockd.lockctl();
    cmd.args([
        "run",
        "--lock",
        "two:a",
        "--lock",
        "two:b",
        "--ttl",
        "1s",
        "--grace",
        "200ms",
        "--",
        "sh",
        "-c",
        "echo pid $$; exec sleep 600",
    ]);
    let (mut run, pid) = started(cmd);
    lockd.process.signal(libc::SIGSTOP);
    let status = run.wait();
    lockd.process.signal(libc::SIGCONT);
    assert_eq!(status.code(), Some(4), "{}", run.stderr.text());
    assert!(!process_exists(pid), "the command outlived its leases");
    for r in ["two:a", "two:b"] {
        lockd.wait_event("lease expired without renewal", |e| e["resource"] == r);
    }
    lockd.kill9();
}

/// Issue 19: `run --permits N` holds one of the N permits of a semaphore while the command
/// runs, and names the permit as FENCING_RESOURCE; a full semaphore is not granted, or waited
/// for; every caller gives the same N.
#[test]
fn run_with_permits_holds_one_permit_of_the_semaphore() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let first = acquire_json(&lockd, &["jobs", "--permits", "2", "--ttl", "60s"]);
    assert_eq!(first["resource"], "jobs@permit-1", "{first}");
    let mut cmd = lockd.lockctl();
    cmd.args(["run", "--permits", "2", "jobs", "--", "sh", "-c"])
        .arg("echo \"$FENCING_RESOURCE $FENCING_TOKEN\"; exit 7");
    let (status, stdout, stderr) = output(cmd);
    assert_eq!(status.code(), Some(7), "{stderr}");
    let (resource, tok) = stdout.trim().split_once(' ').expect("resource and token");
    assert_eq!(
        resource, "jobs@permit-2",
        "the free permit, by its own name"
    );
    assert!(tok.parse::<u64>().unwrap() > token(&first));

    // Full: the command does not run; with --wait it runs once a permit is released.
    let second = acquire_json(&lockd, &["jobs", "--permits", "2", "--ttl", "60s"]);
    let d = describe(&lockd, "jobs");
    assert!(
        d["permits"] == 2 && d["permits_held"] == 2 && d["held"] == false,
        "{d}"
    );
    let marker = dir.path().join("ran");
    let mut cmd = lockd.lockctl();
    cmd.args(["run", "--permits", "2", "jobs", "--", "touch"])
        .arg(&marker);
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(!marker.exists(), "the command ran without a permit");
    let mut cmd = lockd.lockctl();
    cmd.args([
        "run",
        "--permits",
        "2",
        "--wait",
        "60s",
        "jobs",
        "--",
        "sh",
        "-c",
    ])
    .arg("echo \"got $FENCING_RESOURCE\"");
    let mut waiting = Spawned::spawn(cmd);
    while describe(&lockd, "jobs")["waiters"] != 1 {}
    release(&lockd, "jobs@permit-2", &second);
    waiting
        .stdout
        .wait_for("the waiter to get the freed permit", |l| {
            l == "got jobs@permit-2"
        });
    assert!(waiting.wait().success(), "{}", waiting.stderr.text());

    // Another N, or a permit's name as a lock, is refused with the reason.
    for (args, needle) in [
        (
            &["run", "--permits", "3", "jobs", "--", "true"][..],
            "has 2 permits",
        ),
        (&["acquire", "jobs@permit-1"][..], "reserved"),
        (&["acquire", "jobs"][..], "held as a semaphore of 2 permits"),
    ] {
        let mut cmd = lockd.lockctl();
        cmd.args(args);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let mut cmd = lockd.lockctl();
    cmd.args(["release", "jobs", first["lease_id"].as_str().unwrap()]);
    let (status, _, stderr) = output(cmd);
    assert_eq!(
        status.code(),
        Some(1),
        "a release under the semaphore's name: {stderr}"
    );
    assert!(stderr.contains("jobs@permit-K"), "{stderr}");
    for args in [
        &[
            "run",
            "--permits",
            "2",
            "--lock",
            "a",
            "--lock",
            "b",
            "--",
            "true",
        ][..],
        &["run", "--permits", "0", "jobs", "--", "true"],
        &["run", "--permits", "1001", "jobs", "--", "true"],
        &["acquire", "--permits", "2", "--owner", "o", "jobs"],
    ] {
        let mut cmd = lockd.lockctl();
        cmd.args(args);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
    }
    release(&lockd, "jobs@permit-1", &first);
}

/// A read-write lock through lockctl: readers share it, a writer waits behind them, and a
/// reader that comes after the waiting writer waits behind it (it neither runs nor is granted
/// before the writer has run); each gets its own FENCING_RESOURCE and a rising token; a
/// downgrade prints the reader's lease; bad combinations are usage errors.
#[test]
fn run_write_waits_behind_readers_and_later_readers_wait_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let r1 = acquire_json(&lockd, &["doc", "--read", "--ttl", "60s"]);
    let r2 = acquire_json(&lockd, &["doc", "--read", "--ttl", "60s"]);
    assert_eq!(
        (r1["resource"].as_str(), r2["resource"].as_str()),
        (Some("doc@read-1"), Some("doc@read-2")),
        "each reader on its own slot"
    );
    let mut cmd = lockd.lockctl();
    cmd.args(["run", "--write", "--wait", "60s", "doc", "--", "sh", "-c"])
        .arg("echo \"wrote $FENCING_RESOURCE $FENCING_TOKEN\"");
    let mut writer = Spawned::spawn(cmd);
    while describe(&lockd, "doc")["waiters"] != 1 {}
    // A reader after the waiting writer is not granted, and waits behind it.
    let mut cmd = lockd.lockctl();
    cmd.args(["acquire", "--read", "doc"]);
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(3), "behind the writer: {stderr}");
    let mut cmd = lockd.lockctl();
    cmd.args(["run", "--read", "--wait", "60s", "doc", "--", "sh", "-c"])
        .arg("echo \"read $FENCING_RESOURCE $FENCING_TOKEN\"");
    let mut reader = Spawned::spawn(cmd);
    while describe(&lockd, "doc")["waiters"] != 2 {}
    let d = describe(&lockd, "doc");
    assert!(d["readers"] == 2 && d["held"] == false, "{d}");

    release(&lockd, "doc@read-1", &r1);
    release(&lockd, "doc@read-2", &r2);
    let wrote = writer
        .stdout
        .wait_for("the writer to run", |l| l.starts_with("wrote "));
    assert!(writer.wait().success(), "{}", writer.stderr.text());
    let read = reader
        .stdout
        .wait_for("the reader to run", |l| l.starts_with("read "));
    assert!(reader.wait().success(), "{}", reader.stderr.text());
    let fields = |line: &str| -> (String, u64) {
        let mut w = line.split(' ').skip(1);
        let resource = w.next().expect("a resource").to_string();
        (
            resource,
            w.next().expect("a token").parse().expect("a number"),
        )
    };
    let (wrote_on, write_token) = fields(&wrote);
    let (read_on, read_token) = fields(&read);
    assert_eq!(wrote_on, "doc", "the writer fences with the lock's name");
    assert_eq!(read_on, "doc@read-1", "a reader with its slot's");
    assert!(
        token(&r2) < write_token && write_token < read_token,
        "the writer came after the first readers and before the last: {wrote} / {read}"
    );

    // A downgrade prints the reader's lease; the write lease is gone.
    let w = acquire_json(&lockd, &["doc", "--write", "--ttl", "60s"]);
    let mut cmd = lockd.lockctl();
    cmd.args([
        "--json",
        "downgrade",
        "doc",
        w["lease_id"].as_str().unwrap(),
    ]);
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "{stderr}");
    let down = json(&stdout);
    assert!(
        down["resource"] == "doc@read-1" && token(&down) > token(&w),
        "{down}"
    );
    let mut cmd = lockd.lockctl();
    cmd.args(["downgrade", "doc", w["lease_id"].as_str().unwrap()]);
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(4), "a spent write lease: {stderr}");
    assert!(stderr.contains("not the current write lease"), "{stderr}");
    release(&lockd, "doc@read-1", &down);

    for args in [
        &["acquire", "--read", "--write", "doc"][..],
        &["acquire", "--read", "--permits", "2", "doc"],
        &["acquire", "--write", "--owner", "o", "doc"],
        &[
            "run", "--read", "--atomic", "--lock", "a", "--lock", "b", "--", "true",
        ],
    ] {
        let mut cmd = lockd.lockctl();
        cmd.args(args);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
    }
}
