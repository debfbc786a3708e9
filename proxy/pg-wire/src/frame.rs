//! Framing: the untagged start-up packets, and the tagged messages that follow them.

use crate::{CANCEL_REQUEST, GSSENC_REQUEST, SSL_REQUEST, WireError};

/// The header of a tagged message: its type byte and its total length on the wire
/// (the tag, the four length bytes and the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub tag: u8,
    pub total: usize,
}

impl Header {
    /// Bytes before the body.
    pub const LEN: usize = 5;
}

/// Reads the header at the start of `buf`, if all five bytes are there. A length below 4 or a
/// message longer than `max` bytes is an error (the caller decides whether a long message of this
/// type may be streamed instead: [`WireError::TooLarge`] carries the length).
pub fn header(buf: &[u8], max: usize) -> Result<Option<Header>, WireError> {
    let Some(head) = buf.get(..Header::LEN) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len < 4 {
        return Err(WireError::LengthTooSmall(len));
    }
    let total = len as usize + 1;
    if total > max {
        return Err(WireError::TooLarge { len: total, max });
    }
    Ok(Some(Header {
        tag: head[0],
        total,
    }))
}

/// The length of the start-up packet at the start of `buf`, once all of it is there.
pub fn startup_len(buf: &[u8], max: usize) -> Result<Option<usize>, WireError> {
    let Some(head) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if len < 8 {
        return Err(WireError::LengthTooSmall(len));
    }
    let len = len as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    Ok((buf.len() >= len).then_some(len))
}

/// A start-up packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup<'a> {
    Ssl,
    GssEnc,
    Cancel {
        pid: i32,
        key: &'a [u8],
    },
    /// A StartupMessage: the protocol version and the parameters (user, database, options...).
    Params {
        version: u32,
        params: Vec<(&'a [u8], &'a [u8])>,
    },
}

/// Parses a whole start-up packet (as delimited by [`startup_len`]).
pub fn parse_startup(packet: &[u8]) -> Result<Startup<'_>, WireError> {
    let code = packet
        .get(4..8)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .ok_or(WireError::Malformed("start-up"))?;
    let rest = &packet[8..];
    match code {
        SSL_REQUEST if rest.is_empty() => Ok(Startup::Ssl),
        GSSENC_REQUEST if rest.is_empty() => Ok(Startup::GssEnc),
        CANCEL_REQUEST if rest.len() >= 8 && rest.len() <= 260 => Ok(Startup::Cancel {
            pid: i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]),
            key: &rest[4..],
        }),
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => Err(WireError::Malformed("start-up")),
        version => {
            let (major, minor) = ((version >> 16) as u16, version as u16);
            if major != 3 {
                return Err(WireError::UnsupportedVersion { major, minor });
            }
            let mut params = Vec::new();
            let mut r = crate::msg::Reader::new(rest);
            loop {
                let name = r.cstr("start-up")?;
                if name.is_empty() {
                    break;
                }
                let value = r.cstr("start-up")?;
                params.push((name, value));
            }
            if !r.is_empty() {
                return Err(WireError::Malformed("start-up"));
            }
            Ok(Startup::Params { version, params })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg;

    #[test]
    fn headers_need_five_bytes_and_a_sane_length() {
        assert_eq!(header(b"Q\0\0", 100), Ok(None));
        assert_eq!(
            header(b"Q\0\0\0\x09abcd", 100),
            Ok(Some(Header {
                tag: b'Q',
                total: 10
            }))
        );
        assert_eq!(
            header(b"Q\0\0\0\x03", 100),
            Err(WireError::LengthTooSmall(3))
        );
        assert_eq!(
            header(b"Q\0\0\x01\0", 100),
            Err(WireError::TooLarge { len: 257, max: 100 })
        );
    }

    #[test]
    fn startup_packets_from_bytes() {
        // psql's SSLRequest, byte for byte.
        let ssl = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
        assert_eq!(startup_len(&ssl, 1000), Ok(Some(8)));
        assert_eq!(parse_startup(&ssl), Ok(Startup::Ssl));
        let gss = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];
        assert_eq!(parse_startup(&gss), Ok(Startup::GssEnc));
        let cancel = [
            0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 0, 0, 0x30, 0x39, 1, 2, 3, 4,
        ];
        assert_eq!(
            parse_startup(&cancel),
            Ok(Startup::Cancel {
                pid: 12345,
                key: &[1, 2, 3, 4]
            })
        );
        let mut start = Vec::new();
        msg::startup(
            &mut start,
            &[(b"user", b"app"), (b"options", b"-c fencing.token=7")],
        );
        assert_eq!(&start[4..8], &[0, 3, 0, 0]);
        assert_eq!(startup_len(&start, 1000), Ok(Some(start.len())));
        assert_eq!(startup_len(&start[..start.len() - 1], 1000), Ok(None));
        match parse_startup(&start).unwrap() {
            Startup::Params { version, params } => {
                assert_eq!(version, crate::PROTOCOL_3);
                assert_eq!(params[1], (&b"options"[..], &b"-c fencing.token=7"[..]));
            }
            other => panic!("{other:?}"),
        }
        let v2 = [0, 0, 0, 9, 0, 2, 0, 0, 0];
        assert_eq!(
            parse_startup(&v2),
            Err(WireError::UnsupportedVersion { major: 2, minor: 0 })
        );
        assert_eq!(
            startup_len(&[0, 0, 0, 7], 100),
            Err(WireError::LengthTooSmall(7))
        );
        // A parameter list without its final NUL.
        let cut = [0, 0, 0, 12, 0, 3, 0, 0, b'u', 0, b'x', 0];
        assert_eq!(parse_startup(&cut), Err(WireError::Malformed("start-up")));
    }
}
