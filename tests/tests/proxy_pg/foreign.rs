//! Writes that leave through another connection (issue 38): a `postgres_fdw` foreign table
//! that loops back to the same database, a partitioned table one of whose partitions is such a
//! foreign table, `TRUNCATE` of one, and `dblink_exec`. The local transaction gets no
//! transaction id, so the check at the commit point took it for one that wrote nothing and the
//! commit hook did not run: through the proxy of 33166a7 each stale write below committed.
//! Now every foreign table's triggers (`fencing.judge_foreign`) judge each write before it
//! leaves, under both judges, and the commit hook judges every call of dblink's functions.
//!
//! Each stale write (a zombie's token 50, after a newer holder raised the mark to 100) must
//! fail with FN001 and change nothing on the far side; the holder's same write must go through.

use e2e::pg::Postgres;
use e2e::raw::Raw;

use crate::{Setup, setup_with};

/// A database with `stock` (n = 10) and `far_stock`, a foreign table on it through a
/// loopback server; `parts`, partitioned, whose partition for `'a'` is a foreign table on
/// `parts_target`; dblink; `app_fence`, a helper that declares a token where the proxy cannot
/// see it. Created after the proxy installed the check: the event trigger judges the foreign
/// tables as they come.
fn prepared(pg: Postgres) -> Setup {
    let s = setup_with(pg, 1000, "");
    let port = s.pg.port;
    s.pg.psql(&format!(
        "CREATE EXTENSION postgres_fdw;
         CREATE SERVER loop FOREIGN DATA WRAPPER postgres_fdw
           OPTIONS (host '127.0.0.1', port '{port}', dbname 'postgres');
         CREATE USER MAPPING FOR PUBLIC SERVER loop OPTIONS (user 'postgres');
         CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         CREATE FOREIGN TABLE far_stock (sku text, n int) SERVER loop OPTIONS (table_name 'stock');
         CREATE TABLE parts_target (sku text, n int); INSERT INTO parts_target VALUES ('a', 1);
         CREATE TABLE parts (sku text, n int) PARTITION BY LIST (sku);
         CREATE TABLE parts_b PARTITION OF parts FOR VALUES IN ('b');
         CREATE FOREIGN TABLE parts_a PARTITION OF parts FOR VALUES IN ('a')
           SERVER loop OPTIONS (table_name 'parts_target');
         CREATE FUNCTION app_fence(r text, t text) RETURNS void LANGUAGE sql AS
           $$ SELECT set_config('fen' || 'cing.resource', r, false), set_config('fen' || 'cing.token', t, false) $$;"
    ));
    // dblink only where the commit hook can judge it (see `dblink_without_the_hook...`).
    if s.pg
        .psql("SELECT current_setting('fence_hook.active', true)")
        == "on"
    {
        s.pg.psql("CREATE EXTENSION dblink");
    }
    s
}

/// A session that declares `token` for `inv:a` with `declare` and writes a local row with
/// it, so that the proxy's last check of it found that token.
fn session(s: &Setup, declare: fn(&str) -> String, token: &str) -> Raw {
    let mut c = Raw::connect(s.addr(), &[]);
    let declared = c.simple(&declare(token));
    assert!(declared.errors.is_empty(), "{declared:?}");
    let local = c.simple("UPDATE stock SET n = n WHERE sku = 'a'");
    assert!(local.errors.is_empty(), "{local:?}");
    c
}

fn by_set(t: &str) -> String {
    format!("SET fencing.resource = 'inv:a'; SET fencing.token = '{t}'")
}

fn unseen(t: &str) -> String {
    format!("SELECT app_fence('inv:a', '{t}')")
}

/// The zombie's case: a session writes with 50; a newer holder raises the mark to 100; the
/// zombie, which the proxy now knows to be stale (it sends no check before its statements in
/// autocommit: the commit point's check judges), runs `sql`, which must fail with FN001 and
/// leave `state` (a query read directly) as it was; the holder's `sql` goes through and
/// changes it. Under each judge in `judges`.
fn judged_with(declare: fn(&str) -> String, sql: &str, state: &str, judges: &[&str]) {
    for judge in judges {
        let pg = match *judge {
            "the proxy" => Postgres::start(),
            _ => Postgres::start_with_hook(),
        };
        let s = prepared(pg);
        let mut zombie = session(&s, declare, "50");
        let mut holder = session(&s, declare, "100");
        let before = s.pg.psql(state);
        let stale = zombie.simple(sql);
        assert_eq!(stale.code(), "FN001", "{sql}, judged by {judge}: {stale:?}");
        assert_eq!(
            s.pg.psql(state),
            before,
            "{sql}: the stale write reached the far side ({judge})"
        );
        let current = holder.simple(sql);
        assert!(current.errors.is_empty(), "{sql} ({judge}): {current:?}");
        assert_ne!(
            s.pg.psql(state),
            before,
            "{sql}: the current write ({judge})"
        );
    }
}

fn judged(sql: &str, state: &str, judges: &[&str]) {
    judged_with(by_set, sql, state, judges);
}

const BOTH: &[&str] = &["the proxy", "fence_hook"];

#[test]
fn an_update_through_a_foreign_table() {
    judged(
        "UPDATE far_stock SET n = n - 1 WHERE sku = 'a'",
        "SELECT n FROM stock",
        BOTH,
    );
}

#[test]
fn an_insert_and_a_delete_through_a_foreign_table() {
    judged(
        "INSERT INTO far_stock VALUES ('z', 1)",
        "SELECT count(*) FROM stock",
        BOTH,
    );
    judged(
        "DELETE FROM far_stock WHERE sku = 'a'",
        "SELECT count(*) FROM stock",
        BOTH,
    );
}

/// Without the hook nothing can judge a TRUNCATE of a foreign table: the installation makes
/// every postgres_fdw table that does not say otherwise not truncatable, for everyone; a
/// table whose owner set `truncatable` keeps it.
#[test]
fn a_truncate_of_a_foreign_table_without_the_hook_is_refused() {
    let s = prepared(Postgres::start());
    let mut zombie = session(&s, by_set, "50");
    let _holder = session(&s, by_set, "100");
    let a = zombie.simple("TRUNCATE far_stock");
    assert!(!a.errors.is_empty(), "{a:?}");
    assert!(a.errors[0].1.contains("truncate"), "{a:?}");
    assert_eq!(s.pg.psql("SELECT count(*) FROM stock"), "1");
    s.pg.psql(
        "CREATE FOREIGN TABLE chosen (sku text, n int) SERVER loop \
         OPTIONS (table_name 'parts_target', truncatable 'true')",
    );
    assert_eq!(
        s.pg.psql(
            "SELECT ftoptions::text FROM pg_foreign_table WHERE ftrelid = 'chosen'::regclass"
        ),
        "{table_name=parts_target,truncatable=true}"
    );
}

/// PostgreSQL allows no TRUNCATE trigger on a foreign table: the commit hook judges it.
#[test]
fn a_truncate_of_a_foreign_table_with_the_commit_hook() {
    judged(
        "TRUNCATE far_stock",
        "SELECT count(*) FROM stock",
        &["fence_hook"],
    );
    judged(
        "TRUNCATE parts",
        "SELECT count(*) FROM parts_target",
        &["fence_hook"],
    );
}

#[test]
fn an_insert_routed_to_a_foreign_partition() {
    judged(
        "INSERT INTO parts VALUES ('a', 1)",
        "SELECT count(*) FROM parts_target",
        BOTH,
    );
}

/// A token declared where the proxy cannot see it (a helper whose name does not say
/// "fencing").
#[test]
fn a_token_declared_unseen_then_a_write_through_a_foreign_table() {
    judged_with(
        unseen,
        "UPDATE far_stock SET n = n - 1 WHERE sku = 'a'",
        "SELECT n FROM stock",
        BOTH,
    );
}

/// `dblink_exec` commits on the far side as it runs: the commit hook judges the call before
/// it is made.
#[test]
fn dblink_exec_with_the_commit_hook() {
    let conn =
        "host=127.0.0.1 port=' || current_setting('port') || ' dbname=postgres user=postgres";
    judged(
        &format!("SELECT dblink_exec('{conn}', 'UPDATE stock SET n = n - 1 WHERE sku = ''a''')"),
        "SELECT n FROM stock",
        &["fence_hook"],
    );
}

/// A foreign table that was there before the check was installed is judged from the
/// installation on (the event trigger, which judges later ones, is dropped first).
#[test]
fn a_foreign_table_older_than_the_installation() {
    let s = prepared(Postgres::start());
    s.pg.psql(
        "DROP EVENT TRIGGER fencing_judge_new_foreign_tables;
         CREATE FOREIGN TABLE older (sku text, n int) SERVER loop OPTIONS (table_name 'stock')",
    );
    assert_eq!(
        s.pg.psql("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'older'::regclass"),
        "0"
    );
    let again = crate::start_proxy(&s.dir, &s.pg, 1000, "");
    assert_eq!(
        s.pg.psql("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'older'::regclass"),
        "1",
        "the installation judges it"
    );
    s.pg.psql("INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100)");
    let mut c = Raw::connect(&again.pg[0], &[]);
    c.simple(&by_set("1"));
    let stale = c.simple("UPDATE older SET n = 0");
    assert_eq!(stale.code(), "FN001", "{stale:?}");
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "10");
}

/// Without the commit hook nothing can judge a dblink call before it writes: a database with
/// dblink is refused, at the installation (fence-proxy does not start) and at a later `CREATE
/// EXTENSION`, unless the database accepts unjudged dblink calls.
#[test]
fn dblink_without_the_hook_is_refused_unless_accepted() {
    let s = prepared(Postgres::start());
    let refused = std::process::Command::new("psql")
        .args([&s.pg.url(), "-Atc", "CREATE EXTENSION dblink"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("fence_hook is not loaded"), "{err}");
    s.pg.psql("CREATE DATABASE other");
    let other = format!("postgres://postgres@127.0.0.1:{}/other", s.pg.port);
    let direct = std::process::Command::new("psql")
        .args([&other, "-Atc", "CREATE EXTENSION dblink"])
        .output()
        .unwrap();
    assert!(
        direct.status.success(),
        "no check in `other` yet: {}",
        String::from_utf8_lossy(&direct.stderr)
    );
    let config = format!(
        "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{other}\"]\nschema_wait_ms = 0\n",
        s.pg.port
    );
    let dir = tempfile::tempdir().unwrap();
    let mut p = e2e::FenceProxy::spawn(dir.path(), &config);
    assert_eq!(p.wait().code(), Some(1), "{}", p.stderr.text());
    assert!(
        p.stderr.text().contains("has dblink"),
        "{}",
        p.stderr.text()
    );
    // A role's setting is not the database's acceptance (a second breaker's finding).
    s.pg.psql("ALTER ROLE postgres SET fencing.allow_unjudged_dblink = on");
    let mut p = e2e::FenceProxy::spawn(dir.path(), &config);
    assert_eq!(p.wait().code(), Some(1), "{}", p.stderr.text());
    s.pg.psql("ALTER DATABASE other SET fencing.allow_unjudged_dblink = on");
    let mut p = e2e::FenceProxy::spawn(dir.path(), &config);
    let line = p.stderr.wait_for("the check installed in `other`", |l| {
        l.contains("installed the fence check")
    });
    assert!(line.contains("other"), "{line}");
    p.signal(libc::SIGTERM);
}

/// The judge trigger of a foreign table, as the installation makes it.
const JUDGED: &str = "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'far_stock'::regclass \
     AND tgname = 'fencing_judge_rows' AND tgenabled IN ('O', 'A') AND tgqual IS NULL \
     AND tgtype = 31 AND tgattr = ''::int2vector AND tgfoid = 'fencing.judge_foreign()'::regprocedure";

/// The owner of a foreign table can disable, drop, rename or replace its trigger (found by an
/// outside breaker: a zombie's write then committed through it). Each is undone at the end of
/// the command, and the zombie's write is refused after them all.
#[test]
fn a_foreign_tables_trigger_is_made_again_after_its_owner_undoes_it() {
    let s = prepared(Postgres::start());
    for tamper in [
        "ALTER FOREIGN TABLE far_stock DISABLE TRIGGER fencing_judge_rows",
        "ALTER TABLE far_stock DISABLE TRIGGER ALL",
        "ALTER FOREIGN TABLE far_stock ENABLE REPLICA TRIGGER fencing_judge_rows",
        "DROP TRIGGER fencing_judge_rows ON far_stock",
        "ALTER TRIGGER fencing_judge_rows ON far_stock RENAME TO other",
        "CREATE OR REPLACE TRIGGER fencing_judge_rows BEFORE INSERT OR UPDATE OR DELETE \
         ON far_stock FOR EACH ROW WHEN (false) EXECUTE FUNCTION fencing.judge_foreign('1000')",
        // Only for updates of one column (a second breaker's: other columns went unjudged).
        "CREATE OR REPLACE TRIGGER fencing_judge_rows BEFORE INSERT OR UPDATE OF sku OR DELETE \
         ON far_stock FOR EACH ROW EXECUTE FUNCTION fencing.judge_foreign('1000')",
    ] {
        s.pg.psql(tamper);
        assert_eq!(s.pg.psql(JUDGED), "1", "after {tamper}");
    }
    let mut zombie = session(&s, by_set, "50");
    let _holder = session(&s, by_set, "100");
    let stale = zombie.simple("UPDATE far_stock SET n = n - 1 WHERE sku = 'a'");
    assert_eq!(stale.code(), "FN001", "{stale:?}");
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "10");
}

/// The zombie's token declared the other ways the bypass catalogue lists: start-up options,
/// start-up keys of their own (asyncpg, pgx) and a bound `set_config`; each zombie's write
/// through the foreign table is refused under both judges.
#[test]
fn a_zombie_declared_at_start_up_or_by_bound_values_writes_nothing_through_a_foreign_table() {
    for judge in BOTH {
        let pg = match *judge {
            "the proxy" => Postgres::start(),
            _ => Postgres::start_with_hook(),
        };
        let s = prepared(pg);
        let options = [("options", "-c fencing.resource=inv:a -c fencing.token=50")];
        let keys = [("fencing.resource", "inv:a"), ("fencing.token", "50")];
        let mut zombies = vec![
            ("options", Raw::connect(s.addr(), &options)),
            ("start-up keys", Raw::connect(s.addr(), &keys)),
            ("bound set_config", Raw::connect(s.addr(), &[])),
        ];
        let bound = zombies[2].1.extended(
            "SELECT set_config($1, $2, false), set_config($3, $4, false)",
            &["fencing.resource", "inv:a", "fencing.token", "50"],
        );
        assert!(bound.errors.is_empty(), "{bound:?}");
        for (how, z) in &mut zombies {
            let a = z.simple("UPDATE stock SET n = n WHERE sku = 'a'");
            assert!(a.errors.is_empty(), "{how} ({judge}): {a:?}");
        }
        let _holder = session(&s, by_set, "100");
        for (how, z) in &mut zombies {
            let stale = z.simple("UPDATE far_stock SET n = n - 1 WHERE sku = 'a'");
            assert_eq!(stale.code(), "FN001", "{how} ({judge}): {stale:?}");
        }
        assert_eq!(s.pg.psql("SELECT n FROM stock"), "10", "{judge}");
    }
}
