//! fence-proxy on its admin listener (`admin_listen`, served by opskit::admin):
//!
//! - `GET /metrics`: the fence's metrics in both modes (opskit::fence);
//! - `GET /healthz`: 200 while the process serves at all;
//! - `GET /readyz`: 200 once every listener is up and, for each PostgreSQL listener with
//!   `schema_urls`, the check is found installed in each of those databases (asked every
//!   [`PROBE_EVERY`]); 503 with the reason otherwise;
//! - `GET /` (or `/status`): the status page: the marks raised lately, the most refused
//!   resources, recent refusals and ended zombie transactions.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use opskit::admin::BoxFuture;
use opskit::fence::{self as obs, Mode, Outcome};
use opskit::html::{Cell, Level, Page};

/// How often `/readyz`'s answer about the check is renewed.
const PROBE_EVERY: Duration = Duration::from_secs(10);

pub struct Ops {
    registry: prometheus_client::registry::Registry,
    /// Every listener is up.
    started: AtomicBool,
    /// Why the check is not known to be installed (`None`: it is, everywhere asked).
    not_installed: Mutex<Option<String>>,
    /// Each listener, as bound: mode, address, upstream.
    listeners: Mutex<Vec<String>>,
}

impl Ops {
    pub fn new() -> Ops {
        let mut registry = prometheus_client::registry::Registry::default();
        obs::get().register(&mut registry);
        Ops {
            registry,
            started: AtomicBool::new(false),
            not_installed: Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// A listener is bound (`what`: its mode, address and upstream).
    pub fn listening(&self, what: String) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
    }

    /// Every listener is up.
    pub fn started(&self) {
        self.started.store(true, Ordering::Release);
    }

    /// Asks each of `urls` whether the check is installed, now and every [`PROBE_EVERY`].
    pub fn probe(self: &Arc<Self>, urls: Vec<String>, connect_timeout: Duration) {
        if urls.is_empty() {
            return;
        }
        let ops = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let mut why = None;
                for url in &urls {
                    if let Err(e) = pg_relay::schema::probe(url, connect_timeout).await {
                        why = Some(e);
                        break;
                    }
                }
                if let Some(w) = &why {
                    tracing::warn!(reason = %w, "not ready: the fence check is not known to be installed");
                }
                *ops.not_installed.lock().unwrap_or_else(|e| e.into_inner()) = why;
                tokio::time::sleep(PROBE_EVERY).await;
            }
        });
    }

    fn readiness(&self) -> Result<(), String> {
        if !self.started.load(Ordering::Acquire) {
            return Err("starting: the listeners are not all up yet".into());
        }
        match &*self.not_installed.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    fn status(&self, query: &str) -> String {
        let m = obs::get();
        let now = SystemTime::now();
        let mut page = Page::new("fence-proxy", query);
        if let Err(why) = self.readiness() {
            page.banner(Level::Bad, &format!("not ready: {why}"));
        }
        let stale: u64 = [Mode::Http, Mode::Pg]
            .iter()
            .map(|mode| m.count(*mode, Outcome::Stale))
            .sum();
        let forged: u64 = [Mode::Http, Mode::Pg]
            .iter()
            .map(|mode| m.count(*mode, Outcome::Forged))
            .sum();
        if stale > 0 || m.zombies_ended() > 0 {
            page.banner(
                Level::Warn,
                &format!(
                    "{stale} stale write(s) refused and {} zombie transaction(s) ended since start: a client went on writing after its lock passed to another (the fence stopped it; find it in the tables below)",
                    m.zombies_ended()
                ),
            );
        }
        if forged > 0 {
            page.banner(
                Level::Bad,
                &format!("{forged} write(s) with a token not signed by lockd refused since start"),
            );
        }
        let passed = m.count(Mode::Http, Outcome::Passed) + m.count(Mode::Pg, Outcome::Passed);
        page.facts(&[
            (
                "listeners",
                self.listeners
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .join(", "),
            ),
            (
                "connections (pg / http)",
                format!(
                    "{} / {}",
                    m.connections(Mode::Pg),
                    m.connections(Mode::Http)
                ),
            ),
            ("fenced writes passed", passed.to_string()),
            ("stale refused", stale.to_string()),
            ("zombies ended", m.zombies_ended().to_string()),
        ]);

        page.section(
            "Marks",
            "the highest token accepted per resource, for the resources whose mark rose lately (newest first; the mark in force is the authority's: marks.redb, PostgreSQL's fencing.tokens)",
        );
        let mut seen = HashSet::new();
        let rows: Vec<Vec<Cell>> = m
            .recent_raises
            .newest_first()
            .into_iter()
            .filter(|(_, r)| seen.insert((r.mode, r.resource.clone())))
            .map(|(at, r)| {
                vec![
                    Cell::long(r.resource),
                    Cell::text(r.mode.as_str()),
                    Cell::num(r.token as f64),
                    Cell::when(at, now),
                ]
            })
            .collect();
        page.table(
            "marks",
            &["resource", "mode", "mark", "raised"],
            &rows,
            "no mark raised since start",
        );

        page.section("Most refused", "refused writes per resource since start");
        let rows: Vec<Vec<Cell>> = m
            .most_refused(obs::TOP_N)
            .into_iter()
            .map(|(r, n)| vec![Cell::long(r), Cell::num(n as f64).bad()])
            .collect();
        page.table(
            "most-refused",
            &["resource", "refused"],
            &rows,
            "nothing refused since start",
        );

        page.section(
            "Recent refusals",
            "fenced writes refused: stale tokens, malformed or forged ones; newest first",
        );
        let rows: Vec<Vec<Cell>> = m
            .recent_refusals
            .newest_first()
            .into_iter()
            .map(|(at, r)| {
                vec![
                    Cell::when(at, now),
                    Cell::text(r.outcome.as_str()).bad(),
                    Cell::long(r.resource),
                    Cell::text(r.token),
                    Cell::text(r.highest.map(|h| h.to_string()).unwrap_or_default()),
                    Cell::text(r.mode.as_str()),
                    Cell::text(r.peer),
                    Cell::long(r.target),
                    Cell::long(r.reason),
                ]
            })
            .collect();
        page.table(
            "refusals",
            &[
                "when", "result", "resource", "token", "highest", "mode", "client", "target",
                "reason",
            ],
            &rows,
            "nothing refused since start",
        );

        page.section(
            "Ended zombie transactions",
            "open transactions with an older token that PostgreSQL ended because a newer token waited for them (FN003); newest first",
        );
        let rows: Vec<Vec<Cell>> = m
            .recent_zombies
            .newest_first()
            .into_iter()
            .map(|(at, z)| {
                vec![
                    Cell::when(at, now),
                    Cell::long(z.resource),
                    Cell::num(z.token as f64).bad(),
                    Cell::text(z.newer.map(|n| n.to_string()).unwrap_or_default()),
                    Cell::text(z.peer),
                    Cell::text(z.database),
                ]
            })
            .collect();
        page.table(
            "zombies",
            &["when", "resource", "token", "newer", "client", "database"],
            &rows,
            "none since start",
        );
        page.finish(concat!("fence-proxy ", env!("CARGO_PKG_VERSION")))
    }
}

impl opskit::admin::Endpoints for Ops {
    fn metrics(&self) -> String {
        opskit::render(&self.registry)
    }

    fn ready(&self) -> Result<(), String> {
        self.readiness()
    }

    fn page<'a>(&'a self, path: &'a str, query: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            match path {
                "/" | "/status" => Some(self.status(query)),
                _ => None,
            }
        })
    }

    fn pages(&self) -> &'static str {
        "/ (the status page)"
    }
}
