//! Two fence-proxy replicas in front of one upstream, with their marks in a real PostgreSQL.

use std::path::Path;

use e2e::FenceProxy;
use e2e::client::{body, client, send};
use e2e::pg::Postgres;
use e2e::upstream::Upstream;

use crate::{check_order, racing_writers, runtime, spawn_put};

fn replica(dir: &Path, name: &str, pg: &Postgres, upstream: &Upstream) -> FenceProxy {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "data_dir = \"{}\"\n[fence]\nstore = \"postgres\"\npostgres_url = \"{}\"\nbarrier_wait_ms = 60000\n\
         [[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n",
        dir.join("data").display(),
        pg.url(),
        upstream.url()
    );
    FenceProxy::start(&dir, &config, 1)
}

#[test]
fn replicas_share_the_marks_and_keep_them_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let pg = Postgres::start();
    let upstream = Upstream::start();
    let mut a = replica(dir.path(), "a", &pg, &upstream);
    let b = replica(dir.path(), "b", &pg, &upstream);
    let rt = runtime();
    let c = client();
    let put = |px: &FenceProxy, token: u64| {
        let t = token.to_string();
        rt.block_on(send(
            &c,
            "PUT",
            &format!("{}/w", px.urls[0]),
            &[("fencing-resource", "acct:7"), ("fencing-token", &t)],
            body(""),
        ))
    };
    assert_eq!(put(&a, 10).status, 200);
    let stale = put(&b, 9);
    assert_eq!(
        (stale.status, stale.json()["highest"].as_u64()),
        (409, Some(10)),
        "replica b accepted what a had fenced off"
    );
    assert_eq!(put(&b, 10).status, 200);
    assert_eq!(put(&b, 11).status, 200);
    assert_eq!(
        put(&a, 10).status,
        409,
        "replica a accepted what b had fenced off"
    );
    assert_eq!(
        pg.psql("SELECT token FROM fence_proxy.marks WHERE resource = 'acct:7'"),
        "11"
    );
    a.kill9();
    let a = replica(dir.path(), "a", &pg, &upstream);
    assert_eq!(put(&a, 10).status, 409);
    assert_eq!(put(&a, 11).status, 200);
}

#[test]
fn the_barrier_holds_across_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let pg = Postgres::start();
    let upstream = Upstream::start();
    let a = replica(dir.path(), "a", &pg, &upstream);
    let b = replica(dir.path(), "b", &pg, &upstream);
    let rt = runtime();
    let old = spawn_put(&rt, &format!("{}/w", a.urls[0]), "r", 1, Some("old"));
    upstream.wait_until("the old write, through replica a", |s| {
        s.iter().any(|s| s.token == Some(1))
    });
    let new = spawn_put(&rt, &format!("{}/w", b.urls[0]), "r", 2, None);
    // Replica b's raise waits in PostgreSQL for the old request's share lock, held by replica a.
    pg.wait_until(
        "replica b's raise to wait for the lock",
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO fence_proxy.marks%'",
        "1",
    );
    assert!(
        upstream.seen().iter().all(|s| s.token != Some(2)),
        "the new token overtook the old request"
    );
    upstream.release("old");
    assert_eq!(rt.block_on(old).unwrap().status, 200);
    assert_eq!(rt.block_on(new).unwrap().status, 200);
    let order: Vec<Option<u64>> = upstream.seen().iter().map(|s| s.token).collect();
    assert_eq!(order, vec![Some(1), Some(2)]);
}

#[test]
fn with_clients_on_both_replicas_the_upstream_never_sees_a_token_go_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let pg = Postgres::start();
    let upstream = Upstream::start();
    let replicas = [
        replica(dir.path(), "a", &pg, &upstream),
        replica(dir.path(), "b", &pg, &upstream),
    ];
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| format!("{}/w", r.urls[0]))
        .collect();
    let answers = racing_writers(&urls, 8, 10, 2);
    let accepted = check_order(&upstream.seen(), &answers);
    assert_eq!(accepted, 8 * 10, "every round ends with an accepted write");
}

/// The runbook for the replicated store: a poisoned mark in `fence_proxy.marks` is lowered with
/// `fence-proxy marks --marks-url`, recorded in `fence_proxy.mark_changes`, and once the
/// replicas restart (each caches the marks it saw) the holder writes again.
#[test]
fn a_poisoned_mark_in_the_shared_store_is_lowered_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let pg = Postgres::start();
    let upstream = Upstream::start();
    let rt = runtime();
    let c = client();
    let put = |px: &FenceProxy, token: &str| {
        rt.block_on(send(
            &c,
            "PUT",
            &format!("{}/w", px.urls[0]),
            &[("fencing-resource", "acct:7"), ("fencing-token", token)],
            body(""),
        ))
        .status
    };
    let mut a = replica(dir.path(), "a", &pg, &upstream);
    assert_eq!(put(&a, "10"), 200);
    assert_eq!(put(&a, "9223372036854775807"), 200);
    assert_eq!(put(&a, "10"), 409, "poisoned");
    let url = pg.url();
    let mut cmd = std::process::Command::new(e2e::bin("fence-proxy"));
    cmd.args([
        "marks", "lower", "acct:7", "--to", "10", "--force", "--by", "ops",
    ])
    .args(["--reason", "forged token", "--marks-url", &url]);
    let (st, out, err) = e2e::output(cmd);
    assert!(st.success(), "{err}");
    assert!(out.contains("9223372036854775807 -> 10"), "{out}");
    assert_eq!(
        pg.psql("SELECT token FROM fence_proxy.marks WHERE resource = 'acct:7'"),
        "10"
    );
    assert_eq!(
        pg.psql("SELECT actor || '|' || reason FROM fence_proxy.mark_changes"),
        "ops (as postgres)|forged token"
    );
    a.kill9();
    let a = replica(dir.path(), "a2", &pg, &upstream);
    assert_eq!(put(&a, "10"), 200, "the holder writes again");
    assert_eq!(put(&a, "9"), 409);
}
