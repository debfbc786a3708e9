//! HTTP/1.1 framing for the relay (RFC 9112): heads parsed in place with httparse and written
//! on as bytes, with the hop-by-hop headers left out and the forwarding headers added; chunked
//! bodies decoded and encoded again, so that both hops agree where every message ends.
//!
//! No allocation per request except the head written on (a buffer the connection reuses).
//! Everything here is synchronous and pure: the connection loop in `relay` does the I/O.

use std::net::SocketAddr;
use std::ops::Range;

use bytes::{Buf, BytesMut};
use http::Method;

/// Largest request or response head (request line and headers), bytes.
pub(crate) const HEAD_MAX: usize = 64 * 1024;
/// Most header fields in one head.
pub(crate) const HEADERS_MAX: usize = 100;
/// Longest chunk-size line (with extensions), bytes.
const CHUNK_LINE_MAX: usize = 4096;
/// Largest trailer section of a chunked body (dropped), bytes.
const TRAILERS_MAX: usize = 16 * 1024;

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes (responses only).
    UntilClose,
}

/// Why a request head is refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reject {
    /// Malformed: 400.
    Bad(String),
    /// Longer than [`HEAD_MAX`] or more than [`HEADERS_MAX`] fields: 431.
    TooLarge,
    /// Well formed but not relayed (CONNECT, a transfer coding other than chunked): 501.
    NotImplemented(String),
}

/// A request head, checked, and written on into the caller's buffer.
#[derive(Debug)]
pub(crate) struct Request {
    /// Bytes of the head in the input.
    pub head_len: usize,
    pub method: Method,
    /// The path (without the query) in the input; empty for `*` and for an absolute-form
    /// target without a path (both mean `/` to the routes).
    pub path: Range<usize>,
    /// The path as the listener's reading reads it, when that differs from the input
    /// (`crate::path`): the one the routes judge (and, spelled for that reading, the one the
    /// upstream receives).
    pub normalized: Option<String>,
    /// The `Fencing-Token` and `Fencing-Resource` values in the input, and how many of each
    /// there were.
    pub token: Option<Range<usize>>,
    pub tokens: u8,
    pub resource: Option<Range<usize>>,
    pub resources: u8,
    /// The WebDAV `Destination` (COPY, MOVE: a second path the upstream writes), and how many
    /// there were.
    pub destination: Option<Range<usize>>,
    pub destinations: u8,
    /// The first method override header (`X-HTTP-Method-Override`, `X-HTTP-Method`,
    /// `X-Method-Override`: a method some stacks take instead of the request's), and how many
    /// there were of all three.
    pub method_override: Option<Range<usize>>,
    pub method_overrides: u8,
    pub framing: Framing,
    /// The client lets the connection stay open after this exchange.
    pub keep_alive: bool,
    /// HTTP/1.0 client (no chunked responses, closed after the exchange).
    pub http10: bool,
}

/// What a request names besides its method and path that may make an upstream write elsewhere
/// or otherwise: each header's bytes, and how many there were.
#[derive(Clone, Copy, Default)]
pub(crate) struct Named<'b> {
    pub destination: Option<(&'b [u8], u8)>,
    pub method_override: Option<(&'b [u8], u8)>,
}

impl Request {
    /// The headers of [`Named`], in `input` (the buffer the head was parsed from).
    pub(crate) fn named_in<'b>(&self, input: &'b [u8]) -> Named<'b> {
        let at = |r: &Option<Range<usize>>, n: u8| r.clone().map(|r| (&input[r], n));
        Named {
            destination: at(&self.destination, self.destinations),
            method_override: at(&self.method_override, self.method_overrides),
        }
    }
}

/// What the request head towards the upstream needs besides the client's head.
pub(crate) struct Context<'a> {
    /// Path prefix of the upstream URL (no trailing `/`), or empty.
    pub prefix: &'a str,
    /// `Host` for a request that has none.
    pub host: &'a str,
    /// The client's address, as it goes into the forwarding headers.
    pub peer: &'a Peer,
    /// How the upstream reads paths.
    pub reading: crate::path::PathReading,
}

/// A client's IP address as text, made once per connection.
#[derive(Debug)]
pub(crate) struct Peer {
    ip: String,
    ipv6: bool,
}

impl Peer {
    pub(crate) fn new(addr: SocketAddr) -> Peer {
        Peer {
            ip: addr.ip().to_string(),
            ipv6: addr.is_ipv6(),
        }
    }
}

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether header `name` is `wanted`, ignoring case and reading `_` as `-`: CGI and WSGI
/// servers turn both into `_` (`HTTP_X_HTTP_METHOD_OVERRIDE`), so to them the two spellings
/// are one header.
fn is_named(name: &str, wanted: &str) -> bool {
    let dash = |b: u8| {
        if b == b'_' {
            b'-'
        } else {
            b.to_ascii_lowercase()
        }
    };
    name.len() == wanted.len()
        && name
            .bytes()
            .zip(wanted.bytes())
            .all(|(a, b)| dash(a) == dash(b))
}

fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

fn offset(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

fn trim(v: &[u8]) -> &[u8] {
    v.trim_ascii()
}

/// The `Connection` header's options: whether it says `close` / `keep-alive`, and the other
/// names in it (headers to drop as hop-by-hop).
#[derive(Default)]
struct ConnectionOptions<'b> {
    close: bool,
    keep_alive: bool,
    named: Vec<&'b [u8]>,
}

impl<'b> ConnectionOptions<'b> {
    fn from_headers(headers: &[httparse::Header<'b>]) -> ConnectionOptions<'b> {
        let mut o = ConnectionOptions::default();
        for h in headers {
            if !h.name.eq_ignore_ascii_case("connection") {
                continue;
            }
            for token in h.value.split(|&b| b == b',').map(trim) {
                if token.eq_ignore_ascii_case(b"close") {
                    o.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    o.keep_alive = true;
                } else if !token.is_empty() {
                    o.named.push(token);
                }
            }
        }
        o
    }

    fn names(&self, name: &str) -> bool {
        self.named
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name.as_bytes()))
    }
}

/// Content-Length and Transfer-Encoding of a head. `Err` is the reason it is malformed.
fn body_headers(headers: &[httparse::Header<'_>]) -> Result<(Option<u64>, bool), String> {
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut coded = false;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = trim(h.value);
            if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
                return Err(format!(
                    "Content-Length {:?} is not a decimal length",
                    String::from_utf8_lossy(h.value)
                ));
            }
            let n: u64 = std::str::from_utf8(v)
                .expect("digits")
                .parse()
                .expect("at most 19 digits");
            if length.is_some_and(|l| l != n) {
                return Err("two different Content-Length values".into());
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            for coding in h.value.split(|&b| b == b',').map(trim) {
                if coded && chunked {
                    // A coding after chunked: the message cannot be delimited.
                    return Err("a transfer coding after chunked".into());
                }
                coded = true;
                chunked = coding.eq_ignore_ascii_case(b"chunked");
            }
        }
    }
    if coded && length.is_some() {
        return Err("both Transfer-Encoding and Content-Length".into());
    }
    if coded && !chunked {
        return Err("a Transfer-Encoding that does not end in chunked".into());
    }
    Ok((length, chunked))
}

/// Whether `buf` may hold a whole head: it has a blank line (`\n\n` or `\n\r\n`) at or
/// after `from` (less the bytes a line end spans). Parsing is tried only then, so that a head
/// arriving a byte at a time costs linear work, not a parse of everything so far per byte.
pub(crate) fn may_be_complete(buf: &[u8], from: usize) -> bool {
    let tail = &buf[from.saturating_sub(2).min(buf.len())..];
    tail.windows(2).any(|w| w == b"\n\n") || tail.windows(3).any(|w| w == b"\n\r\n")
}

/// Parses the request head at the start of `buf` and writes the head to send upstream into
/// `out` (cleared first). `Ok(None)`: the head is not complete yet.
pub(crate) fn request(
    buf: &[u8],
    ctx: &Context<'_>,
    out: &mut Vec<u8>,
) -> Result<Option<Request>, Reject> {
    let mut fields = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut fields);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= HEAD_MAX => return Err(Reject::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Reject::TooLarge),
        Err(e) => return Err(Reject::Bad(format!("malformed request head: {e}"))),
    };
    if head_len > HEAD_MAX {
        return Err(Reject::TooLarge);
    }
    let method_text = req.method.expect("complete");
    let target = req.path.expect("complete");
    let http10 = req.version.expect("complete") == 0;
    let headers: &[httparse::Header<'_>] = req.headers;
    let method = Method::from_bytes(method_text.as_bytes())
        .map_err(|_| Reject::Bad(format!("method {method_text:?}")))?;
    if method == Method::CONNECT {
        return Err(Reject::NotImplemented(
            "CONNECT (tunnels) is not relayed".into(),
        ));
    }

    // The target: origin form (`/p?q`), `*`, or absolute form (`http://host/p?q`), whose
    // authority then replaces the Host header (RFC 9112 §3.2.2).
    let (origin, authority): (&str, Option<&str>) = if target.starts_with('/') {
        (target, None)
    } else if target == "*" {
        ("*", None)
    } else if let Some(rest) = strip_scheme(target) {
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        if end == 0 {
            return Err(Reject::Bad(format!(
                "request target {target:?} has no host"
            )));
        }
        (&rest[end..], Some(&rest[..end]))
    } else {
        return Err(Reject::Bad(format!("request target {target:?}")));
    };
    let path_text = match origin.find('?') {
        Some(q) => &origin[..q],
        None => origin,
    };
    let path = if path_text == "*" {
        0..0
    } else {
        offset(buf, path_text.as_bytes())
    };
    let normal = if path_text.starts_with('/') {
        crate::path::normalize(path_text, ctx.reading).map_err(|e| Reject::Bad(e.0))?
    } else {
        None
    };

    let (length, chunked) = body_headers(headers).map_err(Reject::Bad)?;
    let framing = if chunked {
        if http10 {
            return Err(Reject::Bad("chunked body from an HTTP/1.0 client".into()));
        }
        Framing::Chunked
    } else {
        match length {
            Some(0) | None => Framing::Empty,
            Some(n) => Framing::Length(n),
        }
    };
    let connection = ConnectionOptions::from_headers(headers);
    let keep_alive = !http10 && !connection.close;

    // The head towards the upstream.
    out.clear();
    out.extend_from_slice(method_text.as_bytes());
    out.push(b' ');
    if origin == "*" {
        out.push(b'*');
    } else {
        out.extend_from_slice(ctx.prefix.as_bytes());
        if !origin.starts_with('/') {
            out.push(b'/');
        }
        match &normal {
            // The path as read, then the query as it came.
            Some(n) => {
                out.extend_from_slice(n.sent.as_ref().unwrap_or(&n.judged).as_bytes());
                out.extend_from_slice(&origin.as_bytes()[path_text.len()..]);
            }
            None => out.extend_from_slice(origin.as_bytes()),
        }
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut host: Option<&[u8]> = authority.map(str::as_bytes);
    let mut xff: Option<&[u8]> = None;
    let mut xff_more = Vec::new();
    let mut forwarded: Option<&[u8]> = None;
    let mut forwarded_more = Vec::new();
    let (mut token, mut tokens, mut resource, mut resources) = (None, 0u8, None, 0u8);
    let (mut destination, mut destinations) = (None, 0u8);
    let (mut method_override, mut method_overrides) = (None, 0u8);
    for h in headers {
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            if authority.is_some() {
                continue;
            }
            if host.is_some() {
                return Err(Reject::Bad("more than one Host header".into()));
            }
            host = Some(h.value);
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            match xff {
                None => xff = Some(h.value),
                Some(_) => xff_more.push(h.value),
            }
            continue;
        } else if name.eq_ignore_ascii_case("forwarded") {
            match forwarded {
                None => forwarded = Some(h.value),
                Some(_) => forwarded_more.push(h.value),
            }
            continue;
        } else if is_named(name, fencing::wire::HTTP_HEADER_TOKEN) {
            tokens = tokens.saturating_add(1);
            token.get_or_insert_with(|| offset(buf, h.value));
            // Judged here; named in `Connection`, it was meant for this hop only.
            if connection.names(name) {
                continue;
            }
        } else if is_named(name, fencing::wire::HTTP_HEADER_RESOURCE) {
            resources = resources.saturating_add(1);
            resource.get_or_insert_with(|| offset(buf, h.value));
            if connection.names(name) {
                continue;
            }
        } else if is_named(name, "destination") {
            destinations = destinations.saturating_add(1);
            destination.get_or_insert_with(|| offset(buf, h.value));
        } else if [
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
        ]
        .iter()
        .any(|o| is_named(name, o))
        {
            method_overrides = method_overrides.saturating_add(1);
            method_override.get_or_insert_with(|| offset(buf, h.value));
        } else if name.eq_ignore_ascii_case("content-length")
            || is_hop_by_hop(name)
            || connection.names(name)
            // Paths a client could name to stacks that route by them (Symfony, IIS).
            || is_named(name, "x-original-url")
            || is_named(name, "x-rewrite-url")
        {
            continue;
        }
        header(out, name.as_bytes(), h.value);
    }
    if host.is_none() {
        header(out, b"host", ctx.host.as_bytes());
    } else if let Some(a) = authority {
        header(out, b"host", a.as_bytes());
    }
    let ip = ctx.peer.ip.as_bytes();
    // X-Forwarded-For and Forwarded: the earlier hops' values (all fields, in order), then ours.
    out.extend_from_slice(b"x-forwarded-for: ");
    for v in xff.into_iter().chain(xff_more) {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(ip);
    out.extend_from_slice(b"\r\nforwarded: ");
    for v in forwarded.into_iter().chain(forwarded_more) {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(b"for=");
    if ctx.peer.ipv6 {
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(ip);
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(ip);
    }
    out.extend_from_slice(b";proto=http");
    if let Some(h) = host.filter(|h| h.iter().all(|&b| b.is_ascii_graphic() && b != b'"')) {
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(h);
        out.push(b'"');
    }
    out.extend_from_slice(b"\r\n");
    match framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_display(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Empty | Framing::UntilClose => {}
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some(Request {
        head_len,
        method,
        path,
        normalized: normal.map(|n| n.judged),
        token,
        tokens,
        resource,
        resources,
        destination,
        destinations,
        method_override,
        method_overrides,
        framing,
        keep_alive,
        http10,
    }))
}

fn strip_scheme(target: &str) -> Option<&str> {
    let (scheme, rest) = target.split_once("://")?;
    (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")).then_some(rest)
}

fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn push_display(out: &mut Vec<u8>, v: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, "{v}");
}

/// A response head from the upstream, checked.
#[derive(Debug)]
pub(crate) struct Response {
    pub head_len: usize,
    pub status: u16,
    /// How its body is delimited on the upstream connection.
    pub framing: Framing,
    /// The upstream lets its connection stay open after this response.
    pub keep_alive: bool,
    /// The client connection closes after this response (`Connection: close` was written).
    pub closing: bool,
}

/// What the client side decides about the response head it gets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResponseTo {
    /// The request was HEAD (the response has no body whatever its headers say).
    pub head_request: bool,
    /// The client speaks HTTP/1.0 (no chunked coding; the connection closes after).
    pub http10: bool,
    /// The client connection closes after this response (`Connection: close` is sent).
    pub closing: bool,
}

/// Parses the response head at the start of `buf`. For a final response (2xx-5xx) writes the
/// head to send to the client into `out` (cleared first); an interim one (1xx) is left to the
/// caller. `Ok(None)`: not complete yet. `Err`: why the upstream's answer cannot be relayed.
pub(crate) fn response(
    buf: &[u8],
    to: ResponseTo,
    out: &mut Vec<u8>,
) -> Result<Option<Response>, String> {
    let mut fields = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut resp = httparse::Response::new(&mut fields);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= HEAD_MAX => {
            return Err(format!("a response head longer than {HEAD_MAX} bytes"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("a malformed response head: {e}")),
    };
    let status = resp.code.expect("complete");
    let http10 = resp.version.expect("complete") == 0;
    let headers: &[httparse::Header<'_>] = resp.headers;
    let connection = ConnectionOptions::from_headers(headers);
    let keep_alive = if http10 {
        connection.keep_alive && !connection.close
    } else {
        !connection.close
    };
    if status == 101 {
        return Err("101 Switching Protocols (upgrades are not relayed)".into());
    }
    if status < 200 {
        return Ok(Some(Response {
            head_len,
            status,
            framing: Framing::Empty,
            keep_alive,
            closing: to.closing,
        }));
    }
    let (length, chunked) = body_headers(headers)?;
    let framing = if to.head_request || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        Framing::Chunked
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    // Towards the client: chunked stays chunked for HTTP/1.1; an HTTP/1.0 client gets the
    // decoded bytes, delimited by the close.
    let bodyless = framing == Framing::Empty;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_display(out, status);
    out.push(b' ');
    out.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in headers {
        let name = h.name;
        // A bodyless response keeps its Content-Length (of the representation, for HEAD and
        // 304); otherwise the framing below replaces it.
        if (name.eq_ignore_ascii_case("content-length") && !bodyless)
            || is_hop_by_hop(name)
            || connection.names(name)
        {
            continue;
        }
        header(out, name.as_bytes(), h.value);
    }
    match framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_display(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked if !to.http10 => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        _ => {}
    }
    let closing = to.closing || closes_client(framing, to.http10);
    if closing {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some(Response {
        head_len,
        status,
        framing,
        keep_alive,
        closing,
    }))
}

/// The client connection must close after a response with this framing.
fn closes_client(framing: Framing, http10: bool) -> bool {
    framing == Framing::UntilClose || (framing == Framing::Chunked && http10)
}

/// A decoder of the chunked coding, fed from the front of a buffer.
#[derive(Debug, Default)]
pub(crate) struct Chunked {
    state: ChunkState,
    /// Bytes of the current size line or of the trailers so far.
    seen: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading the hexadecimal size; `value` so far, whether a digit was seen.
    #[default]
    SizeStart,
    Size {
        value: u64,
    },
    /// After the size: extensions or whitespace up to CR.
    Extension {
        value: u64,
    },
    SizeLf {
        value: u64,
    },
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// In the trailer section: at the start of a line.
    TrailerLineStart,
    TrailerLine,
    TrailerLineLf,
    EndLf,
    Done,
}

/// What [`Chunked::decode`] found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// The first `n` bytes of the buffer are body data (the caller takes them).
    Data(usize),
    /// The buffer is used up; more input is needed.
    Need,
    /// The body ended (last chunk and trailers consumed).
    End,
}

impl Chunked {
    /// Consumes framing bytes from the front of `buf` until data, the end, or the end of the
    /// buffer. Data bytes are left in `buf` for the caller to take (and report with
    /// [`Chunked::took`]).
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, &'static str> {
        loop {
            if let ChunkState::Data { left } = self.state {
                if buf.is_empty() {
                    return Ok(Decoded::Need);
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                return Ok(Decoded::Data(n));
            }
            if self.state == ChunkState::Done {
                return Ok(Decoded::End);
            }
            let Some(&b) = buf.first() else {
                return Ok(Decoded::Need);
            };
            buf.advance(1);
            self.seen += 1;
            self.state = match self.state {
                ChunkState::SizeStart => match hex(b) {
                    Some(d) => ChunkState::Size { value: d },
                    None => return Err("a chunk size is not hexadecimal"),
                },
                ChunkState::Size { value } => match hex(b) {
                    Some(d) => {
                        if value >> 60 != 0 {
                            return Err("a chunk size is too large");
                        }
                        ChunkState::Size {
                            value: value << 4 | d,
                        }
                    }
                    None if b == b'\r' => ChunkState::SizeLf { value },
                    None if b == b';' || b == b' ' || b == b'\t' => ChunkState::Extension { value },
                    None => return Err("a chunk size is not hexadecimal"),
                },
                ChunkState::Extension { value } => match b {
                    b'\r' => ChunkState::SizeLf { value },
                    b'\n' => return Err("a chunk line ends without CR"),
                    _ => ChunkState::Extension { value },
                },
                ChunkState::SizeLf { value } => {
                    if b != b'\n' {
                        return Err("a chunk line has CR without LF");
                    }
                    self.seen = 0;
                    if value == 0 {
                        ChunkState::TrailerLineStart
                    } else {
                        ChunkState::Data { left: value }
                    }
                }
                ChunkState::DataCr => match b {
                    b'\r' => ChunkState::DataLf,
                    _ => return Err("chunk data longer than its size"),
                },
                ChunkState::DataLf => match b {
                    b'\n' => {
                        self.seen = 0;
                        ChunkState::SizeStart
                    }
                    _ => return Err("chunk data longer than its size"),
                },
                ChunkState::TrailerLineStart => match b {
                    b'\r' => ChunkState::EndLf,
                    _ => ChunkState::TrailerLine,
                },
                ChunkState::TrailerLine => match b {
                    b'\r' => ChunkState::TrailerLineLf,
                    _ => ChunkState::TrailerLine,
                },
                ChunkState::TrailerLineLf => match b {
                    b'\n' => ChunkState::TrailerLineStart,
                    _ => return Err("a trailer line has CR without LF"),
                },
                ChunkState::EndLf => match b {
                    b'\n' => ChunkState::Done,
                    _ => return Err("the last chunk has CR without LF"),
                },
                ChunkState::Data { .. } | ChunkState::Done => unreachable!("handled above"),
            };
            let limit = match self.state {
                ChunkState::TrailerLineStart
                | ChunkState::TrailerLine
                | ChunkState::TrailerLineLf
                | ChunkState::EndLf => TRAILERS_MAX,
                _ => CHUNK_LINE_MAX,
            };
            if self.seen > limit {
                return Err("a chunk line or the trailers are too long");
            }
        }
    }

    /// The caller took `n` data bytes that [`Chunked::decode`] reported.
    pub(crate) fn took(&mut self, n: usize) {
        if let ChunkState::Data { left } = self.state {
            let left = left - n as u64;
            self.state = if left == 0 {
                ChunkState::DataCr
            } else {
                ChunkState::Data { left }
            };
        }
    }
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

/// Appends one chunk's framing and data.
pub(crate) fn encode_chunk(out: &mut Vec<u8>, data: &[u8]) {
    use std::io::Write;
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk, with no trailers.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context<'static> {
        static PEER: std::sync::LazyLock<Peer> =
            std::sync::LazyLock::new(|| Peer::new("192.0.2.7:5555".parse().unwrap()));
        Context {
            prefix: "",
            host: "up:8080",
            peer: &PEER,
            reading: crate::path::PathReading::Strict,
        }
    }

    fn upstream_head(raw: &str) -> (Request, String) {
        let mut out = Vec::new();
        let r = request(raw.as_bytes(), &ctx(), &mut out)
            .expect("accepted")
            .expect("complete");
        (r, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_request_head_goes_on_without_hop_by_hop_headers_and_with_forwarding_headers() {
        let raw = "PUT /inventory/sku-1?x=1 HTTP/1.1\r\nHost: shop.example\r\n\
                   Connection: keep-alive, X-Secret-Hop\r\nKeep-Alive: timeout=5\r\n\
                   X-Secret-Hop: 1\r\nTE: trailers\r\nUpgrade: websocket\r\n\
                   X-Forwarded-For: 10.0.0.1\r\nFencing-Token: 42\r\n\
                   Fencing-Resource: inventory:sku-1\r\nContent-Length: 7\r\n\r\ncount=7";
        let (r, head) = upstream_head(raw);
        assert_eq!(
            head,
            "PUT /inventory/sku-1?x=1 HTTP/1.1\r\nHost: shop.example\r\nFencing-Token: 42\r\n\
             Fencing-Resource: inventory:sku-1\r\nx-forwarded-for: 10.0.0.1, 192.0.2.7\r\n\
             forwarded: for=192.0.2.7;proto=http;host=\"shop.example\"\r\n\
             content-length: 7\r\n\r\n"
        );
        assert_eq!(r.head_len, raw.len() - 7);
        assert_eq!(&raw[r.path.clone()], "/inventory/sku-1");
        assert_eq!(&raw[r.token.clone().unwrap()], "42");
        assert_eq!(&raw[r.resource.clone().unwrap()], "inventory:sku-1");
        assert_eq!((r.tokens, r.resources), (1, 1));
        assert_eq!(r.framing, Framing::Length(7));
        assert!(r.keep_alive && !r.http10);
    }

    /// The fencing headers are judged by the proxy either way; named in `Connection`, they
    /// were meant for this hop only and go no further (they went on before).
    #[test]
    fn fencing_headers_named_in_connection_are_judged_and_dropped() {
        let raw = "PUT /a HTTP/1.1\r\nHost: h\r\nConnection: Fencing-Token, fencing-resource\r\n\
                   Fencing-Token: 42\r\nFencing-Resource: r\r\nX-Original-URL: /b\r\n\
                   X-Rewrite-URL: /b\r\n\r\n";
        let (r, head) = upstream_head(raw);
        assert_eq!(&raw[r.token.clone().unwrap()], "42");
        assert_eq!(&raw[r.resource.clone().unwrap()], "r");
        let head = head.to_ascii_lowercase();
        assert!(!head.contains("fencing-"), "{head}");
        // Nor do the headers that name another path to stacks that route by them.
        assert!(!head.contains("/b"), "{head}");
        // CGI and WSGI read `_` as `-`: the underscore spellings are the same headers.
        let raw = "PUT /a HTTP/1.1\r\nHost: h\r\nX_Original_URL: /b\r\nFencing_Token: 1\r\n\
                   fencing-token: 2\r\nX_HTTP_METHOD_OVERRIDE: GET\r\nDESTINATION: /c\r\n\r\n";
        let (r, head) = upstream_head(raw);
        assert!(!head.contains("/b"), "{head}");
        assert_eq!(r.tokens, 2, "two tokens, as a CGI upstream would see them");
        assert_eq!(r.method_overrides, 1);
        assert_eq!(&raw[r.destination.clone().unwrap()], "/c");
    }

    /// A decoding reading sends the path it judged, spelled for one decoding.
    #[test]
    fn the_upstream_gets_the_path_as_the_reading_read_it() {
        let mut out = Vec::new();
        let c = Context {
            reading: crate::path::PathReading::Decoded,
            ..ctx()
        };
        let raw = b"PUT /x/..%2Finventory%2Fsku1?q=%2F HTTP/1.1\r\nHost: h\r\n\r\n";
        let r = request(raw, &c, &mut out).unwrap().unwrap();
        assert_eq!(r.normalized.as_deref(), Some("/inventory/sku1"));
        let head = String::from_utf8(out.clone()).unwrap();
        assert!(
            head.starts_with("PUT /inventory/sku1?q=%2F HTTP/1.1\r\n"),
            "{head}"
        );
        // The strict reading refuses it.
        let err = request(raw, &ctx(), &mut out).unwrap_err();
        assert!(
            matches!(&err, Reject::Bad(m) if m.contains("%2F")),
            "{err:?}"
        );
    }

    #[test]
    fn targets_get_the_prefix_and_requests_without_host_get_the_upstreams() {
        let mut out = Vec::new();
        let c = Context {
            prefix: "/api",
            ..ctx()
        };
        let raw = b"GET /a?b HTTP/1.0\r\n\r\n";
        let r = request(raw, &c, &mut out).unwrap().unwrap();
        let head = String::from_utf8(out.clone()).unwrap();
        assert!(
            head.starts_with("GET /api/a?b HTTP/1.1\r\nhost: up:8080\r\n"),
            "{head}"
        );
        assert!(r.http10 && !r.keep_alive);
        // Absolute form: its authority is the Host.
        let raw = b"GET http://shop.example HTTP/1.1\r\nHost: other\r\n\r\n";
        let r = request(raw, &c, &mut out).unwrap().unwrap();
        let head = String::from_utf8(out.clone()).unwrap();
        assert!(
            head.starts_with("GET /api/ HTTP/1.1\r\nhost: shop.example\r\n"),
            "{head}"
        );
        assert!(r.path.is_empty());
        let raw = b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n";
        request(raw, &c, &mut out).unwrap().unwrap();
        assert!(out.starts_with(b"OPTIONS * HTTP/1.1\r\n"));
    }

    #[test]
    fn ipv6_peers_are_quoted_in_forwarded() {
        let mut out = Vec::new();
        let peer = Peer::new("[2001:db8::1]:80".parse().unwrap());
        let c = Context {
            peer: &peer,
            ..ctx()
        };
        request(b"GET / HTTP/1.1\r\nForwarded: for=a\r\n\r\n", &c, &mut out)
            .unwrap()
            .unwrap();
        let head = String::from_utf8(out).unwrap();
        // The Host the proxy added is not the client's: no `host=`.
        assert!(
            head.contains("forwarded: for=a, for=\"[2001:db8::1]\";proto=http\r\n"),
            "{head}"
        );
    }

    #[test]
    fn ambiguous_or_unsupported_requests_are_refused() {
        let mut out = Vec::new();
        let bad = |raw: &str| request(raw.as_bytes(), &ctx(), &mut Vec::new());
        for raw in [
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET relative HTTP/1.1\r\n\r\n",
            "GET http:///x HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "\x00\x01\x02\r\n\r\n",
        ] {
            assert!(matches!(bad(raw), Err(Reject::Bad(_))), "{raw:?}");
        }
        assert!(matches!(
            bad("CONNECT a:443 HTTP/1.1\r\n\r\n"),
            Err(Reject::NotImplemented(_))
        ));
        let many: String = (0..HEADERS_MAX + 1)
            .map(|i| format!("x-{i}: v\r\n"))
            .collect();
        assert_eq!(
            bad(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            Reject::TooLarge
        );
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(HEAD_MAX));
        assert_eq!(bad(&long).unwrap_err(), Reject::TooLarge);
        // Incomplete is not an error.
        assert!(
            request(b"GET / HTTP/1.1\r\nHost:", &ctx(), &mut out)
                .unwrap()
                .is_none()
        );
    }

    fn to(head_request: bool, http10: bool, closing: bool) -> ResponseTo {
        ResponseTo {
            head_request,
            http10,
            closing,
        }
    }

    #[test]
    fn response_heads_are_framed_for_the_client() {
        let mut out = Vec::new();
        let raw =
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\nX-A: 1\r\n\r\nok\n";
        let r = response(raw, to(false, false, false), &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.status, r.framing, r.keep_alive),
            (200, Framing::Length(3), false)
        );
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\ncontent-length: 3\r\n\r\n"
        );

        let raw = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n";
        let r = response(raw, to(false, false, true), &mut out)
            .unwrap()
            .unwrap();
        assert_eq!((r.framing, r.keep_alive), (Framing::Chunked, true));
        assert_eq!(
            out,
            b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        // To an HTTP/1.0 client the decoded body goes out delimited by the close.
        response(raw, to(false, true, true), &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(out, b"HTTP/1.1 201 Created\r\nconnection: close\r\n\r\n");
        assert!(closes_client(Framing::Chunked, true));

        // HEAD and 304 keep their Content-Length and have no body.
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n";
        let r = response(raw, to(true, false, false), &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(r.framing, Framing::Empty);
        assert_eq!(out, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
        // No length: until the upstream closes; an HTTP/1.0 upstream is not kept by default.
        let raw = b"HTTP/1.0 200 OK\r\n\r\n";
        let r = response(raw, to(false, false, false), &mut out)
            .unwrap()
            .unwrap();
        assert_eq!((r.framing, r.keep_alive), (Framing::UntilClose, false));
        assert!(closes_client(r.framing, false));
        // Interim responses are reported, not written.
        let r = response(
            b"HTTP/1.1 100 Continue\r\n\r\n",
            to(false, false, false),
            &mut out,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.status, 100);
        assert!(
            response(
                b"HTTP/1.1 101 Switching\r\n\r\n",
                to(false, false, false),
                &mut out
            )
            .is_err()
        );
        assert!(
            response(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                to(false, false, false),
                &mut out
            )
            .is_err()
        );
    }

    /// Decodes `input` fed in pieces of `step` bytes; the data, or the error.
    fn decode_all(input: &[u8], step: usize) -> Result<(Vec<u8>, usize), &'static str> {
        let mut d = Chunked::default();
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut fed = 0;
        loop {
            match d.decode(&mut buf)? {
                Decoded::Data(n) => {
                    data.extend_from_slice(&buf[..n]);
                    buf.advance(n);
                    d.took(n);
                }
                Decoded::End => return Ok((data, input.len() - fed + buf.len())),
                Decoded::Need => {
                    if fed == input.len() {
                        return Err("incomplete");
                    }
                    let end = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..end]);
                    fed = end;
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_at_any_split() {
        let body = b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        for step in 1..body.len() {
            let (data, rest) = decode_all(body, step).unwrap();
            assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz");
            assert_eq!(rest, 4, "the bytes after the body are left: step {step}");
        }
        for bad in [
            &b"5\r\nhelloX\r\n0\r\n\r\n"[..],
            b"g\r\n",
            b"5\nhello\r\n",
            b"11111111111111111\r\n",
            b"0\r\nX: 1\rY\r\n\r\n",
        ] {
            assert!(
                decode_all(bad, 3).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long_ext = format!("1;{}\r\na\r\n0\r\n\r\n", "e".repeat(CHUNK_LINE_MAX));
        assert!(decode_all(long_ext.as_bytes(), 64).is_err());
        let mut round = Vec::new();
        encode_chunk(&mut round, b"hello");
        encode_chunk(&mut round, &[7u8; 300]);
        round.extend_from_slice(LAST_CHUNK);
        let (data, rest) = decode_all(&round, 7).unwrap();
        assert_eq!(data.len(), 305);
        assert_eq!(rest, 0);
    }

    /// Fed a byte at a time, a head is found possibly complete only at its last byte.
    #[test]
    fn the_completeness_gate_opens_at_the_blank_line_only() {
        for raw in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\r\n"[..],
            b"GET / HTTP/1.1\nHost: a\n\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        ] {
            let mut seen = 0;
            for end in 1..=raw.len() {
                let open = may_be_complete(&raw[..end], seen);
                assert_eq!(
                    open,
                    end == raw.len(),
                    "{:?} at {end}",
                    String::from_utf8_lossy(raw)
                );
                seen = end;
            }
        }
    }

    /// Random bytes and random splits: the parsers answer (accept, refuse, ask for more) and
    /// never panic; a head found complete is found complete at any split.
    #[test]
    fn random_input_never_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let alphabet: &[u8] =
            b"GETPOST /HTTP1.0\r\n:;,chunkedContent-Length0123456789abcdefxX\t \x00\xff";
        let mut out = Vec::new();
        for _ in 0..20_000 {
            let len = (next() % 200) as usize;
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let _ = request(&input, &ctx(), &mut out);
            let _ = response(&input, to(false, false, false), &mut out);
            let _ = decode_all(&input, 1 + (next() % 16) as usize);
        }
        // A valid head with random garbage appended: found at every split point.
        let raw = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        for cut in 0..raw.len() {
            assert!(request(&raw[..cut], &ctx(), &mut out).unwrap().is_none());
        }
        assert_eq!(
            request(raw, &ctx(), &mut out).unwrap().unwrap().framing,
            Framing::Chunked
        );
    }
}
