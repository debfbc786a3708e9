//! The bypass catalogue of the HTTP mode (issue 14, invariant 9): every spelling of a fenced
//! path is fenced as that path. With the route `/inventory/{sku}` → `inventory:{sku}` and the
//! mark of `inventory:sku1` at 100, each spelling below with token 1 is refused (409) and
//! reaches nothing, and with token 100 it reaches the upstream, as the normal path.
//!
//! Sent as raw bytes, so that no client library tidies the path first. Each spelling reached
//! the upstream with the stale token through the proxy of commit a54c88f (paths were matched
//! as written and unmatched requests passed by default).

use std::io::{Read, Write};
use std::net::TcpStream;

use e2e::upstream::Upstream;

use crate::proxy;

const ROUTES: &str = "[[http.routes]]\npath = \"/inventory/{sku}\"\nresource = \"inventory:{sku}\"\n\
                      [[http.routes]]\npath = \"/files/{*path}\"\nresource = \"file:{path}\"\n";

/// Sends `method target` with `token` (and `extra` header lines) over a new connection and
/// returns the status.
fn send(base: &str, method: &str, target: &str, token: &str, extra: &str) -> u16 {
    let addr = base.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(e2e::PATIENCE)).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: shop\r\nFencing-Token: {token}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"))
}

/// Raises `resource` to 100 through the proxy, with its plain path.
fn raise(base: &str, path: &str) {
    assert_eq!(send(base, "PUT", path, "100", ""), 200);
}

#[test]
fn every_spelling_of_a_fenced_path_is_fenced_as_that_path() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", ROUTES);
    let base = &px.urls[0];
    raise(base, "/inventory/sku1");
    let before = upstream.seen().len();
    let spellings = [
        "/inventory/sku1/",
        "//inventory/sku1",
        "/inventory//sku1",
        "/inventory/./sku1",
        "/x/../inventory/sku1",
        "/../inventory/sku1",
        "/inventory/%73ku1",
        "/%69nventory/sku1",
        "/inventory/sku1/.",
        "/inventory/sku1?x=1",
        "http://shop//inventory/./sku1",
    ];
    let leaked: Vec<(&str, u16)> = spellings
        .iter()
        .map(|p| (*p, send(base, "PUT", p, "1", "")))
        .filter(|(_, status)| *status != 409)
        .collect();
    assert!(
        leaked.is_empty(),
        "not refused with a stale token: {leaked:?}"
    );
    assert_eq!(
        upstream.seen().len(),
        before,
        "a stale write reached the upstream"
    );
    for p in spellings {
        assert_eq!(
            send(base, "PUT", p, "100", ""),
            200,
            "{p} with the current token"
        );
    }
    // What the upstream received is the normal path (the query as it was).
    let seen = upstream.seen();
    for s in &seen[before..] {
        assert!(
            s.path == "/inventory/sku1"
                || s.path == "/inventory/sku1/"
                || s.path == "/inventory/sku1?x=1",
            "the upstream got {:?}",
            s.path
        );
        assert_eq!(s.token, Some(100));
    }
}

#[test]
fn a_dot_segment_names_the_resource_it_leads_to() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", ROUTES);
    let base = &px.urls[0];
    raise(base, "/files/b");
    // `/files/a/../b` is `/files/b`: the same resource, not one of its own.
    assert_eq!(send(base, "PUT", "/files/a/../b", "1", ""), 409);
    assert_eq!(send(base, "PUT", "/files/a/../b", "100", ""), 200);
    assert_eq!(upstream.seen().last().unwrap().path, "/files/b");
}

#[test]
fn a_write_no_route_matches_is_fenced_by_its_header_unless_the_config_says_pass() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", ROUTES);
    let base = &px.urls[0];
    raise(base, "/inventory/sku1");
    // The upstream may route `/inventory/sku1/extra` to the same handler: without a resource
    // it is refused, with one it is fenced by it.
    assert_eq!(send(base, "PUT", "/inventory/sku1/extra", "1", ""), 428);
    let header = "Fencing-Resource: inventory:sku1\r\n";
    assert_eq!(send(base, "PUT", "/inventory/sku1/extra", "1", header), 409);
    assert_eq!(
        send(base, "PUT", "/inventory/sku1/extra", "100", header),
        200
    );
    // Reads pass unfenced.
    assert_eq!(send(base, "GET", "/inventory/sku1/extra", "1", ""), 200);
    drop(px);

    let dir = tempfile::tempdir().unwrap();
    let px = proxy(
        dir.path(),
        &upstream,
        "",
        &format!("unmatched = \"pass\"\n{ROUTES}"),
    );
    assert_eq!(
        send(&px.urls[0], "PUT", "/elsewhere", "1", ""),
        200,
        "the explicit opt-out"
    );
}

/// (Refused before too, as a malformed resource name; now as a malformed path, before any
/// route sees it.)
#[test]
fn a_broken_percent_encoding_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", ROUTES);
    for p in ["/inventory/sku%", "/inventory/sku%1", "/inventory/%zz"] {
        assert_eq!(send(&px.urls[0], "PUT", p, "100", ""), 400, "{p}");
    }
    assert!(upstream.seen().is_empty());
}
