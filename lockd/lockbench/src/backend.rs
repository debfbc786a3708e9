//! The systems under test, each driven the way a user of it would take a lock.
//!
//! - **lockd**: `Acquire` (try-lock, durable before the reply), `Renew`, `Release`.
//! - **etcd** (the standard recipe): grant a lease, then a transaction "if the key does not
//!   exist, put it under the lease"; the fencing token is the revision of that put (the key's
//!   create revision). Release revokes the lease, which deletes the key. Every step is a raft
//!   write, synced by etcd before it answers.
//! - **Redis**: `SET key random NX PX ttl`; release and renew are compare-and-delete /
//!   compare-and-pexpire scripts. Redis offers no fencing token. Durable only with
//!   `appendfsync always` (the benchmark script configures it).
//!
//! - **ZooKeeper** (the recipe of Curator's `InterProcessMutex`): an ephemeral sequential node
//!   under the resource's node, then its children listed: the lowest node holds the lock
//!   (try-lock: a node that is not the lowest is deleted at once). Release deletes the node;
//!   the session keeps it alive, so a renewal only reads it. Every write is logged by a
//!   majority of the ensemble before ZooKeeper answers. ZooKeeper offers no fencing token.
//!
//! A set of locks, all or none (`closed --set N`): lockd's AcquireAll and ReleaseMany; etcd's
//! one transaction of N puts under one lease, released by revoking it; a Redis script that sets
//! every key or none.
//!
//! A read-write lock (`closed --rw`): lockd's Acquire with `mode`; on Redis, the recipe of
//! Redisson's `RReadWriteLock` in its simplest form (a hash with the lock's mode and a count
//! per holder, one expiry for the hash), a refused caller asking again after 1 ms.

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, bail};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lockd_proto::v1::acquire_response::Outcome;
use std::sync::Arc;

use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, ReleaseRequest, RenewRequest};
use tonic::transport::{Channel, Endpoint};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    Lockd,
    /// lockd through the Rust SDK (`lockd_client`): a guard per grant, renewing until released
    /// (closed loop of plain locks only), next to the other SDKs (bench/sdk.sh).
    LockdSdk,
    Etcd,
    Redis,
    /// Redis, `SET NX PX` and a fencing token from a counter (`INCR`) in one script: the raw
    /// recipe a user of Redis would write for a fenced lock.
    RedisFenced,
    /// A ZooKeeper ensemble (`host:port,...`), Curator's lock recipe.
    Zookeeper,
}

/// A held lock, as each system names it.
#[derive(Clone, Debug)]
pub enum Held {
    Lockd {
        resource: String,
        lease_id: String,
    },
    Etcd {
        lease: i64,
    },
    Redis {
        key: String,
        value: String,
    },
    /// A permit of the Redis semaphore `key` (a sorted set), held as `member`.
    RedisPermit {
        key: String,
        member: String,
    },
    /// A side of the Redis read-write lock `key` (a hash), held as `holder`.
    RedisRw {
        key: String,
        holder: String,
    },
    /// A ZooKeeper lock: the holder's node.
    Zk {
        node: String,
    },
    /// The Rust SDK's guard, until released.
    Sdk(Arc<std::sync::Mutex<Option<lockd_client::LockGuard>>>),
}

/// How lockbench proves itself to lockd: the CA of its certificate (TLS), a client
/// certificate and key (mutual TLS), a bearer token (a policy).
pub struct Auth<'a> {
    pub ca: Option<&'a std::path::Path>,
    pub identity: Option<(&'a std::path::Path, &'a std::path::Path)>,
    pub token_file: Option<&'a std::path::Path>,
}

/// Connections to one system (several, used round-robin, so that one connection's processing
/// is not the bottleneck).
pub enum Backend {
    Lockd(Vec<LockServiceClient<Channel>>),
    Sdk(Vec<lockd_client::Client>),
    Etcd(Vec<etcd_client::Client>),
    /// Redis connections; `true`: each grant also takes a token from a counter (the fenced
    /// recipe).
    Redis(Vec<redis::aio::MultiplexedConnection>, bool),
    Zk(Vec<zookeeper_client::Client>),
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// lockd with a policy: `authorization: Bearer TOKEN` on every call (`--token-file`).
static BEARER: std::sync::OnceLock<tonic::metadata::AsciiMetadataValue> =
    std::sync::OnceLock::new();

/// Presents `token` on every lockd call from now on.
fn use_token(token: &str) -> anyhow::Result<()> {
    let value = format!("Bearer {}", token.trim())
        .parse()
        .context("the token is not a valid metadata value")?;
    let _ = BEARER.set(value);
    Ok(())
}

/// `message` as a lockd request, with the bearer token if there is one.
fn authed<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(b) = BEARER.get() {
        r.metadata_mut().insert("authorization", b.clone());
    }
    r
}

/// All or none: every key set (NX, with the TTL) when none exists.
const REDIS_SET_ALL: &str = "for i = 1, #KEYS do if redis.call('exists', KEYS[i]) == 1 then return 0 end end for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2]) end return 1";
/// `SET NX PX`, and a fencing token from a counter if it was set (0 if it was not).
const REDIS_FENCED: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('incr', KEYS[2]) end return 0";
const REDIS_RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
/// The Redis semaphore with leases (the recipe of Redisson's `RPermitExpirableSemaphore`, in
/// its simplest form): a sorted set of the permits held, each scored by its expiry on Redis's
/// clock. Drop the expired; take a permit if fewer than N are held.
const REDIS_PERMIT: &str = "local t = redis.call('time') local now = t[1] * 1000 + math.floor(t[2] / 1000) redis.call('zremrangebyscore', KEYS[1], '-inf', now) if redis.call('zcard', KEYS[1]) < tonumber(ARGV[1]) then redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[3]) return 1 end return 0";
/// Redisson's read lock, simply: free, or already read, takes one more read hold of `holder`
/// and extends the hash's expiry (Redisson keeps a timeout key per reader; one expiry for the
/// hash is less work for Redis). A writer holding it refuses. No writer preference: readers
/// join while the lock is read, whoever waits to write (as in Redisson).
const REDIS_READ: &str = "local mode = redis.call('hget', KEYS[1], 'mode') if mode == false or mode == 'read' then redis.call('hset', KEYS[1], 'mode', 'read') redis.call('hincrby', KEYS[1], ARGV[2], 1) if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then redis.call('pexpire', KEYS[1], ARGV[1]) end return 1 end return 0";
/// Redisson's write lock: only a free lock is taken.
const REDIS_WRITE: &str = "if redis.call('exists', KEYS[1]) == 0 then redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1) redis.call('pexpire', KEYS[1], ARGV[1]) return 1 end return 0";
/// Ends one hold of `holder`; the last hold of the lock deletes it.
const REDIS_RW_RELEASE: &str = "if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end if redis.call('hincrby', KEYS[1], ARGV[1], -1) <= 0 then redis.call('hdel', KEYS[1], ARGV[1]) end if redis.call('hlen', KEYS[1]) <= 1 then redis.call('del', KEYS[1]) end return 1";
const REDIS_RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

impl Backend {
    pub async fn connect(
        target: Target,
        endpoint: &str,
        connections: usize,
        auth: &Auth<'_>,
    ) -> anyhow::Result<Backend> {
        let n = connections.max(1);
        if let Some(path) = auth.token_file {
            let token = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading --token-file {}: {e}", path.display()))?;
            use_token(&token)?;
        }
        Ok(match target {
            Target::Lockd => {
                // Several lockd instances (comma-separated): the connections are spread over
                // them, as clients of a lockd cluster would be.
                let instances: Vec<&str> = endpoint.split(',').collect();
                let mut v = Vec::new();
                for i in 0..n.max(instances.len()) {
                    let mut ep = Endpoint::from_shared(instances[i % instances.len()].to_string())?;
                    if let Some(ca) = auth.ca {
                        let read = |p: &std::path::Path| {
                            std::fs::read(p)
                                .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))
                        };
                        let mut tls = tonic::transport::ClientTlsConfig::new()
                            .ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
                        if let Some((cert, key)) = auth.identity {
                            tls = tls.identity(tonic::transport::Identity::from_pem(
                                read(cert)?,
                                read(key)?,
                            ));
                        }
                        ep = ep.tls_config(tls)?;
                    }
                    let ch = ep.tcp_nodelay(true).connect().await?;
                    v.push(LockServiceClient::new(ch));
                }
                Backend::Lockd(v)
            }
            Target::LockdSdk => {
                if auth.ca.is_some() || auth.token_file.is_some() {
                    bail!("--target lockd-sdk is for a plaintext lockd without a policy");
                }
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(lockd_client::Client::connect(endpoint)?);
                }
                Backend::Sdk(v)
            }
            Target::Etcd => {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(
                        // Every member, comma-separated, as a user of a cluster would give.
                        etcd_client::Client::connect(endpoint.split(',').collect::<Vec<_>>(), None)
                            .await
                            .context("connecting to etcd")?,
                    );
                }
                Backend::Etcd(v)
            }
            Target::Redis | Target::RedisFenced => {
                let client = redis::Client::open(endpoint).context("redis endpoint")?;
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(
                        client
                            .get_multiplexed_async_connection()
                            .await
                            .context("connecting to redis")?,
                    );
                }
                Backend::Redis(v, target == Target::RedisFenced)
            }
            Target::Zookeeper => {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(
                        zookeeper_client::Client::connect(endpoint)
                            .await
                            .context("connecting to ZooKeeper")?,
                    );
                }
                Backend::Zk(v)
            }
        })
    }

    fn pick<T: Clone>(v: &[T]) -> T {
        v[NEXT.fetch_add(1, Ordering::Relaxed) % v.len()].clone()
    }

    /// Try-lock. `Ok(None)`: held by someone else.
    pub async fn acquire(&self, resource: &str, ttl_ms: u64) -> anyhow::Result<Option<Held>> {
        match self {
            Backend::Lockd(v) => lockd_take(Self::pick(v), resource, ttl_ms, 0, (0, 0)).await,
            Backend::Sdk(v) => {
                let opts = lockd_client::AcquireOptions {
                    ttl: Some(std::time::Duration::from_millis(ttl_ms)),
                    ..lockd_client::AcquireOptions::default()
                };
                Ok(match Self::pick(v).acquire(resource, opts).await? {
                    lockd_client::Acquired::Granted(g) => {
                        Some(Held::Sdk(Arc::new(std::sync::Mutex::new(Some(g)))))
                    }
                    lockd_client::Acquired::NotGranted(_) => None,
                })
            }
            Backend::Etcd(v) => {
                let lease =
                    etcd_take(Self::pick(v), &[format!("/locks/{resource}")], ttl_ms).await?;
                Ok(lease.map(|lease| Held::Etcd { lease }))
            }
            Backend::Redis(v, true) => {
                let mut c = Self::pick(v);
                let value = format!("{:032x}", rand::random::<u128>());
                let token: i64 = redis::Script::new(REDIS_FENCED)
                    .key(resource)
                    .key("lockbench:token")
                    .arg(&value)
                    .arg(ttl_ms)
                    .invoke_async(&mut c)
                    .await?;
                Ok((token > 0).then(|| Held::Redis {
                    key: resource.to_string(),
                    value,
                }))
            }
            Backend::Redis(v, false) => {
                let mut c = Self::pick(v);
                let value = format!("{:032x}", rand::random::<u128>());
                let set: Option<String> = redis::cmd("SET")
                    .arg(resource)
                    .arg(&value)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async(&mut c)
                    .await?;
                Ok(set.map(|_| Held::Redis {
                    key: resource.to_string(),
                    value,
                }))
            }
            Backend::Zk(v) => zk_take(&Self::pick(v), resource).await,
        }
    }

    /// Try-lock of every resource of a set, all or none, each system's way. `Ok(None)`: one was
    /// held by someone else, and nothing is held.
    /// - lockd: one `AcquireAll`.
    /// - etcd: one lease and one transaction "if no key exists, put them all under the lease".
    /// - Redis: one script that sets every key if none exists (`SET NX PX` alone is per key).
    pub async fn acquire_set(
        &self,
        resources: &[String],
        ttl_ms: u64,
    ) -> anyhow::Result<Option<Vec<Held>>> {
        match self {
            Backend::Sdk(_) => bail!("--target lockd-sdk measures plain locks only (closed loop)"),
            Backend::Zk(_) => {
                bail!("only the lock recipe is here for ZooKeeper: use --target lockd or redis")
            }
            Backend::Lockd(v) => {
                let req = lockd_proto::v1::AcquireAllRequest {
                    resources: resources.to_vec(),
                    request_id: lockd_client::new_request_id(),
                    ttl_ms,
                    holder: "lockbench".to_string(),
                };
                let resp = Self::pick(v).acquire_all(authed(req)).await?.into_inner();
                match resp.outcome {
                    Some(lockd_proto::v1::acquire_all_response::Outcome::Granted(set)) => Ok(Some(
                        resources
                            .iter()
                            .zip(set.leases)
                            .map(|(r, l)| Held::Lockd {
                                resource: r.clone(),
                                lease_id: l.lease_id,
                            })
                            .collect(),
                    )),
                    Some(lockd_proto::v1::acquire_all_response::Outcome::NotGranted(_)) => Ok(None),
                    None => bail!("empty AcquireAllResponse"),
                }
            }
            Backend::Etcd(v) => {
                let keys: Vec<String> = resources.iter().map(|r| format!("/locks/{r}")).collect();
                // One lease holds every key: revoking it releases the set.
                let lease = etcd_take(Self::pick(v), &keys, ttl_ms).await?;
                Ok(lease.map(|lease| vec![Held::Etcd { lease }]))
            }
            Backend::Redis(v, _) => {
                let mut c = Self::pick(v);
                let value = format!("{:032x}", rand::random::<u128>());
                let all = redis::Script::new(REDIS_SET_ALL);
                let mut script = all.prepare_invoke();
                for r in resources {
                    script.key(r);
                }
                let set: i64 = script.arg(&value).arg(ttl_ms).invoke_async(&mut c).await?;
                Ok((set == 1).then(|| {
                    resources
                        .iter()
                        .map(|r| Held::Redis {
                            key: r.clone(),
                            value: value.clone(),
                        })
                        .collect()
                }))
            }
        }
    }

    /// Releases a set taken with [`Backend::acquire_set`]: lockd's ReleaseMany, etcd's one
    /// lease revoked, Redis's compare-and-delete of each key.
    pub async fn release_set(&self, held: Vec<Held>) -> anyhow::Result<()> {
        if let Backend::Lockd(v) = self {
            let leases = held
                .into_iter()
                .map(|h| match h {
                    Held::Lockd { resource, lease_id } => {
                        Ok(lockd_proto::v1::LeaseRef { resource, lease_id })
                    }
                    _ => bail!("a held lock of another system"),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let req = lockd_proto::v1::ReleaseManyRequest { leases };
            Self::pick(v).release_many(authed(req)).await?;
            return Ok(());
        }
        for h in held {
            self.release(h).await?;
        }
        Ok(())
    }

    /// One of the `permits` permits of `semaphore`, waiting for one up to `wait`. `Ok(None)`:
    /// none in time.
    /// - lockd: an Acquire with `permits`, waiting in the semaphore's FIFO queue; a freed
    ///   permit is handed to the head of the queue.
    /// - Redis: [`REDIS_PERMIT`], asked again 1 ms after each refusal (Redisson wakes its
    ///   waiters by pub/sub instead; the poll costs Redis more, a waiter up to 1 ms).
    /// - etcd has no semaphore recipe: not supported.
    pub async fn acquire_permit(
        &self,
        semaphore: &str,
        permits: u32,
        ttl_ms: u64,
        wait: std::time::Duration,
    ) -> anyhow::Result<Option<Held>> {
        match self {
            Backend::Sdk(_) => bail!("--target lockd-sdk measures plain locks only (closed loop)"),
            Backend::Lockd(v) => {
                let wait_ms = wait.as_millis() as u64;
                lockd_take(Self::pick(v), semaphore, ttl_ms, wait_ms, (permits, 0)).await
            }
            Backend::Etcd(_) => bail!("etcd has no semaphore recipe: use --target lockd or redis"),
            Backend::Zk(_) => {
                bail!("only the lock recipe is here for ZooKeeper: use --target lockd or redis")
            }
            Backend::Redis(v, _) => {
                let member = format!("{:032x}", rand::random::<u128>());
                let script = redis::Script::new(REDIS_PERMIT);
                let mut take = script.prepare_invoke();
                take.key(semaphore).arg(permits).arg(ttl_ms).arg(&member);
                let got = redis_poll(Self::pick(v), &take, wait).await?;
                Ok(got.then(|| Held::RedisPermit {
                    key: semaphore.to_string(),
                    member,
                }))
            }
        }
    }

    /// A side of the read-write lock `lock` (`reads`: a reader's), waiting up to `wait`.
    /// `Ok(None)`: not in time.
    /// - lockd: an Acquire with `mode`, waiting in the lock's FIFO queue (a writer that waits
    ///   is not overtaken by later readers; readers behind it are handed the lock together).
    /// - Redis: [`REDIS_READ`] or [`REDIS_WRITE`], asked again 1 ms after each refusal.
    /// - etcd: not supported (its read-write recipe is a Go library's).
    pub async fn acquire_rw(
        &self,
        lock: &str,
        reads: bool,
        ttl_ms: u64,
        wait: std::time::Duration,
    ) -> anyhow::Result<Option<Held>> {
        match self {
            Backend::Sdk(_) => bail!("--target lockd-sdk measures plain locks only (closed loop)"),
            Backend::Lockd(v) => {
                use lockd_proto::v1::acquire_request::Mode;
                let mode = if reads { Mode::Read } else { Mode::Write };
                let wait_ms = wait.as_millis() as u64;
                lockd_take(Self::pick(v), lock, ttl_ms, wait_ms, (0, mode as i32)).await
            }
            Backend::Etcd(_) => {
                bail!("etcd has no read-write lock recipe outside Go: use --target lockd or redis")
            }
            Backend::Zk(_) => {
                bail!("only the lock recipe is here for ZooKeeper: use --target lockd or redis")
            }
            Backend::Redis(v, _) => {
                let holder = format!("{:032x}", rand::random::<u128>());
                let script = redis::Script::new(if reads { REDIS_READ } else { REDIS_WRITE });
                let mut take = script.prepare_invoke();
                take.key(lock).arg(ttl_ms).arg(&holder);
                let got = redis_poll(Self::pick(v), &take, wait).await?;
                Ok(got.then(|| Held::RedisRw {
                    key: lock.to_string(),
                    holder,
                }))
            }
        }
    }

    pub async fn renew(&self, held: &Held, ttl_ms: u64) -> anyhow::Result<()> {
        match (self, held) {
            (Backend::Lockd(v), Held::Lockd { resource, lease_id }) => {
                let req = RenewRequest {
                    resource: resource.clone(),
                    lease_id: lease_id.clone(),
                };
                Self::pick(v).renew(authed(req)).await?;
                Ok(())
            }
            (Backend::Etcd(v), Held::Etcd { lease }) => {
                let (mut keeper, mut stream) = Self::pick(v).lease_keep_alive(*lease).await?;
                keeper.keep_alive().await?;
                stream.message().await?;
                Ok(())
            }
            (Backend::Redis(v, _), Held::Redis { key, value }) => {
                let mut c = Self::pick(v);
                let renewed: i64 = redis::Script::new(REDIS_RENEW)
                    .key(key)
                    .arg(value)
                    .arg(ttl_ms)
                    .invoke_async(&mut c)
                    .await?;
                if renewed == 0 {
                    bail!("redis lock {key} was lost");
                }
                Ok(())
            }
            (Backend::Zk(v), Held::Zk { node }) => {
                if Self::pick(v).check_stat(node).await?.is_none() {
                    bail!("ZooKeeper lock {node} was lost");
                }
                Ok(())
            }
            _ => bail!("a held lock of another system"),
        }
    }

    pub async fn release(&self, held: Held) -> anyhow::Result<()> {
        match (self, held) {
            (Backend::Lockd(v), Held::Lockd { resource, lease_id }) => {
                Self::pick(v)
                    .release(authed(ReleaseRequest { resource, lease_id }))
                    .await?;
            }
            (Backend::Sdk(_), Held::Sdk(guard)) => {
                let guard = guard.lock().expect("not poisoned").take();
                if let Some(g) = guard {
                    g.release().await?;
                }
            }
            (Backend::Etcd(v), Held::Etcd { lease }) => {
                Self::pick(v).lease_revoke(lease).await?;
            }
            (Backend::Redis(v, _), Held::RedisRw { key, holder }) => {
                let mut c = Self::pick(v);
                let _: i64 = redis::Script::new(REDIS_RW_RELEASE)
                    .key(key)
                    .arg(holder)
                    .invoke_async(&mut c)
                    .await?;
            }
            (Backend::Redis(v, _), Held::RedisPermit { key, member }) => {
                let mut c = Self::pick(v);
                let _: i64 = redis::cmd("ZREM")
                    .arg(key)
                    .arg(member)
                    .query_async(&mut c)
                    .await?;
            }
            (Backend::Redis(v, _), Held::Redis { key, value }) => {
                let mut c = Self::pick(v);
                let _: i64 = redis::Script::new(REDIS_RELEASE)
                    .key(key)
                    .arg(value)
                    .invoke_async(&mut c)
                    .await?;
            }
            (Backend::Zk(v), Held::Zk { node }) => {
                Self::pick(v).delete(&node, None).await?;
            }
            _ => bail!("a held lock of another system"),
        }
        Ok(())
    }
}

/// Curator's lock recipe, as a try-lock: an ephemeral sequential node under `/locks/{resource}`
/// (created once, a container: ZooKeeper deletes it when it is left empty), held if it is the
/// lowest of the children.
async fn zk_take(c: &zookeeper_client::Client, resource: &str) -> anyhow::Result<Option<Held>> {
    use zookeeper_client as zk;
    let parent = format!("/locks/{resource}");
    let node_options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/lock-");
    let created = match c.create(&prefix, b"", &node_options).await {
        Err(zk::Error::NoNode) => {
            let parents = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
            for p in ["/locks", parent.as_str()] {
                match c.create(p, b"", &parents).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            c.create(&prefix, b"", &node_options).await?
        }
        other => other?,
    };
    let mine = format!("lock-{}", created.1);
    let children = c.list_children(&parent).await?;
    let lowest = children.iter().filter(|n| n.starts_with("lock-")).min();
    let node = format!("{parent}/{mine}");
    if lowest == Some(&mine) {
        Ok(Some(Held::Zk { node }))
    } else {
        c.delete(&node, None).await?;
        Ok(None)
    }
}

/// One lockd Acquire (`permits` for a semaphore's permit, `mode` for a side of a read-write
/// lock): the lease, on the name lockd grants (a permit's or a reader's own name; the name
/// asked for when the lease names none, as a lockd from before semaphores answers, which
/// bench/kinds.sh runs), or `None` when it was not granted.
async fn lockd_take(
    mut c: LockServiceClient<Channel>,
    resource: &str,
    ttl_ms: u64,
    wait_timeout_ms: u64,
    (permits, mode): (u32, i32),
) -> anyhow::Result<Option<Held>> {
    let req = AcquireRequest {
        resource: resource.to_string(),
        request_id: lockd_client::new_request_id(),
        ttl_ms,
        wait_timeout_ms,
        holder: "lockbench".to_string(),
        permits,
        mode,
        ..AcquireRequest::default()
    };
    match c.acquire(authed(req)).await?.into_inner().outcome {
        Some(Outcome::Granted(l)) => Ok(Some(Held::Lockd {
            resource: match l.resource.is_empty() {
                true => resource.to_string(),
                false => l.resource,
            },
            lease_id: l.lease_id,
        })),
        Some(Outcome::NotGranted(_)) => Ok(None),
        None => bail!("empty AcquireResponse"),
    }
}

/// Runs a Redis try-script until it answers 1 (`true`) or `wait` has passed (`false`),
/// asking again 1 ms after each refusal: a client polling, as one without Redisson's pub/sub
/// wake-ups does.
async fn redis_poll(
    mut c: redis::aio::MultiplexedConnection,
    take: &redis::ScriptInvocation<'_>,
    wait: std::time::Duration,
) -> anyhow::Result<bool> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let got: i64 = take.invoke_async(&mut c).await?;
        if got == 1 {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// etcd's recipe: grant a lease, then one transaction "if none of `keys` exists, put them all
/// under the lease" (else read the first, to learn its holder). The lease, if they were put;
/// otherwise it is revoked. The fencing token is the revision of that put (the keys' create
/// revision).
async fn etcd_take(
    mut c: etcd_client::Client,
    keys: &[String],
    ttl_ms: u64,
) -> anyhow::Result<Option<i64>> {
    let lease = c
        .lease_grant((ttl_ms / 1000).max(1) as i64, None)
        .await?
        .id();
    let absent: Vec<Compare> = keys
        .iter()
        .map(|k| Compare::create_revision(k.clone(), CompareOp::Equal, 0))
        .collect();
    let put: Vec<TxnOp> = keys
        .iter()
        .map(|k| {
            TxnOp::put(
                k.clone(),
                "lockbench",
                Some(PutOptions::new().with_lease(lease)),
            )
        })
        .collect();
    let txn = Txn::new()
        .when(absent)
        .and_then(put)
        .or_else([TxnOp::get(keys[0].clone(), None)]);
    let resp = c.txn(txn).await?;
    if resp.succeeded() {
        let _token = resp.header().map(|h| h.revision());
        Ok(Some(lease))
    } else {
        c.lease_revoke(lease).await?;
        Ok(None)
    }
}
