//! What the high-availability mode ([`crate::ha`]) needs of the coordination service under
//! it, and its implementations: etcd ([`Etcd`]), ZooKeeper ([`ZooKeeper`]) and Redis with
//! Sentinel ([`Redis`]).
//!
//! The HA mode itself (who leads, where calls go, how a term starts and ends) is the same
//! over each: a [`Coordination`] runs elections and names the leader; a won election is a
//! [`Leading`] term, which keeps itself in force, loads the stored state into the term's
//! [`Store`], and resigns. The guarantees of each service are in docs/config.md ("Backends").

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockd_core::Snapshot;
use lockd_store::Store;
use lockd_store_etcd::keys::LeaderRecord;
use lockd_store_etcd::{Cluster, EtcdStore, Member, Term, Warm, highwater};
use lockd_store_zk as zk;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::driver::Authority;

/// A boxed future (the traits are used as objects).
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A term's store, loaded: the store, the state, and where it was read from.
pub type Loaded = (Box<dyn Store>, Snapshot, &'static str);

/// A leader as the service names it: its record, and the handle of its leadership (etcd:
/// its lease; ZooKeeper: its node's sequence number; Redis: 0, the key is the leadership).
#[derive(Clone, Debug)]
pub struct Leader {
    pub record: LeaderRecord,
    pub handle: i64,
}

/// What a campaign ended with.
pub enum Campaigned {
    Won(Box<dyn Leading>),
    /// Another instance leads (`None`: its record could not be read).
    Lost(Option<Leader>),
}

/// A coordination service, as the HA mode uses it.
pub trait Coordination: Send + Sync + 'static {
    /// The service's name, for messages.
    fn service(&self) -> &'static str;
    /// Longest one call to the service may take.
    fn request_timeout(&self) -> Duration;
    /// How long a dead leader may keep the cluster without one.
    fn leader_ttl(&self) -> Duration;
    /// The current leader, if any.
    fn observe(&self) -> Fut<'_, Result<Option<Leader>, String>>;
    /// Runs for leadership as `me`.
    fn campaign<'a>(&'a self, me: &'a Member) -> Fut<'a, Result<Campaigned, String>>;
    /// Whether the leadership of a leader whose record is gone may still be in force (the
    /// record deleted by hand while its holder lives): no new leader before it has ended.
    fn leadership_alive<'a>(&'a self, leader: &'a Leader) -> Fut<'a, Result<bool, String>>;
    /// Keeps a copy of the stored state while this instance does not lead, if the service
    /// can (started once; a term takes it).
    fn warm_up(&self) {}
    /// Stops what [`Coordination::warm_up`] started.
    fn cool_down(&self) {}
    /// Resolves when `leader`'s leadership may have ended, if the service can tell (a
    /// watch); never, if it cannot (followers also look every 200 ms).
    fn leader_changed<'a>(&'a self, _leader: &'a Leader) -> Fut<'a, ()> {
        Box::pin(std::future::pending())
    }
    /// Tasks that run for as long as the instance does (until `stop`).
    fn background(self: Arc<Self>, _stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        Vec::new()
    }
}

/// One term of this instance as leader.
pub trait Leading: Send + Sync {
    /// What the driver checks before it answers.
    fn authority(&self) -> Arc<dyn Authority>;
    /// The term, for the log.
    fn describe(&self) -> String;
    /// Keeps the term in force; resolves with why it ended.
    fn keep(&self) -> Fut<'_, String>;
    /// The term's store, loaded.
    fn load(&self) -> Fut<'_, Result<Loaded, String>>;
    /// A task that runs while the term lasts (aborted when it ends).
    fn while_leading(&self) -> Option<JoinHandle<()>> {
        None
    }
    /// Ends the term and gives the leadership up at once.
    fn resign(&self) -> Fut<'_, ()>;
}

// ---- etcd ------------------------------------------------------------------------------------

/// How long a new etcd leader waits for its warm copy to reach the term's revision before it
/// reads the whole state instead.
const WARM_CATCH_UP: Duration = Duration::from_millis(500);

/// The pause before the warm copy is read again after its watch failed.
const WARM_RETRY_AFTER: Duration = Duration::from_millis(200);

/// lockd over etcd (`lockd_store_etcd`).
pub struct Etcd {
    cluster: Arc<Cluster>,
    /// How often the leader compacts etcd's history (`None`: never).
    compact_every: Option<Duration>,
    /// The warm copy of the state, kept while not leading.
    warm: WarmSlot,
}

/// Where the warm copy is kept: taken by the term that starts.
type WarmSlot = Arc<Mutex<Option<(Arc<Warm>, JoinHandle<()>)>>>;

fn take_warm(slot: &WarmSlot) -> Option<(Arc<Warm>, JoinHandle<()>)> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

impl Etcd {
    pub fn new(cluster: Arc<Cluster>, compact_every: Option<Duration>) -> Etcd {
        Etcd {
            cluster,
            compact_every,
            warm: Arc::default(),
        }
    }
}

impl Coordination for Etcd {
    fn service(&self) -> &'static str {
        "etcd"
    }

    fn request_timeout(&self) -> Duration {
        self.cluster.request_timeout()
    }

    fn leader_ttl(&self) -> Duration {
        self.cluster.leader_ttl()
    }

    fn observe(&self) -> Fut<'_, Result<Option<Leader>, String>> {
        Box::pin(async move {
            let observed = self.cluster.observe().await.map_err(|e| e.to_string())?;
            Ok(observed.map(|(record, handle)| Leader { record, handle }))
        })
    }

    fn campaign<'a>(&'a self, me: &'a Member) -> Fut<'a, Result<Campaigned, String>> {
        Box::pin(async move {
            match self.cluster.campaign(me).await.map_err(|e| e.to_string())? {
                lockd_store_etcd::Campaign::Won(term) => Ok(Campaigned::Won(Box::new(EtcdTerm {
                    warm: Arc::clone(&self.warm),
                    cluster: Arc::clone(&self.cluster),
                    term: Arc::new(term),
                    compact_every: self.compact_every,
                }))),
                lockd_store_etcd::Campaign::Lost(record, handle) => Ok(Campaigned::Lost(
                    record.map(|record| Leader { record, handle }),
                )),
            }
        })
    }

    fn leadership_alive<'a>(&'a self, leader: &'a Leader) -> Fut<'a, Result<bool, String>> {
        Box::pin(async move {
            if leader.handle == 0 {
                return Ok(false);
            }
            self.cluster
                .lease_alive(leader.handle)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn warm_up(&self) {
        let mut warm = self.warm.lock().unwrap_or_else(|p| p.into_inner());
        if warm.is_some() {
            return;
        }
        let copy = Arc::new(Warm::default());
        let task = tokio::spawn({
            let (cluster, copy) = (Arc::clone(&self.cluster), Arc::clone(&copy));
            async move {
                loop {
                    if let Err(e) = cluster.keep_warm(&copy).await {
                        warn!(error = %e, "the warm copy of the state stopped; reading it again");
                    }
                    tokio::time::sleep(WARM_RETRY_AFTER).await;
                }
            }
        });
        *warm = Some((copy, task));
    }

    fn cool_down(&self) {
        if let Some((_, task)) = take_warm(&self.warm) {
            task.abort();
        }
    }

    fn background(self: Arc<Self>, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let cluster = Arc::clone(&self.cluster);
        vec![
            tokio::spawn(flush_high_water(
                move || cluster.high_water().flush(),
                stop.clone(),
            )),
            tokio::spawn(prefer_etcd_leader(Arc::clone(&self.cluster), stop)),
        ]
    }
}

/// A term over etcd.
struct EtcdTerm {
    warm: WarmSlot,
    cluster: Arc<Cluster>,
    term: Arc<Term>,
    compact_every: Option<Duration>,
}

impl Authority for Term {
    fn in_force(&self) -> bool {
        Term::in_force(self)
    }

    /// Up to the point etcd's clock has surely reached, by the last clock check.
    fn expiry_limit(&self, now: lockd_core::Millis) -> Option<lockd_core::Millis> {
        let behind = lockd_store_etcd::boot_time().saturating_sub(self.proven());
        Some(now.saturating_sub(behind.as_millis() as u64))
    }

    fn trusted_again(&self) -> Fut<'static, ()> {
        Box::pin(self.verified())
    }
}

impl Leading for EtcdTerm {
    fn authority(&self) -> Arc<dyn Authority> {
        Arc::clone(&self.term) as Arc<dyn Authority>
    }

    fn describe(&self) -> String {
        format!(
            "lease {}, revision {}",
            self.term.lease(),
            self.term.revision()
        )
    }

    fn keep(&self) -> Fut<'_, String> {
        Box::pin(self.cluster.keep_leading(&self.term))
    }

    fn load(&self) -> Fut<'_, Result<Loaded, String>> {
        Box::pin(async move {
            let mut store = EtcdStore::new(Arc::clone(&self.cluster), Arc::clone(&self.term));
            let copy = match take_warm(&self.warm) {
                Some((warm, task)) => {
                    let copy = warm.take_at(self.term.revision(), WARM_CATCH_UP).await;
                    task.abort();
                    copy
                }
                None => None,
            };
            let (snapshot, from) = match &copy {
                Some(stored) => (store.load_from(stored).await, "warm copy"),
                None => (store.load_async().await, "etcd"),
            };
            let snapshot = snapshot.map_err(|e| e.to_string())?;
            Ok((Box::new(store) as Box<dyn Store>, snapshot, from))
        })
    }

    fn while_leading(&self) -> Option<JoinHandle<()>> {
        self.compact_every
            .map(|every| tokio::spawn(compact(Arc::clone(&self.cluster), every)))
    }

    fn resign(&self) -> Fut<'_, ()> {
        Box::pin(self.cluster.resign(&self.term))
    }
}

/// While leading: every `every`, compacts etcd's history up to the revision of one interval
/// before (so that one interval of history is always kept).
async fn compact(cluster: Arc<Cluster>, every: Duration) {
    let mut previous = None;
    loop {
        tokio::time::sleep(every).await;
        let now = match cluster.revision().await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "cannot read etcd's revision to compact");
                continue;
            }
        };
        if let Some(revision) = previous.replace(now) {
            match cluster.compact(revision).await {
                Ok(()) => info!(revision, "compacted etcd's history"),
                Err(e) => warn!(error = %e, revision, "cannot compact etcd's history"),
            }
        }
    }
}

/// Writes the high-water file (`flush`) every [`highwater::FLUSH_EVERY`], and once more at the
/// end.
async fn flush_high_water(
    flush: impl Fn() -> std::io::Result<()> + Clone + Send + Sync + 'static,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match tokio::task::spawn_blocking(flush.clone()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e, "cannot write the token high-water file"),
            Err(e) => error!(error = %e, "the high-water flush panicked"),
        }
        if *stop.borrow_and_update() {
            return;
        }
        let _ = tokio::time::timeout(highwater::FLUSH_EVERY, stop.changed()).await;
    }
}

/// Sends etcd calls to etcd's leader first, checking every few seconds.
async fn prefer_etcd_leader(cluster: Arc<Cluster>, mut stop: watch::Receiver<bool>) {
    loop {
        cluster.prefer_etcd_leader().await;
        if *stop.borrow_and_update() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), stop.changed()).await;
    }
}

// ---- ZooKeeper -------------------------------------------------------------------------------

/// lockd over ZooKeeper (`lockd_store_zk`), with the same token high-water file as over etcd
/// (`zookeeper-token-high-water`). A new leader reads the whole state (there is no warm
/// copy), and a leader's node deleted by hand lets the next campaign start at once: its
/// holder's term ends at its next read of the node, and nothing it sends after the deletion
/// commits.
pub struct ZooKeeper {
    cluster: Arc<zk::Cluster>,
    session_timeout: Duration,
}

impl ZooKeeper {
    pub fn new(cluster: Arc<zk::Cluster>, session_timeout: Duration) -> ZooKeeper {
        ZooKeeper {
            cluster,
            session_timeout,
        }
    }
}

impl Coordination for ZooKeeper {
    fn service(&self) -> &'static str {
        "ZooKeeper"
    }

    fn request_timeout(&self) -> Duration {
        self.cluster.request_timeout()
    }

    fn leader_ttl(&self) -> Duration {
        self.session_timeout
    }

    fn observe(&self) -> Fut<'_, Result<Option<Leader>, String>> {
        Box::pin(async move {
            let observed = self.cluster.observe().await.map_err(|e| e.to_string())?;
            Ok(observed.map(|(record, seq)| Leader {
                record,
                handle: seq as i64,
            }))
        })
    }

    /// A watch of the leader's node: a follower notices its end at once.
    fn leader_changed<'a>(&'a self, leader: &'a Leader) -> Fut<'a, ()> {
        Box::pin(self.cluster.leader_gone(leader.handle as u64))
    }

    fn campaign<'a>(&'a self, me: &'a Member) -> Fut<'a, Result<Campaigned, String>> {
        Box::pin(async move {
            match self.cluster.campaign(me).await.map_err(|e| e.to_string())? {
                zk::Campaign::Won(term) => Ok(Campaigned::Won(Box::new(ZkTerm {
                    cluster: Arc::clone(&self.cluster),
                    term: Arc::new(term),
                }))),
                zk::Campaign::Lost(leader) => {
                    Ok(Campaigned::Lost(leader.map(|(record, seq)| Leader {
                        record,
                        handle: seq as i64,
                    })))
                }
            }
        })
    }

    fn leadership_alive<'a>(&'a self, _leader: &'a Leader) -> Fut<'a, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }

    fn background(self: Arc<Self>, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let cluster = Arc::clone(&self.cluster);
        vec![tokio::spawn(flush_high_water(
            move || cluster.high_water().flush(),
            stop,
        ))]
    }
}

/// A term over ZooKeeper.
struct ZkTerm {
    cluster: Arc<zk::Cluster>,
    term: Arc<zk::Term>,
}

impl Authority for zk::Term {
    fn in_force(&self) -> bool {
        zk::Term::in_force(self)
    }
}

impl Leading for ZkTerm {
    fn authority(&self) -> Arc<dyn Authority> {
        Arc::clone(&self.term) as Arc<dyn Authority>
    }

    fn describe(&self) -> String {
        format!(
            "node {}, session timeout {:?}",
            self.term.node(),
            self.term.session_timeout()
        )
    }

    fn keep(&self) -> Fut<'_, String> {
        Box::pin(self.cluster.keep_leading(&self.term))
    }

    fn load(&self) -> Fut<'_, Result<Loaded, String>> {
        Box::pin(async move {
            let mut store = zk::ZkStore::new(Arc::clone(&self.cluster), Arc::clone(&self.term));
            let snapshot = store.load_async().await.map_err(|e| e.to_string())?;
            Ok((Box::new(store) as Box<dyn Store>, snapshot, "ZooKeeper"))
        })
    }

    fn resign(&self) -> Fut<'_, ()> {
        Box::pin(self.cluster.resign(&self.term))
    }
}

// ---- Redis -----------------------------------------------------------------------------------

/// lockd over Redis with Sentinel (`lockd_store_redis`), with the same token high-water file
/// as the others (`redis-token-high-water`). A new leader reads the whole state (there is no
/// warm copy). The leader key is the leadership: once it is gone, nobody leads.
pub struct Redis {
    cluster: Arc<lockd_store_redis::Cluster>,
}

impl Redis {
    pub fn new(cluster: Arc<lockd_store_redis::Cluster>) -> Redis {
        Redis { cluster }
    }
}

impl Coordination for Redis {
    fn service(&self) -> &'static str {
        "Redis"
    }

    fn request_timeout(&self) -> Duration {
        self.cluster.request_timeout()
    }

    fn leader_ttl(&self) -> Duration {
        self.cluster.leader_ttl()
    }

    fn observe(&self) -> Fut<'_, Result<Option<Leader>, String>> {
        Box::pin(async move {
            let observed = self.cluster.observe().await.map_err(|e| e.to_string())?;
            Ok(observed.map(|record| Leader { record, handle: 0 }))
        })
    }

    fn campaign<'a>(&'a self, me: &'a Member) -> Fut<'a, Result<Campaigned, String>> {
        Box::pin(async move {
            match self.cluster.campaign(me).await.map_err(|e| e.to_string())? {
                lockd_store_redis::Campaign::Won(term) => {
                    Ok(Campaigned::Won(Box::new(RedisTerm {
                        cluster: Arc::clone(&self.cluster),
                        term: Arc::new(term),
                    })))
                }
                lockd_store_redis::Campaign::Lost(record) => Ok(Campaigned::Lost(
                    record.map(|record| Leader { record, handle: 0 }),
                )),
            }
        })
    }

    fn leadership_alive<'a>(&'a self, _leader: &'a Leader) -> Fut<'a, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }

    fn background(self: Arc<Self>, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let cluster = Arc::clone(&self.cluster);
        vec![tokio::spawn(flush_high_water(
            move || cluster.high_water().flush(),
            stop,
        ))]
    }
}

/// A term over Redis.
struct RedisTerm {
    cluster: Arc<lockd_store_redis::Cluster>,
    term: Arc<lockd_store_redis::Term>,
}

impl Authority for lockd_store_redis::Term {
    fn in_force(&self) -> bool {
        lockd_store_redis::Term::in_force(self)
    }
}

impl Leading for RedisTerm {
    fn authority(&self) -> Arc<dyn Authority> {
        Arc::clone(&self.term) as Arc<dyn Authority>
    }

    fn describe(&self) -> String {
        format!(
            "master {} (configuration epoch {}), term epoch {}, leader TTL {:?}",
            self.term.master().address,
            self.term.master().epoch,
            self.term.epoch(),
            self.term.ttl()
        )
    }

    fn keep(&self) -> Fut<'_, String> {
        Box::pin(self.cluster.keep_leading(&self.term))
    }

    fn load(&self) -> Fut<'_, Result<Loaded, String>> {
        Box::pin(async move {
            let mut store = lockd_store_redis::RedisStore::new(
                Arc::clone(&self.cluster),
                Arc::clone(&self.term),
            );
            let snapshot = store.load_async().await.map_err(|e| e.to_string())?;
            Ok((Box::new(store) as Box<dyn Store>, snapshot, "Redis"))
        })
    }

    fn resign(&self) -> Fut<'_, ()> {
        Box::pin(self.cluster.resign(&self.term))
    }
}
