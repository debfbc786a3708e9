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
