//! lockd over a real Redis with Sentinel (Debian `redis-server` and `redis-sentinel`, loopback
//! ports).
//!
//! - `api`: the API conformance suite (`e2e::api`), one lockd over a master, a replica and a
//!   Sentinel;
//! - `store`: the Store conformance suite on `RedisStore`, and what a replicated store adds (a
//!   deposed leader's batch, a late batch, a batch the replicas did not take, batches beyond
//!   one script's size, the key layout, tokens above the epoch floor after a failover, a
//!   master that does not sync every write);
//! - `instances`: two lockd instances (one leads, one forwards): a request id retried through
//!   the other instance, a clean hand-over, `kill -9` of the lockd leader; no replica, no
//!   lock; `kill -9` of the Redis master (a Sentinel failover).
//!
//! Needs the binaries (`cargo build --bins`) and `apt-get install redis-server
//! redis-sentinel`.

mod api;
mod instances;
mod store;
