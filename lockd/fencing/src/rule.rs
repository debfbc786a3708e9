//! The fencing rule, in one place.
//!
//! Invariant 3 of DESIGN.md: once a write with token `t` has been accepted for a resource, no
//! write with a token below `t` may be. Equal tokens are accepted (one holder does many writes);
//! a higher token raises the resource's high-water mark. Every component that enforces fencing
//! (the PostgreSQL function, the HTTP layer, the in-memory pre-check, the verifier) decides with
//! this rule, or with SQL that the tests hold to it.

use crate::FencingToken;

/// What the fence does with a presented token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The token equals the highest accepted one: accept, the mark stays.
    AcceptSame,
    /// The token is above the highest accepted one (or none was accepted yet): accept and raise
    /// the mark to it.
    AcceptRaise,
    /// The token is below the highest accepted one: reject.
    Reject { highest: FencingToken },
}

impl Decision {
    pub fn is_accept(self) -> bool {
        !matches!(self, Decision::Reject { .. })
    }
}

/// Decides a presented token against the highest token accepted so far for its resource.
pub fn check(highest: Option<FencingToken>, presented: FencingToken) -> Decision {
    match highest {
        None => Decision::AcceptRaise,
        Some(h) if presented > h => Decision::AcceptRaise,
        Some(h) if presented == h => Decision::AcceptSame,
        Some(h) => Decision::Reject { highest: h },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    #[test]
    fn lower_rejected_equal_accepted_higher_raises() {
        assert_eq!(check(None, t(1)), Decision::AcceptRaise);
        assert_eq!(check(Some(t(42)), t(43)), Decision::AcceptRaise);
        assert_eq!(check(Some(t(42)), t(42)), Decision::AcceptSame);
        assert_eq!(
            check(Some(t(42)), t(41)),
            Decision::Reject { highest: t(42) }
        );
        assert!(!check(Some(t(2)), t(1)).is_accept());
        assert!(check(Some(t(2)), t(2)).is_accept());
    }
}
