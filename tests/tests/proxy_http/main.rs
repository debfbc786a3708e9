//! fence-proxy's HTTP mode end to end: the real binary between an HTTP client and an upstream
//! written for the tests (`e2e::upstream`), over real sockets.
//!
//! - `answers`: stale, missing and malformed tokens, limits, an upstream down or slow; unfenced
//!   requests untouched;
//! - `ordering`: many clients with increasing tokens, and the barrier;
//! - `durability`: `kill -9` and restart;
//! - `replicas`: two proxies with their marks in a real PostgreSQL;
//! - `streaming`: large bodies both ways without holding them;
//! - `tls`: HTTPS on both sides with curl, every failure, mutual TLS, SIGHUP;
//! - `bypass` and `stacks`: the bypass catalogue, the latter against real upstream stacks
//!   (WSGI, Node.js, nginx) that read paths their own way.
//!
//! Needs the binaries: `cargo build --bins` first.

mod answers;
mod bypass;
mod durability;
mod observe;
mod ordering;
mod replicas;
mod signed;
mod stacks;
mod status_pages;
mod streaming;
mod tls;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use e2e::FenceProxy;
use e2e::client::{body, client, send};
use e2e::upstream::{Seen, Upstream};

/// A proxy in front of `upstream` with `extra` TOML for its listener (routes, limits).
pub fn proxy(dir: &Path, upstream: &Upstream, fence: &str, listener: &str) -> FenceProxy {
    proxy_to(dir, &upstream.url(), fence, listener)
}

/// A proxy in front of the service at `url`, as [`proxy`].
pub fn proxy_to(dir: &Path, url: &str, fence: &str, listener: &str) -> FenceProxy {
    let config = format!(
        "data_dir = \"{}\"\n[fence]\n{fence}\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{url}\"\n{listener}\n",
        dir.join("data").display(),
    );
    FenceProxy::start(dir, &config, 1)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

/// `PUT url` for `resource` with `token` (held at the upstream under `hold`, if given), sent in
/// the background on `rt`.
pub fn spawn_put(
    rt: &tokio::runtime::Runtime,
    url: &str,
    resource: &str,
    token: u64,
    hold: Option<&str>,
) -> tokio::task::JoinHandle<e2e::client::Answer> {
    let (url, resource, token, hold) = (
        url.to_string(),
        resource.to_string(),
        token.to_string(),
        hold.map(str::to_string),
    );
    rt.spawn(async move {
        let mut headers = vec![
            ("fencing-resource", resource.as_str()),
            ("fencing-token", token.as_str()),
        ];
        if let Some(h) = &hold {
            headers.push(("x-hold", h.as_str()));
        }
        send(&client(), "PUT", &url, &headers, body("")).await
    })
}

/// One answer to a write: resource, token, status.
pub type Answer = (String, u64, u16);

/// `clients` concurrent writers, each doing `rounds` rounds against `urls` (client i uses
/// `urls[i % len]`): a round takes the next global token and writes with it until a write is
/// accepted, taking a newer token after each refusal, like a lock holder that re-acquires.
/// Every round ends with an accepted write, whatever the timing.
pub fn racing_writers(
    urls: &[String],
    clients: usize,
    rounds: usize,
    resources: u64,
) -> Vec<Answer> {
    let rt = runtime();
    let next = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..clients {
            let (url, next, c) = (urls[i % urls.len()].clone(), Arc::clone(&next), client());
            tasks.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                for round in 0..rounds {
                    let resource = format!("shared-{}", (i + round) as u64 % resources);
                    for attempt in 0.. {
                        assert!(attempt < 10_000, "a writer never got through");
                        let token = next.fetch_add(1, Ordering::SeqCst) + 1;
                        let t = token.to_string();
                        let a = send(
                            &c,
                            "PUT",
                            &url,
                            &[("fencing-resource", &resource), ("fencing-token", &t)],
                            body("x"),
                        )
                        .await;
                        answers.push((resource.clone(), token, a.status));
                        if a.status == 200 {
                            break;
                        }
                    }
                }
                answers
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    })
}

/// Per resource, the tokens reaching the upstream never go backwards; every accepted write
/// reached it and no refused one did. Returns the number of accepted writes.
pub fn check_order(seen: &[Seen], answers: &[Answer]) -> usize {
    let mut last: HashMap<String, u64> = HashMap::new();
    for s in seen {
        let (r, t) = (s.resource.clone().unwrap(), s.token.unwrap());
        let prev = last.insert(r.clone(), t).unwrap_or(0);
        assert!(
            t >= prev,
            "{r}: token {t} reached the upstream after {prev}"
        );
    }
    let mut accepted = 0;
    for (resource, token, status) in answers {
        let reached = seen
            .iter()
            .any(|s| s.resource.as_deref() == Some(resource) && s.token == Some(*token));
        match status {
            200 => {
                accepted += 1;
                assert!(
                    reached,
                    "acknowledged write {resource}/{token} is missing at the upstream"
                );
            }
            409 | 503 => assert!(
                !reached,
                "refused write {resource}/{token} reached the upstream"
            ),
            other => panic!("unexpected status {other} for {resource}/{token}"),
        }
    }
    accepted
}
