//! The audit log (`audit_log`): one JSON object per line for every grant, release, expiry, long
//! hold and refused call (docs/operations.md "Audit log" has the schema). The writer is
//! opskit's (a thread of its own, a bounded queue, SIGHUP reopens the file).
//!
//! Records never hold a lease id, which is a holder's capability: only its fingerprint, the
//! first 16 hex digits of its SHA-256.

use serde_json::json;
use sha2::{Digest, Sha256};

pub use opskit::audit::{on, record};

/// Starts the audit log at `target` (a file path, or `-` for stdout).
pub fn start(target: &str) -> Result<(), String> {
    opskit::audit::start(target, "lockd-audit")
}

/// The fingerprint of a lease id: never the id itself.
pub fn lease_fingerprint(lease_id: &str) -> String {
    Sha256::digest(lease_id.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A record of what happened to a lease by itself (`expiry`, `long_hold`), with no caller.
pub fn lease_event(
    kind: &'static str,
    resource: &fencing::ResourceName,
    lease_id: fencing::LeaseId,
    token: fencing::FencingToken,
    holder: &lockd_core::Holder,
    held_ms: u64,
) {
    if !on() {
        return;
    }
    let result = if kind == "expiry" {
        "expired"
    } else {
        "held_long"
    };
    record(
        kind,
        json!({
            "resource": resource.as_str(),
            "lease": lease_fingerprint(&lease_id.to_string()),
            "token": token.get(),
            "holder": holder.as_str(),
            "held_ms": held_ms,
            "result": result,
        }),
    );
}
