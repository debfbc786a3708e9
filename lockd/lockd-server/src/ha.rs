//! lockd over etcd: which instance leads, and where every other instance sends its calls.
//!
//! Each instance runs [`Ha::run`]: it campaigns for the leader key; the winner loads the
//! state from etcd, rebuilds the same core as the embedded mode (every stored lease gets a
//! full TTL from now, tokens continue above the stored high-water) and serves it over an
//! [`EtcdStore`] until its term ends; the others *follow*. A follower forwards every call to
//! the leader (the client may talk to any instance) and keeps reading the leader key, so that
//! it campaigns as soon as the key is gone.
//!
//! A term ends when its lease cannot be kept alive in time, when etcd refuses or fails a batch
//! (the writer stops), or on shutdown. The driver is then deposed: queued waits and new calls
//! are answered UNAVAILABLE `not_leader`, the lease is revoked (so another instance need not
//! wait for the TTL), and the instance campaigns again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd_core::{Core, Limits};
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_store_etcd::{Campaign, Cluster, EtcdStore, Member, Term, highwater};
use tokio::sync::watch;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tracing::{error, info, warn};

use crate::clock::Clock;
use crate::driver::{Authority, Driver, OsLeaseIds};
use crate::server::{EXIT_STORE_FAILED, MAX_MESSAGE_BYTES};
use crate::status::{no_leader, not_leader};
use crate::writer::Writer;

/// How often a follower reads the leader key (and the stored high-water).
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// The pause before campaigning again after etcd failed.
const CAMPAIGN_RETRY_AFTER: Duration = Duration::from_millis(200);

/// Metadata on a forwarded call: an instance that does not lead does not forward it again.
pub const FORWARDED_METADATA: &str = "lockd-forwarded-by";

impl Authority for Term {
    fn in_force(&self) -> bool {
        Term::in_force(self)
    }
}

/// What this instance is now.
#[derive(Clone)]
pub enum Role {
    /// Campaigning, or between terms.
    Candidate,
    Leader(Arc<Driver>),
    Follower {
        leader: String,
        client: LockServiceClient<Channel>,
    },
    Stopped,
}

/// Where a call goes.
pub enum Route {
    Local(Arc<Driver>),
    /// To the leader at this address.
    Forward(LockServiceClient<Channel>, String),
}

/// See the module documentation.
pub struct Ha {
    cluster: Arc<Cluster>,
    me: Member,
    limits: Limits,
    sync_interval: Duration,
    role: watch::Sender<Role>,
    stop: watch::Sender<bool>,
    /// A forward failed: the follower looks at the leader key again at once.
    look_again: tokio::sync::Notify,
}

impl Ha {
    pub fn new(cluster: Arc<Cluster>, me: Member, limits: Limits, sync_interval: Duration) -> Ha {
        Ha {
            cluster,
            me,
            limits,
            sync_interval,
            role: watch::channel(Role::Candidate).0,
            stop: watch::channel(false).0,
            look_again: tokio::sync::Notify::new(),
        }
    }

    /// Where a call goes now. Waits (up to the etcd request timeout) while there is no leader;
    /// a call that was forwarded already is served here or refused, never forwarded again.
    pub async fn route(&self, forwarded: bool) -> Result<Route, Status> {
        let mut rx = self.role.subscribe();
        let deadline = tokio::time::Instant::now() + self.cluster.request_timeout();
        loop {
            let role = rx.borrow_and_update().clone();
            match role {
                Role::Leader(driver) => return Ok(Route::Local(driver)),
                Role::Follower { client, leader } if !forwarded => {
                    return Ok(Route::Forward(client, leader));
                }
                Role::Follower { leader, .. } => {
                    return Err(not_leader(format!(
                        "this lockd does not lead; the leader is {leader}"
                    )));
                }
                Role::Stopped => {
                    return Err(Status::unavailable("lockd is shutting down"));
                }
                Role::Candidate => {}
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Err(no_leader(format!(
                    "no lockd leader within {:?}: an election is under way, or etcd is out of reach",
                    self.cluster.request_timeout()
                )));
            }
        }
    }

    /// A call forwarded to `failed` did not reach it (the leader died or stepped down): looks
    /// at the leader key again at once, and waits (up to the etcd request timeout) until the
    /// leadership has moved; then says where the call goes now.
    pub async fn reroute(&self, failed: &str) -> Result<Route, Status> {
        self.look_again.notify_one();
        let mut rx = self.role.subscribe();
        let deadline = tokio::time::Instant::now() + self.cluster.request_timeout();
        loop {
            let moved = match &*rx.borrow_and_update() {
                Role::Follower { leader, .. } => leader != failed,
                Role::Candidate => false,
                Role::Leader(_) | Role::Stopped => true,
            };
            if moved {
                return self.route(false).await;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Err(no_leader(format!(
                    "the leader {failed} cannot be reached, and no other took over within {:?}",
                    self.cluster.request_timeout()
                )));
            }
        }
    }

    /// Ends the current term (flushing what the leader decided) and stops campaigning.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Campaigns, leads and follows until [`Ha::shutdown`].
    pub async fn run(self: Arc<Self>) {
        let flusher = tokio::spawn(flush_high_water(
            Arc::clone(&self.cluster),
            self.stop.subscribe(),
        ));
        let etcd_leader = tokio::spawn(prefer_etcd_leader(
            Arc::clone(&self.cluster),
            self.stop.subscribe(),
        ));
        // Since when this instance has known of no leader (for the time it logs on taking over).
        let mut leader_gone = Instant::now();
        while !self.stopping() {
            match self.cluster.campaign(&self.me).await {
                Ok(Campaign::Won(term)) => {
                    self.lead(term, leader_gone).await;
                    leader_gone = Instant::now();
                }
                Ok(Campaign::Lost(leader)) => {
                    self.follow(leader).await;
                    leader_gone = Instant::now();
                }
                Err(e) => {
                    warn!(error = %e, "cannot campaign for leadership; retrying");
                    self.set(Role::Candidate);
                    self.pause(CAMPAIGN_RETRY_AFTER).await;
                }
            }
        }
        self.set(Role::Stopped);
        let _ = flusher.await;
        etcd_leader.abort();
    }

    fn set(&self, role: Role) {
        self.role.send_replace(role);
    }

    async fn pause(&self, d: Duration) {
        let mut stop = self.stop.subscribe();
        if *stop.borrow_and_update() {
            return;
        }
        let _ = tokio::time::timeout(d, stop.changed()).await;
    }

    /// One term as leader.
    async fn lead(&self, term: Term, leader_gone: Instant) {
        let term = Arc::new(term);
        let won = Instant::now();
        let mut store = EtcdStore::new(Arc::clone(&self.cluster), Arc::clone(&term));
        let snapshot = match store.load_async().await {
            Ok(s) => s,
            Err(e) => {
                error!(error = %e, "cannot load the state from etcd; giving the leadership up");
                self.cluster.resign(&term).await;
                self.pause(CAMPAIGN_RETRY_AFTER).await;
                return;
            }
        };
        let clock = Clock::new();
        let core = match Core::recover(
            self.limits.clone(),
            Box::new(OsLeaseIds),
            snapshot,
            clock.now(),
        ) {
            Ok(core) => core,
            Err(e) => {
                // What etcd holds breaks the invariants: no instance may serve it.
                error!(error = %e, "the state in etcd is inconsistent; lockd stops");
                eprintln!("lockd: the state in etcd is inconsistent, stopping: {e}");
                self.cluster.resign(&term).await;
                std::process::exit(EXIT_STORE_FAILED);
            }
        };
        let stats = core.stats();
        let last_token = core.last_token().map_or(0, |t| t.get());
        let (failed_tx, mut failed) = watch::channel(None::<String>);
        let writer = Writer::start(
            Box::new(store),
            self.sync_interval,
            Box::new(move |e| {
                failed_tx.send_replace(Some(e.to_string()));
            }),
        );
        let driver = Arc::new(Driver::new(core, writer, clock).with_authority(term.clone()));
        let timer = tokio::spawn({
            let driver = Arc::clone(&driver);
            async move { driver.run_timer().await }
        });
        self.set(Role::Leader(Arc::clone(&driver)));
        info!(
            lease = term.lease(),
            revision = term.revision(),
            leases = stats.leases,
            requests = stats.requests,
            last_token,
            load_ms = won.elapsed().as_millis() as u64,
            without_leader_ms = leader_gone.elapsed().as_millis() as u64,
            "leading: every stored lease gets a full TTL from now"
        );
        let mut stop = self.stop.subscribe();
        let why = tokio::select! {
            why = self.cluster.keep_leading(&term) => why,
            why = failed.wait_for(Option::is_some) => {
                let why = why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default();
                format!("etcd refused or failed a batch: {why}")
            }
            _ = stop.wait_for(|s| *s) => "shutting down".to_string(),
        };
        // No call reaches the driver from now on; the ones inside it end.
        self.set(Role::Candidate);
        driver.depose();
        let _ = timer.await;
        // Releases and expiries not yet committed are committed if the term still holds.
        let closing = Arc::clone(&driver);
        let _ = tokio::task::spawn_blocking(move || closing.close_store()).await;
        self.cluster.resign(&term).await;
        if why == "shutting down" {
            info!("stopped leading: shutting down");
        } else {
            warn!(reason = %why, "stopped leading");
            // Let the others campaign first: this instance just failed to lead.
            self.pause(CAMPAIGN_RETRY_AFTER).await;
        }
    }

    /// Follows `leader` until the leader key is gone (or this instance stops).
    async fn follow(&self, leader: Option<lockd_store_etcd::keys::LeaderRecord>) {
        let mut current: Option<String> = None;
        let mut leader = leader;
        loop {
            match &leader {
                Some(l) if current.as_deref() != Some(l.id.as_str()) => {
                    current = Some(l.id.clone());
                    if l.address == self.me.address {
                        // A predecessor on this very address (killed, its lease not yet run
                        // out): there is nobody to forward to until the key is gone.
                        warn!(leader = %l.id, address = %l.address, "the leader key names this address but another process; waiting for it to run out");
                        self.set(Role::Candidate);
                    } else {
                        match forward_client(&l.address) {
                            Ok(client) => {
                                info!(leader = %l.id, address = %l.address, "following");
                                self.set(Role::Follower {
                                    leader: l.address.clone(),
                                    client,
                                });
                            }
                            Err(e) => {
                                warn!(leader = %l.id, address = %l.address, error = %e, "the leader's address is not usable");
                                self.set(Role::Candidate);
                            }
                        }
                    }
                }
                Some(_) => {}
                None if current.is_some() => {
                    info!("the leader is gone; campaigning");
                    self.set(Role::Candidate);
                    return;
                }
                None => {
                    // The key holds something lockd did not write: do not campaign in a loop.
                    warn!("the leader key holds no leader record; waiting");
                    self.pause(FOLLOW_EVERY).await;
                    return;
                }
            }
            tokio::select! {
                () = self.pause(FOLLOW_EVERY) => {}
                () = self.look_again.notified() => {}
            }
            if self.stopping() {
                return;
            }
            match self.cluster.observe().await {
                Ok((l, _)) => leader = l,
                Err(e) => warn!(error = %e, "cannot read the leader key"),
            }
        }
    }
}

/// A client to the leader at `address`, connected lazily.
fn forward_client(address: &str) -> Result<LockServiceClient<Channel>, String> {
    let endpoint = Endpoint::from_shared(address.to_string())
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(
        LockServiceClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
    )
}

/// Writes the high-water file every [`highwater::FLUSH_EVERY`], and once more at the end.
async fn flush_high_water(cluster: Arc<Cluster>, mut stop: watch::Receiver<bool>) {
    loop {
        let c = Arc::clone(&cluster);
        match tokio::task::spawn_blocking(move || c.high_water().flush()).await {
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
