//! Message bodies: the few the relay reads, and the ones it writes.
//!
//! Parsers take a whole message (tag and length included, as delimited by [`crate::header`]).
//! Builders append one whole message to a `Vec<u8>`.

use crate::{PROTOCOL_3, WireError};

/// A cursor over a message body.
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    /// The body of a whole tagged message.
    pub fn body(message: &'a [u8]) -> Reader<'a> {
        Reader::new(message.get(5..).unwrap_or_default())
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub fn cstr(&mut self, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::Malformed(what))?;
        let s = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        Ok(s)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        let (&b, rest) = self.rest.split_first().ok_or(WireError::Malformed(what))?;
        self.rest = rest;
        Ok(b)
    }

    pub fn i16(&mut self, what: &'static str) -> Result<i16, WireError> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if self.rest.len() < n {
            return Err(WireError::Malformed(what));
        }
        let (b, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(b)
    }

    pub fn rest(self) -> &'a [u8] {
        self.rest
    }
}

/// ReadyForQuery ('Z'): the transaction status, `I`, `T` or `E`.
pub fn ready_status(message: &[u8]) -> Result<u8, WireError> {
    let mut r = Reader::body(message);
    let s = r.u8("ReadyForQuery")?;
    (r.is_empty() && matches!(s, b'I' | b'T' | b'E'))
        .then_some(s)
        .ok_or(WireError::Malformed("ReadyForQuery"))
}

/// BackendKeyData ('K'): the process id and the secret key.
pub fn backend_key(message: &[u8]) -> Result<(i32, &[u8]), WireError> {
    let mut r = Reader::body(message);
    let pid = r.i32("BackendKeyData")?;
    let key = r.rest();
    (4..=256)
        .contains(&key.len())
        .then_some((pid, key))
        .ok_or(WireError::Malformed("BackendKeyData"))
}

/// DataRow ('D' from the server): the columns, `None` for NULL.
pub fn data_row(message: &[u8]) -> Result<Vec<Option<&[u8]>>, WireError> {
    let mut r = Reader::body(message);
    let n = r.i16("DataRow")?;
    let mut cols = Vec::with_capacity(n.clamp(0, 64) as usize);
    for _ in 0..n {
        let len = r.i32("DataRow")?;
        cols.push(if len < 0 {
            None
        } else {
            Some(r.take(len as usize, "DataRow")?)
        });
    }
    r.is_empty()
        .then_some(cols)
        .ok_or(WireError::Malformed("DataRow"))
}

/// The fields of an ErrorResponse or NoticeResponse that the relay uses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorFields<'a> {
    pub severity: &'a [u8],
    pub code: &'a [u8],
    pub message: &'a [u8],
    pub detail: &'a [u8],
}

pub fn error_fields(message: &[u8]) -> Result<ErrorFields<'_>, WireError> {
    let mut r = Reader::body(message);
    let mut f = ErrorFields::default();
    loop {
        let kind = r.u8("ErrorResponse")?;
        if kind == 0 {
            break;
        }
        let value = r.cstr("ErrorResponse")?;
        match kind {
            b'V' => f.severity = value,
            b'S' if f.severity.is_empty() => f.severity = value,
            b'C' => f.code = value,
            b'M' => f.message = value,
            b'D' => f.detail = value,
            _ => {}
        }
    }
    r.is_empty()
        .then_some(f)
        .ok_or(WireError::Malformed("ErrorResponse"))
}

fn begin(out: &mut Vec<u8>, tag: u8) -> usize {
    out.push(tag);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    at
}

fn finish(out: &mut [u8], at: usize) {
    let len = u32::try_from(out.len() - at).expect("messages we build are small");
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn cstr(out: &mut Vec<u8>, s: &[u8]) {
    // A NUL inside would end the string early on the other side: drop it.
    out.extend(s.iter().copied().filter(|&b| b != 0));
    out.push(0);
}

/// An ErrorResponse (or, with tag b'N', a NoticeResponse).
pub struct ErrorResponse<'a> {
    /// ERROR or FATAL.
    pub severity: &'a str,
    pub code: &'a str,
    pub message: &'a str,
    pub detail: Option<&'a str>,
    pub hint: Option<&'a str>,
}

pub fn error_response(out: &mut Vec<u8>, e: &ErrorResponse<'_>) {
    let at = begin(out, b'E');
    for (kind, value) in [
        (b'S', Some(e.severity)),
        (b'V', Some(e.severity)),
        (b'C', Some(e.code)),
        (b'M', Some(e.message)),
        (b'D', e.detail),
        (b'H', e.hint),
    ] {
        if let Some(v) = value {
            out.push(kind);
            cstr(out, v.as_bytes());
        }
    }
    out.push(0);
    finish(out, at);
}

pub fn ready_for_query(out: &mut Vec<u8>, status: u8) {
    let at = begin(out, b'Z');
    out.push(status);
    finish(out, at);
}

pub fn backend_key_data(out: &mut Vec<u8>, pid: i32, key: &[u8]) {
    let at = begin(out, b'K');
    out.extend_from_slice(&pid.to_be_bytes());
    out.extend_from_slice(key);
    finish(out, at);
}

pub fn query(out: &mut Vec<u8>, text: &[u8]) {
    let at = begin(out, b'Q');
    cstr(out, text);
    finish(out, at);
}

/// Parse with parameter types given by OID (0 = let the server infer).
pub fn parse(out: &mut Vec<u8>, name: &[u8], text: &[u8], types: &[u32]) {
    let at = begin(out, b'P');
    cstr(out, name);
    cstr(out, text);
    out.extend_from_slice(&(types.len() as i16).to_be_bytes());
    for t in types {
        out.extend_from_slice(&t.to_be_bytes());
    }
    finish(out, at);
}

/// Bind with text parameters and text results.
pub fn bind(out: &mut Vec<u8>, portal: &[u8], statement: &[u8], params: &[&[u8]]) {
    let at = begin(out, b'B');
    cstr(out, portal);
    cstr(out, statement);
    out.extend_from_slice(&0i16.to_be_bytes());
    out.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        out.extend_from_slice(&(p.len() as i32).to_be_bytes());
        out.extend_from_slice(p);
    }
    out.extend_from_slice(&0i16.to_be_bytes());
    finish(out, at);
}

pub fn execute(out: &mut Vec<u8>, portal: &[u8], max_rows: i32) {
    let at = begin(out, b'E');
    cstr(out, portal);
    out.extend_from_slice(&max_rows.to_be_bytes());
    finish(out, at);
}

/// Close of a prepared statement (`kind` b'S') or a portal (b'P').
pub fn close(out: &mut Vec<u8>, kind: u8, name: &[u8]) {
    let at = begin(out, b'C');
    out.push(kind);
    cstr(out, name);
    finish(out, at);
}

/// Describe of a prepared statement (`kind` b'S') or a portal (b'P').
pub fn describe(out: &mut Vec<u8>, kind: u8, name: &[u8]) {
    let at = begin(out, b'D');
    out.push(kind);
    cstr(out, name);
    finish(out, at);
}

pub fn sync(out: &mut Vec<u8>) {
    let at = begin(out, b'S');
    finish(out, at);
}

pub fn terminate(out: &mut Vec<u8>) {
    let at = begin(out, b'X');
    finish(out, at);
}

/// An SSLRequest: asks the server to go on in TLS (it answers one byte, `S` or `N`).
pub fn ssl_request(out: &mut Vec<u8>) {
    out.extend_from_slice(&8u32.to_be_bytes());
    out.extend_from_slice(&crate::SSL_REQUEST.to_be_bytes());
}

pub fn cancel_request(out: &mut Vec<u8>, pid: i32, key: &[u8]) {
    let len = 12 + key.len() as u32;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crate::CANCEL_REQUEST.to_be_bytes());
    out.extend_from_slice(&pid.to_be_bytes());
    out.extend_from_slice(key);
}

/// A protocol 3.0 StartupMessage.
pub fn startup(out: &mut Vec<u8>, params: &[(&[u8], &[u8])]) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&PROTOCOL_3.to_be_bytes());
    for (k, v) in params {
        cstr(out, k);
        cstr(out, v);
    }
    out.push(0);
    let len = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_bytes() {
        let mut m = Vec::new();
        query(&mut m, b"SELECT 1");
        assert_eq!(m, b"Q\0\0\0\x0dSELECT 1\0");
        assert_eq!(
            crate::Frontend::decode(b"Q\0\0\0\x08abc"),
            Err(WireError::Malformed("Query"))
        );
        assert_eq!(
            crate::Frontend::decode(b"Q\0\0\0\x09a\0bc"),
            Err(WireError::Malformed("Query"))
        );
    }

    #[test]
    fn parse_bind_execute_bytes() {
        // The messages the relay writes, byte for byte (their decoding is in `frontend`).
        let mut m = Vec::new();
        parse(&mut m, b"s1", b"SELECT $1", &[23]);
        assert_eq!(m, b"P\0\0\0\x17s1\0SELECT $1\0\0\x01\0\0\0\x17");
        let mut b = Vec::new();
        bind(&mut b, b"", b"s1", &[b"42"]);
        assert_eq!(b, b"B\0\0\0\x14\0s1\0\0\0\0\x01\0\0\0\x0242\0\0");
        let mut e = Vec::new();
        execute(&mut e, b"", 0);
        assert_eq!(e, b"E\0\0\0\x09\0\0\0\0\0");
        let mut c = Vec::new();
        close(&mut c, b'S', b"ab");
        assert_eq!(c, b"C\0\0\0\x08Sab\0");
        let mut y = Vec::new();
        sync(&mut y);
        assert_eq!(y, b"S\0\0\0\x04");
    }

    #[test]
    fn server_message_bytes() {
        assert_eq!(ready_status(b"Z\0\0\0\x05T"), Ok(b'T'));
        assert_eq!(
            ready_status(b"Z\0\0\0\x05Q"),
            Err(WireError::Malformed("ReadyForQuery"))
        );
        let k = b"K\0\0\0\x0c\0\0\x30\x39\x01\x02\x03\x04";
        assert_eq!(backend_key(k), Ok((12345, &[1u8, 2, 3, 4][..])));
        let mut out = Vec::new();
        backend_key_data(&mut out, 12345, &[1, 2, 3, 4]);
        assert_eq!(out, k);

        // A DataRow of two columns, 'r1' and NULL.
        let row = b"D\0\0\0\x10\0\x02\0\0\0\x02r1\xff\xff\xff\xff";
        assert_eq!(data_row(row), Ok(vec![Some(&b"r1"[..]), None]));
        assert_eq!(
            data_row(b"D\0\0\0\x0a\0\x01\0\0\0\x09"),
            Err(WireError::Malformed("DataRow"))
        );

        let mut err = Vec::new();
        error_response(
            &mut err,
            &ErrorResponse {
                severity: "ERROR",
                code: "FN001",
                message: "stale",
                detail: Some("d"),
                hint: None,
            },
        );
        assert_eq!(err, b"E\0\0\0\x24SERROR\0VERROR\0CFN001\0Mstale\0Dd\0\0");
        let f = error_fields(&err).unwrap();
        assert_eq!(
            (f.severity, f.code, f.message, f.detail),
            (&b"ERROR"[..], &b"FN001"[..], &b"stale"[..], &b"d"[..])
        );
    }
}
