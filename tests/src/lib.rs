//! The end-to-end test harness: the project's real binaries as child processes, their output
//! as events to wait on, and the faults the tests inject (SIGKILL, SIGSTOP/SIGCONT).
//!
//! Tests never sleep to synchronise: they wait for an *event* (a log line, an output line, a
//! process exit) with a generous timeout that only bounds how long a broken build can hang.
//!
//! The binaries are the ones `cargo build --workspace --bins --tests` puts next to the test
//! executable. A missing binary, or one older than the sources it is built from, fails the test
//! with the command that fixes it, so a stale build is never silently tested.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

pub mod api;
pub mod certs;
pub mod chromium;
pub mod client;
pub mod etcd;
pub mod ha;
pub mod keys;
pub mod pg;
pub mod raw;
pub mod redis;
pub mod replicated;
pub mod stacks;
pub mod tap;
pub mod upstream;
pub mod zookeeper;

/// How long any wait may take before the test fails. Generous: it only bounds a hang.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// Path of a workspace binary, checked to exist and to be newer than the sources.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    // A test: target/<profile>/deps/<test> → target/<profile>/<name>. A binary that uses the
    // harness (the fault runner): target/<profile>/<it> → target/<profile>/<name>.
    let mut dir = exe.parent().expect("an executable lives in a directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("deps/ is inside target/<profile>");
    }
    let path = dir.join(name);
    let built = match std::fs::metadata(&path).and_then(|m| m.modified()) {
        Ok(t) => t,
        Err(_) => panic!(
            "{} is missing: build the binaries first with `cargo build --workspace --bins --tests` (README: run the tests)",
            path.display()
        ),
    };
    if let Some((source, changed)) = newest_source(name) {
        assert!(
            changed <= built,
            "{} is older than {}: rebuild with `cargo build --workspace --bins --tests` before running the tests",
            path.display(),
            source.display()
        );
    }
    path
}

/// The crates each binary is built from (their `src/`, `proto/` and `build.rs` count).
fn crates_of(name: &str) -> &'static [&'static str] {
    match name {
        "lockd" => &[
            "fencing",
            "lockd-core",
            "lockd-store",
            "lockd-store-etcd",
            "lockd-proto",
            "lockd-server",
            "../tools/cli-docs",
        ],
        "lockctl" => &[
            "fencing",
            "lockd-proto",
            "lockd-client",
            "../tools/cli-docs",
        ],
        "fence-proxy" => &[
            "fencing",
            "../proxy/http-relay",
            "../proxy/pg-wire",
            "../proxy/pg-relay",
            "../proxy/fence-proxy",
            "../tools/cli-docs",
        ],
        "verify" => &["fencing", "../verifier", "../tools/cli-docs"],
        "cron-dedup" => &["../examples/cron-dedup"],
        "zombie" => &["fencing", "../examples/zombie", "../verifier", "../tests"],
        "faults" => &["fencing", "../examples/faults", "../verifier", "../tests"],
        "testbed" => &["fencing", "../clients/testbed", "../tests"],
        _ => &[],
    }
}

fn newest_source(name: &str) -> Option<(PathBuf, SystemTime)> {
    let mut newest: Option<(PathBuf, SystemTime)> = None;
    let mut stack = Vec::new();
    for krate in crates_of(name) {
        let dir = workspace().join("lockd").join(krate);
        stack.extend([dir.join("src"), dir.join("proto"), dir.join("build.rs")]);
    }
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        } else if let Ok(t) = meta.modified()
            // Test-only modules (`machine_tests.rs`) are not in the binary: cargo does not
            // rebuild it when they change.
            && !p.to_string_lossy().ends_with("_tests.rs")
            && newest.as_ref().is_none_or(|(_, n)| t > *n)
        {
            newest = Some((p, t));
        }
    }
    newest
}

/// Lines a child process wrote, collected by a thread, that a test can wait on.
#[derive(Default)]
pub struct Lines {
    state: Mutex<(Vec<String>, bool)>,
    changed: Condvar,
}

impl Lines {
    fn collect(stream: impl Read + Send + 'static) -> Arc<Lines> {
        let lines = Arc::new(Lines::default());
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                let mut st = sink.state.lock().unwrap();
                st.0.push(line);
                sink.changed.notify_all();
            }
            sink.state.lock().unwrap().1 = true;
            sink.changed.notify_all();
        });
        lines
    }

    /// Waits until the stream has ended (the writer closed it); false if it has not within
    /// `PATIENCE` (something the process started may still hold it open).
    fn wait_closed(&self) -> bool {
        let deadline = Instant::now() + PATIENCE;
        let mut st = self.state.lock().unwrap();
        while !st.1 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self.changed.wait_timeout(st, left).unwrap().0;
        }
        true
    }

    /// Everything so far, one line each. (Also while unwinding from a failed wait, which
    /// poisoned the lock: the lines are still whole.)
    pub fn text(&self) -> String {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .join("\n")
    }

    /// Waits for the first line (from the beginning) that `pred` accepts.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_for_nth(what, 1, pred)
    }

    /// Waits until `n` lines (counted from the beginning) satisfy `pred`; returns the n-th.
    pub fn wait_for_nth(&self, what: &str, n: usize, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        let mut st = self.state.lock().unwrap();
        loop {
            if let Some(line) = st.0.iter().filter(|l| pred(l)).nth(n - 1) {
                return line.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !st.1 && !left.is_zero(),
                "gave up waiting for {what}; output so far:\n{}",
                st.0.join("\n")
            );
            st = self.changed.wait_timeout(st, left).unwrap().0;
        }
    }
}

/// A child process whose output and exit can be waited on.
pub struct Spawned {
    pub pid: i32,
    pub stdout: Arc<Lines>,
    pub stderr: Arc<Lines>,
    exit: Receiver<ExitStatus>,
    status: Option<ExitStatus>,
    name: String,
}

impl Spawned {
    pub fn spawn(mut cmd: Command) -> Spawned {
        let name = format!("{cmd:?}");
        let mut child: Child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = Lines::collect(child.stdout.take().expect("piped"));
        let stderr = Lines::collect(child.stderr.take().expect("piped"));
        let pid = child.id() as i32;
        let (tx, exit) = channel();
        std::thread::spawn(move || {
            if let Ok(status) = child.wait() {
                let _ = tx.send(status);
            }
        });
        Spawned {
            pid,
            stdout,
            stderr,
            exit,
            status: None,
            name,
        }
    }

    /// Waits for the process to exit and for what it wrote to be read: after it, `stdout` and
    /// `stderr` hold everything (the reader threads may lag behind the exit).
    pub fn wait(&mut self) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        match self.exit.recv_timeout(PATIENCE) {
            Ok(s) => {
                self.status = Some(s);
                for (name, lines) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
                    assert!(
                        lines.wait_closed(),
                        "{} exited but its {name} stayed open for {PATIENCE:?}",
                        self.name
                    );
                }
                s
            }
            Err(RecvTimeoutError::Timeout) => panic!(
                "{} did not exit within {PATIENCE:?}\nstdout:\n{}\nstderr:\n{}",
                self.name,
                self.stdout.text(),
                self.stderr.text()
            ),
            Err(RecvTimeoutError::Disconnected) => panic!("lost track of {}", self.name),
        }
    }

    /// Sends `sig` and waits up to `within` for the exit, without panicking (for `Drop`):
    /// whether it exited.
    pub fn stop_quietly(&mut self, sig: libc::c_int, within: std::time::Duration) -> bool {
        if self.status.is_some() {
            return true;
        }
        self.signal(sig);
        match self.exit.recv_timeout(within) {
            Ok(s) => {
                self.status = Some(s);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether it is still running (without waiting).
    pub fn running(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(s) = self.exit.try_recv()
        {
            self.status = Some(s);
        }
        self.status.is_none()
    }

    /// Waits until `n` JSON log events (on stderr) with this message satisfy `pred`; returns
    /// the n-th.
    pub fn wait_events(&self, message: &str, n: usize, pred: impl Fn(&Value) -> bool) -> Value {
        let what = format!("{n} event(s) {message:?} from {}", self.name);
        let line = self.stderr.wait_for_nth(&what, n, |l| {
            event(l).is_some_and(|e| e["message"] == message && pred(&e))
        });
        event(&line).expect("matched a JSON event")
    }

    /// Waits until the process has logged a failed TLS handshake whose reason contains
    /// `reason`; returns that event.
    pub fn wait_handshake_failure(&self, reason: &str) -> Value {
        self.wait_events("TLS handshake failed; connection closed", 1, |e| {
            e["reason"].as_str().is_some_and(|r| r.contains(reason))
        })
    }

    /// Sends a signal, if it is still running.
    pub fn signal(&mut self, sig: libc::c_int) {
        if self.running() {
            // SAFETY: kill(2) on our own child's pid; it has not been reaped (still running).
            unsafe {
                libc::kill(self.pid, sig);
            }
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // Killed and reaped before the next process may start: a lockd dropped and started
        // again on the same data directory must not find the old one still holding its
        // lock (CI at 81ad2c0 saw "in use by another lockd process" after a drop).
        let _ = self.stop_quietly(libc::SIGKILL, PATIENCE);
        // A failing test shows what its lockd processes said (the last lines of each); so does
        // every test with E2E_SHOW_LOGS set.
        let asked = std::env::var_os("E2E_SHOW_LOGS").is_some();
        if (asked || std::thread::panicking()) && self.name.contains("lockd\"") {
            let text = self.stderr.text();
            let lines: Vec<&str> = text.lines().collect();
            let keep = if asked { lines.len() } else { 60 };
            let tail = &lines[lines.len().saturating_sub(keep)..];
            eprintln!(
                "--- the last lines of {} (pid {}):\n{}",
                self.name,
                self.pid,
                tail.join("\n")
            );
        }
    }
}

/// Whether a process with this pid exists (is not yet reaped).
pub fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// A lockd process on a loopback port, logging JSON events the test can wait on.
pub struct Lockd {
    pub process: Spawned,
    pub data_dir: PathBuf,
    pub endpoint: String,
}

impl Lockd {
    /// Starts lockd on `data_dir` with `extra` arguments and waits until it listens.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Lockd {
        Lockd::start_on(data_dir, "127.0.0.1:0", extra)
    }

    /// Like [`Lockd::start`], on a given address.
    pub fn start_on(data_dir: &Path, listen: &str, extra: &[&str]) -> Lockd {
        Lockd::start_with_env(data_dir, listen, extra, &[])
    }

    /// Like [`Lockd::start_on`], with these environment variables set.
    pub fn start_with_env(
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Lockd {
        let mut cmd = Command::new(bin("lockd"));
        cmd.envs(env.iter().copied());
        cmd.arg("--data-dir")
            .arg(data_dir)
            .args([
                "--listen",
                listen,
                "--log-format",
                "json",
                "--log",
                "info,lockd_server=debug",
            ])
            .args(extra)
            .env_remove("LOCKD_CONFIG");
        let process = Spawned::spawn(cmd);
        let listening = process.stderr.wait_for("lockd to listen", |l| {
            event(l).is_some_and(|e| e["message"] == "listening")
        });
        let addr = event(&listening)
            .and_then(|e| e["addr"].as_str().map(str::to_string))
            .expect("listening event has addr");
        let scheme = if extra.contains(&"--tls-cert") {
            "https"
        } else {
            "http"
        };
        Lockd {
            process,
            data_dir: data_dir.to_path_buf(),
            endpoint: format!("{scheme}://{addr}"),
        }
    }

    /// Waits for a log event with this message whose fields satisfy `pred`.
    pub fn wait_event(&self, message: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.process.wait_events(message, 1, pred)
    }

    /// Waits until `n` log events with this message satisfy `pred`; returns the n-th.
    pub fn wait_events(&self, message: &str, n: usize, pred: impl Fn(&Value) -> bool) -> Value {
        self.process.wait_events(message, n, pred)
    }

    /// `kill -9`, and waits until it is gone.
    pub fn kill9(&mut self) {
        self.process.signal(libc::SIGKILL);
        self.process.wait();
    }

    /// The admin listener's address (lockd started with `--admin-listen`).
    pub fn admin(&self) -> String {
        let e = self.wait_event(
            "admin listening: /metrics, /healthz, /readyz, / (status page)",
            |_| true,
        );
        e["addr"].as_str().expect("the admin address").to_string()
    }

    /// A `lockctl` command aimed at this lockd.
    pub fn lockctl(&self) -> Command {
        let mut cmd = Command::new(bin("lockctl"));
        cmd.env("LOCKD_ENDPOINT", &self.endpoint);
        cmd
    }
}

/// A fence-proxy process, from a TOML configuration, logging JSON events.
pub struct FenceProxy {
    pub process: Spawned,
    /// The base URL of each `[[http]]` listener, in configuration order.
    pub urls: Vec<String>,
    /// The address (host:port) of each `[[pg]]` listener, in configuration order.
    pub pg: Vec<String>,
}

impl FenceProxy {
    /// Starts fence-proxy with `config` (written to `dir/proxy.toml`; the harness sets the log
    /// settings) and waits until its `listeners` HTTP listeners listen.
    pub fn start(dir: &Path, config: &str, listeners: usize) -> FenceProxy {
        FenceProxy::start_with(dir, config, listeners, 0)
    }

    /// Starts fence-proxy with `http` HTTP listeners and `pg` PostgreSQL listeners.
    pub fn start_with(dir: &Path, config: &str, http: usize, pg: usize) -> FenceProxy {
        let process = FenceProxy::spawn(dir, config);
        let mut urls = Vec::new();
        for i in 1..=http {
            let e = process.wait_events("listening (http)", i, |_| true);
            urls.push(format!(
                "http://{}",
                e["addr"].as_str().expect("listening event has addr")
            ));
        }
        let mut pgs = Vec::new();
        for i in 1..=pg {
            let e = process.wait_events("listening (pg)", i, |_| true);
            pgs.push(
                e["addr"]
                    .as_str()
                    .expect("listening event has addr")
                    .to_string(),
            );
        }
        FenceProxy {
            process,
            urls,
            pg: pgs,
        }
    }

    /// Starts fence-proxy with `config` as [`FenceProxy::start_with`] does, without waiting
    /// for anything.
    pub fn spawn(dir: &Path, config: &str) -> Spawned {
        let path = dir.join("proxy.toml");
        let text = format!(
            "log = \"info,http_relay=debug,pg_relay=debug\"\nlog_format = \"json\"\n{config}"
        );
        std::fs::write(&path, text).expect("writing the proxy configuration");
        let mut cmd = Command::new(bin("fence-proxy"));
        cmd.arg("--config")
            .arg(&path)
            .env_remove("FENCE_PROXY_CONFIG");
        Spawned::spawn(cmd)
    }

    /// Runs fence-proxy with `config` as [`FenceProxy::spawn`] does, expecting it to refuse
    /// the configuration (exit 2); returns what it said.
    pub fn refused(dir: &Path, config: &str) -> String {
        let mut p = FenceProxy::spawn(dir, config);
        assert_eq!(p.wait().code(), Some(2), "fence-proxy took {config:?}");
        p.stderr.text()
    }

    /// `kill -9`, and waits until it is gone.
    pub fn kill9(&mut self) {
        self.process.signal(libc::SIGKILL);
        self.process.wait();
    }

    /// The admin listener's address (started with `admin_listen`).
    pub fn admin(&self) -> String {
        let e = self.process.wait_events(
            "admin listening: /metrics, /healthz, /readyz, / (status page)",
            1,
            |_| true,
        );
        e["addr"].as_str().expect("the admin address").to_string()
    }
}

/// `promtool check metrics` of `text`: its complaints, if any (empty: none). Fails clearly
/// without promtool.
pub fn promtool(text: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool is missing ({e}): apt-get install prometheus, or run ./x test")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool failed: {out:?}");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The records of the audit log at `path` once `done` says they are complete (its writer is
/// a thread of its own), or a failure naming what was there after `PATIENCE`.
pub fn audit_records(path: &Path, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        if done(&records) {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "the audit log stayed at {records:?}"
        );
        std::thread::yield_now();
    }
}

/// A TCP connection to `addr` from the local address `from` (e.g. 127.0.0.2: another client
/// address on loopback), for tests of per-address bounds.
pub fn connect_from(from: &str, addr: std::net::SocketAddr) -> std::net::TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    let local: std::net::SocketAddr = format!("{from}:0").parse().expect("an IPv4 address");
    socket
        .bind(&local.into())
        .expect("binding to the source address");
    socket.connect(&addr.into()).expect("connecting");
    socket.into()
}

/// A loopback address with a port that was free a moment ago (for servers that must start
/// after their clients already know where to find them).
///
/// The port is taken below the kernel's ephemeral range (32768 and up): a port from that range
/// can be handed to some other test's outgoing connection between this check and the server's
/// bind. Ports are drawn at random from 20000-32767 and checked free, and each is *claimed*
/// for [`PORT_CLAIM`] (a file of its own in a directory every test process shares, created
/// only if absent): two tests that run at once never draw the same port, even though neither
/// holds it until its server binds it. (Before the claims, an etcd member and another test's
/// server once drew the same port: "address already in use".)
pub fn free_loopback_addr() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()) << 32
        | SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into());
    for _ in 0..1000 {
        // A cheap mix of the process, the time and a counter: different tests in parallel
        // draw different sequences.
        let n = DRAWS.fetch_add(1, Ordering::Relaxed);
        let x = (seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let port = 20_000 + (x >> 33) % 12_768;
        let addr = format!("127.0.0.1:{port}");
        if claim_port(port) && std::net::TcpListener::bind(&addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port found in 20000-32767")
}

/// How long a port drawn by [`free_loopback_addr`] stays claimed: longer than a test runs.
pub const PORT_CLAIM: Duration = Duration::from_secs(30 * 60);

/// Claims `port` for this process unless another claimed it less than [`PORT_CLAIM`] ago.
fn claim_port(port: u64) -> bool {
    let dir = std::env::temp_dir().join("lockd-e2e-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true; // no claims possible: the bind check alone
    }
    let file = dir.join(port.to_string());
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
            .is_ok()
    };
    if create() {
        return true;
    }
    let stale = std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > PORT_CLAIM));
    // A stale claim is taken over (two processes doing so at the same instant could both
    // take it; the bind check still stands).
    stale && std::fs::remove_file(&file).is_ok() && create()
}

/// Nanoseconds on the machine's monotonic clock: one clock for every process on the machine,
/// so that events recorded by separate processes (clients, runners) make one history.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One event of a history (docs/history.md), timed now on [`monotonic_ns`]; `extra` (a JSON
/// object) adds the fields the operation needs (token, value, note...).
pub fn history_event(kind: &str, process: &str, f: &str, resource: &str, extra: Value) -> Value {
    let mut e = serde_json::json!({
        "type": kind, "process": process, "time": monotonic_ns(), "f": f, "resource": resource,
    });
    if let (Some(e), Value::Object(extra)) = (e.as_object_mut(), extra) {
        e.extend(extra);
    }
    e
}

/// Parses one JSON log line.
pub fn event(line: &str) -> Option<Value> {
    serde_json::from_str(line).ok()
}

/// Runs a command to completion and returns (status, stdout, stderr).
pub fn output(mut cmd: Command) -> (ExitStatus, String, String) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `lockd --hash-token` of `token`: the policy file's `token_sha256` (the tool prints the
/// line to paste, `token_sha256 = "…"`, and this checks that it does).
pub fn sha256_hex(token: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(bin("lockd"))
        .arg("--hash-token")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run lockd --hash-token: {e}"));
    writeln!(child.stdin.take().expect("stdin"), "{token}").expect("writing the token");
    let out = child.wait_with_output().expect("lockd --hash-token ends");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "lockd --hash-token: {out:?}");
    text.trim()
        .strip_prefix("token_sha256 = \"")
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or_else(|| panic!("lockd --hash-token printed {text:?}"))
        .to_string()
}

/// `GET path` on `addr` over plain HTTP/1.1 (an admin listener): the status and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("sending the request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("reading the answer");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {raw:?}"));
    (status, body.to_string())
}

/// The value of the Prometheus sample `series` (name and labels exactly as exposed, e.g.
/// `lockd_requests_total{method="acquire",outcome="granted"}`) in `text`, if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod port_claims {
    #[test]
    fn a_drawn_port_is_not_drawn_again_while_claimed() {
        let addr = super::free_loopback_addr();
        let port: u64 = addr.rsplit(':').next().unwrap().parse().unwrap();
        assert!(
            !super::claim_port(port),
            "{addr} was claimed by the draw: no other test may draw it"
        );
        let again: Vec<String> = (0..20).map(|_| super::free_loopback_addr()).collect();
        assert!(!again.contains(&addr), "{addr} was drawn twice");
    }
}
