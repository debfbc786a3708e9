//! What the HTTP mode shows operators (issue 18): each metric moves as the requests do, the
//! audit log records a refused stale write, /readyz, and the status page lists the mark and
//! the refusal.

use e2e::client::{body, client, send};
use e2e::upstream::Upstream;
use e2e::{FenceProxy, audit_records, http_get, promtool, sample};

use crate::{runtime, spawn_put};

#[test]
fn each_metric_moves_as_the_requests_do_and_a_stale_write_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let audit = dir.path().join("audit.jsonl");
    // A second listener whose upstream refuses connections: an upstream error. The port is
    // bound and never listened on, so no other test's listener can take it meanwhile.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dead = reserved.local_addr().unwrap();
    let config = format!(
        "admin_listen = \"127.0.0.1:0\"\naudit_log = \"{}\"\ndata_dir = \"{}\"\n[fence]\nbarrier_wait_ms = 200\n\
         [[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n\
         [[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{dead}\"\n",
        audit.display(),
        dir.path().join("data").display(),
        upstream.url()
    );
    let px = FenceProxy::start(dir.path(), &config, 2);
    let admin = px.admin();
    let rt = runtime();
    let c = client();
    let url = format!("{}/stock", px.urls[0]);
    let put =
        |headers: &[(&str, &str)]| rt.block_on(send(&c, "PUT", &url, headers, body(""))).status;
    // Two tokens passed (two raises), one stale, two malformed (one missing).
    assert_eq!(
        put(&[("fencing-resource", "inv:a"), ("fencing-token", "5")]),
        200
    );
    assert_eq!(
        put(&[("fencing-resource", "inv:a"), ("fencing-token", "7")]),
        200
    );
    assert_eq!(
        put(&[("fencing-resource", "inv:a"), ("fencing-token", "5")]),
        409
    );
    assert_eq!(put(&[("fencing-resource", "inv:a")]), 428);
    assert_eq!(
        put(&[("fencing-resource", "inv:a"), ("fencing-token", "abc")]),
        400
    );
    // A barrier wait that times out: 8 waits for 7's request held at the upstream.
    let old = spawn_put(&rt, &url, "inv:b", 7, Some("old"));
    upstream.wait_until("the old write", |s| {
        s.iter()
            .any(|s| s.token == Some(7) && s.resource.as_deref() == Some("inv:b"))
    });
    assert_eq!(
        put(&[("fencing-resource", "inv:b"), ("fencing-token", "8")]),
        503
    );
    upstream.release("old");
    assert_eq!(rt.block_on(old).unwrap().status, 200);
    // The upstream that is not there.
    let down = rt.block_on(send(
        &c,
        "PUT",
        &format!("{}/x", px.urls[1]),
        &[("fencing-resource", "inv:c"), ("fencing-token", "1")],
        body(""),
    ));
    assert_eq!(down.status, 502);

    let (status, text) = http_get(&admin, "/metrics");
    assert_eq!(status, 200);
    let v =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    // inv:a 5 and 7, inv:b 7, inv:c 1 (relayed, then the upstream failed).
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="http",outcome="passed"}"#),
        4.0
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="http",outcome="stale"}"#),
        1.0
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="http",outcome="malformed"}"#),
        2.0
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="http",outcome="barrier_timeout"}"#),
        1.0
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="pg",outcome="passed"}"#),
        0.0
    );
    // Raises: inv:a 5, 7; inv:b 7, 8 (raised, then timed out at the barrier); inv:c 1.
    assert_eq!(v(r#"fence_proxy_mark_raises_total{mode="http"}"#), 5.0);
    assert_eq!(v(r#"fence_proxy_barrier_waits_total{mode="http"}"#), 1.0);
    assert_eq!(v(r#"fence_proxy_barrier_timeouts_total{mode="http"}"#), 1.0);
    assert_eq!(
        v(r#"fence_proxy_upstream_errors_total{mode="http",kind="connect"}"#),
        1.0
    );
    assert_eq!(
        v(r#"fence_proxy_check_duration_seconds_count{mode="http"}"#),
        6.0
    );
    assert_eq!(v(r#"fence_proxy_resource_refusals{resource="inv:a"}"#), 1.0);
    assert_eq!(v(r#"fence_proxy_resource_refusals{resource="inv:b"}"#), 1.0);
    assert!(v(r#"fence_proxy_connections{mode="http"}"#) >= 0.0);
    let complaints = promtool(&text);
    assert!(complaints.trim().is_empty(), "promtool: {complaints}");

    // The refused stale write, in the audit log with everything an auditor needs.
    let records = audit_records(&audit, |r| r.iter().any(|r| r["result"] == "stale"));
    let stale = records.iter().find(|r| r["result"] == "stale").unwrap();
    assert_eq!(stale["type"], "refused_write", "{stale}");
    assert_eq!(stale["mode"], "http");
    assert_eq!(stale["resource"], "inv:a");
    assert_eq!(stale["token"], "5");
    assert_eq!(stale["highest"], 7);
    assert_eq!(stale["target"], "PUT /stock");
    assert!(
        stale["caller"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{stale}"
    );
    assert!(stale["time"].as_str().unwrap().ends_with('Z'), "{stale}");
    // Malformed requests are counted, not audited (nothing was at stake).
    assert!(
        records.iter().all(|r| r["result"] != "malformed"),
        "{records:?}"
    );

    assert_eq!(http_get(&admin, "/readyz"), (200, "ready\n".to_string()));
    assert_eq!(http_get(&admin, "/healthz").0, 200);
    let (status, page) = http_get(&admin, "/");
    assert_eq!(status, 200);
    assert!(page.contains("<td class=\"wrap\">inv:a</td>"), "{page}");
    assert!(page.contains("stale write(s) refused"), "{page}");
    assert_eq!(http_get(&admin, "/nope").0, 404);

    // DNS rebinding: a request for another host name is not answered.
    assert_eq!(raw_get(&admin, "rebind.attacker.example"), 421);
    assert_eq!(raw_get(&admin, "localhost:1"), 200);
    // 64 idle connections do not lock a probe out: the oldest is closed for it.
    let idle: Vec<std::net::TcpStream> = (0..64)
        .map(|_| std::net::TcpStream::connect(&admin).unwrap())
        .collect();
    assert_eq!(http_get(&admin, "/healthz").0, 200);
    let open = idle.iter().filter(|s| still_open(s)).count();
    assert!(
        open >= 60,
        "the probe waited for idle connections to time out: {open} open"
    );
}

/// Whether the server has not closed `s` (nothing to read, no end of stream).
fn still_open(s: &std::net::TcpStream) -> bool {
    use std::io::Read;
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    matches!((&*s).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// `GET /healthz` on `addr` with `Host: host`: the status.
fn raw_get(addr: &str, host: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    raw.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap()
}

#[test]
fn an_admin_listener_off_loopback_needs_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let said = FenceProxy::refused(
        dir.path(),
        "admin_listen = \"0.0.0.0:0\"\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\n",
    );
    assert!(
        said.contains("admin_listen 0.0.0.0:0 is not a loopback address"),
        "{said}"
    );
    let said = FenceProxy::refused(
        dir.path(),
        "audit_log = \"\"\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\n",
    );
    assert!(said.contains("audit_log must be a file path"), "{said}");
    let mut p = FenceProxy::spawn(
        dir.path(),
        &format!(
            "audit_log = \"{}/no/such/dir/a.jsonl\"\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\n",
            dir.path().display()
        ),
    );
    assert!(!p.wait().success());
    let said = p.stderr.text();
    assert!(
        said.contains("audit_log") && said.contains("cannot open it"),
        "{said}"
    );
}

#[test]
fn a_forged_token_is_counted_and_audited() {
    use e2e::keys::{SECRET_A, SECRET_B, sign, write_key_file};
    use fencing::signed::KeyState;
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let audit = dir.path().join("audit.jsonl");
    let keys = write_key_file(
        dir.path(),
        "fence-keys.toml",
        &[("k1", KeyState::Active, Some(SECRET_A))],
    );
    let config = format!(
        "admin_listen = \"127.0.0.1:0\"\naudit_log = \"{}\"\ndata_dir = \"{}\"\n[signing]\nkeys = \"{}\"\n\
         [[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n",
        audit.display(),
        dir.path().join("data").display(),
        keys.display(),
        upstream.url()
    );
    let px = FenceProxy::start(dir.path(), &config, 1);
    let admin = px.admin();
    let rt = runtime();
    let url = format!("{}/stock", px.urls[0]);
    let put = |token: &str| {
        rt.block_on(send(
            &client(),
            "PUT",
            &url,
            &[("fencing-resource", "inv:a"), ("fencing-token", token)],
            body(""),
        ))
        .status
    };
    assert_eq!(put(&sign("k1", SECRET_A, "inv:a", 5)), 200);
    // Signed with a key lockd does not have, and a bare number where a signature is required.
    let forged = sign("k1", SECRET_B, "inv:a", 9);
    assert_eq!(put(&forged), 403);
    assert_eq!(put("9"), 403);
    // lockd's valid token for another resource: refused here, and never shown whole.
    let elsewhere = sign("k1", SECRET_A, "inv:b", 11);
    assert_eq!(put(&elsewhere), 403);
    let (_, text) = http_get(&admin, "/metrics");
    assert_eq!(
        sample(
            &text,
            r#"fence_proxy_checks_total{mode="http",outcome="forged"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"fence_proxy_mark_raises_total{mode="http"}"#),
        Some(1.0),
        "a forged token raises nothing"
    );
    let records = audit_records(&audit, |r| r.len() >= 3);
    assert_eq!(records.len(), 3, "{records:?}");
    // A signed form is shown as its number, key id and 8 digits of its MAC.
    let shown = |t: &str| match t.match_indices('.').nth(1) {
        Some((i, _)) => format!("{}…", &t[..i + 9]),
        None => t.to_string(),
    };
    for (r, token) in records
        .iter()
        .zip([forged.as_str(), "9", elsewhere.as_str()])
    {
        assert_eq!(r["type"], "refused_write", "{r}");
        assert_eq!(r["result"], "forged", "{r}");
        assert_eq!(r["resource"], "inv:a", "{r}");
        assert_eq!(r["token"], shown(token), "{r}");
    }
    let (_, page) = http_get(&admin, "/");
    assert!(page.contains("not signed by lockd refused"), "{page}");
    let mac = elsewhere.rsplit('.').next().unwrap();
    assert!(!page.contains(mac), "{page}");
    assert!(!std::fs::read_to_string(&audit).unwrap().contains(mac));
}
