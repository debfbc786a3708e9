//! The TLS settings of fence-proxy's listeners and upstreams, checked and made into tlsconf
//! objects: a listener's certificate (with mutual TLS when a client CA is given), and the
//! client side towards PostgreSQL or an `https://` service; and the methods of `PgConfig` and
//! `HttpConfig` that load them and say what would cross the network in plaintext.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tlsconf::rustls::pki_types::ServerName;
use tlsconf::{ClientFiles, ClientTls, Reloadable, ServerFiles, Verify, loopback_host};

use crate::config::{HttpConfig, PgConfig};

/// How the PostgreSQL mode reaches PostgreSQL (libpq's `sslmode` names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamTlsMode {
    /// Plaintext.
    #[default]
    Disable,
    /// TLS, without checking the server's certificate (encrypted, not authenticated).
    Require,
    /// TLS; the certificate must chain to `upstream_ca` and name the server.
    VerifyFull,
}

/// A listener's certificate files, as configured.
pub struct ListenerFiles<'a> {
    pub listen: std::net::SocketAddr,
    pub cert: &'a Option<PathBuf>,
    pub key: &'a Option<PathBuf>,
    pub client_ca: &'a Option<PathBuf>,
}

impl ListenerFiles<'_> {
    /// The listener's TLS (`None`: plaintext), its files read and checked; `alpn`: the
    /// protocol it speaks.
    pub fn load(&self, alpn: &[u8]) -> anyhow::Result<Option<Arc<Reloadable>>> {
        let l = self.listen;
        let (cert, key) = match (self.cert, self.key) {
            (None, None) => {
                if self.client_ca.is_some() {
                    bail!(
                        "listener {l}: tls_client_ca needs tls_cert and tls_key (client certificates are asked for in TLS only)"
                    );
                }
                return Ok(None);
            }
            (Some(c), Some(k)) => (c, k),
            _ => bail!("listener {l}: tls_cert and tls_key go together"),
        };
        let files = ServerFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.client_ca.clone(),
            client_cert_optional: false,
        };
        let tls = Reloadable::new(files, &[alpn]).with_context(|| format!("listener {l}"))?;
        Ok(Some(Arc::new(tls)))
    }
}

/// A client side's files, as configured.
pub struct UpstreamFiles<'a> {
    pub what: &'a str,
    pub ca: &'a Option<PathBuf>,
    pub cert: &'a Option<PathBuf>,
    pub key: &'a Option<PathBuf>,
}

impl UpstreamFiles<'_> {
    fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    fn load(&self, verify: Verify, alpn: &[u8]) -> anyhow::Result<Arc<ClientTls>> {
        let files = ClientFiles {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        };
        let what = self.what;
        let tls =
            ClientTls::new(files, verify, &[alpn]).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        Ok(Arc::new(tls))
    }
}

/// The PostgreSQL mode's TLS towards PostgreSQL (`None`: plaintext). `upstream` is its
/// `host:port`; `server_name` overrides the host as the name to verify.
pub fn pg_upstream(
    mode: UpstreamTlsMode,
    files: &UpstreamFiles<'_>,
    upstream: &str,
    server_name: &Option<String>,
) -> anyhow::Result<Option<pg_relay::UpstreamTls>> {
    let what = files.what;
    let verify = match mode {
        UpstreamTlsMode::Disable => {
            if files.any() || server_name.is_some() {
                bail!(
                    "{what}: upstream_ca, upstream_cert, upstream_key and upstream_server_name need upstream_tls = \"require\" or \"verify-full\""
                );
            }
            return Ok(None);
        }
        UpstreamTlsMode::Require => {
            if files.ca.is_some() {
                bail!(
                    "{what}: upstream_ca is given but upstream_tls = \"require\" does not check the server: use \"verify-full\""
                );
            }
            Verify::EncryptOnly
        }
        UpstreamTlsMode::VerifyFull => {
            if files.ca.is_none() {
                bail!(
                    "{what}: upstream_tls = \"verify-full\" needs upstream_ca, the CA that signed PostgreSQL's certificate"
                );
            }
            Verify::Full
        }
    };
    let host = server_name.clone().unwrap_or_else(|| host_of(upstream));
    let name = ServerName::try_from(host.clone())
        .map_err(|_| anyhow::anyhow!("{what}: {host:?} is not a name a certificate can carry"))?;
    Ok(Some(pg_relay::UpstreamTls {
        client: files.load(verify, b"postgresql")?,
        server_name: name,
    }))
}

/// The HTTP mode's TLS towards an `https://` upstream (`None` for `http://`).
pub fn http_upstream(
    https: bool,
    files: &UpstreamFiles<'_>,
) -> anyhow::Result<Option<Arc<ClientTls>>> {
    let what = files.what;
    if !https {
        if files.any() {
            bail!("{what}: upstream_ca, upstream_cert and upstream_key need an https:// upstream");
        }
        return Ok(None);
    }
    if files.ca.is_none() {
        bail!(
            "{what}: an https:// upstream needs upstream_ca, the CA that signed its certificate (/etc/ssl/certs/ca-certificates.crt for the public ones)"
        );
    }
    files.load(Verify::Full, b"http/1.1").map(Some)
}

/// The host of `host:port` (`[v6]:port` too), without brackets.
pub fn host_of(address: &str) -> String {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

impl PgConfig {
    /// The TLS of this listener, towards clients and towards PostgreSQL, its files read and
    /// checked.
    pub fn tls(
        &self,
    ) -> anyhow::Result<(Option<pg_relay::ListenerTls>, Option<pg_relay::UpstreamTls>)> {
        let listener = ListenerFiles {
            listen: self.listen,
            cert: &self.tls_cert,
            key: &self.tls_key,
            client_ca: &self.tls_client_ca,
        }
        .load(b"postgresql")?
        .map(|server| pg_relay::ListenerTls {
            server,
            required: self.tls_required,
        });
        let what = format!("pg listener {}", self.listen);
        let upstream = pg_upstream(
            self.upstream_tls,
            &UpstreamFiles {
                what: &what,
                ca: &self.upstream_ca,
                cert: &self.upstream_cert,
                key: &self.upstream_key,
            },
            &self.upstream,
            &self.upstream_server_name,
        )?;
        Ok((listener, upstream))
    }

    /// What this listener lets cross the network in plaintext, in words (none: nothing).
    pub(crate) fn plaintext(&self) -> Vec<String> {
        let l = self.listen;
        let mut found = Vec::new();
        if !l.ip().to_canonical().is_loopback() && (self.tls_cert.is_none() || !self.tls_required) {
            found.push(format!(
                "pg listener {l} is not on loopback and takes plaintext sessions (give tls_cert and tls_key, with tls_required = true)"
            ));
        }
        if self.upstream_tls == UpstreamTlsMode::Disable && !loopback_host(&host_of(&self.upstream))
        {
            found.push(format!(
                "pg listener {l} reaches PostgreSQL at {}, not on loopback, in plaintext (set upstream_tls = \"verify-full\" with upstream_ca)",
                self.upstream
            ));
        }
        found
    }
}

impl HttpConfig {
    /// The listener's HTTPS certificate (`None`: plain HTTP).
    pub fn listener_tls(&self) -> anyhow::Result<Option<std::sync::Arc<tlsconf::Reloadable>>> {
        ListenerFiles {
            listen: self.listen,
            cert: &self.tls_cert,
            key: &self.tls_key,
            client_ca: &self.tls_client_ca,
        }
        .load(b"http/1.1")
    }

    /// TLS towards an `https://` upstream (`None` for `http://`).
    pub fn upstream_tls(&self) -> anyhow::Result<Option<std::sync::Arc<tlsconf::ClientTls>>> {
        let what = format!("listener {}", self.listen);
        http_upstream(
            self.upstream.starts_with("https://"),
            &UpstreamFiles {
                what: &what,
                ca: &self.upstream_ca,
                cert: &self.upstream_cert,
                key: &self.upstream_key,
            },
        )
    }

    /// What this listener lets cross the network in plaintext, in words.
    pub(crate) fn plaintext(&self) -> Vec<String> {
        let l = self.listen;
        let mut found = Vec::new();
        if !l.ip().to_canonical().is_loopback() && self.tls_cert.is_none() {
            found.push(format!(
                "listener {l} is not on loopback and serves plain HTTP (give tls_cert and tls_key)"
            ));
        }
        if let Ok(uri) = http_relay::parse_upstream(&self.upstream)
            && uri.scheme_str() == Some("http")
            && !loopback_host(
                uri.host()
                    .unwrap_or_default()
                    .trim_start_matches('[')
                    .trim_end_matches(']'),
            )
        {
            found.push(format!(
                "listener {l} reaches {}, not on loopback, in plain HTTP (use https:// with upstream_ca)",
                self.upstream
            ));
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read() {
        assert_eq!(host_of("db.internal:5432"), "db.internal");
        assert_eq!(host_of("[::1]:5432"), "::1");
    }

    #[test]
    fn upstream_settings_that_contradict_are_refused() {
        let none = None;
        let ca = Some(PathBuf::from("/nonexistent/ca.pem"));
        let files = |ca| UpstreamFiles {
            what: "pg listener",
            ca,
            cert: &None,
            key: &None,
        };
        let err =
            |r: anyhow::Result<Option<pg_relay::UpstreamTls>>| format!("{:#}", r.unwrap_err());
        assert!(
            err(pg_upstream(
                UpstreamTlsMode::Disable,
                &files(&ca),
                "h:1",
                &None
            ))
            .contains("need upstream_tls")
        );
        assert!(
            err(pg_upstream(
                UpstreamTlsMode::Require,
                &files(&ca),
                "h:1",
                &None
            ))
            .contains("verify-full")
        );
        assert!(
            err(pg_upstream(
                UpstreamTlsMode::VerifyFull,
                &files(&none),
                "h:1",
                &None
            ))
            .contains("needs upstream_ca")
        );
        assert!(
            pg_upstream(UpstreamTlsMode::Disable, &files(&none), "h:1", &None)
                .unwrap()
                .is_none()
        );
        assert!(
            format!("{:#}", http_upstream(true, &files(&none)).unwrap_err())
                .contains("needs upstream_ca")
        );
        assert!(
            format!("{:#}", http_upstream(false, &files(&ca)).unwrap_err()).contains("https://")
        );
    }
}
