//! lockd and lockctl end to end, through the real binaries.
//!
//! - `audit`: the audit log's records of every type, and its reopening on SIGHUP;
//! - `api`: the API conformance suite (`e2e::api`), on the embedded store;
//! - `conformance`: the SDK conformance suite (clients/conformance), with the Rust SDK;
//! - `cli`: contention, waiting, FIFO order, de-duplication, waiter removal, describe, `run`;
//! - `crash`: `kill -9` during a burst of grants, then restart on the same data directory;
//! - `sdk`: the client library (renewal, the lost signal, retries while lockd is down, release
//!   on drop) and, through the raw API, a cancelled wait and a full queue;
//! - `server`: start-up refusals, bad input, and a clean shutdown;
//! - `demo`: README's demo runs to the end.
//! - `list`: the List RPC's pages, `lockctl list` and `lockctl top` over 10,000 locks;
//! - `metrics`: the admin listener (metrics after known calls, bounded labels, health);
//! - `tenants`: identities (certificate, token file) and tenants through lockctl over mTLS.
//! - `faults`: the fault runner, in both fence-proxy modes and with fencing off.
//!
//! Needs the binaries: `cargo build --bins` first (the harness says so if they are missing).

mod api;
mod audit;
mod cli;
mod conformance;
mod crash;
mod demo;
mod faults;
mod list;
mod metrics;
mod sdk;
mod server;
mod signed;
mod tenants;
mod timeline;
mod tls;

use serde_json::Value;

/// Parses the single JSON object a `--json` command printed.
pub fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout:?}"))
}
