//! Starting and stopping lockd: open the store, rebuild the core, serve, shut down cleanly;
//! or, over etcd, connect and take part in the election (see [`crate::ha`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockd_core::Core;
use lockd_proto::v1::lock_service_server::LockServiceServer;
use lockd_store::{RedbStore, RedbStoreOptions, Store};
use tonic::transport::Server;
use tracing::{error, info};

use crate::clock::Clock;
use crate::config::{Backend, Config};
use crate::coord::{Coordination, Etcd, ZooKeeper};
use crate::driver::{Driver, OsLeaseIds};
use crate::ha::Ha;
use crate::service::{LockApi, Routes};
use crate::writer::Writer;
use lockd_store_etcd::{Cluster, EtcdOptions, Member};
use lockd_store_zk::ZkOptions;

/// Largest gRPC message lockd accepts: room for the largest valid request, a RenewMany or
/// ReleaseMany of `limits::BATCH_MAX` entries with names at their limit (each entry is the
/// name, the 32-digit lease id and at most 8 bytes of protobuf framing; every other request
/// is under 4 KiB). Anything bigger is garbage and is refused unread: about 293 KiB.
pub const MAX_MESSAGE_BYTES: usize = 4096
    + lockd_core::limits::BATCH_MAX
        * (fencing::RESOURCE_NAME_LEN_MAX + fencing::LeaseId::HEX_LEN + 8);

/// Concurrent calls per client connection. Each waiting Acquire is one stream; the total is
/// bounded separately by `limits.waiters_total_max`.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 4096;

/// Exit status when the store fails under lockd (EX_IOERR of sysexits.h).
pub const EXIT_STORE_FAILED: i32 = 74;

/// Why lockd could not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("opening the store: {0}")]
    Open(#[source] lockd_store::StoreError),
    #[error("loading the store: {0}")]
    Load(#[source] lockd_store::StoreError),
    #[error("the stored state is inconsistent; refusing to start: {0}")]
    Inconsistent(#[from] lockd_core::RecoverError),
    #[error("starting the etcd backend: {0}")]
    Etcd(#[source] lockd_store_etcd::EtcdError),
    #[error("ZooKeeper: {0}")]
    ZooKeeper(#[source] lockd_store_zk::ZkError),
    #[error("Redis: {0}")]
    Redis(#[source] lockd_store_redis::RedisError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("reading the bound address: {0}")]
    LocalAddr(#[source] std::io::Error),
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("{0}")]
    Keys(#[source] crate::config::ConfigError),
    #[error("TLS: {0}")]
    Tls(#[source] tlsconf::TlsError),
    #[error("{0}")]
    Audit(String),
}

/// Runs lockd until `shutdown` completes. Returns when everything is flushed.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    // Metrics are recorded only where an admin listener shows them.
    if config.admin_listen.is_some() {
        crate::metrics::enable();
    }
    if let Some(target) = &config.audit_log {
        crate::audit::start(target).map_err(ServeError::Audit)?;
    }
    if config.backend != Backend::Embedded {
        return run_cluster(config, shutdown).await;
    }
    let options = RedbStoreOptions {
        cache_size_bytes: config.cache_size_mb << 20,
        journal_bytes: config.journal_size_mb << 20,
        ..RedbStoreOptions::default()
    };
    let policy = load_policy(&config)?;
    let mut store = RedbStore::open(&config.data_dir, &options).map_err(ServeError::Open)?;
    let snapshot = store.load().map_err(ServeError::Load)?;
    let clock = Clock::new();
    let mut core = Core::recover(
        config.limits.clone(),
        Box::new(OsLeaseIds),
        snapshot,
        clock.now(),
    )?;
    core.set_tenancy(policy.as_ref().map(|p| p.tenancy()));
    let stats = core.stats();
    info!(
        data_file = %store.path().display(),
        leases = stats.leases,
        requests = stats.requests,
        last_token = core.last_token().map_or(0, |t| t.get()),
        "recovered; every held lease gets a full TTL from now"
    );
    let writer = Writer::start(
        Box::new(store),
        Duration::from_millis(config.sync_interval_ms),
        Box::new(|e| {
            // Fail-stop: the state on disk is unknown, so no further grant may be acknowledged.
            error!(error = %e, "store failure; lockd stops");
            eprintln!("lockd: store failure, stopping: {e}");
            std::process::exit(EXIT_STORE_FAILED);
        }),
    );
    let driver = Arc::new(Driver::new(core, writer, clock));
    let timer = tokio::spawn({
        let driver = Arc::clone(&driver);
        async move { driver.run_timer().await }
    });

    let stop = {
        let driver = Arc::clone(&driver);
        async move {
            shutdown.await;
            info!("shutting down: ending waits, finishing calls, flushing the store");
            driver.shutdown();
        }
    };
    let (incoming, addr) = bind(&config)?;
    let served = serve(
        &config,
        incoming,
        addr,
        Routes::Single(Arc::clone(&driver)),
        policy,
        stop,
    )
    .await;
    driver.shutdown();
    let _ = timer.await;
    driver.close_store();
    served?;
    info!("stopped");
    Ok(())
}

/// The coordination service `config` names, connected.
async fn coordination(config: &Config) -> Result<Arc<dyn Coordination>, ServeError> {
    if config.backend == Backend::Zookeeper {
        let options = ZkOptions {
            endpoints: config.zk_endpoints.clone(),
            prefix: config.zk_prefix.clone(),
            request_timeout: Duration::from_millis(config.zk_request_timeout_ms),
            session_timeout: Duration::from_millis(config.zk_session_timeout_ms),
            data_dir: config.data_dir.clone(),
        };
        let cluster = lockd_store_zk::Cluster::connect(&options)
            .await
            .map_err(ServeError::ZooKeeper)?;
        info!(
            endpoints = ?config.zk_endpoints,
            prefix = %config.zk_prefix,
            high_water = cluster.high_water().value(),
            "connected to ZooKeeper"
        );
        return Ok(Arc::new(ZooKeeper::new(
            Arc::new(cluster),
            options.session_timeout,
        )));
    }
    if config.backend == Backend::Redis {
        let options = lockd_store_redis::RedisOptions {
            sentinels: config.redis_endpoints.clone(),
            master: config.redis_master.clone(),
            prefix: config.redis_prefix.clone(),
            request_timeout: Duration::from_millis(config.redis_request_timeout_ms),
            leader_ttl: Duration::from_millis(config.redis_leader_ttl_ms),
            wait_replicas: config.redis_wait_replicas,
            data_dir: config.data_dir.clone(),
        };
        let cluster = lockd_store_redis::Cluster::connect(&options)
            .await
            .map_err(ServeError::Redis)?;
        info!(
            sentinels = ?config.redis_endpoints,
            master = %config.redis_master,
            prefix = %config.redis_prefix,
            high_water = cluster.high_water().value(),
            "connected to Redis's Sentinels"
        );
        return Ok(Arc::new(crate::coord::Redis::new(Arc::new(cluster))));
    }
    let options = EtcdOptions {
        endpoints: config.etcd_endpoints.clone(),
        prefix: config.etcd_prefix.clone(),
        request_timeout: Duration::from_millis(config.etcd_request_timeout_ms),
        leader_ttl: Duration::from_millis(config.etcd_leader_ttl_ms),
        data_dir: config.data_dir.clone(),
        max_txn_ops: config.etcd_max_txn_ops,
        tls: config.etcd_tls().map(|f| tonic_tls(&f)).transpose()?,
    };
    let cluster = Arc::new(Cluster::connect(&options).await.map_err(ServeError::Etcd)?);
    info!(
        endpoints = ?config.etcd_endpoints,
        prefix = %config.etcd_prefix,
        high_water = cluster.high_water().value(),
        "connected to etcd"
    );
    Ok(Arc::new(Etcd::new(
        cluster,
        (config.etcd_compact_every_ms > 0)
            .then(|| Duration::from_millis(config.etcd_compact_every_ms)),
    )))
}

/// lockd over etcd, ZooKeeper or Redis: campaign, then lead or follow (see [`crate::ha`]).
async fn run_cluster(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let policy = load_policy(&config)?;
    let coord = coordination(&config).await?;
    let (incoming, addr) = bind(&config)?;
    let advertise = config.advertise.clone().unwrap_or_else(|| {
        let scheme = if config.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{addr}")
    });
    let me = Member::new(advertise.clone());
    info!(id = %me.id, %advertise, "campaigning");
    let ha = Arc::new(Ha::new(
        coord,
        me,
        config.limits.clone(),
        Duration::from_millis(config.sync_interval_ms),
        peer_tls(&config)?,
        policy.as_ref().map(|p| p.tenancy()),
    ));
    let elections = tokio::spawn(Arc::clone(&ha).run());
    let stop = {
        let ha = Arc::clone(&ha);
        async move {
            shutdown.await;
            info!("shutting down: ending waits, finishing calls, handing the leadership over");
            ha.shutdown();
        }
    };
    let served = serve(
        &config,
        incoming,
        addr,
        Routes::Cluster(Arc::clone(&ha)),
        policy,
        stop,
    )
    .await;
    ha.shutdown();
    let _ = elections.await;
    served?;
    info!("stopped");
    Ok(())
}

/// Keeps `grpc.health.v1` in step with readiness (the overall status and the lock service's):
/// SERVING when calls can be served, NOT_SERVING otherwise (see `admin::readiness`).
async fn report_health(health: tonic_health::server::HealthReporter, routes: Routes) {
    use tonic_health::ServingStatus;
    let mut last = None;
    loop {
        let status = match crate::admin::readiness(&routes) {
            Ok(()) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        if last != Some(status) {
            health.set_service_status("", status).await;
            health
                .set_service_status(
                    <LockServiceServer<LockApi> as tonic::server::NamedService>::NAME,
                    status,
                )
                .await;
            last = Some(status);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The policy `policy` names, loaded, or `None`.
fn load_policy(config: &Config) -> Result<Option<Arc<crate::policy::Policy>>, ServeError> {
    Ok(config.policy().map_err(ServeError::Keys)?.map(Arc::new))
}

/// What this instance presents and trusts when it calls another one (TLS only).
fn peer_tls(config: &Config) -> Result<Option<tonic::transport::ClientTlsConfig>, ServeError> {
    config.peer_tls().map(|f| tonic_tls(&f)).transpose()
}

/// tonic's client TLS settings from `files`.
fn tonic_tls(
    files: &tlsconf::ClientFiles,
) -> Result<tonic::transport::ClientTlsConfig, ServeError> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let pems = files.pems().map_err(ServeError::Tls)?;
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pems.ca));
    if let Some((cert, key)) = pems.identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// The gRPC listener, bound: plaintext, or TLS with its certificates.
enum Listener {
    Plain(tokio::net::TcpListener),
    Tls(tokio::net::TcpListener, Arc<tlsconf::Reloadable>),
}

/// Binds the gRPC listener (with TLS when configured).
fn bind(config: &Config) -> Result<(Listener, std::net::SocketAddr), ServeError> {
    let listen_error = |source| ServeError::Listen {
        addr: config.listen,
        source,
    };
    let tls = match config.tls().map_err(ServeError::Keys)? {
        Some(files) => Some(tlsconf::Reloadable::new(files, &[b"h2"]).map_err(ServeError::Tls)?),
        None => None,
    };
    let socket = std::net::TcpListener::bind(config.listen).map_err(listen_error)?;
    socket.set_nonblocking(true).map_err(listen_error)?;
    let listener = tokio::net::TcpListener::from_std(socket).map_err(listen_error)?;
    let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
    Ok(match tls {
        Some(tls) => (Listener::Tls(listener, Arc::new(tls)), addr),
        None => (Listener::Plain(listener), addr),
    })
}

/// Serves the gRPC API on `listener` until `stop` completes.
async fn serve(
    config: &Config,
    listener: Listener,
    addr: std::net::SocketAddr,
    routes: Routes,
    policy: Option<Arc<crate::policy::Policy>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (tls, mtls) = match &listener {
        Listener::Plain(_) => (false, false),
        Listener::Tls(_, t) => (true, t.files().client_ca.is_some()),
    };
    info!(%addr, backend = ?config.backend, tls, mtls, "listening");
    if !tls && !addr.ip().to_canonical().is_loopback() {
        tracing::warn!(%addr, "serving plaintext gRPC on an address other than loopback (insecure = true): anyone who can reach it can take any lock and read lease ids in transit");
    }
    let keepalive = (config.keepalive_interval_ms > 0)
        .then(|| Duration::from_millis(config.keepalive_interval_ms));
    let keys = config.signing_keys().map_err(ServeError::Keys)?;
    match keys.as_ref().and_then(|k| k.active()) {
        Some(key) => info!(key_id = key.id(), "signing fencing tokens"),
        None => info!("fencing tokens are not signed (no fence_keys)"),
    }
    match &policy {
        Some(p) => info!(
            identities = p.identities(),
            tenants = p.tenancy().tenants().len(),
            "policy in force: every call is authenticated, and a tenant uses only its own resources"
        ),
        None if !addr.ip().to_canonical().is_loopback() => tracing::warn!(
            %addr,
            "no policy: every caller that reaches lockd may take, release or describe every lock"
        ),
        None => {}
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(report_health(health, routes.clone()));
    if let Some(admin) = config.admin_listen {
        let listener = tokio::net::TcpListener::bind(admin)
            .await
            .map_err(|source| ServeError::Listen {
                addr: admin,
                source,
            })?;
        let bound = listener.local_addr().map_err(ServeError::LocalAddr)?;
        info!(addr = %bound, "admin listening: /metrics, /healthz, /readyz, / (status page)");
        opskit::admin::serve(listener, Arc::new(crate::admin::Admin::new(routes.clone())));
    }
    let api = LockApi::new(routes, config.limits.clone(), keys.map(Arc::new), policy);
    let service = LockServiceServer::new(api).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let router = Server::builder()
        .http2_keepalive_interval(keepalive)
        .http2_keepalive_timeout(
            keepalive.map(|_| Duration::from_millis(config.keepalive_timeout_ms)),
        )
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .add_service(health_service)
        .add_service(service);
    match listener {
        Listener::Plain(socket) => {
            tlsconf::reload_on_sighup(Vec::new());
            let incoming = crate::tls::incoming_plain(socket, config.connections_max);
            router.serve_with_incoming_shutdown(incoming, stop).await?;
        }
        Listener::Tls(socket, tls) => {
            tlsconf::reload_on_sighup(vec![Arc::clone(&tls) as Arc<dyn tlsconf::Reload>]);
            let incoming = crate::tls::incoming(socket, tls, config.connections_max);
            router.serve_with_incoming_shutdown(incoming, stop).await?;
        }
    }
    Ok(())
}
