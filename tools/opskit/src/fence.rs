//! What fence-proxy records of its fence, in both modes: the metrics (docs/operations.md,
//! "fence-proxy's metrics"), the audit records of refused writes and ended zombie
//! transactions, and the recent events its status page lists.
//!
//! Nothing is recorded unless [`enable`]d (fence-proxy does when it has an admin listener), so
//! a proxy without one pays a relaxed load per event. The counters of each mode and outcome
//! are created once, so a passed check costs an atomic add and a histogram's observation; only
//! refusals, raises and ended zombies take a lock (the top N and the rings). Every label has a
//! bounded set of values; the one per-resource series is the top [`TOP_N`] by refusals.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use serde_json::json;

use crate::hist::{AtomicHistogram, PerThread};
use crate::recent::Recent;
use crate::topn::TopN;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Records metrics and recent events from now on.
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
}

fn on() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether anything is recorded at all (metrics or audit): callers skip building events
/// otherwise.
pub fn observing() -> bool {
    on() || crate::audit::on()
}

/// Per-resource series shown at most.
pub const TOP_N: usize = 10;
/// Resources whose refusals are counted at once (the sketch behind the top N).
const REFUSALS_TRACKED: usize = 256;
/// Events the status page lists at most, of each kind.
const RECENT_MAX: usize = 100;

/// The proxy mode an event happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Http,
    Pg,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Http => "http",
            Mode::Pg => "pg",
        }
    }
    const ALL: [Mode; 2] = [Mode::Http, Mode::Pg];
}

/// What the fence decided for one fenced request (HTTP) or one check (PostgreSQL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Relayed (HTTP), or the check passed (PostgreSQL).
    Passed,
    /// The token is below the highest accepted one (409 / FN001).
    Stale,
    /// The resource or the token is missing or malformed (400 / FN002).
    Malformed,
    /// A signed token that is not lockd's for the resource, or a bare token where a signed one
    /// is required (403 / FN007).
    Forged,
    /// A commit point the fence cannot check (FN006).
    Uncheckable,
    /// A token in a database without the check (FN004).
    NotInstalled,
    /// Older-token requests were still in flight when the barrier wait ran out (HTTP, 503).
    BarrierTimeout,
    /// The fence could not decide: its store failed or is full (HTTP, 503).
    Unavailable,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Stale => "stale",
            Outcome::Malformed => "malformed",
            Outcome::Forged => "forged",
            Outcome::Uncheckable => "uncheckable",
            Outcome::NotInstalled => "not_installed",
            Outcome::BarrierTimeout => "barrier_timeout",
            Outcome::Unavailable => "unavailable",
        }
    }
    const ALL: [Outcome; 8] = [
        Outcome::Passed,
        Outcome::Stale,
        Outcome::Malformed,
        Outcome::Forged,
        Outcome::Uncheckable,
        Outcome::NotInstalled,
        Outcome::BarrierTimeout,
        Outcome::Unavailable,
    ];
}

/// Why an upstream exchange failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamError {
    /// It could not be reached (connect, TLS handshake).
    Connect,
    /// It closed the connection, or the connection failed, mid-exchange.
    Lost,
    /// It answered something that is not HTTP (HTTP mode).
    BadResponse,
    /// It did not answer in time (HTTP mode's `upstream_timeout_ms`).
    Timeout,
}

impl UpstreamError {
    fn as_str(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Lost => "lost",
            UpstreamError::BadResponse => "bad_response",
            UpstreamError::Timeout => "timeout",
        }
    }
    const ALL: [UpstreamError; 4] = [
        UpstreamError::Connect,
        UpstreamError::Lost,
        UpstreamError::BadResponse,
        UpstreamError::Timeout,
    ];
}

/// A refused write, as the status page lists it.
#[derive(Clone, Debug)]
pub struct Refusal {
    pub mode: Mode,
    pub outcome: Outcome,
    pub resource: String,
    pub token: String,
    pub highest: Option<u64>,
    pub peer: String,
    /// The database (PostgreSQL mode) or the request's method and path (HTTP mode).
    pub target: String,
    /// What the client was told.
    pub reason: String,
}

/// A zombie transaction PostgreSQL ended because a newer token waited for it.
#[derive(Clone, Debug)]
pub struct Zombie {
    pub resource: String,
    pub token: i64,
    pub newer: Option<i64>,
    pub peer: String,
    pub database: String,
}

/// A mark raised: a newer token accepted for the first time.
#[derive(Clone, Debug)]
pub struct Raise {
    pub mode: Mode,
    pub resource: String,
    pub token: u64,
}

type ModeOutcome = [(&'static str, &'static str); 2];

/// What one thread counted: checks by mode and outcome, and their durations by mode.
#[derive(Default)]
struct Tally {
    checks: [[AtomicU64; 8]; 2],
    durations: [AtomicHistogram; 2],
}
type ModeOnly = [(&'static str, &'static str); 1];

pub struct FenceMetrics {
    /// Checks by outcome and their durations, per thread (both encoded by [`Scrape`]).
    tallies: PerThread<Tally>,
    raises: Family<ModeOnly, Counter>,
    raises_of: [Counter; 2],
    barrier_waits: Family<ModeOnly, Counter>,
    barrier_waits_of: [Counter; 2],
    barrier_timeouts: Family<ModeOnly, Counter>,
    barrier_timeouts_of: [Counter; 2],
    zombies: Counter,
    upstream: Family<ModeOutcome, Counter>,
    upstream_of: [[Counter; 4]; 2],
    connections: [AtomicI64; 2],
    refused_by_resource: TopN,
    pub recent_refusals: Recent<Refusal>,
    pub recent_zombies: Recent<Zombie>,
    pub recent_raises: Recent<Raise>,
}

impl FenceMetrics {
    fn new() -> FenceMetrics {
        let per_mode = || {
            let f = Family::<ModeOnly, Counter>::default();
            let of = Mode::ALL.map(|m| f.get_or_create(&[("mode", m.as_str())]).clone());
            (f, of)
        };
        let (raises, raises_of) = per_mode();
        let (barrier_waits, barrier_waits_of) = per_mode();
        let (barrier_timeouts, barrier_timeouts_of) = per_mode();
        let upstream = Family::<ModeOutcome, Counter>::default();
        let upstream_of = Mode::ALL.map(|m| {
            UpstreamError::ALL.map(|e| {
                upstream
                    .get_or_create(&[("mode", m.as_str()), ("kind", e.as_str())])
                    .clone()
            })
        });
        FenceMetrics {
            tallies: PerThread::default(),
            raises,
            raises_of,
            barrier_waits,
            barrier_waits_of,
            barrier_timeouts,
            barrier_timeouts_of,
            zombies: Counter::default(),
            upstream,
            upstream_of,
            connections: [AtomicI64::new(0), AtomicI64::new(0)],
            refused_by_resource: TopN::new(REFUSALS_TRACKED),
            recent_refusals: Recent::new(RECENT_MAX),
            recent_zombies: Recent::new(RECENT_MAX),
            recent_raises: Recent::new(RECENT_MAX),
        }
    }

    /// A fenced request or check that passed, after `took`.
    pub fn passed(&self, mode: Mode, took: Option<Duration>) {
        if !on() {
            return;
        }
        let tally = self.tallies.local();
        tally.checks[mode as usize][0].fetch_add(1, Ordering::Relaxed);
        if let Some(took) = took {
            tally.durations[mode as usize].observe(took);
        }
    }

    /// A check's duration alone (a refused check's: `refused` counts it).
    pub fn check_took(&self, mode: Mode, took: Duration) {
        if on() {
            self.tallies.local().durations[mode as usize].observe(took);
        }
    }

    /// A write refused with `refusal.outcome` (not `Passed`): counted, listed, and, for a
    /// stale or forged token, written to the audit log.
    pub fn refused(&self, refusal: impl FnOnce() -> Refusal, outcome: Outcome, mode: Mode) {
        let audited = crate::audit::on() && matches!(outcome, Outcome::Stale | Outcome::Forged);
        if !on() && !audited {
            return;
        }
        let mut r = refusal();
        // A signed token refused for one resource may be lockd's for another, and valid there:
        // never shown whole. What a client sent may be long: kept bounded, here and in the log.
        redact_signature(&mut r.token);
        for text in [&mut r.resource, &mut r.token, &mut r.target, &mut r.reason] {
            clip(text);
        }
        if audited {
            crate::audit::record(
                "refused_write",
                json!({
                    "mode": r.mode.as_str(),
                    "resource": r.resource,
                    "token": r.token,
                    "highest": r.highest,
                    "caller": r.peer,
                    "target": r.target,
                    "result": r.outcome.as_str(),
                    "reason": r.reason,
                }),
            );
        }
        if !on() {
            return;
        }
        self.tallies.local().checks[mode as usize][outcome as usize]
            .fetch_add(1, Ordering::Relaxed);
        if outcome == Outcome::BarrierTimeout {
            self.barrier_timeouts_of[mode as usize].inc();
        }
        // A malformed name is no resource: it is listed, not ranked.
        if !r.resource.is_empty() && outcome != Outcome::Malformed {
            self.refused_by_resource.add(&r.resource);
        }
        self.recent_refusals.push(r);
    }

    /// A mark raised by a newer token.
    pub fn raised(&self, mode: Mode, resource: &str, token: u64) {
        if !on() {
            return;
        }
        self.raises_of[mode as usize].inc();
        self.recent_raises.push(Raise {
            mode,
            resource: resource.to_string(),
            token,
        });
    }

    /// A fenced request waited at the barrier for older-token requests in flight.
    pub fn barrier_wait(&self, mode: Mode) {
        if on() {
            self.barrier_waits_of[mode as usize].inc();
        }
    }

    /// A zombie transaction ended (PostgreSQL mode): counted, listed and audited.
    pub fn zombie_ended(&self, zombie: impl FnOnce() -> Zombie) {
        if !on() && !crate::audit::on() {
            return;
        }
        let mut z = zombie();
        clip(&mut z.database);
        crate::audit::record(
            "zombie_ended",
            json!({
                "mode": "pg",
                "resource": z.resource,
                "token": z.token,
                "newer": z.newer,
                "caller": z.peer,
                "target": z.database,
                "result": "ended",
            }),
        );
        if on() {
            self.zombies.inc();
            self.recent_zombies.push(z);
        }
    }

    pub fn upstream_error(&self, mode: Mode, kind: UpstreamError) {
        if on() {
            self.upstream_of[mode as usize][kind as usize].inc();
        }
    }

    /// A client connection opened; the guard counts it until dropped.
    pub fn connection(&'static self, mode: Mode) -> Connection {
        self.connections[mode as usize].fetch_add(1, Ordering::Relaxed);
        Connection {
            metrics: self,
            mode,
        }
    }

    /// Client connections open now.
    pub fn connections(&self, mode: Mode) -> i64 {
        self.connections[mode as usize].load(Ordering::Relaxed)
    }

    /// The count of `outcome` in `mode` since start.
    pub fn count(&self, mode: Mode, outcome: Outcome) -> u64 {
        self.tallies
            .all()
            .map(|t| t.checks[mode as usize][outcome as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// Zombie transactions ended since start.
    pub fn zombies_ended(&self) -> u64 {
        self.zombies.get()
    }

    /// The `n` resources with the most refusals.
    pub fn most_refused(&self, n: usize) -> Vec<(String, u64)> {
        self.refused_by_resource.top(n)
    }

    /// Everything above, registered under `fence_proxy_`, with `readiness` read at each
    /// scrape.
    pub fn register(&'static self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("fence_proxy");
        r.register(
            "mark_raises",
            "Newer tokens accepted for the first time (the mark raised)",
            self.raises.clone(),
        );
        r.register(
            "barrier_waits",
            "Fenced requests that waited for older-token requests still in flight (HTTP mode)",
            self.barrier_waits.clone(),
        );
        r.register(
            "barrier_timeouts",
            "Fenced requests refused because older-token requests were still in flight when the wait ran out (HTTP mode)",
            self.barrier_timeouts.clone(),
        );
        r.register(
            "zombies_ended",
            "Transactions with an older token that PostgreSQL ended because a newer token waited for them (FN003)",
            self.zombies.clone(),
        );
        r.register(
            "upstream_errors",
            "Exchanges with the upstream that failed, by mode and kind",
            self.upstream.clone(),
        );
        r.register_collector(Box::new(Scrape { metrics: self }));
    }
}

/// Longest text of a client's kept in a refusal, in bytes.
const TEXT_MAX: usize = 300;

/// `text` cut to [`TEXT_MAX`] bytes at a character boundary, with an ellipsis when cut.
fn clip(text: &mut String) {
    if text.len() <= TEXT_MAX {
        return;
    }
    let mut end = TEXT_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

/// Hex digits of a signed token's MAC that are kept (enough to tell two apart).
const MAC_SHOWN: usize = 8;

/// Characters kept of a presented token that is neither a plain number nor of the signed form:
/// a malformed form may be a valid signed token with a character added or changed.
const MALFORMED_SHOWN: usize = 16;

/// What is shown of a presented token, never a whole MAC: `TOKEN.KEY_ID.MAC` (anything with
/// two dots) cut to its number, key id and the first [`MAC_SHOWN`] characters of its MAC; a
/// plain number whole; anything else cut to [`MALFORMED_SHOWN`] characters. PostgreSQL's
/// `fencing.shown_token` shows the same.
fn redact_signature(token: &mut String) {
    if token.len() <= 19 && token.bytes().all(|b| b.is_ascii_digit()) {
        return;
    }
    let second = token
        .find('.')
        .and_then(|first| token[first + 1..].find('.').map(|i| first + 1 + i));
    let mut end = match second {
        Some(second) => second + 1 + MAC_SHOWN,
        None => MALFORMED_SHOWN,
    }
    .min(token.len());
    while !token.is_char_boundary(end) {
        end -= 1;
    }
    if end < token.len() {
        token.truncate(end);
        token.push('…');
    }
}

/// A client connection, counted while it lives.
pub struct Connection {
    metrics: &'static FenceMetrics,
    mode: Mode,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.metrics.connections[self.mode as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

struct Scrape {
    metrics: &'static FenceMetrics,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrape")
    }
}

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        {
            let mut family = encoder.encode_descriptor(
                "checks",
                "Fenced HTTP requests and PostgreSQL checks, by mode and outcome (passed, or refused as stale, malformed, forged...)",
                None,
                MetricType::Counter,
            )?;
            for m in Mode::ALL {
                for o in Outcome::ALL {
                    let labels = [("mode", m.as_str()), ("outcome", o.as_str())];
                    ConstCounter::new(self.metrics.count(m, o))
                        .encode(family.encode_family(&labels)?)?;
                }
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "check_duration",
                "Time the fence took to decide: HTTP, the admission including any barrier wait; PostgreSQL, from sending the check to its answer",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for m in Mode::ALL {
                let parts = self.metrics.tallies.all().map(|t| &t.durations[m as usize]);
                AtomicHistogram::encode(parts, family.encode_family(&[("mode", m.as_str())])?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "connections",
                "Client connections open now, by mode",
                None,
                MetricType::Gauge,
            )?;
            for m in Mode::ALL {
                ConstGauge::new(self.metrics.connections(m))
                    .encode(family.encode_family(&[("mode", m.as_str())])?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "resource_refusals",
            "Refused writes since start, for the most refused resources (the top 10 only; approximate above the 256 tracked)",
            None,
            MetricType::Gauge,
        )?;
        for (resource, n) in self.metrics.most_refused(TOP_N) {
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("resource", resource.as_str())])?)?;
        }
        Ok(())
    }
}

/// The process-wide fence metrics.
pub fn get() -> &'static FenceMetrics {
    static METRICS: OnceLock<FenceMetrics> = OnceLock::new();
    METRICS.get_or_init(FenceMetrics::new)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lists_of_modes_and_outcomes_are_in_declaration_order() {
        use super::{Mode, Outcome};
        // Counts are indexed by `as usize`.
        assert!(
            Outcome::ALL
                .iter()
                .enumerate()
                .all(|(i, o)| *o as usize == i)
        );
        assert!(Mode::ALL.iter().enumerate().all(|(i, m)| *m as usize == i));
    }

    #[test]
    fn a_signed_token_is_never_shown_whole() {
        let mac = "ab".repeat(32);
        let mut t = format!("20.k1.{mac}");
        super::redact_signature(&mut t);
        assert_eq!(t, "20.k1.abababab…");
        let mut plain = "42".to_string();
        super::redact_signature(&mut plain);
        assert_eq!(plain, "42");
        let mut odd = "1.é.éééééééééé".to_string();
        super::redact_signature(&mut odd);
        assert!(odd.ends_with('…') && !odd.contains("éééééééé"), "{odd}");
        // A malformed form that holds a whole MAC: cut all the same.
        let mut bent = format!("20.k1:{mac}");
        super::redact_signature(&mut bent);
        assert_eq!(bent, "20.k1:ababababab…");
        let mut long = "99999999999999999999".to_string();
        super::redact_signature(&mut long);
        assert_eq!(long, "9999999999999999…");
    }

    #[test]
    fn long_texts_are_clipped_at_a_character_boundary() {
        let mut long = "é".repeat(400);
        super::clip(&mut long);
        assert!(long.len() <= super::TEXT_MAX + '…'.len_utf8());
        assert!(long.ends_with('…'));
        let mut short = "inv:a".to_string();
        super::clip(&mut short);
        assert_eq!(short, "inv:a");
    }
}
