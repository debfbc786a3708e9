//! lockd's etcd backend: one lockd instance *leads* and decides with the same core as the
//! embedded mode; etcd stores its batches, replicated to a majority, so that another instance
//! can take over when the leader dies.
//!
//! - [`election`]: the leader is whoever holds the key `{p}/leader` under its *leadership
//!   lease* (an etcd lease). The leader keeps the lease alive and knows until when it surely
//!   holds it ([`Term::in_force`]): only until then may it answer. Followers read the key to
//!   find the leader, and campaign when it is gone.
//! - [`EtcdStore`]: the leader's [`Store`](lockd_store::Store). Each group commit is one etcd
//!   transaction (cut into several when it exceeds etcd's limits), conditional on the leader
//!   key being the leader's own: a leader that was deposed (paused past its lease, cut off
//!   from the majority) has its next batch refused and stops deciding.
//! - [`clockcheck`]: each term checks its leader's clock against etcd's, and ends when the
//!   two disagree (a clock jump, a clock running fast or slow), before it decides anything by
//!   that clock.
//! - [`Warm`]: a follower's copy of the stored state, kept current from a watch, so that it
//!   takes over without reading everything.
//! - [`highwater`]: the token high-water each instance writes down, the guard against an etcd
//!   cluster that lost data.
//! - [`keys`]: the key layout.
//!
//! Every etcd call has a deadline (`request_timeout`) and fails over between members; a call
//! that cannot complete in time (no quorum, members unreachable) is an error, never a grant.

pub mod clockcheck;
mod conn;
pub mod election;
/// The token high-water file of the etcd mode (see [`lockd_store_kv::highwater`]).
pub mod highwater {
    pub use lockd_store_kv::highwater::{FLUSH_EVERY, HighWater, MARGIN};
    /// Its name in the data directory.
    pub const FILE: &str = "etcd-token-high-water";
}
pub mod keys;
mod state;
mod store;

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{GetOptions, GetResponse, Txn, TxnResponse};
use tokio::time::Instant;

pub use crate::election::{Campaign, Member, Term, boot_time};
pub use crate::state::{Stored, Warm};
pub use crate::store::EtcdStore;

use crate::conn::Etcd;
use crate::highwater::HighWater;
use crate::keys::Keys;

/// Why a call to etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// etcd could not answer in time: no quorum, or no member reachable.
    #[error("{0}")]
    Unavailable(String),
    /// etcd refused a call for a reason a retry will not fix.
    #[error("etcd refused the call: {0}")]
    Etcd(String),
    /// A stored value is not what lockd writes.
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Config(String),
}

/// An etcd failure as the store reports it to the writer.
impl From<EtcdError> for lockd_store::StoreError {
    fn from(e: EtcdError) -> lockd_store::StoreError {
        use lockd_store::StoreError;
        match e {
            EtcdError::Unavailable(m) => StoreError::Unavailable(m),
            EtcdError::Corrupt(m) => StoreError::Corrupt(m),
            EtcdError::Etcd(m) | EtcdError::Config(m) => StoreError::Io(m),
        }
    }
}

/// etcd's default `--max-txn-ops`: the most operations one transaction may carry.
pub const MAX_TXN_OPS_DEFAULT: usize = 128;

/// How lockd reaches its etcd cluster.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// Key prefix of this lockd cluster (`/lockd`).
    pub prefix: String,
    /// Longest one etcd call may take (failing over between members) before it is an error.
    pub request_timeout: Duration,
    /// TTL of the leadership lease: how long a dead leader keeps the cluster without one.
    pub leader_ttl: Duration,
    /// Where the token high-water file lives.
    pub data_dir: PathBuf,
    /// The most operations per transaction (etcd's `--max-txn-ops`).
    pub max_txn_ops: usize,
    /// TLS to the members (`https://` endpoints): their CA, and a client certificate for
    /// members that require one.
    pub tls: Option<etcd_client::TlsOptions>,
}

/// The connection to one lockd cluster's keys in etcd, shared by the election and the store.
pub struct Cluster {
    etcd: Etcd,
    keys: Keys,
    request_timeout: Duration,
    leader_ttl: Duration,
    max_txn_ops: usize,
    highwater: HighWater,
    /// Leases of terms this instance gave up whose revocation etcd did not take (no quorum
    /// then): revoked at the next campaign, so that the others need not wait for their TTL.
    unrevoked: std::sync::Mutex<Vec<i64>>,
}

impl Cluster {
    /// Connects (lazily: members that are down are skipped until they are back) and reads the
    /// high-water file.
    pub async fn connect(options: &EtcdOptions) -> Result<Cluster, EtcdError> {
        let etcd = Etcd::connect(&options.endpoints, options.tls.as_ref()).await?;
        let highwater = HighWater::open(&options.data_dir, highwater::FILE).map_err(|e| {
            EtcdError::Config(format!(
                "token high-water in {}: {e}",
                options.data_dir.display()
            ))
        })?;
        if options.max_txn_ops < 8 {
            return Err(EtcdError::Config(format!(
                "max_txn_ops {} is too small (etcd's default is {MAX_TXN_OPS_DEFAULT})",
                options.max_txn_ops
            )));
        }
        Ok(Cluster {
            etcd,
            keys: Keys::new(&options.prefix),
            request_timeout: options.request_timeout,
            leader_ttl: options.leader_ttl,
            max_txn_ops: options.max_txn_ops,
            highwater,
            unrevoked: std::sync::Mutex::new(Vec::new()),
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn leader_ttl(&self) -> Duration {
        self.leader_ttl
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub fn high_water(&self) -> &HighWater {
        &self.highwater
    }

    /// Sends calls to etcd's leader first (a write sent to an etcd follower costs a hop).
    pub async fn prefer_etcd_leader(&self) {
        self.etcd.prefer_leader(conn::ATTEMPT_TIMEOUT).await;
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.request_timeout
    }

    /// Runs `txn` (failing over between members) within the request timeout.
    async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, EtcdError> {
        self.etcd
            .call(self.deadline(), what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    /// Reads `key` (with `options`, linearizable) within the request timeout.
    async fn get(
        &self,
        what: &str,
        key: String,
        options: Option<GetOptions>,
    ) -> Result<GetResponse, EtcdError> {
        self.etcd
            .call(self.deadline(), what, |mut c| {
                let (key, options) = (key.clone(), options.clone());
                async move { c.get(key, options).await }
            })
            .await
    }
}

/// A token high-water as lockd writes it: a decimal within the token range (0: none).
fn decimal(key: &str, value: &[u8]) -> Result<u64, EtcdError> {
    lockd_store_kv::high_water_value(key, value).map_err(|e| EtcdError::Corrupt(e.to_string()))
}

impl Cluster {
    /// etcd's current revision.
    pub async fn revision(&self) -> Result<i64, EtcdError> {
        let r = self
            .get(
                "reading etcd's revision",
                self.keys.high_water().to_string(),
                None,
            )
            .await?;
        Ok(r.header().map_or(0, |h| h.revision()))
    }

    /// Discards etcd's history before `revision` (the leader does this periodically: it
    /// writes thousands of revisions a second, and an uncompacted etcd fills its quota and
    /// then refuses every write). A revision compacted already is no error.
    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        match self
            .etcd
            .call(
                self.deadline(),
                "compacting etcd's history",
                |mut c| async move { c.compact(revision, None).await },
            )
            .await
        {
            Err(EtcdError::Etcd(m)) if m.contains("compacted") => Ok(()),
            other => other.map(drop),
        }
    }
}
