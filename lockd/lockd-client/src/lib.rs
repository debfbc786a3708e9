//! The client SDK of lockd.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lockd_client::ClientError> {
//! use lockd_client::{Acquired, AcquireOptions, Client};
//! use std::time::Duration;
//!
//! let client = Client::connect("http://127.0.0.1:7420")?; // inside a Tokio runtime
//! let opts = AcquireOptions { wait: Duration::from_secs(10), ..AcquireOptions::default() };
//! match client.acquire("inventory:sku-1001", opts).await? {
//!     Acquired::Granted(guard) => {
//!         // Attach guard.token() to every write the lock protects, and stop when it is lost:
//!         tokio::select! {
//!             _ = do_the_work(guard.token()) => {}
//!             reason = guard.lost() => eprintln!("lock lost ({reason}); stopping"),
//!         }
//!         guard.release().await?;
//!     }
//!     Acquired::NotGranted(why) => eprintln!("not granted: {why}"),
//! }
//! # Ok(()) }
//! # async fn do_the_work(_token: u64) {}
//! ```
//!
//! What the SDK does for the caller:
//! - **Retries that are safe.** An Acquire carries a request id; transport failures are retried
//!   with the *same* id, so a grant whose reply was lost is returned, never doubled. Contention
//!   and full queues are retried with backoff (50 ms doubling to 1 s, jittered) until the wait
//!   runs out. A request id of the caller's own is granted once: see
//!   [`AcquireOptions::request_id`].
//! - **Renewal.** The [`LockGuard`] renews every TTL/3 (jittered by ±10 %).
//! - **A lost signal.** [`LockGuard::lost`] resolves when lockd says the lease is no longer
//!   current, or when the lease's *local deadline* passes without a successful renewal. The
//!   local deadline is the send time of the request that last extended the lease, plus the TTL,
//!   minus a safety margin ([`safety_margin`]): measured on this machine's monotonic clock from
//!   a moment before lockd started its own TTL, it ends before lockd's does, as long as the two
//!   clocks' rates differ by less than the margin. When it fires, stop working under the lock:
//!   a new holder may be granted soon after.
//! - **Release** explicitly with [`LockGuard::release`]; dropping a guard releases it in the
//!   background, best effort.

mod backoff;
mod endpoints;
mod guard;
mod retried;
mod sets;

use std::fmt;
use std::time::{Duration, Instant};

use fencing::ResourceName;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

pub use backoff::{BACKOFF_MAX, BACKOFF_MIN, Backoff};
pub use guard::{LockGuard, LostReason, safety_margin};
use retried::Retried;
pub use sets::AcquiredAll;

/// Default endpoint of lockd.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7420";

/// How long the SDK keeps retrying transport failures (lockd down, restarting, unreachable)
/// past the caller's wait before it gives up.
pub const TRANSPORT_RETRY_FOR: Duration = Duration::from_secs(10);

/// Extra time allowed for a call beyond the wait it asks lockd for (network, fsync, queueing).
pub(crate) const CALL_GRACE: Duration = Duration::from_secs(5);

/// Longest wait asked for in one call: lockd's default `limits.wait_max_ms`. A longer wait is
/// made of several calls (between them the caller re-queues behind whoever queued meanwhile).
pub const CALL_WAIT_MAX: Duration = Duration::from_secs(300);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request is invalid as written (checked locally, or refused by lockd).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The endpoint is not a usable URL.
    #[error("bad endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// The lease is not the current lease of the resource (expired, released, or never was).
    #[error("{0}")]
    LeaseNotCurrent(String),
    /// lockd answered with an error.
    #[error("lockd refused the call ({code:?}{}): {message}", .error_code.as_deref().map(|c| format!(", {c}")).unwrap_or_default())]
    Rejected {
        code: Code,
        error_code: Option<String>,
        message: String,
    },
    /// lockd could not be reached (or did not answer) within the retry budget.
    #[error("lockd is unreachable: {0}")]
    Unavailable(String),
    /// The TLS connection to lockd failed (a certificate the other side refused, no client
    /// certificate where lockd wants one, bad TLS files): not retried, nothing will change.
    #[error("TLS with lockd failed: {0}")]
    Tls(String),
}

/// The causes of an error, each after a colon (tonic's statuses for transport failures say
/// only "transport error" themselves).
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// A TLS failure somewhere in the causes of `s`: what it was.
fn tls_failure(s: &Status) -> Option<String> {
    let mut cause = std::error::Error::source(s);
    while let Some(c) = cause {
        // By its text: tokio-rustls hands some rustls errors on as text only (and a typed
        // one says the same in its Display).
        let text = c.to_string();
        if text.contains("CertificateRequired") {
            return Some("lockd requires a client certificate (--cert and --key)".to_string());
        }
        if let Some(rest) = text.split("received fatal alert: ").nth(1) {
            return Some(format!(
                "lockd refused the connection: TLS alert {rest} (a client certificate it does not trust?)"
            ));
        }
        if text.contains("invalid peer certificate") {
            return Some(format!("lockd's certificate was refused: {text}"));
        }
        let typed = c.downcast_ref::<tlsconf::rustls::Error>().is_some()
            || c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|i| i.is::<tlsconf::rustls::Error>());
        if typed {
            return Some(text);
        }
        cause = c.source();
    }
    None
}

impl ClientError {
    fn from_status(s: Status) -> ClientError {
        let error_code = s
            .metadata()
            .get(lockd_proto::ERROR_CODE_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(why) = tls_failure(&s) {
            return ClientError::Tls(why);
        }
        match s.code() {
            Code::InvalidArgument => ClientError::InvalidArgument(s.message().to_string()),
            // lockd's other preconditions (a name held as another kind of lock, another
            // number of permits) have codes of their own.
            Code::FailedPrecondition
                if error_code
                    .as_deref()
                    .is_none_or(|c| c == lockd_proto::LEASE_NOT_CURRENT) =>
            {
                ClientError::LeaseNotCurrent(s.message().to_string())
            }
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                ClientError::Unavailable(format!("{:?}: {}", s.code(), with_causes(&s)))
            }
            code => ClientError::Rejected {
                code,
                error_code,
                message: s.message().to_string(),
            },
        }
    }
}

/// Which calls may be sent again to another endpoint within one call.
#[derive(Clone, Copy)]
enum Call {
    /// Renew, describe, list: after any transient failure.
    Repeatable,
    /// Release: only when it was never sent (a repeat would end one more hold).
    Release,
}

/// Whether a status is worth retrying with the same request: the call may not have reached
/// lockd, or lockd could not serve it right now.
pub(crate) fn transient(s: &Status) -> bool {
    tls_failure(s).is_none()
        && matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Aborted
        )
}

/// Options of [`Client::acquire`].
#[derive(Clone, Debug)]
pub struct AcquireOptions {
    /// Lease length; `None` = lockd's default (30 s unless configured).
    pub ttl: Option<Duration>,
    /// How long to wait for the lock; zero = try once.
    pub wait: Duration,
    /// Who is asking, shown by Describe. Defaults to `host:pid`.
    pub holder: String,
    /// Makes the acquire idempotent across retries; a random id when `None`. An id of the
    /// caller's own is granted once: when its grant has ended since (released or expired) and
    /// lockd still remembers the id (`limits.request_retention_ms`), the acquire (and
    /// `acquire_all`) fails with [`ClientError::InvalidArgument`]; a new id acquires again.
    pub request_id: Option<String>,
    /// Makes the lock reentrant for this owner: an acquire naming the owner of the current
    /// lease gets that lease (same lease id and token) with one more hold, and each release
    /// ends one hold. Any printable ASCII id without spaces, up to 128 bytes, e.g. from
    /// [`new_owner_id`]; with a policy, owners are the identity's own. See
    /// [`LockGuard::reenter`].
    pub owner: Option<String>,
    /// 0 = an exclusive lock. N = one of the N permits of the semaphore named by the
    /// resource: the guard's lease is on the permit's own name (`RESOURCE@permit-K`, see
    /// [`LockGuard::resource`]), with its own token to fence with. Every client of a semaphore
    /// must ask with the same N (1 ..= 1000). Not with `owner`.
    pub permits: u32,
    /// A side of the read-write lock named by the resource ([`Mode`]); `Exclusive` for a
    /// lock or a semaphore's permit. Not with `owner` or `permits`.
    pub mode: Mode,
}

/// What an acquire asks of a read-write lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Not a read-write lock: an exclusive lock, or a semaphore's permit.
    #[default]
    Exclusive,
    /// A reader's lease, shared with other readers, on the reader's own slot
    /// (`RESOURCE@read-K`, see [`LockGuard::resource`]), with its own token.
    Read,
    /// The writer's lease on the resource itself, alone. A waiting writer is not overtaken by
    /// readers that come after it. See [`LockGuard::downgrade`].
    Write,
}

impl Mode {
    fn wire(self) -> i32 {
        let mode = match self {
            Mode::Exclusive => pb::acquire_request::Mode::Unspecified,
            Mode::Read => pb::acquire_request::Mode::Read,
            Mode::Write => pb::acquire_request::Mode::Write,
        };
        mode as i32
    }
}

impl Default for AcquireOptions {
    fn default() -> AcquireOptions {
        AcquireOptions {
            ttl: None,
            wait: Duration::ZERO,
            holder: default_holder(),
            request_id: None,
            owner: None,
            permits: 0,
            mode: Mode::Exclusive,
        }
    }
}

/// `hostname:pid`, the default holder description.
pub fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", std::process::id())
}

/// A fresh random request id: 128 bits as 22 URL-safe base64 characters (short enough for
/// lockd to keep inline, without a heap allocation per remembered request).
pub fn new_request_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bits = rand::random::<u128>();
    (0..22)
        .map(|i| ALPHABET[((bits >> (6 * i)) & 63) as usize] as char)
        .collect()
}

/// A fresh random owner id for [`AcquireOptions::owner`] (one per logical owner: a process,
/// a job, a thread of work).
pub fn new_owner_id() -> String {
    new_request_id()
}

/// The result of an acquire.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // made once per acquire and unpacked at once
pub enum Acquired {
    Granted(LockGuard),
    NotGranted(NotGranted),
}

/// Why the lock was not granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotGranted {
    pub reason: NotGrantedReason,
    /// The holder at the time, as it described itself (empty if unknown).
    pub holder: String,
    /// The holder's token, if the resource was held.
    pub token: Option<u64>,
    pub expires_at_ms: u64,
    pub waiters: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotGrantedReason {
    /// The resource was held and no wait was asked for.
    Busy,
    /// The wait ran out.
    WaitTimeout,
}

impl fmt::Display for NotGranted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            NotGrantedReason::Busy => f.write_str("busy")?,
            NotGrantedReason::WaitTimeout => f.write_str("the wait ran out")?,
        }
        if let Some(token) = self.token {
            write!(
                f,
                "; held by {:?} with token {token}, {} waiting",
                self.holder, self.waiters
            )?;
        }
        Ok(())
    }
}

/// tonic's TLS settings from `files`, each file read and checked first, so that a bad one is
/// named at once.
pub(crate) fn tls_config(
    files: &tlsconf::ClientFiles,
) -> Result<tonic::transport::ClientTlsConfig, ClientError> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let pems = files.pems().map_err(|e| ClientError::Tls(e.to_string()))?;
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pems.ca));
    if let Some((cert, key)) = pems.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    Ok(config)
}

/// A lease as lockd granted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub resource: String,
    pub lease_id: String,
    pub token: u64,
    /// The token signed by lockd (`TOKEN.KEY_ID.MAC`), when lockd signs tokens.
    pub signed_token: Option<String>,
    pub ttl: Duration,
    pub expires_at_ms: u64,
    /// The grant answers a retry of an earlier request id.
    pub duplicate: bool,
    /// How many times the owner holds the lease: 1, or more after re-entries.
    pub holds: u32,
    /// The owner it was acquired for (a reentrant lease), if any.
    pub owner: Option<String>,
}

impl Lease {
    /// The token as fence-proxy wants it (`fencing.token`, `Fencing-Token`, `FENCING_TOKEN`):
    /// the signed form when lockd signs tokens, the number otherwise.
    pub fn fence_token(&self) -> String {
        match &self.signed_token {
            Some(signed) => signed.clone(),
            None => self.token.to_string(),
        }
    }
}

/// What Describe reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Description {
    pub resource: String,
    pub held: bool,
    pub holder: String,
    pub token: Option<u64>,
    pub expires_at_ms: Option<u64>,
    pub ttl_ms: Option<u64>,
    /// How many times its owner holds it (1 unless a reentrant lease was re-entered).
    pub holds: Option<u32>,
    pub waiters: u32,
    /// For a semaphore in use: its number of permits, and how many are held (each permit is
    /// described under its own name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits_held: Option<u32>,
    /// For a read-write lock in use: how many readers hold it (each is described under its
    /// own slot's name; its writer, if any, is `held`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readers: Option<u32>,
}

/// One held lock, as List reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HeldLock {
    pub resource: String,
    pub holder: String,
    pub token: u64,
    pub expires_at_ms: u64,
    pub ttl_ms: u64,
    pub held_for_ms: u64,
    pub waiters: u32,
}

/// A page of held locks, and the token of the next page (`None`: this was the last).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPage {
    pub locks: Vec<HeldLock>,
    pub next_page_token: Option<String>,
}

/// A connection to lockd (cheap to clone; calls are multiplexed on one HTTP/2 connection per
/// endpoint).
#[derive(Clone, Debug)]
pub struct Client {
    endpoints: endpoints::Endpoints,
    /// `authorization: Bearer TOKEN` on every call, for a lockd with a policy.
    bearer: Option<tonic::metadata::AsciiMetadataValue>,
}

impl Client {
    /// A client for `endpoint` (e.g. `http://127.0.0.1:7420`). Connects lazily: a lockd that is
    /// down shows up as retried, then failed, calls. Must be called within a Tokio runtime.
    pub fn connect(endpoint: &str) -> Result<Client, ClientError> {
        Client::connect_tls(endpoint, &tlsconf::ClientFiles::default())
    }

    /// A client for `endpoint` over TLS with `tls` when the endpoint is `https://`: the CA
    /// that verifies lockd, and a client certificate for a lockd that wants one. Files that
    /// cannot be read or do not go together are an error at once.
    ///
    /// Several endpoints, separated by commas (`http://a:7420,http://b:7420`, one scheme): any
    /// lockd instance serves, so calls go to one and move to the next after a transient failure
    /// (the module `endpoints` says which calls are repeated on another within one call).
    pub fn connect_tls(endpoint: &str, tls: &tlsconf::ClientFiles) -> Result<Client, ClientError> {
        Ok(Client {
            endpoints: endpoints::Endpoints::new(endpoint, tls)?,
            bearer: None,
        })
    }

    /// The same client, presenting `token` as its bearer token on every call (for a lockd
    /// with a policy). Refused for a plaintext endpoint on another host, where anyone on the
    /// way could read it.
    pub fn with_token(mut self, token: &str) -> Result<Client, ClientError> {
        let bad = |reason: &str| ClientError::InvalidArgument(format!("bearer token: {reason}"));
        if self.endpoints.plaintext_remote {
            return Err(bad(
                "not sent over plaintext to another host; use an https:// endpoint",
            ));
        }
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("it must be printable ASCII without spaces"));
        }
        let mut value: tonic::metadata::AsciiMetadataValue = format!("Bearer {token}")
            .parse()
            .map_err(|_| bad("not a valid metadata value"))?;
        value.set_sensitive(true);
        self.bearer = Some(value);
        Ok(self)
    }

    /// A call other than an acquire, on the current endpoint; after a transient failure, on
    /// the next ones in turn, each once, when `kind` allows (see the module `endpoints`).
    async fn call<T, R, F, Fut>(&self, kind: Call, message: &T, f: F) -> Result<R, ClientError>
    where
        T: Clone,
        F: Fn(LockServiceClient<Channel>, tonic::Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let mut tries = self.endpoints.len();
        loop {
            let (i, rpc) = self.endpoints.rpc();
            let status = match f(rpc, self.request(message.clone())).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status) => status,
            };
            self.endpoints.failed(i, &status);
            tries -= 1;
            let again = match kind {
                Call::Repeatable => transient(&status),
                Call::Release => endpoints::never_sent(&status),
            };
            if tries == 0 || !again {
                return Err(self.error(status));
            }
        }
    }

    /// `message` as a request, with the bearer token.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(b) = &self.bearer {
            r.metadata_mut().insert("authorization", b.clone());
        }
        r
    }

    /// `s` as an error, with the hint for a closed TLS connection.
    fn error(&self, s: Status) -> ClientError {
        match (ClientError::from_status(s), self.endpoints.hint) {
            (ClientError::Unavailable(why), Some(hint)) => {
                ClientError::Unavailable(format!("{why} ({hint})"))
            }
            (e, _) => e,
        }
    }

    /// Whether a failed acquire (of a lock or a set) is asked again with the same request id:
    /// a transient failure within `TRANSPORT_RETRY_FOR` past the `deadline`, a full table
    /// within the deadline; otherwise the failure, as an error.
    fn retry_or_fail(&self, status: Status, deadline: Instant) -> Result<(), ClientError> {
        let exhausted = status.code() == Code::ResourceExhausted;
        let budget = if exhausted {
            deadline
        } else {
            deadline + TRANSPORT_RETRY_FOR
        };
        if !(transient(&status) || exhausted) || Instant::now() >= budget {
            return Err(self.error(status));
        }
        tracing::debug!(code = ?status.code(), message = status.message(), "acquire failed; retrying with the same request id");
        Ok(())
    }

    /// Acquires the lock of `resource`, waiting up to `opts.wait`. See the crate documentation
    /// for the retries this makes.
    pub async fn acquire(
        &self,
        resource: &str,
        opts: AcquireOptions,
    ) -> Result<Acquired, ClientError> {
        self.acquire_as(resource, opts, "").await
    }

    /// An acquire; with `downgrade` (a write lease's id), the downgrade of that lease.
    pub(crate) async fn acquire_as(
        &self,
        resource: &str,
        opts: AcquireOptions,
        downgrade: &str,
    ) -> Result<Acquired, ClientError> {
        ResourceName::new(resource).map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        let ttl_ms = opts.ttl.map_or(0, |t| t.as_millis() as u64);
        let mut request_id = opts.request_id.clone().unwrap_or_else(new_request_id);
        let start = Instant::now();
        let deadline = start + opts.wait;
        let mut backoff = Backoff::new();
        loop {
            let now = Instant::now();
            let remaining = deadline.saturating_duration_since(now);
            let call_wait = remaining.min(CALL_WAIT_MAX);
            let req = pb::AcquireRequest {
                resource: resource.to_string(),
                request_id: request_id.clone(),
                ttl_ms,
                wait_timeout_ms: call_wait.as_millis() as u64,
                holder: opts.holder.clone(),
                owner: opts.owner.clone().unwrap_or_default(),
                permits: opts.permits,
                mode: opts.mode.wire(),
                downgrade_lease_id: downgrade.to_string(),
            };
            // A fresh grant in the reply to this attempt was made after this moment, so its
            // lease ends no earlier than `sent + ttl` on lockd's clock.
            let sent = Instant::now();
            let (endpoint, mut rpc) = self.endpoints.rpc();
            // Given up (dropped: a select!, a timeout, an aborted task) during the call, or
            // after it went unanswered, what lockd may have granted is asked for again and
            // released (endpoints::Abandoned); a downgrade too, which then ends its lease.
            let abandoned = endpoints::Abandoned::new(self.clone(), req.clone());
            let call = tokio::time::timeout(
                call_wait + CALL_GRACE,
                rpc.acquire(self.request(req.clone())),
            )
            .await;
            let abandoned = abandoned.unless_answered(&call);
            let status = match call {
                Ok(Ok(resp)) => match resp.into_inner().outcome {
                    Some(pb::acquire_response::Outcome::Granted(l)) => {
                        let (duplicate, held) = (l.duplicate, l.held);
                        let mut lease = lease_of(resource, l, opts.owner.clone());
                        if !duplicate {
                            return Ok(Acquired::Granted(LockGuard::start(
                                self.clone(),
                                lease,
                                sent,
                            )));
                        }
                        // A grant made before under this id: renewed, ended, or to ask again
                        // (the `retried` module).
                        match self
                            .recheck(&mut lease, held, &req, deadline, &mut backoff)
                            .await?
                        {
                            Retried::Renewed(at) => {
                                return Ok(Acquired::Granted(LockGuard::start(
                                    self.clone(),
                                    lease,
                                    at,
                                )));
                            }
                            Retried::AskAgain => continue,
                            Retried::Ended => {}
                        }
                        retried::unless_own(&opts, &request_id)?;
                        request_id = new_request_id();
                        continue;
                    }
                    Some(pb::acquire_response::Outcome::NotGranted(ng)) => {
                        let why = not_granted(&ng, !opts.wait.is_zero());
                        if Instant::now() >= deadline {
                            return Ok(Acquired::NotGranted(why));
                        }
                        // lockd ended the wait early (its maximum wait is shorter than ours).
                        None
                    }
                    None => Some(Status::internal("lockd sent an empty AcquireResponse")),
                },
                Ok(Err(status)) => Some(status),
                Err(_) => Some(Status::deadline_exceeded("lockd did not answer in time")),
            };
            if let Some(status) = status {
                self.endpoints.failed(endpoint, &status);
                self.retry_or_fail(status, deadline)?;
            }
            tokio::time::sleep(backoff.next_delay()).await;
            endpoints::Abandoned::next_call(abandoned);
        }
    }

    /// Trades the write lease `lease_id` of the read-write lock `resource` for a reader's
    /// lease in one step ([`LockGuard::downgrade`] does this for a guard). Retried with the
    /// same request id on transport failures, like an acquire. `LeaseNotCurrent` when the
    /// write lease had ended. Dropped before its answer, it ends the lease: the downgrade is
    /// asked again in the background and the reader released.
    pub async fn downgrade(
        &self,
        resource: &str,
        lease_id: &str,
        ttl: Option<Duration>,
    ) -> Result<LockGuard, ClientError> {
        let opts = AcquireOptions {
            ttl,
            mode: Mode::Read,
            ..AcquireOptions::default()
        };
        match self.acquire_as(resource, opts, lease_id).await? {
            Acquired::Granted(reader) => Ok(reader),
            // A downgrade is granted or refused, never busy: an answer that is neither is
            // lockd's bug, not a reason to go on.
            Acquired::NotGranted(why) => Err(ClientError::Unavailable(format!(
                "lockd did not grant the downgrade of {resource}: {why}"
            ))),
        }
    }

    /// Renews a lease once (the guard does this by itself).
    pub async fn renew(&self, resource: &str, lease_id: &str) -> Result<RenewReply, ClientError> {
        let req = pb::RenewRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_string(),
        };
        let r = self
            .call(Call::Repeatable, &req, |mut rpc, req| async move {
                rpc.renew(req).await
            })
            .await?;
        Ok(RenewReply {
            ttl: Duration::from_millis(r.ttl_ms),
            expires_at_ms: r.expires_at_ms,
        })
    }

    /// Releases a lease; `Ok(false)` when it was no longer current (releasing is idempotent).
    pub async fn release(&self, resource: &str, lease_id: &str) -> Result<bool, ClientError> {
        Ok(self.release_hold(resource, lease_id).await?.is_some())
    }

    /// Releases a lease, or one hold of a reentrant lease: the holds left (`Some(0)`: the
    /// lease ended), or `None` when it was no longer current.
    pub async fn release_hold(
        &self,
        resource: &str,
        lease_id: &str,
    ) -> Result<Option<u32>, ClientError> {
        let req = pb::ReleaseRequest {
            resource: resource.to_string(),
            lease_id: lease_id.to_string(),
        };
        let r = self
            .call(Call::Release, &req, |mut rpc, req| async move {
                rpc.release(req).await
            })
            .await?;
        Ok(r.released.then_some(r.holds))
    }

    /// Renews every lease of `leases` (resource, lease id) in one call: each answer says
    /// whether that lease was renewed, in the order asked. lockd takes 1 to 1000 leases per
    /// call; a malformed entry, or one the caller may not use, refuses the whole call.
    pub async fn renew_many(&self, leases: &[(&str, &str)]) -> Result<Vec<Renewal>, ClientError> {
        let req = pb::RenewManyRequest {
            leases: lease_refs(leases),
        };
        let r = self
            .call(Call::Repeatable, &req, |mut rpc, req| async move {
                rpc.renew_many(req).await
            })
            .await?;
        answered_each(leases.len(), r.results.len())?;
        Ok(r.results
            .into_iter()
            .map(|r| match r.renewed {
                true => Renewal::Renewed(RenewReply {
                    ttl: Duration::from_millis(r.ttl_ms),
                    expires_at_ms: r.expires_at_ms,
                }),
                false => Renewal::NotCurrent {
                    current_token: (r.current_token != 0).then_some(r.current_token),
                },
            })
            .collect())
    }

    /// Releases every lease of `leases` (resource, lease id) in one call and one commit at
    /// lockd: for each, in the order asked, what [`Client::release_hold`] would answer (the
    /// holds left, `Some(0)` when the lease ended; `None` when it was no longer current).
    /// Limits as for [`Client::renew_many`].
    pub async fn release_many(
        &self,
        leases: &[(&str, &str)],
    ) -> Result<Vec<Option<u32>>, ClientError> {
        let req = pb::ReleaseManyRequest {
            leases: lease_refs(leases),
        };
        let r = self
            .call(Call::Release, &req, |mut rpc, req| async move {
                rpc.release_many(req).await
            })
            .await?;
        answered_each(leases.len(), r.results.len())?;
        Ok(r.results
            .into_iter()
            .map(|r| r.released.then_some(r.holds))
            .collect())
    }

    /// One page of the held locks under `prefix` (empty: all the caller may see), from
    /// `page_token` (`None`: the first page), at most `page_size` (0: lockd's default).
    pub async fn list_page(
        &self,
        prefix: &str,
        page_size: u32,
        page_token: Option<&str>,
    ) -> Result<ListPage, ClientError> {
        let req = pb::ListRequest {
            prefix: prefix.to_string(),
            page_size,
            page_token: page_token.unwrap_or_default().to_string(),
        };
        let r = self
            .call(Call::Repeatable, &req, |mut rpc, req| async move {
                rpc.list(req).await
            })
            .await?;
        Ok(ListPage {
            locks: r
                .locks
                .into_iter()
                .map(|l| HeldLock {
                    resource: l.resource,
                    holder: l.holder,
                    token: l.token,
                    expires_at_ms: l.expires_at_ms,
                    ttl_ms: l.ttl_ms,
                    held_for_ms: l.held_for_ms,
                    waiters: l.waiters,
                })
                .collect(),
            next_page_token: (!r.next_page_token.is_empty()).then_some(r.next_page_token),
        })
    }

    /// Every held lock under `prefix`, a page of `page_size` at a time.
    pub async fn list_all(
        &self,
        prefix: &str,
        page_size: u32,
    ) -> Result<Vec<HeldLock>, ClientError> {
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let page = self.list_page(prefix, page_size, token.as_deref()).await?;
            all.extend(page.locks);
            match page.next_page_token {
                Some(t) => token = Some(t),
                None => return Ok(all),
            }
        }
    }

    /// Who holds `resource` and how many wait for it.
    pub async fn describe(&self, resource: &str) -> Result<Description, ClientError> {
        let req = pb::DescribeRequest {
            resource: resource.to_string(),
        };
        let d = self
            .call(Call::Repeatable, &req, |mut rpc, req| async move {
                rpc.describe(req).await
            })
            .await?;
        Ok(Description {
            resource: resource.to_string(),
            held: d.held,
            holder: d.holder,
            token: d.held.then_some(d.token),
            expires_at_ms: d.held.then_some(d.expires_at_ms),
            ttl_ms: d.held.then_some(d.ttl_ms),
            holds: d.held.then_some(d.holds.max(1)),
            waiters: d.waiters,
            permits: (d.permits > 0).then_some(d.permits),
            permits_held: (d.permits > 0).then_some(d.permits_held),
            readers: d.read_write.then_some(d.readers),
        })
    }
}

/// The answer to a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewReply {
    pub ttl: Duration,
    pub expires_at_ms: u64,
}

/// One lease's answer in [`Client::renew_many`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    Renewed(RenewReply),
    /// The lease was not current (expired, released, or never held); `current_token` is the
    /// token of whoever holds the resource now.
    NotCurrent {
        current_token: Option<u64>,
    },
}

fn lease_refs(leases: &[(&str, &str)]) -> Vec<pb::LeaseRef> {
    leases
        .iter()
        .map(|(resource, lease_id)| pb::LeaseRef {
            resource: resource.to_string(),
            lease_id: lease_id.to_string(),
        })
        .collect()
}

/// A batch's answer has one result per lease asked, or it cannot be matched to them.
fn answered_each(asked: usize, answered: usize) -> Result<(), ClientError> {
    if asked == answered {
        return Ok(());
    }
    Err(ClientError::Rejected {
        code: Code::Internal,
        error_code: None,
        message: format!("lockd answered {answered} results for {asked} leases"),
    })
}

/// A lease of `resource` as lockd granted it (to `owner`, for a reentrant one).
/// The lease of a grant asked for under `resource`: on the name lockd says (a semaphore's
/// permit has its own), or `resource` from a lockd that does not say.
fn lease_of(resource: &str, l: pb::Lease, owner: Option<String>) -> Lease {
    Lease {
        resource: match l.resource.is_empty() {
            true => resource.to_string(),
            false => l.resource,
        },
        lease_id: l.lease_id,
        token: l.token,
        signed_token: (!l.signed_token.is_empty()).then_some(l.signed_token),
        ttl: Duration::from_millis(l.ttl_ms),
        expires_at_ms: l.expires_at_ms,
        duplicate: l.duplicate,
        holds: l.holds.max(1),
        owner,
    }
}

/// What lockd's refusal means to the caller. A caller that asked to wait (`waited`) gets a
/// timeout whatever the last attempt's answer: when lockd ends a wait a little before the
/// caller's own deadline (its clock counts whole milliseconds), the attempt that follows asks
/// with no time left and is answered busy, but the caller did wait its full time.
fn not_granted(ng: &pb::NotGranted, waited: bool) -> NotGranted {
    let reason = match pb::not_granted::Reason::try_from(ng.reason) {
        Ok(pb::not_granted::Reason::WaitTimeout) => NotGrantedReason::WaitTimeout,
        _ if waited => NotGrantedReason::WaitTimeout,
        _ => NotGrantedReason::Busy,
    };
    NotGranted {
        reason,
        holder: ng.holder.clone(),
        token: (ng.token != 0).then_some(ng.token),
        expires_at_ms: ng.expires_at_ms,
        waiters: ng.waiters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The other SDKs report a refusal after a wait as a timeout too (`|| waited`).
    #[test]
    fn a_refusal_after_a_wait_is_a_timeout_even_when_the_last_attempt_was_answered_busy() {
        let busy = pb::NotGranted {
            reason: pb::not_granted::Reason::Busy as i32,
            ..pb::NotGranted::default()
        };
        assert_eq!(
            not_granted(&busy, true).reason,
            NotGrantedReason::WaitTimeout
        );
        assert_eq!(not_granted(&busy, false).reason, NotGrantedReason::Busy);
        let timeout = pb::NotGranted {
            reason: pb::not_granted::Reason::WaitTimeout as i32,
            ..pb::NotGranted::default()
        };
        assert_eq!(
            not_granted(&timeout, false).reason,
            NotGrantedReason::WaitTimeout
        );
    }

    #[test]
    fn bad_endpoints_are_refused_at_once() {
        for bad in [
            "",
            "not a url",
            "127.0.0.1:7420 x",
            // several: none empty, one scheme
            "http://127.0.0.1:7420,",
            "http://127.0.0.1:7420,,http://127.0.0.1:7421",
            "http://127.0.0.1:7420,https://127.0.0.1:7421",
            "http://127.0.0.1:7420,ftp://h:1",
        ] {
            assert!(
                matches!(Client::connect(bad), Err(ClientError::Endpoint { .. })),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn invalid_resource_names_are_refused_before_any_call() {
        let client = Client::connect("http://127.0.0.1:9").unwrap();
        let err = client
            .acquire("has space", AcquireOptions::default())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::InvalidArgument(ref m) if m.contains("allowed are")),
            "{err}"
        );
    }

    #[test]
    fn request_ids_are_fresh_and_valid() {
        let a = new_request_id();
        assert_eq!(a.len(), 22);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_ne!(a, new_request_id());
    }
}
