//! Signed fencing tokens: a token that only lockd can have issued for its resource.
//!
//! A plain token is a number anyone can type. A client that may write through fence-proxy could
//! present `9223372036854775807` and raise the resource's mark for good. With signing on, lockd
//! gives each grant's holder the token in a signed form, and fence-proxy lets a token pass or
//! raise a mark only when its signature is good for that resource (DESIGN.md invariant 10).
//!
//! The form (docs/security.md):
//!
//! ```text
//! {token}.{key id}.{mac}
//! 42.2026-12.9b1c…(64 lowercase hex digits)
//! ```
//!
//! `mac` is HMAC-SHA256 under the key named by `key id` of the message
//! `fence-v1 LF resource LF token`. `token` is in canonical decimal (no leading zeros), and the
//! message uses the same canonical form. HMAC rather than a public-key signature is used because
//! PostgreSQL must verify it inside the check, with nothing but its built-in `sha256`.
//! The PostgreSQL side gets the HMAC pads of each key ([`FenceKey::pads`]) and computes
//! `sha256(opad || sha256(ipad || message))`.
//!
//! Keys have ids, so they can be rotated. Exactly one key is `active` at lockd (it signs). The
//! verifiers accept every `active` and `verify` key. A `retired` key, kept by id without its
//! secret, makes its tokens fail with a refusal that says so.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::{FencingToken, ResourceName};

/// The domain-separation prefix of every signed message (the format's version).
pub const MESSAGE_PREFIX: &str = "fence-v1";
/// Longest key id, in bytes.
pub const KEY_ID_LEN_MAX: usize = 32;
/// Shortest and longest secret, in bytes: at least the hash's output (RFC 2104 section 3), at
/// most its block, so that the pads are the key itself padded.
pub const SECRET_LEN_MIN: usize = 32;
pub const SECRET_LEN_MAX: usize = 64;
/// Most digits of a token as presented, leading zeros included (what the PostgreSQL check
/// reads, so that both modes take the same texts).
pub const TOKEN_DIGITS_MAX: usize = 19;
/// Length of the MAC in the token, in hex digits.
pub const MAC_HEX_LEN: usize = 64;
/// Longest signed form: 19 digits, a key id, 64 hex digits and two dots.
pub const SIGNED_LEN_MAX: usize = 19 + 1 + KEY_ID_LEN_MAX + 1 + MAC_HEX_LEN;

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    /// Signs (at lockd; exactly one) and verifies.
    Active,
    /// Verifies only: the key of the last rotation, kept until its tokens are gone.
    Verify,
    /// Verifies nothing: a token signed with it is refused as signed by a retired key.
    Retired,
}

/// One entry of a key file, as written (`[[keys]]` in TOML).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub id: String,
    pub state: KeyState,
    /// The secret in hex, 32 to 64 bytes; not needed for a retired key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// A key file: the same file goes to lockd and to every fence-proxy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    pub keys: Vec<KeyEntry>,
}

/// A usable key.
#[derive(Clone)]
pub struct FenceKey {
    id: String,
    state: KeyState,
    secret: Vec<u8>,
    /// The HMAC keyed once (its padded key hashed), cloned for each MAC: a verifier computes
    /// one per request.
    keyed: Hmac<Sha256>,
}

impl fmt::Debug for FenceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("FenceKey")
            .field("id", &self.id)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl FenceKey {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn state(&self) -> KeyState {
        self.state
    }

    /// The HMAC-SHA256 inner and outer pads of this key (RFC 2104): what PostgreSQL's check
    /// needs to compute the MAC with `sha256` alone. Empty for a retired key.
    pub fn pads(&self) -> Option<([u8; 64], [u8; 64])> {
        if self.state == KeyState::Retired {
            return None;
        }
        let mut ipad = [0x36u8; 64];
        let mut opad = [0x5cu8; 64];
        for (i, b) in self.secret.iter().enumerate() {
            ipad[i] ^= b;
            opad[i] ^= b;
        }
        Some((ipad, opad))
    }

    fn mac(&self, resource: &str, token: FencingToken) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(message(resource, token).as_bytes());
        mac
    }
}

/// The signed message for `(resource, token)`.
pub fn message(resource: &str, token: FencingToken) -> String {
    format!("{MESSAGE_PREFIX}\n{resource}\n{token}")
}

/// Why a key file cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyFileError {
    NoKeys,
    BadId {
        id: String,
    },
    DuplicateId {
        id: String,
    },
    Secret {
        id: String,
        reason: String,
    },
    /// A signer needs exactly one active key.
    Active {
        count: usize,
    },
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFileError::NoKeys => f.write_str("the key file has no keys"),
            KeyFileError::BadId { id } => write!(
                f,
                "key id {id:?} must be 1 to {KEY_ID_LEN_MAX} of A-Z a-z 0-9 - _"
            ),
            KeyFileError::DuplicateId { id } => write!(f, "key id {id:?} appears twice"),
            KeyFileError::Secret { id, reason } => write!(f, "key {id:?}: {reason}"),
            KeyFileError::Active { count } => write!(
                f,
                "lockd signs with the one key whose state is \"active\"; the key file has {count}"
            ),
        }
    }
}

impl std::error::Error for KeyFileError {}

fn valid_id(id: &str) -> bool {
    (1..=KEY_ID_LEN_MAX).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    text.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// The keys a process knows.
#[derive(Clone, Debug)]
pub struct Keyring {
    keys: Vec<FenceKey>,
}

impl Keyring {
    /// Checks a key file: valid, unique ids; a 32 to 64 byte hex secret for every key that
    /// is not retired.
    pub fn new(file: &KeyFile) -> Result<Keyring, KeyFileError> {
        if file.keys.is_empty() {
            return Err(KeyFileError::NoKeys);
        }
        let mut keys: Vec<FenceKey> = Vec::with_capacity(file.keys.len());
        for e in &file.keys {
            if !valid_id(&e.id) {
                return Err(KeyFileError::BadId { id: e.id.clone() });
            }
            if keys.iter().any(|k| k.id == e.id) {
                return Err(KeyFileError::DuplicateId { id: e.id.clone() });
            }
            let secret = match (&e.secret, e.state) {
                (_, KeyState::Retired) => Vec::new(),
                (None, _) => {
                    return Err(KeyFileError::Secret {
                        id: e.id.clone(),
                        reason: "an active or verify key needs its secret (hex)".into(),
                    });
                }
                (Some(hex), _) => {
                    let bytes = decode_hex(hex.trim()).ok_or_else(|| KeyFileError::Secret {
                        id: e.id.clone(),
                        reason: "the secret is not hex (an even number of 0-9, a-f or A-F)".into(),
                    })?;
                    if !(SECRET_LEN_MIN..=SECRET_LEN_MAX).contains(&bytes.len()) {
                        return Err(KeyFileError::Secret {
                            id: e.id.clone(),
                            reason: format!(
                                "the secret is {} bytes; it must be {SECRET_LEN_MIN} to {SECRET_LEN_MAX} \
                                 (generate one with `openssl rand -hex 32`)",
                                bytes.len()
                            ),
                        });
                    }
                    if bytes.iter().all(|b| *b == bytes[0]) {
                        return Err(KeyFileError::Secret {
                            id: e.id.clone(),
                            reason: "the secret is one byte repeated: not a random key (generate one with `openssl rand -hex 32`)".into(),
                        });
                    }
                    bytes
                }
            };
            let keyed = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret).expect("any key length");
            keys.push(FenceKey {
                id: e.id.clone(),
                state: e.state,
                secret,
                keyed,
            });
        }
        Ok(Keyring { keys })
    }

    /// [`Keyring::new`], for a signer: exactly one active key.
    pub fn for_signing(file: &KeyFile) -> Result<Keyring, KeyFileError> {
        let ring = Keyring::new(file)?;
        let count = ring
            .keys
            .iter()
            .filter(|k| k.state == KeyState::Active)
            .count();
        if count != 1 {
            return Err(KeyFileError::Active { count });
        }
        Ok(ring)
    }

    pub fn keys(&self) -> &[FenceKey] {
        &self.keys
    }

    /// The key that signs: the active one (the first, if a verifier's file has several).
    pub fn active(&self) -> Option<&FenceKey> {
        self.keys.iter().find(|k| k.state == KeyState::Active)
    }

    /// The signed form of `(resource, token)` under the active key; `None` without one.
    pub fn sign(&self, resource: &str, token: FencingToken) -> Option<String> {
        let key = self.active()?;
        let mac = key.mac(resource, token).finalize().into_bytes();
        Some(format!("{token}.{}.{}", key.id, encode_hex(&mac)))
    }

    /// Checks a signed token for `resource`: a known key that is not retired, and a good MAC.
    pub fn verify(&self, resource: &str, signed: &Signed<'_>) -> Result<FencingToken, Refusal> {
        let Some(key) = self.keys.iter().find(|k| k.id == signed.key_id) else {
            return Err(Refusal::UnknownKey {
                key_id: signed.key_id.to_string(),
            });
        };
        if key.state == KeyState::Retired {
            return Err(Refusal::RetiredKey {
                key_id: key.id.clone(),
            });
        }
        let tag = decode_hex(signed.mac).expect("checked by Presented::parse");
        key.mac(resource, signed.token)
            .verify_slice(&tag)
            .map_err(|_| Refusal::BadSignature {
                key_id: key.id.clone(),
            })?;
        Ok(signed.token)
    }
}

/// A signed token's parts, as presented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signed<'a> {
    pub token: FencingToken,
    pub key_id: &'a str,
    pub mac: &'a str,
}

/// A token as a client presented it: a plain number, or the signed form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presented<'a> {
    Plain(FencingToken),
    Signed(Signed<'a>),
}

/// Why a presented token is not a token at all (before any key is looked at).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MalformedToken {
    /// The number part (the whole text, for a plain token).
    Number(crate::ParseTokenError),
    /// A signed form with a bad key id or MAC, or the wrong number of parts.
    Form(&'static str),
    /// More than 19 digits (leading zeros included): PostgreSQL's check reads no more.
    TooManyDigits,
}

impl fmt::Display for MalformedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MalformedToken::Number(e) => e.fmt(f),
            MalformedToken::TooManyDigits => write!(
                f,
                "the fencing token has more than {TOKEN_DIGITS_MAX} digits (leading zeros count)"
            ),
            MalformedToken::Form(why) => write!(
                f,
                "the signed fencing token is malformed ({why}); the form is TOKEN.KEY_ID.MAC (64 lowercase hex digits)"
            ),
        }
    }
}

impl std::error::Error for MalformedToken {}

impl<'a> Presented<'a> {
    /// Parses a token as presented: digits only (a plain token, [`FencingToken`]'s rules, at
    /// most 19 digits), or `TOKEN.KEY_ID.MAC` with a key id of 1 to 32 of `A-Z a-z 0-9 - _` and a MAC of 64
    /// lowercase hex digits. Anything else is malformed.
    pub fn parse(text: &'a str) -> Result<Presented<'a>, MalformedToken> {
        let (number, rest) = match text.split_once('.') {
            Some((number, rest)) => (number, Some(rest)),
            None => (text, None),
        };
        if number.len() > TOKEN_DIGITS_MAX {
            return Err(MalformedToken::TooManyDigits);
        }
        let Some(rest) = rest else {
            return text
                .parse()
                .map(Presented::Plain)
                .map_err(MalformedToken::Number);
        };
        if text.len() > SIGNED_LEN_MAX {
            return Err(MalformedToken::Form("too long"));
        }
        let token: FencingToken = number.parse().map_err(MalformedToken::Number)?;
        let Some((key_id, mac)) = rest.split_once('.') else {
            return Err(MalformedToken::Form("two parts; three are needed"));
        };
        if !valid_id(key_id) {
            return Err(MalformedToken::Form("the key id"));
        }
        if mac.len() != MAC_HEX_LEN || !mac.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(MalformedToken::Form("the MAC"));
        }
        Ok(Presented::Signed(Signed { token, key_id, mac }))
    }

    /// The number, verified or not.
    pub fn token(&self) -> FencingToken {
        match self {
            Presented::Plain(t) => *t,
            Presented::Signed(s) => s.token,
        }
    }
}

/// Why a well-formed token is refused by the signature policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A plain token for a resource that requires signed ones.
    Unsigned,
    /// Signed with a key id the verifier does not know.
    UnknownKey { key_id: String },
    /// Signed with a key that has been retired.
    RetiredKey { key_id: String },
    /// The MAC is wrong: forged, altered, or signed for another resource.
    BadSignature { key_id: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unsigned => f.write_str(
                "the fencing token is not signed, and this resource requires tokens signed by lockd",
            ),
            Refusal::UnknownKey { key_id } => write!(
                f,
                "the fencing token is signed with key {key_id:?}, which is not a key of this fence"
            ),
            Refusal::RetiredKey { key_id } => write!(
                f,
                "the fencing token is signed with key {key_id:?}, which has been retired"
            ),
            Refusal::BadSignature { key_id } => write!(
                f,
                "the fencing token's signature (key {key_id:?}) is not lockd's for this resource and token: forged, altered, or signed for another resource"
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// What a verifier requires: its keys (none: signatures are not checked), and the resource
/// prefixes for which a token must be signed.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    keys: Option<Keyring>,
    required: Vec<String>,
}

impl Policy {
    /// `required`: prefixes of the resources that need signed tokens (`""`: every resource).
    pub fn new(keys: Option<Keyring>, required: Vec<String>) -> Policy {
        Policy { keys, required }
    }

    pub fn keys(&self) -> Option<&Keyring> {
        self.keys.as_ref()
    }

    pub fn required_prefixes(&self) -> &[String] {
        &self.required
    }

    /// Whether `resource` needs a signed token.
    pub fn requires(&self, resource: &str) -> bool {
        self.required
            .iter()
            .any(|p| resource.starts_with(p.as_str()))
    }

    /// The token `presented` stands for, for `resource`: a signed form is verified when the
    /// policy has keys (without keys, its number is taken as a plain token would be); a plain
    /// token passes unless the resource requires signed ones.
    pub fn admit(
        &self,
        resource: &ResourceName,
        presented: &Presented<'_>,
    ) -> Result<FencingToken, Refusal> {
        match presented {
            Presented::Plain(t) if !self.requires(resource.as_str()) => Ok(*t),
            Presented::Plain(_) => Err(Refusal::Unsigned),
            Presented::Signed(s) => match &self.keys {
                Some(ring) => ring.verify(resource.as_str(), s),
                None if self.requires(resource.as_str()) => Err(Refusal::UnknownKey {
                    key_id: s.key_id.to_string(),
                }),
                None => Ok(s.token),
            },
        }
    }
}

/// A fresh secret's hex, from 32 random bytes the caller provides (this crate draws no
/// randomness).
pub fn secret_hex(random: &[u8; 32]) -> String {
    encode_hex(random)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &[(&str, KeyState, Option<&str>)]) -> KeyFile {
        KeyFile {
            keys: entries
                .iter()
                .map(|(id, state, secret)| KeyEntry {
                    id: id.to_string(),
                    state: *state,
                    secret: secret.map(str::to_string),
                })
                .collect(),
        }
    }

    const A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    fn r(name: &str) -> ResourceName {
        ResourceName::new(name).unwrap()
    }

    #[test]
    fn the_mac_is_hmac_sha256_of_the_documented_message() {
        // RFC 4231 test case 2 checks the HMAC itself; this pins the message and the form.
        let ring = Keyring::for_signing(&file(&[("k1", KeyState::Active, Some(A))])).unwrap();
        let signed = ring.sign("inv:1", t(42)).unwrap();
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&decode_hex(A).unwrap()).unwrap();
        mac.update(b"fence-v1\ninv:1\n42");
        let want = encode_hex(&mac.finalize().into_bytes());
        assert_eq!(signed, format!("42.k1.{want}"));
        // The pads give the same MAC by the construction PostgreSQL uses.
        let (ipad, opad) = ring.keys()[0].pads().unwrap();
        use sha2::Digest;
        let inner = Sha256::new()
            .chain_update(ipad)
            .chain_update(b"fence-v1\ninv:1\n42")
            .finalize();
        let outer = Sha256::new()
            .chain_update(opad)
            .chain_update(inner)
            .finalize();
        assert_eq!(encode_hex(&outer), want);
    }

    #[test]
    fn rfc_4231_case_2() {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            encode_hex(&mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn only_the_signed_resource_and_token_verify() {
        let ring = Keyring::for_signing(&file(&[("k1", KeyState::Active, Some(A))])).unwrap();
        let policy = Policy::new(Some(ring.clone()), vec![String::new()]);
        let signed = ring.sign("inv:1", t(42)).unwrap();
        let p = Presented::parse(&signed).unwrap();
        assert_eq!(policy.admit(&r("inv:1"), &p), Ok(t(42)));
        assert!(matches!(
            policy.admit(&r("inv:2"), &p),
            Err(Refusal::BadSignature { .. })
        ));
        // Another token under the same MAC.
        let other = signed.replacen("42.", "43.", 1);
        assert!(matches!(
            policy.admit(&r("inv:1"), &Presented::parse(&other).unwrap()),
            Err(Refusal::BadSignature { .. })
        ));
        // i64::MAX with a made-up MAC.
        let forged = format!("9223372036854775807.k1.{}", "0".repeat(64));
        assert!(matches!(
            policy.admit(&r("inv:1"), &Presented::parse(&forged).unwrap()),
            Err(Refusal::BadSignature { .. })
        ));
        // Plain tokens where signatures are required.
        assert_eq!(
            policy.admit(&r("inv:1"), &Presented::Plain(t(42))),
            Err(Refusal::Unsigned)
        );
    }

    #[test]
    fn leading_zeros_sign_as_the_number() {
        let ring = Keyring::for_signing(&file(&[("k1", KeyState::Active, Some(A))])).unwrap();
        let signed = ring.sign("inv:1", t(42)).unwrap();
        let padded = format!("0{signed}");
        let p = Presented::parse(&padded).unwrap();
        assert_eq!(ring.verify("inv:1", &p_signed(&p)), Ok(t(42)));
    }

    fn p_signed<'a>(p: &Presented<'a>) -> Signed<'a> {
        match p {
            Presented::Signed(s) => *s,
            Presented::Plain(_) => panic!("plain"),
        }
    }

    #[test]
    fn rotation_verify_keys_pass_and_retired_ones_say_so() {
        let old = Keyring::for_signing(&file(&[("old", KeyState::Active, Some(A))])).unwrap();
        let signed_old = old.sign("inv:1", t(7)).unwrap();
        let rotated = Keyring::new(&file(&[
            ("new", KeyState::Active, Some(B)),
            ("old", KeyState::Verify, Some(A)),
        ]))
        .unwrap();
        let p = Presented::parse(&signed_old).unwrap();
        assert_eq!(rotated.verify("inv:1", &p_signed(&p)), Ok(t(7)));
        let retired = Keyring::new(&file(&[
            ("new", KeyState::Active, Some(B)),
            ("old", KeyState::Retired, None),
        ]))
        .unwrap();
        assert_eq!(
            retired.verify("inv:1", &p_signed(&p)),
            Err(Refusal::RetiredKey {
                key_id: "old".into()
            })
        );
        let unknown = Keyring::new(&file(&[("new", KeyState::Active, Some(B))])).unwrap();
        assert_eq!(
            unknown.verify("inv:1", &p_signed(&p)),
            Err(Refusal::UnknownKey {
                key_id: "old".into()
            })
        );
    }

    #[test]
    fn malformed_forms_are_named() {
        let mac = "a".repeat(64);
        for bad in [
            "",
            "4x",
            "-1",
            "0",
            "1.k1",
            &format!("1..{mac}"),
            &format!("1.k 1.{mac}"),
            &format!("1.k1.{}", "A".repeat(64)),
            &format!("1.k1.{}", "a".repeat(63)),
            &format!("1.k1.{mac}.x"),
            &format!(".k1.{mac}"),
            &format!("9223372036854775808.k1.{mac}"),
            &format!("1.{}.{mac}", "k".repeat(33)),
            "00000000000000000042",
            &format!("00000000000000000042.k1.{mac}"),
        ] {
            assert!(Presented::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(Presented::parse(&format!("1.k-1_A.{mac}")).is_ok());
        assert!(Presented::parse("0000000000000000042").is_ok(), "19 digits");
    }

    #[test]
    fn without_keys_a_signed_form_is_its_number_unless_required() {
        let mac = "a".repeat(64);
        let text = format!("5.k1.{mac}");
        let p = Presented::parse(&text).unwrap();
        assert_eq!(Policy::default().admit(&r("x"), &p), Ok(t(5)));
        let required = Policy::new(None, vec!["x".into()]);
        assert!(required.admit(&r("x"), &p).is_err());
        assert_eq!(required.admit(&r("y"), &p), Ok(t(5)));
    }

    #[test]
    fn key_files_are_checked() {
        let bad = [
            (file(&[]), KeyFileError::NoKeys),
            (
                file(&[("a b", KeyState::Active, Some(A))]),
                KeyFileError::BadId { id: "a b".into() },
            ),
            (
                file(&[
                    ("a", KeyState::Active, Some(A)),
                    ("a", KeyState::Verify, Some(B)),
                ]),
                KeyFileError::DuplicateId { id: "a".into() },
            ),
        ];
        for (f, want) in bad {
            assert_eq!(Keyring::new(&f).unwrap_err(), want);
        }
        for secret in [
            None,
            Some("xyz"),
            Some("abcd"),
            Some(&*"ab".repeat(65)),
            Some(&*"00".repeat(32)),
        ] {
            assert!(matches!(
                Keyring::new(&file(&[("a", KeyState::Active, secret)])),
                Err(KeyFileError::Secret { .. })
            ));
        }
        assert_eq!(
            Keyring::for_signing(&file(&[("a", KeyState::Verify, Some(A))])).unwrap_err(),
            KeyFileError::Active { count: 0 }
        );
        assert!(
            format!(
                "{:?}",
                Keyring::new(&file(&[("a", KeyState::Active, Some(A))]))
            )
            .find("0011")
            .is_none()
        );
    }
}
