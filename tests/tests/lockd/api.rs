//! The API conformance suite on the embedded store.

e2e::api_suite!(e2e::api::Embedded);
