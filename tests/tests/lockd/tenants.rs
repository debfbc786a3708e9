//! Identities and tenants through lockctl over mutual TLS: a caller known by its client
//! certificate and one known by a bearer token file, each kept to its tenant's resources, the
//! identity as the holder in describe, and the ways a policy or a token file is refused. The
//! API conformance suite checks the same rules call by call on both backends
//! (`e2e::api::tenants_are_kept_apart_and_within_their_quotas`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use e2e::certs::{Ca, Pair};
use e2e::{Lockd, output};

use crate::json;

const PAY_TOKEN: &str = "6f1c0a5e9b7d4c3e8a2f1b0c9d8e7f6a";

/// How a lockctl call authenticates, besides trusting lockd's CA.
enum As<'a> {
    Cert(&'a Pair),
    TokenFile(&'a Path),
    Nothing,
}

struct Rig {
    lockd: Lockd,
    ca: PathBuf,
}

impl Rig {
    /// `lockctl --json ARGS` as `who`: (exit code, stdout, stderr).
    fn ctl(&self, who: &As, args: &[&str]) -> (Option<i32>, String, String) {
        let mut cmd = self.lockd.lockctl();
        cmd.env_remove("LOCKD_TOKEN_FILE")
            .arg("--ca")
            .arg(&self.ca)
            .arg("--json");
        match who {
            As::Cert(pair) => {
                cmd.arg("--cert")
                    .arg(&pair.cert)
                    .arg("--key")
                    .arg(&pair.key);
            }
            As::TokenFile(path) => {
                cmd.arg("--token-file").arg(path);
            }
            As::Nothing => {}
        }
        cmd.args(args);
        let (status, out, err) = output(cmd);
        (status.code(), out, err)
    }
}

/// A policy: tenant `pay` (`pay/`, known by token) and tenant `inv` (`inv/`, known by its
/// certificate's DNS name).
fn policy(dir: &Path) -> PathBuf {
    let path = dir.join("policy.toml");
    let text = format!(
        r#"
        [[tenant]]
        name = "pay"
        prefixes = ["pay/"]
        [[tenant]]
        name = "inv"
        prefixes = ["inv/"]
        [[identity]]
        name = "pay-api"
        tenant = "pay"
        token_sha256 = "{}"
        [[identity]]
        name = "inv-worker"
        tenant = "inv"
        cert = "DNS:inv-worker.internal"
        "#,
        e2e::sha256_hex(PAY_TOKEN)
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn secret_file(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn lockctl_callers_are_known_by_certificate_or_token_and_kept_to_their_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, clients) = (Ca::new(d, "server"), Ca::new(d, "clients"));
    let server = ca.issue(d, "lockd", &["127.0.0.1"], false);
    let inv = clients.issue(d, "inv", &["inv-worker.internal"], false);
    let unnamed = clients.issue(d, "unnamed", &["somebody.internal"], false);
    let policy = policy(d);
    let lockd = Lockd::start(
        &d.join("data"),
        &[
            "--tls-cert",
            server.cert.to_str().unwrap(),
            "--tls-key",
            server.key.to_str().unwrap(),
            "--tls-client-ca",
            clients.pem.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    let rig = Rig {
        lockd,
        ca: ca.pem.clone(),
    };
    let token = d.join("pay.token");
    secret_file(&token, &format!("{PAY_TOKEN}\n"), 0o600);
    let pay = As::TokenFile(&token);
    let inv = As::Cert(&inv);

    // The token's identity takes its tenant's lock; the holder is the identity, with the
    // client's own description after it.
    let (code, out, err) = rig.ctl(
        &pay,
        &["acquire", "pay/1", "--ttl", "60s", "--holder", "web-3"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let lease = json(&out);
    let lease_id = lease["lease_id"].as_str().unwrap().to_string();
    let (code, out, err) = rig.ctl(&pay, &["describe", "pay/1"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(json(&out)["holder"], "pay-api (web-3)");

    // The certificate's identity can do nothing with pay's lock, lease id or not.
    for args in [
        vec!["acquire", "pay/1"],
        vec!["acquire", "pay/2", "--wait", "5s"],
        vec!["describe", "pay/1"],
        vec!["renew", "pay/1", &lease_id],
        vec!["release", "pay/1", &lease_id],
        vec!["acquire", "elsewhere"],
    ] {
        let (code, out, err) = rig.ctl(&inv, &args);
        assert_eq!(code, Some(1), "{args:?}: {out}{err}");
        assert!(err.contains("permission_denied"), "{args:?}: {err}");
        assert!(
            err.contains("identity inv-worker (tenant inv) may not use"),
            "{err}"
        );
        assert!(
            err.contains("\"inv/\""),
            "the message says what it may use: {err}"
        );
    }
    let (_, out, _) = rig.ctl(&pay, &["describe", "pay/1"]);
    assert_eq!(
        json(&out)["token"],
        lease["token"],
        "pay/1 is still pay-api's"
    );
    let (code, out, err) = rig.ctl(&inv, &["acquire", "inv/1"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (_, out, _) = rig.ctl(&inv, &["describe", "inv/1"]);
    let holder = json(&out)["holder"].as_str().unwrap().to_string();
    assert!(
        holder.starts_with("inv-worker ("),
        "the default holder follows the identity: {holder}"
    );
    // Nor can pay-api use inv's.
    let (code, _, err) = rig.ctl(&pay, &["describe", "inv/1"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("identity pay-api (tenant pay) may not use \"inv/1\""),
        "{err}"
    );

    // Callers the policy does not know: each told what is missing.
    let stranger = d.join("stranger.token");
    secret_file(&stranger, "0000000000000000ffffffffffffffff", 0o600);
    let cases = [
        (
            As::Nothing,
            "present a client certificate it names, or a bearer token",
        ),
        (
            As::Cert(&unnamed),
            "the client certificate names no identity",
        ),
        (
            As::TokenFile(&stranger),
            "the bearer token is not in lockd's policy",
        ),
    ];
    for (who, expected) in &cases {
        let (code, out, err) = rig.ctl(who, &["describe", "pay/1"]);
        assert_eq!(code, Some(1), "{out}{err}");
        assert!(
            err.contains("unauthenticated") && err.contains(expected),
            "{err}"
        );
    }
    // A token file others may read is refused before anything is sent; so is an empty one.
    secret_file(&stranger, PAY_TOKEN, 0o644);
    let (code, _, err) = rig.ctl(&As::TokenFile(&stranger), &["describe", "pay/1"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("must not be readable by group or others"),
        "{err}"
    );
    secret_file(&stranger, "\n", 0o600);
    let (code, _, err) = rig.ctl(&As::TokenFile(&stranger), &["describe", "pay/1"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("printable ASCII"), "{err}");
    // None of it took lockd down, and the holder released.
    let (code, out, err) = rig.ctl(&pay, &["release", "pay/1", &lease_id]);
    assert_eq!(code, Some(0), "{out}{err}");
}

#[test]
fn a_bearer_token_is_not_sent_in_plaintext_to_another_host() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("t");
    secret_file(&token, PAY_TOKEN, 0o600);
    let mut cmd = std::process::Command::new(e2e::bin("lockctl"));
    cmd.args(["--endpoint", "http://192.0.2.1:7420", "--token-file"])
        .arg(&token)
        .args(["describe", "x"]);
    let (status, _, err) = output(cmd);
    assert_eq!(status.code(), Some(1));
    assert!(
        err.contains("not sent over plaintext to another host"),
        "{err}"
    );
}

#[test]
fn bad_policies_are_refused_at_start_up_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "server");
    let server = ca.issue(d, "lockd", &["127.0.0.1"], false);
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let by_cert = write(
        "cert.toml",
        "[[tenant]]\nname = \"t\"\nprefixes = [\"t/\"]\n[[identity]]\nname = \"a\"\ntenant = \"t\"\ncert = \"DNS:a\"\n",
    );
    let overlap = write(
        "overlap.toml",
        "[[tenant]]\nname = \"t\"\nprefixes = [\"jobs/\"]\n[[tenant]]\nname = \"u\"\nprefixes = [\"jobs/nightly/\"]\n[[identity]]\nname = \"a\"\ntenant = \"t\"\ntoken_sha256 = \"00000000000000000000000000000000000000000000000000000000000000ff\"\n",
    );
    let garbage = write("garbage.toml", "tenant = 3\n");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--policy".into(),
                d.join("missing.toml").display().to_string(),
            ],
            "cannot read it",
        ),
        (vec!["--policy".into(), garbage], "not a policy file"),
        (
            vec!["--policy".into(), "/dev/zero".into()],
            "not a regular file",
        ),
        (
            vec!["--policy".into(), overlap],
            "a resource must have one owner",
        ),
        // A certificate identity, and lockd does not ask for client certificates.
        (
            vec![
                "--policy".into(),
                by_cert,
                "--tls-cert".into(),
                server.cert.display().to_string(),
                "--tls-key".into(),
                server.key.display().to_string(),
            ],
            "identities known by a certificate need tls_client_ca",
        ),
    ];
    for (args, want) in cases {
        let mut cmd = std::process::Command::new(e2e::bin("lockd"));
        cmd.arg("--data-dir").arg(d.join("data")).args(&args);
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    // --hash-token refuses a token too short to be one.
    let mut cmd = std::process::Command::new(e2e::bin("lockd"));
    cmd.arg("--hash-token");
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("at least 32 characters"), "{stderr}");
}
