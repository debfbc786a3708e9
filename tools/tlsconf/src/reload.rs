//! Reading certificates again on SIGHUP: for connections opened from then on; connections
//! already open keep theirs. A reload that fails (a missing file, a key that does not go with
//! its certificate) keeps what is in force, and says why.

use std::sync::Arc;
use std::time::Duration;

use crate::TlsError;

/// Longest one reload may take (reading files on a slow or hung mount).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Something read from files that can be read again.
pub trait Reload: Send + Sync + 'static {
    /// Reads the files again; on failure nothing changes.
    fn reload(&self) -> Result<(), TlsError>;
    /// What it is, for the log: "certificate /etc/lockd/server.pem".
    fn what(&self) -> String;
}

/// One reload, off the runtime's threads (files are read), bounded in time.
async fn reload_one(item: &Arc<dyn Reload>) -> Result<(), String> {
    let item = Arc::clone(item);
    match tokio::time::timeout(
        RELOAD_TIMEOUT,
        tokio::task::spawn_blocking(move || item.reload()),
    )
    .await
    {
        Ok(Ok(result)) => result.map_err(|e| e.to_string()),
        Ok(Err(e)) => Err(format!("the reload failed: {e}")),
        Err(_) => Err(format!(
            "reading the files took more than {RELOAD_TIMEOUT:?}"
        )),
    }
}

/// Reads every item again on each SIGHUP, for as long as the process runs; one log line per
/// item and outcome. Call it inside a runtime, once.
pub fn reload_on_sighup(items: Vec<Arc<dyn Reload>>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler: certificates will not be reloaded");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if items.is_empty() {
                tracing::info!("SIGHUP: no TLS certificates to reload");
            }
            for item in &items {
                match reload_one(item).await {
                    Ok(()) => tracing::info!(
                        what = %item.what(),
                        "reloaded the TLS certificates; new connections use them"
                    ),
                    Err(e) => tracing::warn!(
                        what = %item.what(),
                        error = %e,
                        "reloading the TLS certificates failed; keeping the ones in use"
                    ),
                }
            }
        }
    });
}
