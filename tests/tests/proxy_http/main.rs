//! fence-proxy's HTTP mode end to end: the real binary between an HTTP client and an upstream
//! written for the tests (`e2e::upstream`), over real sockets.
//!
//! - `answers`: stale, missing and malformed tokens, limits, an upstream down or slow; unfenced
//!   requests untouched;
//! - `ordering`: many clients with increasing tokens, and the barrier;
//! - `durability`: `kill -9` and restart;
//! - `replicas`: two proxies with their marks in a real PostgreSQL;
//! - `streaming`: large bodies both ways without holding them.
//!
//! Needs the binaries: `cargo build --bins` first.

mod answers;
mod durability;
mod ordering;
mod replicas;
mod streaming;

use std::path::Path;

use e2e::FenceProxy;
use e2e::upstream::Upstream;

/// A proxy in front of `upstream` with `extra` TOML for its listener (routes, limits).
pub fn proxy(dir: &Path, upstream: &Upstream, fence: &str, listener: &str) -> FenceProxy {
    let config = format!(
        "data_dir = \"{}\"\n[fence]\n{fence}\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n{listener}\n",
        dir.join("data").display(),
        upstream.url()
    );
    FenceProxy::start(dir, &config, 1)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}
