//! lockd's Prometheus metrics (docs/operations.md lists each, with its labels).
//!
//! The counters and histograms live in one process-wide [`Metrics`] ([`get`]), updated where
//! things happen: the service (each call's outcome and duration), the driver (expiries, how long
//! leases were held, waiters that left), the writer (commit duration and batch size), the HA
//! loop (leader changes, failover time). The gauges are read from the core at each scrape
//! ([`Gauges`]). Every label has a bounded set of values: methods and outcomes are fixed lists,
//! and the only per-resource series are the top [`TOP_N`] by queue length and by contention.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opskit::recent::Recent;
use opskit::topn::TopN;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Whether anything is recorded: only with an admin listener to show it (`enable`), so that
/// a lockd without one pays nothing.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Records metrics from now on.
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
}

pub(crate) fn on() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Per-resource series shown at most (waiters, contention).
pub const TOP_N: usize = 10;

/// Resources whose contention is counted at once (the space-saving sketch behind the top N):
/// a resource outside it that becomes hot replaces the least contended one.
const CONTENTION_TRACKED: usize = 256;

type Labels2 = [(&'static str, &'static str); 2];
type Labels1 = [(&'static str, &'static str); 1];

/// The metrics that are updated as things happen.
pub struct Metrics {
    calls: Family<Labels2, Counter>,
    durations: Family<Labels1, Histogram, fn() -> Histogram>,
    expiries: Counter,
    held_long: Counter,
    held: Histogram,
    commits: Histogram,
    batch_ops: Histogram,
    leader_changes: Counter,
    failover: Histogram,
    contention: TopN,
    /// For the status page: the last expiries and long holds, and the last refused calls.
    pub recent_leases: Recent<LeaseNews>,
    pub recent_refusals: Recent<Refused>,
}

/// Events the status page lists at most, of each kind.
const RECENT_MAX: usize = 50;

/// An expiry or a long hold, for the status page.
#[derive(Clone, Debug)]
pub struct LeaseNews {
    pub kind: &'static str,
    pub resource: String,
    pub token: u64,
    pub holder: String,
    pub held_ms: u64,
}

/// A refused call, for the status page.
#[derive(Clone, Debug)]
pub struct Refused {
    pub method: &'static str,
    pub resource: String,
    pub peer: Option<std::net::SocketAddr>,
    pub outcome: &'static str,
    pub reason: String,
}

fn duration_histogram() -> Histogram {
    Histogram::new(opskit::seconds_buckets())
}

impl Metrics {
    fn new() -> Metrics {
        Metrics {
            calls: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            expiries: Counter::default(),
            held_long: Counter::default(),
            // 10 ms to about 12 days.
            held: Histogram::new(exponential_buckets(0.01, 4.0, 14)),
            commits: Histogram::new(opskit::seconds_buckets()),
            batch_ops: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            leader_changes: Counter::default(),
            failover: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            contention: TopN::new(CONTENTION_TRACKED),
            recent_leases: Recent::new(RECENT_MAX),
            recent_refusals: Recent::new(RECENT_MAX),
        }
    }

    /// One call of `method` ended with `outcome` after `took`.
    pub fn call(&self, method: &'static str, outcome: &'static str, took: Duration) {
        if !on() {
            return;
        }
        self.calls
            .get_or_create(&[("method", method), ("outcome", outcome)])
            .inc();
        self.durations
            .get_or_create(&[("method", method)])
            .observe(took.as_secs_f64());
    }

    /// A call that ended without an answer (a waiting Acquire whose client went away).
    pub fn call_without_answer(&self, method: &'static str, outcome: &'static str) {
        if !on() {
            return;
        }
        self.calls
            .get_or_create(&[("method", method), ("outcome", outcome)])
            .inc();
    }

    /// An Acquire of `resource` found it held (answered busy, or queued).
    pub fn contended(&self, resource: &str) {
        if !on() {
            return;
        }
        self.contention.add(resource);
    }

    /// A lease ended after `held_ms`; `expired` if it ran out rather than being released.
    pub fn lease_ended(&self, held_ms: u64, expired: bool) {
        if !on() {
            return;
        }
        if expired {
            self.expiries.inc();
        }
        self.held.observe(held_ms as f64 / 1000.0);
    }

    /// An expiry or a long hold, kept for the status page.
    pub fn lease_news(&self, news: impl FnOnce() -> LeaseNews) {
        if on() {
            self.recent_leases.push(news());
        }
    }

    /// A refused call, kept for the status page.
    pub fn refused(&self, refused: impl FnOnce() -> Refused) {
        if on() {
            self.recent_refusals.push(refused());
        }
    }

    /// A lease has been held `hold_warn_after_ms` (once per lease).
    pub fn held_long(&self) {
        if !on() {
            return;
        }
        self.held_long.inc();
    }

    /// The store committed a batch of `ops` operations in `took`.
    pub fn committed(&self, ops: usize, took: Duration) {
        if !on() {
            return;
        }
        self.commits.observe(took.as_secs_f64());
        self.batch_ops.observe(ops as f64);
    }

    /// This instance took the leadership, `after` the previous leader was last known.
    pub fn took_over(&self, after: Duration) {
        if !on() {
            return;
        }
        self.leader_changes.inc();
        self.failover.observe(after.as_secs_f64());
    }

    /// The `n` most contended resources and their counts.
    pub fn hot(&self, n: usize) -> Vec<(String, u64)> {
        self.contention.top(n)
    }

    /// The registry of everything above, and the gauges `gauges` reads at each scrape.
    pub fn registry(&'static self, gauges: Box<dyn Fn() -> Gauges + Send + Sync>) -> Registry {
        let mut r = Registry::with_prefix("lockd");
        r.register(
            "requests",
            "Calls answered, by method and outcome",
            self.calls.clone(),
        );
        r.register_with_unit(
            "request_duration",
            "Time from a call's arrival to its answer, by method (a waiting Acquire includes its wait)",
            Unit::Seconds,
            self.durations.clone(),
        );
        r.register(
            "lease_expiries",
            "Leases that ran out without being released or renewed",
            self.expiries.clone(),
        );
        r.register(
            "lease_long_holds",
            "Leases held longer than limits.hold_warn_after_ms (each counted once)",
            self.held_long.clone(),
        );
        r.register_with_unit(
            "lease_held",
            "How long leases were held, from the grant to the release or expiry",
            Unit::Seconds,
            self.held.clone(),
        );
        r.register_with_unit(
            "commit_duration",
            "Time the store took to commit a batch (with its fdatasync, or its etcd transaction)",
            Unit::Seconds,
            self.commits.clone(),
        );
        r.register(
            "commit_batch_ops",
            "Operations per committed batch (group commit)",
            self.batch_ops.clone(),
        );
        r.register(
            "leader_changes",
            "Times this instance took the leadership (backend etcd)",
            self.leader_changes.clone(),
        );
        r.register_with_unit(
            "failover",
            "Time from the last sign of the previous leader to this instance serving as leader",
            Unit::Seconds,
            self.failover.clone(),
        );
        r.register_collector(Box::new(Scrape {
            gauges,
            metrics: self,
        }));
        r
    }
}

/// What the core holds now, read at each scrape.
#[derive(Default)]
pub struct Gauges {
    /// `None` on an instance that does not lead (it holds no state).
    pub state: Option<State>,
    /// Backend etcd: whether this instance leads.
    pub leader: Option<bool>,
}

pub struct State {
    pub leases: usize,
    pub waiters: usize,
    pub requests: usize,
    pub last_token: u64,
    /// The resources with the longest queues, longest first.
    pub longest_queues: Vec<(String, usize)>,
}

struct Scrape {
    gauges: Box<dyn Fn() -> Gauges + Send + Sync>,
    metrics: &'static Metrics,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrape")
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::encoding::EncodeMetric;
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

fn per_resource(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    values: &[(String, i64)],
) -> Result<(), std::fmt::Error> {
    use prometheus_client::encoding::EncodeMetric;
    let mut family = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (resource, value) in values {
        let labels = [("resource", resource.as_str())];
        ConstGauge::new(*value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = (self.gauges)();
        if let Some(leader) = now.leader {
            gauge(
                &mut encoder,
                "leader",
                "1 when this instance leads (backend etcd)",
                i64::from(leader),
            )?;
        }
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        if let Some(s) = &now.state {
            gauge(&mut encoder, "leases", "Leases held now", as_i64(s.leases))?;
            gauge(
                &mut encoder,
                "waiters",
                "Acquire calls waiting in queues now",
                as_i64(s.waiters),
            )?;
            gauge(
                &mut encoder,
                "request_ids",
                "Request ids remembered now (for retries)",
                as_i64(s.requests),
            )?;
            gauge(
                &mut encoder,
                "token_high_water",
                "The highest fencing token issued",
                i64::try_from(s.last_token).unwrap_or(i64::MAX),
            )?;
            let queues: Vec<(String, i64)> = s
                .longest_queues
                .iter()
                .map(|(r, n)| (r.clone(), as_i64(*n)))
                .collect();
            per_resource(
                &mut encoder,
                "resource_waiters",
                "Waiters of the resources with the longest queues (the top 10 only)",
                &queues,
            )?;
        }
        let hot: Vec<(String, i64)> = self
            .metrics
            .contention
            .top(TOP_N)
            .into_iter()
            .map(|(r, n)| (r, i64::try_from(n).unwrap_or(i64::MAX)))
            .collect();
        per_resource(
            &mut encoder,
            "resource_contention",
            "Acquire calls that found the resource held (busy or queued) since start, for the most contended resources (the top 10 only; approximate above the 256 tracked)",
            &hot,
        )
    }
}

/// The process-wide metrics.
pub fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}
