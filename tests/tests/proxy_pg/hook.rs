//! fence_hook (proxy/pg-hook): with it loaded, PostgreSQL judges every commit by the fence
//! check, and the proxy sends no check of its own at a commit point. The bypass catalogue runs
//! against it too (`bypass.rs`); these show what only the hook can do, that the proxy does rely
//! on it, and that nothing but the server's own report makes the proxy rely on it.

use e2e::pg::Postgres;
use e2e::raw::{Answer, Raw};
use e2e::{FenceProxy, http_get, sample};

const UPDATE: &str = "UPDATE stock SET n = n - 1 WHERE sku = 'a'";

fn proxy(dir: &std::path::Path, pg: &Postgres) -> FenceProxy {
    proxy_with(dir, pg, "")
}

fn proxy_with(dir: &std::path::Path, pg: &Postgres, extra: &str) -> FenceProxy {
    pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);",
    );
    let config = format!(
        "admin_listen = \"127.0.0.1:0\"\n[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nfence_wait_ms = 300\n{extra}",
        pg.port,
        pg.url()
    );
    let px = FenceProxy::start_with(dir, &config, 0, 1);
    pg.psql("INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100)");
    px
}

fn checks_passed(px: &FenceProxy) -> f64 {
    let (_, text) = http_get(&px.admin(), "/metrics");
    sample(
        &text,
        r#"fence_proxy_checks_total{mode="pg",outcome="passed"}"#,
    )
    .unwrap_or(0.0)
}

/// Five writes with the current token, each its own transaction: how many checks the proxy
/// ran (the metric counts the checks that judged a token).
fn checks_for_five_writes(pg: &Postgres, params: &[(&str, &str)]) -> f64 {
    checks_for_five_writes_with(pg, params, "")
}

fn checks_for_five_writes_with(pg: &Postgres, params: &[(&str, &str)], extra: &str) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let px = proxy_with(dir.path(), pg, extra);
    let before = checks_passed(&px);
    let mut params = params.to_vec();
    params.extend([("fencing.resource", "inv:a"), ("fencing.token", "100")]);
    let mut c = Raw::connect(&px.pg[0], &params);
    for _ in 0..5 {
        let a = c.simple(UPDATE);
        assert!(a.errors.is_empty(), "a write with the current token: {a:?}");
    }
    assert_eq!(pg.psql("SELECT n FROM stock"), "5");
    checks_passed(&px) - before
}

#[test]
fn with_the_hook_the_proxy_checks_no_commit_point() {
    // The first write is checked before it (the proxy does not know the token to be the mark
    // yet); then it leaves the commits to PostgreSQL.
    assert_eq!(
        checks_for_five_writes(&Postgres::start_with_hook(), &[]),
        1.0
    );
    // Without the hook, that one and each commit point.
    assert_eq!(checks_for_five_writes(&Postgres::start(), &[]), 6.0);
    // And with the hook on a listener that does not trust it (trust_commit_hook = false).
    assert_eq!(
        checks_for_five_writes_with(
            &Postgres::start_with_hook(),
            &[],
            "trust_commit_hook = false\n"
        ),
        6.0
    );
}

#[test]
fn a_client_cannot_claim_the_hook() {
    // A setting of that name that the client sends is a placeholder to a PostgreSQL without
    // the library: never reported, so the proxy checks every commit point itself.
    let pg = Postgres::start();
    assert_eq!(
        checks_for_five_writes(&pg, &[("options", "-c fence_hook.active=on")]),
        6.0
    );
    let pg = Postgres::start();
    assert_eq!(
        checks_for_five_writes(&pg, &[("fence_hook.active", "on")]),
        6.0
    );
    // And to one with the library it is refused at start-up.
    let pg = Postgres::start_with_hook();
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &pg);
    let addr = px.pg[0].clone();
    let refused = std::panic::catch_unwind(|| {
        Raw::connect(&addr, &[("options", "-c fence_hook.active=off")]);
    })
    .expect_err("a session that turns the hook off started");
    let why = refused
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(why.contains("55P02"), "{why}");
}

#[test]
fn commits_inside_a_procedure_are_judged() {
    // The proxy sees one CALL; PostgreSQL commits twice inside it. The first commit, under
    // token 100 (the mark), lands; the second, under a stale 1, is refused.
    let pg = Postgres::start_with_hook();
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &pg);
    pg.psql(
        "CREATE PROCEDURE two() LANGUAGE plpgsql AS $$ BEGIN
           PERFORM set_config('fen' || 'cing.resource', 'inv:a', false);
           PERFORM set_config('fen' || 'cing.token', '100', false);
           UPDATE stock SET n = n - 1 WHERE sku = 'a'; COMMIT;
           PERFORM set_config('fen' || 'cing.token', '1', false);
           UPDATE stock SET n = n - 1 WHERE sku = 'a'; COMMIT; END $$",
    );
    let a = Raw::connect(&px.pg[0], &[]).simple("CALL two()");
    assert_eq!(a.code(), "FN001", "{a:?}");
    assert_eq!(pg.psql("SELECT n FROM stock"), "9");
}

/// A PostgreSQL with the hook, a proxy in front of it, and `take(t)`, a function that declares
/// token `t` for inv:a (where the proxy cannot see it) and writes.
fn with_take() -> (Postgres, tempfile::TempDir, FenceProxy) {
    let pg = Postgres::start_with_hook();
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &pg);
    pg.psql(
        "CREATE FUNCTION take(t text) RETURNS int LANGUAGE plpgsql AS $$ BEGIN
           PERFORM set_config('fen' || 'cing.resource', 'inv:a', false);
           PERFORM set_config('fen' || 'cing.token', t, false);
           UPDATE stock SET n = n - 1 WHERE sku = 'a'; RETURN 1; END $$",
    );
    (pg, dir, px)
}

/// `write(token)` under the stale token 1 is refused and changes nothing; under 100 it lands.
fn judged(pg: &Postgres, mut write: impl FnMut(&str) -> Answer) {
    let stale = write("1");
    assert_eq!(stale.code(), "FN001", "{stale:?}");
    assert_eq!(pg.psql("SELECT n FROM stock"), "10");
    let current = write("100");
    assert!(current.errors.is_empty(), "{current:?}");
    assert_eq!(pg.psql("SELECT n FROM stock"), "9");
}

#[test]
fn a_held_cursor_is_judged_after_it_ran() {
    // Without the hook the proxy refuses such a commit (FN006): the cursor's query runs after
    // its last check. PostgreSQL runs it before the hook's check, which judges what it wrote.
    let (pg, _dir, px) = with_take();
    let mut c = Raw::connect(&px.pg[0], &[]);
    let mut n = 0;
    judged(&pg, |t| {
        n += 1;
        c.simple(&format!(
            "BEGIN; DECLARE c{n} CURSOR WITH HOLD FOR SELECT take('{t}'); COMMIT"
        ))
    });
}

#[test]
fn a_function_call_is_judged_at_its_commit() {
    // The proxy checks a FunctionCall only before it (docs/fence-proxy.md, limits); a function
    // called that way that declares a stale token and writes is refused by the hook at commit.
    let (pg, _dir, px) = with_take();
    let oid: u32 = pg
        .psql("SELECT 'take(text)'::regprocedure::oid")
        .parse()
        .unwrap();
    let mut c = Raw::connect(&px.pg[0], &[]);
    judged(&pg, |t| c.function_call(oid, &[t]));
}

#[test]
fn autovacuum_is_not_judged() {
    // A stale token in postgresql.conf reaches every process; autovacuum's ANALYZE, which
    // writes statistics, carries no client's token and commits. (Waited for by its outcome,
    // the table's rows in pg_statistic, within a deadline: a judged ANALYZE rolls them back.
    // Not last_autoanalyze: that is reported before the commit.)
    let pg = Postgres::start_with_hook();
    let dir = tempfile::tempdir().unwrap();
    let px = proxy(dir.path(), &pg);
    pg.psql_each(&[
        "CREATE TABLE t (i int) WITH (autovacuum_analyze_threshold = 1, autovacuum_analyze_scale_factor = 0)",
        "INSERT INTO t SELECT generate_series(1, 100)",
        // ALTER SYSTEM takes a custom setting only once the session knows its name.
        "SET fencing.resource = ''",
        "SET fencing.token = ''",
        "ALTER SYSTEM SET fencing.resource = 'inv:a'",
        "ALTER SYSTEM SET fencing.token = '1'",
        "ALTER SYSTEM SET autovacuum_naptime = 1",
        "SELECT pg_reload_conf()",
    ]);
    // The stale setting does reach sessions: a client's write is refused.
    let refused = Raw::connect(&px.pg[0], &[]).simple(UPDATE);
    assert_eq!(refused.code(), "FN001", "{refused:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let done = pg.psql("SELECT count(*) > 0 FROM pg_stats WHERE tablename = 't'");
        if done == "t" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "autovacuum never analyzed t in 120 s (is its commit judged by the stale token?)"
        );
        std::thread::yield_now();
    }
}
