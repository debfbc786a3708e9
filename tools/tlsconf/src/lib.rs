//! TLS for the project's listeners and clients, with rustls (and its `ring` provider).
//!
//! - [`ServerFiles`] → [`Reloadable`]: a server configuration from PEM files (a certificate
//!   chain, its key, and optionally the CA that client certificates must chain to, which
//!   turns on mutual TLS). [`Reloadable::reload`] reads the files again (on SIGHUP) and
//!   swaps the configuration in for new connections only. Connections already open keep the
//!   one they were accepted with, and a reload that fails keeps the old one.
//! - [`ClientFiles`] → [`client_config`]: the CA that verifies the server, and optionally a
//!   client certificate and key.
//! - [`ClientTls`]: a client configuration that can be read again, verifying the server
//!   ([`Verify::Full`]) or only encrypting ([`Verify::EncryptOnly`], libpq's `sslmode=require`).
//! - [`handshake_error`]: what a failed handshake means, in words an operator can act on
//!   (a plaintext client on a TLS port, no client certificate, an unknown CA...).
//! - [`Stream`]: plaintext or TLS, either side, as one connection type.
//! - [`reload_on_sighup`]: reads every [`Reload`] again on SIGHUP, bounded in time, logged.
//! - [`PerPeer`]: connections still negotiating, bounded per peer address.
//!
//! Every error names the file and what is wrong with it: a missing file, no PEM block, a key
//! that does not belong to the certificate. [`read_secret`] reads other files of secrets
//! (the key files of signed tokens) with the same care.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

pub use rustls;
pub use tokio_rustls;

mod per_peer;
mod reload;
mod stream;
pub use per_peer::{PeerSlot, PerPeer};
pub use reload::{Reload, reload_on_sighup};
pub use stream::Stream;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {what} {} holds no PEM {kind} (a block starting with -----BEGIN)", path.display())]
    Empty {
        what: &'static str,
        kind: &'static str,
        path: PathBuf,
    },
    #[error("the {what} {} is not valid PEM: {reason}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the CA file {}: {reason}", path.display())]
    Ca { path: PathBuf, reason: String },
    #[error("the certificate {} and the key {} do not go together: {reason}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("{0}")]
    Config(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Largest certificate, key or CA file read: far above any real chain or CA bundle.
const FILE_MAX: u64 = 1 << 20;

/// A regular file of at most [`FILE_MAX`] bytes: a FIFO or a device would block or never end
/// (at start-up, or inside a running daemon on SIGHUP).
fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let err = |source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    if !meta.is_file() {
        return Err(err(std::io::Error::other("not a regular file")));
    }
    if meta.len() > FILE_MAX {
        return Err(err(std::io::Error::other(format!(
            "{} bytes, more than the {FILE_MAX} a certificate or key file may have",
            meta.len()
        ))));
    }
    let bytes = std::fs::read(path).map_err(err)?;
    if bytes.len() as u64 > FILE_MAX {
        return Err(err(std::io::Error::other(
            "grew past the size limit while read",
        )));
    }
    Ok(bytes)
}

/// A file of secrets (a key file of signed tokens), as text: a regular file of at most 1 MiB
/// that neither group nor others may read. The error says which of these it is not.
pub fn read_secret(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "the file holds secrets and must not be readable by group or others (mode {:o}; chmod 600 it)",
            mode & 0o777
        ));
    }
    if meta.len() > FILE_MAX {
        return Err(format!(
            "{} bytes, more than the {FILE_MAX} it may have",
            meta.len()
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))
}

/// The certificates of a PEM file, in order (a chain: the leaf first).
fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(what, path, &read(what, path)?)
}

/// The certificates in `bytes`, read from `path`.
fn parse_certs(
    what: &'static str,
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            kind: "certificate",
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    parse_key(path, &read("key", path)?)
}

/// The private key in `bytes`, read from `path`.
fn parse_key(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    // PKCS#8 encrypted, or the traditional OpenSSL form (`Proc-Type: 4,ENCRYPTED`).
    if has(b"ENCRYPTED PRIVATE KEY") || has(b"Proc-Type: 4,ENCRYPTED") {
        return Err(TlsError::Pem {
            what: "key",
            path: path.to_path_buf(),
            reason: "it is encrypted; give the key unencrypted (openssl pkey -in KEY -out KEY.plain), readable by the daemon only".into(),
        });
    }
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "key",
            kind: "private key",
            path: path.to_path_buf(),
        },
        other => TlsError::Pem {
            what: "key",
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    roots_in(path, &read("CA file", path)?)
}

fn roots_in(path: &Path, bytes: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let certs = parse_certs("CA file", path, bytes)?;
    if let Some(why) = no_ca_among(&certs) {
        tracing::warn!(path = %path.display(), "{why}");
    }
    for cert in certs {
        roots.add(cert).map_err(|e| TlsError::Ca {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// A warning when no certificate of a CA file is a CA's (`basicConstraints CA:TRUE`): a leaf
/// given by mistake, which verifies nothing but itself.
fn no_ca_among(certs: &[CertificateDer<'static>]) -> Option<String> {
    let any_ca = certs.iter().any(|c| {
        x509_parser::parse_x509_certificate(c.as_ref()).is_ok_and(|(_, cert)| cert.is_ca())
    });
    (!any_ca).then(|| {
        "the CA file holds no CA certificate (none has basicConstraints CA:TRUE): certificates signed by a CA will not verify against it; was a leaf certificate given instead of its CA?".to_string()
    })
}

/// A warning when `cert` is outside its validity period now (clients will refuse it), and
/// the date it gives.
fn outside_validity(cert: &CertificateDer<'static>) -> Option<(&'static str, String)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let v = parsed.validity();
    let now = x509_parser::time::ASN1Time::now();
    if now > v.not_after {
        Some((
            "the certificate has expired: clients will refuse it; renew it and send SIGHUP",
            v.not_after.to_string(),
        ))
    } else if now < v.not_before {
        Some((
            "the certificate is not valid yet: clients will refuse it until then (is the clock right?)",
            v.not_before.to_string(),
        ))
    } else {
        None
    }
}

/// The files of a TLS listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFiles {
    /// The certificate chain (PEM), the server's own certificate first.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// Client certificates must chain to a CA in this file (PEM); without it, clients present
    /// none.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client may present no certificate at all (something else
    /// authenticates it, e.g. lockd's policy by bearer token). One it presents is verified.
    pub client_cert_optional: bool,
}

/// A server configuration from `files`, offering `alpn` (e.g. `h2` for gRPC).
pub fn server_config(files: &ServerFiles, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, TlsError> {
    server_parts(files, alpn).map(|(config, _)| config)
}

/// The configuration, and the leaf certificate it presents.
fn server_parts(
    files: &ServerFiles,
    alpn: &[&[u8]],
) -> Result<(Arc<ServerConfig>, CertificateDer<'static>), TlsError> {
    let certs = load_certs("certificate", &files.cert)?;
    let leaf = certs[0].clone();
    if let Some((why, date)) = outside_validity(&leaf) {
        tracing::warn!(path = %files.cert.display(), %date, "{why}");
    }
    let key = load_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider(),
            );
            let verifier = if files.client_cert_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| TlsError::Ca {
                path: ca.clone(),
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Pair {
            cert: files.cert.clone(),
            key: files.key.clone(),
            reason: e.to_string(),
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok((Arc::new(config), leaf))
}

/// A server configuration that can be read again from its files.
pub struct Reloadable {
    files: ServerFiles,
    alpn: Vec<Vec<u8>>,
    /// The configuration, and the leaf certificate it presents.
    current: RwLock<(Arc<ServerConfig>, CertificateDer<'static>)>,
}

impl Reloadable {
    pub fn new(files: ServerFiles, alpn: &[&[u8]]) -> Result<Reloadable, TlsError> {
        let current = RwLock::new(server_parts(&files, alpn)?);
        Ok(Reloadable {
            files,
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            current,
        })
    }

    pub fn files(&self) -> &ServerFiles {
        &self.files
    }

    /// An acceptor with the configuration in force now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        tokio_rustls::TlsAcceptor::from(Arc::clone(&current.0))
    }

    /// An acceptor with the configuration in force now, and the certificate it presents
    /// (the leaf): what a client's channel binding is computed over.
    pub fn acceptor_and_leaf(&self) -> (tokio_rustls::TlsAcceptor, CertificateDer<'static>) {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        (
            tokio_rustls::TlsAcceptor::from(Arc::clone(&current.0)),
            current.1.clone(),
        )
    }
}

impl Reload for Reloadable {
    /// Reads the files again. On success new connections use them; on failure nothing changes
    /// and the error says why.
    fn reload(&self) -> Result<(), TlsError> {
        let alpn: Vec<&[u8]> = self.alpn.iter().map(Vec::as_slice).collect();
        let fresh = server_parts(&self.files, &alpn)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    fn what(&self) -> String {
        format!("certificate {}", self.files.cert.display())
    }
}

impl std::fmt::Debug for Reloadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloadable")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The files of a TLS client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientFiles {
    /// The CA that the server's certificate must chain to (PEM).
    pub ca: Option<PathBuf>,
    /// A client certificate chain (PEM), for servers that ask for one (mutual TLS).
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
}

impl ClientFiles {
    /// Whether any file is given.
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// Checks that the files go together: a CA, and a certificate with its key or neither.
    pub fn check(&self) -> Result<(), TlsError> {
        match (&self.ca, &self.cert, &self.key) {
            (None, _, _) => Err(TlsError::Config(
                "TLS needs the CA file that verifies the server (--ca)".into(),
            )),
            (_, Some(_), None) | (_, None, Some(_)) => Err(TlsError::Config(
                "a client certificate needs its key, and a key its certificate (--cert and --key)"
                    .into(),
            )),
            _ => Ok(()),
        }
    }
}

/// The contents of a client's files, read once and checked (they parse, and the certificate
/// and key go together), for TLS stacks that take PEM (tonic's).
#[derive(Clone, Debug)]
pub struct ClientPems {
    pub ca: Vec<u8>,
    /// The client certificate chain and its key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientFiles {
    /// Reads the files ([`ClientFiles::check`] first) and checks what they hold.
    pub fn pems(&self) -> Result<ClientPems, TlsError> {
        self.check()?;
        let ca = read("CA file", self.ca.as_deref().expect("checked"))?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((read("certificate", cert)?, read("key", key)?)),
            _ => None,
        };
        let pems = ClientPems { ca, identity };
        build_client(self, &pems, &[])?;
        Ok(pems)
    }
}

/// A client configuration from `files` ([`ClientFiles::check`] first), offering `alpn`.
pub fn client_config(files: &ClientFiles, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsError> {
    let pems = files.pems()?;
    build_client(files, &pems, alpn)
}

/// The configuration from what `files` held (`pems`).
fn build_client(
    files: &ClientFiles,
    pems: &ClientPems,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let ca = files.ca.as_deref().expect("checked");
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots_in(ca, &pems.ca)?);
    let mut config = match (&files.cert, &files.key, &pems.identity) {
        (Some(cert), Some(key), Some((cert_pem, key_pem))) => builder
            .with_client_auth_cert(
                parse_certs("certificate", cert, cert_pem)?,
                parse_key(key, key_pem)?,
            )
            .map_err(|e| TlsError::Pair {
                cert: cert.clone(),
                key: key.clone(),
                reason: e.to_string(),
            })?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// How a client checks the server's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// It chains to the CA file, and names the server (libpq's `verify-full`).
    Full,
    /// Not at all: the connection is encrypted, and anyone who can reach the path between the
    /// two could be the server (libpq's `require`). The handshake's signatures are still
    /// checked against the certificate presented.
    EncryptOnly,
}

/// A client configuration that can be read again from its files (SIGHUP): a rotated client
/// certificate, or a new CA, is used from the next connection on.
pub struct ClientTls {
    files: ClientFiles,
    verify: Verify,
    alpn: Vec<Vec<u8>>,
    current: RwLock<Arc<ClientConfig>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("files", &self.files)
            .field("verify", &self.verify)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// `files.ca` is required with [`Verify::Full`], and refused with [`Verify::EncryptOnly`]
    /// (a CA that nothing checks would only mislead).
    pub fn new(files: ClientFiles, verify: Verify, alpn: &[&[u8]]) -> Result<ClientTls, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let current = RwLock::new(client_config_for(&files, verify, &alpn)?);
        Ok(ClientTls {
            files,
            verify,
            alpn,
            current,
        })
    }

    pub fn verify(&self) -> Verify {
        self.verify
    }

    /// A connector with the configuration in force now.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        let config = self.current.read().unwrap_or_else(|e| e.into_inner());
        tokio_rustls::TlsConnector::from(Arc::clone(&config))
    }
}

impl Reload for ClientTls {
    fn reload(&self) -> Result<(), TlsError> {
        let fresh = client_config_for(&self.files, self.verify, &self.alpn)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    fn what(&self) -> String {
        match (&self.files.cert, &self.files.ca) {
            (Some(cert), _) => format!("client certificate {}", cert.display()),
            (None, Some(ca)) => format!("CA file {}", ca.display()),
            (None, None) => "client TLS settings".into(),
        }
    }
}

fn client_config_for(
    files: &ClientFiles,
    verify: Verify,
    alpn: &[Vec<u8>],
) -> Result<Arc<ClientConfig>, TlsError> {
    let alpn: Vec<&[u8]> = alpn.iter().map(Vec::as_slice).collect();
    match verify {
        Verify::Full => client_config(files, &alpn),
        Verify::EncryptOnly => {
            if files.ca.is_some() {
                return Err(TlsError::Config(
                    "a CA file is given but the server is not verified: verify the server (verify-full), or drop the CA file".into(),
                ));
            }
            let verifier = Arc::new(AnyServer(provider()));
            let builder = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Config(e.to_string()))?
                .dangerous()
                .with_custom_certificate_verifier(verifier);
            let mut config = match (&files.cert, &files.key) {
                (Some(cert), Some(key)) => builder
                    .with_client_auth_cert(load_certs("certificate", cert)?, load_key(key)?)
                    .map_err(|e| TlsError::Pair {
                        cert: cert.clone(),
                        key: key.clone(),
                        reason: e.to_string(),
                    })?,
                (None, None) => builder.with_no_client_auth(),
                _ => {
                    return Err(TlsError::Config(
                        "a client certificate needs its key, and a key its certificate".into(),
                    ));
                }
            };
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(Arc::new(config))
        }
    }
}

/// Takes any certificate as the server's ([`Verify::EncryptOnly`]); the handshake's
/// signatures are still checked, so the other end does hold that certificate's key.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// How long, and how much of what a client sent, is read after a failed handshake before
/// the connection is closed.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
const LINGER_BYTES: u64 = 64 << 10;

/// The server side of a handshake on `io`. When it fails, the alert that says why has been
/// written, and what the client sent meanwhile is read and dropped for a moment before the
/// connection closes: closing with unread data would send a reset, and a client that had
/// already sent its first request (TLS 1.3 clients do, before the server has judged their
/// certificate) would see "connection reset" instead of the alert.
pub async fn accept<IO>(
    acceptor: &tokio_rustls::TlsAcceptor,
    io: IO,
) -> Result<tokio_rustls::server::TlsStream<IO>, std::io::Error>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    match acceptor.accept(io).into_fallible().await {
        Ok(stream) => Ok(stream),
        Err((e, mut io)) => {
            let mut sink = tokio::io::sink();
            let mut limited = (&mut io).take(LINGER_BYTES);
            let _ = tokio::time::timeout(LINGER, tokio::io::copy(&mut limited, &mut sink)).await;
            Err(e)
        }
    }
}

/// Whether `host` (a name or an address, without brackets or port) is this machine:
/// `localhost`, 127.0.0.0/8, `::1`, or an IPv4-mapped loopback address (`::ffff:127.0.0.1`).
/// What is not may be anywhere on the network, so plaintext to or from it needs `insecure`.
pub fn loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// What a failed handshake (or a first read) on a client connection means: most often the
/// server's certificate, or the server refusing ours (which TLS 1.3 says after the handshake,
/// on the first read).
pub fn client_handshake_error(e: &std::io::Error) -> String {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidCertificate(why)) => format!(
            "the server's certificate was refused ({why:?}): is the CA file the one that signed it, and does the certificate carry the name connected to?"
        ),
        Some(rustls::Error::AlertReceived(alert)) => format!(
            "the server refused the handshake (TLS alert {alert:?}): does it require a client certificate, of a CA it trusts?"
        ),
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            "the server did not answer in TLS (plaintext on that port?)".to_string()
        }
        Some(other) => other.to_string(),
        None => e.to_string(),
    }
}

/// What a failed TLS handshake means, for the one log line it gets.
pub fn handshake_error(e: &std::io::Error) -> String {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            "the client did not speak TLS (plaintext on a TLS port?)".to_string()
        }
        Some(rustls::Error::NoCertificatesPresented) => {
            "the client presented no certificate, and this listener requires one".to_string()
        }
        Some(rustls::Error::InvalidCertificate(why)) => {
            format!("the client's certificate was refused: {why:?}")
        }
        Some(rustls::Error::AlertReceived(alert)) => format!(
            "the client refused this server's certificate (TLS alert {alert:?}): expired, for another name, or of a CA the client does not trust?"
        ),
        Some(other) => other.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests;
