//! Demo: two hosts fire the same cron job; `lockctl run` lets one run and skips the other. Then
//! a job whose lock service stops answering is stopped before its lease could be handed on.
//!
//! Runs the real `lockd` and `lockctl` binaries from the same build directory as this one
//! (`cargo build --bins` builds all three), with a temporary data directory.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} not found: build everything first with `cargo build --bins`",
            path.display()
        );
    }
    Ok(path)
}

fn say(text: &str) {
    println!("\n== {text}");
}

fn lockctl(endpoint: &str) -> anyhow::Result<Command> {
    let mut cmd = Command::new(bin("lockctl")?);
    cmd.env("LOCKD_ENDPOINT", endpoint);
    Ok(cmd)
}

/// Reads lines from `child`'s stdout until one contains `needle`.
fn wait_line(child: &mut Child, needle: &str) -> anyhow::Result<String> {
    let out = child.stdout.as_mut().context("stdout is piped")?;
    let mut reader = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            bail!("output ended before {needle:?}");
        }
        print!("   | {line}");
        if line.contains(needle) {
            return Ok(line);
        }
    }
}

/// A child killed when dropped: lockd must not outlive the demo when a step fails (it holds
/// the demo's stdout, and whoever waits for the demo's output would wait for ever).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signalling our own child process; it may be stopped (SIGSTOP) by a step.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    say("starting lockd with a fresh data directory");
    let mut lockd = KillOnDrop(
        Command::new(bin("lockd")?)
            .arg("--data-dir")
            .arg(data.path())
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .stderr(Stdio::piped())
            .spawn()
            .context("starting lockd")?,
    );
    let addr = {
        let err = lockd.0.stderr.take().context("stderr is piped")?;
        let mut lines = BufReader::new(err).lines();
        let line = lines
            .find_map(|l| l.ok().filter(|l| l.contains("\"listening\"")))
            .context("lockd did not start")?;
        std::thread::spawn(move || lines.for_each(drop)); // keep draining its log
        let start = line
            .find("\"addr\":\"")
            .context("listening line names the address")?
            + 8;
        line[start..]
            .split('"')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let endpoint = format!("http://{addr}");
    println!("   lockd listens on {endpoint}");

    say("host A's cron fires `nightly-report` under `lockctl run reports:nightly`");
    let mut a = lockctl(&endpoint)?
        .args(["run", "reports:nightly", "--holder", "host-a", "--", "sh", "-c"])
        .arg("echo \"host A: report running with fencing token $FENCING_TOKEN\"; read finish; echo 'host A: report done'")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    wait_line(&mut a, "report running")?;

    say("host B's cron fires the same job at the same moment");
    let b = lockctl(&endpoint)?
        .args([
            "run",
            "reports:nightly",
            "--holder",
            "host-b",
            "--",
            "sh",
            "-c",
            "echo 'host B: report running'",
        ])
        .output()?;
    print!("   | {}", String::from_utf8_lossy(&b.stderr));
    println!(
        "   host B's lockctl exited with {} (3 = not granted): the job ran once",
        b.status.code().unwrap_or(-1)
    );
    if b.status.code() != Some(3) {
        bail!("host B should have been refused");
    }
    let described = lockctl(&endpoint)?
        .args(["describe", "reports:nightly"])
        .output()?;
    print!("   | {}", String::from_utf8_lossy(&described.stdout));

    say("host A's job finishes; lockctl releases the lock and exits with the job's status");
    a.stdin.take().context("stdin is piped")?.write_all(b"\n")?;
    wait_line(&mut a, "report done")?;
    println!(
        "   host A's lockctl exited with {}",
        a.wait()?.code().unwrap_or(-1)
    );

    say("a job holds a 1 s lease; then lockd stops answering (SIGSTOP), as in a partition");
    let mut c = lockctl(&endpoint)?
        .args([
            "run",
            "reports:hourly",
            "--ttl",
            "1s",
            "--grace",
            "200ms",
            "--",
            "sh",
            "-c",
        ])
        .arg("echo \"job: running with token $FENCING_TOKEN\"; exec sleep 600")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_line(&mut c, "job: running")?;
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(lockd.0.id() as i32, libc::SIGSTOP) };
    let status = c.wait()?;
    let mut why = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().context("stderr is piped")?, &mut why)?;
    for line in why.lines() {
        println!("   | {line}");
    }
    println!(
        "   lockctl exited with {} (4 = lease lost): the job was stopped before lockd could give the lock to anyone else",
        status.code().unwrap_or(-1)
    );
    drop(lockd);
    say(
        "done. A job that wrote through fence-proxy would also have had its late writes rejected by token.",
    );
    Ok(())
}
