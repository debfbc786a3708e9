//! What lockd and fence-proxy show their operators, written once for both:
//!
//! - [`admin`]: the admin HTTP listener (`/metrics`, `/healthz`, `/readyz` and status pages),
//!   bounded in connections and in the time a request head may take;
//! - [`audit`]: the audit log's writer (JSON Lines to a file or stdout, off the hot path,
//!   reopened on SIGHUP);
//! - [`topn`]: the space-saving sketch behind every "top N resources by ..." metric, so that
//!   per-resource label sets stay bounded;
//! - [`fence`]: fence-proxy's metrics, audit records and recent events, for both modes;
//! - [`hist`]: a histogram of durations without a lock, for per-request observations;
//! - [`recent`]: a bounded ring of recent events, for the status pages;
//! - [`html`]: the status pages' HTML (server-rendered, no external assets, sortable tables).

pub mod admin;
pub mod audit;
pub mod fence;
pub mod hist;
pub mod html;
pub mod recent;
pub mod topn;

/// The text exposition format (Prometheus 0.0.4) of `registry`.
pub fn render(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
        .expect("writing to a String does not fail");
    out
}

/// An exponential histogram's buckets for durations in seconds: 100 µs to about 54 s.
pub fn seconds_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 20)
}
