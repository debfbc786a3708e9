//! lockd over a real etcd cluster (Debian `etcd-server`, loopback ports).
//!
//! - `admin`: `/readyz`, grpc.health.v1 and the leader metrics as the leader comes and goes;
//! - `api`: the API conformance suite (`e2e::api`), one lockd over a one-member etcd;
//! - `store`: the Store conformance suite on `EtcdStore`, and what a replicated store adds
//!   (a deposed leader's batch, batches beyond etcd's transaction limit, the key layout, the
//!   high-water guard);
//! - `faults`: etcd members failing under lockd: `kill -9` of the etcd leader during a burst
//!   of grants, SIGSTOP of the etcd leader, two members down (no grant, no renewal) and back;
//! - `clocks`: a leader whose clock jumps (libfaketime) gives the leadership up before it
//!   expires anything by that clock;
//! - `instances`: three lockd instances (one leads, two forward) over three etcd members:
//!   clients on all of them, a retry through another instance, a clean hand-over, `kill -9`
//!   of the lockd leader during a burst, SIGSTOP of the lockd leader past its lease, and an
//!   etcd that lost its data.
//!
//! Clients record what they saw as a history (docs/history.md), judged by `verify`'s checker:
//! single holder and monotone tokens must hold.
//!
//! Needs the binaries (`cargo build --bins`) and `etcd` / `etcdctl` on the PATH.

mod admin;
mod api;
mod clocks;
mod faults;
mod instances;
mod store;
mod tls;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use e2e::etcd::EtcdCluster;
use e2e::{Lockd, PATIENCE};
use lockd_client::{AcquireOptions, Acquired, Client, ClientError};
use serde_json::{Value, json};

/// lockd over `cluster` (a short leadership lease), once it leads or follows.
pub fn lockd_on(dir: &Path, cluster: &EtcdCluster) -> Lockd {
    cluster.lockd(dir, &[])
}

/// The history the clients write, and a count of grants to wait on.
#[derive(Default)]
pub struct Recorder {
    state: Mutex<(Vec<Value>, usize)>,
    changed: Condvar,
}

impl Recorder {
    pub fn event(&self, kind: &str, process: &str, f: &str, resource: &str, extra: Value) {
        let e = e2e::history_event(kind, process, f, resource, extra);
        let mut st = self.state.lock().unwrap();
        if kind == "ok" && f == "acquire" {
            st.1 += 1;
        }
        st.0.push(e);
        self.changed.notify_all();
    }

    /// Waits until `n` more grants than so far have been recorded.
    pub fn wait_grants(&self, n: usize, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        let mut st = self.state.lock().unwrap();
        let target = st.1 + n;
        while st.1 < target {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "gave up waiting for {what}: {} grants",
                st.1
            );
            st = self.changed.wait_timeout(st, left).unwrap().0;
        }
    }

    /// Judges the history: single holder and monotone tokens must hold (and be shown).
    pub fn check(&self) {
        let events = self.state.lock().unwrap().0.clone();
        let mut sorted = events;
        sorted.sort_by_key(|e| e["time"].as_u64());
        let text: String = sorted.iter().map(|e| format!("{e}\n")).collect();
        let history = verifier::parse(text.as_bytes()).expect("a valid history");
        let report = verifier::check(&history);
        for p in [
            verifier::Property::SingleHolder,
            verifier::Property::MonotoneTokens,
        ] {
            assert!(
                matches!(report.verdict(p), verifier::check::Verdict::Holds),
                "{report}"
            );
        }
        assert!(report.ok(), "{report}");
    }
}

/// Clients that take and release locks on a few resources until stopped, recording
/// everything. Each starts on one lockd endpoint and moves to the next when that one is
/// unreachable.
pub struct Load {
    pub recorder: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    rt: tokio::runtime::Runtime,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(endpoints: &[String], clients: usize, resources: usize) -> Load {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let recorder = Arc::new(Recorder::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let endpoints = endpoints.to_vec();
            let recorder = Arc::clone(&recorder);
            let stop = Arc::clone(&stop);
            tasks.push(rt.spawn(async move {
                let name = format!("c{c}");
                let mut at = c % endpoints.len();
                let mut client = Client::connect(&endpoints[at]).unwrap();
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let resource = format!("r{}", (c + round) % resources);
                    recorder.event("invoke", &name, "acquire", &resource, json!({}));
                    let opts = AcquireOptions {
                        ttl: Some(Duration::from_secs(5)),
                        wait: Duration::from_secs(5),
                        holder: name.clone(),
                        request_id: None,
                        owner: Default::default(),
                        permits: 0,
                        mode: lockd_client::Mode::Exclusive,
                    };
                    let lease = match client.acquire(&resource, opts).await {
                        Ok(Acquired::Granted(guard)) => {
                            let lease = guard.detach().await;
                            recorder.event(
                                "ok",
                                &name,
                                "acquire",
                                &resource,
                                json!({"token": lease.token, "ttl_ms": lease.ttl.as_millis() as u64}),
                            );
                            lease
                        }
                        Ok(Acquired::NotGranted(_)) => {
                            recorder.event("fail", &name, "acquire", &resource, json!({}));
                            continue;
                        }
                        Err(e) => {
                            recorder.event(
                                "info",
                                &name,
                                "acquire",
                                &resource,
                                json!({"note": e.to_string()}),
                            );
                            if matches!(e, ClientError::Unavailable(_)) {
                                at = (at + 1) % endpoints.len();
                                client = Client::connect(&endpoints[at]).unwrap();
                            }
                            continue;
                        }
                    };
                    // The work under the lock: one renewal (a round trip, and renewals
                    // are exercised under the faults too).
                    if let Err(e @ ClientError::LeaseNotCurrent(_)) =
                        client.renew(&resource, &lease.lease_id).await
                    {
                        recorder.event(
                            "info",
                            &name,
                            "expire",
                            &resource,
                            json!({"token": lease.token, "note": e.to_string()}),
                        );
                    }
                    recorder.event(
                        "invoke",
                        &name,
                        "release",
                        &resource,
                        json!({"token": lease.token}),
                    );
                    let kind = match client.release(&resource, &lease.lease_id).await {
                        Ok(true) => "ok",
                        Ok(false) => "fail",
                        Err(_) => "info",
                    };
                    recorder.event(kind, &name, "release", &resource, json!({"token": lease.token}));
                }
            }));
        }
        Load {
            recorder,
            stop,
            rt,
            tasks,
        }
    }

    /// Stops the clients after their current round and judges the history.
    pub fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            self.rt.block_on(t).expect("a client task panicked");
        }
        self.recorder.check();
    }
}
