//! lockd's ZooKeeper backend: one lockd instance *leads* and decides with the same core as the
//! embedded mode; ZooKeeper stores its batches, replicated to a majority of the ensemble, so
//! that another instance can take over when the leader dies.
//!
//! - [`election`]: each candidate creates an ephemeral sequential node under
//!   `{p}/election`; the lowest leads, for as long as its ZooKeeper session lives. The leader
//!   knows until when its session surely lives ([`Term::in_force`]): only until then may it
//!   answer.
//! - [`ZkStore`]: the leader's [`Store`](lockd_store::Store). Each group commit is one
//!   ZooKeeper multi-op (cut into several beyond ZooKeeper's request size), which checks the
//!   leader's election node first and the version of `{p}/batch` last: a deposed leader (its
//!   session expired, its node deleted) has its next batch refused and stops deciding.
//! - [`paths`]: the node layout.
//!
//! The records, the mirror of the stored state and the cutting of a batch are the etcd
//! store's too ([`lockd_store_kv`]). Every ZooKeeper call has a deadline (`request_timeout`);
//! a call that cannot complete in time (no quorum, no server reachable) is an error, never a
//! grant.

pub mod election;
pub mod paths;
mod state;
mod store;

use std::path::PathBuf;
use std::time::Duration;

use lockd_store_kv::highwater::HighWater;
use zookeeper_client as zk;

pub use crate::election::{Campaign, Term};
pub use crate::store::ZkStore;
pub use lockd_store_kv::Member;

use crate::paths::Paths;

/// Why a call to ZooKeeper failed.
#[derive(Debug, thiserror::Error)]
pub enum ZkError {
    /// ZooKeeper could not answer in time: no quorum, or no server reachable.
    #[error("{0}")]
    Unavailable(String),
    /// ZooKeeper refused a call for a reason a retry will not fix.
    #[error("ZooKeeper refused the call: {0}")]
    Refused(String),
    /// A stored node is not what lockd writes.
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Config(String),
}

/// A ZooKeeper failure as the store reports it to the writer.
impl From<ZkError> for lockd_store::StoreError {
    fn from(e: ZkError) -> lockd_store::StoreError {
        use lockd_store::StoreError;
        match e {
            ZkError::Unavailable(m) => StoreError::Unavailable(m),
            ZkError::Corrupt(m) => StoreError::Corrupt(m),
            ZkError::Refused(m) | ZkError::Config(m) => StoreError::Io(m),
        }
    }
}

/// `e`, from a call that was `doing` something, as a [`ZkError`].
fn failed(doing: &str, e: zk::Error) -> ZkError {
    match e {
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::NoHosts
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::Throttled
        | zk::Error::ClientClosed => ZkError::Unavailable(format!("{doing}: {e}")),
        e => ZkError::Refused(format!("{doing}: {e}")),
    }
}

/// How lockd reaches its ZooKeeper ensemble.
#[derive(Clone, Debug)]
pub struct ZkOptions {
    /// `host:port` of each server.
    pub endpoints: Vec<String>,
    /// Path under which this lockd cluster keeps its nodes (`/lockd`).
    pub prefix: String,
    /// Longest one ZooKeeper call may take before it is an error.
    pub request_timeout: Duration,
    /// The session timeout asked of ZooKeeper: how long a dead leader keeps the cluster
    /// without one (ZooKeeper may grant another, within its `minSessionTimeout` and
    /// `maxSessionTimeout`; the granted one is used).
    pub session_timeout: Duration,
    /// Where the token high-water file lives ([`HIGH_WATER_FILE`]).
    pub data_dir: PathBuf,
}

/// The token high-water file of the ZooKeeper mode, in the data directory (see
/// [`lockd_store_kv::highwater`]).
pub const HIGH_WATER_FILE: &str = "zookeeper-token-high-water";

/// The connection to one lockd cluster's nodes in ZooKeeper: a session for reading, shared,
/// and what each candidate needs to open a session of its own.
pub struct Cluster {
    /// The shared session, replaced when it has ended (expired during an outage).
    client: std::sync::Mutex<zk::Client>,
    connect: String,
    paths: Paths,
    request_timeout: Duration,
    session_timeout: Duration,
    highwater: HighWater,
}

impl Cluster {
    /// Connects, and creates the nodes lockd keeps its state under if they are not there.
    pub async fn connect(options: &ZkOptions) -> Result<Cluster, ZkError> {
        if options.endpoints.is_empty() {
            return Err(ZkError::Config(
                "no ZooKeeper endpoints (zk_endpoints is empty)".to_string(),
            ));
        }
        let paths = Paths::new(&options.prefix)?;
        let highwater = HighWater::open(&options.data_dir, HIGH_WATER_FILE).map_err(|e| {
            ZkError::Config(format!(
                "token high-water in {}: {e}",
                options.data_dir.display()
            ))
        })?;
        let connect = options.endpoints.join(",");
        let cluster = Cluster {
            client: std::sync::Mutex::new(
                session(&connect, options.session_timeout, options.request_timeout).await?,
            ),
            connect,
            paths,
            request_timeout: options.request_timeout,
            session_timeout: options.session_timeout,
            highwater,
        };
        cluster.set_up().await?;
        Ok(cluster)
    }

    /// The shared session; a new one if it has ended.
    async fn reader(&self) -> Result<zk::Client, ZkError> {
        let current = self
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if !current.state().is_terminated() {
            return Ok(current);
        }
        let fresh = session(&self.connect, self.session_timeout, self.request_timeout).await?;
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// The highest token this instance has seen.
    pub fn high_water(&self) -> &HighWater {
        &self.highwater
    }

    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Runs `call` with the request timeout.
    async fn within<T>(
        &self,
        doing: &str,
        call: impl std::future::Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, ZkError> {
        self.answer(doing, call)
            .await?
            .map_err(|e| failed(doing, e))
    }

    /// ZooKeeper's answer to `call`, or an error if none came within the request timeout.
    async fn answer<T, E>(
        &self,
        doing: &str,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<Result<T, E>, ZkError> {
        tokio::time::timeout(self.request_timeout, call)
            .await
            .map_err(|_| {
                ZkError::Unavailable(format!(
                    "{doing}: no answer from ZooKeeper within {:?}",
                    self.request_timeout
                ))
            })
    }

    /// Creates the skeleton, the high-water (0) and the batch node, each unless it exists.
    /// A prefix inside another lockd cluster's nodes is refused: its nodes would be taken for
    /// records of that cluster, whose next leader would then refuse to load.
    async fn set_up(&self) -> Result<(), ZkError> {
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let client = self.reader().await?;
        for above in self.paths.ancestors() {
            let doing = "reading the nodes above zk_prefix";
            let batch = self
                .within(doing, client.check_stat(&format!("{above}/batch")))
                .await?;
            let election = self
                .within(doing, client.check_stat(&format!("{above}/election")))
                .await?;
            if batch.is_some() && election.is_some() {
                return Err(ZkError::Config(format!(
                    "zk_prefix {} is inside the nodes of the lockd cluster at {above}: give each cluster a path of its own, outside every other's",
                    self.paths.prefix()
                )));
            }
        }
        let last = format!("{}/ff", self.paths.requests());
        if self
            .within("reading the nodes", client.check_stat(&last))
            .await?
            .is_some()
            && self
                .within("reading the nodes", client.check_stat(self.paths.batch()))
                .await?
                .is_some()
        {
            return Ok(());
        }
        let mut nodes: Vec<(String, &[u8])> = self
            .paths
            .skeleton()
            .into_iter()
            .map(|p| (p, &b""[..]))
            .collect();
        nodes.push((self.paths.high_water().to_string(), b"0"));
        nodes.push((self.paths.batch().to_string(), b""));
        for (path, data) in &nodes {
            let doing = "creating lockd's nodes";
            match self
                .answer(doing, client.create(path, data, &options))
                .await?
            {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(failed(doing, e)),
            }
        }
        Ok(())
    }
}

/// A new ZooKeeper session.
async fn session(
    connect: &str,
    session_timeout: Duration,
    request_timeout: Duration,
) -> Result<zk::Client, ZkError> {
    let connecting = zk::Client::connector()
        .with_session_timeout(session_timeout)
        .connect(connect);
    match tokio::time::timeout(request_timeout.max(session_timeout), connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(failed(&format!("connecting to ZooKeeper at {connect}"), e)),
        Err(_) => Err(ZkError::Unavailable(format!(
            "connecting to ZooKeeper at {connect}: no session within {:?}",
            request_timeout.max(session_timeout)
        ))),
    }
}
