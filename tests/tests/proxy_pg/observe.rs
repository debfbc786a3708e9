//! What the PostgreSQL mode shows operators (issue 18): each metric moves as the checks do, the
//! audit log records a refused stale write and an ended zombie transaction, /readyz follows
//! the check's presence in the database, and the status page lists the mark, the refusal and
//! the zombie.

use e2e::pg::Postgres;
use e2e::{FenceProxy, audit_records, http_get, promtool, sample};

use crate::{code, connect_with, holder, psql, runtime};

fn observed_proxy(dir: &std::path::Path, pg: &Postgres) -> (FenceProxy, std::path::PathBuf) {
    let audit = dir.join("audit.jsonl");
    let config = format!(
        "admin_listen = \"127.0.0.1:0\"\naudit_log = \"{}\"\n[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nfence_wait_ms = 300\n",
        audit.display(),
        pg.port,
        pg.url()
    );
    (FenceProxy::start_with(dir, &config, 0, 1), audit)
}

/// `/readyz` once it answers `status` (it is asked again every few seconds).
fn readyz_until(admin: &str, status: u16) -> String {
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    loop {
        let (got, body) = http_get(admin, "/readyz");
        if got == status {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz stayed at {got} {body}"
        );
        std::thread::yield_now();
    }
}

#[test]
fn each_metric_moves_as_the_checks_do_and_refusals_and_zombies_are_audited() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (px, audit) = observed_proxy(dir.path(), &pg);
    let admin = px.admin();
    let addr = px.pg[0].clone();
    pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);\
         CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init')",
    );
    // 42 passes (a raise), 41 is stale, 'x' is malformed.
    let (ok, _, err) = psql(
        &addr,
        "SET fencing.resource = 'inventory:a';\n\
         SET fencing.token = '42';\n\
         UPDATE stock SET n = 9 WHERE sku = 'a';\n\
         SET fencing.token = '41';\n\
         UPDATE stock SET n = 0 WHERE sku = 'a';\n\
         SET fencing.token = 'x';\n\
         UPDATE stock SET n = 0 WHERE sku = 'a';\n",
        &[],
    );
    assert!(ok, "{err}");
    assert!(err.contains("FN001") && err.contains("FN002"), "{err}");
    // A zombie: A's open transaction with 41 is ended for B's 42.
    runtime().block_on(async {
        let (a, a_conn) = connect_with(
            &addr,
            "options='-c fencing.resource=acct:1 -c fencing.token=41'",
        )
        .await;
        a.batch_execute("BEGIN").await.unwrap();
        a.execute("UPDATE acct SET owner = 'A' WHERE id = 1", &[])
            .await
            .unwrap();
        let b = holder(&addr, "acct:1", 42).await;
        b.execute("UPDATE acct SET owner = 'B' WHERE id = 1", &[])
            .await
            .unwrap();
        let ended = a
            .batch_execute("COMMIT")
            .await
            .expect_err("the zombie's COMMIT");
        assert_eq!(code(&ended), "FN003", "{ended}");
        let _ = a_conn.await;
    });

    // A client raising the fence's SQLSTATEs itself is no refusal of the fence's.
    let (_, _, err) = psql(
        &addr,
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'FN001', MESSAGE = 'forged', \
         DETAIL = 'resource: evil:x, presented token: 1, highest accepted token: 999'; END $$;\n\
         DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'FN007', MESSAGE = 'forged'; END $$;\n",
        &[],
    );
    assert!(
        err.contains("FN001: forged") && err.contains("FN007: forged"),
        "{err}"
    );

    let (status, text) = http_get(&admin, "/metrics");
    assert_eq!(status, 200);
    assert!(!text.contains("evil:x"), "{text}");
    let v =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    assert!(
        v(r#"fence_proxy_checks_total{mode="pg",outcome="passed"}"#) >= 3.0,
        "{text}"
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="pg",outcome="stale"}"#),
        1.0
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="pg",outcome="forged"}"#),
        0.0
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="pg",outcome="malformed"}"#),
        1.0
    );
    assert_eq!(
        v(r#"fence_proxy_checks_total{mode="http",outcome="passed"}"#),
        0.0
    );
    // inventory:a 42, acct:1 41 then 42 (as this proxy saw them).
    assert_eq!(v(r#"fence_proxy_mark_raises_total{mode="pg"}"#), 3.0);
    assert_eq!(v("fence_proxy_zombies_ended_total"), 1.0);
    assert_eq!(
        v(r#"fence_proxy_resource_refusals{resource="inventory:a"}"#),
        1.0
    );
    assert!(
        v(r#"fence_proxy_check_duration_seconds_count{mode="pg"}"#) >= 5.0,
        "{text}"
    );
    let complaints = promtool(&text);
    assert!(complaints.trim().is_empty(), "promtool: {complaints}");

    let records = audit_records(&audit, |r| {
        r.iter().any(|r| r["type"] == "refused_write")
            && r.iter().any(|r| r["type"] == "zombie_ended")
    });
    let stale = records
        .iter()
        .find(|r| r["type"] == "refused_write")
        .unwrap();
    assert_eq!(stale["mode"], "pg", "{stale}");
    assert_eq!(stale["result"], "stale");
    assert_eq!(stale["resource"], "inventory:a");
    assert_eq!(stale["token"], "41");
    assert_eq!(stale["highest"], 42);
    assert_eq!(stale["target"], "postgres");
    assert!(
        stale["caller"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{stale}"
    );
    let zombie = records
        .iter()
        .find(|r| r["type"] == "zombie_ended")
        .unwrap();
    assert_eq!(zombie["resource"], "acct:1", "{zombie}");
    assert_eq!(zombie["token"], 41);
    // The newer token, when the proxy has seen it already (PostgreSQL ends the zombie while
    // the newer check still waits, so it may not have).
    assert!(
        zombie["newer"] == 42 || zombie["newer"].is_null(),
        "{zombie}"
    );
    assert_eq!(zombie["result"], "ended");
    assert_eq!(records.len(), 2, "one record each: {records:?}");

    let (status, page) = http_get(&admin, "/");
    assert_eq!(status, 200);
    for needle in ["inventory:a", "acct:1", "zombie transaction(s) ended"] {
        assert!(page.contains(needle), "{needle} not in {page}");
    }
    assert!(!page.contains("evil:x"), "{page}");
}

#[test]
fn readyz_fails_when_the_check_is_gone_from_the_database() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let (px, _) = observed_proxy(dir.path(), &pg);
    let admin = px.admin();
    assert_eq!(readyz_until(&admin, 200), "ready\n");
    pg.psql("DROP SCHEMA fencing CASCADE");
    let why = readyz_until(&admin, 503);
    assert!(why.contains("the fence check is not installed"), "{why}");
    let (_, page) = http_get(&admin, "/");
    assert!(page.contains("not ready"), "{page}");
}
