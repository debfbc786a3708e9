//! Token order at the upstream, with many clients and with the barrier.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use e2e::client::{body, client, send};
use e2e::upstream::Upstream;

use crate::{proxy, runtime};

#[test]
fn with_many_clients_the_upstream_never_sees_a_token_go_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "barrier_wait_ms = 30000", "");
    let rt = runtime();
    let url = format!("{}/write", px.urls[0]);
    let next = Arc::new(AtomicU64::new(0));
    let answers = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (url, next, c) = (url.clone(), Arc::clone(&next), client());
            tasks.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                for _ in 0..40 {
                    let token = next.fetch_add(1, Ordering::SeqCst) + 1;
                    let resource = format!("shared-{}", token % 3);
                    let t = token.to_string();
                    let a = send(
                        &c,
                        "PUT",
                        &url,
                        &[("fencing-resource", &resource), ("fencing-token", &t)],
                        body("x"),
                    )
                    .await;
                    answers.push((resource, token, a.status));
                }
                answers
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    let seen = upstream.seen();
    let mut last: HashMap<String, u64> = HashMap::new();
    for s in &seen {
        let (r, t) = (s.resource.clone().unwrap(), s.token.unwrap());
        let prev = last.insert(r.clone(), t).unwrap_or(0);
        assert!(
            t >= prev,
            "{r}: token {t} reached the upstream after {prev}"
        );
    }
    let mut accepted = 0;
    for (resource, token, status) in &answers {
        let reached = seen
            .iter()
            .any(|s| s.resource.as_deref() == Some(resource) && s.token == Some(*token));
        match status {
            200 => {
                accepted += 1;
                assert!(
                    reached,
                    "acknowledged write {resource}/{token} is missing at the upstream"
                );
            }
            409 | 503 => assert!(
                !reached,
                "refused write {resource}/{token} reached the upstream"
            ),
            other => panic!("unexpected status {other} for {resource}/{token}"),
        }
    }
    // Racing clients make most tokens stale before they arrive; enough must still get through
    // for the order check to mean something.
    assert!(
        accepted >= 20,
        "only {accepted} of {} writes accepted",
        answers.len()
    );
}

#[test]
fn a_new_token_waits_for_an_older_request_still_at_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let px = proxy(dir.path(), &upstream, "barrier_wait_ms = 60000", "");
    let rt = runtime();
    let c = client();
    let url = format!("{}/stock", px.urls[0]);
    let old = {
        let (c, url) = (c.clone(), url.clone());
        rt.spawn(async move {
            send(
                &c,
                "PUT",
                &url,
                &[
                    ("fencing-resource", "r"),
                    ("fencing-token", "1"),
                    ("x-hold", "old"),
                ],
                body("old"),
            )
            .await
        })
    };
    upstream.wait_until("the old write", |s| s.iter().any(|s| s.token == Some(1)));
    let new = {
        let (c, url) = (c.clone(), url.clone());
        rt.spawn(async move {
            send(
                &c,
                "PUT",
                &url,
                &[("fencing-resource", "r"), ("fencing-token", "2")],
                body("new"),
            )
            .await
        })
    };
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
    let old = {
        let (c, url) = (c.clone(), url.clone());
        rt.spawn(async move {
            send(
                &c,
                "PUT",
                &url,
                &[
                    ("fencing-resource", "r"),
                    ("fencing-token", "1"),
                    ("x-hold", "old"),
                ],
                body(""),
            )
            .await
        })
    };
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
