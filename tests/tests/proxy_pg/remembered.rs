//! fence_hook's remembered passes (proxy/pg-hook, "Remembered passes"): a backend whose fast
//! check passed a (resource, token) uses that pass again, without reading the fence's tables,
//! only while the fence epoch has not moved; every change to those tables moves it. These show
//! that each way a mark, a prefix or a key can change is seen at the next check, that nothing
//! is remembered where the tables are not guarded whole, in a transaction that changed them
//! itself, or on a standby, and that changes by a prepared transaction, by a subscription and
//! through a parent table are seen too. They connect straight to PostgreSQL with
//! `client_min_messages = debug1`, under which the hook says when a pass was used again ("as
//! read before").

use e2e::pg::Postgres;
use e2e::raw::{Answer, Raw};

use crate::fast_check::{database, declare, session};

const R: &str = "inv:a";
const UPDATE: &str = "UPDATE stock SET n = n - 1 WHERE sku = 'a'";
const REMEMBERED: &str = "as read before";
/// The mark back at 100, plain, and no resource needing a signature.
const RESET: &str = "DELETE FROM fencing.signed_prefixes; \
     INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100) \
     ON CONFLICT (resource) DO UPDATE SET token = 100, signed_hash = NULL";

/// A session straight to PostgreSQL that hears the hook's DEBUG1 messages, with token `token`
/// for inv:a.
fn holder(pg: &Postgres, token: &str) -> Raw {
    let mut c = session(pg, "postgres");
    declare(&mut c, R, token);
    c
}

fn remembered(a: &Answer) -> bool {
    a.notices.iter().any(|n| n.contains(REMEMBERED))
}

/// Whether the first check of `a` that passed (an autocommit write's, before the write; its
/// commit's check then finds that pass) used one from before.
fn first_pass_remembered(a: &Answer) -> bool {
    a.notices
        .iter()
        .find(|n| n.starts_with("fence_hook: token"))
        .is_some_and(|n| n.contains(REMEMBERED))
}

/// Writes until a pass is used again; asserts that it is.
fn write_remembered(c: &mut Raw, what: &str) {
    let first = c.simple(UPDATE);
    assert!(
        first.errors.is_empty(),
        "{what}, the first write: {first:?}"
    );
    let again = c.simple(UPDATE);
    assert!(
        again.errors.is_empty() && remembered(&again),
        "{what}: the second write should pass as read before: {again:?}"
    );
}

fn stock(pg: &Postgres) -> i64 {
    pg.psql("SELECT n FROM stock").parse().unwrap()
}

#[test]
fn every_change_to_the_fences_tables_is_seen_by_a_remembered_pass() {
    let pg = database();
    let mut a = holder(&pg, "100");
    // (what, the change made by another session without the fence lock, the code the write
    // with token 100 then gets; None: it still passes, read again)
    let cases: &[(&str, &[&str], Option<&str>)] = &[
        (
            "an UPDATE by hand",
            &["UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'"],
            Some("FN001"),
        ),
        (
            "an UPDATE as a replica (logical replication's apply, a restore)",
            &["SET session_replication_role = replica; \
               UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'"],
            Some("FN001"),
        ),
        (
            "a TRUNCATE and an INSERT",
            &["BEGIN; TRUNCATE fencing.tokens; \
               INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 101); COMMIT"],
            Some("FN001"),
        ),
        (
            "a DELETE, then an INSERT",
            &[
                "DELETE FROM fencing.tokens",
                "INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 101)",
            ],
            Some("FN001"),
        ),
        (
            "an upsert",
            &[
                "INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 101) \
               ON CONFLICT (resource) DO UPDATE SET token = excluded.token",
            ],
            Some("FN001"),
        ),
        (
            "a prefix that needs a signature",
            &["INSERT INTO fencing.signed_prefixes VALUES ('inv:')"],
            Some("FN007"),
        ),
        (
            "a new version of the keys",
            &["UPDATE fencing.keys_version SET v = v + 1"],
            None,
        ),
        (
            "a key added",
            &["INSERT INTO fencing.keys (key_id, retired) VALUES ('old', true)"],
            None,
        ),
    ];
    for (what, change, code) in cases {
        pg.psql(RESET);
        write_remembered(&mut a, what);
        let before = stock(&pg);
        pg.psql_each(change);
        let w = a.simple(UPDATE);
        assert!(
            !first_pass_remembered(&w),
            "{what}: used again after the change: {w:?}"
        );
        match code {
            Some(code) => {
                assert_eq!(w.code(), *code, "{what}: {w:?}");
                assert_eq!(stock(&pg), before, "{what}: the write committed");
            }
            None => assert!(w.errors.is_empty(), "{what}: {w:?}"),
        }
    }
}

#[test]
fn a_change_that_commits_after_a_pass_was_read_is_seen() {
    let pg = database();
    let port = pg.port.to_string();
    // Session w changes the mark by hand, without the fence lock, and keeps its transaction
    // open; session a's checks read the mark, still 100, after w's statement ended.
    let mut w = Raw::connect(&format!("127.0.0.1:{port}"), &[("database", "postgres")]);
    let b = w.simple("BEGIN; UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
    assert!(b.errors.is_empty(), "{b:?}");
    let mut a = holder(&pg, "100");
    write_remembered(&mut a, "while the change is open");
    // w commits: its end of transaction moves the epoch, after the change is visible.
    assert!(w.simple("COMMIT").errors.is_empty());
    write_refused(&mut a, &pg, "once w committed");
}

#[test]
fn nothing_is_remembered_where_the_tables_are_not_guarded_whole() {
    let pg = database();
    // (what weakens the guard, by the owner of the schema)
    let cases: &[(&str, &str)] = &[
        (
            "the trigger disabled",
            "ALTER TABLE fencing.tokens DISABLE TRIGGER fencing_hook_changed",
        ),
        (
            "a trigger enabled only for origin sessions",
            "ALTER TABLE fencing.signed_prefixes ENABLE TRIGGER fencing_hook_truncated",
        ),
        (
            "a trigger dropped",
            "DROP TRIGGER fencing_hook_truncated ON fencing.keys",
        ),
        (
            "the trigger function replaced",
            "CREATE OR REPLACE FUNCTION fencing.hook_changed() RETURNS trigger \
             LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
        ),
        (
            "a trigger with a WHEN",
            "CREATE OR REPLACE TRIGGER fencing_hook_changed \
             AFTER INSERT OR UPDATE OR DELETE ON fencing.tokens \
             FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION fencing.hook_changed(); \
             ALTER TABLE fencing.tokens ENABLE ALWAYS TRIGGER fencing_hook_changed",
        ),
        (
            "a statement trigger in place of the row trigger (logical replication fires none)",
            "CREATE OR REPLACE TRIGGER fencing_hook_changed \
             AFTER INSERT OR UPDATE OR DELETE ON fencing.signed_prefixes \
             FOR EACH STATEMENT EXECUTE FUNCTION fencing.hook_changed(); \
             ALTER TABLE fencing.signed_prefixes ENABLE ALWAYS TRIGGER fencing_hook_changed",
        ),
        (
            "an UPDATE trigger for one column",
            "CREATE OR REPLACE TRIGGER fencing_hook_changed \
             AFTER INSERT OR UPDATE OF updated_at OR DELETE ON fencing.tokens \
             FOR EACH STATEMENT EXECUTE FUNCTION fencing.hook_changed(); \
             ALTER TABLE fencing.tokens ENABLE ALWAYS TRIGGER fencing_hook_changed",
        ),
    ];
    for (what, weaken) in cases {
        // The installation puts the guard back whole.
        crate::install_schema(&pg, "postgres");
        pg.psql(RESET);
        let mut a = holder(&pg, "100");
        write_remembered(&mut a, what);
        pg.psql(weaken);
        write_read_again(&mut a, what);
        // A change the weakened guard may not see is seen all the same.
        pg.psql("UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
        write_refused(&mut a, &pg, what);
    }
}

#[test]
fn an_invalidation_lost_in_an_overflow_forgets_everything() {
    let pg = database();
    let port = pg.port.to_string();
    let connect = || Raw::connect(&format!("127.0.0.1:{port}"), &[("database", "postgres")]);
    let mut a = holder(&pg, "100");
    write_remembered(&mut a, "before");
    // Session a waits for an advisory lock that x holds: busy, it reads no invalidation.
    let mut x = connect();
    assert!(x.simple("SELECT pg_advisory_lock(42)").errors.is_empty());
    a.send_simple("SELECT pg_advisory_lock(42)");
    pg.wait_until(
        "a waiting for the lock",
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        "1",
    );
    // Meanwhile the guard is weakened, and so many invalidations follow (a few per table
    // created) that the queue overflows past a: the one for fencing.tokens is lost to it, and
    // it is told to reset everything instead. Then the mark changes, which nothing announces.
    pg.psql("ALTER TABLE fencing.tokens DISABLE TRIGGER fencing_hook_changed");
    pg.psql(
        "DO $$ BEGIN FOR i IN 1..3000 LOOP \
         EXECUTE format('CREATE TABLE overflow_%s (x int, y int)', i); END LOOP; END $$",
    );
    pg.psql("UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
    assert!(x.simple("SELECT pg_advisory_unlock(42)").errors.is_empty());
    let got = a.read_answer();
    assert!(got.errors.is_empty(), "{got:?}");
    write_refused(&mut a, &pg, "after the overflow");
}

#[test]
fn tables_found_under_another_schema_are_read_not_remembered() {
    let pg = database();
    let mut a = holder(&pg, "100");
    write_remembered(&mut a, "before the rename");
    // The schema renamed, and a table of marks made in its place without a trigger firing:
    // the check no longer finds the fence it passed, so the write is not passed from memory.
    pg.psql(
        "ALTER SCHEMA fencing RENAME TO fencing_old; CREATE SCHEMA fencing; \
         CREATE TABLE fencing.tokens AS SELECT resource, 101::bigint AS token FROM fencing_old.tokens",
    );
    let before = stock(&pg);
    let w = a.simple(UPDATE);
    assert!(!remembered(&w), "{w:?}");
    assert!(!w.errors.is_empty(), "{w:?}");
    assert_eq!(stock(&pg), before);
}

#[test]
fn a_change_rolled_back_to_a_savepoint_is_not_remembered() {
    let pg = database();
    pg.psql("UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
    // Token 100 is stale. The session holds the fence lock by hand (its writes' checks are then
    // left to the commit), lowers the mark to its token in a savepoint, where the fast check
    // passes it, and rolls that back.
    let mut a = holder(&pg, "100");
    let w = a.simple(
        "BEGIN; SELECT pg_advisory_xact_lock_shared(fencing.lock_key('inv:a')); SAVEPOINT s; \
         UPDATE fencing.tokens SET token = 100 WHERE resource = 'inv:a'; \
         SELECT fencing.hook_check(1000)",
    );
    assert!(w.errors.is_empty(), "{w:?}");
    assert_eq!(w.rows.last().unwrap()[0].as_deref(), Some("100"), "{w:?}");
    let w = a.simple(&format!("ROLLBACK TO s; {UPDATE}"));
    assert!(w.errors.is_empty(), "{w:?}");
    let w = a.simple("COMMIT");
    assert_eq!(w.code(), "FN001", "{w:?}");
    assert!(!remembered(&w), "{w:?}");
    assert_eq!(stock(&pg), 10);
    assert_eq!(crate::mark(&pg, R), "101");
}

/// Writes twice with `c`: both pass, and neither uses a pass from before.
fn write_read_again(c: &mut Raw, what: &str) {
    for _ in 0..2 {
        let w = c.simple(UPDATE);
        assert!(w.errors.is_empty() && !remembered(&w), "{what}: {w:?}");
    }
}

/// Writes with `c` and expects FN001, the write not made.
fn write_refused(c: &mut Raw, pg: &Postgres, what: &str) {
    let before = stock(pg);
    let w = c.simple(UPDATE);
    assert_eq!(w.code(), "FN001", "{what}: {w:?}");
    assert!(!remembered(&w), "{what}: {w:?}");
    assert_eq!(stock(pg), before, "{what}");
}

/// A PostgreSQL as [`database`] that allows prepared transactions.
fn database_with_2pc() -> Postgres {
    let mut pg = database();
    pg.psql_each(&["ALTER SYSTEM SET max_prepared_transactions = 5"]);
    pg.restart();
    pg
}

#[test]
fn a_prepared_change_to_the_fences_tables_is_seen_once_committed() {
    let pg = database_with_2pc();
    let mut a = holder(&pg, "100");
    write_remembered(&mut a, "before the prepare");
    let port = pg.port.to_string();
    let mut p = Raw::connect(&format!("127.0.0.1:{port}"), &[("database", "postgres")]);
    let w = p.simple(
        "BEGIN; UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'; \
         PREPARE TRANSACTION 'raise'",
    );
    assert!(w.errors.is_empty(), "{w:?}");
    // The change is not visible yet: token 100 passes, read each time, as a prepared
    // transaction ends without its session's callbacks.
    write_read_again(&mut a, "while the change is prepared");
    assert!(p.simple("COMMIT PREPARED 'raise'").errors.is_empty());
    write_refused(&mut a, &pg, "once committed");
}

#[test]
fn a_change_prepared_without_the_hook_is_seen_once_committed() {
    let mut pg = database_with_2pc();
    pg.restart_with_hook(false);
    pg.psql(
        "BEGIN; UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'; \
         PREPARE TRANSACTION 'raise'",
    );
    pg.restart_with_hook(true);
    let mut a = holder(&pg, "100");
    write_read_again(&mut a, "while the change is prepared");
    pg.psql("COMMIT PREPARED 'raise'");
    write_refused(&mut a, &pg, "once committed");
}

/// A publisher of fencing.tokens and a subscriber of it (two-phase, and both allowing
/// prepared transactions, when `two_phase`), each as [`database`]; returns once the
/// subscription streams.
fn replicated(two_phase: bool) -> (Postgres, Postgres) {
    let server = if two_phase {
        database_with_2pc
    } else {
        database
    };
    let mut publisher = server();
    publisher.psql_each(&["ALTER SYSTEM SET wal_level = logical"]);
    publisher.restart();
    publisher.psql("CREATE PUBLICATION marks FOR TABLE fencing.tokens");
    let subscriber = server();
    subscriber.psql(&format!(
        "CREATE SUBSCRIPTION marks CONNECTION 'host=127.0.0.1 port={} user=postgres dbname=postgres' \
         PUBLICATION marks WITH (copy_data = false, two_phase = {two_phase})",
        publisher.port
    ));
    // Streaming once a change made now arrives (and, two-phase, once that is enabled).
    publisher.psql("INSERT INTO fencing.tokens (resource, token) VALUES ('inv:ready', 1)");
    subscriber.wait_until(
        "the subscription streaming",
        "SELECT count(*) FROM fencing.tokens WHERE resource = 'inv:ready'",
        "1",
    );
    if two_phase {
        subscriber.wait_until(
            "two-phase enabled",
            "SELECT subtwophasestate FROM pg_subscription WHERE subname = 'marks'",
            "e",
        );
    }
    (publisher, subscriber)
}

#[test]
fn a_prepared_change_replicated_by_a_two_phase_subscription_is_seen() {
    let (publisher, subscriber) = replicated(true);
    let mut a = holder(&subscriber, "100");
    write_remembered(&mut a, "on the subscriber");
    // The apply worker prepares the change, and later commits it, without SQL.
    publisher.psql(
        "BEGIN; UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'; \
         PREPARE TRANSACTION 'raise'",
    );
    subscriber.wait_until(
        "the prepare on the subscriber",
        "SELECT count(*) FROM pg_prepared_xacts",
        "1",
    );
    write_read_again(&mut a, "while the change is prepared on the subscriber");
    publisher.psql("COMMIT PREPARED 'raise'");
    subscriber.wait_until(
        "the raise on the subscriber",
        "SELECT token FROM fencing.tokens WHERE resource = 'inv:a'",
        "101",
    );
    write_refused(&mut a, &subscriber, "once committed on the subscriber");
    subscriber.psql("DROP SUBSCRIPTION marks");
}

#[test]
fn a_change_replicated_by_a_subscription_is_seen() {
    let (publisher, subscriber) = replicated(false);
    let mut a = holder(&subscriber, "100");
    write_remembered(&mut a, "on the subscriber");
    // The apply worker fires row triggers only.
    publisher.psql("UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
    subscriber.wait_until(
        "the raise on the subscriber",
        "SELECT token FROM fencing.tokens WHERE resource = 'inv:a'",
        "101",
    );
    write_refused(&mut a, &subscriber, "once replicated");
    subscriber.psql("DROP SUBSCRIPTION marks");
}

#[test]
fn a_change_written_through_a_parent_table_is_seen() {
    let pg = database();
    // (the table made a parent of fencing.tokens, by its owner; the write through it)
    let cases: &[(&str, &str, &str)] = &[
        (
            "an inheritance parent",
            "CREATE TABLE par (resource text, token bigint); ALTER TABLE fencing.tokens INHERIT par",
            "UPDATE par SET token = 101 WHERE resource = 'inv:a'",
        ),
        (
            "a partitioned table",
            "ALTER TABLE fencing.tokens NO INHERIT par; \
             CREATE TABLE pp (LIKE fencing.tokens) PARTITION BY LIST (resource); \
             ALTER TABLE pp ATTACH PARTITION fencing.tokens DEFAULT",
            "UPDATE pp SET token = 101 WHERE resource = 'inv:a'",
        ),
    ];
    for (what, parent, change) in cases {
        pg.psql(parent);
        pg.psql(RESET);
        let mut a = holder(&pg, "100");
        write_remembered(&mut a, what);
        pg.psql(change);
        assert_eq!(crate::mark(&pg, R), "101", "{what}");
        write_refused(&mut a, &pg, what);
    }
}

#[test]
fn ddl_committed_during_a_transaction_that_used_a_pass_is_seen_at_its_commit() {
    let pg = database();
    let port = pg.port.to_string();
    let mut a = holder(&pg, "100");
    write_remembered(&mut a, "before the transaction");
    let before = stock(&pg);
    let w = a.simple(&format!("BEGIN; {UPDATE}"));
    assert!(w.errors.is_empty() && remembered(&w), "{w:?}");
    // Meanwhile the owner disables the trigger, changes the mark unseen, and enables it again,
    // in one transaction (a DISABLE TRIGGER does not wait for readers of the table).
    let mut p = Raw::connect(&format!("127.0.0.1:{port}"), &[("database", "postgres")]);
    let w = p.simple(
        "BEGIN; ALTER TABLE fencing.tokens DISABLE TRIGGER fencing_hook_changed; \
         UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'; \
         ALTER TABLE fencing.tokens ENABLE ALWAYS TRIGGER fencing_hook_changed; COMMIT",
    );
    assert!(w.errors.is_empty(), "{w:?}");
    // a's commit takes in the DDL's invalidations before it would use its pass, and reads.
    let w = a.simple("COMMIT");
    assert_eq!(w.code(), "FN001", "{w:?}");
    assert!(!first_pass_remembered(&w), "{w:?}");
    assert_eq!(stock(&pg), before);
}

#[test]
fn the_trigger_function_is_the_fences_alone() {
    let pg = database();
    // Nobody else may put it on a table.
    pg.psql("CREATE ROLE app LOGIN; GRANT ALL ON SCHEMA public TO app");
    let port = pg.port.to_string();
    let mut app = Raw::connect(
        &format!("127.0.0.1:{port}"),
        &[("database", "postgres"), ("user", "app")],
    );
    let w = app.simple(
        "CREATE TABLE mine (x int); CREATE TRIGGER t AFTER INSERT ON mine \
         FOR EACH ROW EXECUTE FUNCTION fencing.hook_changed()",
    );
    assert_eq!(w.code(), "42501", "{w:?}");
    // Put on another table by a superuser, it marks nothing: a session that writes that
    // table still uses its passes, and the epoch does not move for anyone.
    pg.psql(
        "CREATE TRIGGER t AFTER UPDATE ON stock FOR EACH ROW EXECUTE FUNCTION fencing.hook_changed()",
    );
    let mut a = holder(&pg, "100");
    write_remembered(&mut a, "with the function on stock");
    let w = a.simple(UPDATE);
    assert!(w.errors.is_empty() && first_pass_remembered(&w), "{w:?}");
}

#[test]
fn a_standby_remembers_nothing_and_its_promotion_refuses_an_old_token() {
    let pg = database();
    let standby = pg.standby();
    standby.wait_until(
        "the mark on the standby",
        "SELECT token FROM fencing.tokens WHERE resource = 'inv:a'",
        "100",
    );
    // On the standby, the relay's check before a transaction passes token 100 each time by
    // reading the mark: a standby's tables change by WAL replay, which fires no trigger.
    let mut a = holder(&standby, "100");
    for _ in 0..2 {
        let w = a.simple("SELECT fencing.hook_check(1000)");
        assert!(w.errors.is_empty() && !remembered(&w), "{w:?}");
        assert_eq!(w.rows[0][0].as_deref(), Some("100"), "{w:?}");
    }
    // The primary raises the mark; then the standby is promoted, and session a, still
    // connected, writes with its old token.
    pg.psql("UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
    standby.wait_until(
        "the raise on the standby",
        "SELECT token FROM fencing.tokens WHERE resource = 'inv:a'",
        "101",
    );
    standby.psql("SELECT pg_promote(true, 60)");
    let w = a.simple(UPDATE);
    assert_eq!(w.code(), "FN001", "{w:?}");
    assert_eq!(standby.psql("SELECT n FROM stock"), "10");
}

#[test]
fn the_hook_taken_out_of_the_preload_leaves_the_fences_tables_writable() {
    let mut pg = database();
    pg.restart_with_hook(false);
    // The trigger's library loads, installs nothing and does nothing: the marks can be changed
    // (fence-proxy's own check raises them this way); the hook's function refuses, saying why.
    pg.psql("UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
    pg.psql("TRUNCATE fencing.signed_prefixes");
    assert_eq!(crate::mark(&pg, R), "101");
    let port = pg.port.to_string();
    let mut c = Raw::connect(&format!("127.0.0.1:{port}"), &[("database", "postgres")]);
    let w = c.simple("SELECT fencing.hook_check(1000)");
    assert_eq!(w.code(), "55000", "{w:?}");
    assert!(w.errors[0].1.contains("shared_preload_libraries"), "{w:?}");
}
