//! lockd's etcd backend: the locks themselves live in an etcd cluster, so several stateless
//! lockd instances serve one set of locks and survive the loss of a machine.
//!
//! Every decision is one etcd transaction whose compares carry the rule it enforces, so two
//! lockd instances can never both grant:
//!
//! - **Grant** (invariant 1): "the lock key does not exist, and no waiter is queued before me
//!   (a try-lock: no waiter at all), and the token offset is the one I read" → put the lock key
//!   (value: the 128-bit random lease id) and its meta under a fresh etcd lease with the lock's
//!   TTL, the request record under a retention lease, and delete my waiter key. The token is
//!   the transaction's revision plus the offset (invariant 2: revisions only rise; a revision
//!   below this instance's persisted floor, which etcd data loss could cause, is undone and the
//!   offset raised, see [`highwater`]).
//! - **Expiry** is etcd's: the lock key goes with its etcd lease. etcd keeps leases across
//!   leader changes, and a new leader gives every lease a full TTL again (never an early
//!   grant).
//! - **Renew / release** (invariant 5): "the lock key's value is this lease id" → keep the
//!   etcd lease alive / revoke it (which deletes the keys). A read with quorum comes first, so without a majority
//!   neither succeeds (invariant 7).
//! - **Retries** (invariant 6): the request record `requests/{id}` is written in the grant's
//!   transaction, which also requires it not to exist; a retry on any instance finds it.
//! - **FIFO waiters**: a waiting Acquire puts `waiters/{resource}#{name}` under its lockd's
//!   session lease (so the waiters of a lockd that dies disappear with it); the key's create
//!   revision orders the queue; each waiter watches only its predecessor (no thundering herd),
//!   and only the head, while its key still exists, can be granted.
//!
//! Every etcd call has a deadline (`request_timeout`); a call that cannot complete in time (no
//! quorum, members unreachable) is answered UNAVAILABLE, never with a grant.

mod conn;
pub mod highwater;
pub mod keys;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{AcquireError, Holder, InvalidArgument, Limits, RenewError, RequestId};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::conn::Etcd;
use crate::highwater::{HighWater, MARGIN};
use crate::keys::{Keys, Meta, RequestRecord, Waiter};

/// Why a call failed. The refusals a client can act on are the core's own types, so that
/// both backends say the same thing with the same gRPC codes.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    /// A reused request id, a full queue.
    #[error(transparent)]
    Acquire(#[from] AcquireError),
    /// The lease is not current.
    #[error(transparent)]
    Renew(#[from] RenewError),
    /// etcd could not decide in time: no quorum, or no member reachable.
    #[error("{0}")]
    Unavailable(String),
    /// etcd refused a call for a reason a retry will not fix.
    #[error("etcd refused the call: {0}")]
    Etcd(String),
    #[error("lockd is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Config(String),
}

impl LockError {
    fn not_current(resource: &str, current: Option<FencingToken>) -> LockError {
        match ResourceName::new(resource) {
            Ok(resource) => LockError::Renew(RenewError::NotCurrent { resource, current }),
            Err(e) => LockError::Invalid(e.into()),
        }
    }
}

/// What the etcd backend needs to know.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// Key prefix; several lockd clusters can share one etcd with different prefixes.
    pub prefix: String,
    /// Longest the etcd work of one call may take (waiting in a queue excluded).
    pub request_timeout: Duration,
    /// TTL of this instance's session lease, under which its waiters' keys live: how long
    /// the waiters of a lockd that died stay queued.
    pub session_ttl: Duration,
    /// Where the token high-water file lives.
    pub data_dir: PathBuf,
    pub limits: Limits,
}

/// An Acquire as the service hands it over (validated names).
pub struct AcquireArgs {
    pub resource: ResourceName,
    pub request_id: Option<RequestId>,
    pub holder: Holder,
    pub ttl_ms: u64,
    pub wait_ms: u64,
}

/// A lease as the client sees it; times are wall-clock milliseconds since the Unix epoch.
#[derive(Clone, Debug)]
pub struct LeaseInfo {
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

/// Who holds a lock that was asked for.
#[derive(Clone, Debug)]
pub struct BusyInfo {
    pub holder: String,
    pub token: FencingToken,
    pub expires_at_ms: u64,
    pub ttl_ms: u64,
    pub waiters: usize,
}

#[derive(Debug)]
pub enum Acquired {
    Granted {
        lease: LeaseInfo,
        duplicate: bool,
        held: bool,
    },
    Busy(Option<BusyInfo>),
    TimedOut(Option<BusyInfo>),
}

/// What one grant attempt found.
enum Attempt {
    Granted(LeaseInfo),
    Duplicate(LeaseInfo, bool),
    /// The lock is held (or, for a try-lock, waiters are queued); the revision to watch from.
    Held {
        revision: i64,
    },
    /// Not the head of the queue (someone queued earlier).
    NotHead,
    /// This call's waiter key is gone (its lockd's session ended).
    WaiterGone,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn random_lease_id() -> LeaseId {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    LeaseId::from_bytes(bytes)
}

fn random_name() -> String {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// etcd leases count whole seconds: the lock's TTL rounded up (never shorter than asked).
fn etcd_ttl_s(ttl_ms: u64) -> i64 {
    (ttl_ms.div_ceil(1000)).max(1) as i64
}

fn kvs(r: &TxnOpResponse) -> &[KeyValue] {
    match r {
        TxnOpResponse::Get(g) => g.kvs(),
        _ => &[],
    }
}

/// The count of a count-only read in a transaction's answer.
fn count(r: &TxnOpResponse) -> usize {
    match r {
        TxnOpResponse::Get(g) => g.count().max(0) as usize,
        _ => 0,
    }
}

/// Reads that only count the keys under a prefix.
fn count_only() -> GetOptions {
    GetOptions::new().with_prefix().with_count_only()
}

fn revision(t: &TxnResponse) -> i64 {
    t.header().map_or(0, |h| h.revision())
}

fn token_of(create_revision: i64, offset: u64) -> Result<FencingToken, LockError> {
    FencingToken::new((create_revision as u64).saturating_add(offset))
        .ok_or_else(|| LockError::Etcd("the fencing token space is exhausted".to_string()))
}

/// The token offset as last read: its value and the key's mod revision (0: absent).
#[derive(Clone, Copy, Debug)]
struct Offset {
    value: u64,
    mod_revision: i64,
}

/// See the crate documentation.
pub struct EtcdLocks {
    etcd: Etcd,
    keys: Keys,
    limits: Limits,
    request_timeout: Duration,
    offset: Mutex<Offset>,
    highwater: HighWater,
    granted: Granted,
    session: watch::Receiver<Option<i64>>,
    /// The current retention lease and when it was granted.
    retention: tokio::sync::Mutex<Option<(i64, Instant)>>,
    closed: AtomicBool,
    stop: watch::Sender<bool>,
}

impl EtcdLocks {
    /// Connects, reads the token offset (raising it if etcd is behind this instance's
    /// high-water), and starts the session lease and the high-water flusher.
    pub async fn start(options: EtcdOptions) -> Result<Arc<EtcdLocks>, LockError> {
        let etcd = Etcd::connect(&options.endpoints).await?;
        let lag = options.request_timeout + highwater::FLUSH_EVERY * 2;
        let highwater = HighWater::open(&options.data_dir, lag).map_err(|e| {
            LockError::Config(format!(
                "token high-water in {}: {e}",
                options.data_dir.display()
            ))
        })?;
        let (session_tx, session) = watch::channel(None);
        let (stop, _) = watch::channel(false);
        let locks = Arc::new(EtcdLocks {
            etcd,
            keys: Keys::new(&options.prefix),
            limits: options.limits.clone(),
            request_timeout: options.request_timeout,
            offset: Mutex::new(Offset {
                value: 0,
                mod_revision: 0,
            }),
            highwater,
            granted: Granted::default(),
            session,
            retention: tokio::sync::Mutex::new(None),
            closed: AtomicBool::new(false),
            stop,
        });
        let revision = locks.load_offset().await?;
        let floor = locks.highwater.floor();
        let offset = locks.offset().value;
        if (revision as u64).saturating_add(offset) <= floor {
            locks.raise_offset(revision, floor).await?;
        }
        info!(
            endpoints = ?options.endpoints,
            prefix = %options.prefix,
            revision,
            offset = locks.offset().value,
            floor,
            "connected to etcd"
        );
        tokio::spawn(session_loop(
            Arc::clone(&locks),
            session_tx,
            options.session_ttl,
        ));
        tokio::spawn(flush_loop(Arc::clone(&locks)));
        tokio::spawn(leader_loop(Arc::clone(&locks)));
        Ok(locks)
    }

    /// Ends waits (their callers get UNAVAILABLE) and gives up the session lease, so that
    /// this instance's waiters leave the queues at once.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.stop.send(true);
        // The last tokens answered, written down before the process goes.
        if let Err(e) = self.highwater.tick() {
            error!(error = %e, "cannot write the token high-water file");
        }
    }

    fn check_open(&self) -> Result<(), LockError> {
        if self.closed.load(Ordering::Acquire) {
            Err(LockError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    fn offset(&self) -> Offset {
        *self.offset.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_offset(&self, kv: Option<&KeyValue>) -> Result<(), LockError> {
        let o = match kv {
            None => Offset {
                value: 0,
                mod_revision: 0,
            },
            Some(kv) => Offset {
                value: std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| {
                        LockError::Etcd(format!(
                            "{} does not hold a number: {:?}",
                            self.keys.offset(),
                            String::from_utf8_lossy(kv.value())
                        ))
                    })?,
                mod_revision: kv.mod_revision(),
            },
        };
        *self.offset.lock().unwrap_or_else(|p| p.into_inner()) = o;
        Ok(())
    }

    /// Reads the offset; returns etcd's current revision.
    async fn load_offset(&self) -> Result<i64, LockError> {
        let resp = self
            .get("reading the token offset", self.keys.offset(), None)
            .await?;
        self.set_offset(resp.kvs().first())?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    /// etcd's revision plus the offset is at or below `floor`: etcd has lost history. Raise
    /// the offset so that tokens continue above the floor (plus a margin for what the floor
    /// cannot know).
    async fn raise_offset(&self, revision: i64, floor: u64) -> Result<(), LockError> {
        let current = self.offset();
        let value = floor
            .saturating_add(MARGIN)
            .saturating_sub(revision.max(0) as u64);
        error!(
            revision,
            offset = current.value,
            floor,
            new_offset = value,
            "etcd's revision is behind tokens this lockd has answered (etcd lost data, or was restored from a backup); raising the token offset"
        );
        let key = self.keys.offset();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                current.mod_revision,
            )])
            .and_then([TxnOp::put(key.clone(), value.to_string(), None)]);
        self.txn("raising the token offset", txn).await?;
        // Whoever won, read what it is now.
        self.load_offset().await?;
        Ok(())
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.request_timeout
    }

    /// Runs `txn` (failing over between members) by `deadline`.
    async fn txn_by(
        &self,
        deadline: Instant,
        what: &str,
        txn: Txn,
    ) -> Result<TxnResponse, LockError> {
        self.etcd
            .call(deadline, what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    /// Runs `txn` within the request timeout.
    async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, LockError> {
        self.txn_by(self.deadline(), what, txn).await
    }

    /// Reads `key` (with `options`) within the request timeout.
    async fn get(
        &self,
        what: &str,
        key: String,
        options: Option<GetOptions>,
    ) -> Result<GetResponse, LockError> {
        self.etcd
            .call(self.deadline(), what, |mut c| {
                let (key, options) = (key.clone(), options.clone());
                async move { c.get(key, options).await }
            })
            .await
    }

    fn validate(&self, a: &AcquireArgs) -> Result<u64, LockError> {
        let l = &self.limits;
        let ttl_ms = if a.ttl_ms == 0 {
            l.ttl_default_ms
        } else {
            a.ttl_ms
        };
        if !(l.ttl_min_ms..=l.ttl_max_ms).contains(&ttl_ms) {
            return Err(InvalidArgument::Ttl {
                requested_ms: ttl_ms,
                min_ms: l.ttl_min_ms,
                max_ms: l.ttl_max_ms,
            }
            .into());
        }
        if a.wait_ms > l.wait_max_ms {
            return Err(InvalidArgument::Wait {
                requested_ms: a.wait_ms,
                max_ms: l.wait_max_ms,
            }
            .into());
        }
        Ok(ttl_ms)
    }

    pub async fn acquire(&self, a: AcquireArgs) -> Result<Acquired, LockError> {
        self.check_open()?;
        let ttl_ms = self.validate(&a)?;
        let resource = a.resource.as_str();
        match self.attempt(&a, ttl_ms, None).await? {
            Attempt::Granted(lease) => {
                return Ok(Acquired::Granted {
                    lease,
                    duplicate: false,
                    held: true,
                });
            }
            Attempt::Duplicate(lease, held) => {
                return Ok(Acquired::Granted {
                    lease,
                    duplicate: true,
                    held,
                });
            }
            _ if a.wait_ms == 0 => return Ok(Acquired::Busy(self.busy(resource).await?)),
            _ => {}
        }
        self.wait(&a, ttl_ms).await
    }

    /// One grant transaction (see the crate documentation); `waiter` is this call's queue key
    /// and its create revision, `None` for a try-lock.
    async fn attempt(
        &self,
        a: &AcquireArgs,
        ttl_ms: u64,
        waiter: Option<(&str, i64)>,
    ) -> Result<Attempt, LockError> {
        let resource = a.resource.as_str();
        let deadline = self.deadline();
        loop {
            let ttl_s = etcd_ttl_s(ttl_ms);
            // The lock's TTL runs from the lease's creation.
            let started_ms = wall_ms();
            let grant = self
                .etcd
                .call(deadline, "granting an etcd lease", |mut c| async move {
                    c.lease_grant(ttl_s, None).await
                })
                .await?;
            let (etcd_lease, granted_ttl_s) = (grant.id(), grant.ttl().max(ttl_s));
            let granted_ttl_ms = (granted_ttl_s as u64) * 1000;
            let lease_id = random_lease_id();
            // The lock key's value, the request record's, and what an earlier attempt wrote.
            let lease_text = lease_id.to_string();
            let offset = self.offset();
            let meta = Meta {
                holder: a.holder.as_str().to_string(),
                ttl_ms: granted_ttl_ms,
                offset: offset.value,
                etcd_lease,
            };
            let lock_key = self.keys.lock(resource);
            let meta_key = self.keys.meta(resource);
            let waiters = self.keys.waiters(resource);
            let mut when = vec![
                Compare::create_revision(lock_key.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(self.keys.offset(), CompareOp::Equal, offset.mod_revision),
            ];
            let mut then = vec![
                TxnOp::put(
                    lock_key.clone(),
                    lease_text.clone(),
                    Some(PutOptions::new().with_lease(etcd_lease)),
                ),
                TxnOp::put(
                    meta_key.clone(),
                    serde_json::to_string(&meta).expect("serialisable"),
                    Some(PutOptions::new().with_lease(etcd_lease)),
                ),
            ];
            let mut otherwise = vec![
                TxnOp::get(lock_key.clone(), None),
                TxnOp::get(meta_key.clone(), None),
                TxnOp::get(self.keys.offset(), None),
            ];
            match waiter {
                // A try-lock does not jump the queue.
                None => {
                    when.push(Compare::version(waiters.clone(), CompareOp::Equal, 0).with_prefix())
                }
                Some((key, rev)) => {
                    when.push(Compare::create_revision(key, CompareOp::Equal, rev));
                    // Nobody queued before me: every waiter's create revision is at least mine.
                    when.push(
                        Compare::create_revision(waiters.clone(), CompareOp::Greater, rev - 1)
                            .with_prefix(),
                    );
                    then.push(TxnOp::delete(key, None));
                    otherwise.push(TxnOp::get(key, None));
                }
            }
            if let Some(id) = &a.request_id {
                let key = self.keys.request(id.as_str());
                when.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
                let record = RequestRecord {
                    resource: resource.to_string(),
                    lease_id: lease_text.clone(),
                    ttl_ms: granted_ttl_ms,
                    offset: offset.value,
                };
                let retention = self.retention_lease(deadline).await?;
                then.push(TxnOp::put(
                    key.clone(),
                    serde_json::to_string(&record).expect("serialisable"),
                    Some(PutOptions::new().with_lease(retention)),
                ));
                otherwise.push(TxnOp::get(key, None));
            }
            let txn = Txn::new().when(when).and_then(then).or_else(otherwise);
            let resp = self.txn_by(deadline, "the grant transaction", txn).await?;
            let rev = revision(&resp);
            if resp.succeeded() {
                let token = token_of(rev, offset.value)?;
                if token.get() <= self.highwater.floor() {
                    self.undo_grant(resource, &lease_id, a.request_id.as_ref(), rev)
                        .await?;
                    self.raise_offset(rev, self.highwater.floor()).await?;
                    continue;
                }
                self.highwater.answered(token.get());
                self.granted.put(
                    resource,
                    lease_id,
                    etcd_lease,
                    Duration::from_millis(granted_ttl_ms),
                );
                debug!(%resource, %token, "granted");
                return Ok(Attempt::Granted(LeaseInfo {
                    lease_id,
                    token,
                    ttl_ms: granted_ttl_ms,
                    expires_at_ms: started_ms + granted_ttl_ms,
                }));
            }
            // Not granted: the etcd lease is not needed.
            self.revoke_later(etcd_lease);
            let ops = resp.op_responses();
            let lock = kvs(&ops[0]).first();
            // An earlier attempt of this very transaction committed (its answer was lost).
            if let Some(kv) = lock
                && kv.value() == lease_text.as_bytes()
            {
                let token = token_of(kv.create_revision(), offset.value)?;
                self.highwater.answered(token.get());
                return Ok(Attempt::Granted(LeaseInfo {
                    lease_id,
                    token,
                    ttl_ms: granted_ttl_ms,
                    expires_at_ms: started_ms + granted_ttl_ms,
                }));
            }
            if a.request_id.is_some()
                && let Some(kv) = ops.last().and_then(|r| kvs(r).first())
            {
                return self.duplicate(resource, kv, lock).await;
            }
            let offset_kv = kvs(&ops[2]).first();
            if offset_kv.map_or(0, KeyValue::mod_revision) != offset.mod_revision {
                self.set_offset(offset_kv)?;
                continue;
            }
            if let Some((_, mine)) = waiter {
                let present = kvs(&ops[3]).first().map(KeyValue::create_revision);
                if present != Some(mine) {
                    return Ok(Attempt::WaiterGone);
                }
                if lock.is_none() {
                    return Ok(Attempt::NotHead);
                }
            }
            return Ok(Attempt::Held { revision: rev });
        }
    }

    /// A grant whose token fell below the floor: take it back before anyone hears of it.
    async fn undo_grant(
        &self,
        resource: &str,
        lease_id: &LeaseId,
        request_id: Option<&RequestId>,
        rev: i64,
    ) -> Result<(), LockError> {
        let lock_key = self.keys.lock(resource);
        let mut then = vec![
            TxnOp::delete(lock_key.clone(), None),
            TxnOp::delete(self.keys.meta(resource), None),
        ];
        if let Some(id) = request_id {
            then.push(TxnOp::delete(self.keys.request(id.as_str()), None));
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(lock_key.clone(), CompareOp::Equal, rev),
                Compare::value(lock_key, CompareOp::Equal, lease_id.to_string()),
            ])
            .and_then(then);
        self.txn("taking back a grant below the floor", txn).await?;
        Ok(())
    }

    /// The answer to a retry of a granted request id.
    async fn duplicate(
        &self,
        resource: &str,
        record: &KeyValue,
        lock: Option<&KeyValue>,
    ) -> Result<Attempt, LockError> {
        let rec: RequestRecord = serde_json::from_slice(record.value())
            .map_err(|e| LockError::Etcd(format!("a request record is damaged: {e}")))?;
        let request_id = String::from_utf8_lossy(record.key())
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        if rec.resource != resource {
            let name = |r: &str| {
                ResourceName::new(r)
                    .map_err(|e| LockError::Etcd(format!("a request record names {r:?}: {e}")))
            };
            return Err(AcquireError::RequestIdReused {
                request_id,
                original: name(&rec.resource)?,
                requested: name(resource)?,
            }
            .into());
        }
        let lease_id: LeaseId = rec
            .lease_id
            .parse()
            .map_err(|_| LockError::Etcd("a request record has a damaged lease id".to_string()))?;
        let token = token_of(record.create_revision(), rec.offset)?;
        let held = lock.is_some_and(|kv| kv.value() == rec.lease_id.as_bytes());
        let expires_at_ms = if held {
            self.expires_at(resource).await?.unwrap_or(0)
        } else {
            0
        };
        Ok(Attempt::Duplicate(
            LeaseInfo {
                lease_id,
                token,
                ttl_ms: rec.ttl_ms,
                expires_at_ms,
            },
            held,
        ))
    }

    /// When the current lock of `resource` runs out (wall ms), if it is held.
    async fn expires_at(&self, resource: &str) -> Result<Option<u64>, LockError> {
        Ok(self.busy(resource).await?.map(|b| b.expires_at_ms))
    }

    /// Who holds `resource` now, with its waiters (`None`: not held).
    async fn busy(&self, resource: &str) -> Result<Option<BusyInfo>, LockError> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.keys.lock(resource), None),
            TxnOp::get(self.keys.meta(resource), None),
            TxnOp::get(self.keys.waiters(resource), Some(count_only())),
        ]);
        let resp = self.txn("reading a lock", txn).await?;
        let ops = resp.op_responses();
        let waiters = count(&ops[2]);
        let (Some(lock), Some(meta)) = (kvs(&ops[0]).first(), kvs(&ops[1]).first()) else {
            return Ok(None);
        };
        let meta: Meta = serde_json::from_slice(meta.value())
            .map_err(|e| LockError::Etcd(format!("a lock's meta is damaged: {e}")))?;
        let token = token_of(lock.create_revision(), meta.offset)?;
        let etcd_lease = meta.etcd_lease;
        let ttl = self
            .etcd
            .call(
                self.deadline(),
                "reading a lease's time to live",
                |mut c| async move { c.lease_time_to_live(etcd_lease, None).await },
            )
            .await?
            .ttl();
        Ok(Some(BusyInfo {
            holder: meta.holder,
            token,
            expires_at_ms: wall_ms() + (ttl.max(0) as u64) * 1000,
            ttl_ms: meta.ttl_ms,
            waiters,
        }))
    }

    /// The retention lease request records live under: at least `request_retention_ms`, one
    /// lease shared by the records of half a retention period.
    async fn retention_lease(&self, deadline: Instant) -> Result<i64, LockError> {
        let retention = Duration::from_millis(self.limits.request_retention_ms);
        let mut current = self.retention.lock().await;
        if let Some((id, at)) = *current
            && at.elapsed() < retention / 2
        {
            return Ok(id);
        }
        let ttl_s = etcd_ttl_s(self.limits.request_retention_ms * 3 / 2);
        let id = self
            .etcd
            .call(
                deadline,
                "granting the retention lease",
                |mut c| async move { c.lease_grant(ttl_s, None).await },
            )
            .await?
            .id();
        *current = Some((id, Instant::now()));
        Ok(id)
    }

    fn revoke_later(&self, etcd_lease: i64) {
        let client = self.etcd.any();
        tokio::spawn(async move {
            let mut c = client;
            let _ = tokio::time::timeout(conn::ATTEMPT_TIMEOUT, c.lease_revoke(etcd_lease)).await;
        });
    }

    /// The waiting part of an Acquire (see the crate documentation).
    async fn wait(&self, a: &AcquireArgs, ttl_ms: u64) -> Result<Acquired, LockError> {
        let resource = a.resource.as_str();
        let wait_deadline = Instant::now() + Duration::from_millis(a.wait_ms);
        let name = a
            .request_id
            .as_ref()
            .map_or_else(random_name, |id| id.as_str().to_string());
        let key = self.keys.waiter(resource, &name);
        let mine = self.enqueue(resource, &key, a).await?;
        let mut guard = QueueGuard {
            locks: self,
            key: key.clone(),
            revision: mine,
            armed: true,
        };
        let mut stop = self.stop.subscribe();
        loop {
            if *stop.borrow_and_update() {
                return Err(LockError::ShuttingDown);
            }
            let now = Instant::now();
            if now >= wait_deadline {
                guard.leave().await;
                return Ok(Acquired::TimedOut(self.busy(resource).await?));
            }
            // Who is before me?
            let queue = self
                .get(
                    "reading a queue",
                    self.keys.waiters(resource),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                )
                .await?;
            let revision_read = queue.header().map_or(0, |h| h.revision());
            let kvs = queue.kvs();
            if !kvs.iter().any(|kv| kv.create_revision() == mine) {
                guard.armed = false;
                return Err(LockError::Unavailable(
                    "this call's place in the queue was lost (its lockd's etcd session ended); retry".to_string(),
                ));
            }
            let until = wait_deadline.min(Instant::now() + RECHECK);
            if let Some(pred) = kvs.iter().rev().find(|kv| kv.create_revision() < mine) {
                let pred = pred.key().to_vec();
                self.watch_delete(pred, revision_read + 1, until, &mut stop)
                    .await;
                continue;
            }
            match self.attempt(a, ttl_ms, Some((&key, mine))).await? {
                Attempt::Granted(lease) => {
                    guard.armed = false;
                    return Ok(Acquired::Granted {
                        lease,
                        duplicate: false,
                        held: true,
                    });
                }
                Attempt::Duplicate(lease, held) => {
                    guard.leave().await;
                    return Ok(Acquired::Granted {
                        lease,
                        duplicate: true,
                        held,
                    });
                }
                Attempt::WaiterGone => {
                    guard.armed = false;
                    return Err(LockError::Unavailable(
                        "this call's place in the queue was lost (its lockd's etcd session ended); retry".to_string(),
                    ));
                }
                Attempt::NotHead => continue,
                Attempt::Held { revision } => {
                    let lock = self.keys.lock(resource).into_bytes();
                    self.watch_delete(lock, revision + 1, until, &mut stop)
                        .await;
                }
            }
        }
    }

    /// Puts this call's waiter key (or finds it, when a retry with the same request id takes
    /// over a place it already has); returns its create revision.
    async fn enqueue(&self, resource: &str, key: &str, a: &AcquireArgs) -> Result<i64, LockError> {
        let Some(session) = *self.session.borrow() else {
            return Err(LockError::Unavailable(
                "this lockd has no etcd session yet (etcd unreachable?); retry".to_string(),
            ));
        };
        let prefix = self.keys.waiters(resource);
        let max = self.limits.waiters_per_resource_max;
        let value = serde_json::to_string(&Waiter {
            holder: a.holder.as_str().to_string(),
        })
        .expect("serialisable");
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, value, Some(PutOptions::new().with_lease(session))),
                TxnOp::get(prefix.clone(), Some(count_only())),
            ])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn("joining a queue", txn).await?;
        let ops = resp.op_responses();
        if resp.succeeded() {
            let queued = count(&ops[1]);
            let mine = revision(&resp);
            if queued > max {
                // Over the limit (counted with this one): leave again.
                QueueGuard {
                    locks: self,
                    key: key.to_string(),
                    revision: mine,
                    armed: true,
                }
                .leave()
                .await;
                return Err(AcquireError::QueueFull {
                    resource: ResourceName::new(resource).map_err(InvalidArgument::from)?,
                    max,
                }
                .into());
            }
            Ok(mine)
        } else {
            kvs(&ops[0])
                .first()
                .map(KeyValue::create_revision)
                .ok_or_else(|| LockError::Unavailable("the queue changed; retry".to_string()))
        }
    }

    /// Waits until `key` is deleted at or after `from_revision`, `until` passes, or lockd
    /// stops. A watch that cannot be opened or breaks just returns: the caller looks again.
    async fn watch_delete(
        &self,
        key: Vec<u8>,
        from_revision: i64,
        until: Instant,
        stop: &mut watch::Receiver<bool>,
    ) {
        let work = async {
            let Ok(mut stream) = self
                .etcd
                .call(until, "opening a watch", |mut c| {
                    let key = key.clone();
                    async move {
                        c.watch(
                            key,
                            Some(WatchOptions::new().with_start_revision(from_revision)),
                        )
                        .await
                    }
                })
                .await
            else {
                return;
            };
            while let Ok(Some(resp)) = stream.message().await {
                if resp.canceled() || resp.compact_revision() > 0 {
                    return;
                }
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == etcd_client::EventType::Delete)
                {
                    return;
                }
            }
        };
        tokio::select! {
            () = work => {}
            _ = tokio::time::sleep_until(until) => {}
            _ = stop.changed() => {}
        }
    }

    pub async fn renew(
        &self,
        resource: &ResourceName,
        lease_id: LeaseId,
    ) -> Result<LeaseInfo, LockError> {
        self.check_open()?;
        let (meta, token) = self.current(resource.as_str(), &lease_id).await?;
        let etcd_lease = meta.etcd_lease;
        let renewed = self
            .etcd
            .call(
                self.deadline(),
                "renewing an etcd lease",
                |mut c| async move {
                    match c.lease_keep_alive(etcd_lease).await {
                        Ok(_) => Ok(true),
                        // The lease ran out between the check and the keep-alive.
                        Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                        Err(e) => Err(e),
                    }
                },
            )
            .await?;
        if !renewed {
            return Err(LockError::not_current(resource.as_str(), None));
        }
        Ok(LeaseInfo {
            lease_id,
            token,
            ttl_ms: meta.ttl_ms,
            expires_at_ms: wall_ms() + meta.ttl_ms,
        })
    }

    /// The lock's meta and token when `lease_id` is its current lease (a read with quorum).
    async fn current(
        &self,
        resource: &str,
        lease_id: &LeaseId,
    ) -> Result<(Meta, FencingToken), LockError> {
        let lock_key = self.keys.lock(resource);
        let txn = Txn::new()
            .when([Compare::value(
                lock_key.clone(),
                CompareOp::Equal,
                lease_id.to_string(),
            )])
            .and_then([
                TxnOp::get(lock_key.clone(), None),
                TxnOp::get(self.keys.meta(resource), None),
            ])
            .or_else([
                TxnOp::get(lock_key, None),
                TxnOp::get(self.keys.meta(resource), None),
            ]);
        let resp = self.txn("reading a lock", txn).await?;
        let ops = resp.op_responses();
        let lock = kvs(&ops[0]).first();
        let meta = kvs(&ops[1])
            .first()
            .and_then(|kv| serde_json::from_slice::<Meta>(kv.value()).ok());
        let current = match (lock, &meta) {
            (Some(lock), Some(meta)) => Some(token_of(lock.create_revision(), meta.offset)?),
            _ => None,
        };
        match (resp.succeeded(), meta, current) {
            (true, Some(meta), Some(token)) => Ok((meta, token)),
            _ => Err(LockError::not_current(resource, current)),
        }
    }

    /// `Ok(None)`: released. `Ok(Some(current))`: the lease was not current (`current` = the
    /// token of the lease that is, if any).
    ///
    /// The lease id is checked against the member's own view of the lock (no quorum needed:
    /// that view may lag, but only ever shows a grant as it was, so the etcd lease it names is
    /// that grant's), then the lock's etcd lease is revoked, which deletes its keys at once.
    /// Should the lock have run out and been granted again meanwhile, the revoke names the old
    /// etcd lease, which no longer exists: nothing else is touched.
    pub async fn release(
        &self,
        resource: &ResourceName,
        lease_id: LeaseId,
    ) -> Result<Option<Option<FencingToken>>, LockError> {
        self.check_open()?;
        let resource = resource.as_str();
        // Granted here: this instance knows the etcd lease (and the caller knows the lease id).
        if let Some(etcd_lease) = self.granted.take(resource, &lease_id)
            && self.revoke(etcd_lease).await?
        {
            return Ok(None);
        }
        // Not granted here, or it ran out meanwhile: look at the lock.
        let serializable = || Some(GetOptions::new().with_serializable());
        let txn = Txn::new().and_then([
            TxnOp::get(self.keys.lock(resource), serializable()),
            TxnOp::get(self.keys.meta(resource), serializable()),
        ]);
        let resp = self.txn("reading a lock", txn).await?;
        let ops = resp.op_responses();
        let (lock, meta_kv) = (kvs(&ops[0]).first(), kvs(&ops[1]).first());
        let meta: Option<Meta> = meta_kv.and_then(|kv| serde_json::from_slice(kv.value()).ok());
        let current = match (lock, &meta) {
            (Some(lock), Some(m)) => Some(token_of(lock.create_revision(), m.offset)?),
            _ => None,
        };
        let same_grant = lock.zip(meta_kv).is_some_and(|(l, m)| {
            l.value() == lease_id.to_string().as_bytes()
                && l.create_revision() == m.create_revision()
        });
        let (true, Some(meta)) = (same_grant, meta) else {
            return Ok(Some(current));
        };
        let revoked = self.revoke(meta.etcd_lease).await?;
        Ok(if revoked { None } else { Some(None) })
    }

    /// Revokes a lock's etcd lease; `false`: it did not exist (any more).
    async fn revoke(&self, etcd_lease: i64) -> Result<bool, LockError> {
        self.etcd
            .call(
                self.deadline(),
                "revoking a lock's etcd lease",
                |mut c| async move {
                    match c.lease_revoke(etcd_lease).await {
                        Ok(_) => Ok(true),
                        // It ran out just now (or an earlier attempt of this call revoked it).
                        Err(etcd_client::Error::GRpcStatus(s))
                            if s.code() == tonic::Code::NotFound =>
                        {
                            Ok(false)
                        }
                        Err(e) => Err(e),
                    }
                },
            )
            .await
    }

    /// The current holder (without its lease id) and the number of waiters.
    pub async fn describe(
        &self,
        resource: &ResourceName,
    ) -> Result<(Option<BusyInfo>, usize), LockError> {
        self.check_open()?;
        let resource = resource.as_str();
        match self.busy(resource).await? {
            Some(b) => {
                let waiters = b.waiters;
                Ok((Some(b), waiters))
            }
            None => {
                let count = self
                    .get(
                        "counting waiters",
                        self.keys.waiters(resource),
                        Some(count_only()),
                    )
                    .await?
                    .count();
                Ok((None, count.max(0) as usize))
            }
        }
    }
}

/// The grants this instance made and that are not known to be over: lease id → the lock's
/// etcd lease, so that a release through this instance revokes at once without a read. A
/// caller that presents a lease id found here knows the 128-bit secret, and revoking that
/// etcd lease can end only that grant. Bounded: when full, entries past their TTL go, and if
/// it is still full a grant is simply not remembered (its release reads the lock first).
#[derive(Default)]
struct Granted {
    map: Mutex<GrantedMap>,
}

type GrantedMap = std::collections::HashMap<LeaseId, (String, i64, Instant)>;

/// Grants remembered at most (about 100 bytes each).
const GRANTED_MAX: usize = 100_000;

impl Granted {
    fn map(&self) -> std::sync::MutexGuard<'_, GrantedMap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, resource: &str, lease_id: LeaseId, etcd_lease: i64, ttl: Duration) {
        let mut map = self.map();
        if map.len() >= GRANTED_MAX {
            let now = Instant::now();
            map.retain(|_, (_, _, until)| *until > now);
        }
        if map.len() < GRANTED_MAX {
            map.insert(
                lease_id,
                (resource.to_string(), etcd_lease, Instant::now() + ttl),
            );
        }
    }

    /// The etcd lease of `lease_id`'s grant of `resource`, forgotten as it is handed out.
    fn take(&self, resource: &str, lease_id: &LeaseId) -> Option<i64> {
        let mut map = self.map();
        match map.get(lease_id) {
            Some((r, etcd_lease, _)) if r == resource => {
                let etcd_lease = *etcd_lease;
                map.remove(lease_id);
                Some(etcd_lease)
            }
            _ => None,
        }
    }
}

/// How long a waiter trusts one watch before it looks at the queue again (a watch on a member
/// that was stopped may never fire).
const RECHECK: Duration = Duration::from_secs(1);

/// Takes a waiter's key out of the queue when its call ends without a grant, including when
/// the call is dropped (the client cancelled or went away).
struct QueueGuard<'a> {
    locks: &'a EtcdLocks,
    key: String,
    revision: i64,
    armed: bool,
}

impl QueueGuard<'_> {
    fn txn(&self) -> Txn {
        Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([TxnOp::delete(self.key.clone(), None)])
    }

    async fn leave(&mut self) {
        self.armed = false;
        let txn = self.txn();
        let _ = self
            .locks
            .etcd
            .call(self.locks.deadline(), "leaving a queue", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await;
    }
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let txn = self.txn();
            let client = self.locks.etcd.any();
            tokio::spawn(async move {
                let mut c = client;
                let _ = tokio::time::timeout(conn::ATTEMPT_TIMEOUT * 2, c.txn(txn)).await;
            });
        }
    }
}

/// Keeps this instance's session lease alive (its waiters' keys live under it); grants a new
/// one when it is lost. On shutdown, revokes it.
async fn session_loop(locks: Arc<EtcdLocks>, tx: watch::Sender<Option<i64>>, ttl: Duration) {
    let ttl_s = etcd_ttl_s(ttl.as_millis() as u64);
    let every = Duration::from_millis((ttl_s as u64) * 1000 / 3);
    let mut stop = locks.stop.subscribe();
    let mut current: Option<i64> = None;
    loop {
        if *stop.borrow_and_update() {
            break;
        }
        let deadline = Instant::now() + every.max(Duration::from_millis(500));
        // Set when etcd did not answer in time (not when it refused for good: an error that
        // will not go away is not worth a warning five times a second).
        let mut retry_soon = false;
        match current {
            None => match locks
                .etcd
                .call(deadline, "granting the session lease", |mut c| async move {
                    c.lease_grant(ttl_s, None).await
                })
                .await
            {
                Ok(g) => {
                    current = Some(g.id());
                    let _ = tx.send(Some(g.id()));
                    info!(lease = g.id(), ttl_s, "etcd session started");
                }
                Err(e) => {
                    retry_soon = matches!(e, LockError::Unavailable(_));
                    warn!(error = %e, "cannot start an etcd session; retrying");
                }
            },
            Some(id) => {
                let kept = locks
                    .etcd
                    .call(deadline, "keeping the session alive", |mut c| async move {
                        match c.lease_keep_alive(id).await {
                            Ok(_) => Ok(true),
                            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                            Err(e) => Err(e),
                        }
                    })
                    .await;
                match kept {
                    Ok(true) => {}
                    Ok(false) => {
                        warn!(
                            lease = id,
                            "the etcd session ran out; its waiters have left their queues"
                        );
                        current = None;
                        let _ = tx.send(None);
                        continue;
                    }
                    Err(e) => {
                        retry_soon = matches!(e, LockError::Unavailable(_));
                        warn!(error = %e, "cannot renew the etcd session");
                    }
                }
            }
        }
        // After no answer in time, try again soon rather than a third of the TTL later: the
        // call has already moved on from the member that failed, and the lease is running out.
        let pause = if retry_soon {
            every.min(SESSION_RETRY_AFTER)
        } else {
            every
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
    if let Some(id) = current {
        let mut c = locks.etcd.any();
        let _ = tokio::time::timeout(conn::ATTEMPT_TIMEOUT, c.lease_revoke(id)).await;
        let _ = tx.send(None);
    }
}

/// The pause before the session lease is granted or renewed again after etcd did not answer
/// in time.
const SESSION_RETRY_AFTER: Duration = Duration::from_millis(200);

/// Looks for the etcd leader every few seconds and sends calls there first.
async fn leader_loop(locks: Arc<EtcdLocks>) {
    let mut stop = locks.stop.subscribe();
    loop {
        locks.etcd.prefer_leader(conn::ATTEMPT_TIMEOUT).await;
        tokio::select! {
            _ = tokio::time::sleep(LEADER_CHECK_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}

/// How often the leader is looked for (a call that fails moves on to another member at once;
/// this only brings calls back to the leader after a change).
const LEADER_CHECK_EVERY: Duration = Duration::from_secs(2);

/// Writes the high-water down every 100 ms (and a last time on shutdown).
async fn flush_loop(locks: Arc<EtcdLocks>) {
    let mut stop = locks.stop.subscribe();
    loop {
        if let Err(e) = locks.highwater.tick() {
            // Not fatal for safety while etcd keeps its history; say so loudly.
            error!(error = %e, "cannot write the token high-water file");
        }
        if *stop.borrow_and_update() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(highwater::FLUSH_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
}
