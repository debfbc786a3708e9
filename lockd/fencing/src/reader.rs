//! The names of a read-write lock's readers.
//!
//! A read-write lock `doc` is held by one writer, whose lease is on `doc` itself, or by
//! readers, each a lease of its own, with its own token, on a reader's slot `doc@read-K`. The
//! slot's name is what a reader renews and releases; the lock's name is what the writer
//! presents to a store. Every token comes from the one counter, so a reader's token is above
//! every write grant before it, and below every one after: a store that keeps the highest
//! write token of `doc` may refuse a read whose token is below it (a write was granted after
//! that reader, so the reader's lease had ended).
//!
//! The names are reserved as a permit's are: lockd lets no Acquire name one, and a reader
//! belongs to its lock's tenant. Reserved is any name whose last `@read-` is followed by
//! digits only, leading zeros included.

use crate::ResourceName;
use crate::permit::{parse_slot, slot_of};

/// What separates a read-write lock's name from a reader's slot number.
pub const MARK: &str = "@read-";

/// Whether `name` is reserved for a reader of a read-write lock.
pub fn is_reserved(name: &str) -> bool {
    parse_slot(name, MARK).is_some()
}

/// The lock and slot number of a reader's name lockd hands out (`k` spelled without leading
/// zeros, 1 or more); `None` for any other name.
pub fn reader_of(name: &str) -> Option<(&str, u32)> {
    slot_of(name, MARK)
}

/// The name of reader slot `k` of `lock`, if it is short enough.
pub fn name(lock: &ResourceName, k: u32) -> Option<ResourceName> {
    ResourceName::new(&format!("{lock}{MARK}{k}")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_reader_is_reserved_and_only_the_plain_one_is_handed_out() {
        assert_eq!(reader_of("doc@read-3"), Some(("doc", 3)));
        assert!(is_reserved("doc@read-03"));
        assert_eq!(reader_of("doc@read-03"), None);
        assert!(crate::is_reserved("doc@read-03"));
        assert_eq!(crate::owner_name("doc@read-12"), "doc");
        assert_eq!(crate::owner_name("a@permit-1@read-2"), "a@permit-1");
        for free in [
            "doc",
            "doc@read-",
            "doc@read-1x",
            "doc@read1",
            "doc@reader-1",
        ] {
            assert!(!is_reserved(free), "{free}");
            assert!(!crate::is_reserved(free), "{free}");
            assert_eq!(crate::owner_name(free), free);
        }
        assert_eq!(reader_of("doc@read-99999999999"), None);
        let doc = ResourceName::new("doc").unwrap();
        assert_eq!(name(&doc, 7).unwrap().as_str(), "doc@read-7");
    }
}
