//! The core of lockd: locks, leases, FIFO waiters, request-id de-duplication and token issue,
//! as a state machine without I/O.
//!
//! The machine ([`Core`]) is told the time with every call and returns what must happen as
//! [`Effect`]s: records to persist, waiters to answer. It never reads a clock, touches a disk or
//! a socket, or draws randomness (lease ids come from an injected [`LeaseIdSource`]); the server
//! crate drives it. That makes every behaviour testable from data, and simulable.
//!
//! What it guarantees, for the calls it is given (DESIGN.md section 2):
//! - at most one lease per resource (invariant 1);
//! - every grant's token above every earlier one, across [`Core::recover`] (invariant 2);
//! - renew and release only with the current lease id (invariant 5);
//! - a retried request id returns its original grant (invariant 6);
//! - an AcquireAll's set is granted whole or not at all, in one atomic store op;
//! - at most N permits of a semaphore of N, each its own lease on its own name;
//! - a read-write lock held by one writer or by readers, never both, FIFO and so
//!   writer-preferring;
//! - FIFO hand-off to waiters when a lease is released or expires.
//!
//! What it does not do: durability (the driver must make each `Op::Grant` durable before
//! answering it), parsing of wire messages, or deciding what time it is.

mod error;
mod leases;
pub mod limits;
mod machine;
mod outcome;
pub mod permits;
mod persist;
pub mod tenants;
mod types;

pub use error::{AcquireError, InvalidArgument, LimitsError, RecoverError, RenewError};
pub use limits::Limits;
pub use machine::{
    AcquireAllOutcome, AcquireAllRequest, AcquireRequest, Core, LeaseIdSource, Rw, Stats,
};
pub use outcome::{
    AcquireOutcome, Busy, Description, Effect, Grant, HeldBy, Listed, Page, ReleaseOutcome,
    Renewed, SemaphoreUse,
};
pub use persist::{LeaseRecord, Op, Reentrant, RwRole, Snapshot};
pub use tenants::{Quota, Rate, Tenancy, TenancyError, Tenant};
pub use types::{Holder, Millis, Owner, RequestId, WaiterId};
