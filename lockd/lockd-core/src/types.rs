//! Small newtypes of the core: time, request ids, holders, waiter ids.
//!
//! Request ids and holders are kept once per lease, a million times over in a big lockd, so
//! they are compact strings: up to 24 bytes are stored inline, without a heap allocation (the
//! SDK's request ids are 22 characters for that reason).

use std::fmt;

use compact_str::CompactString;

use crate::error::InvalidArgument;
use crate::limits::Limits;

/// Milliseconds on the driver's monotonic clock, from an origin of its choosing. The core never
/// reads a clock: every operation is told the time, and time never goes backwards inside the
/// core (an earlier `now` is treated as the latest seen).
pub type Millis = u64;

/// A client-chosen id that makes an Acquire idempotent: a retry with the same id gets the
/// original grant back (invariant 6). Printable ASCII without spaces, bounded length.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(CompactString);

impl RequestId {
    pub fn new(id: &str, limits: &Limits) -> Result<RequestId, InvalidArgument> {
        if id.len() > limits.request_id_len_max {
            return Err(InvalidArgument::RequestIdTooLong {
                len: id.len(),
                max: limits.request_id_len_max,
            });
        }
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidArgument::RequestIdCharacters);
        }
        Ok(RequestId(CompactString::new(id)))
    }

    /// Rebuilds an id read back from the store. Only the alphabet is checked (a member id's
    /// space included, see [`RequestId::member`]): the length limit may have been lowered
    /// since the id was accepted, and a remembered id must stay usable.
    pub fn from_persisted(id: &str) -> Option<RequestId> {
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
            .then(|| RequestId(CompactString::new(id)))
    }

    /// The id of the set a member id belongs to (`"{id} {k}"` gives `id`); `None` for any
    /// other id, which is its own.
    pub(crate) fn set_base(&self) -> Option<RequestId> {
        let (base, _) = self.0.rsplit_once(' ')?;
        Some(RequestId(CompactString::new(base)))
    }

    /// The id under which the `k`th lease of an AcquireAll with this id is remembered: the id
    /// itself for the first, `"{id} {k}"` for the others. A caller's id has no space, so no
    /// caller can name a member id of another request.
    pub(crate) fn member(&self, k: usize) -> RequestId {
        match k {
            0 => self.clone(),
            k => RequestId(compact_str::format_compact!("{} {k}", self.0)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Free text that says who holds a lock (host, process, purpose); shown by Describe, never used
/// for decisions. May be empty.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Holder(CompactString);

impl Holder {
    pub fn new(holder: &str, limits: &Limits) -> Result<Holder, InvalidArgument> {
        if holder.len() > limits.holder_len_max {
            return Err(InvalidArgument::HolderTooLong {
                len: holder.len(),
                max: limits.holder_len_max,
            });
        }
        if holder.chars().any(char::is_control) {
            return Err(InvalidArgument::HolderCharacters);
        }
        Ok(Holder(CompactString::new(holder)))
    }

    /// Rebuilds a holder read back from the store (no limit check, see `RequestId::from_persisted`).
    pub fn from_persisted(holder: &str) -> Holder {
        Holder(CompactString::new(holder))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Who may re-enter a lock: an Acquire that names the owner of the current lease gets that
/// lease back with one more hold. Chosen by the client (an id per process, or per logical
/// owner); with a policy, the server puts the caller's identity before it, so that owners are
/// never shared across identities. Printable ASCII without spaces, bounded length.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(CompactString);

impl Owner {
    pub fn new(owner: &str) -> Result<Owner, InvalidArgument> {
        let max = crate::limits::OWNER_LEN_MAX;
        if owner.len() > max {
            return Err(InvalidArgument::OwnerTooLong {
                len: owner.len(),
                max,
            });
        }
        Owner::from_persisted(owner).ok_or(InvalidArgument::OwnerCharacters)
    }

    /// Rebuilds an owner read back from the store, or made by the server (the identity's name,
    /// `/`, the client's owner): only the alphabet is checked.
    pub fn from_persisted(owner: &str) -> Option<Owner> {
        (!owner.is_empty() && owner.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Owner(CompactString::new(owner)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Names one queued Acquire inside one core instance (not persisted, never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(pub u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_bounded_printable_ascii() {
        let l = Limits::default();
        assert!(RequestId::new("0b6a6f5e-5f1c-4a8e-9d43-1e2c7d2b9a10", &l).is_ok());
        assert_eq!(
            RequestId::new("", &l),
            Err(InvalidArgument::RequestIdCharacters)
        );
        assert_eq!(
            RequestId::new("a b", &l),
            Err(InvalidArgument::RequestIdCharacters)
        );
        assert_eq!(
            RequestId::new("é", &l),
            Err(InvalidArgument::RequestIdCharacters)
        );
        let long = "r".repeat(129);
        assert_eq!(
            RequestId::new(&long, &l),
            Err(InvalidArgument::RequestIdTooLong { len: 129, max: 128 })
        );
    }

    #[test]
    fn owners_are_bounded_printable_ascii() {
        assert!(Owner::new("worker-7f3c").is_ok());
        assert_eq!(Owner::new("").err(), Some(InvalidArgument::OwnerCharacters));
        assert_eq!(
            Owner::new("a b").err(),
            Some(InvalidArgument::OwnerCharacters)
        );
        assert_eq!(
            Owner::new("é").err(),
            Some(InvalidArgument::OwnerCharacters)
        );
        assert!(Owner::new(&"o".repeat(128)).is_ok());
        assert_eq!(
            Owner::new(&"o".repeat(129)).err(),
            Some(InvalidArgument::OwnerTooLong { len: 129, max: 128 })
        );
    }

    #[test]
    fn holders_are_bounded_and_free_of_control_characters() {
        let l = Limits::default();
        assert!(Holder::new("", &l).is_ok());
        assert!(Holder::new("web-3 pid 4711 (nightly report)", &l).is_ok());
        assert_eq!(
            Holder::new("a\nb", &l),
            Err(InvalidArgument::HolderCharacters)
        );
        assert!(Holder::new(&"h".repeat(129), &l).is_err());
    }
}
