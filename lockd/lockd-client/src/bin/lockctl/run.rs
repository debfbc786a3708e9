//! `lockctl run`: hold a lock while a command runs, and stop the command if the lock is lost.
//!
//! The stop must be over before anyone else can hold the lock. lockd may grant it to another
//! once the lease runs out there: no earlier than the last confirmed renewal's sending plus
//! the TTL. The guard's local deadline is that instant less a tenth of the TTL (for the two
//! clocks' rates). So the whole stop, SIGTERM, the grace, SIGKILL and the reaping, starts a
//! [`StopBudget`] before the local deadline, unless a renewal moves the deadline first: the
//! command is dead at the deadline at the latest, a tenth of the TTL before lockd could let
//! anyone else in. The budget is at most half the TTL, so that a renewal (every third of it)
//! and a retry fit before the stop must begin.

use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use tokio::time::Instant;

use fencing::wire::{ENV_RESOURCE, ENV_TOKEN, ENV_TOKEN_NUMBER, ENV_TOKENS};
use lockd_client::LockGuard;
use tokio::signal::unix::{SignalKind, signal};

/// Time allowed for SIGKILL to take the group and for the command to be reaped.
const KILL_SLACK: Duration = Duration::from_millis(250);
/// The default grace: a fifth of the TTL (less when that would not fit), at most this.
const GRACE_DEFAULT_MAX: Duration = Duration::from_secs(10);

/// How the command is stopped: SIGTERM, `grace`, SIGKILL, all within `total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopBudget {
    pub grace: Duration,
    pub total: Duration,
}

/// The stop budget of a lease of `ttl` with the grace `asked` (the default when `None`), or
/// why that grace does not fit.
pub fn stop_budget(asked: Option<Duration>, ttl: Duration) -> Result<StopBudget, String> {
    // The default fits whenever anything does: a fifth of the TTL, less for short ones.
    let grace = asked.unwrap_or_else(|| {
        (ttl / 5)
            .min(GRACE_DEFAULT_MAX)
            .min((ttl / 2).saturating_sub(KILL_SLACK))
    });
    let total = grace + KILL_SLACK;
    if total > ttl / 2 {
        return Err(format!(
            "--grace {} does not fit a lease of {}: the grace and {} for SIGKILL must fit in half the TTL ({}), so that the command is dead before the lease can expire at lockd; give a shorter --grace or a longer --ttl",
            humantime::format_duration(grace),
            humantime::format_duration(ttl),
            humantime::format_duration(KILL_SLACK),
            humantime::format_duration(ttl / 2),
        ));
    }
    Ok(StopBudget { grace, total })
}

/// Releases every lock, the last taken first.
pub async fn release_all(guards: Vec<LockGuard>) {
    for guard in guards.into_iter().rev() {
        let resource = guard.resource().to_string();
        if let Err(e) = guard.release().await {
            eprintln!(
                "lockctl: releasing the lock on {resource} failed (it will expire after its TTL): {e}"
            );
        }
    }
}

/// The guard whose deadline comes first: the whole stop must begin before it.
fn first_deadline(guards: &[LockGuard]) -> &LockGuard {
    guards
        .iter()
        .min_by_key(|g| g.deadline())
        .expect("run holds at least one lock")
}

/// Runs `command` under `guards` (one or more locks). Returns lockctl's exit status.
pub async fn run(guards: Vec<LockGuard>, command: &[String], budget: StopBudget) -> ExitCode {
    let grace = budget.grace;
    let mut cmd = tokio::process::Command::new(&command[0]);
    let tokens: Vec<String> = guards
        .iter()
        .map(|g| format!("{}={}", g.resource(), g.fence_token()))
        .collect();
    cmd.args(&command[1..])
        .env(ENV_TOKENS, tokens.join(","))
        // Its own process group, so that stopping it stops everything it started too.
        .process_group(0);
    if let [guard] = guards.as_slice() {
        cmd.env(ENV_RESOURCE, guard.resource())
            .env(ENV_TOKEN, guard.fence_token())
            .env(ENV_TOKEN_NUMBER, guard.token().to_string());
    } else {
        // One of several would be a guess: the command reads FENCING_TOKENS.
        cmd.env_remove(ENV_RESOURCE)
            .env_remove(ENV_TOKEN)
            .env_remove(ENV_TOKEN_NUMBER);
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("lockctl: cannot start {:?}: {e}", command[0]);
            release_all(guards).await;
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
    // The first lease lost, of however many.
    let (lost_tx, mut lost) = tokio::sync::mpsc::channel(guards.len());
    for guard in &guards {
        let (tx, resource, reason) = (lost_tx.clone(), guard.resource().to_string(), guard.lost());
        tokio::spawn(async move {
            let _ = tx.send((resource, reason.await)).await;
        });
    }
    loop {
        // The stop must begin by then, unless a renewal moves the deadline first (a deadline
        // only moves later, so waking at an old one and looking again is safe).
        let stop_at = first_deadline(&guards)
            .deadline()
            .checked_sub(budget.total)
            .unwrap_or_else(Instant::now);
        let reason = tokio::select! {
            status = child.wait() => {
                let code = exit_code(status);
                release_all(guards).await;
                return code;
            }
            Some((resource, reason)) = lost.recv() => format!("the lease on {resource} was lost ({reason})"),
            () = tokio::time::sleep_until(stop_at) => {
                let guard = first_deadline(&guards);
                if guard.deadline().checked_sub(budget.total).is_some_and(|s| s > Instant::now()) {
                    continue; // renewed meanwhile
                }
                format!(
                    "lockd has not confirmed a renewal of the lease on {}, which could expire there within {}",
                    guard.resource(),
                    humantime::format_duration(budget.total + lockd_client::safety_margin(guard.lease().ttl))
                )
            }
            _ = int.recv() => { signal_group(group, libc::SIGINT); continue; }
            _ = term.recv() => { signal_group(group, libc::SIGTERM); continue; }
            _ = hup.recv() => { signal_group(group, libc::SIGHUP); continue; }
        };
        eprintln!(
            "lockctl: {reason}; stopping the command (SIGTERM, then SIGKILL after {})",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grace_fits_every_ttl_that_can_fit_a_stop() {
        for ms in [500u64, 600, 833, 1000, 30_000, 600_000] {
            let ttl = Duration::from_millis(ms);
            let b = stop_budget(None, ttl).unwrap();
            assert!(b.total <= ttl / 2, "{ms} ms: {b:?}");
        }
        let at = |s| stop_budget(None, Duration::from_secs(s)).unwrap().grace;
        assert_eq!(at(30), Duration::from_secs(6));
        assert_eq!(at(600), Duration::from_secs(10));
        // Below 500 ms not even SIGKILL's 250 ms fits in half the TTL.
        assert!(stop_budget(None, Duration::from_millis(400)).is_err());
        assert!(stop_budget(Some(Duration::from_secs(1)), Duration::from_secs(2)).is_err());
        assert!(stop_budget(Some(Duration::from_millis(750)), Duration::from_secs(2)).is_ok());
    }
}
