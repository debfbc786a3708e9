//! lockd over a real ZooKeeper ensemble (Debian `zookeeper`, loopback ports).
//!
//! - `api`: the API conformance suite (`e2e::api`), one lockd over a one-server ensemble;
//! - `store`: the Store conformance suite on `ZkStore`, and what a replicated store adds (a
//!   deposed leader's batch, a late batch, batches beyond ZooKeeper's request size, the node
//!   layout, names ZooKeeper cannot take as they are);
//! - `instances`: two lockd instances (one leads, one forwards): a request id retried through
//!   the other instance, a clean hand-over, `kill -9` of the lockd leader; and no quorum, no
//!   lock.
//!
//! Needs the binaries (`cargo build --bins`), `java` and Debian's ZooKeeper jars
//! (`apt-get install zookeeper`).

mod api;
mod instances;
mod store;
