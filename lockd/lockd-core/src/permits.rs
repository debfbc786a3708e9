//! The names of a semaphore's permits.
//!
//! Permit `k` (1 ..= N) of the semaphore `jobs` is its own lease, with its own token, on the
//! resource `jobs@permit-k`. That name is what the holder renews and releases, and what it
//! presents to a store: a fence keeps one mark per permit, so a permit holder that was paused
//! past its lease is refused once the permit's next holder has written, as for any lock.
//!
//! The names are reserved: no Acquire or AcquireAll may name one (they are the semaphore's to
//! hand out), and a permit belongs to its semaphore's tenant. Reserved is any name whose last
//! `@permit-` is followed by digits only, leading zeros included, so that no second spelling
//! of a permit can be taken as a lock of its own.

use fencing::{RESOURCE_NAME_LEN_MAX, ResourceName};

use crate::error::InvalidArgument;

/// What separates a semaphore's name from a permit's number.
pub const MARK: &str = "@permit-";

/// The semaphore and the number (as spelled) of a reserved name; `None` for any other name.
pub fn parse(name: &str) -> Option<(&str, &str)> {
    let at = name.rfind(MARK)?;
    let digits = &name[at + MARK.len()..];
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| (&name[..at], digits))
}

/// Whether `name` is reserved for a semaphore's permit.
pub fn is_reserved(name: &str) -> bool {
    parse(name).is_some()
}

/// The name whose tenant owns `name`: its semaphore's for a permit, else the name itself.
pub fn owner_name(name: &str) -> &str {
    parse(name).map_or(name, |(semaphore, _)| semaphore)
}

/// The semaphore and permit number of a permit lockd hands out (`k` spelled without leading
/// zeros, 1 or more); `None` for any other name.
pub fn permit_of(name: &str) -> Option<(&str, u32)> {
    let (semaphore, digits) = parse(name)?;
    if digits.starts_with('0') {
        return None;
    }
    Some((semaphore, digits.parse().ok()?))
}

/// The name of permit `k` of `semaphore`.
pub fn name(semaphore: &ResourceName, k: u32) -> ResourceName {
    ResourceName::new(&format!("{semaphore}{MARK}{k}"))
        .expect("checked by `check`: every permit's name is valid")
}

/// Checks that `semaphore` may have `permits` permits: 1 ..= `limits::PERMITS_MAX`, and a name
/// short enough for its longest permit name.
pub fn check(semaphore: &ResourceName, permits: u32) -> Result<(), InvalidArgument> {
    let max = crate::limits::PERMITS_MAX;
    if permits == 0 || permits > max {
        return Err(InvalidArgument::Permits {
            asked: permits,
            max,
        });
    }
    let longest = semaphore.as_str().len() + MARK.len() + permits.to_string().len();
    if longest > RESOURCE_NAME_LEN_MAX {
        return Err(InvalidArgument::SemaphoreNameTooLong {
            resource: semaphore.clone(),
            max: RESOURCE_NAME_LEN_MAX - MARK.len() - permits.to_string().len(),
        });
    }
    Ok(())
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
            assert_eq!(owner_name(free), free);
        }
        assert_eq!(owner_name("jobs@permit-9"), "jobs");
        assert_eq!(permit_of("jobs@permit-99999999999"), None);
    }

    #[test]
    fn a_semaphore_name_leaves_room_for_its_longest_permit() {
        let max = crate::limits::PERMITS_MAX;
        let short = ResourceName::new("jobs").unwrap();
        assert!(check(&short, 1).is_ok());
        assert!(check(&short, max).is_ok());
        assert_eq!(
            check(&short, 0),
            Err(InvalidArgument::Permits { asked: 0, max })
        );
        assert!(check(&short, max + 1).is_err());
        let fits = ResourceName::new(&"s".repeat(RESOURCE_NAME_LEN_MAX - MARK.len() - 1)).unwrap();
        assert!(check(&fits, 9).is_ok());
        assert_eq!(name(&fits, 9).as_str().len(), RESOURCE_NAME_LEN_MAX);
        assert!(matches!(
            check(&fits, 10),
            Err(InvalidArgument::SemaphoreNameTooLong { .. })
        ));
    }
}
