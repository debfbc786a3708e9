//! The audit log's writer: one JSON object per line, to a file or to stdout.
//!
//! Records are written by a thread of their own from a bounded queue, so that a slow disk
//! never holds up the work they record; when the queue is full a record is dropped, counted,
//! and said in the log. SIGHUP reopens the file (for logrotate's `create`). The file is
//! created owner- and group-readable only. What records hold is the service's (lockd's
//! `audit.rs`, fence-proxy's `fence-obs`); every record has `time` (RFC 3339, ms) and `type`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::SystemTime;

use serde_json::{Value, json};
use tracing::warn;

/// Records queued for the writer at most.
const QUEUE_MAX: usize = 65_536;

struct Audit {
    tx: mpsc::SyncSender<String>,
    dropped: AtomicU64,
}

static AUDIT: OnceLock<Audit> = OnceLock::new();

/// Where records go.
enum Sink {
    Stdout,
    File(std::path::PathBuf),
}

impl Sink {
    fn open(&self) -> std::io::Result<Box<dyn Write + Send>> {
        Ok(match self {
            Sink::Stdout => Box::new(std::io::stdout()),
            Sink::File(path) => {
                use std::os::unix::fs::OpenOptionsExt;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o640)
                    .open(path)?;
                Box::new(std::io::BufWriter::new(file))
            }
        })
    }
}

/// Starts the audit log at `target` (a file path, or `-` for stdout), its writer a thread
/// named `thread`. Call once, inside the runtime (SIGHUP is watched there).
pub fn start(target: &str, thread: &str) -> Result<(), String> {
    let sink = match target {
        "-" => Sink::Stdout,
        path => Sink::File(path.into()),
    };
    let mut out = sink
        .open()
        .map_err(|e| format!("audit_log {target}: cannot open it: {e}"))?;
    let (tx, rx) = mpsc::sync_channel::<String>(QUEUE_MAX);
    let reopen = Arc::new(AtomicBool::new(false));
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        let reopen = Arc::clone(&reopen);
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                reopen.store(true, Ordering::Release);
            }
        });
    }
    let target = target.to_string();
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                if reopen.swap(false, Ordering::AcqRel) {
                    let _ = out.flush();
                    match sink.open() {
                        Ok(new) => out = new,
                        Err(e) => {
                            warn!(audit_log = %target, error = %e, "reopening the audit log failed; writing on to the file in use")
                        }
                    }
                }
                let mut write = |line: &str| {
                    if let Err(e) = writeln!(out, "{line}") {
                        warn!(audit_log = %target, error = %e, "writing the audit log failed");
                    }
                };
                write(&first);
                while let Ok(more) = rx.try_recv() {
                    write(&more);
                }
                let _ = out.flush();
            }
        })
        .map_err(|e| format!("audit_log: cannot start its writer: {e}"))?;
    let _ = AUDIT.set(Audit {
        tx,
        dropped: AtomicU64::new(0),
    });
    Ok(())
}

/// Writes one record of `kind` with `fields` (and the time), if the audit log is on.
pub fn record(kind: &str, fields: Value) {
    let Some(audit) = AUDIT.get() else {
        return;
    };
    let mut record = json!({
        "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "type": kind,
    });
    if let (Some(r), Value::Object(f)) = (record.as_object_mut(), fields) {
        r.extend(f);
    }
    if audit.tx.try_send(record.to_string()).is_err() {
        let n = audit.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 || n % 10_000 == 0 {
            warn!(
                dropped = n,
                "the audit log's writer is behind (a slow disk?): records are being dropped"
            );
        }
    }
}

/// Whether the audit log is on (so that callers skip building records otherwise).
pub fn on() -> bool {
    AUDIT.get().is_some()
}
