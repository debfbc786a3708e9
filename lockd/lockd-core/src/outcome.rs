//! What the core answers and what it asks the driver to do.

use fencing::{FencingToken, LeaseId, ResourceName};

use crate::persist::Op;
use crate::types::{Holder, Millis, WaiterId};

/// A lease as handed to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub resource: ResourceName,
    pub lease_id: LeaseId,
    pub token: FencingToken,
    pub ttl_ms: u64,
    /// When the lease ends unless renewed, on the core's clock.
    pub expires_at: Millis,
    /// How many times its owner holds it: 1, or more for a re-entered reentrant lease.
    pub holds: u32,
}

/// Who holds a lock that was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Busy {
    pub holder: Holder,
    pub token: FencingToken,
    pub expires_at: Millis,
    /// Waiters queued on the resource.
    pub waiters: usize,
}

/// The answer to an Acquire that was served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// A new lease. The driver must make the `Op::Grant` effect durable before answering.
    Granted(Grant),
    /// A retry of a request id that was granted before: the original grant, unchanged. `held`
    /// says whether that lease is still the current one (it may have expired or been released).
    Duplicate { grant: Grant, held: bool },
    /// The owner of the current (reentrant) lease asked again: the same lease, with one more
    /// hold and its TTL from now. The driver must make the `Op::Reenter` effect durable before
    /// answering. A retry of the re-entry's request id is a `Duplicate`: not counted again.
    Reentered(Grant),
    /// Try-lock on a held resource.
    Busy(Busy),
    /// The request waits in the resource's FIFO queue at `position` (1 = next). Its answer comes
    /// later as an [`Effect::Granted`] or [`Effect::WaitTimedOut`] naming `waiter`.
    Queued { waiter: WaiterId, position: usize },
    /// A retry of a request id that is still waiting: the retry takes over the original's place
    /// in the queue (and its wait deadline becomes the retry's). The driver must tell the
    /// original caller, if still connected, that it was superseded.
    Rejoined { waiter: WaiterId, position: usize },
}

/// The answer to a Release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease was current and has ended.
    /// `held_ms`: from the grant (or the restart that recovered it) to the release.
    Released { token: FencingToken, held_ms: u64 },
    /// The lease is reentrant and was held more than once: one hold ended, `holds` are left,
    /// and the lease goes on.
    Unheld { token: FencingToken, holds: u32 },
    /// The lease was not current (already released, expired, or never existed); nothing
    /// changed. Releasing is idempotent, so this is not an error.
    NotHeld {
        current: Option<FencingToken>,
        /// The name is a semaphore's in use, of this many permits: its permits are released
        /// under their own names (a client bug, which the server refuses as such).
        semaphore: Option<u32>,
        /// The lease is a reader's of the read-write lock of that name, on this slot: a reader
        /// releases under its own slot's name (a client bug, refused as such).
        reader_slot: Option<u32>,
    },
}

/// One held lock in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub resource: ResourceName,
    pub holder: Holder,
    pub token: FencingToken,
    pub expires_at: Millis,
    pub ttl_ms: u64,
    pub granted_at: Millis,
    pub waiters: usize,
}

/// One page of a listing, and where the next one starts (`None`: this was the last).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub locks: Vec<Listed>,
    pub next: Option<u32>,
}

/// The answer to a successful Renew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub expires_at: Millis,
    pub ttl_ms: u64,
}

/// What Describe reports about a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Description {
    pub held: Option<HeldBy>,
    pub waiters: usize,
    /// For a semaphore in use: how many permits it has, and how many are held (each is a
    /// lease of its own, described under its permit's name).
    pub permits: Option<SemaphoreUse>,
    /// For a read-write lock in use: how many readers hold it (its writer, if any, is
    /// `held`; each reader is a lease of its own, described under its slot's name).
    pub readers: Option<u32>,
}

/// A semaphore in use, as Describe reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemaphoreUse {
    pub permits: u32,
    pub held: u32,
}

/// The current lease of a resource, without its lease id (that is the holder's capability and
/// is never shown to others).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBy {
    pub holder: Holder,
    pub token: FencingToken,
    pub expires_at: Millis,
    pub ttl_ms: u64,
    /// 1, or more for a re-entered reentrant lease.
    pub holds: u32,
}

/// Something the driver must do as a consequence of a core call, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Persist this change (see `persist` for which must be durable before what).
    Persist(Op),
    /// A queued waiter got the lock (hand-off). Its answer must wait for the grant's durability.
    Granted { waiter: WaiterId, grant: Grant },
    /// A queued waiter's wait ended without a grant. `busy` is who holds the lock now (`None`
    /// only when no grant can ever be made again: the token space is exhausted).
    WaitTimedOut {
        waiter: WaiterId,
        busy: Option<Busy>,
    },
    /// A lease ran out without being renewed (for logs and metrics).
    Expired {
        resource: ResourceName,
        lease_id: LeaseId,
        token: FencingToken,
        holder: Holder,
        /// From the grant (or the restart that recovered it) to the expiry.
        held_ms: u64,
    },
    /// A lease has been held `limits.hold_warn_after_ms` (reported once per lease).
    HeldLong {
        resource: ResourceName,
        lease_id: LeaseId,
        token: FencingToken,
        holder: Holder,
        held_ms: u64,
    },
}
