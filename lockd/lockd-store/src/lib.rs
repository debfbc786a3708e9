//! Persistence for lockd: the [`Store`] trait, two implementations, and the conformance suite.
//!
//! A store is a log applier, not a lock service: it applies the core's [`Op`]s in order, in
//! atomic batches, checks the preconditions that protect the invariants once more at the disk's
//! edge (a grant never lands on a held resource, tokens only rise, only the stored lease is
//! removed), and gives everything back as a [`Snapshot`] on open. It makes no decisions.
//!
//! - [`MemoryStore`]: for tests and simulations; a "crash" loses exactly the unsynced batches.
//! - [`RedbStore`]: the embedded, durable default: a redb file behind a journal, in the data
//!   directory.
//! - [`conformance`]: the behaviour every store must show, as a suite that each implementation
//!   runs from its own tests (the etcd store, in `lockd-store-etcd`, runs it from the e2e tests
//!   against a real etcd).
//! - [`check_batch`]: the preconditions of a batch, shared by every store (also the etcd one).
//!
//! # Assumptions about the disk
//!
//! A synced commit (`fdatasync` under redb's commit) is on stable storage when the call
//! returns: the device honours flushes (no volatile write cache that lies) and the file system
//! does not lose synced data. Without that no embedded store can keep invariant 8. Unsynced
//! commits may be lost in a crash; redb then recovers to the last durable commit or a later one,
//! never to a torn mix. A failed write or sync leaves the store state unknown, so the server
//! stops (fail-stop) rather than continue with a state it cannot trust.

mod check;
pub mod conformance;
mod encoding;
mod error;
mod journal;
mod memory;
mod redb_store;

pub use check::{View, check_batch};
pub use error::StoreError;
pub use lockd_core::{LeaseRecord, Op, Snapshot};
pub use memory::MemoryStore;
pub use redb_store::{
    CHECKPOINT_OPS, DATA_FILE, JOURNAL_FILE, RedbStore, RedbStoreOptions, SECOND_JOURNAL_FILE,
};

/// Where the core's decisions are kept.
pub trait Store: Send {
    /// Everything persisted so far (called once, when the server starts).
    fn load(&mut self) -> Result<Snapshot, StoreError>;

    /// Applies `ops` in order, all or none. Refuses the whole batch when an op breaks a
    /// precondition (see [`Op`]). With `sync`, this batch and every earlier one are durable
    /// when the call returns; without, they may be lost in a crash (but not torn). An empty
    /// batch with `sync` makes every earlier batch durable.
    fn commit(&mut self, ops: &[Op], sync: bool) -> Result<(), StoreError>;

    /// Whether [`Store::commit`] runs an async runtime of its own (`block_on`): it must then
    /// never be called on a thread that drives another runtime's tasks, which tokio refuses.
    /// The server's writer hands such a thread's tasks over first (`block_in_place`); for a
    /// store that answers `false` it commits in place, saving that hand-over.
    fn commit_runs_a_runtime(&self) -> bool {
        false
    }

    /// Work that may be deferred after a commit has been answered (the redb store applies the
    /// journaled batch to its main file here). The writer calls it when it has answered the
    /// batch; a store that defers nothing does nothing.
    fn tidy(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
}
