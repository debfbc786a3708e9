//! Request paths in their normal form (RFC 3986 §6.2.2), so that no spelling of a fenced path
//! goes unfenced (invariant 9): the routes match the normal form, and the normal form is what
//! the upstream receives, so what the proxy judged is what the upstream serves, however the
//! upstream itself would have normalised.
//!
//! - percent-encoded unreserved characters (`%41`, `%7e`) are decoded; other percent-encodings
//!   keep their octet, with upper-case hex digits (`%2f` → `%2F`: an encoded slash stays one);
//! - repeated slashes become one (`//a///b` → `/a/b`), as nginx's `merge_slashes` does;
//! - dot segments are removed (`/a/./b/../c` → `/a/c`; `..` above the root stays at the root);
//! - a `%` not followed by two hex digits is refused (400): no server agrees on what it means.
//!
//! A trailing slash is kept (it is part of the path); the routes treat `/a/b/` as `/a/b`.
//! The query is not touched.

/// Why a path cannot be normalised.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadPath(pub String);

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Whether `path` (starting with `/`) is already in normal form: the common case, checked
/// without allocating.
fn is_normal(path: &str) -> bool {
    let b = path.as_bytes();
    !b.contains(&b'%')
        && !path.contains("//")
        && !b
            .split(|&c| c == b'/')
            .any(|seg| seg == b"." || seg == b"..")
}

/// The normal form of `path` (which starts with `/`), or `None` when it is normal already.
pub(crate) fn normalize(path: &str) -> Result<Option<String>, BadPath> {
    if is_normal(path) {
        return Ok(None);
    }
    let decoded = decode_unreserved(path)?;
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
    let mut normal = String::with_capacity(path.len());
    for seg in &out {
        normal.push('/');
        normal.push_str(seg);
    }
    if normal.is_empty() {
        normal.push('/');
    }
    Ok(Some(normal))
}

fn decode_unreserved(path: &str) -> Result<String, BadPath> {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) else {
            return Err(BadPath(format!(
                "the path {path:?} has a '%' that is not followed by two hex digits"
            )));
        };
        let octet = hi << 4 | lo;
        if unreserved(octet) {
            out.push(octet);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.extend_from_slice(&[b'%', HEX[usize::from(hi)], HEX[usize::from(lo)]]);
        }
        i += 3;
    }
    // Only ASCII was put in place of ASCII: still the text it was.
    Ok(String::from_utf8(out).expect("a path with ASCII decoded into ASCII is still UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(path: &str, expected: &str) {
        let got = normalize(path).unwrap().unwrap_or_else(|| path.to_string());
        assert_eq!(got, expected, "{path}");
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
        ] {
            let got = normalize(p).unwrap().unwrap_or_else(|| p.to_string());
            assert!(
                got == "/inventory/sku1" || got == "/inventory/sku1/",
                "{p} → {got}"
            );
        }
        check("/files/a/../b", "/files/b");
        check("/a/b/", "/a/b/");
        check("/a/b//", "/a/b/");
        check("/a/%2f/b", "/a/%2F/b");
        check("/a/%7E%2e", "/a/~.");
        check("/a/%2E%2E/b", "/b");
        check("/.", "/");
        check("/..", "/");
        check("/", "/");
        assert_eq!(normalize("/inventory/sku-1"), Ok(None));
    }

    #[test]
    fn a_broken_percent_encoding_is_refused() {
        for p in ["/a%", "/a%2", "/a%zz", "/%%41"] {
            assert!(normalize(p).is_err(), "{p}");
        }
    }
}
