//! lockd over a coordination service (etcd, ZooKeeper or Redis with Sentinel, [`crate::coord`]): which instance
//! leads, and where every other instance sends its calls.
//!
//! Each instance runs [`Ha::run`]: it campaigns for leadership; the winner loads the stored
//! state, rebuilds the same core as the embedded mode (every stored lease gets a full TTL from
//! now, tokens continue above the stored high-water) and serves it over the term's store until
//! its term ends; the others *follow*. A follower forwards every call to the leader (the client
//! may talk to any instance) and keeps looking at who leads, so that it campaigns as soon as
//! the leader is gone.
//!
//! Over etcd, every instance that does not lead keeps a warm copy of the stored state (a full
//! read, then a watch of the prefix), so that a new leader starts from it once the copy has
//! reached the term's own revision, instead of reading everything (which takes seconds with a
//! million remembered request ids); it reads everything when the copy is not there in time.
//!
//! A term ends when it cannot be kept in force in time (etcd's lease, ZooKeeper's session, Redis's leader key),
//! when the service refuses or fails a batch (the writer stops), or on shutdown. The driver
//! is then deposed: queued waits and new calls are answered UNAVAILABLE `not_leader`, the
//! leadership is given up (so another instance need not wait for it to run out), and the
//! instance campaigns again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd_core::{Core, Limits, Tenancy};
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_store_etcd::Member;
use tokio::sync::watch;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, error, info, warn};

use crate::clock::Clock;
use crate::coord::{Campaigned, Coordination, Leader, Leading};
use crate::driver::{Driver, OsLeaseIds};
use crate::server::MAX_MESSAGE_BYTES;
use crate::status::{no_leader, not_leader};
use crate::writer::Writer;

/// How often a follower reads the leader key (and the stored high-water).
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// The pause before campaigning again after the state could not be loaded.
const LOAD_RETRY_AFTER: Duration = Duration::from_secs(2);

/// The pause before campaigning again after the coordination service failed.
const CAMPAIGN_RETRY_AFTER: Duration = Duration::from_millis(200);

/// How often the same campaign error is logged again at `warn` while it lasts.
const REPEAT_LOG_EVERY: Duration = Duration::from_secs(30);

/// Metadata on a forwarded call: an instance that does not lead does not forward it again.
pub const FORWARDED_METADATA: &str = "lockd-forwarded-by";

/// Metadata on a new leader's Describe to its own advertised address, and on the answer (the
/// answering instance's id): the address must reach the leader itself.
pub const PROBE_METADATA: &str = "lockd-probe";
pub const INSTANCE_METADATA: &str = "lockd-instance";

/// Attempts of the advertise check before the leader gives up.
const PROBE_ATTEMPTS: u32 = 3;

/// What this instance is now.
#[derive(Clone)]
pub enum Role {
    /// Campaigning, or between terms.
    Candidate,
    Leader(Arc<Driver>),
    Follower {
        leader: String,
        clients: Arc<Forwarders>,
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
    coord: Arc<dyn Coordination>,
    me: Member,
    limits: Limits,
    sync_interval: Duration,
    role: watch::Sender<Role>,
    stop: watch::Sender<bool>,
    /// A forward failed: the follower looks at the leader key again at once.
    look_again: tokio::sync::Notify,
    /// Cleared when the advertised address turned out not to reach this instance: it then
    /// only follows.
    may_lead: std::sync::atomic::AtomicBool,
    /// How this instance reaches the others (the leader, and itself for the advertise check)
    /// when they serve TLS: the peers' CA, and its own certificate as a client's.
    peer_tls: Option<tonic::transport::ClientTlsConfig>,
    /// Tenants' quotas (the policy's), for each core this instance leads.
    tenancy: Option<Arc<Tenancy>>,
}

impl Ha {
    pub fn new(
        coord: Arc<dyn Coordination>,
        me: Member,
        limits: Limits,
        sync_interval: Duration,
        peer_tls: Option<tonic::transport::ClientTlsConfig>,
        tenancy: Option<Arc<Tenancy>>,
    ) -> Ha {
        Ha {
            coord,
            me,
            limits,
            sync_interval,
            role: watch::channel(Role::Candidate).0,
            stop: watch::channel(false).0,
            look_again: tokio::sync::Notify::new(),
            may_lead: std::sync::atomic::AtomicBool::new(true),
            peer_tls,
            tenancy,
        }
    }

    /// Where a call goes now. Waits (up to the request timeout) while there is no leader;
    /// a call that was forwarded already is served here or refused, never forwarded again.
    pub async fn route(&self, forwarded: bool) -> Result<Route, Status> {
        let mut rx = self.role.subscribe();
        let deadline = tokio::time::Instant::now() + self.coord.request_timeout();
        loop {
            let role = rx.borrow_and_update().clone();
            match role {
                Role::Leader(driver) => return Ok(Route::Local(driver)),
                Role::Follower { clients, leader } if !forwarded => {
                    return Ok(Route::Forward(clients.next(), leader));
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
                    "no lockd leader within {:?}: an election is under way, or {} is out of reach",
                    self.coord.request_timeout(),
                    self.coord.service()
                )));
            }
        }
    }

    /// This process's instance id.
    /// This instance's core, while it leads.
    pub fn leading(&self) -> Option<Arc<Driver>> {
        match &*self.role.borrow() {
            Role::Leader(driver) => Some(Arc::clone(driver)),
            _ => None,
        }
    }

    /// Whether calls can be served now: this instance leads, or follows a known leader.
    pub fn ready(&self) -> bool {
        matches!(
            &*self.role.borrow(),
            Role::Leader(_) | Role::Follower { .. }
        )
    }

    /// This instance's part, as the status page says it.
    pub fn role_text(&self) -> String {
        match &*self.role.borrow() {
            Role::Leader(_) => format!("leader (this instance, {})", self.me.id),
            Role::Follower { leader, .. } => format!("follower of the leader at {leader}"),
            Role::Candidate => "no leader known: an election is under way".to_string(),
            Role::Stopped => "stopped".to_string(),
        }
    }

    pub fn instance_id(&self) -> &str {
        &self.me.id
    }

    /// The id of the instance that answers at `address` (a Describe with
    /// [`PROBE_METADATA`], answered with the answering instance's id), tried a few times.
    async fn instance_at(&self, address: &str) -> Result<String, String> {
        let client = lockd_client_to(address, self.peer_tls.as_ref())?;
        let mut last = String::new();
        for attempt in 0..PROBE_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let mut probe = tonic::Request::new(lockd_proto::v1::DescribeRequest::default());
            probe.set_timeout(Duration::from_secs(1));
            probe.metadata_mut().insert(
                PROBE_METADATA,
                tonic::metadata::MetadataValue::from_static("1"),
            );
            match client.clone().describe(probe).await {
                Ok(answer) => {
                    return Ok(answer
                        .metadata()
                        .get(INSTANCE_METADATA)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string());
                }
                Err(e) => last = format!("{address} cannot be reached: {e}"),
            }
        }
        Err(last)
    }

    /// Whether the advertised address reaches this very instance; why not, if not.
    async fn check_advertise(&self) -> Result<(), String> {
        let id = self.instance_at(&self.me.address).await?;
        if id == self.me.id {
            Ok(())
        } else {
            Err(format!(
                "{} is answered by another instance ({id:?}), not this one ({})",
                self.me.address, self.me.id
            ))
        }
    }

    /// Resolves once this instance no longer follows the leader at `address` (the leadership
    /// moved on, or is gone).
    pub async fn moved_from(&self, address: &str) {
        let mut rx = self.role.subscribe();
        let _ = rx
            .wait_for(|role| !matches!(role, Role::Follower { leader, .. } if leader == address))
            .await;
    }

    /// A call forwarded to `failed` did not reach it (the leader died or stepped down): looks
    /// at who leads again at once, and waits (up to the request timeout) until the leadership
    /// has moved; then says where the call goes now.
    pub async fn reroute(&self, failed: &str) -> Result<Route, Status> {
        self.look_again.notify_one();
        let mut rx = self.role.subscribe();
        let deadline = tokio::time::Instant::now() + self.coord.request_timeout();
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
                    self.coord.request_timeout()
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
        let background = Arc::clone(&self.coord).background(self.stop.subscribe());
        // Since when this instance has known of no leader (for the time it logs on taking over).
        let mut leader_gone = Instant::now();
        // The last campaign error logged, and when.
        let mut last_failure: Option<(String, Instant)> = None;
        while !self.stopping() {
            self.coord.warm_up();
            if !self.may_lead.load(std::sync::atomic::Ordering::Acquire) {
                match self.coord.observe().await {
                    Ok(Some(leader)) => self.follow(Some(leader)).await,
                    Ok(None) => {
                        self.set(Role::Candidate);
                        self.pause(FOLLOW_EVERY).await;
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read who leads");
                        self.pause(FOLLOW_EVERY).await;
                    }
                }
                continue;
            }
            match self.coord.campaign(&self.me).await {
                Ok(Campaigned::Won(term)) => {
                    self.lead(term, leader_gone).await;
                    leader_gone = Instant::now();
                }
                Ok(Campaigned::Lost(leader)) => {
                    self.follow(leader).await;
                    leader_gone = Instant::now();
                }
                Err(e) => {
                    // The same error again (a key edited by hand, a master that does not sync
                    // every write) is logged once per REPEAT_LOG_EVERY, not at every retry.
                    let now = Instant::now();
                    let repeat = matches!(&last_failure, Some((same, at)) if *same == e && now.duration_since(*at) < REPEAT_LOG_EVERY);
                    if repeat {
                        debug!(error = %e, "cannot campaign for leadership; retrying");
                    } else {
                        warn!(error = %e, "cannot campaign for leadership; retrying");
                        last_failure = Some((e, now));
                    }
                    self.set(Role::Candidate);
                    self.pause(CAMPAIGN_RETRY_AFTER).await;
                }
            }
        }
        self.set(Role::Stopped);
        self.coord.cool_down();
        for task in background {
            let _ = task.await;
        }
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
    async fn lead(&self, term: Box<dyn Leading>, leader_gone: Instant) {
        let won = Instant::now();
        let service = self.coord.service();
        // The term is kept in force from the start: loading a large state takes a while.
        let keep = term.keep();
        tokio::pin!(keep);
        let loaded = tokio::select! {
            loaded = term.load() => loaded,
            why = &mut keep => Err(why),
        };
        let (store, snapshot, from) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                error!(error = %e, "cannot load the state from {service}; giving the leadership up");
                term.resign().await;
                // Damaged data stays damaged: do not churn leases five times a second.
                self.pause(LOAD_RETRY_AFTER).await;
                return;
            }
        };
        let clock = Clock::new();
        let mut core = match Core::recover(
            self.limits.clone(),
            Box::new(OsLeaseIds),
            snapshot,
            clock.now(),
        ) {
            Ok(core) => core,
            Err(e) => {
                // What the service holds breaks the invariants: no instance may serve it until
                // it is repaired (the others find the same), and none exits over it.
                error!(error = %e, "the state in {service} is inconsistent; giving the leadership up");
                term.resign().await;
                self.pause(LOAD_RETRY_AFTER).await;
                return;
            }
        };
        core.set_tenancy(self.tenancy.clone());
        let stats = core.stats();
        let last_token = core.last_token().map_or(0, |t| t.get());
        let (failed_tx, mut failed) = watch::channel(None::<String>);
        let writer = Writer::start(
            store,
            self.sync_interval,
            Box::new(move |e| {
                failed_tx.send_replace(Some(e.to_string()));
            }),
        );
        let driver = Arc::new(Driver::new(core, writer, clock).with_authority(term.authority()));
        let timer = tokio::spawn({
            let driver = Arc::clone(&driver);
            async move { driver.run_timer().await }
        });
        self.set(Role::Leader(Arc::clone(&driver)));
        crate::metrics::get().took_over(leader_gone.elapsed());
        info!(
            term = %term.describe(),
            leases = stats.leases,
            requests = stats.requests,
            last_token,
            load_ms = won.elapsed().as_millis() as u64,
            loaded_from = from,
            without_leader_ms = leader_gone.elapsed().as_millis() as u64,
            "leading: every stored lease gets a full TTL from now"
        );
        let alongside = term.while_leading();
        let mut stop = self.stop.subscribe();
        let misadvertised = async {
            match self.check_advertise().await {
                Ok(()) => std::future::pending().await,
                Err(why) => why,
            }
        };
        let why = tokio::select! {
            why = &mut keep => why,
            why = misadvertised => {
                error!(advertise = %self.me.address, reason = %why, "the advertised address does not reach this instance: the others cannot forward to it, so it gives the leadership up and will only follow (fix advertise)");
                self.may_lead.store(false, std::sync::atomic::Ordering::Release);
                format!("advertise does not reach this instance: {why}")
            }
            why = failed.wait_for(Option::is_some) => {
                let why = why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default();
                format!("{service} refused or failed a batch: {why}")
            }
            _ = stop.wait_for(|s| *s) => "shutting down".to_string(),
        };
        // No call reaches the driver from now on; the ones inside it end.
        self.set(Role::Candidate);
        if let Some(task) = alongside {
            task.abort();
        }
        driver.depose();
        let _ = timer.await;
        // Releases and expiries not yet committed are committed if the term still holds.
        let closing = Arc::clone(&driver);
        let _ = tokio::task::spawn_blocking(move || closing.close_store()).await;
        term.resign().await;
        if self.stopping() {
            info!("stopped leading: shutting down");
        } else {
            warn!(reason = %why, "stopped leading");
            // Let the others campaign first: this instance just failed to lead.
            self.pause(CAMPAIGN_RETRY_AFTER).await;
        }
    }

    /// Follows `leader` until its leadership is gone (or this instance stops).
    async fn follow(&self, leader: Option<Leader>) {
        let mut current: Option<String> = None;
        let mut leader = leader;
        // The last leader seen, and since when a leader names this address.
        let mut last: Option<Leader> = None;
        let mut on_my_address: Option<Instant> = None;
        loop {
            match &leader {
                Some(seen) if current.as_deref() != Some(seen.record.id.as_str()) => {
                    let l = &seen.record;
                    current = Some(l.id.clone());
                    last = Some(seen.clone());
                    on_my_address = None;
                    // The leader advertises this instance's address: a predecessor on it (killed,
                    // its lease not yet run out), or one of the two advertise settings is wrong.
                    let reaches_me = l.address == self.me.address
                        && self.instance_at(&l.address).await.as_deref() == Ok(self.me.id.as_str());
                    if reaches_me {
                        // There is nobody to forward to until the key is gone.
                        warn!(leader = %l.id, address = %l.address, "the leader key names this address but another process; waiting for it to run out");
                        on_my_address = Some(Instant::now());
                        self.set(Role::Candidate);
                    } else {
                        match Forwarders::new(&l.address, self.peer_tls.as_ref()) {
                            Ok(clients) => {
                                info!(leader = %l.id, address = %l.address, "following");
                                self.set(Role::Follower {
                                    leader: l.address.clone(),
                                    clients: Arc::new(clients),
                                });
                            }
                            Err(e) => {
                                warn!(leader = %l.id, address = %l.address, error = %e, "the leader's address is not usable");
                                self.set(Role::Candidate);
                            }
                        }
                    }
                }
                Some(seen) => {
                    let l = &seen.record;
                    // A dead predecessor's leadership runs out within its TTL; a live leader
                    // that keeps naming this address has a wrong advertise setting.
                    if let Some(since) = on_my_address
                        && since.elapsed() > self.coord.leader_ttl() * 2
                    {
                        error!(leader = %l.id, address = %l.address, "the leader advertises this instance's address (its advertise setting is wrong): nobody can forward to it; fix its advertise, or stop it");
                        on_my_address = None;
                    }
                }
                None if current.is_some() => {
                    // The leader is gone. If its leadership is not (etcd: the key deleted by
                    // hand, its lease alive), the old leader may still be answering until it
                    // notices: no new leader before that leadership has ended.
                    let alive = match &last {
                        Some(seen) => self.coord.leadership_alive(seen).await,
                        None => Ok(false),
                    };
                    match alive {
                        Ok(false) => {
                            if self.may_lead.load(std::sync::atomic::Ordering::Acquire) {
                                info!("the leader is gone; campaigning");
                            } else {
                                info!(
                                    "the leader is gone; this instance only follows (its advertise is wrong)"
                                );
                            }
                            self.set(Role::Candidate);
                            return;
                        }
                        Ok(true) => warn!(
                            "the leader's record is gone but its leadership is not (deleted by hand?); waiting for it to end"
                        ),
                        Err(e) => warn!(error = %e, "cannot read the old leader's leadership"),
                    }
                }
                None => {
                    // The leadership holds something lockd did not write: do not campaign in a
                    // loop.
                    warn!("the leader holds no leader record lockd can read; waiting");
                    self.pause(FOLLOW_EVERY).await;
                    return;
                }
            }
            // A service that can watch the leader wakes the follower at its end.
            let gone = async {
                match &leader {
                    Some(l) => self.coord.leader_changed(l).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.pause(FOLLOW_EVERY) => {}
                () = self.look_again.notified() => {}
                () = gone => {}
            }
            if self.stopping() {
                return;
            }
            match self.coord.observe().await {
                Ok(l) => leader = l,
                Err(e) => warn!(error = %e, "cannot read who leads"),
            }
        }
    }
}

/// Connections to the leader, connected lazily, used in turn: the leader serves at most
/// `MAX_STREAMS_PER_CONNECTION` calls per connection, and waiting Acquires hold theirs.
pub struct Forwarders {
    clients: Vec<LockServiceClient<Channel>>,
    next: std::sync::atomic::AtomicUsize,
}

/// Connections a follower opens to the leader.
pub const FORWARD_CONNECTIONS: usize = 8;

/// A client of the lockd instance at `address`, on its own connection, made lazily (over TLS
/// with `tls`).
fn lockd_client_to(
    address: &str,
    tls: Option<&tonic::transport::ClientTlsConfig>,
) -> Result<LockServiceClient<Channel>, String> {
    let mut endpoint = Endpoint::from_shared(address.to_string()).map_err(|e| e.to_string())?;
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .map_err(|e| format!("TLS to {address}: {e}"))?;
    }
    let endpoint = endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(
        LockServiceClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
    )
}

impl Forwarders {
    fn new(
        address: &str,
        tls: Option<&tonic::transport::ClientTlsConfig>,
    ) -> Result<Forwarders, String> {
        let clients = (0..FORWARD_CONNECTIONS)
            .map(|_| lockd_client_to(address, tls))
            .collect::<Result<_, _>>()?;
        Ok(Forwarders {
            clients,
            next: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn next(&self) -> LockServiceClient<Channel> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.clients[i % self.clients.len()].clone()
    }
}
