//! Key files for signed fencing tokens, and tokens signed with them, as lockd would sign them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use fencing::FencingToken;
use fencing::signed::{KeyEntry, KeyFile, KeyState, Keyring};

/// Secrets for the tests' keys (32 bytes each, hex).
pub const SECRET_A: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
pub const SECRET_B: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

/// A key file, as TOML.
pub fn key_file_text(keys: &[(&str, KeyState, Option<&str>)]) -> String {
    let file = KeyFile {
        keys: keys
            .iter()
            .map(|(id, state, secret)| KeyEntry {
                id: id.to_string(),
                state: *state,
                secret: secret.map(str::to_string),
            })
            .collect(),
    };
    toml::to_string(&file).expect("a key file serialises")
}

/// Writes a key file `name` in `dir`, readable by its owner only; returns its path.
pub fn write_key_file(dir: &Path, name: &str, keys: &[(&str, KeyState, Option<&str>)]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, key_file_text(keys)).expect("writing a key file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `(resource, token)` signed with the key `id` whose secret is `secret`.
pub fn sign(id: &str, secret: &str, resource: &str, token: u64) -> String {
    let ring = Keyring::for_signing(&KeyFile {
        keys: vec![KeyEntry {
            id: id.into(),
            state: KeyState::Active,
            secret: Some(secret.into()),
        }],
    })
    .expect("a valid test key");
    ring.sign(
        resource,
        FencingToken::new(token).expect("a token in range"),
    )
    .expect("an active key signs")
}
