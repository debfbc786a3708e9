//! `[signing]`: the keys that verify signed fencing tokens, and the resources that need them
//! (docs/security.md).

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// Signed tokens (`[signing]`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SigningConfig {
    /// The key file (TOML, the same as lockd's `fence_keys`).
    pub keys: PathBuf,
    /// Prefixes of the resources that need signed tokens; `[""]` (the default): all of them.
    #[serde(default = "d_required")]
    pub required_prefixes: Vec<String>,
}

pub(crate) fn d_required() -> Vec<String> {
    vec![String::new()]
}

impl SigningConfig {
    /// The policy: the key file read and checked (no key usable, a secret of the wrong
    /// size, or a file others may read is an error), and the prefixes.
    pub fn policy(&self) -> anyhow::Result<fencing::signed::Policy> {
        let path = &self.keys;
        let text = tlsconf::read_secret(path)
            .map_err(|why| anyhow::anyhow!("signing.keys {}: {why}", path.display()))?;
        let file: fencing::signed::KeyFile = toml::from_str(&text)
            .with_context(|| format!("signing.keys {} is not a key file", path.display()))?;
        let ring = fencing::signed::Keyring::new(&file)
            .map_err(|e| anyhow::anyhow!("signing.keys {}: {e}", path.display()))?;
        if ring
            .keys()
            .iter()
            .all(|k| k.state() == fencing::signed::KeyState::Retired)
        {
            bail!(
                "signing.keys {}: every key is retired; nothing could be verified",
                path.display()
            );
        }
        for p in &self.required_prefixes {
            if p.len() > fencing::RESOURCE_NAME_LEN_MAX
                || (!p.is_empty() && fencing::ResourceName::validate(p).is_err())
            {
                bail!(
                    "signing.required_prefixes: {p:?} is not the start of a resource name (at most 256 of A-Z a-z 0-9 - _ . : / @)"
                );
            }
        }
        Ok(fencing::signed::Policy::new(
            Some(ring),
            self.required_prefixes.clone(),
        ))
    }
}
