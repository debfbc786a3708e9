//! What the proxy answers itself, and what it leaves alone.

use e2e::client::{body, client, send};
use e2e::upstream::Upstream;

use crate::{proxy, runtime};

fn fenced(token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("fencing-resource", "inventory:sku-1".to_string()),
        ("fencing-token", token.to_string()),
    ]
}

#[test]
fn stale_missing_and_malformed_tokens_get_their_answers() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", "");
    let rt = runtime();
    let c = client();
    let url = format!("{}/inventory/sku-1", px.urls[0]);
    let put = |headers: Vec<(&'static str, String)>| {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        rt.block_on(send(&c, "PUT", &url, &h, body("count=7")))
    };

    assert_eq!(put(fenced("42")).status, 200);
    assert_eq!(put(fenced("42")).status, 200, "the same token writes again");

    let stale = put(fenced("41"));
    assert_eq!(stale.status, 409);
    assert_eq!(stale.headers["content-type"], "application/problem+json");
    let p = stale.json();
    assert_eq!(p["type"], "urn:fencing:problem:stale-token");
    assert_eq!(
        (
            p["resource"].as_str(),
            p["token"].as_u64(),
            p["highest"].as_u64()
        ),
        (Some("inventory:sku-1"), Some(41), Some(42))
    );

    let missing = put(vec![("fencing-resource", "inventory:sku-1".into())]);
    assert_eq!(
        (missing.status, missing.json()["type"].as_str()),
        (428, Some("urn:fencing:problem:fencing-required"))
    );
    let no_resource = put(vec![("fencing-token", "43".into())]);
    assert_eq!(no_resource.status, 428);
    assert!(
        no_resource.json()["detail"]
            .as_str()
            .unwrap()
            .contains("Fencing-Resource")
    );

    for bad in ["abc", "-1", "0", "9223372036854775808", "1.5", "0x10"] {
        let a = put(fenced(bad));
        assert_eq!(
            (a.status, a.json()["type"].as_str()),
            (400, Some("urn:fencing:problem:malformed-token")),
            "{bad:?}"
        );
    }
    let bad_resource = put(vec![
        ("fencing-resource", "has space".into()),
        ("fencing-token", "50".into()),
    ]);
    assert_eq!(
        (bad_resource.status, bad_resource.json()["type"].as_str()),
        (400, Some("urn:fencing:problem:malformed-resource"))
    );
    let huge = "r".repeat(10_000);
    let too_long = put(vec![
        ("fencing-resource", huge),
        ("fencing-token", "50".into()),
    ]);
    assert_eq!(too_long.status, 400);

    // Only the two writes with token 42 reached the upstream.
    let seen = upstream.seen();
    assert_eq!(
        seen.iter()
            .filter(|s| s.method == "PUT")
            .map(|s| s.token)
            .collect::<Vec<_>>(),
        vec![Some(42), Some(42)]
    );
}

#[test]
fn unfenced_requests_pass_untouched_with_forwarding_headers() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", "");
    let rt = runtime();
    let c = client();
    let get = rt.block_on(send(
        &c,
        "GET",
        &format!("{}/inventory/sku-1?x=1", px.urls[0]),
        &[
            ("x-custom", "kept"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "dropped"),
        ],
        body(""),
    ));
    assert_eq!(get.status, 200);
    let seen = upstream.seen();
    let s = &seen[0];
    assert_eq!(
        (s.method.as_str(), s.path.as_str()),
        ("GET", "/inventory/sku-1")
    );
    assert_eq!(s.headers["x-custom"], "kept");
    assert!(
        s.headers.get("x-hop").is_none(),
        "a header named by Connection is hop-by-hop"
    );
    assert_eq!(s.headers["x-forwarded-for"], "127.0.0.1");
    assert!(
        s.headers["forwarded"]
            .to_str()
            .unwrap()
            .starts_with("for=127.0.0.1;proto=http")
    );
}

#[test]
fn routes_name_resources_from_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let routes = "[[http.routes]]\npath = \"/inventory/{sku}\"\nresource = \"inventory:{sku}\"\n\
                  [[http.routes]]\npath = \"/health\"\nfenced = false\n";
    let px = proxy(dir.path(), &upstream, "", routes);
    let rt = runtime();
    let c = client();
    let put = |sku: &str, token: &str| {
        rt.block_on(send(
            &c,
            "PUT",
            &format!("{}/inventory/{sku}", px.urls[0]),
            &[("fencing-token", token)],
            body("x"),
        ))
    };
    assert_eq!(put("a", "5").status, 200);
    assert_eq!(put("b", "1").status, 200, "each sku is its own resource");
    let stale = put("a", "4");
    assert_eq!(
        (stale.status, stale.json()["resource"].as_str()),
        (409, Some("inventory:a"))
    );
    // An unfenced route passes without a token; an unmatched write is fenced by header.
    assert_eq!(
        rt.block_on(send(
            &c,
            "POST",
            &format!("{}/health", px.urls[0]),
            &[],
            body("")
        ))
        .status,
        200
    );
    assert_eq!(
        rt.block_on(send(
            &c,
            "POST",
            &format!("{}/other", px.urls[0]),
            &[],
            body("")
        ))
        .status,
        428
    );
    let bad = rt.block_on(send(
        &c,
        "PUT",
        &format!("{}/inventory/has%20space", px.urls[0]),
        &[("fencing-token", "9")],
        body(""),
    ));
    assert_eq!(bad.status, 400);
}

#[test]
fn an_upstream_down_or_slow_gets_502_or_504() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", "upstream_timeout_ms = 300");
    let rt = runtime();
    let c = client();
    // Slow: the upstream holds the request past the proxy's timeout.
    let slow = rt.block_on(send(
        &c,
        "GET",
        &format!("{}/slow", px.urls[0]),
        &[("x-hold", "never")],
        body(""),
    ));
    assert_eq!(
        (slow.status, slow.json()["type"].as_str()),
        (504, Some("urn:fencing:problem:upstream-timeout"))
    );
    upstream.release("never");
    // Down: nothing listens any more.
    drop(upstream);
    let down = rt.block_on(send(&c, "GET", &format!("{}/x", px.urls[0]), &[], body("")));
    assert_eq!(
        (down.status, down.json()["type"].as_str()),
        (502, Some("urn:fencing:problem:upstream-unreachable"))
    );
}

#[test]
fn bodies_above_the_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "", "body_max_bytes = 1000");
    let rt = runtime();
    let c = client();
    let url = format!("{}/count", px.urls[0]);
    let declared = rt.block_on(send(
        &c,
        "POST",
        &url,
        &[("fencing-resource", "r"), ("fencing-token", "1")],
        body(vec![0u8; 1001]),
    ));
    assert_eq!(
        (declared.status, declared.json()["type"].as_str()),
        (413, Some("urn:fencing:problem:body-too-large"))
    );
    // A streamed (chunked) body is cut off when it passes the limit.
    let streamed = rt.block_on(send(
        &c,
        "POST",
        &url,
        &[("fencing-resource", "r"), ("fencing-token", "1")],
        e2e::client::Generated::new(5000).boxed_body(),
    ));
    assert_eq!(streamed.status, 413);
    let fits = rt.block_on(send(
        &c,
        "POST",
        &url,
        &[("fencing-resource", "r"), ("fencing-token", "1")],
        body(vec![0u8; 1000]),
    ));
    assert_eq!((fits.status, fits.text()), (200, "1000".to_string()));
}

/// A plaintext listener off loopback is refused unless the config says `insecure = true`, and
/// then it is logged (with TLS it needs nothing: `tls::plaintext_off_loopback_...`).
#[test]
fn a_listener_off_loopback_needs_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let config = format!(
            "data_dir = \"{}\"\n[[http]]\nlisten = \"{listen}\"\nupstream = \"{}\"\n",
            dir.path().join("data").display(),
            upstream.url()
        );
        let text = e2e::FenceProxy::refused(dir.path(), &config);
        assert!(text.contains("is not on loopback"), "{listen}: {text}");
    }
    let config = format!(
        "data_dir = \"{}\"\ninsecure = true\n[[http]]\nlisten = \"0.0.0.0:0\"\nupstream = \"{}\"\n",
        dir.path().join("data").display(),
        upstream.url()
    );
    let px = e2e::FenceProxy::start(dir.path(), &config, 1);
    px.process.wait_events(
        "plaintext off loopback (insecure = true): tokens and data travel unencrypted",
        1,
        |e| {
            e["what"]
                .as_str()
                .is_some_and(|w| w.contains("serves plain HTTP"))
        },
    );
}

/// Connections that never send a request, from one address, take at most
/// `startups_per_peer_max` of the listener's `connections_max`: a client elsewhere is still
/// served. (The flood comes from 127.0.0.2, the request from 127.0.0.1.)
#[test]
fn silent_connections_from_one_address_do_not_keep_others_out() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let config = format!(
        "data_dir = \"{}\"\nworkers = 1\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\nconnections_max = 20\nstartups_per_peer_max = 4\n",
        dir.path().join("data").display(),
        upstream.url()
    );
    let px = e2e::FenceProxy::start(dir.path(), &config, 1);
    let addr: std::net::SocketAddr = px.urls[0]["http://".len()..].parse().unwrap();
    let flood: Vec<std::net::TcpStream> = (0..30)
        .map(|_| e2e::connect_from("127.0.0.2", addr))
        .collect();
    let refused = px.process.wait_events(
        "refusing a connection: too many in start-up from this address",
        26,
        |_| true,
    );
    assert_eq!(refused["max"], 4, "{refused}");
    let a = runtime().block_on(send(
        &client(),
        "GET",
        &format!("{}/x", px.urls[0]),
        &[],
        body(""),
    ));
    assert_eq!(a.status, 200, "{a:?}");
    drop(flood);
}
