//! What lockd's stores over a key-value service share (the etcd store, and the ZooKeeper
//! store): the state is one record per held lock, one per remembered request id, and the
//! token high-water, each under a key of its own; only the leading lockd writes them, in
//! transactions conditional on its leadership.
//!
//! - [`records`]: the records as JSON, the same in every such store.
//! - [`Mirror`]: what the store holds, as far as the preconditions need it (the leader is the
//!   only writer, so the mirror is exact while its term lasts), and the cutting of a batch
//!   into [`Change`]s of [`Key`]s, piece by piece within a service's transaction limits.
//! - [`Stored`]: the state read back (a new leader's load, a follower's warm copy).
//! - [`highwater`]: the token high-water each instance writes down, the guard against a
//!   service that lost data.
//! - [`tenure`]: until when a leader may answer, by its own boot-time clock.
//!
//! A store maps each [`Key`] to its own key or path, and each [`Change`] to its own
//! operation; it decides nothing about the state.

pub mod highwater;
mod mirror;
pub mod records;
mod stored;
pub mod tenure;

pub use mirror::{Change, Key, Mirror, Piece};
pub use stored::{Stored, high_water_value};

/// Time since boot, stopped processes and suspended machines included: the clock a leader
/// measures its term by, so that a leader that wakes up from a pause knows at once that its
/// term may be over.
pub fn boot_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux lockd
    // supports (since 2.6.39), so the call cannot fail.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// This lockd process, as a candidate for leadership.
#[derive(Clone, Debug)]
pub struct Member {
    pub id: String,
    /// Where followers forward to.
    pub address: String,
}

impl Member {
    /// A member with a fresh random id.
    pub fn new(address: String) -> Member {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
        Member {
            id: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            address,
        }
    }
}

#[doc(hidden)]
pub use {lockd_core as __core, lockd_store as __store};

/// The [`Store`](lockd_store::Store) impl of a store over a key-value service, whose calls
/// are async: `$store` has a `runtime` (a `tokio::runtime::Handle`), `load_async` and
/// `commit_async`; every commit is durable (on the service's replicas) when it returns,
/// `sync` or not, so the writer runs commits off its runtime.
#[macro_export]
macro_rules! blocking_store {
    ($store:ty) => {
        impl $crate::__store::Store for $store {
            fn load(&mut self) -> Result<$crate::__core::Snapshot, $crate::__store::StoreError> {
                let runtime = self.runtime.clone();
                runtime.block_on(self.load_async())
            }

            fn commit_runs_a_runtime(&self) -> bool {
                true
            }

            fn commit(
                &mut self,
                ops: &[$crate::__core::Op],
                _sync: bool,
            ) -> Result<(), $crate::__store::StoreError> {
                if ops.is_empty() {
                    return Ok(());
                }
                let runtime = self.runtime.clone();
                runtime.block_on(self.commit_async(ops))
            }
        }
    };
}
