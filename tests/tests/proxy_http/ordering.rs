//! Token order at the upstream, with many clients and with the barrier.

use e2e::client::{body, client, send};
use e2e::upstream::Upstream;

use crate::{check_order, proxy, racing_writers, runtime, spawn_put};

#[test]
fn with_many_clients_the_upstream_never_sees_a_token_go_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "barrier_wait_ms = 30000", "");
    let answers = racing_writers(&[format!("{}/write", px.urls[0])], 16, 20, 3);
    let accepted = check_order(&upstream.seen(), &answers);
    assert_eq!(accepted, 16 * 20, "every round ends with an accepted write");
}

#[test]
fn a_new_token_waits_for_an_older_request_still_at_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "barrier_wait_ms = 60000", "");
    let rt = runtime();
    let c = client();
    let url = format!("{}/stock", px.urls[0]);
    let old = spawn_put(&rt, &url, "r", 1, Some("old"));
    upstream.wait_until("the old write", |s| s.iter().any(|s| s.token == Some(1)));
    let new = spawn_put(&rt, &url, "r", 2, None);
    // The new mark is durable and the proxy still waits: only the old request holds it back.
    px.process
        .wait_events("waiting for older-token requests in flight", 1, |e| {
            e["token"] == "2" && e["durable"] == true
        });
    assert!(
        upstream.seen().iter().all(|s| s.token != Some(2)),
        "the new token overtook the old request"
    );
    // The mark is raised already: the old holder's next write is refused.
    let late = rt.block_on(send(
        &c,
        "PUT",
        &url,
        &[("fencing-resource", "r"), ("fencing-token", "1")],
        body("late"),
    ));
    assert_eq!(late.status, 409);
    upstream.release("old");
    assert_eq!(rt.block_on(old).unwrap().status, 200);
    assert_eq!(rt.block_on(new).unwrap().status, 200);
    let order: Vec<Option<u64>> = upstream.seen().iter().map(|s| s.token).collect();
    assert_eq!(order, vec![Some(1), Some(2)]);
}

#[test]
fn the_barrier_wait_is_bounded_and_says_retry() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "barrier_wait_ms = 200", "");
    let rt = runtime();
    let c = client();
    let url = format!("{}/stock", px.urls[0]);
    let old = spawn_put(&rt, &url, "r", 1, Some("old"));
    upstream.wait_until("the old write", |s| s.iter().any(|s| s.token == Some(1)));
    let refused = rt.block_on(send(
        &c,
        "PUT",
        &url,
        &[("fencing-resource", "r"), ("fencing-token", "2")],
        body(""),
    ));
    assert_eq!(refused.status, 503);
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(
        refused.json()["type"],
        "urn:fencing:problem:older-requests-in-flight"
    );
    upstream.release("old");
    assert_eq!(rt.block_on(old).unwrap().status, 200);
    // Nothing older is in flight now: the retry goes through.
    let retried = rt.block_on(send(
        &c,
        "PUT",
        &url,
        &[("fencing-resource", "r"), ("fencing-token", "2")],
        body(""),
    ));
    assert_eq!(retried.status, 200);
}
