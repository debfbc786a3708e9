//! Who may call lockd, and on which resources: the policy file (`policy`, docs/security.md
//! "Identities and tenants").
//!
//! A caller is known by a bearer token (`authorization: Bearer TOKEN`; the file holds only the
//! token's SHA-256) or, failing that, by its client certificate (a DNS, URI or e-mail subject
//! alternative name, or the subject's common name), which rustls has already verified against
//! `tls_client_ca`. Each identity belongs to one tenant, and may use only the resources its
//! tenant owns (lockd-core's `Tenancy`: disjoint name prefixes, each tenant with its quotas).
//!
//! Over etcd, an instance that does not lead forwards a call with the caller's bearer token,
//! which the leader checks itself, or, for a caller known by its certificate, with the
//! identity's name in [`FORWARDED_IDENTITY_METADATA`]. The leader believes that name only from
//! an identity marked `peer`: another instance, known by its own certificate.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use lockd_core::{Quota, Rate, Tenancy, Tenant};
use sha2::{Digest, Sha256};
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::status::{permission_denied, unauthenticated};

/// Metadata on a call forwarded to the leader: the name of the identity its certificate
/// proved to the forwarding instance.
pub const FORWARDED_IDENTITY_METADATA: &str = "lockd-forwarded-identity";

/// Longest identity name, in bytes.
pub const IDENTITY_NAME_LEN_MAX: usize = 64;

/// Shortest bearer token `lockd hash-token` accepts, in bytes: 128 bits as hex.
pub const TOKEN_LEN_MIN: usize = 32;

/// The policy file, as written.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    tenant: Vec<TenantEntry>,
    #[serde(default)]
    identity: Vec<IdentityEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    prefixes: Vec<String>,
    leases_max: Option<usize>,
    waiters_max: Option<usize>,
    requests_max: Option<usize>,
    /// Acquire calls a second.
    acquire_rate: Option<u32>,
    /// Calls the bucket holds [default: acquire_rate].
    acquire_burst: Option<u32>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityEntry {
    name: String,
    tenant: Option<String>,
    #[serde(default)]
    peer: bool,
    /// `DNS:name`, `URI:uri`, `email:address` or `CN:name`.
    cert: Option<String>,
    /// SHA-256 of the bearer token, in hex.
    token_sha256: Option<String>,
}

/// A name a client certificate carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum CertName {
    Dns(String),
    Uri(String),
    Email(String),
    CommonName(String),
}

impl CertName {
    fn parse(text: &str) -> Result<CertName, String> {
        let (kind, value) = text
            .split_once(':')
            .ok_or_else(|| format!("cert {text:?} must be DNS:, URI:, email: or CN: and a name"))?;
        if value.is_empty() {
            return Err(format!("cert {text:?} has an empty name"));
        }
        Ok(match kind.to_ascii_lowercase().as_str() {
            // DNS names compare without regard to case (RFC 4343).
            "dns" => CertName::Dns(value.to_ascii_lowercase()),
            "uri" => CertName::Uri(value.to_string()),
            "email" => CertName::Email(email(value)),
            "cn" => CertName::CommonName(value.to_string()),
            _ => {
                return Err(format!(
                    "cert {text:?}: the kind must be DNS, URI, email or CN"
                ));
            }
        })
    }
}

/// An e-mail address with its domain in lower case (the domain compares without regard to
/// case; the local part exactly, RFC 5280 section 7.5).
fn email(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) => format!("{local}@{}", domain.to_ascii_lowercase()),
        None => address.to_string(),
    }
}

/// What a client certificate names: an identity (by index), none, or why it cannot be read.
type CertAnswer = Result<Option<usize>, String>;

/// Client certificates [`Policy`] remembers what they name.
const SEEN_MAX: usize = 4096;

/// Largest policy file lockd reads (a policy of 20,000 tenants is about 2 MiB).
const POLICY_FILE_MAX: u64 = 16 << 20;

/// One identity of the policy.
#[derive(Clone, Debug)]
pub struct Identity {
    pub name: String,
    /// Its tenant, by index in the tenancy; a peer may have none.
    tenant: Option<usize>,
    /// Another lockd instance: may forward calls for identities its certificate proved.
    peer: bool,
}

/// A loaded, checked policy.
#[derive(Debug)]
pub struct Policy {
    tenancy: Arc<Tenancy>,
    /// Shared with every call that an identity makes (no copy per call).
    identities: Vec<Arc<Identity>>,
    by_token: HashMap<[u8; 32], usize>,
    by_cert: HashMap<CertName, usize>,
    by_name: HashMap<String, usize>,
    /// What each client certificate seen lately names (its identity, or why none), so that a
    /// connection's certificate is read once, not at every call; cleared when full.
    seen: std::sync::Mutex<HashMap<Vec<u8>, CertAnswer>>,
    /// Whether any identity is known by a certificate.
    certs: bool,
}

fn valid_identity_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= IDENTITY_NAME_LEN_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b':'))
}

/// The SHA-256 of a bearer token, as the policy file gives it.
pub fn token_sha256(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Policy {
    /// Reads and checks the policy file at `path`.
    pub fn load(path: &Path) -> Result<Policy, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
        if !meta.is_file() {
            return Err("not a regular file".to_string());
        }
        if meta.len() > POLICY_FILE_MAX {
            return Err(format!(
                "{} bytes, more than the {POLICY_FILE_MAX} a policy may have",
                meta.len()
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
        Policy::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Policy, String> {
        let file: PolicyFile =
            toml::from_str(text).map_err(|e| format!("not a policy file: {e}"))?;
        let tenants = file
            .tenant
            .iter()
            .map(|t| {
                let acquire_rate = match (t.acquire_rate, t.acquire_burst) {
                    (None, None) => None,
                    (None, Some(_)) => {
                        return Err(format!(
                            "tenant {:?}: acquire_burst needs acquire_rate",
                            t.name
                        ));
                    }
                    (Some(per_second), burst) => Some(Rate {
                        per_second,
                        burst: burst.unwrap_or(per_second),
                    }),
                };
                Ok(Tenant {
                    name: t.name.clone(),
                    prefixes: t.prefixes.clone(),
                    quota: Quota {
                        leases_max: t.leases_max,
                        waiters_max: t.waiters_max,
                        requests_max: t.requests_max,
                        acquire_rate,
                    },
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let tenancy = Tenancy::new(tenants).map_err(|e| e.to_string())?;
        if file.identity.is_empty() {
            return Err("no [[identity]]: nobody could call lockd".to_string());
        }
        let mut policy = Policy {
            tenancy: Arc::new(tenancy),
            identities: Vec::new(),
            by_token: HashMap::new(),
            by_cert: HashMap::new(),
            by_name: HashMap::new(),
            seen: std::sync::Mutex::new(HashMap::new()),
            certs: false,
        };
        for (ix, e) in file.identity.into_iter().enumerate() {
            policy.add(ix, e)?;
        }
        Ok(policy)
    }

    fn add(&mut self, ix: usize, e: IdentityEntry) -> Result<(), String> {
        let who = format!("identity {:?}", e.name);
        if !valid_identity_name(&e.name) {
            return Err(format!(
                "{who}: a name is 1 ..= {IDENTITY_NAME_LEN_MAX} bytes of letters, digits and . _ - @ :"
            ));
        }
        if self.by_name.insert(e.name.clone(), ix).is_some() {
            return Err(format!("two identities are named {:?}", e.name));
        }
        let tenant = match &e.tenant {
            Some(name) => Some(
                self.tenancy
                    .tenants()
                    .iter()
                    .position(|t| &t.name == name)
                    .ok_or_else(|| format!("{who}: no [[tenant]] is named {name:?}"))?,
            ),
            None if e.peer => None,
            None => {
                return Err(format!(
                    "{who}: give it a tenant (only a peer may have none)"
                ));
            }
        };
        if e.cert.is_none() && e.token_sha256.is_none() {
            return Err(format!(
                "{who}: give it a cert, a token_sha256, or both: how else would it be known?"
            ));
        }
        if let Some(text) = &e.cert {
            let name = CertName::parse(text).map_err(|why| format!("{who}: {why}"))?;
            if let Some(&other) = self.by_cert.get(&name) {
                return Err(format!(
                    "{who}: cert {text:?} already names identity {:?}",
                    self.identities[other].name
                ));
            }
            self.by_cert.insert(name, ix);
            self.certs = true;
        }
        if let Some(text) = &e.token_sha256 {
            let hash = parse_sha256(text).ok_or_else(|| {
                format!("{who}: token_sha256 must be 64 hex digits (lockd hash-token prints it)")
            })?;
            if let Some(&other) = self.by_token.get(&hash) {
                return Err(format!(
                    "{who}: its token_sha256 already names identity {:?}",
                    self.identities[other].name
                ));
            }
            self.by_token.insert(hash, ix);
        }
        self.identities.push(Arc::new(Identity {
            name: e.name,
            tenant,
            peer: e.peer,
        }));
        Ok(())
    }

    /// How many identities it names.
    pub fn identities(&self) -> usize {
        self.identities.len()
    }

    /// The tenants, for the core.
    pub fn tenancy(&self) -> Arc<Tenancy> {
        Arc::clone(&self.tenancy)
    }

    /// Whether some identity can only be known by a client certificate (which needs
    /// `tls_client_ca`).
    pub fn needs_client_certificates(&self) -> bool {
        self.certs
    }

    /// Who makes a call: its bearer token's identity, else its certificate's; for a call
    /// forwarded by a peer, the identity the peer names.
    pub fn authenticate(
        &self,
        metadata: &MetadataMap,
        certs: Option<&[tlsconf::rustls::pki_types::CertificateDer<'static>]>,
    ) -> Result<&Arc<Identity>, Status> {
        let by_cert = || -> Result<Option<&Arc<Identity>>, Status> {
            let Some(leaf) = certs.and_then(<[_]>::first) else {
                return Ok(None);
            };
            self.by_certificate(leaf)
                .map(|i| i.map(|i| &self.identities[i]))
        };
        if let Some(name) = metadata.get(FORWARDED_IDENTITY_METADATA) {
            let forwarder = by_cert()?.ok_or_else(|| {
                unauthenticated("a forwarded call must come from a peer known by its certificate")
            })?;
            if !forwarder.peer {
                return Err(permission_denied(format!(
                    "identity {} is not a peer: it may not make calls for other identities",
                    forwarder.name
                )));
            }
            let name = name.to_str().unwrap_or_default();
            return self
                .by_name
                .get(name)
                .map(|&i| &self.identities[i])
                .ok_or_else(|| {
                    unauthenticated(format!(
                        "peer {} forwarded a call for {name:?}, which this policy does not know (are the instances' policies the same?)",
                        forwarder.name
                    ))
                });
        }
        if let Some(value) = metadata.get("authorization") {
            let text = value.to_str().unwrap_or_default();
            let token = text
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim())
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    unauthenticated("the authorization metadata must be `Bearer TOKEN`")
                })?;
            let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            return self
                .by_token
                .get(&hash)
                .map(|&i| &self.identities[i])
                .ok_or_else(|| unauthenticated("the bearer token is not in lockd's policy"));
        }
        by_cert()?.ok_or_else(|| {
            let how = if certs.is_some() {
                "the client certificate names no identity of lockd's policy"
            } else {
                "lockd has a policy: present a client certificate it names, or a bearer token (lockctl --token-file)"
            };
            unauthenticated(how)
        })
    }

    /// The identity the certificate `leaf` names, if one.
    fn by_certificate(
        &self,
        leaf: &tlsconf::rustls::pki_types::CertificateDer<'static>,
    ) -> Result<Option<usize>, Status> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let found = match seen.get(leaf.as_ref()) {
            Some(found) => found.clone(),
            None => {
                let found = self.read_certificate(leaf.as_ref());
                if seen.len() >= SEEN_MAX {
                    seen.clear();
                }
                seen.insert(leaf.as_ref().to_vec(), found.clone());
                found
            }
        };
        found.map_err(unauthenticated)
    }

    /// What the certificate `der` names: [`Policy::by_certificate`] without the memory.
    fn read_certificate(&self, der: &[u8]) -> CertAnswer {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Err("the client certificate cannot be parsed".to_string());
        };
        let mut names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            use x509_parser::extensions::GeneralName;
            for n in &san.value.general_names {
                match n {
                    GeneralName::DNSName(d) => names.push(CertName::Dns(d.to_ascii_lowercase())),
                    GeneralName::URI(u) => names.push(CertName::Uri((*u).to_string())),
                    GeneralName::RFC822Name(m) => names.push(CertName::Email(email(m))),
                    _ => {}
                }
            }
        }
        for cn in cert.subject().iter_common_name() {
            if let Ok(cn) = cn.as_str() {
                names.push(CertName::CommonName(cn.to_string()));
            }
        }
        let mut found: Vec<usize> = names
            .iter()
            .filter_map(|n| self.by_cert.get(n).copied())
            .collect();
        found.sort_unstable();
        found.dedup();
        match found.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(*one)),
            many => {
                let names: Vec<&str> = many
                    .iter()
                    .map(|&i| self.identities[i].name.as_str())
                    .collect();
                Err(format!(
                    "the client certificate names several identities ({}); a certificate must name one",
                    names.join(", ")
                ))
            }
        }
    }

    /// Whether `who`'s tenant owns `resource` (for listings; `authorize` says why not).
    pub fn owns(&self, who: &Identity, resource: &str) -> bool {
        who.tenant.is_some() && self.tenancy.owner_ix(resource) == who.tenant
    }

    /// Whether `who` may use `resource`: its tenant owns it.
    pub fn authorize(&self, who: &Identity, resource: &str) -> Result<(), Status> {
        let Some(tenant) = who.tenant else {
            return Err(permission_denied(format!(
                "identity {} has no tenant: it may only forward calls",
                who.name
            )));
        };
        if self.owns(who, resource) {
            return Ok(());
        }
        let t = &self.tenancy.tenants()[tenant];
        let owner = lockd_core::permits::owner_name(resource);
        let whose = match (owner == resource, fencing::reader::is_reserved(resource)) {
            (true, _) => String::new(),
            (false, true) => {
                format!(" (a read-write lock's reader, which is {owner:?}'s tenant's)")
            }
            (false, false) => format!(" (a semaphore's permit, which is {owner:?}'s tenant's)"),
        };
        Err(permission_denied(format!(
            "identity {} (tenant {}) may not use {resource:?}{whose}: its tenant's resources start with {}",
            who.name,
            t.name,
            t.prefixes
                .iter()
                .map(|p| format!("{p:?}"))
                .collect::<Vec<_>>()
                .join(" or ")
        )))
    }
}

impl Identity {
    /// The holder recorded for a grant to this identity: its name, and the client's own
    /// description after it in parentheses.
    pub fn holder(&self, described: &str) -> String {
        if described.is_empty() || described == self.name {
            self.name.clone()
        } else {
            format!("{} ({described})", self.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tlsconf::rustls::pki_types::CertificateDer;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn policy() -> Policy {
        Policy::parse(&format!(
            r#"
            [[tenant]]
            name = "pay"
            prefixes = ["pay/", "ledger/"]
            waiters_max = 10
            [[tenant]]
            name = "inv"
            prefixes = ["inv/"]
            acquire_rate = 5
            [[identity]]
            name = "pay-api"
            tenant = "pay"
            token_sha256 = "{}"
            [[identity]]
            name = "inv-worker"
            tenant = "inv"
            cert = "DNS:Inv-Worker.internal"
            [[identity]]
            name = "lockd-1"
            peer = true
            cert = "URI:spiffe://prod/lockd/1"
            "#,
            token_sha256(TOKEN)
        ))
        .unwrap()
    }

    /// A certificate with these subject alternative names (`DNS:`/`URI:` prefixes) and CN.
    fn cert(sans: &[&str], cn: &str) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.split_once(':') {
                Some(("DNS", d)) => rcgen::SanType::DnsName(d.try_into().unwrap()),
                Some(("URI", u)) => rcgen::SanType::URI(u.try_into().unwrap()),
                Some(("EMAIL", m)) => rcgen::SanType::Rfc822Name(m.try_into().unwrap()),
                _ => panic!("{s}"),
            })
            .collect();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    fn md(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    fn who(
        p: &Policy,
        m: &[(&'static str, &str)],
        c: Option<&CertificateDer<'static>>,
    ) -> Result<String, (tonic::Code, String)> {
        let certs = c.map(|c| vec![c.clone()]);
        p.authenticate(&md(m), certs.as_deref())
            .map(|i| i.name.clone())
            .map_err(|s| (s.code(), s.message().to_string()))
    }

    #[test]
    fn callers_are_known_by_token_or_certificate() {
        let p = policy();
        let bearer = format!("Bearer {TOKEN}");
        assert_eq!(
            who(&p, &[("authorization", &bearer)], None).unwrap(),
            "pay-api"
        );
        // The scheme is case-insensitive; the token is not.
        let lower = format!("bearer {TOKEN}");
        assert_eq!(
            who(&p, &[("authorization", &lower)], None).unwrap(),
            "pay-api"
        );
        let upper = format!("Bearer {}", TOKEN.to_uppercase());
        assert!(
            who(&p, &[("authorization", &upper)], None)
                .unwrap_err()
                .1
                .contains("not in")
        );
        // A certificate by its DNS name, whatever its case; a token wins over a certificate.
        let inv = cert(&["DNS:inv-worker.INTERNAL"], "anything");
        assert_eq!(who(&p, &[], Some(&inv)).unwrap(), "inv-worker");
        assert_eq!(
            who(&p, &[("authorization", &bearer)], Some(&inv)).unwrap(),
            "pay-api"
        );
        // CN and URI names.
        let q = Policy::parse(
            r#"
            [[tenant]]
            name = "t"
            prefixes = ["t/"]
            [[identity]]
            name = "by-cn"
            tenant = "t"
            cert = "CN:batch runner"
            "#,
        )
        .unwrap();
        assert_eq!(
            who(&q, &[], Some(&cert(&[], "batch runner"))).unwrap(),
            "by-cn"
        );
        assert!(who(&q, &[], Some(&cert(&["DNS:batch runner"], "x"))).is_err());
        // An e-mail name: its domain in any case, its local part exactly.
        let m = Policy::parse(
            r#"
            [[tenant]]
            name = "t"
            prefixes = ["t/"]
            [[identity]]
            name = "ops"
            tenant = "t"
            cert = "email:ops@Example.com"
            "#,
        )
        .unwrap();
        assert_eq!(
            who(&m, &[], Some(&cert(&["EMAIL:ops@EXAMPLE.COM"], "x"))).unwrap(),
            "ops"
        );
        assert!(who(&m, &[], Some(&cert(&["EMAIL:Ops@example.com"], "x"))).is_err());
    }

    #[test]
    fn every_way_of_not_being_known_is_unauthenticated_with_its_reason() {
        let p = policy();
        let unauth = |r: Result<String, (tonic::Code, String)>, expected: &str| {
            let (code, msg) = r.unwrap_err();
            assert_eq!(code, tonic::Code::Unauthenticated, "{msg}");
            assert!(msg.contains(expected), "{msg}");
        };
        unauth(who(&p, &[], None), "present a client certificate");
        unauth(
            who(&p, &[("authorization", "Bearer")], None),
            "Bearer TOKEN",
        );
        unauth(
            who(&p, &[("authorization", "Bearer ")], None),
            "Bearer TOKEN",
        );
        unauth(who(&p, &[("authorization", TOKEN)], None), "Bearer TOKEN");
        unauth(
            who(&p, &[("authorization", &format!("Basic {TOKEN}"))], None),
            "Bearer TOKEN",
        );
        unauth(who(&p, &[("authorization", "Bearer x")], None), "not in");
        // A wrong token is refused even with a good certificate beside it.
        let inv = cert(&["DNS:inv-worker.internal"], "x");
        unauth(
            who(&p, &[("authorization", "Bearer x")], Some(&inv)),
            "not in",
        );
        unauth(
            who(&p, &[], Some(&cert(&["DNS:stranger"], "x"))),
            "names no identity",
        );
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        unauth(who(&p, &[], Some(&garbage)), "cannot be parsed");
        // A certificate naming two identities is refused, not resolved by order.
        let q = Policy::parse(
            r#"
            [[tenant]]
            name = "t"
            prefixes = ["t/"]
            [[identity]]
            name = "a"
            tenant = "t"
            cert = "DNS:a"
            [[identity]]
            name = "b"
            tenant = "t"
            cert = "CN:b"
            "#,
        )
        .unwrap();
        unauth(
            who(&q, &[], Some(&cert(&["DNS:a"], "b"))),
            "several identities (a, b)",
        );
    }

    #[test]
    fn only_a_peer_known_by_its_certificate_may_name_the_caller() {
        let p = policy();
        let peer = cert(&["URI:spiffe://prod/lockd/1"], "x");
        let inv = cert(&["DNS:inv-worker.internal"], "x");
        let fwd = |name| [(FORWARDED_IDENTITY_METADATA, name)];
        assert_eq!(
            who(&p, &fwd("inv-worker"), Some(&peer)).unwrap(),
            "inv-worker"
        );
        // Not a peer: an application cannot speak for another.
        let (code, msg) = who(&p, &fwd("pay-api"), Some(&inv)).unwrap_err();
        assert_eq!(code, tonic::Code::PermissionDenied, "{msg}");
        // No certificate: a bearer token does not make a peer, nor does nothing.
        let bearer = format!("Bearer {TOKEN}");
        let mut with_token = fwd("inv-worker").to_vec();
        with_token.push(("authorization", &bearer));
        let (code, _) = who(&p, &with_token, None).unwrap_err();
        assert_eq!(code, tonic::Code::Unauthenticated);
        assert_eq!(
            who(&p, &fwd("inv-worker"), None).unwrap_err().0,
            tonic::Code::Unauthenticated
        );
        // A name the policy does not know.
        let (code, msg) = who(&p, &fwd("ghost"), Some(&peer)).unwrap_err();
        assert_eq!(code, tonic::Code::Unauthenticated);
        assert!(msg.contains("ghost"), "{msg}");
    }

    #[test]
    fn an_identity_uses_only_its_tenants_resources() {
        let p = policy();
        let bearer = format!("Bearer {TOKEN}");
        let pay = p
            .authenticate(&md(&[("authorization", &bearer)]), None)
            .unwrap()
            .clone();
        for ok in ["pay/1", "ledger/2024", "pay/"] {
            p.authorize(&pay, ok).unwrap();
        }
        for denied in ["inv/1", "pay", "payments/1", "other", "", "Pay/1", "ledger"] {
            let s = p.authorize(&pay, denied).unwrap_err();
            assert_eq!(s.code(), tonic::Code::PermissionDenied, "{denied}");
            assert!(
                s.message().contains("\"pay/\" or \"ledger/\""),
                "{}",
                s.message()
            );
        }
        // A peer without a tenant may not lock anything itself.
        let peer = p.identities.iter().find(|i| i.peer).unwrap().clone();
        let s = p.authorize(&peer, "inv/1").unwrap_err();
        assert!(s.message().contains("no tenant"), "{}", s.message());
    }

    #[test]
    fn bad_policies_are_refused_with_the_reason() {
        let tenant = "[[tenant]]\nname = \"t\"\nprefixes = [\"t/\"]\n";
        let id = |body: &str| format!("{tenant}[[identity]]\n{body}\n");
        let h = token_sha256(TOKEN);
        let cases = [
            ("garbage = 1".to_string(), "not a policy file"),
            (tenant.to_string(), "no [[identity]]"),
            (id("name = \"a\"\ntenant = \"t\""), "give it a cert, a token_sha256"),
            (id("name = \"a b\"\ntenant = \"t\"\ncert = \"DNS:a\""), "a name is"),
            (id("name = \"a\"\ntenant = \"u\"\ncert = \"DNS:a\""), "no [[tenant]] is named \"u\""),
            (id("name = \"a\"\ncert = \"DNS:a\""), "give it a tenant"),
            (id("name = \"a\"\ntenant = \"t\"\ncert = \"IP:1.2.3.4\""), "DNS, URI, email or CN"),
            (id("name = \"a\"\ntenant = \"t\"\ncert = \"a.example\""), "must be DNS:"),
            (id("name = \"a\"\ntenant = \"t\"\ncert = \"DNS:\""), "empty name"),
            (id("name = \"a\"\ntenant = \"t\"\ntoken_sha256 = \"abc\""), "64 hex digits"),
            (id("name = \"a\"\ntenant = \"t\"\ntoken = \"secret\""), "unknown field"),
            (
                id(&format!(
                    "name = \"a\"\ntenant = \"t\"\ntoken_sha256 = \"{h}\"\n[[identity]]\nname = \"b\"\ntenant = \"t\"\ntoken_sha256 = \"{h}\""
                )),
                "already names identity \"a\"",
            ),
            (
                id("name = \"a\"\ntenant = \"t\"\ncert = \"dns:A\"\n[[identity]]\nname = \"b\"\ntenant = \"t\"\ncert = \"DNS:a\""),
                "already names identity \"a\"",
            ),
            (
                id("name = \"a\"\ntenant = \"t\"\ncert = \"DNS:a\"\n[[identity]]\nname = \"a\"\ntenant = \"t\"\ncert = \"DNS:b\""),
                "two identities",
            ),
            (
                "[[tenant]]\nname = \"t\"\nprefixes = [\"t/\"]\nacquire_burst = 3\n[[identity]]\nname = \"a\"\ntenant = \"t\"\ncert = \"DNS:a\"".to_string(),
                "acquire_burst needs acquire_rate",
            ),
            (
                "[[tenant]]\nname = \"t\"\nprefixes = [\"t/\"]\n[[tenant]]\nname = \"u\"\nprefixes = [\"t/x\"]\n[[identity]]\nname = \"a\"\ntenant = \"t\"\ncert = \"DNS:a\"".to_string(),
                "one owner",
            ),
        ];
        for (text, expected) in cases {
            let e = Policy::parse(&text).unwrap_err();
            assert!(e.contains(expected), "{text}\n=> {e}");
        }
    }
}
