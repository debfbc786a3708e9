//! lockd over a real ZooKeeper ensemble (Debian `zookeeper`, loopback ports).
//!
//! - `store`: the Store conformance suite on `ZkStore`, and what a replicated store adds (a
//!   deposed leader's batch, a late batch, batches beyond ZooKeeper's request size, the node
//!   layout, names ZooKeeper cannot take as they are).
//!
//! Needs `java` and Debian's ZooKeeper jars (`apt-get install zookeeper`).

mod store;
