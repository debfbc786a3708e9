//! fence-proxy's PostgreSQL mode: a session relay between PostgreSQL clients and one PostgreSQL
//! server that makes PostgreSQL run the fence check inside every transaction that may touch
//! data, of every session: the check reads the session's `fencing.resource` and
//! `fencing.token` inside PostgreSQL, so whatever way they were set is what it enforces.
//!
//! - [`schema`]: the check itself (schema `fencing`: a table of marks, SECURITY DEFINER
//!   functions, protected tables), its installation with sqlx, the text `fence-proxy pg
//!   print-schema` prints, and the statements the relay prepares.
//! - `machine`: the session machine, without I/O: where the check goes, which replies are the
//!   relay's own (hidden) and what they said, the errors it answers itself.
//! - `session`: one client connection's I/O: start-up (TLS included), the two directions of
//!   the relay.
//! - [`upstream`]: the connection to PostgreSQL, in plaintext or TLS.
//! - `pool`: server connections reused across client connections (session pooling), the
//!   clients' authentication it needs (`scram`), and the reset between clients.
//! - [`sqlstate`]: the one table of the errors this mode reports.
//! - [`Relay`]: what the sessions of one listener share: settings, the in-memory map of highest
//!   tokens seen (a cache that rejects an obviously stale token without a round trip; the table
//!   in PostgreSQL stays the authority), the cancel-key registry and the connection count.
//!
//! The codec is `pg-wire`; this crate owns the I/O.

mod machine;
mod pool;
pub mod schema;
mod scram;
mod session;
pub mod sqlstate;
mod tally;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use compact_str::CompactString;
use dashmap::DashMap;

pub use pool::{AuthFile, PoolAuth, PoolConfig};
pub use upstream::UpstreamTls;

/// TLS towards clients.
#[derive(Clone, Debug)]
pub struct ListenerTls {
    /// The certificate offered to an SSLRequest (and to a direct TLS handshake).
    pub server: Arc<tlsconf::Reloadable>,
    /// Refuse sessions that stay in plaintext (28000). Cancel requests are taken either way,
    /// as PostgreSQL takes them.
    pub required: bool,
}

/// Settings of one PostgreSQL listener.
#[derive(Debug, Clone)]
pub struct PgRelayConfig {
    /// The PostgreSQL server, `host:port`.
    pub upstream: String,
    /// Longest a transaction with a newer token waits for older-token transactions before
    /// PostgreSQL ends them (passed to the check).
    pub fence_wait: Duration,
    /// Largest message a client may send (CopyData excepted: it is streamed).
    pub message_max_bytes: usize,
    /// Client connections at most; one more is refused with SQLSTATE 53300.
    pub connections_max: usize,
    /// Connections still in start-up (TLS handshake, start-up packet) at once from one
    /// address; one more is refused with 53300, so that one client's silent connections
    /// cannot take every slot of `connections_max`.
    pub startups_per_peer_max: usize,
    pub connect_timeout: Duration,
    /// Longest a client may take to send its start-up packet.
    pub startup_timeout: Duration,
    /// Resources the in-memory map of highest tokens holds at most.
    pub marks_max: usize,
    /// How long the fenced error of a session that was idle when PostgreSQL ended it waits for
    /// the client's next message (after which the connection is closed without it).
    pub fenced_hold: Duration,
    /// Leave the checks at commit points to PostgreSQL in sessions whose start-up reports
    /// `fence_hook.active = on` (proxy/pg-hook, docs/fence-proxy.md "The commit hook").
    /// `false`: every commit point is checked by the proxy, as without the hook.
    pub trust_commit_hook: bool,
    /// With signed tokens on: the databases this proxy installed its keys in. PostgreSQL
    /// verifies signatures only where it has the keys, so in any other database a session
    /// may not present a token at all (its checks take the bare form: FN004). `None`: every
    /// database is checked as installed.
    pub verified_databases: Option<Vec<String>>,
    /// TLS towards clients (`None`: SSLRequest is answered `N`).
    pub tls: Option<ListenerTls>,
    /// TLS towards PostgreSQL (`None`: plaintext).
    pub upstream_tls: Option<UpstreamTls>,
    /// Server connections reused across clients (`None`: one per client connection, and
    /// PostgreSQL authenticates every client).
    pub pool: Option<PoolConfig>,
}

impl Default for PgRelayConfig {
    fn default() -> PgRelayConfig {
        PgRelayConfig {
            upstream: "127.0.0.1:5432".into(),
            fence_wait: Duration::from_millis(1000),
            message_max_bytes: 64 << 20,
            connections_max: 1000,
            startups_per_peer_max: 256,
            connect_timeout: Duration::from_secs(5),
            startup_timeout: Duration::from_secs(10),
            marks_max: 1_000_000,
            fenced_hold: Duration::from_secs(60),
            trust_commit_hook: true,
            verified_databases: None,
            tls: None,
            upstream_tls: None,
            pool: None,
        }
    }
}

/// Where a cancel request for one of our sessions goes.
struct CancelTarget {
    key: Vec<u8>,
    upstream_pid: i32,
    upstream_key: Vec<u8>,
    /// A pooled server connection's gate (see `pool::ServerConn::gate`).
    gate: Option<Arc<tokio::sync::RwLock<()>>>,
}

/// What the sessions of one listener share.
pub struct Relay {
    config: PgRelayConfig,
    /// Highest token seen accepted (or reported) per database and resource: a cache, never the
    /// authority. Per database: two databases behind one listener have marks of their own.
    marks: DashMap<CompactString, Arc<Marks>>,
    /// Entries in all of `marks`, bounded by `marks_max`.
    marks_len: Arc<AtomicUsize>,
    cancels: DashMap<i32, CancelTarget>,
    connections: AtomicUsize,
    /// Connections in start-up, per peer address.
    starting: Arc<tlsconf::PerPeer>,
    pool: Option<pool::Pool>,
}

impl Relay {
    pub fn new(config: PgRelayConfig) -> Relay {
        Relay {
            starting: tlsconf::PerPeer::new(config.startups_per_peer_max),
            pool: config
                .pool
                .clone()
                .map(|p| pool::Pool::new(p, config.connections_max)),
            config,
            marks: DashMap::new(),
            marks_len: Arc::new(AtomicUsize::new(0)),
            cancels: DashMap::new(),
            connections: AtomicUsize::new(0),
        }
    }

    pub fn config(&self) -> &PgRelayConfig {
        &self.config
    }

    /// Client connections open now.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// The marks of the sessions of `database`.
    pub(crate) fn marks_of(&self, database: &str) -> Arc<Marks> {
        if let Some(m) = self.marks.get(database) {
            return Arc::clone(&m);
        }
        let fresh = Marks {
            map: DashMap::new(),
            len: Arc::clone(&self.marks_len),
            max: self.config.marks_max,
        };
        Arc::clone(
            &self
                .marks
                .entry(database.into())
                .or_insert_with(|| Arc::new(fresh)),
        )
    }

    /// Registers a session's cancel key and returns the pid and key handed to the client.
    fn register_cancel(
        &self,
        upstream_pid: i32,
        upstream_key: &[u8],
        gate: Option<Arc<tokio::sync::RwLock<()>>>,
    ) -> (i32, Vec<u8>) {
        // A CSPRNG in this thread, seeded by the operating system: two system calls per
        // connection were a measurable share of a connection's cost (pgbench -C).
        let mut rng = rand::rng();
        loop {
            let mut key = vec![0u8; upstream_key.len()];
            rand::Rng::fill(&mut rng, &mut key[..]);
            let pid = (rand::Rng::random::<u32>(&mut rng) & 0x7fff_ffff) as i32;
            if pid == 0 {
                continue;
            }
            if let dashmap::Entry::Vacant(v) = self.cancels.entry(pid) {
                v.insert(CancelTarget {
                    key: key.clone(),
                    upstream_pid,
                    upstream_key: upstream_key.to_vec(),
                    gate,
                });
                return (pid, key);
            }
        }
    }

    fn unregister_cancel(&self, pid: i32) {
        self.cancels.remove(&pid);
    }

    /// Forwards a client's CancelRequest to the upstream session it names, if the key matches.
    async fn cancel(&self, pid: i32, key: &[u8]) {
        let lookup = || {
            self.cancels.get(&pid).and_then(|t| {
                let same = t.key.len() == key.len()
                    && t.key.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
                same.then(|| (t.upstream_pid, t.upstream_key.clone(), t.gate.clone()))
            })
        };
        let mut target = lookup();
        // A pooled connection: hold its gate while forwarding, and only if the session is
        // still registered once it is held (the reset waits for the gate after the session
        // unregistered), so that no cancel reaches the connection's next client.
        let mut _held = None;
        if let Some((_, _, Some(gate))) = &target {
            _held = Some(Arc::clone(gate).read_owned().await);
            target = lookup();
        }
        let Some((upstream_pid, upstream_key, _)) = target else {
            tracing::debug!(
                pid,
                "cancel request for an unknown session or with a wrong key"
            );
            return;
        };
        upstream::cancel(&self.config, upstream_pid, &upstream_key).await;
        tracing::debug!(pid, upstream_pid, "forwarded a cancel request");
    }
}

/// The in-memory marks of one database.
pub(crate) struct Marks {
    map: DashMap<CompactString, i64>,
    len: Arc<AtomicUsize>,
    max: usize,
}

impl machine::Marks for Marks {
    fn mark(&self, resource: &str) -> Option<i64> {
        self.map.get(resource).map(|m| *m)
    }

    fn raise(&self, resource: &str, token: i64) {
        if let Some(mut m) = self.map.get_mut(resource) {
            if *m < token {
                *m = token;
            }
            return;
        }
        // Past `marks_max`, new resources are simply checked by PostgreSQL alone.
        if self.len.load(Ordering::Relaxed) < self.max {
            let mut inserted = false;
            let mut m = self.map.entry(resource.into()).or_insert_with(|| {
                inserted = true;
                token
            });
            if *m < token {
                *m = token;
            }
            drop(m);
            if inserted {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Accepts PostgreSQL clients on `listener` until `shutdown` completes; each session runs in its
/// own task (sessions still open when it returns end with the runtime), counted as its worker's
/// load while it lasts.
pub async fn serve(
    listener: shards::Listener,
    relay: Arc<Relay>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    // One reaper for the listener's pool, whichever worker serves first.
    let reaper = relay
        .pool
        .as_ref()
        .filter(|p| !p.reaping.swap(true, Ordering::AcqRel))
        .map(|p| {
            let relay = Arc::clone(&relay);
            let every =
                (p.config.idle / 2).clamp(Duration::from_millis(10), Duration::from_secs(10));
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(every);
                loop {
                    ticks.tick().await;
                    if let Some(p) = &relay.pool {
                        p.reap();
                    }
                }
            })
        });
    let _reaper = AbortOnDrop(reaper);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer, load)) => {
                    let relay = Arc::clone(&relay);
                    tokio::spawn(async move {
                        session::run(relay, stream, peer).await;
                        drop(load);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: log, and keep serving the others.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::task::yield_now().await;
                }
            }
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}
