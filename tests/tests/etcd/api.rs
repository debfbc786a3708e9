//! The API conformance suite on the etcd backend.

e2e::api_suite!(e2e::api::OverEtcd::new());
