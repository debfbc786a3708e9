//! Resource names.
//!
//! A resource name says what a lock protects (`inventory:sku-1001`, `cron/nightly-report`). It
//! travels in gRPC requests, SQL settings, HTTP headers, URL paths, environment variables and
//! log lines, so the alphabet is the intersection of what is safe in all of them: ASCII letters
//! and digits and `- _ . : / @`. No whitespace, quotes, backslashes, `%`, or control characters:
//! nothing that needs quoting or escaping anywhere, so a name can never be spliced into SQL or a
//! header in a harmful way even by a careless caller.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// Longest accepted resource name, in bytes. Hierarchical names such as
/// `tenant-42/payments/invoice:2026-11-29:000123` fit comfortably; bounding the length bounds the
/// memory a client can make lockd and the proxy spend per name.
pub const RESOURCE_NAME_LEN_MAX: usize = 256;

/// A validated resource name; cheap to clone (shared, immutable).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceName(Arc<str>);

/// Why a text is not a resource name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceNameError {
    /// The name is empty.
    Empty,
    /// The name is longer than [`RESOURCE_NAME_LEN_MAX`] bytes.
    TooLong { len: usize },
    /// The name holds a character outside the alphabet.
    BadCharacter { position: usize, character: char },
}

impl fmt::Display for ResourceNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const ALLOWED: &str = "ASCII letters, digits and - _ . : / @";
        match self {
            ResourceNameError::Empty => write!(
                f,
                "the resource name is empty; use 1 to {RESOURCE_NAME_LEN_MAX} of: {ALLOWED}"
            ),
            ResourceNameError::TooLong { len } => write!(
                f,
                "the resource name is {len} bytes long; the limit is {RESOURCE_NAME_LEN_MAX} bytes"
            ),
            ResourceNameError::BadCharacter {
                position,
                character,
            } => write!(
                f,
                "the resource name has {character:?} at byte {position}; allowed are {ALLOWED}"
            ),
        }
    }
}

impl std::error::Error for ResourceNameError {}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/' | '@')
}

impl ResourceName {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<ResourceName, ResourceNameError> {
        ResourceName::validate(name)?;
        Ok(ResourceName(Arc::from(name)))
    }

    /// Checks `name` without keeping it (no allocation).
    pub fn validate(name: &str) -> Result<(), ResourceNameError> {
        if name.is_empty() {
            return Err(ResourceNameError::Empty);
        }
        if name.len() > RESOURCE_NAME_LEN_MAX {
            return Err(ResourceNameError::TooLong { len: name.len() });
        }
        if let Some((position, character)) = name.char_indices().find(|&(_, c)| !allowed(c)) {
            return Err(ResourceNameError::BadCharacter {
                position,
                character,
            });
        }
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ResourceName {
    type Err = ResourceNameError;
    fn from_str(s: &str) -> Result<ResourceName, ResourceNameError> {
        ResourceName::new(s)
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for ResourceName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for ResourceName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for ResourceName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ResourceName::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        for ok in [
            "a",
            "inventory:sku-1001",
            "cron/nightly_report",
            "user@host",
            "A.b-C_d:e/f@9",
        ] {
            assert_eq!(ResourceName::new(ok).unwrap().as_str(), ok);
        }
        let longest = "x".repeat(RESOURCE_NAME_LEN_MAX);
        assert!(ResourceName::new(&longest).is_ok());
    }

    #[test]
    fn refuses_everything_else_with_the_reason() {
        assert_eq!(ResourceName::new(""), Err(ResourceNameError::Empty));
        let long = "x".repeat(RESOURCE_NAME_LEN_MAX + 1);
        assert_eq!(
            ResourceName::new(&long),
            Err(ResourceNameError::TooLong { len: 257 })
        );
        for (bad, position, character) in [
            ("a b", 1, ' '),
            ("it's", 2, '\''),
            ("semi;colon", 4, ';'),
            ("new\nline", 3, '\n'),
            ("per%cent", 3, '%'),
            ("ünï", 0, 'ü'),
            ("nul\0", 3, '\0'),
        ] {
            assert_eq!(
                ResourceName::new(bad),
                Err(ResourceNameError::BadCharacter {
                    position,
                    character
                }),
                "{bad:?}"
            );
        }
        let msg = ResourceName::new("a b").unwrap_err().to_string();
        assert!(msg.contains("allowed are"), "{msg}");
    }

    #[test]
    fn serde_validates() {
        assert!(serde_json::from_str::<ResourceName>("\"a b\"").is_err());
        assert_eq!(
            serde_json::from_str::<ResourceName>("\"a:b\"")
                .unwrap()
                .as_str(),
            "a:b"
        );
    }
}
