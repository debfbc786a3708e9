//! The bypass catalogue against real upstream stacks (issue 38, invariant 9): a zombie with a
//! stale token, naming a resource of its own choosing, sends a write for `/inventory/sku1` in a
//! spelling that the proxy could read as another path than the upstream does; a client with no
//! token at all climbs out of an unfenced route the same way. Each is refused by the proxy
//! (its own `problem+json` answer), the stack's `sku1` is unchanged, and the current holder
//! still writes.
//!
//! Through the proxy of commit 33166a7, the WSGI service stored the zombie's write for
//! `%2F` spellings, the Node.js service for `\`, `#` and case spellings and the climb with
//! `\`, and nginx for `%2F` spellings and the climbs with `%2F`: each was unmatched, so fenced
//! under the zombie's own resource, or matched the unfenced route, and relayed.

use e2e::stacks::{Stack, exchange};

use crate::proxy_to;

const ROUTES: &str = "[[http.routes]]\npath = \"/inventory/{sku}\"\nresource = \"inventory:{sku}\"\n\
                      [[http.routes]]\npath = \"/public/{*rest}\"\nfenced = false\n";

/// Spellings some stack reads as `/inventory/sku1`; sent with a stale token and the zombie's
/// own resource.
const STALE: [&str; 16] = [
    "/inventory%2Fsku1",
    "/inventory%2fsku1",
    "/x/..%2Finventory/sku1",
    "/inventory%5Csku1",
    "/inventory\\sku1",
    "/x\\..\\inventory\\sku1",
    "/Inventory/sku1",
    "/INVENTORY/sku1/",
    "/inventory/sku1/#x",
    "/inventory/sku1/#/../x",
    "/inventory;v=1/sku1",
    "/inventory/sku1;v=1",
    "/inventory%252Fsku1",
    "/inventory%3Bsku1",
    "/inventory/sku1%00",
    "/inventory%C0%AFsku1",
];

/// Spellings that climb out of the unfenced route `/public/{*rest}` into `/inventory/sku1`;
/// sent without any token.
const CLIMBS: [&str; 5] = [
    "/public/..%2Finventory/sku1",
    "/public/%2e%2e%2finventory%2fsku1",
    "/public/..\\inventory\\sku1",
    "/public/..;/inventory/sku1",
    "/public/%2E%2E/inventory/sku1",
];

const CURRENT: &str = "Fencing-Token: 100\r\n";
const ZOMBIE: &str = "Fencing-Token: 1\r\nFencing-Resource: scratch\r\n";

fn catalogue(stack: Stack) {
    let dir = tempfile::tempdir().unwrap();
    let px = proxy_to(dir.path(), &stack.url(), "", ROUTES);
    let proxy = px.urls[0].strip_prefix("http://").unwrap();
    let put =
        |target: &str, headers: &str, body: &str| exchange(proxy, "PUT", target, headers, body);
    let written = |status: u16| (200..300).contains(&status);
    assert!(written(put("/inventory/sku1", CURRENT, "current").0));
    assert_eq!(stack.stored("sku1").as_deref(), Some("current"));
    let mut leaked = Vec::new();
    let attempts = STALE.iter().map(|t| (*t, ZOMBIE, "stale"));
    let climbs = CLIMBS.iter().map(|t| (*t, "", "climbed"));
    for (target, headers, body) in attempts.chain(climbs) {
        let (status, answer) = put(target, headers, body);
        let stored = stack.stored("sku1");
        if stored.as_deref() != Some("current") || !answer.contains("urn:fencing:problem:") {
            leaked.push(format!("{target:?}: {status}, sku1 holds {stored:?}"));
            assert!(written(put("/inventory/sku1", CURRENT, "current").0));
        }
    }
    assert!(
        leaked.is_empty(),
        "{}: not refused by the proxy, or written:\n{}",
        stack.name,
        leaked.join("\n")
    );
    // The current holder still writes, through the plain path.
    assert!(written(put("/inventory/sku1", CURRENT, "newer").0));
    assert_eq!(stack.stored("sku1").as_deref(), Some("newer"));
}

#[test]
fn a_wsgi_upstream_gets_no_stale_write_through_a_spelling_it_decodes() {
    catalogue(Stack::wsgi());
}

#[test]
fn a_node_upstream_routing_with_new_url_gets_no_stale_write() {
    catalogue(Stack::node());
}

#[test]
fn an_nginx_upstream_gets_no_stale_write() {
    let dir = tempfile::tempdir().unwrap();
    catalogue(Stack::nginx(dir.path()));
}

/// `path_reading = "decoded"` names the WSGI reading: `%2F` is a `/`, judged as such, so the
/// zombie's spelling is fenced as `inventory:sku1` and the holder's reaches `sku1`.
#[test]
fn with_the_decoding_reading_a_wsgi_upstream_is_judged_as_it_reads() {
    let stack = Stack::wsgi();
    let dir = tempfile::tempdir().unwrap();
    let listener = format!("path_reading = \"decoded\"\n{ROUTES}");
    let px = proxy_to(dir.path(), &stack.url(), "", &listener);
    let proxy = px.urls[0].strip_prefix("http://").unwrap();
    let put =
        |target: &str, headers: &str, body: &str| exchange(proxy, "PUT", target, headers, body);
    assert_eq!(put("/inventory/sku1", CURRENT, "current").0, 200);
    for target in ["/inventory%2Fsku1", "/x/..%2Finventory/sku1"] {
        let (status, answer) = put(target, ZOMBIE, "stale");
        assert_eq!(status, 409, "{target}: {answer}");
        assert!(answer.contains("inventory:sku1"), "{answer}");
    }
    // The climb out of the unfenced route is fenced as where it lands: no token, refused.
    let (status, answer) = put("/public/..%2Finventory/sku1", "", "climbed");
    assert_eq!(status, 428, "{answer}");
    assert_eq!(stack.stored("sku1").as_deref(), Some("current"));
    assert_eq!(put("/inventory%2Fsku1", CURRENT, "decoded").0, 200);
    assert_eq!(stack.stored("sku1").as_deref(), Some("decoded"));
    // Still refused in this reading: what a decoding upstream may also read otherwise.
    for target in [
        "/inventory\\sku1",
        "/inventory;v=1/sku1",
        "/inventory/sku1%00",
    ] {
        assert_eq!(put(target, CURRENT, "x").0, 400, "{target}");
    }
    // Decoded once, as the upstream decodes: `%252F` is the text `%2F`, no slash.
    assert_eq!(
        put("/inventory/a%252Fb", CURRENT, "x").0,
        400,
        "not a resource name"
    );
}

/// WebDAV's COPY and MOVE write where their `Destination` header says (found by an outside
/// breaker: a MOVE of a scratch file under its own token, or of an unfenced file with no token,
/// over `/inventory/sku1` wrote it through the proxy). A destination fenced otherwise than the
/// request's own path is refused; one handled alike is relayed.
#[test]
fn an_nginx_move_or_copy_cannot_write_a_fenced_path_under_another_token() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::nginx(dir.path());
    let pdir = tempfile::tempdir().unwrap();
    let px = proxy_to(pdir.path(), &stack.url(), "", ROUTES);
    let proxy = px.urls[0].strip_prefix("http://").unwrap();
    let send = |method: &str, target: &str, headers: &str, body: &str| {
        exchange(proxy, method, target, headers, body)
    };
    let written = |status: u16| (200..300).contains(&status);
    assert!(written(
        send("PUT", "/inventory/sku1", CURRENT, "current").0
    ));
    let scratch = "Fencing-Token: 50\r\n";
    assert!(written(send("PUT", "/inventory/tmp", scratch, "zombie").0));
    assert!(written(send("PUT", "/public/x", "", "stray").0));
    for (method, from, headers) in [
        ("MOVE", "/inventory/tmp", scratch),
        ("COPY", "/inventory/tmp", scratch),
        ("MOVE", "/public/x", ""),
        ("COPY", "/public/x", ""),
    ] {
        for to in [
            "http://shop/inventory/sku1",
            "/inventory/sku1",
            "http://shop/public/../inventory/sku1",
        ] {
            let (status, answer) =
                send(method, from, &format!("{headers}Destination: {to}\r\n"), "");
            assert_eq!(status, 400, "{method} {from} -> {to}: {answer}");
            assert_eq!(
                stack.stored("sku1").as_deref(),
                Some("current"),
                "{method} {from} -> {to}"
            );
        }
    }
    // A collection above fenced paths, as the source of a DELETE or MOVE or the destination
    // of a MOVE, under a resource of the client's choosing (a second breaker's finding).
    let zombie = "Fencing-Token: 1\r\nFencing-Resource: junk:1\r\n";
    assert!(written(send("PUT", "/other/dir/sku1", zombie, "zombie").0));
    for (method, target, extra) in [
        (
            "MOVE",
            "/other/dir/",
            "Destination: http://shop/inventory/\r\nOverwrite: T\r\n",
        ),
        ("COPY", "/other/dir/", "Destination: /inventory/\r\n"),
        ("DELETE", "/inventory/", ""),
        ("DELETE", "/inventory", ""),
    ] {
        let (status, answer) = send(method, target, &format!("{zombie}{extra}"), "");
        assert_eq!(status, 400, "{method} {target}: {answer}");
        assert_eq!(
            stack.stored("sku1").as_deref(),
            Some("current"),
            "{method} {target}"
        );
    }
    // Within the unfenced route, a MOVE is relayed.
    let (status, answer) = send(
        "MOVE",
        "/public/x",
        "Destination: http://shop/public/y\r\n",
        "",
    );
    assert!(written(status), "{answer}");
    assert!(written(send("PUT", "/inventory/sku1", CURRENT, "newer").0));
    assert_eq!(stack.stored("sku1").as_deref(), Some("newer"));
}

/// A request whose method override header names a write is a write to stacks that honour it
/// (the Node.js service does, as method-override middlewares do): a GET turned into a PUT
/// was relayed unfenced, and stored a write with no token. Judged as both methods, it is
/// refused.
#[test]
fn a_method_override_does_not_turn_an_unfenced_read_into_a_write() {
    let stack = Stack::node();
    let dir = tempfile::tempdir().unwrap();
    let px = proxy_to(dir.path(), &stack.url(), "", ROUTES);
    let proxy = px.urls[0].strip_prefix("http://").unwrap();
    let send = |method: &str, headers: &str, body: &str| {
        exchange(proxy, method, "/inventory/sku1", headers, body)
    };
    assert_eq!(send("PUT", CURRENT, "current").0, 200);
    for (method, headers) in [
        ("GET", "X-HTTP-Method-Override: PUT\r\n"),
        ("GET", "X-HTTP-Method-Override: put\r\n"),
        (
            "GET",
            "X-HTTP-Method: PUT\r\nX-HTTP-Method-Override: GET\r\n",
        ),
        ("HEAD", "X-Method-Override: PUT\r\n"),
    ] {
        let (status, answer) = send(method, headers, "stale");
        assert_eq!(status, 400, "{method} {headers:?}: {answer}");
        assert_eq!(
            stack.stored("sku1").as_deref(),
            Some("current"),
            "{method} {headers:?}"
        );
    }
    // Overriding a write with the same write, with its token, still writes.
    let headers = format!("{CURRENT}X-HTTP-Method-Override: PUT\r\n");
    assert_eq!(send("POST", &headers, "newer").0, 200);
    assert_eq!(stack.stored("sku1").as_deref(), Some("newer"));
}
