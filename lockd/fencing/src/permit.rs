//! The names of a semaphore's permits.
//!
//! Permit `k` (1 ..= N) of the semaphore `jobs` is its own lease, with its own token, on the
//! resource `jobs@permit-k`. That name is what the holder renews and releases, and what it
//! presents to a store: a fence keeps one mark per permit, so a permit holder that was paused
//! past its lease is refused once the permit's next holder has written, as for any lock.
//!
//! The names are reserved: lockd lets no Acquire or AcquireAll name one (they are the
//! semaphore's to hand out), and a permit belongs to its semaphore's tenant. Reserved is any
//! name whose last `@permit-` is followed by digits only, leading zeros included, so that no
//! second spelling of a permit can be taken as a lock of its own.

use crate::ResourceName;

/// What separates a semaphore's name from a permit's number.
pub const MARK: &str = "@permit-";

/// The semaphore and the number (as spelled) of a reserved name; `None` for any other name.
pub fn parse(name: &str) -> Option<(&str, &str)> {
    parse_slot(name, MARK)
}

/// Whether `name` is reserved for a semaphore's permit.
pub fn is_reserved(name: &str) -> bool {
    parse(name).is_some()
}

/// The semaphore and permit number of a permit lockd hands out (`k` spelled without leading
/// zeros, 1 or more); `None` for any other name.
pub fn permit_of(name: &str) -> Option<(&str, u32)> {
    slot_of(name, MARK)
}

/// The name of permit `k` of `semaphore`, if it is short enough.
pub fn name(semaphore: &ResourceName, k: u32) -> Option<ResourceName> {
    ResourceName::new(&format!("{semaphore}{MARK}{k}")).ok()
}

/// The owner and the number (as spelled) of `name` if its last `mark` is followed by digits
/// only: the rule of every reserved name (a permit's, a reader's).
pub(crate) fn parse_slot<'a>(name: &'a str, mark: &str) -> Option<(&'a str, &'a str)> {
    let at = name.rfind(mark)?;
    let digits = &name[at + mark.len()..];
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| (&name[..at], digits))
}

/// The owner and number of a slot name lockd hands out: digits without leading zeros, 1 or
/// more, within `u32`.
pub(crate) fn slot_of<'a>(name: &'a str, mark: &str) -> Option<(&'a str, u32)> {
    let (owner, digits) = parse_slot(name, mark)?;
    if digits.starts_with('0') {
        return None;
    }
    Some((owner, digits.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_permit_is_reserved_and_only_the_plain_one_is_handed_out() {
        assert_eq!(parse("jobs@permit-3"), Some(("jobs", "3")));
        assert_eq!(permit_of("jobs@permit-3"), Some(("jobs", 3)));
        assert!(is_reserved("jobs@permit-03"));
        assert_eq!(permit_of("jobs@permit-03"), None);
        assert!(is_reserved("a@permit-1@permit-2"));
        assert_eq!(permit_of("a@permit-1@permit-2"), Some(("a@permit-1", 2)));
        for free in [
            "jobs",
            "jobs@permit-",
            "jobs@permit-3x",
            "jobs@permit3",
            "user@example.com",
            "jobs@permit-1/x",
        ] {
            assert!(!is_reserved(free), "{free}");
            assert_eq!(crate::owner_name(free), free);
        }
        assert_eq!(crate::owner_name("jobs@permit-9"), "jobs");
        assert_eq!(permit_of("jobs@permit-99999999999"), None);
        let jobs = ResourceName::new("jobs").unwrap();
        assert_eq!(name(&jobs, 7).unwrap().as_str(), "jobs@permit-7");
        let long = ResourceName::new(&"s".repeat(crate::RESOURCE_NAME_LEN_MAX)).unwrap();
        assert_eq!(name(&long, 1), None);
    }
}
