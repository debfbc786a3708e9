//! The API conformance suite on the ZooKeeper backend.

e2e::api_suite!(e2e::api::OverZooKeeper::new());
