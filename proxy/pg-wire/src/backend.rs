//! What a server sends, decoded into one typed enum (see [`crate::frontend`] for why).
//!
//! DataRow and CopyData can be large: the relay may stream them without decoding, so the
//! framer asks [`Backend::may_stream`] by tag before a whole message is there.

use crate::WireError;
use crate::msg::{self, ErrorFields, Reader};

/// A server message, borrowed from its bytes (tag and length included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend<'a> {
    /// R: an authentication request or its outcome.
    Authentication,
    /// K: the session's process id and cancel key.
    BackendKeyData {
        pid: i32,
        key: &'a [u8],
    },
    /// S: a reported setting and its value.
    ParameterStatus {
        name: &'a [u8],
        value: &'a [u8],
    },
    /// v: the server speaks an older minor protocol version.
    NegotiateProtocolVersion,
    /// Z: ready for the next query; the transaction status (`I`, `T` or `E`).
    ReadyForQuery {
        status: u8,
    },
    ParseComplete,
    BindComplete,
    CloseComplete,
    NoData,
    /// s: Execute stopped at its row limit.
    PortalSuspended,
    /// I: a Query (or Execute) of an empty statement.
    EmptyQueryResponse,
    /// t: a prepared statement's parameter types.
    ParameterDescription,
    /// T: the columns of the rows that follow.
    RowDescription,
    /// D: one row (the bytes; see [`msg::data_row`] for the columns).
    DataRow {
        message: &'a [u8],
    },
    /// C: a statement finished, with its command tag.
    CommandComplete {
        tag: &'a [u8],
    },
    /// E: an error; what follows depends on the protocol (see the relay).
    Error(ErrorFields<'a>),
    /// N: a notice.
    Notice,
    /// A: a NOTIFY from some session.
    Notification,
    /// G, H, W: COPY begins (from the client, to the client, both ways).
    CopyInResponse,
    CopyOutResponse,
    CopyBothResponse,
    /// d, c: COPY TO STDOUT data and its end.
    CopyData,
    CopyDone,
    /// V: a FunctionCall's result.
    FunctionCallResponse,
}

impl<'a> Backend<'a> {
    /// Decodes a whole message. A type a server may not send, or a body that does not match its
    /// type, is an error.
    pub fn decode(message: &'a [u8]) -> Result<Backend<'a>, WireError> {
        let tag = *message.first().ok_or(WireError::Malformed("message"))?;
        let m = match tag {
            b'R' => Backend::Authentication,
            b'K' => {
                let (pid, key) = msg::backend_key(message)?;
                Backend::BackendKeyData { pid, key }
            }
            b'S' => {
                let mut r = Reader::body(message);
                let name = r.cstr("ParameterStatus")?;
                let value = r.cstr("ParameterStatus")?;
                if !r.is_empty() {
                    return Err(WireError::Malformed("ParameterStatus"));
                }
                Backend::ParameterStatus { name, value }
            }
            b'v' => Backend::NegotiateProtocolVersion,
            b'Z' => Backend::ReadyForQuery {
                status: msg::ready_status(message)?,
            },
            b'1' => Backend::ParseComplete,
            b'2' => Backend::BindComplete,
            b'3' => Backend::CloseComplete,
            b'n' => Backend::NoData,
            b's' => Backend::PortalSuspended,
            b'I' => Backend::EmptyQueryResponse,
            b't' => Backend::ParameterDescription,
            b'T' => Backend::RowDescription,
            b'D' => Backend::DataRow { message },
            b'C' => {
                let mut r = Reader::body(message);
                Backend::CommandComplete {
                    tag: r.cstr("CommandComplete")?,
                }
            }
            b'E' => Backend::Error(msg::error_fields(message)?),
            b'N' => Backend::Notice,
            b'A' => Backend::Notification,
            b'G' => Backend::CopyInResponse,
            b'H' => Backend::CopyOutResponse,
            b'W' => Backend::CopyBothResponse,
            b'd' => Backend::CopyData,
            b'c' => Backend::CopyDone,
            b'V' => Backend::FunctionCallResponse,
            _ => return Err(WireError::UnknownMessage(tag)),
        };
        Ok(m)
    }

    /// Whether a message with this tag may be relayed as its bytes come, before it is whole:
    /// the two that carry rows or copy data. (Only the relay knows whether a given one may:
    /// the rows of its own check may not.)
    pub fn may_stream(tag: u8) -> bool {
        matches!(tag, b'D' | b'd')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages_decode_to_their_kind() {
        assert_eq!(
            Backend::decode(b"Z\0\0\0\x05T"),
            Ok(Backend::ReadyForQuery { status: b'T' })
        );
        assert_eq!(
            Backend::decode(b"Z\0\0\0\x05Q"),
            Err(WireError::Malformed("ReadyForQuery"))
        );
        assert_eq!(
            Backend::decode(b"C\0\0\0\x0bCOMMIT\0"),
            Ok(Backend::CommandComplete { tag: b"COMMIT" })
        );
        assert_eq!(
            Backend::decode(b"S\0\0\0\x0ca\0b\0\0\0\0"),
            Err(WireError::Malformed("ParameterStatus"))
        );
        assert_eq!(
            Backend::decode(b"S\0\0\0\x08a\0b\0"),
            Ok(Backend::ParameterStatus {
                name: b"a",
                value: b"b"
            })
        );
        assert_eq!(
            Backend::decode(b"Q\0\0\0\x04"),
            Err(WireError::UnknownMessage(b'Q'))
        );
        assert!(Backend::may_stream(b'D') && !Backend::may_stream(b'C'));
    }
}
