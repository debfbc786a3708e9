//! Fencing tokens.
//!
//! A token is a positive integer no larger than `i64::MAX`. The upper bound exists because the
//! PostgreSQL fence stores tokens in a `bigint` and HTTP clients in many languages parse JSON
//! numbers as signed 64-bit integers; the lower bound because 0 is used on the wire to mean
//! "no token" and a token of 0 would be indistinguishable from its absence.

use std::fmt;
use std::str::FromStr;

/// A fencing token: strictly larger for every grant lockd ever makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The smallest token lockd issues.
    pub const MIN: FencingToken = FencingToken(1);
    /// The largest representable token (`i64::MAX`, see the module docs).
    pub const MAX: FencingToken = FencingToken(i64::MAX as u64);

    /// Wraps a raw value, or `None` when it is outside `1 ..= i64::MAX`.
    pub const fn new(raw: u64) -> Option<FencingToken> {
        if raw >= 1 && raw <= i64::MAX as u64 {
            Some(FencingToken(raw))
        } else {
            None
        }
    }

    /// The raw value, always in `1 ..= i64::MAX`.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The raw value as the signed integer PostgreSQL stores.
    pub const fn as_i64(self) -> i64 {
        self.0 as i64
    }

    /// The next token, or `None` once the token space is exhausted.
    pub const fn next(self) -> Option<FencingToken> {
        FencingToken::new(self.0 + 1)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why a text is not a fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseTokenError {
    /// Nothing was given.
    Empty,
    /// The text is not a plain decimal number (signs, spaces, hex and exponents are refused).
    NotANumber,
    /// The number is 0, negative, or larger than `i64::MAX`.
    OutOfRange,
}

impl fmt::Display for ParseTokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseTokenError::Empty => f.write_str("the fencing token is empty"),
            ParseTokenError::NotANumber => {
                f.write_str("the fencing token is not a plain decimal number (digits 0-9 only)")
            }
            ParseTokenError::OutOfRange => write!(
                f,
                "the fencing token is out of range: tokens are 1 ..= {}",
                FencingToken::MAX.0
            ),
        }
    }
}

impl std::error::Error for ParseTokenError {}

impl FromStr for FencingToken {
    type Err = ParseTokenError;

    /// Parses the decimal form, strictly: no sign, no whitespace, no leading `+`. A number with
    /// a leading `-` is reported as out of range rather than as garbage, because that is what
    /// the user meant.
    fn from_str(s: &str) -> Result<FencingToken, ParseTokenError> {
        if s.is_empty() {
            return Err(ParseTokenError::Empty);
        }
        let (negative, digits) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseTokenError::NotANumber);
        }
        if negative {
            return Err(ParseTokenError::OutOfRange);
        }
        // Digits only, so the only possible parse error is overflow.
        let raw: u64 = digits.parse().map_err(|_| ParseTokenError::OutOfRange)?;
        FencingToken::new(raw).ok_or(ParseTokenError::OutOfRange)
    }
}

impl serde::Serialize for FencingToken {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for FencingToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = u64::deserialize(d)?;
        FencingToken::new(raw).ok_or_else(|| serde::de::Error::custom(ParseTokenError::OutOfRange))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_valid_range_and_nothing_else() {
        assert_eq!("1".parse(), Ok(FencingToken::MIN));
        assert_eq!("42".parse::<FencingToken>().map(FencingToken::get), Ok(42));
        assert_eq!("9223372036854775807".parse(), Ok(FencingToken::MAX));
        assert_eq!(
            "0".parse::<FencingToken>(),
            Err(ParseTokenError::OutOfRange)
        );
        assert_eq!(
            "-5".parse::<FencingToken>(),
            Err(ParseTokenError::OutOfRange)
        );
        assert_eq!(
            "9223372036854775808".parse::<FencingToken>(),
            Err(ParseTokenError::OutOfRange)
        );
        assert_eq!(
            "99999999999999999999999".parse::<FencingToken>(),
            Err(ParseTokenError::OutOfRange)
        );
        assert_eq!("".parse::<FencingToken>(), Err(ParseTokenError::Empty));
        for garbage in ["+1", " 1", "1 ", "0x10", "1e3", "1.0", "-", "abc", "١"] {
            assert_eq!(
                garbage.parse::<FencingToken>(),
                Err(ParseTokenError::NotANumber),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn next_stops_at_the_top_of_the_range() {
        assert_eq!(FencingToken::MIN.next().map(FencingToken::get), Some(2));
        assert_eq!(FencingToken::MAX.next(), None);
    }

    #[test]
    fn serde_refuses_out_of_range_values() {
        assert_eq!(
            serde_json::to_string(&FencingToken::new(7).unwrap()).unwrap(),
            "7"
        );
        assert!(serde_json::from_str::<FencingToken>("0").is_err());
        assert!(serde_json::from_str::<FencingToken>("9223372036854775808").is_err());
        assert_eq!(
            serde_json::from_str::<FencingToken>("12").unwrap().get(),
            12
        );
    }
}
