//! Errors of the core, one type per operation. Busy locks, timed-out waits and releases of
//! leases that are no longer held are *outcomes*, not errors (see `outcome`); what is here is a
//! request that cannot be served as asked. Every message says what was wrong and what to do.

use fencing::{FencingToken, ResourceName, ResourceNameError};
use thiserror::Error;

/// A request field outside what lockd accepts. Maps to gRPC `INVALID_ARGUMENT`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum InvalidArgument {
    #[error("invalid resource name: {0}")]
    Resource(#[from] ResourceNameError),
    #[error(
        "ttl_ms {requested_ms} is outside the allowed range {min_ms} ..= {max_ms} ms (0 means the server default)"
    )]
    Ttl {
        requested_ms: u64,
        min_ms: u64,
        max_ms: u64,
    },
    #[error(
        "wait_timeout_ms {requested_ms} is above the maximum {max_ms} ms (0 means try once); wait again after it ends"
    )]
    Wait { requested_ms: u64, max_ms: u64 },
    #[error("request_id is {len} bytes long; the limit is {max} bytes")]
    RequestIdTooLong { len: usize, max: usize },
    #[error("request_id must be printable ASCII without spaces (a UUID is a good choice)")]
    RequestIdCharacters,
    #[error("holder is {len} bytes long; the limit is {max} bytes")]
    HolderTooLong { len: usize, max: usize },
    #[error("holder must not contain control characters")]
    HolderCharacters,
    #[error("lease_id is not a lease id: {0}")]
    LeaseId(String),
    #[error("downgrade_lease_id is not a lease id: {0}")]
    DowngradeLeaseId(String),
    #[error("{0}")]
    List(String),
    #[error("owner is {len} bytes long; the limit is {max} bytes")]
    OwnerTooLong { len: usize, max: usize },
    #[error("owner must be printable ASCII without spaces (a UUID is a good choice)")]
    OwnerCharacters,
    #[error(
        "the owner holds the lease of {resource} {max} times, the most lockd counts; release a hold first"
    )]
    HoldsExceeded { resource: ResourceName, max: u32 },
    /// A RenewMany or ReleaseMany: empty, too long, or an entry that is malformed.
    #[error("{0}")]
    Batch(String),
    /// An AcquireAll's set: empty, too large, or naming a resource twice.
    #[error("{0}")]
    Set(String),
    #[error(
        "permits is {asked}; a semaphore has 1 ..= {max} permits (0 asks for an exclusive lock)"
    )]
    Permits { asked: u32, max: u32 },
    #[error("a semaphore's permits are not reentrant: send permits or owner, not both")]
    PermitsWithOwner,
    #[error(
        "{resource} is the name of a semaphore's permit (names ending in @permit- and digits are reserved): acquire the semaphore with permits, then renew and release the permit it grants"
    )]
    ReservedName { resource: ResourceName },
    #[error(
        "the semaphore name {resource} is too long for its permits' names (NAME@permit-K); use at most {max} bytes"
    )]
    SemaphoreNameTooLong { resource: ResourceName, max: usize },
    #[error(
        "{resource} is the name of a read-write lock's reader (names ending in @read- and digits are reserved): acquire the lock with mode read, then renew and release the reader's lease it grants"
    )]
    ReservedReaderName { resource: ResourceName },
    #[error("mode {mode} asks for a read-write lock: send mode or {other}, not both")]
    ModeWith {
        mode: &'static str,
        other: &'static str,
    },
    #[error(
        "the read-write lock name {resource} is too long for its readers' names (NAME@read-K); use at most {max} bytes"
    )]
    RwNameTooLong { resource: ResourceName, max: usize },
    #[error("downgrade_lease_id is set: it downgrades a write lease, so mode must be read")]
    DowngradeNotRead,
    #[error("mode {0} is not a mode: 0 (an exclusive lock or a semaphore), 1 (read) or 2 (write)")]
    Mode(i32),
}

/// Why an Acquire was refused (not: why it was not granted; that is an outcome).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum AcquireError {
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    /// The same request id was already used for another resource: a client bug.
    #[error(
        "request_id {request_id:?} was already used to acquire {original}; use a new request id for {requested}"
    )]
    RequestIdReused {
        request_id: String,
        original: ResourceName,
        requested: ResourceName,
    },
    /// The request id is waiting for a read-write lock as one side, and was used to ask for
    /// the other: a client bug.
    #[error(
        "request_id {request_id:?} is waiting for {resource} as {waits_as}; use a new request id to ask as {asked_as}"
    )]
    RequestIdWaitsAs {
        request_id: String,
        resource: ResourceName,
        waits_as: &'static str,
        asked_as: &'static str,
    },
    /// The request id's grant, still held, is another kind of lock of the same name than asked
    /// for (an exclusive lock and a read-write lock's writer): a client bug.
    #[error(
        "request_id {request_id:?} was already used for {resource} as {used_as}; use a new request id to ask for it as {asked_as}"
    )]
    RequestIdUsedAs {
        request_id: String,
        resource: ResourceName,
        used_as: String,
        asked_as: String,
    },
    /// The request id names an AcquireAll's set, and was used again for something else (an
    /// Acquire, or another set): a client bug.
    #[error(
        "request_id {request_id:?} was already used to acquire the set [{}] (AcquireAll); use a new request id",
        set.iter().map(ResourceName::as_str).collect::<Vec<_>>().join(", ")
    )]
    SetIdReused {
        request_id: String,
        /// The set's members that are remembered, in the set's order.
        set: Vec<ResourceName>,
    },
    #[error(
        "the wait queue of {resource} is full ({max} waiters); retry later with backoff, or try-lock"
    )]
    QueueFull { resource: ResourceName, max: usize },
    #[error("lockd holds the maximum number of waiters ({max}); retry later with backoff")]
    WaitersExhausted { max: usize },
    #[error(
        "lockd holds the maximum number of leases ({max}); release unused locks or raise limits.leases_max"
    )]
    LeasesExhausted { max: usize },
    #[error(
        "lockd remembers the maximum number of request ids ({max}); retry later, or raise limits.requests_max"
    )]
    RequestsExhausted { max: usize },
    #[error(
        "tenant {tenant} holds its maximum of {max} leases; release unused locks, or raise the tenant's leases_max in the policy"
    )]
    TenantLeasesExhausted { tenant: String, max: usize },
    #[error(
        "tenant {tenant} has its maximum of {max} waiters queued; retry later with backoff, or try-lock"
    )]
    TenantWaitersExhausted { tenant: String, max: usize },
    #[error(
        "tenant {tenant} has its maximum of {max} request ids remembered; retry later, or raise the tenant's requests_max in the policy"
    )]
    TenantRequestsExhausted { tenant: String, max: usize },
    #[error(
        "tenant {tenant} is above its acquire rate of {per_second} calls a second; retry in {retry_after_ms} ms"
    )]
    TenantRateLimited {
        tenant: String,
        per_second: u32,
        retry_after_ms: u64,
    },
    /// The resource is held as another kind of lock than asked for (an exclusive lock, or a
    /// semaphore's permits): a client bug, or two programs sharing a name.
    #[error(
        "{resource} is held as {held_as}, and was asked for as {asked_as}; use one kind per name"
    )]
    KindMismatch {
        resource: ResourceName,
        held_as: String,
        asked_as: String,
    },
    /// The semaphore has another number of permits than asked for. It is fixed by the Acquire
    /// that found it unused, for as long as a permit is held or waited for.
    #[error(
        "the semaphore {resource} has {permits} permits, and was asked for with {asked}; every client must ask with the same number"
    )]
    PermitsMismatch {
        resource: ResourceName,
        permits: u32,
        asked: u32,
    },
    /// A downgrade named a lease that is not the lock's current write lease: it expired, was
    /// released, or was never its writer's. Maps to `FAILED_PRECONDITION` (`lease_not_current`):
    /// the caller holds nothing, and must stop working under the lease.
    #[error("{}", not_writer_message(resource, *current))]
    NotWriter {
        resource: ResourceName,
        current: Option<FencingToken>,
    },
    /// 2^63 - 1 tokens have been issued. Unreachable in practice (300 years at a billion grants
    /// per second), but it must not wrap.
    #[error("the fencing token space is exhausted; lockd can issue no more grants")]
    TokensExhausted,
}

/// Why a Renew failed. Maps to gRPC `FAILED_PRECONDITION`: the holder must stop working.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RenewError {
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    #[error("{}", not_current_message(resource, *current))]
    NotCurrent {
        resource: ResourceName,
        current: Option<FencingToken>,
    },
    /// The name is a semaphore's in use: its permits are leases of their own names. Maps to
    /// `FAILED_PRECONDITION` (`kind_mismatch`): the holder's permit is untouched, and it has
    /// only to use the permit's name.
    #[error(
        "{resource} is a semaphore of {permits} permits, not a lease: a permit is renewed and released under its own name, {resource}@permit-K (the resource its grant names)"
    )]
    Semaphore {
        resource: ResourceName,
        permits: u32,
    },
    /// The lease is a reader's of the read-write lock `resource`, named by the lock's name
    /// instead of its slot's. Maps to `FAILED_PRECONDITION` (`kind_mismatch`), as for a
    /// semaphore: the reader's lease is untouched, and it has only to use its slot's name.
    #[error(
        "the lease is a reader's of the read-write lock {resource}: a reader renews and releases under its own slot's name, {resource}@read-{slot} (the resource its grant names)"
    )]
    Readers { resource: ResourceName, slot: u32 },
}

fn not_writer_message(resource: &ResourceName, current: Option<FencingToken>) -> String {
    let now = match current {
        Some(t) => format!("its writer now has token {t}"),
        None => "it has no writer now".to_string(),
    };
    format!(
        "downgrade_lease_id is not the current write lease of {resource} ({now}); stop working under it and acquire again"
    )
}

fn not_current_message(resource: &ResourceName, current: Option<FencingToken>) -> String {
    let now = match current {
        Some(t) => format!("it is now held with token {t}"),
        None => "it is not held now".to_string(),
    };
    format!(
        "the lease is not the current lease of {resource} (it expired or was released; {now}); stop working under it and acquire again"
    )
}

/// The persisted state cannot be loaded into a consistent core. lockd refuses to start.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RecoverError {
    #[error(
        "stored lease of {resource} has token {token}, above the stored token high-water {last_token:?}"
    )]
    TokenAboveHighWater {
        resource: ResourceName,
        token: FencingToken,
        last_token: Option<FencingToken>,
    },
    #[error("two stored leases for {resource}")]
    DuplicateResource { resource: ResourceName },
    #[error("two stored leases with token {token}")]
    DuplicateToken { token: FencingToken },
    #[error("stored record of {resource} is invalid: {reason}")]
    InvalidRecord {
        resource: ResourceName,
        reason: String,
    },
}

/// The configured limits contradict each other.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("invalid limits: {0}")]
pub struct LimitsError(pub String);
