//! lockd on the admin listener (`admin_listen`, served by opskit::admin):
//!
//! - `GET /metrics`: Prometheus text exposition format (crate::metrics);
//! - `GET /healthz`: 200 while the process serves at all;
//! - `GET /readyz`: 200 when calls can be served (the embedded store open; over etcd, a leader
//!   known: this instance or another), 503 otherwise, with the reason in the body;
//! - `GET /` (or `/status`): the status page: the held locks (the longest holds first), the
//!   longest queues, the most contended resources, recent expiries, long holds and refusals,
//!   and in HA mode this instance's part and the leader.

use std::time::{Duration, SystemTime};

use opskit::admin::BoxFuture;
use opskit::html::{self, Cell, Level, Page};

use crate::metrics::Gauges;
use crate::service::Routes;

/// Held locks the status page lists at most (the longest holds), and the held locks it looks
/// at to find them.
const PAGE_LOCKS: usize = 200;
const PAGE_LOOK_MAX: usize = 20_000;

/// What the admin endpoints read.
pub struct Admin {
    routes: Routes,
    registry: prometheus_client::registry::Registry,
}

/// Whether calls can be served, and if not, why.
pub fn readiness(routes: &Routes) -> Result<(), &'static str> {
    match routes {
        Routes::Single(driver) if driver.serving() => Ok(()),
        Routes::Single(_) => Err("lockd is shutting down"),
        Routes::Cluster(ha) if ha.ready() => Ok(()),
        Routes::Cluster(_) => Err(
            "no leader is known (an election is under way, or the coordination service is out of reach)",
        ),
    }
}

/// The gauges the core holds now.
fn gauges(routes: &Routes) -> Gauges {
    match routes {
        Routes::Single(driver) => Gauges {
            state: Some(driver.gauges()),
            leader: None,
        },
        Routes::Cluster(ha) => match ha.leading() {
            Some(driver) => Gauges {
                state: Some(driver.gauges()),
                leader: Some(true),
            },
            None => Gauges {
                state: None,
                leader: Some(false),
            },
        },
    }
}

impl Admin {
    pub fn new(routes: Routes) -> Admin {
        let for_gauges = routes.clone();
        let registry = crate::metrics::get().registry(Box::new(move || gauges(&for_gauges)));
        Admin { routes, registry }
    }

    /// The status page.
    async fn status(&self, query: &str) -> String {
        let mut page = Page::new("lockd", query);
        let ready = readiness(&self.routes);
        if let Err(why) = ready {
            page.banner(Level::Bad, &format!("not ready: {why}"));
        }
        let role = match &self.routes {
            Routes::Single(_) => "single instance (embedded store)".to_string(),
            Routes::Cluster(ha) => ha.role_text(),
        };
        let driver = match &self.routes {
            Routes::Single(d) => Some(std::sync::Arc::clone(d)),
            Routes::Cluster(ha) => ha.leading(),
        };
        let metrics = crate::metrics::get();
        let Some(driver) = driver else {
            page.facts(&[("role", role)]);
            page.section(
                "Held locks",
                "this instance does not lead: the leader's status page lists them",
            );
            self.recent(&mut page, metrics);
            return page.finish(concat!("lockd ", env!("CARGO_PKG_VERSION")));
        };
        let state = driver.gauges();
        let now = driver.clock().now();
        let (locks, looked, complete) = longest_holds(&driver).await;
        page.facts(&[
            ("role", role),
            ("leases held", state.leases.to_string()),
            ("waiters", state.waiters.to_string()),
            ("highest token", state.last_token.to_string()),
            ("request ids kept", state.requests.to_string()),
        ]);
        page.section(
            "Held locks",
            &if complete {
                format!(
                    "the {} longest holds of {} held, longest first",
                    locks.len().min(PAGE_LOCKS),
                    looked
                )
            } else {
                format!(
                    "the {} longest holds among the first {looked} held (of {}), longest first",
                    locks.len(),
                    state.leases
                )
            },
        );
        let rows: Vec<Vec<Cell>> = locks
            .iter()
            .map(|l| {
                let held = Duration::from_millis(now.saturating_sub(l.granted_at));
                let left = Duration::from_millis(l.expires_at.saturating_sub(now));
                vec![
                    Cell::long(l.resource.as_str()),
                    Cell::long(l.holder.as_str()),
                    Cell::num(l.token.get() as f64),
                    Cell::keyed(html::duration(held), held.as_secs_f64()),
                    Cell::keyed(html::duration(left), left.as_secs_f64()),
                    if l.waiters > 0 {
                        Cell::num(l.waiters as f64).bad()
                    } else {
                        Cell::num(l.waiters as f64)
                    },
                ]
            })
            .collect();
        page.table(
            "held",
            &[
                "resource",
                "holder",
                "token",
                "held for",
                "expires in",
                "waiters",
            ],
            &rows,
            "no lock is held",
        );
        page.section(
            "Longest queues",
            "resources with waiters, longest queue first",
        );
        let rows: Vec<Vec<Cell>> = state
            .longest_queues
            .iter()
            .map(|(r, n)| vec![Cell::long(r.as_str()), Cell::num(*n as f64)])
            .collect();
        page.table(
            "queues",
            &["resource", "waiters"],
            &rows,
            "no one is waiting",
        );
        page.section(
            "Most contended",
            "Acquire calls that found the resource held, since lockd started",
        );
        let rows: Vec<Vec<Cell>> = metrics
            .hot(crate::metrics::TOP_N)
            .into_iter()
            .map(|(r, n)| vec![Cell::long(r), Cell::num(n as f64)])
            .collect();
        page.table(
            "contended",
            &["resource", "busy or queued answers"],
            &rows,
            "no contention yet",
        );
        self.recent(&mut page, metrics);
        page.finish(concat!("lockd ", env!("CARGO_PKG_VERSION")))
    }

    /// The recent expiries, long holds and refusals.
    fn recent(&self, page: &mut Page, metrics: &crate::metrics::Metrics) {
        let now = SystemTime::now();
        page.section(
            "Recent expiries and long holds",
            "leases that ran out without a release (their holder stopped renewing), and leases held past limits.hold_warn_after_ms; newest first",
        );
        let rows: Vec<Vec<Cell>> = metrics
            .recent_leases
            .newest_first()
            .into_iter()
            .map(|(at, n)| {
                let kind = if n.kind == "expiry" {
                    Cell::text("expired").bad()
                } else {
                    Cell::text("held long")
                };
                vec![
                    Cell::when(at, now),
                    kind,
                    Cell::long(n.resource),
                    Cell::long(n.holder),
                    Cell::num(n.token as f64),
                    Cell::keyed(
                        html::duration(Duration::from_millis(n.held_ms)),
                        n.held_ms as f64,
                    ),
                ]
            })
            .collect();
        page.table(
            "expiries",
            &["when", "what", "resource", "holder", "token", "held for"],
            &rows,
            "none since lockd started",
        );
        page.section(
            "Recent refusals",
            "calls refused with an error; newest first",
        );
        let rows: Vec<Vec<Cell>> = metrics
            .recent_refusals
            .newest_first()
            .into_iter()
            .map(|(at, r)| {
                vec![
                    Cell::when(at, now),
                    Cell::text(r.method),
                    Cell::long(r.resource),
                    Cell::text(r.outcome).bad(),
                    Cell::long(r.reason),
                    Cell::text(r.peer.map(|p| p.to_string()).unwrap_or_default()),
                ]
            })
            .collect();
        page.table(
            "refusals",
            &["when", "call", "resource", "result", "reason", "peer"],
            &rows,
            "none since lockd started",
        );
    }
}

/// The longest-held locks (at most [`PAGE_LOCKS`]), the held locks looked at, and whether
/// that was all of them.
async fn longest_holds(driver: &crate::driver::Driver) -> (Vec<lockd_core::Listed>, usize, bool) {
    let mut all = Vec::new();
    let mut from = 0;
    let mut looked = 0;
    loop {
        let Ok(page) = driver.list(from, 1000, |_| true).await else {
            return (all, looked, false);
        };
        looked += page.locks.len();
        all.extend(page.locks);
        all.sort_by_key(|l| l.granted_at);
        all.truncate(PAGE_LOCKS);
        match page.next {
            Some(next) if looked < PAGE_LOOK_MAX => from = next,
            Some(_) => return (all, looked, false),
            None => return (all, looked, true),
        }
    }
}

impl opskit::admin::Endpoints for Admin {
    fn metrics(&self) -> String {
        opskit::render(&self.registry)
    }

    fn ready(&self) -> Result<(), String> {
        readiness(&self.routes).map_err(str::to_string)
    }

    fn page<'a>(&'a self, path: &'a str, query: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            match path {
                "/" | "/status" => Some(self.status(query).await),
                _ => None,
            }
        })
    }

    fn pages(&self) -> &'static str {
        "/ (the status page)"
    }
}
