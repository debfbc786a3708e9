//! The shared vocabulary of the fencing lock service.
//!
//! Every program of the project (lockd, lockctl, fence-proxy, verify) speaks in these types, so
//! that a token, a resource name or a lease id means the same thing, with the same limits, on
//! every side of every wire. The crate holds:
//!
//! - [`FencingToken`]: the monotone number handed out with every grant (1 ..= `i64::MAX`, so that
//!   it fits a PostgreSQL `bigint` unchanged);
//! - [`ResourceName`]: a validated, bounded name of the thing a lock protects;
//! - [`LeaseId`]: 128 random bits naming one grant, the capability needed to renew or release;
//! - [`check`]: the fencing rule itself (lower token rejected, equal accepted, higher raises);
//! - [`wire`]: the names under which resource and token travel (SQL settings, HTTP headers,
//!   environment variables).
//!
//! - [`signed`]: signed tokens (HMAC-SHA256 with key ids), signing and verifying;
//! - [`permit`]: the names of a semaphore's permits (`NAME@permit-K`), each a resource of its
//!   own;
//! - [`reader`]: the names of a read-write lock's readers (`NAME@read-K`).
//!
//! It deliberately does no I/O, generates no randomness and depends on nothing but `std`,
//! `serde` and RustCrypto's `hmac` and `sha2`: the verifier depends on this crate alone, so it
//! cannot share a bug with the implementation it checks.

mod lease_id;
pub mod permit;
pub mod reader;
mod resource;
mod rule;
pub mod signed;
mod token;
pub mod wire;

pub use lease_id::{LeaseId, ParseLeaseIdError};
pub use resource::{RESOURCE_NAME_LEN_MAX, ResourceName, ResourceNameError};
pub use rule::{Decision, check};
pub use token::{FencingToken, ParseTokenError};

/// Whether lockd reserves `name` for the slots it hands out itself: a semaphore's permits
/// ([`permit`]) and a read-write lock's readers ([`reader`]).
pub fn is_reserved(name: &str) -> bool {
    permit::is_reserved(name) || reader::is_reserved(name)
}

/// The name whose tenant (and queue) a lease on `name` belongs to: a permit's semaphore's, a
/// reader's lock's, else the name itself.
pub fn owner_name(name: &str) -> &str {
    permit::parse(name)
        .or_else(|| permit::parse_slot(name, reader::MARK))
        .map_or(name, |(owner, _)| owner)
}
