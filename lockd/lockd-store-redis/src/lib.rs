//! lockd's Redis backend: one lockd instance *leads* and decides with the same core as the
//! embedded mode; Redis (one master, its replicas, and the Sentinels that watch them) stores
//! its batches, so that another instance can take over when the leader dies.
//!
//! - [`election`]: the leader holds `{p}:leader` (`SET NX PX`), kept alive by a script that
//!   extends it only while it holds this term's value. The leader knows until when the key
//!   surely lives ([`Term::in_force`]): only until then may it answer.
//! - [`RedisStore`]: the leader's [`Store`](lockd_store::Store). Each group commit is one Lua
//!   script (cut into several beyond [`store::MAX_SCRIPT_BYTES`]), which checks the leader key
//!   and the previous batch's id before it changes anything, so that a deposed leader's batch
//!   and a late batch change nothing; then `WAIT` for the replicas.
//! - The master is the one Sentinel names ([`Cluster::master`]): of the Sentinels that answer,
//!   the one with the highest configuration epoch. Sentinel raises that epoch (with a
//!   majority of Sentinels' votes) at every failover. A term runs on one master only, and
//!   ends when Sentinel names another.
//!
//! # Tokens never go backwards
//!
//! Redis replicates asynchronously: a failover may lose the last writes a leader was
//! answered for, the token high-water among them. So a term's tokens start above its
//! *epoch floor*, `epoch << `[`EPOCH_SHIFT`], where the term's epoch is the configuration epoch
//! of its master (or the highest epoch a term stored on that master, if higher). A leader
//! whose master was failed over from issued its tokens below the next epoch's floor, so every
//! token of the next master is above them, whatever it lost. The token high-water file in
//! each instance's data directory ([`HIGH_WATER_FILE`]) guards against a master that lost
//! its data otherwise (restarted empty).
//!
//! The records, the mirror of the stored state and the cutting of a batch are the etcd and
//! ZooKeeper stores' too ([`lockd_store_kv`]). Every Redis call has a deadline
//! (`request_timeout`); a call that cannot complete in time is an error, never a grant.

pub mod election;
mod scripts;
mod state;
pub mod store;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use lockd_store_kv::highwater::HighWater;
use redis::aio::MultiplexedConnection;

pub use crate::election::{Campaign, Term};
pub use crate::store::RedisStore;
pub use lockd_store_kv::Member;

/// Why a call to Redis or Sentinel failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// Redis or Sentinel could not answer in time, or cannot take writes now.
    #[error("{0}")]
    Unavailable(String),
    /// Redis refused a call for a reason a retry will not fix.
    #[error("Redis refused the call: {0}")]
    Refused(String),
    /// A stored value is not what lockd writes.
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Config(String),
}

/// A Redis failure as the store reports it to the writer.
impl From<RedisError> for lockd_store::StoreError {
    fn from(e: RedisError) -> lockd_store::StoreError {
        use lockd_store::StoreError;
        match e {
            RedisError::Unavailable(m) => StoreError::Unavailable(m),
            RedisError::Corrupt(m) => StoreError::Corrupt(m),
            RedisError::Refused(m) | RedisError::Config(m) => StoreError::Io(m),
        }
    }
}

/// The error codes of a Redis that cannot take the call now (a demoted master, one loading
/// its data, one without enough replicas, one busy with a script).
const TRANSIENT: [&str; 6] = [
    "READONLY",
    "LOADING",
    "MASTERDOWN",
    "NOREPLICAS",
    "BUSY",
    "TRYAGAIN",
];

/// `e`, from a call that was `doing` something, as a [`RedisError`].
fn failed(doing: &str, e: redis::RedisError) -> RedisError {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.code().is_some_and(|c| TRANSIENT.contains(&c));
    if transient {
        RedisError::Unavailable(format!("{doing}: {e}"))
    } else {
        RedisError::Refused(format!("{doing}: {e}"))
    }
}

/// A reply of alternating names and values (`SENTINEL MASTER`, `CONFIG GET`), by name.
fn pairs(reply: &[String]) -> HashMap<&str, &str> {
    reply
        .chunks(2)
        .filter_map(|kv| Some((kv.first()?.as_str(), kv.get(1)?.as_str())))
        .collect()
}

/// How lockd reaches its Redis.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// `host:port` of each Sentinel.
    pub sentinels: Vec<String>,
    /// The name Sentinel monitors the master under.
    pub master: String,
    /// Prefix of every key of this lockd cluster (`lockd`: `lockd:leader`, `lockd:locks`, …).
    pub prefix: String,
    /// Longest one Redis or Sentinel call may take before it is an error.
    pub request_timeout: Duration,
    /// How long the leader key lives past its last renewal: how long a dead leader keeps the
    /// cluster without one.
    pub leader_ttl: Duration,
    /// How many replicas must have a batch before its answer (`WAIT`).
    pub wait_replicas: u32,
    /// Where the token high-water file lives ([`HIGH_WATER_FILE`]).
    pub data_dir: PathBuf,
}

/// The token high-water file of the Redis mode, in the data directory (see
/// [`lockd_store_kv::highwater`]).
pub const HIGH_WATER_FILE: &str = "redis-token-high-water";

/// Bits of a token below its term's epoch: a term's tokens start above `epoch << 40`, and
/// 2^40 (about 10^12) tokens fit between two failovers.
pub const EPOCH_SHIFT: u32 = 40;

/// The highest epoch whose floor is within the token range (2^23 - 1): a stored or reported
/// epoch above it is refused, never adopted (it would exhaust the tokens at once).
pub const MAX_EPOCH: u64 = fencing::FencingToken::MAX.get() >> EPOCH_SHIFT;

/// The lowest token a term of `epoch` may follow (capped at the top of the token range,
/// where the core answers tokens_exhausted).
pub fn epoch_floor(epoch: u64) -> u64 {
    let top = fencing::FencingToken::MAX.get();
    if epoch > top >> EPOCH_SHIFT {
        top
    } else {
        epoch << EPOCH_SHIFT
    }
}

/// The keys of one lockd cluster.
#[derive(Clone, Debug)]
pub struct Keys {
    pub leader: String,
    pub epoch: String,
    pub high_water: String,
    pub batch: String,
    pub locks: String,
    pub requests: String,
}

impl Keys {
    /// The keys under `prefix`, which must be 1 to 64 bytes of letters, digits, `-`, `_`,
    /// `.` and `:`.
    pub fn new(prefix: &str) -> Result<Keys, RedisError> {
        let fine = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
        if prefix.is_empty() || prefix.len() > 64 || !prefix.chars().all(fine) {
            return Err(RedisError::Config(format!(
                "redis_prefix {prefix:?} must be 1 to 64 of: letters, digits, - _ . :"
            )));
        }
        let key = |name: &str| format!("{prefix}:{name}");
        Ok(Keys {
            leader: key("leader"),
            epoch: key("epoch"),
            high_water: key("high-water"),
            batch: key("batch"),
            locks: key("locks"),
            requests: key("requests"),
        })
    }
}

/// The master as Sentinel names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Master {
    /// `host:port`.
    pub address: String,
    /// Sentinel's configuration epoch of this master.
    pub epoch: u64,
}

/// The connection to one lockd cluster's keys in Redis: the Sentinels, and a connection to
/// the master for reading.
pub struct Cluster {
    options: RedisOptions,
    keys: Keys,
    highwater: HighWater,
    /// Open connections to the Sentinels, by address (dropped when a call fails).
    sentinels: Mutex<HashMap<String, MultiplexedConnection>>,
    /// The master a follower last read from, and its connection.
    reader: Mutex<Option<(Master, MultiplexedConnection)>>,
}

impl Cluster {
    /// Checks the options and finds the master (so that a wrong Sentinel address or master
    /// name is an error at start-up).
    pub async fn connect(options: &RedisOptions) -> Result<Cluster, RedisError> {
        if options.sentinels.is_empty() {
            return Err(RedisError::Config(
                "no Sentinels (redis_endpoints is empty)".to_string(),
            ));
        }
        let keys = Keys::new(&options.prefix)?;
        let highwater = HighWater::open(&options.data_dir, HIGH_WATER_FILE).map_err(|e| {
            RedisError::Config(format!(
                "token high-water in {}: {e}",
                options.data_dir.display()
            ))
        })?;
        let cluster = Cluster {
            options: options.clone(),
            keys,
            highwater,
            sentinels: Mutex::default(),
            reader: Mutex::default(),
        };
        cluster.master().await?;
        Ok(cluster)
    }

    /// The highest token this instance has seen.
    pub fn high_water(&self) -> &HighWater {
        &self.highwater
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn request_timeout(&self) -> Duration {
        self.options.request_timeout
    }

    pub fn leader_ttl(&self) -> Duration {
        self.options.leader_ttl
    }

    /// Runs `call` with the request timeout.
    async fn within<T>(
        &self,
        doing: &str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, RedisError> {
        match tokio::time::timeout(self.options.request_timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(failed(doing, e)),
            Err(_) => Err(RedisError::Unavailable(format!(
                "{doing}: no answer within {:?}",
                self.options.request_timeout
            ))),
        }
    }

    /// A new connection to `address` (`host:port`).
    async fn open(&self, address: &str) -> Result<MultiplexedConnection, RedisError> {
        let doing = format!("connecting to Redis at {address}");
        let client = redis::Client::open(format!("redis://{address}/"))
            .map_err(|e| RedisError::Config(format!("{doing}: {e}")))?;
        // No response timeout of the client's own (500 ms by default, shorter than a WAIT):
        // every call has the request timeout instead.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.options.request_timeout));
        self.within(
            &doing,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
    }

    /// The master, as the Sentinels that answer name it: the one of the highest configuration
    /// epoch. An error if none answers.
    pub async fn master(&self) -> Result<Master, RedisError> {
        let asked = futures_util::future::join_all(
            self.options.sentinels.iter().map(|s| self.ask_sentinel(s)),
        )
        .await;
        let mut best: Option<Master> = None;
        let mut errors = Vec::new();
        for answer in asked {
            match answer {
                Ok(m) if best.as_ref().is_none_or(|b| m.epoch > b.epoch) => best = Some(m),
                Ok(_) => {}
                Err(RedisError::Config(e)) => return Err(RedisError::Config(e)),
                Err(e) => errors.push(e.to_string()),
            }
        }
        best.ok_or_else(|| {
            RedisError::Unavailable(format!(
                "no Sentinel named the master {:?}: {}",
                self.options.master,
                errors.join("; ")
            ))
        })
    }

    /// What the Sentinel at `address` says of the master.
    async fn ask_sentinel(&self, address: &str) -> Result<Master, RedisError> {
        let cached = self
            .sentinels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)
            .cloned();
        let mut conn = match cached {
            Some(c) => c,
            None => {
                let c = self.open(address).await?;
                self.sentinels
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(address.to_string(), c.clone());
                c
            }
        };
        let doing = format!("asking the Sentinel at {address} for the master");
        let reply: Result<Vec<String>, RedisError> = self
            .within(
                &doing,
                redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(&self.options.master)
                    .query_async(&mut conn),
            )
            .await;
        let reply = match reply {
            Ok(r) => r,
            Err(RedisError::Refused(e)) if e.contains("No such master") => {
                return Err(RedisError::Config(format!(
                    "the Sentinel at {address} monitors no master named {:?} (redis_master)",
                    self.options.master
                )));
            }
            Err(e) => {
                self.sentinels
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(address);
                return Err(e);
            }
        };
        let fields = pairs(&reply);
        let field = |name: &str| {
            fields.get(name).copied().ok_or_else(|| {
                RedisError::Unavailable(format!("{doing}: the answer has no {name:?}: {reply:?}"))
            })
        };
        let (ip, port) = (field("ip")?, field("port")?);
        let epoch = field("config-epoch")?.parse::<u64>().map_err(|e| {
            RedisError::Unavailable(format!("{doing}: config-epoch is not a number: {e}"))
        })?;
        let address = if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        };
        Ok(Master { address, epoch })
    }

    /// A connection to the master for reading (a follower's), opened again when the master
    /// changed or the connection failed.
    async fn reader(&self) -> Result<MultiplexedConnection, RedisError> {
        let master = self.master().await?;
        let cached = self
            .reader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some((m, conn)) = cached
            && m == master
        {
            return Ok(conn);
        }
        let conn = self.open(&master.address).await?;
        *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = Some((master, conn.clone()));
        Ok(conn)
    }

    /// Forgets the reader's connection (after it failed).
    fn drop_reader(&self) {
        *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_letters_digits_and_a_few_marks() {
        for fine in ["lockd", "team-a:lockd", "a.b_c"] {
            let k = Keys::new(fine).unwrap();
            assert_eq!(k.leader, format!("{fine}:leader"));
        }
        for bad in ["", "a b", "lockd{x}", "é", &"x".repeat(65)] {
            assert!(Keys::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_epoch_floor_is_above_every_token_of_the_epochs_before_and_the_top_caps_it() {
        assert_eq!(epoch_floor(0), 0);
        assert_eq!(epoch_floor(1), 1 << 40);
        assert!(epoch_floor(2) > epoch_floor(1) + (1 << 39));
        let top = fencing::FencingToken::MAX.get();
        assert_eq!(
            epoch_floor(top >> EPOCH_SHIFT),
            (top >> EPOCH_SHIFT) << EPOCH_SHIFT
        );
        assert_eq!(epoch_floor((top >> EPOCH_SHIFT) + 1), top);
        assert_eq!(epoch_floor(u64::MAX), top);
    }
}
