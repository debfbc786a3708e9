//! lockd's configuration: command-line flags, `LOCKD_*` environment variables and a TOML file,
//! in that order of precedence, over built-in defaults.
//!
//! Every setting exists in all three forms, with one name: the TOML key `sync_interval_ms`, the
//! flag `--sync-interval-ms` and the variable `LOCKD_SYNC_INTERVAL_MS` (limits: TOML key
//! `limits.ttl_max_ms`, flag `--ttl-max-ms`, variable `LOCKD_TTL_MAX_MS`). `docs/config.md` is
//! the reference; a test keeps it in step with this file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, ValueEnum};
use lockd_core::Limits;
use serde::{Deserialize, Serialize};

mod coordination;

/// Why a configuration was refused; the message names the setting or the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {} is not valid: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error(transparent)]
    Limits(#[from] lockd_core::LimitsError),
    /// A setting out of its range, or settings that contradict each other.
    #[error("{0}")]
    Invalid(String),
}

/// Command line of `lockd`.
#[derive(Parser, Debug)]
#[command(
    name = "lockd",
    version,
    about = "The lock daemon: leases, FIFO waiters and monotone fencing tokens over gRPC.",
    long_about = "The lock daemon: leases, FIFO waiters and monotone fencing tokens over gRPC \
                  (service fencing.lock.v1.LockService).\n\n\
                  Settings come from flags, then LOCKD_* environment variables, then the TOML file \
                  given with --config, then built-in defaults. See docs/config.md."
)]
pub struct Cli {
    /// TOML configuration file (flags and environment variables override its settings).
    #[arg(long, env = "LOCKD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,

    /// Read a bearer token from stdin, print the policy file's `token_sha256` of it and exit.
    #[arg(long)]
    pub hash_token: bool,

    #[command(flatten)]
    pub settings: Settings,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log shippers).
    Json,
}

/// Where the locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The embedded store in `data_dir` (redb): one lockd.
    Embedded,
    /// An etcd cluster: several lockd instances, one of which leads; etcd stores its state.
    Etcd,
    /// A ZooKeeper ensemble: several lockd instances, one of which leads; ZooKeeper stores
    /// its state.
    Zookeeper,
    /// Redis with Sentinel: several lockd instances, one of which leads; the master Sentinel
    /// names stores its state.
    Redis,
}

/// Every setting, optional: what one source (flags+environment, or the file) says.
#[derive(Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Address to serve gRPC on [default: 127.0.0.1:7420].
    #[arg(long, env = "LOCKD_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Directory of the durable store (created if missing) [default: ./lockd-data].
    #[arg(long, env = "LOCKD_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Log filter, in tracing's EnvFilter syntax (e.g. `info`, `lockd_server=debug`) [default: info].
    #[arg(long, env = "LOCKD_LOG", value_name = "FILTER")]
    pub log: Option<String>,

    /// Log format [default: text].
    #[arg(long, env = "LOCKD_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,

    /// Longest time a release or expiry may stay unsynced on disk, in ms [default: 1000].
    #[arg(long, env = "LOCKD_SYNC_INTERVAL_MS", value_name = "MS")]
    pub sync_interval_ms: Option<u64>,

    /// Page cache of the embedded store, in MiB [default: 32].
    #[arg(long, env = "LOCKD_CACHE_SIZE_MB", value_name = "MIB")]
    pub cache_size_mb: Option<usize>,

    /// Size of the store's journal (redo log) in MiB; a checkpoint runs each time it fills [default: 32].
    #[arg(long, env = "LOCKD_JOURNAL_SIZE_MB", value_name = "MIB")]
    pub journal_size_mb: Option<u64>,

    /// HTTP/2 ping interval towards clients, in ms; finds dead clients so their waits end; 0 = off [default: 10000].
    #[arg(long, env = "LOCKD_KEEPALIVE_INTERVAL_MS", value_name = "MS")]
    pub keepalive_interval_ms: Option<u64>,

    /// How long a ping may go unanswered before the connection is closed, in ms [default: 20000].
    #[arg(long, env = "LOCKD_KEEPALIVE_TIMEOUT_MS", value_name = "MS")]
    pub keepalive_timeout_ms: Option<u64>,

    /// Address of the admin listener (HTTP: /metrics, /healthz, /readyz, the status page at /); off loopback it needs insecure [default: none, off].
    #[arg(long, env = "LOCKD_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,

    /// Audit log: a file (appended to, reopened on SIGHUP) or `-` for stdout; one JSON object per grant, release, expiry, long hold and refused call [default: none, off].
    #[arg(long, env = "LOCKD_AUDIT_LOG", value_name = "FILE")]
    pub audit_log: Option<String>,

    /// Client connections open at once; past it lockd accepts no more until one closes [default: 10000].
    #[arg(long, env = "LOCKD_CONNECTIONS_MAX", value_name = "N")]
    pub connections_max: Option<usize>,

    /// Where the locks live: `embedded` (redb in data_dir), `etcd`, `zookeeper` or `redis` [default: embedded].
    #[arg(long, env = "LOCKD_BACKEND", value_name = "BACKEND")]
    pub backend: Option<Backend>,

    /// etcd members, comma-separated URLs (backend etcd) [default: http://127.0.0.1:2379].
    #[arg(
        long,
        env = "LOCKD_ETCD_ENDPOINTS",
        value_name = "URLS",
        value_delimiter = ','
    )]
    pub etcd_endpoints: Option<Vec<String>>,

    /// Key prefix in etcd; lockd clusters sharing an etcd use different ones [default: /lockd].
    #[arg(long, env = "LOCKD_ETCD_PREFIX", value_name = "PREFIX")]
    pub etcd_prefix: Option<String>,

    /// Longest the etcd work of one call may take before it is answered UNAVAILABLE, in ms [default: 3000].
    #[arg(long, env = "LOCKD_ETCD_REQUEST_TIMEOUT_MS", value_name = "MS")]
    pub etcd_request_timeout_ms: Option<u64>,

    /// TTL of the leadership lease, in ms: how long the cluster may stay without a leader when the leader dies [default: 3000].
    #[arg(long, env = "LOCKD_ETCD_LEADER_TTL_MS", value_name = "MS")]
    pub etcd_leader_ttl_ms: Option<u64>,

    /// Most operations in one etcd transaction (etcd's --max-txn-ops); larger batches are cut [default: 128].
    #[arg(long, env = "LOCKD_ETCD_MAX_TXN_OPS", value_name = "N")]
    pub etcd_max_txn_ops: Option<usize>,

    /// How often the leader compacts etcd's history, keeping one interval of it, in ms; 0 = never (etcd compacts itself) [default: 300000].
    #[arg(long, env = "LOCKD_ETCD_COMPACT_EVERY_MS", value_name = "MS")]
    pub etcd_compact_every_ms: Option<u64>,

    /// CA (PEM) of the etcd members' certificates, for https:// etcd endpoints.
    #[arg(long, env = "LOCKD_ETCD_CA", value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,

    /// Client certificate (PEM) lockd presents to etcd members that require one (--client-cert-auth).
    #[arg(long, env = "LOCKD_ETCD_CERT", value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,

    /// Private key (PEM) of --etcd-cert.
    #[arg(long, env = "LOCKD_ETCD_KEY", value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,

    /// ZooKeeper servers, comma-separated host:port (backend zookeeper) [default: 127.0.0.1:2181].
    #[arg(
        long,
        env = "LOCKD_ZK_ENDPOINTS",
        value_name = "HOSTS",
        value_delimiter = ','
    )]
    pub zk_endpoints: Option<Vec<String>>,

    /// ZooKeeper path under which this lockd cluster keeps its nodes; clusters sharing an ensemble use different ones [default: /lockd].
    #[arg(long, env = "LOCKD_ZK_PREFIX", value_name = "PATH")]
    pub zk_prefix: Option<String>,

    /// Longest the ZooKeeper work of one call may take before it is answered UNAVAILABLE, in ms [default: 3000].
    #[arg(long, env = "LOCKD_ZK_REQUEST_TIMEOUT_MS", value_name = "MS")]
    pub zk_request_timeout_ms: Option<u64>,

    /// ZooKeeper session timeout asked for, in ms: how long the cluster may stay without a leader when the leader dies (ZooKeeper grants it within its minSessionTimeout and maxSessionTimeout) [default: 6000].
    #[arg(long, env = "LOCKD_ZK_SESSION_TIMEOUT_MS", value_name = "MS")]
    pub zk_session_timeout_ms: Option<u64>,

    /// Sentinels, comma-separated host:port (backend redis) [default: 127.0.0.1:26379].
    #[arg(
        long,
        env = "LOCKD_REDIS_ENDPOINTS",
        value_name = "HOSTS",
        value_delimiter = ','
    )]
    pub redis_endpoints: Option<Vec<String>>,

    /// The name the Sentinels monitor the master under (backend redis) [default: lockd].
    #[arg(long, env = "LOCKD_REDIS_MASTER", value_name = "NAME")]
    pub redis_master: Option<String>,

    /// Prefix of this lockd cluster's keys; clusters sharing a Redis use different ones (backend redis) [default: lockd].
    #[arg(long, env = "LOCKD_REDIS_PREFIX", value_name = "PREFIX")]
    pub redis_prefix: Option<String>,

    /// Longest the Redis work of one call may take before it is answered UNAVAILABLE, in ms (backend redis) [default: 3000].
    #[arg(long, env = "LOCKD_REDIS_REQUEST_TIMEOUT_MS", value_name = "MS")]
    pub redis_request_timeout_ms: Option<u64>,

    /// How long the leader key lives past its last renewal, in ms: how long the cluster may stay without a leader when the leader dies (backend redis) [default: 6000].
    #[arg(long, env = "LOCKD_REDIS_LEADER_TTL_MS", value_name = "MS")]
    pub redis_leader_ttl_ms: Option<u64>,

    /// Replicas that must have each batch before its answer (Redis WAIT); 0 answers once the master has synced it (backend redis) [default: 1].
    #[arg(long, env = "LOCKD_REDIS_WAIT_REPLICAS", value_name = "N")]
    pub redis_wait_replicas: Option<u32>,

    /// URL the other instances forward calls to while this one leads (backend etcd, zookeeper or redis) [default: http:// plus the listen address].
    #[arg(long, env = "LOCKD_ADVERTISE", value_name = "URL")]
    pub advertise: Option<String>,

    /// TLS certificate chain (PEM) of the gRPC listener; with --tls-key, lockd serves only TLS [default: none, plaintext].
    #[arg(long, env = "LOCKD_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "LOCKD_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// CA (PEM) that client certificates must chain to: mutual TLS, every client presents a certificate [default: none].
    #[arg(long, env = "LOCKD_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// CA (PEM) of the other instances' certificates, for forwarding to the leader over TLS (backend etcd, zookeeper or redis) [default: tls_client_ca].
    #[arg(long, env = "LOCKD_TLS_PEER_CA", value_name = "FILE")]
    pub tls_peer_ca: Option<PathBuf>,

    /// Allow plaintext gRPC on an address other than loopback (logged at every start) [default: false].
    #[arg(long, env = "LOCKD_INSECURE", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub insecure: Option<bool>,

    /// Key file of the fencing-token signing keys (TOML, docs/security.md); lockd signs every grant's token with its active key [default: none, tokens unsigned].
    #[arg(long, env = "LOCKD_FENCE_KEYS", value_name = "FILE")]
    pub fence_keys: Option<PathBuf>,

    /// Policy file (TOML, docs/security.md): identities (bearer tokens, client certificates), and tenants with their prefixes and quotas; every call must then be authenticated [default: none, every caller may use every resource].
    #[arg(long, env = "LOCKD_POLICY", value_name = "FILE")]
    pub policy: Option<PathBuf>,

    #[command(flatten)]
    #[serde(default)]
    pub limits: LimitSettings,
}

/// The limits of `lockd_core::Limits`, optional (see there for each reason).
#[derive(Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// Shortest lease a client may ask for, in ms [default: 100].
    #[arg(long, env = "LOCKD_TTL_MIN_MS", value_name = "MS")]
    pub ttl_min_ms: Option<u64>,
    /// Longest lease, in ms [default: 3600000].
    #[arg(long, env = "LOCKD_TTL_MAX_MS", value_name = "MS")]
    pub ttl_max_ms: Option<u64>,
    /// Lease length when a request gives none, in ms [default: 30000].
    #[arg(long, env = "LOCKD_TTL_DEFAULT_MS", value_name = "MS")]
    pub ttl_default_ms: Option<u64>,
    /// Longest wait in a queue, in ms [default: 300000].
    #[arg(long, env = "LOCKD_WAIT_MAX_MS", value_name = "MS")]
    pub wait_max_ms: Option<u64>,
    /// Waiters queued on one resource [default: 1000].
    #[arg(long, env = "LOCKD_WAITERS_PER_RESOURCE_MAX", value_name = "N")]
    pub waiters_per_resource_max: Option<usize>,
    /// Waiters queued in total [default: 100000].
    #[arg(long, env = "LOCKD_WAITERS_TOTAL_MAX", value_name = "N")]
    pub waiters_total_max: Option<usize>,
    /// Leases held at once [default: 2000000].
    #[arg(long, env = "LOCKD_LEASES_MAX", value_name = "N")]
    pub leases_max: Option<usize>,
    /// How long a request id is remembered after its grant, in ms [default: 600000].
    #[arg(long, env = "LOCKD_REQUEST_RETENTION_MS", value_name = "MS")]
    pub request_retention_ms: Option<u64>,
    /// Request ids remembered at once [default: 4000000].
    #[arg(long, env = "LOCKD_REQUESTS_MAX", value_name = "N")]
    pub requests_max: Option<usize>,
    /// Longest request id, in bytes [default: 128].
    #[arg(long, env = "LOCKD_REQUEST_ID_LEN_MAX", value_name = "BYTES")]
    pub request_id_len_max: Option<usize>,
    /// Longest holder description, in bytes [default: 128].
    #[arg(long, env = "LOCKD_HOLDER_LEN_MAX", value_name = "BYTES")]
    pub holder_len_max: Option<usize>,
    /// A lease held longer than this is logged once and counted, in ms; 0 = off [default: 3600000].
    #[arg(long, env = "LOCKD_HOLD_WARN_AFTER_MS", value_name = "MS")]
    pub hold_warn_after_ms: Option<u64>,
}

/// The effective configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub log: String,
    pub log_format: LogFormat,
    pub sync_interval_ms: u64,
    pub cache_size_mb: usize,
    pub journal_size_mb: u64,
    pub keepalive_interval_ms: u64,
    pub keepalive_timeout_ms: u64,
    pub connections_max: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<String>,
    pub backend: Backend,
    pub etcd_endpoints: Vec<String>,
    pub etcd_prefix: String,
    pub etcd_request_timeout_ms: u64,
    pub etcd_leader_ttl_ms: u64,
    pub etcd_max_txn_ops: usize,
    pub etcd_compact_every_ms: u64,
    pub zk_endpoints: Vec<String>,
    pub zk_prefix: String,
    pub zk_request_timeout_ms: u64,
    pub zk_session_timeout_ms: u64,
    pub redis_endpoints: Vec<String>,
    pub redis_master: String,
    pub redis_prefix: String,
    pub redis_request_timeout_ms: u64,
    pub redis_leader_ttl_ms: u64,
    pub redis_wait_replicas: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_ca: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_key: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence_keys: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_peer_ca: Option<PathBuf>,
    pub insecure: bool,
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            data_dir: PathBuf::from("./lockd-data"),
            log: "info".to_string(),
            log_format: LogFormat::Text,
            sync_interval_ms: 1_000,
            cache_size_mb: 32,
            journal_size_mb: 32,
            keepalive_interval_ms: 10_000,
            keepalive_timeout_ms: 20_000,
            connections_max: 10_000,
            admin_listen: None,
            audit_log: None,
            backend: Backend::Embedded,
            etcd_endpoints: vec!["http://127.0.0.1:2379".to_string()],
            etcd_prefix: "/lockd".to_string(),
            etcd_request_timeout_ms: 3_000,
            etcd_leader_ttl_ms: 3_000,
            etcd_max_txn_ops: 128,
            etcd_compact_every_ms: 300_000,
            zk_endpoints: vec!["127.0.0.1:2181".to_string()],
            zk_prefix: "/lockd".to_string(),
            zk_request_timeout_ms: 3_000,
            zk_session_timeout_ms: 6_000,
            redis_endpoints: vec!["127.0.0.1:26379".to_string()],
            redis_master: "lockd".to_string(),
            redis_prefix: "lockd".to_string(),
            redis_request_timeout_ms: 3_000,
            redis_leader_ttl_ms: 6_000,
            redis_wait_replicas: 1,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            advertise: None,
            fence_keys: None,
            policy: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_peer_ca: None,
            insecure: false,
            limits: Limits::default(),
        }
    }
}

impl Config {
    /// Resolves the command line (with its environment) and the file it names.
    pub fn from_cli(cli: &Cli) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        let config = Config::default().overlay(file).overlay_ref(&cli.settings);
        config.validate()?;
        Ok(config)
    }

    /// The configuration as TOML (for `--print-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the configuration serialises")
    }

    fn overlay(self, s: Settings) -> Config {
        self.overlay_ref(&s)
    }

    fn overlay_ref(mut self, s: &Settings) -> Config {
        macro_rules! take {
            ($($field:ident),*) => {$(
                if let Some(v) = &s.$field { self.$field = v.clone(); }
            )*};
        }
        macro_rules! take_limit {
            ($($field:ident),*) => {$(
                if let Some(v) = s.limits.$field { self.limits.$field = v; }
            )*};
        }
        take!(
            listen,
            data_dir,
            log,
            log_format,
            sync_interval_ms,
            cache_size_mb,
            journal_size_mb,
            keepalive_interval_ms,
            keepalive_timeout_ms,
            connections_max,
            backend,
            etcd_endpoints,
            etcd_prefix,
            etcd_request_timeout_ms,
            etcd_leader_ttl_ms,
            etcd_max_txn_ops,
            etcd_compact_every_ms,
            zk_endpoints,
            zk_prefix,
            zk_request_timeout_ms,
            zk_session_timeout_ms,
            redis_endpoints,
            redis_master,
            redis_prefix,
            redis_request_timeout_ms,
            redis_leader_ttl_ms,
            redis_wait_replicas
        );
        if let Some(a) = s.admin_listen {
            self.admin_listen = Some(a);
        }
        if let Some(a) = &s.audit_log {
            self.audit_log = Some(a.clone());
        }
        if let Some(a) = &s.advertise {
            self.advertise = Some(a.clone());
        }
        macro_rules! take_some {
            ($($field:ident),*) => {$(
                if let Some(v) = &s.$field { self.$field = Some(v.clone()); }
            )*};
        }
        take_some!(
            fence_keys,
            policy,
            tls_cert,
            tls_key,
            tls_client_ca,
            tls_peer_ca,
            etcd_ca,
            etcd_cert,
            etcd_key
        );
        if let Some(v) = s.insecure {
            self.insecure = v;
        }
        take_limit!(
            ttl_min_ms,
            ttl_max_ms,
            ttl_default_ms,
            wait_max_ms,
            waiters_per_resource_max,
            waiters_total_max,
            leases_max,
            request_retention_ms,
            requests_max,
            request_id_len_max,
            holder_len_max,
            hold_warn_after_ms
        );
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        macro_rules! bail {
            ($($arg:tt)*) => { return Err(ConfigError::Invalid(format!($($arg)*))) };
        }
        self.limits.validate()?;
        if self.sync_interval_ms == 0 {
            bail!("sync_interval_ms must be at least 1");
        }
        if self.cache_size_mb == 0 {
            bail!("cache_size_mb must be at least 1");
        }
        if !(1..=4096).contains(&self.journal_size_mb) {
            bail!("journal_size_mb must be 1 ..= 4096");
        }
        if let Some(a) = self.admin_listen
            && !a.ip().to_canonical().is_loopback()
            && !self.insecure
        {
            bail!(
                "admin_listen {a} is not a loopback address: its plain HTTP shows resource names and counts to anyone who reaches it; put it on loopback behind your scraper's proxy, or set insecure = true"
            );
        }
        if self.connections_max == 0 {
            bail!("connections_max must be at least 1");
        }
        if self.keepalive_interval_ms > 0 && self.keepalive_timeout_ms == 0 {
            bail!("keepalive_timeout_ms must be at least 1 when keepalive_interval_ms is set");
        }
        if self.backend == Backend::Etcd {
            if self.etcd_endpoints.is_empty() {
                bail!("etcd_endpoints must name at least one etcd member");
            }
            for e in &self.etcd_endpoints {
                // user:password@ would make the host the client connects to differ from the
                // one the checks below read (and etcd takes credentials otherwise).
                if e.contains('@') {
                    bail!("etcd endpoint {e:?} must not contain user information (@)");
                }
                let https = e.starts_with("https://") && e.len() > "https://".len();
                if !https && (!e.starts_with("http://") || e.len() <= "http://".len()) {
                    bail!(
                        "etcd endpoint {e:?} must be an http:// or https:// URL, e.g. http://127.0.0.1:2379"
                    );
                }
                if https != self.etcd_endpoints[0].starts_with("https://") {
                    bail!("etcd endpoints must all be http:// or all https://");
                }
            }
            let https = self.etcd_endpoints[0].starts_with("https://");
            match (https, &self.etcd_ca, &self.etcd_cert, &self.etcd_key) {
                (true, None, _, _) => bail!(
                    "https:// etcd endpoints need etcd_ca, the CA of the members' certificates"
                ),
                (false, Some(_), _, _) | (false, _, Some(_), _) | (false, _, _, Some(_)) => bail!(
                    "etcd_ca, etcd_cert and etcd_key are for https:// etcd endpoints; these are http://"
                ),
                (_, _, Some(_), None) | (_, _, None, Some(_)) => {
                    bail!("etcd_cert and etcd_key go together: give both, or neither")
                }
                _ => {}
            }
            if https {
                let files = tlsconf::ClientFiles {
                    ca: self.etcd_ca.clone(),
                    cert: self.etcd_cert.clone(),
                    key: self.etcd_key.clone(),
                };
                tlsconf::client_config(&files, &[])
                    .map_err(|e| ConfigError::Invalid(format!("etcd TLS: {e}")))?;
            }
            if !https && !self.insecure {
                let remote = self.etcd_endpoints.iter().find(|e| !loopback_url(e));
                if let Some(e) = remote {
                    bail!(
                        "etcd endpoint {e:?} is not on loopback, and without TLS the locks travel in plaintext: use https:// endpoints with etcd_ca (and etcd_cert and etcd_key for members that require client certificates), or insecure = true"
                    );
                }
            }
            if !self.etcd_prefix.starts_with('/') || self.etcd_prefix.contains('#') {
                bail!(
                    "etcd_prefix {:?} must start with / and must not contain #",
                    self.etcd_prefix
                );
            }
            if !(100..=60_000).contains(&self.etcd_request_timeout_ms) {
                bail!("etcd_request_timeout_ms must be 100 ..= 60000");
            }
            if !(2_000..=60_000).contains(&self.etcd_leader_ttl_ms) {
                bail!(
                    "etcd_leader_ttl_ms must be 2000 ..= 60000 (etcd's shortest lease is about 2 s)"
                );
            }
            // An atomic AcquireAll's grants are one transaction: the largest set must fit.
            let fewest = lockd_core::limits::TXN_OPS_MIN;
            if !(fewest..=100_000).contains(&self.etcd_max_txn_ops) {
                bail!(
                    "etcd_max_txn_ops must be {fewest} ..= 100000, so that an AcquireAll of {} resources fits in one transaction (etcd's default --max-txn-ops is 128)",
                    lockd_core::limits::SET_MAX
                );
            }
            if self.etcd_compact_every_ms != 0
                && !(1_000..=86_400_000).contains(&self.etcd_compact_every_ms)
            {
                bail!("etcd_compact_every_ms must be 0 (never) or 1000 ..= 86400000");
            }
        }
        if self.backend == Backend::Zookeeper {
            self.validate_zookeeper()?;
        }
        if self.backend == Backend::Redis {
            self.validate_redis()?;
        }
        if self.backend != Backend::Embedded {
            match &self.advertise {
                Some(a)
                    if !(a.starts_with("http://") && a.len() > "http://".len()
                        || a.starts_with("https://") && a.len() > "https://".len()) =>
                {
                    bail!(
                        "advertise {a:?} must be an http:// or https:// URL, e.g. http://10.0.0.5:7420"
                    );
                }
                None if self.listen.ip().is_unspecified() => bail!(
                    "listen {} does not say where the other instances reach this one: set advertise (e.g. http://10.0.0.5:{})",
                    self.listen,
                    self.listen.port()
                ),
                _ => {}
            }
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log) {
            bail!("log filter {:?} is not valid: {e}", self.log);
        }
        self.signing_keys()?;
        self.tls()?;
        if let Some(p) = self.policy()?
            && p.needs_client_certificates()
            && self.tls_client_ca.is_none()
        {
            bail!(
                "policy {}: identities known by a certificate need tls_client_ca (lockd asks for client certificates only then)",
                self.policy.as_ref().expect("loaded").display()
            );
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), Some(_)) => {}
            (None, None) if self.tls_client_ca.is_some() || self.tls_peer_ca.is_some() => {
                bail!("tls_client_ca and tls_peer_ca need tls_cert and tls_key")
            }
            (None, None) if !self.listen.ip().to_canonical().is_loopback() && !self.insecure => {
                bail!(
                    "listen {} is not a loopback address, and without TLS anyone on the network can take any lock and read every lease id: set tls_cert and tls_key, or insecure = true (--insecure) to serve plaintext anyway",
                    self.listen
                )
            }
            (None, None) => {}
            _ => bail!("tls_cert and tls_key go together: give both, or neither"),
        }
        if self.backend != Backend::Embedded && self.tls_cert.is_some() {
            if self.tls_peer_ca.is_none() && self.tls_client_ca.is_none() {
                bail!(
                    "with TLS, backends etcd, zookeeper and redis need tls_peer_ca (the CA of the other instances' certificates), or tls_client_ca, so that followers can forward to the leader"
                );
            }
            if let Some(a) = &self.advertise
                && !a.starts_with("https://")
            {
                bail!("advertise {a:?} must be an https:// URL when lockd serves TLS");
            }
        }
        Ok(())
    }

    /// The TLS files of the listener (checked: they load and go together), or `None` for
    /// plaintext.
    pub fn tls(&self) -> Result<Option<tlsconf::ServerFiles>, ConfigError> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let files = tlsconf::ServerFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.tls_client_ca.clone(),
            // With a policy, the policy authenticates every call: a bearer token suffices.
            client_cert_optional: self.policy.is_some(),
        };
        tlsconf::server_config(&files, &[])
            .map_err(|e| ConfigError::Invalid(format!("TLS: {e}")))?;
        Ok(Some(files))
    }

    /// TLS to the etcd members, for https:// endpoints (files checked by `validate`).
    pub fn etcd_tls(&self) -> Option<tlsconf::ClientFiles> {
        self.etcd_endpoints
            .first()
            .is_some_and(|e| e.starts_with("https://"))
            .then(|| tlsconf::ClientFiles {
                ca: self.etcd_ca.clone(),
                cert: self.etcd_cert.clone(),
                key: self.etcd_key.clone(),
            })
    }

    /// What followers present and trust when they forward to a TLS leader: this instance's
    /// own certificate, and the peers' CA.
    pub fn peer_tls(&self) -> Option<tlsconf::ClientFiles> {
        self.tls_cert.as_ref()?;
        Some(tlsconf::ClientFiles {
            ca: self
                .tls_peer_ca
                .clone()
                .or_else(|| self.tls_client_ca.clone()),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        })
    }

    /// The signing keys `fence_keys` names (checked: one active key, secrets of 32 to 64
    /// bytes, a file that others cannot read), or `None` when tokens are not signed.
    pub fn signing_keys(&self) -> Result<Option<fencing::signed::Keyring>, ConfigError> {
        let Some(path) = &self.fence_keys else {
            return Ok(None);
        };
        let invalid =
            |why: String| ConfigError::Invalid(format!("fence_keys {}: {why}", path.display()));
        let text = tlsconf::read_secret(path).map_err(invalid)?;
        let file: fencing::signed::KeyFile =
            toml::from_str(&text).map_err(|e| invalid(format!("not a key file: {e}")))?;
        fencing::signed::Keyring::for_signing(&file)
            .map(Some)
            .map_err(|e| invalid(e.to_string()))
    }
}

impl Config {
    /// The policy `policy` names (checked), or `None`: every caller may use every resource.
    pub fn policy(&self) -> Result<Option<crate::policy::Policy>, ConfigError> {
        let Some(path) = &self.policy else {
            return Ok(None);
        };
        crate::policy::Policy::load(path)
            .map(Some)
            .map_err(|why| ConfigError::Invalid(format!("policy {}: {why}", path.display())))
    }
}

/// Whether an `http(s)://host[:port]` URL names this host (localhost, 127.0.0.0/8, ::1).
fn loopback_url(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    tlsconf::loopback_host(host)
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests;
