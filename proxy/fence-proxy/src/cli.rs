//! fence-proxy's command line: the `pg`, `http` and `marks` subcommands and their flags (the
//! TOML file's schema is `config`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::config::MarksStore;
use crate::signing::{SigningConfig, d_required};

/// Command line of `fence-proxy`.
#[derive(Parser, Debug)]
#[command(
    name = "fence-proxy",
    version,
    about = "A sidecar that rejects writes carrying a stale fencing token, in front of PostgreSQL or an HTTP service.",
    long_about = "A sidecar that rejects writes carrying a stale fencing token, in front of PostgreSQL \
                  or an HTTP service. Run one listener with `fence-proxy pg --listen ... --upstream ...` \
                  or `fence-proxy http --listen ... --upstream ...`, or any number of both from a TOML \
                  file with `fence-proxy --config FILE`. See docs/fence-proxy.md."
)]
pub struct Cli {
    /// TOML configuration file (all listeners and settings).
    #[arg(long, env = "FENCE_PROXY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,

    #[command(subcommand)]
    pub mode: Option<Mode>,
}

#[derive(Subcommand, Debug)]
pub enum Mode {
    /// One HTTP listener, configured by flags.
    Http(HttpArgs),
    /// One PostgreSQL listener, configured by flags (or `pg print-schema`).
    Pg(PgArgs),
    /// Show a resource's high-water mark, or lower or reset it by hand (audited).
    Marks(crate::admin::MarksArgs),
}

/// Flags both subcommands take.
#[derive(Args, Debug)]
pub struct CommonArgs {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(
        long,
        env = "FENCE_PROXY_LOG",
        default_value = "info",
        value_name = "FILTER"
    )]
    pub log: String,
    /// Log format.
    #[arg(
        long,
        env = "FENCE_PROXY_LOG_FORMAT",
        default_value = "text",
        value_name = "FORMAT"
    )]
    pub log_format: LogFormat,
    /// Threads serving the listener (0 = one per CPU).
    #[arg(
        long,
        env = "FENCE_PROXY_WORKERS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub workers: usize,
    /// Take plaintext off loopback: listen there without TLS, or reach an upstream there
    /// without it (logged at start).
    #[arg(long, env = "FENCE_PROXY_INSECURE")]
    pub insecure: bool,
    /// The admin listener (plain HTTP): /metrics, /healthz, /readyz and the status page at /.
    /// Off by default; off loopback only with --insecure.
    #[arg(long, env = "FENCE_PROXY_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// The audit log: a file (appended to, reopened on SIGHUP), or - for stdout. One JSON
    /// object per refused stale or forged write and per ended zombie transaction.
    #[arg(long, env = "FENCE_PROXY_AUDIT_LOG", value_name = "FILE")]
    pub audit_log: Option<String>,
    /// TLS towards clients: the certificate chain (PEM). Reloaded on SIGHUP.
    #[arg(
        long,
        env = "FENCE_PROXY_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(
        long,
        env = "FENCE_PROXY_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Clients must present a certificate of this CA (PEM): mutual TLS.
    #[arg(
        long,
        env = "FENCE_PROXY_TLS_CLIENT_CA",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_client_ca: Option<PathBuf>,
    /// The CA the upstream's certificate must chain to (PEM).
    #[arg(long, env = "FENCE_PROXY_UPSTREAM_CA", value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// A client certificate for the upstream (PEM).
    #[arg(
        long,
        env = "FENCE_PROXY_UPSTREAM_CERT",
        value_name = "FILE",
        requires = "upstream_key"
    )]
    pub upstream_cert: Option<PathBuf>,
    /// The key of --upstream-cert (PEM).
    #[arg(
        long,
        env = "FENCE_PROXY_UPSTREAM_KEY",
        value_name = "FILE",
        requires = "upstream_cert"
    )]
    pub upstream_key: Option<PathBuf>,
    /// Key file of the keys that verify signed fencing tokens (the one lockd signs with;
    /// docs/security.md). With it, tokens of the --signed-prefix resources must be signed.
    #[arg(long, env = "FENCE_PROXY_FENCE_KEYS", value_name = "FILE")]
    pub fence_keys: Option<PathBuf>,
    /// Resources whose name starts with this need signed tokens; repeat, or comma-separate
    /// [default with --fence-keys: every resource].
    #[arg(
        long,
        env = "FENCE_PROXY_SIGNED_PREFIXES",
        value_name = "PREFIX",
        value_delimiter = ',',
        requires = "fence_keys"
    )]
    pub signed_prefix: Option<Vec<String>>,
}

impl CommonArgs {
    pub(crate) fn signing(&self) -> Option<SigningConfig> {
        self.fence_keys.as_ref().map(|keys| SigningConfig {
            keys: keys.clone(),
            required_prefixes: self.signed_prefix.clone().unwrap_or_else(d_required),
        })
    }
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PgArgs {
    #[command(subcommand)]
    pub action: Option<PgAction>,
    /// Address to listen on.
    #[arg(
        long,
        env = "FENCE_PROXY_PG_LISTEN",
        default_value = "127.0.0.1:6543",
        value_name = "ADDR"
    )]
    pub listen: SocketAddr,
    /// The PostgreSQL server to protect (host:port).
    #[arg(
        long,
        env = "FENCE_PROXY_PG_UPSTREAM",
        default_value = "127.0.0.1:5432",
        value_name = "HOST:PORT"
    )]
    pub upstream: String,
    /// Install the fence check at start-up in the database this postgres:// URL names (a role
    /// that may create the schema and end other sessions). Repeat for several databases.
    #[arg(
        long,
        env = "FENCE_PROXY_SCHEMA_URL",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub schema_url: Vec<String>,
    /// How long to keep trying to install the fence check while PostgreSQL is not accepting
    /// connections yet, in ms (0: one attempt).
    #[arg(
        long,
        env = "FENCE_PROXY_SCHEMA_WAIT_MS",
        default_value_t = 30_000,
        value_name = "MS"
    )]
    pub schema_wait_ms: u64,
    /// Longest a newer token waits for an older token's open transaction before PostgreSQL ends
    /// it, in ms.
    #[arg(
        long,
        env = "FENCE_PROXY_FENCE_WAIT_MS",
        default_value_t = 1_000,
        value_name = "MS"
    )]
    pub fence_wait_ms: u64,
    /// Client connections at most.
    #[arg(
        long,
        env = "FENCE_PROXY_PG_CONNECTIONS_MAX",
        default_value_t = 1_000,
        value_name = "N"
    )]
    pub connections_max: usize,
    /// Largest message a client may send, in bytes (COPY data excepted).
    #[arg(long, env = "FENCE_PROXY_PG_MESSAGE_MAX_BYTES", default_value_t = 64 << 20, value_name = "BYTES")]
    pub message_max_bytes: u64,
    /// Leave commit points to PostgreSQL where its start-up reports fence_hook (false: check
    /// every commit point here).
    #[arg(long, env = "FENCE_PROXY_PG_TRUST_COMMIT_HOOK", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub trust_commit_hook: bool,
    /// With --tls-cert: refuse sessions that stay in plaintext (false: take both).
    #[arg(long, env = "FENCE_PROXY_PG_TLS_REQUIRED", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub tls_required: bool,
    /// TLS towards PostgreSQL: disable, require (encrypted, the server not checked) or
    /// verify-full (--upstream-ca).
    #[arg(
        long,
        env = "FENCE_PROXY_PG_UPSTREAM_TLS",
        default_value = "disable",
        value_name = "MODE"
    )]
    pub upstream_tls: crate::tls::UpstreamTlsMode,
    /// The name PostgreSQL's certificate must carry [default: the --upstream host].
    #[arg(long, env = "FENCE_PROXY_PG_UPSTREAM_SERVER_NAME", value_name = "NAME")]
    pub upstream_server_name: Option<String>,
    /// Server connections per database and user, reused across client connections (0: no
    /// pool).
    #[arg(
        long,
        env = "FENCE_PROXY_PG_POOL_SIZE",
        default_value_t = 0,
        value_name = "N"
    )]
    pub pool_size: usize,
    /// How pooled clients authenticate: scram-sha-256 (against --auth-file) or trust.
    #[arg(
        long,
        env = "FENCE_PROXY_PG_POOL_AUTH",
        default_value = "scram-sha-256",
        value_name = "MODE"
    )]
    pub pool_auth: crate::config::PoolAuthMode,
    /// The pool's users, `"name" "password or SCRAM secret"` per line (PgBouncer's format).
    #[arg(long, env = "FENCE_PROXY_PG_AUTH_FILE", value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// Longest a client waits for a free server connection of its pool, in ms.
    #[arg(
        long,
        env = "FENCE_PROXY_PG_POOL_WAIT_MS",
        default_value_t = 10_000,
        value_name = "MS"
    )]
    pub pool_wait_ms: u64,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Subcommand, Debug)]
pub enum PgAction {
    /// Print the SQL that installs the fence check (schema `fencing`), for a DBA to run.
    PrintSchema,
    /// Print the statements the proxy prepares on each PostgreSQL connection, one per line as
    /// `name<TAB>text` (`$1` is the fence wait in milliseconds, `$2` whether the check is at a
    /// commit point): what `log_statement = all` shows it running.
    PrintChecks,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct HttpArgs {
    /// Address to listen on.
    #[arg(
        long,
        env = "FENCE_PROXY_LISTEN",
        default_value = "127.0.0.1:8420",
        value_name = "ADDR"
    )]
    pub listen: SocketAddr,
    /// The service to protect (http://host:port, optionally with a path prefix).
    #[arg(
        long,
        env = "FENCE_PROXY_UPSTREAM",
        default_value = "http://127.0.0.1:8080",
        value_name = "URL"
    )]
    pub upstream: String,
    /// Directory of the embedded store of high-water marks (created if missing).
    #[arg(
        long,
        env = "FENCE_PROXY_DATA_DIR",
        default_value = "./fence-proxy-data",
        value_name = "DIR"
    )]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Longest a request with a new token waits for older-token requests still in flight, in ms.
    #[arg(
        long,
        env = "FENCE_PROXY_BARRIER_WAIT_MS",
        default_value_t = 5_000,
        value_name = "MS"
    )]
    pub barrier_wait_ms: u64,
    /// Largest request body relayed, in bytes.
    #[arg(long, env = "FENCE_PROXY_BODY_MAX_BYTES", default_value_t = 64 << 20, value_name = "BYTES")]
    pub body_max_bytes: u64,
    /// Longest wait for the upstream's response headers, in ms.
    #[arg(
        long,
        env = "FENCE_PROXY_UPSTREAM_TIMEOUT_MS",
        default_value_t = 30_000,
        value_name = "MS"
    )]
    pub upstream_timeout_ms: u64,
    /// Where the marks live: redb (embedded, one proxy) or postgres (replicas).
    #[arg(
        long,
        env = "FENCE_PROXY_MARKS_STORE",
        default_value = "redb",
        value_name = "STORE"
    )]
    pub marks_store: MarksStore,
    /// PostgreSQL URL for --marks-store postgres (postgres://user:password@host:port/db).
    #[arg(long, env = "FENCE_PROXY_POSTGRES_URL", value_name = "URL")]
    pub postgres_url: Option<String>,
}
