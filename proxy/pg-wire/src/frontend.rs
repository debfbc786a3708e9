//! What a client sends after the start-up packet, decoded into one typed enum, so that no code
//! outside this module reads a tag byte (whose meaning depends on the direction: `D` is Describe
//! from a client and DataRow from a server).
//!
//! Only the fields the relay needs are decoded; the message's bytes stay with the caller, who
//! forwards them unchanged.

use crate::WireError;
use crate::msg::Reader;

/// A client message, borrowed from its bytes (tag and length included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frontend<'a> {
    /// Q: a simple query (one or more statements).
    Query {
        text: &'a [u8],
    },
    /// P: prepares `text` as the statement `name` (`""`: the unnamed statement).
    Parse {
        name: &'a [u8],
        text: &'a [u8],
    },
    /// B: binds the statement into the portal (parameters not decoded).
    Bind {
        portal: &'a [u8],
        statement: &'a [u8],
    },
    /// E: runs the portal (`max_rows` 0: all rows).
    Execute {
        portal: &'a [u8],
        max_rows: i32,
    },
    /// D: describes a statement or a portal.
    Describe {
        target: Target,
        name: &'a [u8],
    },
    /// C: closes a statement or a portal.
    Close {
        target: Target,
        name: &'a [u8],
    },
    /// S: ends an extended-protocol batch.
    Sync,
    /// H: asks for the replies so far.
    Flush,
    /// F: calls a function by OID (the large-object API uses it).
    FunctionCall,
    /// d, c, f: COPY FROM STDIN data, its end, or its failure.
    CopyData,
    CopyDone,
    CopyFail,
    /// p: a password, SASL or GSSAPI response (authentication).
    Authentication,
    /// X: the client is leaving.
    Terminate,
}

/// What Describe and Close name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Statement,
    Portal,
}

/// Tag bytes, for building messages and for the framer's streaming rule.
pub mod tag {
    pub const COPY_DATA: u8 = b'd';
}

impl<'a> Frontend<'a> {
    /// Decodes a whole message (as delimited by [`crate::header`]). A message type a client may
    /// not send, or a body that does not match its type, is an error.
    pub fn decode(message: &'a [u8]) -> Result<Frontend<'a>, WireError> {
        let tag = *message.first().ok_or(WireError::Malformed("message"))?;
        let mut r = Reader::body(message);
        let m = match tag {
            b'Q' => {
                let text = r.cstr("Query")?;
                end(r, "Query")?;
                Frontend::Query { text }
            }
            b'P' => {
                let name = r.cstr("Parse")?;
                let text = r.cstr("Parse")?;
                let n = r.i16("Parse")?;
                let n = usize::try_from(n).map_err(|_| WireError::Malformed("Parse"))?;
                r.take(n * 4, "Parse")?;
                end(r, "Parse")?;
                Frontend::Parse { name, text }
            }
            b'B' => {
                let portal = r.cstr("Bind")?;
                let statement = r.cstr("Bind")?;
                Frontend::Bind { portal, statement }
            }
            b'E' => {
                let portal = r.cstr("Execute")?;
                let max_rows = r.i32("Execute")?;
                end(r, "Execute")?;
                Frontend::Execute { portal, max_rows }
            }
            b'D' | b'C' => {
                let what = if tag == b'D' { "Describe" } else { "Close" };
                let target = match r.u8(what)? {
                    b'S' => Target::Statement,
                    b'P' => Target::Portal,
                    _ => return Err(WireError::Malformed(what)),
                };
                let name = r.cstr(what)?;
                end(r, what)?;
                if tag == b'D' {
                    Frontend::Describe { target, name }
                } else {
                    Frontend::Close { target, name }
                }
            }
            b'S' => Frontend::Sync,
            b'H' => Frontend::Flush,
            b'F' => Frontend::FunctionCall,
            b'd' => Frontend::CopyData,
            b'c' => Frontend::CopyDone,
            b'f' => Frontend::CopyFail,
            b'p' => Frontend::Authentication,
            b'X' => Frontend::Terminate,
            _ => return Err(WireError::UnknownMessage(tag)),
        };
        Ok(m)
    }
}

fn end(r: Reader<'_>, what: &'static str) -> Result<(), WireError> {
    r.is_empty().then_some(()).ok_or(WireError::Malformed(what))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg;

    #[test]
    fn client_messages_decode_to_their_kind() {
        let mut m = Vec::new();
        msg::query(&mut m, b"SELECT 1");
        assert_eq!(
            Frontend::decode(&m),
            Ok(Frontend::Query { text: b"SELECT 1" })
        );
        let mut m = Vec::new();
        msg::parse(&mut m, b"s1", b"SELECT $1", &[23]);
        assert_eq!(
            Frontend::decode(&m),
            Ok(Frontend::Parse {
                name: b"s1",
                text: b"SELECT $1"
            })
        );
        let mut bad = m.clone();
        bad[19] = 9;
        assert_eq!(Frontend::decode(&bad), Err(WireError::Malformed("Parse")));
        let mut m = Vec::new();
        msg::bind(&mut m, b"", b"s1", &[b"42"]);
        assert_eq!(
            Frontend::decode(&m),
            Ok(Frontend::Bind {
                portal: b"",
                statement: b"s1"
            })
        );
        let mut m = Vec::new();
        msg::execute(&mut m, b"p", 5);
        assert_eq!(
            Frontend::decode(&m),
            Ok(Frontend::Execute {
                portal: b"p",
                max_rows: 5
            })
        );
        assert_eq!(
            Frontend::decode(b"C\0\0\0\x08Sab\0"),
            Ok(Frontend::Close {
                target: Target::Statement,
                name: b"ab"
            })
        );
        assert_eq!(
            Frontend::decode(b"D\0\0\0\x08Xab\0"),
            Err(WireError::Malformed("Describe"))
        );
        assert_eq!(Frontend::decode(b"S\0\0\0\x04"), Ok(Frontend::Sync));
        assert_eq!(
            Frontend::decode(b"Z\0\0\0\x04"),
            Err(WireError::UnknownMessage(b'Z'))
        );
    }
}
