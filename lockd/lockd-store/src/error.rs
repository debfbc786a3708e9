//! Store errors. A precondition breach means the caller (the core) has a bug; an I/O error
//! means the store's state is unknown. Either way the server stops.

use fencing::{FencingToken, LeaseId, ResourceName};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error(
        "refused a grant of {resource} while the store holds a lease of it (single-holder check)"
    )]
    GrantWhileHeld { resource: ResourceName },
    #[error(
        "refused token {token}: not above the stored high-water {last:?} (monotone-token check)"
    )]
    TokenNotIncreasing {
        token: FencingToken,
        last: Option<FencingToken>,
    },
    #[error("refused removal of lease {lease_id} of {resource}: it is not the stored lease")]
    RemoveNotStored {
        resource: ResourceName,
        lease_id: LeaseId,
    },
    #[error(
        "refused a change of the holds of lease {lease_id} of {resource}: it is not the stored lease"
    )]
    HoldsNotStored {
        resource: ResourceName,
        lease_id: LeaseId,
    },
    #[error(
        "refused to remember a grant or re-entry under request id {request_id:?}: that id is remembered already"
    )]
    RequestRemembered { request_id: String },
    #[error("refused to forget request id {request_id:?}: it is not remembered")]
    ForgetUnknown { request_id: String },
    #[error(
        "refused an atomic op that is empty or holds something other than grants (atomic-set check)"
    )]
    AtomicNotGrants,
    #[error(
        "the data directory {path} is in use by another lockd process (or another program); stop it first"
    )]
    Locked { path: String },
    #[error(
        "the data file {path} was written by an unsupported format version {found}; this lockd reads version {supported}"
    )]
    Version {
        path: String,
        found: u64,
        supported: u64,
    },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("storage I/O failed: {0}")]
    Io(String),
    /// A replicated store (etcd) refused the batch because this lockd no longer leads: the
    /// batch changed nothing, and this lockd must stop deciding.
    #[error("this lockd no longer leads the cluster: {0}")]
    Deposed(String),
    /// A replicated store did not answer in time (no quorum, unreachable): whether the batch
    /// was applied is unknown.
    #[error("the store did not answer in time: {0}")]
    Unavailable(String),
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> StoreError {
        StoreError::Io(e.to_string())
    }
}

macro_rules! redb_errors {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> StoreError {
                StoreError::from(redb::Error::from(e))
            }
        }
    )*};
}

redb_errors!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);
