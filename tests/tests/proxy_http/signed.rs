//! Signed tokens in the HTTP mode (invariant 10): a token that lockd did not sign for the
//! resource gets 403 and never moves the mark; and marks lowered by hand (`fence-proxy marks`).

use e2e::client::{Answer, body, client, send};
use e2e::keys::{SECRET_A, SECRET_B, sign, write_key_file};
use e2e::upstream::Upstream;
use fencing::signed::KeyState;

use crate::{proxy, runtime};

const R: &str = "inventory:sku-1";

/// A proxy that verifies with `keys`, requiring signatures under `required` (None: the
/// default, every resource).
fn signing_proxy(
    dir: &std::path::Path,
    upstream: &Upstream,
    keys: &[(&str, KeyState, Option<&str>)],
    required: Option<&str>,
) -> e2e::FenceProxy {
    let file = write_key_file(dir, "fence-keys.toml", keys);
    let required = required.map_or(String::new(), |r| format!("required_prefixes = {r}\n"));
    proxy(
        dir,
        upstream,
        &format!("\n[signing]\nkeys = \"{}\"\n{required}", file.display()),
        "",
    )
}

fn put(url: &str, resource: &str, token: &str) -> Answer {
    runtime().block_on(send(
        &client(),
        "PUT",
        url,
        &[("fencing-resource", resource), ("fencing-token", token)],
        body("n=1"),
    ))
}

#[test]
fn only_tokens_lockd_signed_for_the_resource_pass_or_raise_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = signing_proxy(
        dir.path(),
        &upstream,
        &[
            ("k2", KeyState::Active, Some(SECRET_B)),
            ("k1", KeyState::Retired, None),
        ],
        None,
    );
    let url = format!("{}/inventory/sku-1", px.urls[0]);
    let good = sign("k2", SECRET_B, R, 42);
    assert_eq!(put(&url, R, &good).status, 200);

    let forged = |token: &str, why: &str| {
        let a = put(&url, R, token);
        assert_eq!(a.status, 403, "{why}: {token}");
        let p = a.json();
        assert_eq!(p["resource"], R, "{why}");
        p
    };
    // i64::MAX with a made-up MAC, and the real MAC moved to a higher token.
    let p = forged(
        &format!("9223372036854775807.k2.{}", "0".repeat(64)),
        "i64::MAX",
    );
    assert_eq!(p["type"], "urn:fencing:problem:forged-token");
    let moved = good.replacen("42.", "43.", 1);
    assert_eq!(
        forged(&moved, "another token")["type"],
        "urn:fencing:problem:forged-token"
    );
    // Another resource's signature, for a higher token.
    let other = sign("k2", SECRET_B, "inventory:sku-2", 100);
    assert_eq!(
        forged(&other, "another resource")["type"],
        "urn:fencing:problem:forged-token"
    );
    // A retired key (rightly signed once), and a key the proxy does not know.
    let retired = sign("k1", SECRET_A, R, 100);
    let p = forged(&retired, "retired key");
    assert_eq!(
        (p["type"].as_str(), p["key_id"].as_str()),
        (Some("urn:fencing:problem:forged-token"), Some("k1"))
    );
    assert!(p["detail"].as_str().unwrap().contains("retired"), "{p}");
    let unknown = sign("k9", SECRET_A, R, 100);
    assert!(
        forged(&unknown, "unknown key")["detail"]
            .as_str()
            .unwrap()
            .contains("not a key of this fence")
    );
    // A plain number, where every resource needs a signature.
    let p = forged("100", "unsigned");
    assert_eq!(p["type"], "urn:fencing:problem:unsigned-token");
    // A signed form that is not one: 400, as for any malformed token.
    for bad in [
        format!("100.k2.{}", "A".repeat(64)),
        format!("100.k2.{}", "a".repeat(63)),
        "100.k2".to_string(),
        format!("100.k 2.{}", "a".repeat(64)),
        // 20 digits: more than the PostgreSQL check reads, so neither mode takes it.
        format!("0{}", sign("k2", SECRET_B, R, 4200000000000000000)),
    ] {
        let a = put(&url, R, &bad);
        assert_eq!(
            (a.status, a.json()["type"].as_str()),
            (400, Some("urn:fencing:problem:malformed-token")),
            "{bad:?}"
        );
    }
    // None of them moved the mark: the holder of 42 still writes, and only the holder's
    // requests reached the upstream.
    assert_eq!(put(&url, R, &good).status, 200, "the mark moved");
    assert_eq!(upstream.seen().len(), 2, "a refused request was relayed");
    // A newer grant, signed, raises it as before; the older one is then stale.
    assert_eq!(put(&url, R, &sign("k2", SECRET_B, R, 43)).status, 200);
    assert_eq!(put(&url, R, &good).status, 409);
}

#[test]
fn required_prefixes_choose_the_resources_that_need_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = signing_proxy(
        dir.path(),
        &upstream,
        &[("k1", KeyState::Active, Some(SECRET_A))],
        Some("[\"pay:\"]"),
    );
    let url = format!("{}/x", px.urls[0]);
    assert_eq!(
        put(&url, "inventory:a", "5").status,
        200,
        "outside the prefix"
    );
    assert_eq!(put(&url, "pay:a", "5").status, 403, "inside the prefix");
    assert_eq!(
        put(&url, "pay:a", &sign("k1", SECRET_A, "pay:a", 5)).status,
        200
    );
    // A signed token outside the prefixes is still verified when it is presented.
    let forged = format!("6.k1.{}", "1".repeat(64));
    assert_eq!(put(&url, "inventory:a", &forged).status, 403);
}

#[test]
fn bad_key_files_are_refused_at_start_up_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let cases: [(&str, &str, u32); 5] = [
        ("not toml", "not a key file", 0o600),
        (
            "[[keys]]\nid = \"k1\"\nstate = \"active\"\nsecret = \"abcd\"\n",
            "the secret is 2 bytes",
            0o600,
        ),
        (
            "[[keys]]\nid = \"k1\"\nstate = \"retired\"\n",
            "every key is retired",
            0o600,
        ),
        (
            &format!("[[keys]]\nid = \"k1\"\nstate = \"active\"\nsecret = \"{SECRET_A}\"\n"),
            "must not be readable by group or others",
            0o644,
        ),
        (
            &format!("[[keys]]\nid = \"k 1\"\nstate = \"active\"\nsecret = \"{SECRET_A}\"\n"),
            "key id",
            0o600,
        ),
    ]
    .map(|(t, w, m)| (Box::leak(t.to_string().into_boxed_str()) as &str, w, m));
    for (text, want, mode) in cases {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join("keys.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let config = format!(
            "[signing]\nkeys = \"{}\"\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n",
            path.display(),
            upstream.url()
        );
        let mut p = e2e::FenceProxy::spawn(dir.path(), &config);
        let status = p.wait();
        assert_eq!(status.code(), Some(2), "{text:?}");
        let err = p.stderr.text();
        assert!(err.contains(want), "{text:?}: wanted {want:?} in {err}");
    }
}

fn marks(args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = std::process::Command::new(e2e::bin("fence-proxy"));
    cmd.arg("marks").args(args).env("USER", "ops-alice");
    let (status, out, err) = e2e::output(cmd);
    (status.code(), out, err)
}

/// The runbook of docs/fence-proxy.md, for the embedded store: a forged token poisoned the
/// resource (a proxy without signing took it), the admin command lowers the mark, and the
/// legitimate holder writes again; the change is recorded.
#[test]
fn a_poisoned_mark_is_lowered_by_hand_and_the_holder_writes_again() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let mut px = proxy(dir.path(), &upstream, "", "");
    let url = format!("{}/x", px.urls[0]);
    assert_eq!(put(&url, R, "42").status, 200);
    assert_eq!(put(&url, R, "9223372036854775807").status, 200);
    assert_eq!(put(&url, R, "42").status, 409, "poisoned");
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();

    // While the proxy runs, the file has its writer.
    let (code, _, err) = marks(&["show", "--data-dir", data, R]);
    assert_eq!(code, Some(1));
    assert!(err.contains("stop it first"), "{err}");
    px.process.signal(libc::SIGTERM);
    px.process.wait();

    let (code, out, _) = marks(&["show", "--data-dir", data, R]);
    assert_eq!(code, Some(0));
    assert!(out.contains("mark=9223372036854775807"), "{out}");
    // Without --force, without a reason, or not lower: refused, and nothing changes.
    let (code, _, err) = marks(&[
        "lower",
        "--data-dir",
        data,
        R,
        "--to",
        "42",
        "--reason",
        "x",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--force"), "{err}");
    let (code, _, err) = marks(&[
        "lower",
        "--data-dir",
        data,
        R,
        "--to",
        "42",
        "--force",
        "--reason",
        " ",
    ]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = marks(&[
        "lower",
        "--data-dir",
        data,
        R,
        "--to",
        "9223372036854775807",
        "--force",
        "--reason",
        "x",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is not below it"), "{err}");
    let (code, out, err) = marks(&[
        "lower",
        "--data-dir",
        data,
        R,
        "--to",
        "42",
        "--force",
        "--reason",
        "forged token from 10.0.0.9",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("9223372036854775807 -> 42"), "{out}");
    let (_, out, _) = marks(&["show", "--data-dir", data, R]);
    assert!(out.contains("mark=42"), "{out}");
    assert!(
        out.contains("\"actor\":\"ops-alice\"")
            && out.contains("forged token from 10.0.0.9")
            && out.contains("\"old_token\":9223372036854775807"),
        "the change is not recorded: {out}"
    );

    let mut px = proxy(dir.path(), &upstream, "", "");
    let url = format!("{}/x", px.urls[0]);
    assert_eq!(put(&url, R, "42").status, 200, "the holder writes again");
    assert_eq!(put(&url, R, "41").status, 409, "and older tokens stay out");
    px.process.signal(libc::SIGTERM);
    px.process.wait();
    let (code, out, err) = marks(&[
        "reset",
        "--data-dir",
        data,
        R,
        "--force",
        "--reason",
        "retired",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("42 -> none"), "{out}");
}

/// On a route whose resource comes from the path, the signature is checked against the name
/// the normalised path gives, however the path is spelled: a token for one SKU does not pass
/// for another.
#[test]
fn a_routes_resource_is_the_one_the_signature_must_name() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let file = write_key_file(
        dir.path(),
        "fence-keys.toml",
        &[("k1", KeyState::Active, Some(SECRET_A))],
    );
    let px = proxy(
        dir.path(),
        &upstream,
        &format!("\n[signing]\nkeys = \"{}\"\n", file.display()),
        "[[http.routes]]\npath = \"/inventory/{sku}\"\nresource = \"inventory:{sku}\"\n",
    );
    let token = sign("k1", SECRET_A, "inventory:sku-1", 7);
    let put_path = |path: &str| {
        runtime()
            .block_on(send(
                &client(),
                "PUT",
                &format!("{}{path}", px.urls[0]),
                &[("fencing-token", token.as_str())],
                body("n=1"),
            ))
            .status
    };
    for spelling in [
        "/inventory/sku-1",
        "/inventory/%73ku-1",
        "/inventory/x/../sku-1",
        "//inventory/sku-1",
    ] {
        assert_eq!(put_path(spelling), 200, "{spelling}");
    }
    for other in [
        "/inventory/sku-2",
        "/inventory/%73ku-2",
        "/inventory/sku-1/../sku-2",
    ] {
        assert_eq!(put_path(other), 403, "{other}");
    }
}
