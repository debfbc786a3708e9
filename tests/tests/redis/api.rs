//! The API conformance suite on the Redis backend.

e2e::api_suite!(e2e::api::OverRedis::new());
