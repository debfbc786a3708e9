//! fence-proxy's configuration: a TOML file for any number of listeners, or a subcommand's
//! flags (`cli`, and `FENCE_PROXY_*` variables) for one listener.
//!
//! docs/fence-proxy.md is the reference; a test keeps it in step with this file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::ValueEnum;
use http_relay::{
    FenceLimits, PathReading, RelayConfig, RouteConfig, Routes, ServerLimits, Unmatched,
    parse_upstream,
};
use serde::{Deserialize, Serialize};

pub use crate::cli::{Cli, LogFormat, Mode, PgAction, PgArgs};
pub use crate::signing::SigningConfig;
use crate::tls::UpstreamTlsMode;

/// The whole configuration (the TOML file's schema).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Directory of the embedded store of high-water marks.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    #[serde(default = "default_log")]
    pub log: String,
    #[serde(default = "default_log_format")]
    pub log_format: LogFormat,
    /// Threads serving each listener (0 = one per CPU).
    #[serde(default)]
    pub workers: usize,
    /// Take plaintext off loopback: listeners without TLS, and upstreams reached without it.
    #[serde(default)]
    pub insecure: bool,
    /// The admin listener: /metrics, /healthz, /readyz and the status page (none: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<SocketAddr>,
    /// The audit log: a file, or `-` for stdout (none: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<String>,
    #[serde(default)]
    pub fence: FenceConfig,
    /// Signed tokens: the keys and the resources that need them (none: tokens are unsigned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<SigningConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pg: Vec<PgConfig>,
}

/// One PostgreSQL listener.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PgConfig {
    pub listen: SocketAddr,
    /// The PostgreSQL server, host:port.
    pub upstream: String,
    /// postgres:// URLs of the databases to install the fence check in at start-up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schema_urls: Vec<String>,
    /// How long to keep trying the install while PostgreSQL is not ready (0: one attempt).
    #[serde(default = "d_schema_wait")]
    pub schema_wait_ms: u64,
    #[serde(default = "d_fence_wait")]
    pub fence_wait_ms: u64,
    #[serde(default = "d_pg_message_max")]
    pub message_max_bytes: u64,
    #[serde(default = "d_pg_connections")]
    pub connections_max: usize,
    /// Connections in start-up at once from one address.
    #[serde(default = "d_startups_per_peer")]
    pub startups_per_peer_max: usize,
    #[serde(default = "d_pg_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default = "d_startup_timeout")]
    pub startup_timeout_ms: u64,
    /// How long a fenced session's error waits for the client's next message.
    #[serde(default = "d_fenced_hold")]
    pub fenced_hold_ms: u64,
    /// Leave commit points to PostgreSQL where its start-up reports fence_hook (false: the
    /// proxy checks every commit point itself, hook or not).
    #[serde(default = "d_true")]
    pub trust_commit_hook: bool,
    /// TLS towards clients: the certificate chain and its key (PEM). An SSLRequest is then
    /// answered `S`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Clients must present a certificate of this CA (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
    /// With `tls_cert`: refuse sessions that stay in plaintext.
    #[serde(default = "d_true")]
    pub tls_required: bool,
    /// TLS towards PostgreSQL: `disable`, `require` or `verify-full`.
    #[serde(default)]
    pub upstream_tls: UpstreamTlsMode,
    /// The CA that PostgreSQL's certificate must chain to (`verify-full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ca: Option<PathBuf>,
    /// A client certificate and key for PostgreSQL (`hostssl ... cert`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_key: Option<PathBuf>,
    /// The name PostgreSQL's certificate must carry, if not the upstream's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_server_name: Option<String>,
    /// Server connections per database and user, reused across client connections (0: no
    /// pool; each client connection gets its own, and PostgreSQL authenticates it).
    #[serde(default)]
    pub pool_size: usize,
    /// How the pool's clients authenticate: `scram-sha-256` (against `auth_file`) or `trust`.
    #[serde(default)]
    pub pool_auth: PoolAuthMode,
    /// The pool's users: `"name" "password or SCRAM secret"` per line (PgBouncer's format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_file: Option<PathBuf>,
    /// Longest a client waits for a server connection when all of its pool are in use.
    #[serde(default = "d_pool_wait")]
    pub pool_wait_ms: u64,
    /// Idle server connections are closed after this.
    #[serde(default = "d_pg_pool_idle")]
    pub pool_idle_ms: u64,
}

/// How a pooled listener's clients authenticate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PoolAuthMode {
    /// SCRAM-SHA-256 against `auth_file`.
    #[default]
    #[serde(rename = "scram-sha-256")]
    #[value(name = "scram-sha-256")]
    ScramSha256,
    /// No proof: only on loopback (or with `insecure`), where PostgreSQL would trust the same.
    Trust,
}

fn d_pool_wait() -> u64 {
    10_000
}
fn d_pg_pool_idle() -> u64 {
    600_000
}

fn d_true() -> bool {
    true
}

fn d_schema_wait() -> u64 {
    30_000
}
// The PostgreSQL listener's defaults are pg-relay's, stated once there.
fn pg_defaults() -> pg_relay::PgRelayConfig {
    pg_relay::PgRelayConfig::default()
}
fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}
fn d_fence_wait() -> u64 {
    ms(pg_defaults().fence_wait)
}
fn d_pg_message_max() -> u64 {
    pg_defaults().message_max_bytes as u64
}
fn d_pg_connections() -> usize {
    pg_defaults().connections_max
}
fn d_startups_per_peer() -> usize {
    pg_defaults().startups_per_peer_max
}
fn d_http_startups_per_peer() -> usize {
    ServerLimits::default().startups_per_peer_max
}
fn d_pg_connect_timeout() -> u64 {
    ms(pg_defaults().connect_timeout)
}
fn d_startup_timeout() -> u64 {
    ms(pg_defaults().startup_timeout)
}
fn d_fenced_hold() -> u64 {
    ms(pg_defaults().fenced_hold)
}

impl PgConfig {
    fn new(listen: SocketAddr, upstream: String) -> PgConfig {
        PgConfig {
            listen,
            upstream,
            schema_urls: Vec::new(),
            schema_wait_ms: d_schema_wait(),
            fence_wait_ms: d_fence_wait(),
            message_max_bytes: d_pg_message_max(),
            connections_max: d_pg_connections(),
            startups_per_peer_max: d_startups_per_peer(),
            connect_timeout_ms: d_pg_connect_timeout(),
            startup_timeout_ms: d_startup_timeout(),
            fenced_hold_ms: d_fenced_hold(),
            trust_commit_hook: true,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_required: true,
            upstream_tls: UpstreamTlsMode::Disable,
            upstream_ca: None,
            upstream_cert: None,
            upstream_key: None,
            upstream_server_name: None,
            pool_size: 0,
            pool_auth: PoolAuthMode::ScramSha256,
            auth_file: None,
            pool_wait_ms: d_pool_wait(),
            pool_idle_ms: d_pg_pool_idle(),
        }
    }

    /// The pool's settings, its auth file read (`None`: no pool).
    pub fn pool(&self) -> anyhow::Result<Option<pg_relay::PoolConfig>> {
        if self.pool_size == 0 {
            return Ok(None);
        }
        let auth = match (self.pool_auth, &self.auth_file) {
            (PoolAuthMode::Trust, _) => pg_relay::PoolAuth::Trust,
            (PoolAuthMode::ScramSha256, Some(f)) => pg_relay::PoolAuth::Scram(Arc::new(
                pg_relay::AuthFile::load(f)
                    .map_err(|e| anyhow::anyhow!("pg listener {}: {e}", self.listen))?,
            )),
            (PoolAuthMode::ScramSha256, None) => bail!(
                "pg listener {}: pool_size needs auth_file (the proxy authenticates pooled clients), or pool_auth = \"trust\"",
                self.listen
            ),
        };
        Ok(Some(pg_relay::PoolConfig {
            size: self.pool_size,
            wait: Duration::from_millis(self.pool_wait_ms),
            idle: Duration::from_millis(self.pool_idle_ms),
            auth,
        }))
    }

    /// The relay's settings.
    /// The relay's settings; `signing`: signed tokens are on, so only the `schema_urls`
    /// databases (which get the keys) may fence.
    pub fn relay(&self, marks_max: usize, signing: bool) -> pg_relay::PgRelayConfig {
        pg_relay::PgRelayConfig {
            verified_databases: signing.then(|| {
                self.schema_urls
                    .iter()
                    .filter_map(|u| url_database(u))
                    .collect()
            }),
            upstream: self.upstream.clone(),
            fence_wait: Duration::from_millis(self.fence_wait_ms),
            message_max_bytes: usize::try_from(self.message_max_bytes).unwrap_or(usize::MAX),
            connections_max: self.connections_max,
            startups_per_peer_max: self.startups_per_peer_max,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            startup_timeout: Duration::from_millis(self.startup_timeout_ms),
            marks_max,
            fenced_hold: Duration::from_millis(self.fenced_hold_ms),
            trust_commit_hook: self.trust_commit_hook,
            // From `tls()`, which reads files.
            tls: None,
            upstream_tls: None,
            // From `pool()`, which reads the auth file.
            pool: None,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        let l = self.listen;
        match self.upstream.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
            _ => bail!(
                "pg listener {l}: upstream {:?} must be host:port (for example 127.0.0.1:5432)",
                self.upstream
            ),
        }
        if self.fence_wait_ms == 0 || self.fence_wait_ms > 3_600_000 {
            bail!("pg listener {l}: fence_wait_ms must be from 1 to 3600000");
        }
        if self.fenced_hold_ms > 3_600_000 {
            bail!("pg listener {l}: fenced_hold_ms must be from 0 to 3600000");
        }
        if self.schema_wait_ms > 3_600_000 {
            bail!("pg listener {l}: schema_wait_ms must be from 0 to 3600000");
        }
        if self.message_max_bytes < 1024 || self.message_max_bytes > 1 << 30 {
            bail!("pg listener {l}: message_max_bytes must be from 1024 to 1073741824");
        }
        if self.connections_max == 0
            || self.startups_per_peer_max == 0
            || self.connect_timeout_ms == 0
            || self.startup_timeout_ms == 0
        {
            bail!(
                "pg listener {l}: connections_max, startups_per_peer_max and the timeouts must be at least 1"
            );
        }
        if self.pool_size > 100_000 || self.pool_wait_ms > 3_600_000 || self.pool_idle_ms == 0 {
            bail!(
                "pg listener {l}: pool_size must be at most 100000, pool_wait_ms at most 3600000 and pool_idle_ms at least 1"
            );
        }
        if self.pool_auth == PoolAuthMode::Trust && self.auth_file.is_some() {
            bail!(
                "pg listener {l}: auth_file with pool_auth = \"trust\": its users would be let in with no proof; use pool_auth = \"scram-sha-256\" to check them, or drop auth_file"
            );
        }
        if self.pool_size == 0
            && (self.auth_file.is_some() || self.pool_auth != PoolAuthMode::ScramSha256)
        {
            bail!("pg listener {l}: auth_file and pool_auth mean something only with pool_size");
        }
        self.pool()?;
        if !self.tls_required && self.tls_cert.is_none() {
            bail!("pg listener {l}: tls_required = false means something only with tls_cert");
        }
        self.tls()?;
        for url in &self.schema_urls {
            if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
                bail!(
                    "pg listener {l}: schema_urls entry {:?} must be a postgres:// URL",
                    pg_relay::schema::redact(url)
                );
            }
            if url_database(url).is_none() {
                bail!(
                    "pg listener {l}: schema_urls entry {:?} names neither a database nor a user",
                    pg_relay::schema::redact(url)
                );
            }
        }
        Ok(())
    }
}

/// The database a `postgres://` URL connects to: its path, else its `dbname` parameter, else
/// (as libpq) its user's name.
pub fn url_database(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let decode = |s: &str| -> Option<String> {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).ok()
    };
    if let Some(q) = query
        && let Some(db) = q.split('&').find_map(|kv| kv.strip_prefix("dbname="))
    {
        return decode(db).filter(|d| !d.is_empty());
    }
    if !path.is_empty() {
        return decode(path);
    }
    let user = authority.rsplit_once('@')?.0;
    let user = user.split_once(':').map_or(user, |(u, _)| u);
    decode(user).filter(|u| !u.is_empty())
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("./fence-proxy-data")
}
fn default_log() -> String {
    "info".into()
}
fn default_log_format() -> LogFormat {
    LogFormat::Text
}

/// Where the high-water marks live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MarksStore {
    /// An embedded file in the data directory (one proxy process).
    #[default]
    Redb,
    /// A PostgreSQL table (several proxy replicas in front of one upstream).
    Postgres,
}

/// Settings of the fence shared by every HTTP listener.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FenceConfig {
    /// Where the marks live: `redb` or `postgres`.
    pub store: MarksStore,
    /// PostgreSQL connection URL, for `store = "postgres"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_url: Option<String>,
    /// Connections to PostgreSQL; each fenced request in flight holds one.
    pub postgres_pool_size: u32,
    /// Longest a request with a new token waits for older-token requests still in flight, in ms.
    pub barrier_wait_ms: u64,
    /// Resources tracked at most; past it, requests for new resources are refused (503).
    pub resources_max: usize,
    /// Page cache of the marks file, in MiB.
    pub cache_size_mb: usize,
}

impl Default for FenceConfig {
    fn default() -> FenceConfig {
        FenceConfig {
            store: MarksStore::Redb,
            postgres_url: None,
            postgres_pool_size: 64,
            barrier_wait_ms: 5_000,
            resources_max: 10_000_000,
            cache_size_mb: 4,
        }
    }
}

/// One HTTP listener.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    pub upstream: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmatched: Option<Unmatched>,
    /// How the upstream reads request paths: `strict` (refuse paths upstreams read
    /// differently) or `decoded` (it percent-decodes them before routing).
    #[serde(default)]
    pub path_reading: PathReading,
    #[serde(default = "d_body_max")]
    pub body_max_bytes: u64,
    #[serde(default = "d_upstream_timeout")]
    pub upstream_timeout_ms: u64,
    #[serde(default = "d_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default = "d_connections")]
    pub connections_max: usize,
    #[serde(default = "d_header_timeout")]
    pub header_read_timeout_ms: u64,
    /// Connections from one address before their first request head, at once.
    #[serde(default = "d_http_startups_per_peer")]
    pub startups_per_peer_max: usize,
    #[serde(default = "d_pool_idle")]
    pub pool_idle_per_host: usize,
    #[serde(default = "d_pool_idle_timeout")]
    pub pool_idle_timeout_ms: u64,
    /// HTTPS towards clients: the certificate chain and its key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Clients must present a certificate of this CA (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
    /// The CA an `https://` upstream's certificate must chain to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ca: Option<PathBuf>,
    /// A client certificate and key for the upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_key: Option<PathBuf>,
}

fn d_body_max() -> u64 {
    64 << 20
}
fn d_upstream_timeout() -> u64 {
    30_000
}
fn d_connect_timeout() -> u64 {
    2_000
}
fn d_connections() -> usize {
    10_000
}
fn d_header_timeout() -> u64 {
    10_000
}
fn d_pool_idle() -> usize {
    512
}
fn d_pool_idle_timeout() -> u64 {
    90_000
}

impl HttpConfig {
    fn new(listen: SocketAddr, upstream: String) -> HttpConfig {
        HttpConfig {
            listen,
            upstream,
            routes: Vec::new(),
            unmatched: None,
            path_reading: PathReading::Strict,
            body_max_bytes: d_body_max(),
            upstream_timeout_ms: d_upstream_timeout(),
            connect_timeout_ms: d_connect_timeout(),
            connections_max: d_connections(),
            header_read_timeout_ms: d_header_timeout(),
            startups_per_peer_max: d_http_startups_per_peer(),
            pool_idle_per_host: d_pool_idle(),
            pool_idle_timeout_ms: d_pool_idle_timeout(),
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            upstream_ca: None,
            upstream_cert: None,
            upstream_key: None,
        }
    }

    /// The relay settings (the upstream URL checked); `upstream_tls` from
    /// [`HttpConfig::upstream_tls`].
    pub fn relay(
        &self,
        signing: std::sync::Arc<fencing::signed::Policy>,
        upstream_tls: Option<std::sync::Arc<tlsconf::ClientTls>>,
    ) -> anyhow::Result<RelayConfig> {
        Ok(RelayConfig {
            signing,
            upstream_tls,
            upstream: parse_upstream(&self.upstream).map_err(anyhow::Error::msg)?,
            body_max_bytes: self.body_max_bytes,
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            pool_idle_per_host: self.pool_idle_per_host,
            pool_idle_timeout: Duration::from_millis(self.pool_idle_timeout_ms),
            path_reading: self.path_reading,
        })
    }

    pub fn routes(&self) -> anyhow::Result<Routes> {
        Routes::new(&self.routes, self.unmatched)
            .map_err(|e| anyhow::anyhow!("listener {}: {e}", self.listen))
    }

    pub fn server(&self) -> ServerLimits {
        ServerLimits {
            connections_max: self.connections_max,
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            startups_per_peer_max: self.startups_per_peer_max,
            ..ServerLimits::default()
        }
    }
}

impl FenceConfig {
    pub fn limits(&self) -> FenceLimits {
        FenceLimits {
            barrier_wait: Duration::from_millis(self.barrier_wait_ms),
            resources_max: self.resources_max,
        }
    }
}

impl Config {
    /// Resolves the command line: the file, or the `http` subcommand's flags.
    pub fn from_cli(cli: &Cli) -> anyhow::Result<Config> {
        let config = match (&cli.config, &cli.mode) {
            (Some(_), Some(_)) => {
                bail!(
                    "give either --config FILE or the http or pg subcommand with its flags, not both"
                )
            }
            (Some(path), None) => read_file(path)?,
            (None, Some(Mode::Http(a))) => {
                let mut http = HttpConfig::new(a.listen, a.upstream.clone());
                http.body_max_bytes = a.body_max_bytes;
                http.upstream_timeout_ms = a.upstream_timeout_ms;
                http.tls_cert = a.common.tls_cert.clone();
                http.tls_key = a.common.tls_key.clone();
                http.tls_client_ca = a.common.tls_client_ca.clone();
                http.upstream_ca = a.common.upstream_ca.clone();
                http.upstream_cert = a.common.upstream_cert.clone();
                http.upstream_key = a.common.upstream_key.clone();
                Config {
                    data_dir: a.data_dir.clone(),
                    log: a.common.log.clone(),
                    log_format: a.common.log_format,
                    workers: a.common.workers,
                    insecure: a.common.insecure,
                    admin_listen: a.common.admin_listen,
                    audit_log: a.common.audit_log.clone(),
                    fence: FenceConfig {
                        barrier_wait_ms: a.barrier_wait_ms,
                        store: a.marks_store,
                        postgres_url: a.postgres_url.clone(),
                        ..FenceConfig::default()
                    },
                    signing: a.common.signing(),
                    http: vec![http],
                    pg: Vec::new(),
                }
            }
            (None, Some(Mode::Pg(a))) => {
                let mut pg = PgConfig::new(a.listen, a.upstream.clone());
                pg.schema_urls = a.schema_url.clone();
                pg.schema_wait_ms = a.schema_wait_ms;
                pg.fence_wait_ms = a.fence_wait_ms;
                pg.connections_max = a.connections_max;
                pg.message_max_bytes = a.message_max_bytes;
                pg.tls_cert = a.common.tls_cert.clone();
                pg.tls_key = a.common.tls_key.clone();
                pg.tls_client_ca = a.common.tls_client_ca.clone();
                pg.tls_required = a.tls_required;
                pg.trust_commit_hook = a.trust_commit_hook;
                pg.upstream_tls = a.upstream_tls;
                pg.upstream_ca = a.common.upstream_ca.clone();
                pg.upstream_cert = a.common.upstream_cert.clone();
                pg.upstream_key = a.common.upstream_key.clone();
                pg.upstream_server_name = a.upstream_server_name.clone();
                pg.pool_size = a.pool_size;
                pg.pool_auth = a.pool_auth;
                pg.auth_file = a.auth_file.clone();
                pg.pool_wait_ms = a.pool_wait_ms;
                Config {
                    data_dir: default_data_dir(),
                    log: a.common.log.clone(),
                    log_format: a.common.log_format,
                    workers: a.common.workers,
                    insecure: a.common.insecure,
                    admin_listen: a.common.admin_listen,
                    audit_log: a.common.audit_log.clone(),
                    fence: FenceConfig::default(),
                    signing: a.common.signing(),
                    http: Vec::new(),
                    pg: vec![pg],
                }
            }
            (None, Some(Mode::Marks(_))) => bail!("`fence-proxy marks` runs no listener"),
            (None, None) => bail!(
                "nothing to run: give --config FILE, `fence-proxy pg --listen ADDR --upstream HOST:PORT` or `fence-proxy http --listen ADDR --upstream URL` (see --help)"
            ),
        };
        config.validate()?;
        Ok(config)
    }

    /// The number of threads per listener.
    pub fn workers(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the configuration serialises")
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.http.is_empty() && self.pg.is_empty() {
            bail!("no listeners configured: add a [[pg]] or an [[http]] section");
        }
        if self.workers > 1024 {
            bail!("workers must be at most 1024 (0 = one per CPU)");
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.pg {
            if p.listen.port() != 0 && !seen.insert(p.listen) {
                bail!("two listeners on {}", p.listen);
            }
            p.validate()?;
        }
        for h in &self.http {
            if h.listen.port() != 0 && !seen.insert(h.listen) {
                bail!("two listeners on {}", h.listen);
            }
            h.relay(Default::default(), None)
                .with_context(|| format!("listener {}", h.listen))?;
            h.routes()?;
            h.listener_tls()?;
            h.upstream_tls()?;
            if h.body_max_bytes == 0
                || h.connections_max == 0
                || h.startups_per_peer_max == 0
                || h.upstream_timeout_ms == 0
                || h.connect_timeout_ms == 0
            {
                bail!(
                    "listener {}: body_max_bytes, connections_max, startups_per_peer_max and the timeouts must be at least 1",
                    h.listen
                );
            }
        }
        if self.fence.resources_max == 0
            || self.fence.barrier_wait_ms == 0
            || self.fence.cache_size_mb == 0
        {
            bail!(
                "fence.resources_max, fence.barrier_wait_ms and fence.cache_size_mb must be at least 1"
            );
        }
        match (self.fence.store, &self.fence.postgres_url) {
            (MarksStore::Postgres, None) => {
                bail!("fence.store = \"postgres\" needs fence.postgres_url")
            }
            (MarksStore::Postgres, Some(url))
                if !url.starts_with("postgres://") && !url.starts_with("postgresql://") =>
            {
                bail!("fence.postgres_url must be a postgres:// URL")
            }
            (MarksStore::Postgres, _) if self.fence.postgres_pool_size == 0 => {
                bail!("fence.postgres_pool_size must be at least 1")
            }
            _ => {}
        }
        tracing_subscriber::EnvFilter::try_new(&self.log)
            .with_context(|| format!("log filter {:?} is not valid", self.log))?;
        if !self.insecure
            && let Some(first) = self.plaintext().first()
        {
            bail!(
                "{first}: anyone on the network could read the tokens, passwords and data in transit; use TLS, keep it on loopback (a sidecar), or set insecure = true (--insecure) to go on anyway"
            );
        }
        if let Some(p) = self.pg.iter().find(|p| {
            p.pool_size > 0 && p.pool_auth == PoolAuthMode::Trust && !p.listen.ip().is_loopback()
        }) && !self.insecure
        {
            bail!(
                "pg listener {}: pool_auth = \"trust\" lets anyone who reaches this address in as any user of the pool; use scram-sha-256 with auth_file, keep the listener on loopback, or set insecure = true",
                p.listen
            );
        }
        if let Some(a) = self.admin_listen
            && !a.ip().is_loopback()
            && !self.insecure
        {
            bail!(
                "admin_listen {a} is not a loopback address: its plain HTTP shows resource names, tokens and peers to anyone who reaches it; put it on loopback behind your scraper's proxy, or set insecure = true"
            );
        }
        if self
            .audit_log
            .as_deref()
            .is_some_and(|a| a.trim().is_empty())
        {
            bail!("audit_log must be a file path, or - for stdout");
        }
        if let Some(signing) = &self.signing {
            signing.policy()?;
            if let Some(p) = self.pg.iter().find(|p| p.schema_urls.is_empty()) {
                bail!(
                    "pg listener {}: [signing] needs schema_urls, so that the keys reach the check in PostgreSQL (which verifies the signatures)",
                    p.listen
                );
            }
        }
        Ok(())
    }

    /// What the listeners let cross the network in plaintext, in words: refused unless
    /// `insecure`, and then logged at start.
    pub fn plaintext(&self) -> Vec<String> {
        self.pg
            .iter()
            .flat_map(PgConfig::plaintext)
            .chain(self.http.iter().flat_map(HttpConfig::plaintext))
            .collect()
    }

    /// The signed-token policy (the default, with no keys and nothing required, without
    /// `[signing]`).
    pub fn signing_policy(&self) -> anyhow::Result<fencing::signed::Policy> {
        match &self.signing {
            Some(s) => s.policy(),
            None => Ok(fencing::signed::Policy::default()),
        }
    }
}

fn read_file(path: &Path) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {} is not valid", path.display()))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
