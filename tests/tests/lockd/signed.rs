//! lockd signs its tokens (`--fence-keys`): lockctl, the SDK and `lockctl run` carry the signed
//! form, and fence-proxy takes it; Describe never shows it (it is the holder's alone).

use e2e::keys::{SECRET_A, SECRET_B, write_key_file};
use e2e::upstream::Upstream;
use e2e::{FenceProxy, Lockd, output};
use fencing::signed::{KeyState, Keyring, Presented};

use crate::json;

fn verify(keys: &[(&str, KeyState, Option<&str>)], resource: &str, signed: &str) -> u64 {
    let file: fencing::signed::KeyFile = toml::from_str(&e2e::keys::key_file_text(keys)).unwrap();
    let ring = Keyring::new(&file).unwrap();
    let Presented::Signed(s) = Presented::parse(signed).unwrap() else {
        panic!("{signed:?} is not signed")
    };
    ring.verify(resource, &s)
        .unwrap_or_else(|e| panic!("{signed:?}: {e}"))
        .get()
}

fn acquire(lockd: &Lockd, args: &[&str]) -> serde_json::Value {
    let mut cmd = lockd.lockctl();
    cmd.args(["--json", "acquire"]).args(args);
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "{stderr}");
    json(&stdout)
}

#[test]
fn grants_carry_a_signed_token_for_their_resource() {
    let dir = tempfile::tempdir().unwrap();
    let keys = [("k1", KeyState::Active, Some(SECRET_A))];
    let file = write_key_file(dir.path(), "keys.toml", &keys);
    let lockd = Lockd::start(
        &dir.path().join("data"),
        &["--fence-keys", file.to_str().unwrap()],
    );
    lockd.wait_event("signing fencing tokens", |e| e["key_id"] == "k1");
    let g = acquire(&lockd, &["inv:1", "--ttl", "60s", "--request-id", "r-1"]);
    let signed = g["signed_token"].as_str().expect("a signed token");
    assert_eq!(verify(&keys, "inv:1", signed), g["token"].as_u64().unwrap());
    assert!(
        signed.starts_with(&format!("{}.k1.", g["token"])),
        "{signed}"
    );
    // A retry gets the same grant, signed the same.
    let again = acquire(&lockd, &["inv:1", "--ttl", "60s", "--request-id", "r-1"]);
    assert_eq!(again["signed_token"], g["signed_token"]);
    // Describe shows the token, never its signed form.
    let mut cmd = lockd.lockctl();
    cmd.args(["--json", "describe", "inv:1"]);
    let (_, out, _) = output(cmd);
    assert!(!out.contains(".k1."), "{out}");

    // lockctl run gives the command both forms.
    let mut cmd = lockd.lockctl();
    cmd.args([
        "run",
        "cron:x",
        "--",
        "sh",
        "-c",
        "echo \"$FENCING_TOKEN $FENCING_TOKEN_NUMBER\"",
    ]);
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{err}");
    let (signed, number) = out.trim().split_once(' ').unwrap();
    assert_eq!(verify(&keys, "cron:x", signed).to_string(), number);
}

#[test]
fn keys_rotate_and_bad_key_files_stop_lockd_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let rotated = [
        ("k2", KeyState::Active, Some(SECRET_B)),
        ("k1", KeyState::Verify, Some(SECRET_A)),
    ];
    let file = write_key_file(dir.path(), "keys.toml", &rotated);
    let lockd = Lockd::start(
        &dir.path().join("data"),
        &["--fence-keys", file.to_str().unwrap()],
    );
    let g = acquire(&lockd, &["inv:1"]);
    assert!(g["signed_token"].as_str().unwrap().contains(".k2."), "{g}");
    drop(lockd);

    let cases: Vec<(std::path::PathBuf, &str)> = vec![
        (
            write_key_file(
                dir.path(),
                "none-active.toml",
                &[("k1", KeyState::Verify, Some(SECRET_A))],
            ),
            "the key file has 0",
        ),
        (
            write_key_file(
                dir.path(),
                "short.toml",
                &[("k1", KeyState::Active, Some("00ff"))],
            ),
            "the secret is 2 bytes",
        ),
        (dir.path().join("missing.toml"), "cannot read it"),
        (
            {
                let p = write_key_file(dir.path(), "open.toml", &rotated);
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
                p
            },
            "must not be readable by group or others",
        ),
    ];
    for (path, want) in cases {
        let mut cmd = std::process::Command::new(e2e::bin("lockd"));
        cmd.arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--fence-keys")
            .arg(&path)
            .env_remove("LOCKD_CONFIG");
        let (status, _, err) = output(cmd);
        assert_eq!(status.code(), Some(2), "{}: {err}", path.display());
        assert!(
            err.contains(want),
            "{}: wanted {want:?} in {err}",
            path.display()
        );
    }
}

/// The whole chain: lockd signs, `lockctl run` hands the signed token to curl, fence-proxy
/// verifies it; the same number typed by hand is refused.
#[test]
fn a_command_under_lockctl_run_writes_through_a_verifying_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let keys = [("k1", KeyState::Active, Some(SECRET_A))];
    let file = write_key_file(dir.path(), "keys.toml", &keys);
    let lockd = Lockd::start(
        &dir.path().join("data"),
        &["--fence-keys", file.to_str().unwrap()],
    );
    let upstream = Upstream::start();
    let px = FenceProxy::start(
        dir.path(),
        &format!(
            "data_dir = \"{}\"\n[signing]\nkeys = \"{}\"\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n",
            dir.path().join("marks").display(),
            file.display(),
            upstream.url()
        ),
        1,
    );
    let curl = format!(
        "curl -s -o /dev/null -w '%{{http_code}} ' -X PUT -H \"Fencing-Resource: $FENCING_RESOURCE\" \
         -H \"Fencing-Token: $FENCING_TOKEN\" {0}/stock; \
         curl -s -o /dev/null -w '%{{http_code}}' -X PUT -H \"Fencing-Resource: $FENCING_RESOURCE\" \
         -H \"Fencing-Token: $FENCING_TOKEN_NUMBER\" {0}/stock",
        px.urls[0]
    );
    let mut cmd = lockd.lockctl();
    cmd.args(["run", "inventory:sku-1", "--", "sh", "-c", &curl]);
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{err}");
    assert_eq!(out.trim(), "200 403", "signed, then the bare number");
    assert_eq!(upstream.seen().len(), 1);
}
