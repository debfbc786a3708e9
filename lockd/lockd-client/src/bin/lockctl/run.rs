//! `lockctl run`: hold a lock while a command runs, and stop the command if the lock is lost.

use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use fencing::wire::{ENV_RESOURCE, ENV_TOKEN, ENV_TOKEN_NUMBER};
use lockd_client::LockGuard;
use tokio::signal::unix::{SignalKind, signal};

/// Runs `command` under `guard`. Returns lockctl's exit status.
pub async fn run(guard: LockGuard, command: &[String], grace: Duration) -> ExitCode {
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env(ENV_RESOURCE, guard.resource())
        .env(ENV_TOKEN, guard.fence_token())
        .env(ENV_TOKEN_NUMBER, guard.token().to_string())
        // Its own process group, so that stopping it stops everything it started too.
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("lockctl: cannot start {:?}: {e}", command[0]);
            if let Err(e) = guard.release().await {
                eprintln!("lockctl: releasing the lock failed (it will expire): {e}");
            }
            // The shell's conventions: 127 not found, 126 found but not executable.
            return ExitCode::from(match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                std::io::ErrorKind::PermissionDenied => 126,
                _ => 1,
            });
        }
    };
    let group = child.id().map(|pid| pid as libc::pid_t);
    let signals = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ];
    let [mut int, mut term, mut hup] =
        signals.map(|k| signal(k).expect("installing a signal handler"));
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = exit_code(status);
                if let Err(e) = guard.release().await {
                    eprintln!("lockctl: releasing the lock failed (it will expire after its TTL): {e}");
                }
                return code;
            }
            reason = &mut lost => {
                eprintln!(
                    "lockctl: the lease on {} was lost ({reason}); stopping the command (SIGTERM, then SIGKILL after {})",
                    guard.resource(),
                    humantime::format_duration(grace)
                );
                signal_group(group, libc::SIGTERM);
                let status = tokio::select! {
                    status = child.wait() => status,
                    () = tokio::time::sleep(grace) => {
                        signal_group(group, libc::SIGKILL);
                        child.wait().await
                    }
                };
                match status {
                    Ok(s) => eprintln!("lockctl: the command stopped ({s})"),
                    Err(e) => eprintln!("lockctl: waiting for the command failed: {e}"),
                }
                return ExitCode::from(crate::EXIT_LEASE_LOST);
            }
            _ = int.recv() => signal_group(group, libc::SIGINT),
            _ = term.recv() => signal_group(group, libc::SIGTERM),
            _ = hup.recv() => signal_group(group, libc::SIGHUP),
        }
    }
}

fn signal_group(group: Option<libc::pid_t>, sig: libc::c_int) {
    if let Some(pgid) = group {
        // SAFETY: kill(2) with a negative pid signals the process group; no memory is involved.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

fn exit_code(status: std::io::Result<ExitStatus>) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => ExitCode::from(code as u8),
            (None, Some(sig)) => ExitCode::from(128u8.saturating_add(sig as u8)),
            (None, None) => ExitCode::FAILURE,
        },
        Err(e) => {
            eprintln!("lockctl: waiting for the command failed: {e}");
            ExitCode::FAILURE
        }
    }
}
