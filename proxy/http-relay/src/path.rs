//! Request paths as the upstream will read them, in one canonical spelling, so that no
//! spelling of a fenced path goes unfenced (invariant 9): the routes judge the proxy's reading,
//! and the upstream receives that reading spelled so that it can only read it the same way.
//!
//! Upstream stacks read a path differently: WSGI and CGI servers (Flask, Django, gunicorn) and
//! Go's `URL.Path` percent-decode it before routing, so `%2F` is a `/` to them; WHATWG URL
//! parsers (Node.js, Deno, Bun) read `\` as `/`; servlet containers (Tomcat, Jetty) drop a
//! segment's `;parameters`; a stack that decodes twice reads `%252F` as `/`; some cut a path at
//! an encoded NUL; nginx decodes before it matches a location. A path that one of them could
//! read as another path is refused ([`PathReading::Strict`], the default, after Spring
//! Security's `StrictHttpFirewall`), unless the configuration names the upstream's reading
//! ([`PathReading::Decoded`]) and the proxy then judges that reading.
//!
//! Every reading then normalises (RFC 3986 §6.2.2):
//! - percent-encoded unreserved characters (`%41`, `%7e`) are decoded; other percent-encodings
//!   keep their octet, with upper-case hex digits;
//! - repeated slashes become one (`//a///b` → `/a/b`), as nginx's `merge_slashes` does;
//! - dot segments are removed (`/a/./b/../c` → `/a/c`; `..` above the root stays at the root),
//!   also those spelled `%2E`, which appear only after decoding;
//! - a `%` not followed by two hex digits is refused: no server agrees on what it means.
//!
//! A trailing slash is kept (it is part of the path); the routes treat `/a/b/` as `/a/b`.
//! The query is not touched.

use serde::{Deserialize, Serialize};

/// Why a path cannot be relayed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadPath(pub String);

/// How the upstream reads a request's path (`http.path_reading`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PathReading {
    /// Refuse every path that common upstream stacks read differently (an encoded `/`, `\`,
    /// `%` or `;`, a raw `\`, `;` or `#`, an encoded control byte, bytes outside ASCII or
    /// encoded bytes that are not UTF-8): what is left reads the same everywhere.
    #[default]
    Strict,
    /// The upstream percent-decodes the whole path once before routing (WSGI, CGI, Go's
    /// `URL.Path`): the proxy judges the decoded path, so `%2F` is a `/`, and sends it
    /// encoded so that one decoding gives exactly that (`%` as `%25`). Raw `\`, `;` and `#`,
    /// encoded control bytes and non-UTF-8 are still refused.
    Decoded,
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Bytes that go into a path unencoded after a decoding reading: unreserved, `/`, and the
/// sub-delimiters but `;`, which no stack reads as anything but themselves.
fn plain_after_decoding(b: u8) -> bool {
    unreserved(b)
        || matches!(
            b,
            b'/' | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b'='
                | b':'
                | b'@'
        )
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_encoded(out: &mut Vec<u8>, octet: u8) {
    out.extend_from_slice(&[
        b'%',
        HEX[usize::from(octet >> 4)],
        HEX[usize::from(octet & 15)],
    ]);
}

/// Whether `path` (starting with `/`) is already in normal form and reads the same to every
/// upstream: the common case, checked without allocating.
fn is_normal(path: &str) -> bool {
    let b = path.as_bytes();
    !b.iter()
        .any(|&c| matches!(c, b'%' | b'\\' | b';' | b'#') || !c.is_ascii())
        && !path.contains("//")
        && !b
            .split(|&c| c == b'/')
            .any(|seg| seg == b"." || seg == b"..")
}

/// A path as the proxy reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Normal {
    /// What the routes judge.
    pub judged: String,
    /// What the upstream receives, when not `judged` itself (a decoding reading's path,
    /// encoded again).
    pub sent: Option<String>,
}

/// `path` (which starts with `/`) under `reading`, or `None` when it is normal already (the
/// routes judge it and the upstream receives it as it came).
pub(crate) fn normalize(path: &str, reading: PathReading) -> Result<Option<Normal>, BadPath> {
    if is_normal(path) {
        return Ok(None);
    }
    let decoded = decode(path, reading)?;
    let judged = remove_dot_segments(&decoded);
    let sent = match reading {
        PathReading::Strict => None,
        PathReading::Decoded => {
            let mut out = Vec::with_capacity(judged.len() + 8);
            for &b in judged.as_bytes() {
                if plain_after_decoding(b) {
                    out.push(b);
                } else {
                    push_encoded(&mut out, b);
                }
            }
            Some(String::from_utf8(out).expect("ASCII"))
        }
    };
    Ok(Some(Normal { judged, sent }))
}

fn remove_dot_segments(decoded: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = decoded.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." => {}
            ".." => {
                out.pop();
            }
            // Repeated slashes: empty segments go, except a final one (a trailing slash).
            "" if i != last => {}
            s => out.push(s),
        }
        // A path ending in a dot segment ends in a slash (RFC 3986 §5.2.4).
        if i == last && (*seg == "." || *seg == "..") {
            out.push("");
        }
    }
    let mut normal = String::with_capacity(decoded.len());
    for seg in &out {
        normal.push('/');
        normal.push_str(seg);
    }
    if normal.is_empty() {
        normal.push('/');
    }
    normal
}

/// Why a raw byte of a path is refused, whatever the reading.
fn raw_refusal(b: u8) -> Option<&'static str> {
    match b {
        b'\\' => Some("a '\\', which WHATWG URL parsers (Node.js, Deno, Bun) read as '/'"),
        b';' => Some(
            "a ';', which servlet containers (Tomcat, Jetty) drop from the segment with what follows it",
        ),
        b'#' => Some("a '#', which most upstreams read as the end of the path"),
        _ if !b.is_ascii() => Some(
            "a byte outside ASCII, which a request target may not hold (RFC 9112) and upstreams read variously",
        ),
        _ => None,
    }
}

/// Why an encoded octet is refused in the strict reading (`None`: it is kept encoded).
fn strict_refusal(octet: u8) -> Option<&'static str> {
    match octet {
        b'/' => Some(
            "an encoded '/' (%2F), which WSGI and CGI upstreams (Flask, Django, gunicorn), Go's URL.Path and nginx decode to '/' before routing",
        ),
        b'\\' => Some(
            "an encoded '\\' (%5C), which upstreams that decode the path read as '\\', and some as '/'",
        ),
        b'%' => Some(
            "an encoded '%' (%25), which an upstream that decodes twice reads as the start of another encoding",
        ),
        b';' => Some(
            "an encoded ';' (%3B), which an upstream that decodes before it drops ';' parameters reads as one",
        ),
        _ => None,
    }
}

/// The path decoded as `reading` reads it: unreserved octets always, every octet in the
/// decoding reading; the rest kept encoded (upper-case hex).
fn decode(path: &str, reading: PathReading) -> Result<String, BadPath> {
    let refuse = |why: &str| BadPath(format!("the path {path:?} has {why}"));
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    // Encoded octets above 0x7F, checked together as UTF-8 at the end of each run.
    let mut run: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            if let Some(why) = raw_refusal(b[i]) {
                return Err(refuse(why));
            }
            check_utf8(&run).map_err(|()| refuse(NOT_UTF8))?;
            run.clear();
            out.push(b[i]);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) else {
            return Err(refuse("a '%' that is not followed by two hex digits"));
        };
        i += 3;
        let octet = hi << 4 | lo;
        if octet < 0x20 || octet == 0x7F {
            return Err(refuse(
                "an encoded control byte, at which some upstreams cut the path or which they drop",
            ));
        }
        if octet >= 0x80 {
            run.push(octet);
        } else {
            check_utf8(&run).map_err(|()| refuse(NOT_UTF8))?;
            run.clear();
        }
        match reading {
            _ if unreserved(octet) => out.push(octet),
            PathReading::Decoded => out.push(octet),
            PathReading::Strict => {
                if let Some(why) = strict_refusal(octet) {
                    return Err(refuse(why));
                }
                push_encoded(&mut out, octet);
            }
        }
    }
    check_utf8(&run).map_err(|()| refuse(NOT_UTF8))?;
    String::from_utf8(out).map_err(|_| refuse(NOT_UTF8))
}

const NOT_UTF8: &str = "encoded bytes that are not UTF-8 (an overlong '/' such as %C0%AF reads as '/' to some decoders)";

fn check_utf8(run: &[u8]) -> Result<(), ()> {
    std::str::from_utf8(run).map(|_| ()).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(path: &str, reading: PathReading) -> String {
        match normalize(path, reading).unwrap() {
            Some(n) => n.judged,
            None => path.to_string(),
        }
    }

    fn check(path: &str, expected: &str) {
        assert_eq!(judged(path, PathReading::Strict), expected, "{path}");
    }

    #[test]
    fn every_spelling_of_a_path_has_one_normal_form() {
        for p in [
            "/inventory/sku1",
            "//inventory/sku1",
            "/inventory//sku1",
            "/inventory/./sku1",
            "/x/../inventory/sku1",
            "/../inventory/sku1",
            "/inventory/%73ku1",
            "/%69nventory/sku%31",
            "/inventory/sku1/.",
            "/x/%2e%2E/inventory/sku1",
        ] {
            for reading in [PathReading::Strict, PathReading::Decoded] {
                let got = judged(p, reading);
                assert!(
                    got == "/inventory/sku1" || got == "/inventory/sku1/",
                    "{p} → {got}"
                );
            }
        }
        check("/files/a/../b", "/files/b");
        check("/a/b/", "/a/b/");
        check("/a/b//", "/a/b/");
        check("/a/%7E%2e", "/a/~.");
        check("/a/%2E%2E/b", "/b");
        check("/a/%c3%a9", "/a/%C3%A9");
        check("/.", "/");
        check("/..", "/");
        check("/", "/");
        assert_eq!(normalize("/inventory/sku-1", PathReading::Strict), Ok(None));
        // The strict reading sends what it judged.
        let n = normalize("/inventory/%73ku1", PathReading::Strict)
            .unwrap()
            .unwrap();
        assert_eq!(n.sent, None);
    }

    #[test]
    fn a_broken_percent_encoding_is_refused() {
        for p in ["/a%", "/a%2", "/a%zz", "/%%41"] {
            for reading in [PathReading::Strict, PathReading::Decoded] {
                assert!(normalize(p, reading).is_err(), "{p}");
            }
        }
    }

    /// Each spelling some upstream stack reads as another path, with the words the refusal
    /// must say.
    const AMBIGUOUS: [(&str, &str); 16] = [
        ("/inventory%2Fsku1", "%2F"),
        ("/inventory%2fsku1", "%2F"),
        ("/public/..%2Finventory/sku1", "%2F"),
        ("/inventory%5Csku1", "%5C"),
        ("/inventory\\sku1", "WHATWG"),
        ("/public/..\\inventory\\sku1", "WHATWG"),
        ("/inventory;x/sku1", "servlet"),
        ("/public/..;/inventory/sku1", "servlet"),
        ("/inventory/sku1%3Bx", "%3B"),
        ("/inventory%252Fsku1", "%25"),
        ("/inventory/sku1/#/../x", "'#'"),
        ("/inventory/sku1%00.json", "control byte"),
        ("/inventory/sku1%0A", "control byte"),
        ("/inventory/sku1%7F", "control byte"),
        ("/inventory%C0%AFsku1", "not UTF-8"),
        ("/inventory/sku\u{e9}", "outside ASCII"),
    ];

    #[test]
    fn a_path_upstreams_read_differently_is_refused_by_the_strict_reading() {
        for (p, why) in AMBIGUOUS {
            let err = normalize(p, PathReading::Strict).unwrap_err().0;
            assert!(err.contains(why), "{p}: {err}");
        }
    }

    #[test]
    fn the_decoding_reading_judges_the_decoded_path_and_sends_it_so_that_it_decodes_to_that() {
        let read = |p: &str| normalize(p, PathReading::Decoded).unwrap().unwrap();
        let n = read("/inventory%2Fsku1");
        assert_eq!(n.judged, "/inventory/sku1");
        assert_eq!(n.sent.as_deref(), Some("/inventory/sku1"));
        // A dot segment that appears only after decoding leads where it leads.
        assert_eq!(
            read("/public/..%2Finventory/sku1").judged,
            "/inventory/sku1"
        );
        // Decoded once, as the upstream does: %252F is the text %2F, sent as %252F again.
        let n = read("/a/b%252Fc");
        assert_eq!(n.judged, "/a/b%2Fc");
        assert_eq!(n.sent.as_deref(), Some("/a/b%252Fc"));
        let n = read("/a/%5C%3B%3F%23%20%c3%a9");
        assert_eq!(n.judged, "/a/\\;?# \u{e9}");
        assert_eq!(n.sent.as_deref(), Some("/a/%5C%3B%3F%23%20%C3%A9"));
        // Still refused: what a decoding upstream would also read as something else.
        for p in [
            "/inventory\\sku1",
            "/inventory;x/sku1",
            "/a#b",
            "/a%00",
            "/a%C0%AF",
            "/a\u{e9}",
        ] {
            assert!(normalize(p, PathReading::Decoded).is_err(), "{p}");
        }
    }
}
