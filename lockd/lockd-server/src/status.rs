//! The one mapping from lockd's domain errors to gRPC statuses.
//!
//! The gRPC code follows tonic's litmus test: a request that cannot succeed as written is
//! `INVALID_ARGUMENT`; a lease that is no longer current is `FAILED_PRECONDITION` (the client
//! must change what it does: stop and acquire again); full queues and tables are
//! `RESOURCE_EXHAUSTED` (retry later with backoff); a waiting call taken over by its own retry
//! is `ABORTED`; shutdown and a failed store are `UNAVAILABLE` (retry elsewhere or later).
//! Contention is not an error at all: a busy lock is an `AcquireResponse.not_granted`.
//!
//! Every status carries a stable code in the `lockd-error` metadata; the message is for people.

use lockd_core::{AcquireError, InvalidArgument, RenewError};
use lockd_proto::ERROR_CODE_METADATA;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::driver::DriverError;

/// Stable error codes, as documented in docs/api.md.
pub mod codes {
    pub const INVALID_ARGUMENT: &str = "invalid_argument";
    pub const REQUEST_ID_REUSED: &str = "request_id_reused";
    pub const QUEUE_FULL: &str = "queue_full";
    pub const WAITERS_EXHAUSTED: &str = "waiters_exhausted";
    pub const LEASES_EXHAUSTED: &str = "leases_exhausted";
    pub const REQUESTS_EXHAUSTED: &str = "requests_exhausted";
    pub const TOKENS_EXHAUSTED: &str = "tokens_exhausted";
    pub const LEASE_NOT_CURRENT: &str = lockd_proto::LEASE_NOT_CURRENT;
    pub const SUPERSEDED: &str = "superseded";
    pub const SHUTTING_DOWN: &str = "shutting_down";
    pub const STORE_FAILED: &str = "store_failed";
    pub const NOT_LEADER: &str = "not_leader";
    pub const NO_LEADER: &str = "no_leader";
    pub const UNAUTHENTICATED: &str = "unauthenticated";
    pub const PERMISSION_DENIED: &str = "permission_denied";
    pub const TENANT_LEASES_EXHAUSTED: &str = "tenant_leases_exhausted";
    pub const TENANT_WAITERS_EXHAUSTED: &str = "tenant_waiters_exhausted";
    pub const TENANT_REQUESTS_EXHAUSTED: &str = "tenant_requests_exhausted";
    pub const TENANT_RATE_LIMITED: &str = "tenant_rate_limited";
    pub const KIND_MISMATCH: &str = "kind_mismatch";
    pub const PERMITS_MISMATCH: &str = "permits_mismatch";
}

fn status(code: Code, stable: &'static str, message: String) -> Status {
    let mut s = Status::new(code, message);
    s.metadata_mut()
        .insert(ERROR_CODE_METADATA, MetadataValue::from_static(stable));
    s
}

pub fn invalid_argument(e: &InvalidArgument) -> Status {
    status(
        Code::InvalidArgument,
        codes::INVALID_ARGUMENT,
        e.to_string(),
    )
}

fn from_acquire(a: &AcquireError) -> Status {
    let message = a.to_string();
    match a {
        AcquireError::Invalid(i) => invalid_argument(i),
        AcquireError::RequestIdReused { .. }
        | AcquireError::RequestIdWaitsAs { .. }
        | AcquireError::RequestIdUsedAs { .. }
        | AcquireError::SetIdReused { .. } => {
            status(Code::InvalidArgument, codes::REQUEST_ID_REUSED, message)
        }
        AcquireError::QueueFull { .. } => {
            status(Code::ResourceExhausted, codes::QUEUE_FULL, message)
        }
        AcquireError::WaitersExhausted { .. } => {
            status(Code::ResourceExhausted, codes::WAITERS_EXHAUSTED, message)
        }
        AcquireError::LeasesExhausted { .. } => {
            status(Code::ResourceExhausted, codes::LEASES_EXHAUSTED, message)
        }
        AcquireError::RequestsExhausted { .. } => {
            status(Code::ResourceExhausted, codes::REQUESTS_EXHAUSTED, message)
        }
        AcquireError::TenantLeasesExhausted { .. } => status(
            Code::ResourceExhausted,
            codes::TENANT_LEASES_EXHAUSTED,
            message,
        ),
        AcquireError::TenantWaitersExhausted { .. } => status(
            Code::ResourceExhausted,
            codes::TENANT_WAITERS_EXHAUSTED,
            message,
        ),
        AcquireError::TenantRequestsExhausted { .. } => status(
            Code::ResourceExhausted,
            codes::TENANT_REQUESTS_EXHAUSTED,
            message,
        ),
        AcquireError::TenantRateLimited { .. } => {
            status(Code::ResourceExhausted, codes::TENANT_RATE_LIMITED, message)
        }
        AcquireError::KindMismatch { .. } => {
            status(Code::FailedPrecondition, codes::KIND_MISMATCH, message)
        }
        AcquireError::PermitsMismatch { .. } => {
            status(Code::FailedPrecondition, codes::PERMITS_MISMATCH, message)
        }
        AcquireError::NotWriter { .. } => {
            status(Code::FailedPrecondition, codes::LEASE_NOT_CURRENT, message)
        }
        AcquireError::TokensExhausted => {
            status(Code::ResourceExhausted, codes::TOKENS_EXHAUSTED, message)
        }
    }
}

fn from_renew(r: &RenewError) -> Status {
    match r {
        RenewError::Invalid(i) => invalid_argument(i),
        RenewError::NotCurrent { .. } => status(
            Code::FailedPrecondition,
            codes::LEASE_NOT_CURRENT,
            r.to_string(),
        ),
        RenewError::Semaphore { .. } | RenewError::Readers { .. } => status(
            Code::FailedPrecondition,
            codes::KIND_MISMATCH,
            r.to_string(),
        ),
    }
}

pub fn from_driver(e: &DriverError) -> Status {
    let message = e.to_string();
    match e {
        DriverError::Acquire(a) => from_acquire(a),
        DriverError::Renew(r) => from_renew(r),
        DriverError::Superseded => status(Code::Aborted, codes::SUPERSEDED, message),
        DriverError::ShuttingDown => status(Code::Unavailable, codes::SHUTTING_DOWN, message),
        DriverError::StoreFailed => status(Code::Unavailable, codes::STORE_FAILED, message),
        DriverError::NotLeader => status(Code::Unavailable, codes::NOT_LEADER, message),
    }
}

impl From<DriverError> for Status {
    fn from(e: DriverError) -> Status {
        from_driver(&e)
    }
}

/// No leader could be found in time (HA mode): an election is under way, or etcd is out of
/// reach.
pub fn no_leader(message: String) -> Status {
    status(Code::Unavailable, codes::NO_LEADER, message)
}

/// A forwarded call reached an instance that does not lead either (the leadership moved
/// meanwhile); the client retries.
pub fn not_leader(message: String) -> Status {
    status(Code::Unavailable, codes::NOT_LEADER, message)
}

/// The caller could not be told from the credentials it presented (a policy is in force).
pub fn unauthenticated(message: impl Into<String>) -> Status {
    status(
        Code::Unauthenticated,
        codes::UNAUTHENTICATED,
        message.into(),
    )
}

/// The caller is known, and the policy does not let it do this.
pub fn permission_denied(message: String) -> Status {
    status(Code::PermissionDenied, codes::PERMISSION_DENIED, message)
}
