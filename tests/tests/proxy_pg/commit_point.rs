//! A transaction's end, where the check that decides runs, and what PostgreSQL does there
//! after it unless the proxy sees to it: held cursors (FN006), deferred triggers (fired before
//! the check), the completion of an implicit transaction (sent once it committed), and which
//! open transactions a raise may end (judged per resource by the tokens they advertised).
//! Each test here was written from an outside breaker's repro and failed without its fix.

use std::io::Write;

use pg_wire::msg;

use crate::{
    code, connect, connect_with, error_of, holder, mark, raw_query, raw_session, read_until,
    runtime, setup, until_the_wait_restarts,
};

/// The tags of the messages a raw query got back, e.g. "CEZ".
fn tags(messages: &[(u8, Vec<u8>)]) -> String {
    messages.iter().map(|(t, _)| *t as char).collect()
}

#[test]
fn a_write_refused_at_its_commit_point_is_answered_by_the_error_alone() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init')",
    );
    let mut a = raw_session(
        s.addr(),
        &[(b"fencing.resource", b"acct:1"), (b"fencing.token", b"41")],
    );
    assert_eq!(
        tags(&raw_query(
            &mut a,
            "UPDATE acct SET owner = 'A1' WHERE id = 1"
        )),
        "CZ"
    );
    // The proxy now believes 41 is current, so A's next write is checked at its commit point
    // only; the newer holder raised the mark behind its back.
    s.pg.psql("UPDATE fencing.tokens SET token = 42 WHERE resource = 'acct:1'");
    // PostgreSQL sends an implicit transaction's last completion only after its commit: a
    // refused commit is the error alone (not "UPDATE 1", then the error).
    let one = raw_query(&mut a, "UPDATE acct SET owner = 'A2' WHERE id = 1");
    assert_eq!(tags(&one), "EZ");
    assert_eq!(error_of(&one).1, "FN001");
    let two = raw_query(
        &mut a,
        "UPDATE acct SET owner = 'A3' WHERE id = 1; UPDATE acct SET owner = 'A4' WHERE id = 1",
    );
    assert_eq!(
        tags(&two),
        "CEZ",
        "the first statement's completion, then the error"
    );
    assert_eq!(error_of(&two).1, "FN001");
    assert_eq!(s.pg.psql("SELECT owner FROM acct"), "A1");
    // A passing commit still gets its completion, once.
    let mut b = raw_session(
        s.addr(),
        &[(b"fencing.resource", b"acct:1"), (b"fencing.token", b"42")],
    );
    assert_eq!(
        tags(&raw_query(
            &mut b,
            "UPDATE acct SET owner = 'B' WHERE id = 1"
        )),
        "CZ"
    );
    assert_eq!(
        tags(&raw_query(
            &mut b,
            "UPDATE acct SET owner = 'B1' WHERE id = 1; UPDATE acct SET owner = 'B2' WHERE id = 1"
        )),
        "CCZ"
    );
    assert_eq!(s.pg.psql("SELECT owner FROM acct"), "B2");
}

/// A `WITH HOLD` cursor's query runs when its transaction commits, after the proxy's last
/// check: a write in it (or a declaration and a write) would go unjudged, so such a commit is
/// refused (FN006), however the transaction was spelled, and nothing of it is kept.
#[test]
fn a_held_cursor_cannot_carry_a_write_past_the_check() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10); \
         CREATE FUNCTION take() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
           UPDATE stock SET n = n - 1 WHERE sku = 'a'; RETURN 1; END $$; \
         CREATE FUNCTION take_as_one() RETURNS int LANGUAGE plpgsql AS $$ BEGIN \
           PERFORM set_config('fencing.resource', 'inv:a', false); \
           PERFORM set_config('fencing.token', '1', false); \
           UPDATE stock SET n = n - 1 WHERE sku = 'a'; RETURN 1; END $$",
    );
    let mut a = raw_session(
        s.addr(),
        &[(b"fencing.resource", b"inv:a"), (b"fencing.token", b"100")],
    );
    assert_eq!(
        tags(&raw_query(&mut a, "UPDATE stock SET n = n WHERE sku = 'a'")),
        "CZ"
    );
    s.pg.psql("UPDATE fencing.tokens SET token = 101 WHERE resource = 'inv:a'");
    let mut none = raw_session(s.addr(), &[]);
    for (zombie, sql) in [
        (true, "DECLARE c CURSOR WITH HOLD FOR SELECT take()"),
        (
            true,
            "DECLARE c CURSOR WITH HOLD FOR SELECT take(); SELECT 1",
        ),
        (
            true,
            "SELECT 1; DECLARE c CURSOR WITH HOLD FOR SELECT take()",
        ),
        // A session without a token whose cursor declares a stale one and writes.
        (false, "DECLARE c CURSOR WITH HOLD FOR SELECT take_as_one()"),
    ] {
        let got = raw_query(if zombie { &mut a } else { &mut none }, sql);
        assert_eq!(error_of(&got).1, "FN006", "{sql}: {}", tags(&got));
        assert_eq!(s.pg.psql("SELECT n FROM stock"), "10", "{sql}");
    }
    // In an explicit transaction, and through the extended protocol.
    assert_eq!(tags(&raw_query(&mut none, "BEGIN")), "CZ");
    raw_query(
        &mut none,
        "DECLARE c CURSOR WITH HOLD FOR SELECT take_as_one()",
    );
    let got = raw_query(&mut none, "COMMIT");
    assert_eq!(error_of(&got).1, "FN006", "{}", tags(&got));
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "10");
    runtime().block_on(async {
        let c = connect(s.addr()).await;
        let e = c
            .execute("DECLARE c CURSOR WITH HOLD FOR SELECT take_as_one()", &[])
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN006", "{e}");
        // A cursor without HOLD, read inside its transaction, is as before; so is a held one
        // closed before the commit (PostgreSQL then has nothing to run at commit).
        c.batch_execute(
            "BEGIN; DECLARE d CURSOR FOR SELECT sku FROM stock; FETCH ALL FROM d; COMMIT",
        )
        .await
        .unwrap();
        c.batch_execute(
            "BEGIN; DECLARE h CURSOR WITH HOLD FOR SELECT sku FROM stock; CLOSE h; COMMIT",
        )
        .await
        .unwrap();
    });
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "10");
    assert_eq!(mark(&s.pg, "inv:a"), "101");
}

/// A zombie that raised two resources in one transaction, one of them to a token far above
/// the other's: the newer holder of the lower one still ends it after the fence wait (each
/// resource's advertisement is judged on its own), and the zombie's COMMIT is told FN003.
#[test]
fn a_zombie_raising_two_resources_is_ended_by_the_newer_holder_of_either() {
    let s = setup(100);
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('y', 10); \
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:y', 5)",
    );
    runtime().block_on(async {
        let a = connect(s.addr()).await;
        for q in [
            "BEGIN",
            "SET LOCAL fencing.resource = 'inv:x'; SET LOCAL fencing.token = '1000'",
            "SELECT 1",
            "SET LOCAL fencing.resource = 'inv:y'; SET LOCAL fencing.token = '6'",
            "UPDATE stock SET n = n - 1 WHERE sku = 'y'",
        ] {
            a.batch_execute(q).await.unwrap();
        }
        let b = holder(s.addr(), "inv:y", 7).await;
        // Only a bound on a broken build (which would wait for A for ever), not a timing.
        b.batch_execute("SET statement_timeout = '60s'")
            .await
            .unwrap();
        b.batch_execute("UPDATE stock SET n = 100 WHERE sku = 'y'")
            .await
            .expect("the newer holder of inv:y ended the zombie and wrote");
        let e = a.batch_execute("COMMIT").await.unwrap_err();
        assert_eq!(code(&e), "FN003", "{e}");
    });
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "100");
    assert_eq!(mark(&s.pg, "inv:y"), "7");
}

/// A deferred constraint trigger runs when its transaction commits, after the statements: the
/// check at the transaction's end fires it first (`SET CONSTRAINTS ALL IMMEDIATE`), so that a
/// trigger that declares a stale token and writes is judged by what it declared, in
/// autocommit, in an explicit transaction, in a session with or without a token; one that
/// declares the current token writes. A deferred trigger that leaves a held cursor behind is
/// refused with it, and no cursor outlives the refusal.
#[test]
fn a_deferred_trigger_is_judged_by_what_it_declares() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10); \
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100); \
         CREATE TABLE q (token text, how text); \
         CREATE FUNCTION w() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           PERFORM set_config('fencing.resource', 'inv:a', false); \
           PERFORM set_config('fencing.token', NEW.token, false); \
           IF NEW.how = 'cursor' THEN \
             EXECUTE 'DECLARE c CURSOR WITH HOLD FOR SELECT 1'; \
           END IF; \
           UPDATE stock SET n = n - 1 WHERE sku = 'a'; RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER w AFTER INSERT ON q DEFERRABLE INITIALLY DEFERRED \
           FOR EACH ROW EXECUTE FUNCTION w()",
    );
    let n = || s.pg.psql("SELECT n FROM stock");
    runtime().block_on(async {
        let none = connect(s.addr()).await;
        let current = holder(s.addr(), "inv:a", 100).await;
        for (who, client) in [("no token", &none), ("the current token", &current)] {
            // (What the trigger declared is undone with its transaction.)
            let e = none_or(
                client
                    .batch_execute("INSERT INTO q VALUES ('1', 'write')")
                    .await,
            );
            assert_eq!(e.as_deref(), Some("FN001"), "simple, {who}");
            let e = none_or(
                client
                    .execute("INSERT INTO q VALUES ('1', 'write')", &[])
                    .await
                    .map(|_| ()),
            );
            assert_eq!(e.as_deref(), Some("FN001"), "extended, {who}");
            client
                .batch_execute("BEGIN; INSERT INTO q VALUES ('1', 'write')")
                .await
                .unwrap();
            let e = none_or(client.batch_execute("COMMIT").await);
            assert_eq!(e.as_deref(), Some("FN001"), "explicit, {who}");
            client.batch_execute("ROLLBACK").await.unwrap();
        }
        assert_eq!(n(), "10");
        // A deferred trigger that opens a held cursor: refused, and nothing outlives it.
        let e = none_or(
            none.batch_execute("INSERT INTO q VALUES ('100', 'cursor')")
                .await,
        );
        assert_eq!(e.as_deref(), Some("FN006"));
        let open: i64 = none
            .query_one("SELECT count(*) FROM pg_cursors WHERE is_holdable", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(open, 0);
        assert_eq!(n(), "10");
        // The current token, declared by the trigger, writes.
        none.batch_execute("INSERT INTO q VALUES ('100', 'write')")
            .await
            .unwrap();
    });
    assert_eq!(n(), "9");
    assert_eq!(s.pg.psql("SELECT count(*) FROM q"), "1");
}

/// The SQLSTATE of a failed call, or None if it succeeded.
fn none_or(r: Result<(), tokio_postgres::Error>) -> Option<String> {
    r.err().map(|e| code(&e))
}

/// An implicit transaction whose commit fails for a reason of PostgreSQL's own (a deferred
/// foreign key) is answered with the error alone, rows first if it returned any, with or
/// without a token, as PostgreSQL answers it.
#[test]
fn a_commit_that_fails_in_postgresql_is_answered_by_its_error_alone() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE parent (id int PRIMARY KEY); \
         CREATE TABLE child (id int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)",
    );
    let mut none = raw_session(s.addr(), &[]);
    let mut token = raw_session(
        s.addr(),
        &[(b"fencing.resource", b"r"), (b"fencing.token", b"7")],
    );
    for session in [&mut none, &mut token] {
        let got = raw_query(session, "INSERT INTO child VALUES (1)");
        assert_eq!(tags(&got), "EZ");
        assert_eq!(error_of(&got).1, "23503");
        let got = raw_query(session, "INSERT INTO child VALUES (1) RETURNING id");
        assert_eq!(tags(&got), "TDEZ");
        assert_eq!(error_of(&got).1, "23503");
        let got = raw_query(session, "SELECT 1; INSERT INTO child VALUES (1)");
        assert_eq!(tags(&got), "TDCEZ");
    }
    assert_eq!(s.pg.psql("SELECT count(*) FROM child"), "0");
}

/// A transaction that shared the resource with the current token and then raised it, or that
/// reads with a token newer than the mark, has advertised a token newer than B's: B, raising
/// to an older one, waits for it instead of ending it.
#[test]
fn an_older_token_does_not_end_a_sharer_that_raised_or_a_newer_reader() {
    let s = setup(100);
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10); \
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100)",
    );
    runtime().block_on(async {
        let watcher = connect(s.addr()).await;
        // A shares inv:a with 100, then raises it to 102.
        let a = holder(s.addr(), "inv:a", 100).await;
        for q in [
            "BEGIN",
            "UPDATE stock SET n = n - 1 WHERE sku = 'a'",
            "SET fencing.token = '102'",
            "UPDATE stock SET n = n - 1 WHERE sku = 'a'",
        ] {
            a.batch_execute(q).await.unwrap();
        }
        let b = holder(s.addr(), "inv:a", 101).await;
        let b_write = tokio::spawn(async move {
            b.batch_execute("UPDATE stock SET n = 0 WHERE sku = 'a'")
                .await
        });
        until_the_wait_restarts(&watcher).await;
        a.batch_execute("COMMIT")
            .await
            .expect("the raise to 102 was not ended");
        let e = b_write
            .await
            .unwrap()
            .expect_err("101 is older than 102 now");
        assert_eq!(code(&e), "FN001", "{e}");
        assert_eq!(mark(&s.pg, "inv:a"), "102");

        // A reader with 105 (above the mark, 102) holds the resource shared.
        let r = holder(s.addr(), "inv:a", 105).await;
        r.batch_execute("BEGIN READ ONLY; SELECT n FROM stock")
            .await
            .unwrap();
        let c = holder(s.addr(), "inv:a", 103).await;
        let c_write = tokio::spawn(async move {
            c.batch_execute("UPDATE stock SET n = 50 WHERE sku = 'a'")
                .await
        });
        until_the_wait_restarts(&watcher).await;
        r.batch_execute("COMMIT")
            .await
            .expect("the newer reader was not ended");
        c_write
            .await
            .unwrap()
            .expect("103 raises once the reader is gone");
    });
    assert_eq!(mark(&s.pg, "inv:a"), "103");
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "50");
}

/// In a database without the fence check, a commit with a held cursor open is refused too
/// (FN004: nothing there can judge what the cursor's query declares and writes).
#[test]
fn a_held_cursor_is_refused_where_the_check_is_not_installed() {
    let s = setup(1000);
    s.pg.psql_each(&["CREATE DATABASE bare"]);
    runtime().block_on(async {
        let (c, _conn) = connect_with(s.addr(), "dbname=bare").await;
        c.batch_execute("CREATE TABLE t (v int)").await.unwrap();
        let e = c
            .batch_execute("DECLARE h CURSOR WITH HOLD FOR SELECT 1")
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN004", "{e}");
        let open: i64 = c
            .query_one("SELECT count(*) FROM pg_cursors WHERE is_holdable", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(open, 0);
        c.batch_execute("INSERT INTO t VALUES (1)").await.unwrap();
    });
}

/// The tags and the final transaction status of a raw query's answer, e.g. "CEZ/I".
fn answer(messages: &[(u8, Vec<u8>)]) -> String {
    let status = messages
        .last()
        .filter(|(t, _)| *t == b'Z')
        .map_or('?', |(_, m)| m[5] as char);
    format!("{}/{status}", tags(messages))
}

/// Whatever ends a transaction's COMMIT (the check refusing it, or PostgreSQL failing it on a
/// deferred constraint), the client is answered as PostgreSQL answers a failed COMMIT: the
/// error, and the transaction over (ReadyForQuery `I`), in the same order as PostgreSQL
/// sends it, also in one query string; the session goes on without a ROLLBACK.
#[test]
fn a_failed_commit_is_answered_as_postgresql_answers_it() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE parent (id int PRIMARY KEY); \
         CREATE TABLE child (id int REFERENCES parent DEFERRABLE INITIALLY DEFERRED); \
         CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init'); \
         INSERT INTO fencing.tokens (resource, token) VALUES ('acct:1', 41)",
    );
    let direct = format!("127.0.0.1:{}", s.pg.port);
    // PostgreSQL's own answers, then the proxy's, to the same sequences.
    let sequences: &[&[&str]] = &[
        &[
            "BEGIN",
            "INSERT INTO child VALUES (1)",
            "COMMIT",
            "SELECT 1",
        ],
        &["BEGIN", "INSERT INTO child VALUES (1)", "END", "SELECT 1"],
        &[
            "BEGIN; INSERT INTO child VALUES (1) RETURNING id; COMMIT",
            "SELECT 1",
        ],
        &[
            "BEGIN; INSERT INTO parent VALUES (1) RETURNING id; COMMIT",
            "SELECT 1",
        ],
        &[
            "BEGIN; INSERT INTO child VALUES (1); COMMIT; SELECT 2",
            "SELECT 1",
        ],
        // A COMMIT of a transaction an error aborted is a ROLLBACK.
        &[
            "BEGIN",
            "INSERT INTO parent VALUES (5)",
            "SELECT 1/0",
            "COMMIT",
            "SELECT 1",
        ],
        // Notifications come after the completion, as after a commit.
        &[
            "LISTEN ch",
            "NOTIFY ch",
            "INSERT INTO parent VALUES (6); NOTIFY ch",
            "SELECT pg_notify('ch', 'x')",
        ],
    ];
    // Without a token, and with one (the current one, for a resource of its own).
    let keys: [&[(&[u8], &[u8])]; 2] = [
        &[],
        &[(b"fencing.resource", b"own"), (b"fencing.token", b"1")],
    ];
    for sequence in sequences {
        for extra in keys {
            let run = |addr: &str| {
                let mut session = raw_session(addr, extra);
                let got: Vec<String> = sequence
                    .iter()
                    .map(|sql| answer(&raw_query(&mut session, sql)))
                    .collect();
                s.pg.psql("DELETE FROM parent");
                got
            };
            assert_eq!(run(s.addr()), run(&direct), "{sequence:?} {extra:?}");
        }
        // Pipelined: every query sent at once; each runs as it would have alone.
        let pipelined = |addr: &str| {
            let mut session = raw_session(addr, &[]);
            let mut all = Vec::new();
            for sql in sequence.iter() {
                msg::query(&mut all, sql.as_bytes());
            }
            session.write_all(&all).unwrap();
            let got: Vec<String> = sequence
                .iter()
                .map(|_| answer(&read_until(&mut session, b'Z')))
                .collect();
            s.pg.psql("DELETE FROM parent");
            got
        };
        assert_eq!(
            pipelined(s.addr()),
            pipelined(&direct),
            "pipelined {sequence:?}"
        );
    }
    // A COMMIT the check refuses: the same shape as a failed one.
    let mut a = raw_session(
        s.addr(),
        &[(b"fencing.resource", b"acct:1"), (b"fencing.token", b"41")],
    );
    assert_eq!(answer(&raw_query(&mut a, "BEGIN")), "CZ/T");
    assert_eq!(
        answer(&raw_query(
            &mut a,
            "UPDATE acct SET owner = 'A' WHERE id = 1"
        )),
        "CZ/T"
    );
    s.pg.psql("UPDATE fencing.tokens SET token = 42 WHERE resource = 'acct:1'");
    let refused = raw_query(&mut a, "COMMIT");
    assert_eq!(answer(&refused), "EZ/I");
    assert_eq!(error_of(&refused).1, "FN001");
    // A stale token known before a statement fails that statement, as any failing statement
    // does (the rest of the string skipped, the transaction aborted until ROLLBACK).
    assert_eq!(
        answer(&raw_query(
            &mut a,
            "BEGIN; UPDATE acct SET owner = 'A' WHERE id = 1; COMMIT"
        )),
        "CEZ/E"
    );
    assert_eq!(answer(&raw_query(&mut a, "ROLLBACK")), "CZ/I");
    assert_eq!(s.pg.psql("SELECT owner FROM acct"), "init");
}
