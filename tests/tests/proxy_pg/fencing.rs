//! The fence itself: invariant 3 (no write with an older token commits once a newer one was
//! accepted) and what each client is told.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::{
    code, connect, connect_with, error_of, holder, mark, psql, raw_query, raw_session, read_until,
    runtime, setup, start_proxy, until_the_wait_restarts, wait_count,
};

#[test]
fn a_stale_token_is_refused_with_its_sqlstate_and_the_session_stays_usable() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10)",
    );
    let (ok, out, err) = psql(
        s.addr(),
        "SET fencing.resource = 'inventory:a';\n\
         SET fencing.token = '42';\n\
         UPDATE stock SET n = 9 WHERE sku = 'a';\n\
         SET fencing.token = '41';\n\
         UPDATE stock SET n = 0 WHERE sku = 'a';\n\
         UPDATE stock SET n = 1 WHERE sku = 'a';\n\
         RESET fencing.token;\n\
         UPDATE stock SET n = 2 WHERE sku = 'a';\n\
         RESET fencing.resource;\n\
         SELECT 'usable', n FROM stock;\n\
         SET fencing.resource = 'inventory:a';\n\
         SET fencing.token = '43';\n\
         BEGIN; UPDATE stock SET n = 8 WHERE sku = 'a'; COMMIT;\n\
         BEGIN; SET LOCAL fencing.token = '40'; UPDATE stock SET n = 0 WHERE sku = 'a'; ROLLBACK;\n\
         SELECT 'after local', current_setting('fencing.token');\n\
         SET fencing.token = 'x';\n\
         UPDATE stock SET n = 0 WHERE sku = 'a';\n\
         DISCARD ALL;\n\
         SELECT 'discarded', coalesce(current_setting('fencing.token', true), '');\n",
        &[],
    );
    assert!(ok, "{err}");
    // Both writes with 41 refused, with the same words.
    assert_eq!(
        err.matches("ERROR:  FN001: fencing token 41 for resource 'inventory:a' is stale: the highest accepted token is 42").count(),
        2,
        "{err}"
    );
    assert!(
        err.contains("ERROR:  FN002: fencing.token 'x' is not a valid fencing token"),
        "{err}"
    );
    // A resource without a token is half a declaration: refused, never "no token".
    assert!(
        err.contains(
            "ERROR:  FN002: fencing.resource 'inventory:a' is set but fencing.token is not"
        ),
        "{err}"
    );
    assert!(out.contains("usable|9"), "{out}");
    // SET LOCAL: one transaction, refused, and the session's own token is back afterwards.
    assert!(
        err.contains("ERROR:  FN001: fencing token 40 for resource 'inventory:a' is stale: the highest accepted token is 43"),
        "{err}"
    );
    assert!(out.contains("after local|43"), "{out}");
    assert!(out.contains("discarded|"), "{out}");
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "8");
    assert_eq!(mark(&s.pg, "inventory:a"), "43");
}

#[test]
fn the_zombie_in_a_transaction_is_fenced_and_does_not_block_the_new_holder() {
    // A's open transaction is the one that set the mark (41 is new)...
    zombie_in_a_transaction(false);
}

#[test]
fn the_zombie_sharing_the_current_mark_is_fenced_too() {
    // ...or 41 was already the mark and A's transaction merely shares it.
    zombie_in_a_transaction(true);
}

fn zombie_in_a_transaction(mark_already_41: bool) {
    let s = setup(300);
    s.pg.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init')",
    );
    runtime().block_on(async {
        // A takes token 41, begins, writes, and stops without committing.
        let (a, a_conn) = connect_with(
            s.addr(),
            "options='-c fencing.resource=acct:1 -c fencing.token=41'",
        )
        .await;
        if mark_already_41 {
            a.execute("UPDATE acct SET owner = 'A0' WHERE id = 1", &[])
                .await
                .unwrap();
        }
        a.batch_execute("BEGIN").await.unwrap();
        a.execute("UPDATE acct SET owner = 'A' WHERE id = 1", &[])
            .await
            .unwrap();
        // B, with 42, writes the same row and commits: it waits for A's transaction at most
        // the fence wait, then PostgreSQL ends A's.
        let b = holder(s.addr(), "acct:1", 42).await;
        b.execute("UPDATE acct SET owner = 'B' WHERE id = 1", &[])
            .await
            .expect("the new holder's write goes through");
        // A wakes up and commits: refused, with the fenced error, in answer to its COMMIT
        // (PostgreSQL ended its session while it was idle; the proxy kept the error for it).
        let ended = a
            .batch_execute("COMMIT")
            .await
            .expect_err("the zombie's COMMIT must fail");
        assert_eq!(code(&ended), "FN003", "{ended}");
        let _ = a_conn.await;
        let msg = ended.as_db_error().unwrap().message().to_string();
        assert!(
            msg.contains("fencing token 41") && msg.contains("acct:1"),
            "{msg}"
        );
    });
    assert_eq!(s.pg.psql("SELECT owner FROM acct"), "B");
}

#[test]
fn a_commit_that_meets_the_end_of_its_session_in_the_proxy_is_told_fn003() {
    // The zombie's COMMIT and PostgreSQL's end of its session reach the proxy at the same
    // moment (the proxy is stopped while both are sent). PostgreSQL ended the session before
    // the COMMIT could reach it, so nothing was in flight: the client is told FN003, not
    // PostgreSQL's administrator shutdown (which the proxy reports when a message of the
    // client's was in flight, as the outcome is then unknown).
    let mut s = setup(300);
    s.pg.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init')",
    );
    let mut a = raw_session(
        s.addr(),
        &[(
            b"options",
            b"-c fencing.resource=acct:1 -c fencing.token=41",
        )],
    );
    raw_query(&mut a, "BEGIN");
    let wrote = raw_query(&mut a, "UPDATE acct SET owner = 'A' WHERE id = 1");
    assert!(wrote.iter().all(|(t, _)| *t != b'E'), "{wrote:?}");
    s.proxy.process.signal(libc::SIGSTOP);
    // B, on a direct connection, raises the mark to 42: its check waits the fence wait for
    // A's transaction, then ends A's session and waits for its end.
    s.pg.psql(
        "SET fencing.resource = 'acct:1'; SET fencing.token = '42'; BEGIN; \
         SELECT fencing.check_token(300); UPDATE acct SET owner = 'B' WHERE id = 1; COMMIT",
    );
    assert_eq!(
        s.pg.psql("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'"),
        "0"
    );
    let mut commit = Vec::new();
    pg_wire::msg::query(&mut commit, b"COMMIT");
    std::io::Write::write_all(&mut a, &commit).unwrap();
    s.proxy.process.signal(libc::SIGCONT);
    let (severity, code, message) = error_of(&read_until(&mut a, b'E'));
    assert_eq!(
        (severity.as_str(), code.as_str()),
        ("ERROR", "FN003"),
        "{message}"
    );
    assert!(message.contains("fencing token 41"), "{message}");
    assert_eq!(s.pg.psql("SELECT owner FROM acct"), "B");
}

#[test]
fn the_zombie_in_autocommit_is_refused_after_the_new_holder_wrote() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init')",
    );
    runtime().block_on(async {
        let a = holder(s.addr(), "acct:1", 41).await;
        a.execute("UPDATE acct SET owner = 'A1' WHERE id = 1", &[])
            .await
            .unwrap();
        let b = holder(s.addr(), "acct:1", 42).await;
        b.execute("UPDATE acct SET owner = 'B' WHERE id = 1", &[])
            .await
            .unwrap();
        // A's late write, extended protocol and simple protocol.
        let e = a
            .execute("UPDATE acct SET owner = 'A2' WHERE id = 1", &[])
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");
        let e = a
            .batch_execute("UPDATE acct SET owner = 'A3' WHERE id = 1")
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");
        let db = e.as_db_error().unwrap();
        assert!(
            db.message().contains("highest accepted token is 42"),
            "{}",
            db.message()
        );
        // Still usable for reads once it drops the token (both halves of it).
        a.batch_execute("RESET fencing.token; RESET fencing.resource")
            .await
            .unwrap();
        let row = a
            .query_one("SELECT owner FROM acct WHERE id = 1", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "B");
    });
}

#[test]
fn settings_mid_query_string_apply_to_the_statements_after_them() {
    let s = setup(1000);
    s.pg.psql("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'x')");
    s.pg.psql("INSERT INTO fencing.tokens (resource, token) VALUES ('r', 10)");
    runtime().block_on(async {
        let c = connect(s.addr()).await;
        // One simple Query: the settings, then the write; the write must be checked with 9.
        let e = c
            .batch_execute("SET fencing.resource = 'r'; SET fencing.token = '9'; UPDATE t SET v = 'stale' WHERE id = 1")
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");
        // The query string was one implicit transaction: its failure undid the SETs too, so
        // the session has no token now and is not fenced (as with PostgreSQL alone).
        let token: String = c.query_one("SELECT current_setting('fencing.token', true)", &[]).await.unwrap().get(0);
        assert_eq!(token, "");
        c.batch_execute("UPDATE t SET v = 'unfenced' WHERE id = 1").await.unwrap();
        // A valid token, then, after a COMMIT in the same string, a stale one: the statement
        // after the SET is checked with the new token.
        c.batch_execute("SET fencing.resource = 'r'; SET fencing.token = '11'").await.unwrap();
        let e = c
            .batch_execute("BEGIN; UPDATE t SET v = 'fresh' WHERE id = 1; COMMIT; SET fencing.token = '10'; UPDATE t SET v = 'stale2' WHERE id = 1")
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");
        let token: String = c.query_one("SELECT current_setting('fencing.token', true)", &[]).await.unwrap().get(0);
        assert_eq!(token, "11", "the failed implicit transaction undid the SET");
        // Not refused from the proxy's memory either: 11 is still good.
        c.batch_execute("UPDATE t SET v = 'fresh' WHERE id = 1").await.unwrap();
    });
    assert_eq!(s.pg.psql("SELECT v FROM t"), "fresh");
    assert_eq!(mark(&s.pg, "r"), "11");
}

/// Many sessions, tokens handed out in increasing order but used concurrently, doing
/// read-modify-write on shared rows. Each write appends (row, version, token) to a log in the
/// same transaction; the versions give the order in which writes to a row committed.
#[test]
fn interleaved_tokens_never_commit_out_of_order_and_nothing_acknowledged_is_lost() {
    let s = setup(200);
    s.pg.psql(
        "CREATE TABLE counter (id int PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO counter VALUES (1, 0), (2, 0);
         CREATE TABLE log (id int, v bigint, token bigint, PRIMARY KEY (id, v));",
    );
    let next = Arc::new(AtomicI64::new(1));
    // However the scheduler runs the workers, one write is stale: worker 0's first token is
    // taken before any other, and it writes only after some other worker's write committed.
    let zombie = next.fetch_add(1, Ordering::SeqCst);
    let committed = Arc::new(tokio::sync::Notify::new());
    let acked = runtime().block_on(async {
        let mut tasks = Vec::new();
        for w in 0..8 {
            let next = Arc::clone(&next);
            let committed = Arc::clone(&committed);
            let addr = s.addr().to_string();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut refused = 0;
                let mut c = connect(&addr).await;
                for i in 0..25 {
                    let row = 1 + (w + i) % 2;
                    let token = if w == 0 && i == 0 {
                        committed.notified().await;
                        zombie
                    } else {
                        next.fetch_add(1, Ordering::SeqCst)
                    };
                    if c.is_closed() {
                        c = connect(&addr).await;
                    }
                    let r = async {
                        c.batch_execute(&format!(
                            "SET fencing.resource = 'counter'; SET fencing.token = '{token}'"
                        ))
                        .await?;
                        c.batch_execute("BEGIN").await?;
                        let v: i64 = c
                            .query_one("SELECT v FROM counter WHERE id = $1 FOR UPDATE", &[&row])
                            .await?
                            .get(0);
                        c.execute("UPDATE counter SET v = $2 WHERE id = $1", &[&row, &(v + 1)])
                            .await?;
                        c.execute(
                            "INSERT INTO log VALUES ($1, $2, $3)",
                            &[&row, &(v + 1), &token],
                        )
                        .await?;
                        c.batch_execute("COMMIT").await?;
                        Ok::<_, tokio_postgres::Error>((row, v + 1))
                    }
                    .await;
                    match r {
                        Ok(w) => {
                            acked.push(w);
                            committed.notify_one();
                        }
                        Err(e) => {
                            // Refused (stale) or fenced out (connection ended): both expected.
                            if let Some(db) = e.as_db_error() {
                                assert!(
                                    ["FN001", "FN003"].contains(&db.code().code()),
                                    "unexpected error: {e}"
                                );
                            }
                            refused += 1;
                            if !c.is_closed() {
                                let _ = c.batch_execute("ROLLBACK").await;
                            }
                        }
                    }
                }
                (acked, refused)
            }));
        }
        let mut all = Vec::new();
        let mut refused = 0;
        for t in tasks {
            let (a, r) = t.await.unwrap();
            all.extend(a);
            refused += r;
        }
        assert!(
            refused > 0,
            "no write was refused, not even worker 0's first, whose token is older than a committed one"
        );
        all
    });
    assert!(
        acked.len() >= 10,
        "too few writes accepted: {}",
        acked.len()
    );
    let log = s.pg.psql("SELECT id, v, token FROM log ORDER BY id, v");
    let mut by_row: BTreeMap<i32, Vec<(i64, i64)>> = BTreeMap::new();
    for line in log.lines() {
        let f: Vec<i64> = line.split('|').map(|x| x.parse().unwrap()).collect();
        by_row.entry(f[0] as i32).or_default().push((f[1], f[2]));
    }
    for (row, writes) in &by_row {
        for pair in writes.windows(2) {
            assert!(
                pair[1].1 >= pair[0].1,
                "row {row}: version {} committed with token {} after version {} with token {}",
                pair[1].0,
                pair[1].1,
                pair[0].0,
                pair[0].1
            );
        }
    }
    let present: HashSet<(i32, i64)> = by_row
        .iter()
        .flat_map(|(r, w)| w.iter().map(move |(v, _)| (*r, *v)))
        .collect();
    for a in &acked {
        assert!(present.contains(a), "acknowledged write {a:?} is missing");
    }
    // The counter agrees with the log.
    for (row, writes) in &by_row {
        assert_eq!(
            s.pg.psql(&format!("SELECT v FROM counter WHERE id = {row}")),
            writes.len().to_string()
        );
    }
}

#[test]
fn a_session_without_a_token_is_checked_and_otherwise_unchanged() {
    let s = setup(1000);
    s.pg.psql("CREATE TABLE t (v text)");
    runtime().block_on(async {
        let c = connect(s.addr()).await;
        c.execute("INSERT INTO t VALUES ('plain')", &[])
            .await
            .unwrap();
        // The check ran ahead of it (as prepared statements, reading two settings), found no
        // token and left no mark; the last statement PostgreSQL saw is the client's own.
        let q: String = c
            .query_one(
                "SELECT query FROM pg_stat_activity WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            q,
            "SELECT query FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        );
    });
    assert_eq!(s.pg.psql("SELECT count(*) FROM fencing.tokens"), "0");
}

/// A transaction with the current token that starts while a newer token's raise is still
/// open waits for it, and then must not commit: under READ COMMITTED the check reads the raised
/// mark (FN001); under REPEATABLE READ its snapshot predates the raise, so the check's locking
/// read fails it (40001) instead of letting it see the old mark.
#[test]
fn a_transaction_that_waited_for_a_raise_sees_it_at_any_isolation_level() {
    let s = setup(60_000);
    // The two holders write different rows, so that only the check can stop the old one.
    s.pg.psql("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'init'), (2, 'init')");
    // The newer token comes through this proxy, or through a second one in front of the same
    // database: then the old token's proxy still believes its token current, and the check
    // takes its fast form (the lock shared, one read), which must see the raise just as well.
    // The old token's transaction is one Query (BEGIN; UPDATE; COMMIT: the check goes into the
    // text, after BEGIN) or three (the UPDATE's check goes ahead of it as prepared statements:
    // with a current token the lock and the read are two statements, so that the read's
    // snapshot is taken after the wait).
    let dir2 = tempfile::tempdir().unwrap();
    let other = start_proxy(&dir2, &s.pg, 60_000, "");
    let mut token = 0;
    for (isolation, expected, raiser, split) in [
        ("READ COMMITTED", "FN001", s.addr(), false),
        ("REPEATABLE READ", "40001", s.addr(), false),
        ("READ COMMITTED", "FN001", other.pg[0].as_str(), false),
        ("REPEATABLE READ", "40001", other.pg[0].as_str(), false),
        ("READ COMMITTED", "FN001", s.addr(), true),
        ("REPEATABLE READ", "40001", s.addr(), true),
        ("READ COMMITTED", "FN001", other.pg[0].as_str(), true),
        ("REPEATABLE READ", "40001", other.pg[0].as_str(), true),
    ] {
        token += 10;
        runtime().block_on(async {
            let old = connect(s.addr()).await;
            old.batch_execute(&format!(
                "SET fencing.resource = 'iso'; SET fencing.token = '{token}'; UPDATE t SET v = 'old' WHERE id = 2"
            ))
            .await
            .unwrap();
            // The newer token raises the mark in a transaction it keeps open.
            let new = connect(raiser).await;
            new.batch_execute(&format!(
                "SET fencing.resource = 'iso'; SET fencing.token = '{}'; BEGIN; UPDATE t SET v = 'new' WHERE id = 1",
                token + 1
            ))
            .await
            .unwrap();
            // The old token's next transaction starts and waits for the raise.
            let waiting = tokio::spawn(async move {
                if split {
                    old.batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
                        .await?;
                    old.batch_execute("UPDATE t SET v = 'stale' WHERE id = 2")
                        .await?;
                    old.batch_execute("COMMIT").await
                } else {
                    old.batch_execute(&format!(
                        "BEGIN ISOLATION LEVEL {isolation}; UPDATE t SET v = 'stale' WHERE id = 2; COMMIT"
                    ))
                    .await
                }
            });
            let watcher = connect(s.addr()).await;
            wait_count(
                &watcher,
                "the old token's transaction to wait for the raise",
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                1,
            )
            .await;
            new.batch_execute("COMMIT").await.unwrap();
            let e = waiting.await.unwrap().expect_err("the old token must not commit");
            assert_eq!(code(&e), expected, "{isolation}, split {split}: {e}");
        });
        assert_eq!(
            s.pg.psql("SELECT v FROM t ORDER BY id"),
            "new\nold",
            "{isolation}, split {split}"
        );
    }
}

#[test]
fn a_current_token_takes_the_fast_path_and_a_belief_gone_wrong_falls_back_to_the_full_check() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE t (n int); \
         CREATE FUNCTION bump() RETURNS void LANGUAGE sql AS $$ SELECT set_config('fencing.token', '7', false) $$",
    );
    // Every transaction that touches data gets a check. The general form (`fencing.
    // check_token`, which calls `fencing.check(wait)`) runs only where the relay does not know
    // the token to be the mark; otherwise the fast path (two plain statements, no function
    // call unless the mark is not the token: then `fencing.check_token` decides).
    let script = format!(
        "SET track_functions = 'all';\n\
         SET fencing.resource = 'inv:b';\n\
         SET fencing.token = '5';\n\
         INSERT INTO t VALUES (1);\n\
         BEGIN; INSERT INTO t VALUES (2); SELECT 'inside'; COMMIT;\n\
         SELECT bump();\n\
         BEGIN; INSERT INTO t VALUES (3); COMMIT;\n\
         \\! psql -h 127.0.0.1 -p {port} -U postgres -d postgres -X -q -c \"DELETE FROM fencing.tokens\"\n\
         BEGIN; INSERT INTO t VALUES (4); COMMIT;\n\
         BEGIN \\; INSERT INTO t VALUES (5) \\; COMMIT;\n\
         SELECT pg_stat_force_next_flush();\n\
         SELECT 'calls', string_agg(f.funcname || '/' || p.pronargs || ':' || f.calls, ',' \
           ORDER BY f.funcname, p.pronargs) FROM pg_stat_user_functions f \
           JOIN pg_proc p ON p.oid = f.funcid WHERE f.funcname IN ('check', 'check_token');\n",
        port = s.pg.port
    );
    let (ok, out, err) = psql(s.addr(), &script, &[]);
    assert!(ok, "{err}");
    // The general check ran 4 times, each through check_token:
    // - INSERT 1: the token's first use, before the INSERT (it raised the mark to 5); the
    //   check after it, at its commit, took the fast path;
    // - INSERT 3: the token had become 7 inside `bump()`, where the relay could not see it
    //   (the check after `SELECT bump()` did not judge: that transaction wrote nothing), so
    //   the relay knew nothing and checked in full before INSERT 3 (raising the mark to 7);
    // - INSERT 4: the marks were deleted behind everyone's back: the fast path before it found
    //   no mark and handed over, and the general check put 7 back;
    // - the one Query holding BEGIN, INSERT 5 and COMMIT: its checks go into its text, the
    //   one before INSERT 5 as `check(wait, current)` (the fast path inside PL/pgSQL: no
    //   general check), the one before COMMIT in the general form.
    // INSERT 2 and the COMMIT after `SELECT 'inside'`, SELECT bump() and the flush took the
    // fast path alone.
    assert!(
        out.contains("calls|check/1:4,check/2:1,check_token/1:4"),
        "{out}\n{err}"
    );
    assert_eq!(mark(&s.pg, "inv:b"), "7");
    assert_eq!(s.pg.psql("SELECT count(*) FROM t"), "5");
}

#[test]
fn failing_statements_after_the_check_and_a_dropped_check_statement_leave_the_session_in_step() {
    let s = setup(1000);
    s.pg.psql("CREATE TABLE t (n int)");
    // Each line below is one Query; its check goes ahead of it as extended-protocol messages
    // with a Sync after it, whose ReadyForQuery the proxy hides. If any reply were paired
    // with the wrong request, psql would see a second ReadyForQuery or miss one, and the
    // answers below would shift or the script would stop.
    let (ok, out, err) = psql(
        s.addr(),
        "SET fencing.resource = 'inv:c';\n\
         SET fencing.token = '3';\n\
         INSERT INTO t VALUES (1);\n\
         SELECT 1 / 0;\n\
         SELECT 'after division', count(*) FROM t;\n\
         SELECT no_such_column FROM t;\n\
         INSERT INTO t VALUES (2) \\; INSERT INTO t VALUES (1 / 0);\n\
         SELECT 'after a failed pair', count(*) FROM t;\n\
         DEALLOCATE __fence_proxy_fast;\n\
         INSERT INTO t VALUES (3);\n\
         DEALLOCATE ALL;\n\
         INSERT INTO t VALUES (4);\n\
         SELECT 'in step', count(*) FROM t;\n",
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(
        err.matches("ERROR:  22012: division by zero").count(),
        2,
        "{err}"
    );
    assert!(err.contains("ERROR:  42703"), "{err}");
    assert!(out.contains("after division|1"), "{out}");
    // The pair was one transaction: neither row kept.
    assert!(out.contains("after a failed pair|1"), "{out}");
    // After one of the proxy's statements was dropped by hand and after all of them were, the
    // proxy prepared them again (closing the survivors first) and the checks ran.
    assert!(out.contains("in step|3"), "{out}\n{err}");
    assert_eq!(mark(&s.pg, "inv:c"), "3");
}

/// A transaction that raised one resource to 3 and another to 7 (both still open) must not be
/// ended by a token 6 for the second: it is newer there. (The tokens a raising transaction
/// advertises name no resource; it counted as older if any of them was.)
#[test]
fn an_older_token_does_not_end_a_transaction_raising_another_resource_to_a_newer_one() {
    let s = setup(100);
    s.pg.psql("INSERT INTO fencing.tokens (resource, token) VALUES ('y', 5)");
    runtime().block_on(async {
        let a = connect(s.addr()).await;
        for q in [
            "BEGIN",
            "SET LOCAL fencing.resource = 'x'; SET LOCAL fencing.token = '3'",
            "SELECT 1",
            "SET LOCAL fencing.resource = 'y'; SET LOCAL fencing.token = '7'",
            "SELECT 2",
        ] {
            a.batch_execute(q).await.unwrap();
        }
        let b = holder(s.addr(), "y", 6).await;
        let b_write = tokio::spawn(async move { b.batch_execute("SELECT 3").await });
        let watcher = connect(s.addr()).await;
        // B's first wait ran out (fence_wait_ms), it looked for older transactions to end, and
        // it waits again.
        until_the_wait_restarts(&watcher).await;
        a.batch_execute("COMMIT")
            .await
            .expect("the newer raise was not ended");
        let e = b_write.await.unwrap().expect_err("6 is older than 7 now");
        assert_eq!(code(&e), "FN001", "{e}");
    });
    assert_eq!(mark(&s.pg, "y"), "7");
}

#[test]
fn read_only_transactions_at_any_isolation_level_are_checked_and_pass_with_a_current_token() {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE t (n int); INSERT INTO fencing.tokens (resource, token) VALUES ('r', 5)",
    );
    let (ok, out, err) = psql(
        s.addr(),
        "SET fencing.resource = 'r'; SET fencing.token = '5';\n\
         BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 'rr', count(*) FROM t; COMMIT;\n\
         BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE; SELECT 'ser', count(*) FROM t; COMMIT;\n\
         SET fencing.token = '4';\n\
         BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 'stale', count(*) FROM t; COMMIT;\n",
        &[],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("rr|0") && out.contains("ser|0"),
        "{out}\n{err}"
    );
    assert!(!out.contains("stale|"), "{out}");
    assert!(err.contains("FN001"), "{err}");
}

/// The relay's memory of marks is per database: two databases behind one listener each have
/// their own `inv:a`, and one's mark does not make the other's current token look stale (which
/// would cost it the fast path: a PL/pgSQL call per transaction).
#[test]
fn the_marks_in_memory_are_per_database() {
    let pg = e2e::pg::Postgres::start();
    pg.psql("CREATE DATABASE other");
    let other_url = format!("postgres://postgres@127.0.0.1:{}/other", pg.port);
    let dir = tempfile::tempdir().unwrap();
    let proxy = e2e::FenceProxy::start_with(
        dir.path(),
        &format!(
            "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\", \"{other_url}\"]\n",
            pg.port,
            pg.url()
        ),
        0,
        1,
    );
    let addr = proxy.pg[0].as_str();
    runtime().block_on(async {
        // In `postgres` the mark of inv:a goes to 500.
        let p = holder(addr, "inv:a", 500).await;
        p.batch_execute("SELECT 1").await.unwrap();
        // In `other`, inv:a is at 100: three writes with it.
        let (o, _conn) = connect_with(addr, "dbname=other").await;
        o.batch_execute("CREATE TABLE t (n int); SET track_functions = 'all'")
            .await
            .unwrap();
        o.batch_execute("SET fencing.resource = 'inv:a'; SET fencing.token = '100'")
            .await
            .unwrap();
        for _ in 0..3 {
            o.batch_execute("INSERT INTO t VALUES (1)").await.unwrap();
        }
        o.batch_execute("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
        // The first raised the mark through the general check; the others took the fast path.
        let calls: i64 = o
            .query_one(
                "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'check_token'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(calls, 1);
    });
}

#[test]
fn print_checks_prints_the_statements_each_connection_prepares() {
    let s = setup(1000);
    let out = std::process::Command::new(e2e::bin("fence-proxy"))
        .args(["pg", "print-checks"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed: BTreeMap<String, String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (name, text) = l.split_once('\t').expect("name<TAB>text");
            (name.to_string(), text.to_string())
        })
        .collect();
    let names: Vec<&str> = printed.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "__fence_proxy_any",
            "__fence_proxy_bare",
            "__fence_proxy_fast",
            "__fence_proxy_hooked",
            "__fence_proxy_lock"
        ]
    );
    // The commit hook's check is prepared only where the start-up reports the hook.
    let mut printed = printed;
    printed.remove("__fence_proxy_hooked");
    // What a session through the proxy has prepared is exactly what was printed.
    runtime().block_on(async {
        let c = connect(s.addr()).await;
        let rows = c
            .query(
                "SELECT name, statement FROM pg_prepared_statements \
                 WHERE name LIKE '\\_\\_fence\\_proxy%'",
                &[],
            )
            .await
            .unwrap();
        let prepared: BTreeMap<String, String> = rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect();
        assert_eq!(prepared, printed);
    });
}
