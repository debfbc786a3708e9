//! lockd, the lock daemon: the gRPC service over the core state machine and the durable store.
//!
//! - `config`: flags, environment and TOML file;
//! - `server`: start-up (open store, recover, listen) and clean shutdown;
//! - `ha`: over etcd, the election: lead (the core over an etcd store) or forward to the leader;
//! - `service`: the tonic service, wire messages in and out, no decisions;
//! - `driver`: the core under a mutex, effects, waiters' reply channels, expiry timer;
//! - `writer`: group commit (the first waiter commits for everyone queued) and the store's
//!   background work;
//! - `policy`: identities (bearer tokens, client certificates) and tenants; who may use what;
//! - `tls`: the listener (at most `connections_max` connections) and, with TLS, its handshakes (handshakes bounded in number and time, SIGHUP reloads);
//! - `audit`: the audit log (JSON Lines, lease ids only as fingerprints);
//! - `admin`: the admin listener (`/metrics`, `/healthz`, `/readyz`); `metrics`: what it shows;
//! - `status`: the one mapping from domain errors to gRPC statuses;
//! - `clock`: monotonic time for decisions, wall time for display.

pub mod admin;
pub mod audit;
pub mod clock;
pub mod config;
pub mod coord;
pub mod driver;
pub mod ha;
pub mod metrics;
pub mod policy;
pub mod server;
pub mod service;
pub mod status;
pub mod tls;
pub mod writer;
