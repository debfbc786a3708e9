//! The gRPC contract of lockd: package `fencing.lock.v1`, service `LockService`.
//!
//! Generated from `proto/fencing/lock/v1/lock.proto` at build time. Its own crate so that the
//! server and the client SDK share the contract without depending on each other.

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("fencing.lock.v1");
}

/// Metadata key of the stable error code on every error status lockd returns.
pub const ERROR_CODE_METADATA: &str = "lockd-error";

/// The `lockd-error` code of a lease that is not current: the one `FAILED_PRECONDITION` that
/// tells a holder to stop (the others, such as `kind_mismatch`, refuse a request as asked).
pub const LEASE_NOT_CURRENT: &str = "lease_not_current";
