//! The server connection pool (`pool_size`): a server connection serves one client at a time,
//! and nothing of one client reaches the next: no setting (a fencing token above all), prepared
//! statement, temporary table, advisory lock, LISTEN, cursor or role; no cancel; no open
//! transaction (a client that leaves mid-transaction or mid-query takes its server connection
//! with it). The proxy authenticates pooled clients itself (SCRAM against `auth_file`), and
//! fencing through reused connections is what it is without a pool.

use tokio_postgres::{NoTls, SimpleQueryMessage};

use e2e::pg::Postgres;

use crate::{Setup, code, connect, connect_with, conninfo, runtime, setup_with, wait_count};

const POOL_OF_ONE: &str = "pool_size = 1\npool_auth = \"trust\"\npool_wait_ms = 500\n";

/// The first row of a simple query (no named statement is prepared), as text.
async fn row(c: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    let messages = c
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .expect("a row")
}

/// An error's own message (tokio-postgres says only "db error" for a server's).
fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}

async fn pid(c: &tokio_postgres::Client) -> String {
    row(c, "SELECT pg_backend_pid()").await.remove(0)
}

/// Ends a client and waits until its connection's task has seen the end.
async fn leave(
    c: tokio_postgres::Client,
    task: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    drop(c);
    let _ = task.await;
}

fn pooled(extra: &str) -> Setup {
    pooled_on(Postgres::start(), extra)
}

fn pooled_on(pg: Postgres, extra: &str) -> Setup {
    let s = setup_with(pg, 1000, extra);
    s.pg.psql(
        "CREATE ROLE app NOLOGIN; CREATE TABLE stock (sku text PRIMARY KEY, n int); \
         INSERT INTO stock VALUES ('a', 10); GRANT ALL ON stock TO PUBLIC;",
    );
    s
}

#[test]
fn nothing_of_one_client_reaches_the_next_on_the_same_server_connection() {
    // With the hook, which lets a held cursor be declared through the proxy (FN006 without).
    let s = pooled_on(Postgres::start_with_hook(), POOL_OF_ONE);
    let leavings = [
        "SET fencing.resource = 'inv:a'; SET fencing.token = '5'; \
         UPDATE stock SET n = n - 1; \
         SET work_mem = '7MB'; SELECT set_config('search_path', 'pg_catalog', false); \
         PREPARE mine AS SELECT 1; CREATE TEMP TABLE scratch (x int); \
         SELECT pg_advisory_lock(42); LISTEN ch; \
         SET SESSION AUTHORIZATION app",
        "BEGIN; DECLARE held CURSOR WITH HOLD FOR SELECT 1; COMMIT",
    ];
    runtime().block_on(async {
        for leaving in leavings {
            let (a, task) = connect_with(s.addr(), "").await;
            let first = pid(&a).await;
            a.batch_execute(leaving).await.unwrap();
            leave(a, task).await;

            let (b, task) = connect_with(s.addr(), "").await;
            // The same backend: the pool reused it.
            assert_eq!(pid(&b).await, first);
            let state = row(
                &b,
                "SELECT coalesce(current_setting('fencing.resource', true), ''), \
                        coalesce(current_setting('fencing.token', true), ''), \
                        current_setting('work_mem'), current_setting('search_path'), current_user, \
                        (SELECT count(*) FROM pg_prepared_statements WHERE name NOT LIKE '\\_\\_fence\\_proxy%'), \
                        (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()), \
                        (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()), \
                        (SELECT count(*) FROM pg_listening_channels()), \
                        (SELECT count(*) FROM pg_cursors WHERE is_holdable)",
            )
            .await;
            assert_eq!(
                state,
                ["", "", "4MB", "\"$user\", public", "postgres", "0", "0", "0", "0", "0"],
                "what the next client of the connection found after {leaving:?}"
            );
            // Without a token of its own it writes as any tokenless session does.
            b.batch_execute("UPDATE stock SET n = n - 1").await.unwrap();
            leave(b, task).await;
        }
    });
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "7");
    assert_eq!(crate::mark(&s.pg, "inv:a"), "5");
}

#[test]
fn a_client_gone_mid_transaction_or_mid_query_takes_its_server_connection_with_it() {
    let s = pooled(POOL_OF_ONE);
    runtime().block_on(async {
        // Mid-transaction, with a token and a write not committed.
        let (a, task) = connect_with(s.addr(), "").await;
        let first = pid(&a).await;
        a.batch_execute(
            "SET fencing.resource = 'inv:a'; SET fencing.token = '5'; BEGIN; \
             UPDATE stock SET n = 0",
        )
        .await
        .unwrap();
        leave(a, task).await;
        let (b, task) = connect_with(s.addr(), "").await;
        let second = pid(&b).await;
        assert_ne!(
            second, first,
            "a server connection left in a transaction was reused"
        );
        assert_eq!(row(&b, "SELECT n FROM stock").await, ["10"]);
        wait_count(
            &b,
            "the first backend to end",
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {first}"),
            0,
        )
        .await;

        // Mid-query: waiting for an advisory lock that a direct session holds.
        let direct = connect(&format!("127.0.0.1:{}", s.pg.port)).await;
        direct
            .batch_execute("SELECT pg_advisory_lock(7)")
            .await
            .unwrap();
        let waiting = tokio::spawn(async move {
            let _ = b
                .batch_execute("SELECT pg_advisory_lock(7) /* waits */")
                .await;
        });
        wait_count(
            &direct,
            "the pooled client's query to wait",
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            1,
        )
        .await;
        waiting.abort();
        task.abort();
        let _ = task.await;
        // PostgreSQL sees its client gone once the wait ends.
        direct
            .batch_execute("SELECT pg_advisory_unlock(7)")
            .await
            .unwrap();
        wait_count(
            &direct,
            "the waiting backend to end",
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {second}"),
            0,
        )
        .await;
        let c = connect(s.addr()).await;
        let third = pid(&c).await;
        assert!(third != first && third != second);
        // And it holds no lock of anyone's.
        assert_eq!(
            row(
                &c,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            )
            .await,
            ["0"]
        );
    });
}

#[test]
fn a_full_pool_makes_a_client_wait_then_refuses_it_with_53300() {
    let s = pooled(POOL_OF_ONE);
    runtime().block_on(async {
        let (a, task) = connect_with(s.addr(), "").await;
        let first = pid(&a).await;
        let e = tokio_postgres::connect(&conninfo(s.addr(), ""), NoTls)
            .await
            .err()
            .expect("a second client while the pool of one is in use");
        assert_eq!(code(&e), "53300", "{e}");
        assert!(message(&e).contains("pool_size = 1"), "{}", message(&e));
        leave(a, task).await;
        let b = connect(s.addr()).await;
        assert_eq!(pid(&b).await, first);
    });
}

#[test]
fn a_start_up_that_sets_a_fencing_setting_never_shares_its_server_connection() {
    let s = pooled(POOL_OF_ONE);
    runtime().block_on(async {
        for options in [
            "options='-c fencing.resource=inv:a -c fencing.token=5'",
            "options='-c FENCING.token=5 -c fencing.resource=inv:a'",
            "options='--fencing\\\\.token=5 -c fencing.resource=inv:a'",
        ] {
            let (a, task) = connect_with(s.addr(), options).await;
            let first = pid(&a).await;
            assert_eq!(
                row(&a, "SELECT current_setting('fencing.token')").await,
                ["5"],
                "{options}"
            );
            leave(a, task).await;
            let (b, task) = connect_with(s.addr(), options).await;
            assert_ne!(pid(&b).await, first, "{options}");
            leave(b, task).await;
        }
    });
}

#[test]
fn a_database_with_dblink_gets_no_reused_server_connections() {
    let s = pooled(POOL_OF_ONE);
    s.pg.psql("ALTER DATABASE postgres SET fencing.allow_unjudged_dblink = on");
    s.pg.psql("CREATE EXTENSION dblink");
    runtime().block_on(async {
        let (a, task) = connect_with(s.addr(), "").await;
        let first = pid(&a).await;
        leave(a, task).await;
        let b = connect(s.addr()).await;
        assert_ne!(pid(&b).await, first);
    });
}

#[test]
fn a_cancel_reaches_its_own_client_and_never_the_next_one() {
    let s = pooled(POOL_OF_ONE);
    runtime().block_on(async {
        let (a, task) = connect_with(s.addr(), "").await;
        let first = pid(&a).await;
        let old = a.cancel_token();
        let direct = connect(&format!("127.0.0.1:{}", s.pg.port)).await;
        direct
            .batch_execute("SELECT pg_advisory_lock(7)")
            .await
            .unwrap();
        let waits = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
        let a = std::sync::Arc::new(a);
        let q = {
            let a = std::sync::Arc::clone(&a);
            tokio::spawn(async move { a.batch_execute("SELECT pg_advisory_lock(7)").await })
        };
        wait_count(&direct, "a's wait", waits, 1).await;
        old.cancel_query(NoTls).await.unwrap();
        let e = q.await.unwrap().unwrap_err();
        assert_eq!(code(&e), "57014", "{e}");
        let a = std::sync::Arc::into_inner(a).unwrap();
        leave(a, task).await;

        // The next client of the same backend waits; the old key must not cancel it.
        let b = std::sync::Arc::new(connect(s.addr()).await);
        assert_eq!(pid(&b).await, first);
        let q = {
            let b = std::sync::Arc::clone(&b);
            tokio::spawn(async move { b.batch_execute("SELECT pg_advisory_lock(7)").await })
        };
        wait_count(&direct, "b's wait", waits, 1).await;
        old.cancel_query(NoTls).await.unwrap();
        direct
            .batch_execute("SELECT pg_advisory_unlock(7)")
            .await
            .unwrap();
        q.await
            .unwrap()
            .expect("the next client's query ran to its end");
    });
}

/// A write with `token` for inv:a through a fresh client of the pool; the backend it ran on
/// and the SQLSTATE it got ("" when it committed).
async fn write_with(addr: &str, token: i64) -> (String, String) {
    let (c, task) = connect_with(addr, "").await;
    let backend = pid(&c).await;
    let r = c
        .batch_execute(&format!(
            "SET fencing.resource = 'inv:a'; SET fencing.token = '{token}'; \
             UPDATE stock SET n = n - 1"
        ))
        .await;
    leave(c, task).await;
    (
        backend,
        r.err().map(|e| code(&e).to_string()).unwrap_or_default(),
    )
}

#[test]
fn fencing_through_reused_server_connections_is_fencing_without_them() {
    for pg in [Postgres::start(), Postgres::start_with_hook()] {
        let s = setup_with(pg, 1000, POOL_OF_ONE);
        s.pg.psql(
            "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10)",
        );
        runtime().block_on(async {
            let (first, ok) = write_with(s.addr(), 5).await;
            assert_eq!(ok, "");
            let (second, ok) = write_with(s.addr(), 6).await;
            assert_eq!((second.as_str(), ok.as_str()), (first.as_str(), ""));
            // The zombie's token, on the very connection that raised the mark past it.
            let (third, stale) = write_with(s.addr(), 5).await;
            assert_eq!((third.as_str(), stale.as_str()), (first.as_str(), "FN001"));
        });
        assert_eq!(s.pg.psql("SELECT n FROM stock"), "8");
        assert_eq!(crate::mark(&s.pg, "inv:a"), "6");
    }
}

#[test]
fn pooled_clients_are_authenticated_by_the_proxy_with_scram() {
    let pg = Postgres::start_with_hba(&[
        "host all app 127.0.0.1/32 scram-sha-256",
        "host all app2 127.0.0.1/32 scram-sha-256",
        "host all app3 127.0.0.1/32 scram-sha-256",
    ]);
    pg.psql(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE app LOGIN PASSWORD 'pw-app'; CREATE ROLE app2 LOGIN PASSWORD 'pw-2'; \
         CREATE ROLE app3 LOGIN PASSWORD 'pw-3'; CREATE ROLE other LOGIN PASSWORD 'pw-3'",
    );
    let secret = |role: &str| {
        pg.psql(&format!(
            "SELECT rolpassword FROM pg_authid WHERE rolname = '{role}'"
        ))
    };
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.txt");
    std::fs::write(
        &users,
        format!(
            "; the pool's users\n\"app\" \"pw-app\"\n\"app2\" \"{}\"\n\"app3\" \"{}\"\n",
            secret("app2"),
            // Another role's secret for the same password: another salt than PostgreSQL's.
            secret("other"),
        ),
    )
    .unwrap();
    let s = setup_with(
        pg,
        1000,
        &format!("pool_size = 1\nauth_file = \"{}\"\n", users.display()),
    );
    let login = |user: &str, password: &str| {
        conninfo(
            s.addr(),
            &format!("password={password} channel_binding=disable"),
        )
        .replace("user=postgres", &format!("user={user}"))
    };
    runtime().block_on(async {
        // A password in the file; the second client gets the first one's backend.
        let mut backends = Vec::new();
        for _ in 0..2 {
            let (c, task) = tokio_postgres::connect(&login("app", "pw-app"), NoTls)
                .await
                .expect("app with its password");
            let task = tokio::spawn(task);
            assert_eq!(row(&c, "SELECT current_user").await, ["app"]);
            backends.push(pid(&c).await);
            leave(c, task).await;
        }
        assert_eq!(backends[0], backends[1]);
        // PostgreSQL's own secret: the client's proof logs the proxy in (no password kept).
        let (c, task) = tokio_postgres::connect(&login("app2", "pw-2"), NoTls)
            .await
            .expect("app2 through its SCRAM secret");
        tokio::spawn(task);
        assert_eq!(row(&c, "SELECT current_user").await, ["app2"]);
        drop(c);
        // Wrong passwords, a user not in the file (though PostgreSQL trusts postgres), and
        // nobody at all are refused alike, by the proxy.
        for (user, password) in [
            ("app", "wrong"),
            ("app2", "pw-app"),
            ("postgres", "anything"),
            ("nobody", "pw-app"),
        ] {
            let e = tokio_postgres::connect(&login(user, password), NoTls)
                .await
                .err()
                .unwrap_or_else(|| panic!("{user} with {password:?} was let in"));
            assert_eq!(code(&e), "28P01", "{user}: {e}");
        }
        // A secret that is not PostgreSQL's: the client proved it, PostgreSQL would not take
        // it; said so.
        let e = tokio_postgres::connect(&login("app3", "pw-3"), NoTls)
            .await
            .err()
            .expect("app3 with a secret of another salt");
        assert!(message(&e).contains("not PostgreSQL's"), "{}", message(&e));
    });
}

#[test]
fn pgbench_with_a_connection_per_transaction_runs_through_the_pool() {
    let s = pooled("pool_size = 4\npool_auth = \"trust\"\n");
    let (host, port) = s.addr().rsplit_once(':').unwrap();
    let run = |args: &[&str]| {
        let out = Postgres::client_tool("pgbench")
            .args(["-h", host, "-p", port, "-U", "postgres"])
            .args(args)
            .arg("postgres")
            .output()
            .expect("pgbench");
        assert!(
            out.status.success(),
            "pgbench {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["-i", "-q"]);
    let out = run(&["-C", "-c", "4", "-t", "50", "-n"]);
    assert!(
        out.contains("number of transactions actually processed: 200/200"),
        "{out}"
    );
    // 200 connections of pgbench's, and the pool kept some of at most four server connections.
    assert_eq!(
        s.pg.psql("SELECT count(*) BETWEEN 1 AND 4 FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name = 'pgbench'"),
        "t"
    );
}

#[test]
fn statements_a_client_put_in_place_of_the_proxys_never_check_the_next_one() {
    // A client can replace the proxy's prepared checks where the relay cannot see it (in a
    // function), and fence only itself out that way; the next client of the connection must
    // get the proxy's own. Without the hook: the proxy's statements judge every commit.
    let s = pooled(POOL_OF_ONE);
    s.pg.psql("INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 6)");
    runtime().block_on(async {
        let (a, task) = connect_with(s.addr(), "").await;
        let first = pid(&a).await;
        a.batch_execute(
            "PREPARE mine AS SELECT 1; \
             DO $$ BEGIN \
               EXECUTE 'DEALLOCATE __fence_proxy_any'; \
               EXECUTE 'PREPARE __fence_proxy_any(int, bool, bool) AS SELECT 1 WHERE false'; \
               EXECUTE 'DEALLOCATE __fence_proxy_fast'; \
               EXECUTE 'PREPARE __fence_proxy_fast(int, bool) AS SELECT 1 WHERE false'; \
               EXECUTE 'DEALLOCATE __fence_proxy_lock'; \
               EXECUTE 'PREPARE __fence_proxy_lock(bool) AS SELECT true'; \
             END $$",
        )
        .await
        .unwrap();
        leave(a, task).await;
        let (b, task) = connect_with(s.addr(), "").await;
        assert_eq!(pid(&b).await, first);
        let r = b
            .batch_execute(
                "SET fencing.resource = 'inv:a'; SET fencing.token = '5'; \
                 UPDATE stock SET n = 0",
            )
            .await;
        let e = r.expect_err("a stale write through the next client of the connection");
        assert_eq!(code(&e), "FN001", "{e}");
        // The proxy's statements are its own again (prepared as the checks needed them), and
        // the client's are gone.
        assert_eq!(
            row(
                &b,
                "SELECT count(*) FILTER (WHERE name LIKE '\\_\\_fence\\_proxy%' AND NOT from_sql) > 0, \
                        count(*) FILTER (WHERE from_sql) FROM pg_prepared_statements"
            )
            .await,
            ["t", "0"]
        );
        leave(b, task).await;
    });
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "10");
}

#[test]
fn an_idle_connection_postgresql_ended_is_not_given_to_a_client() {
    let s = pooled(POOL_OF_ONE);
    runtime().block_on(async {
        let (a, task) = connect_with(s.addr(), "").await;
        let first = pid(&a).await;
        leave(a, task).await;
        let direct = connect(&format!("127.0.0.1:{}", s.pg.port)).await;
        // The reset's last statement ran: the connection waits in the pool.
        wait_count(
            &direct,
            "the pooled connection to be reset",
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {first} AND state = 'idle' \
                 AND query LIKE '%pg_extension%'"
            ),
            1,
        )
        .await;
        direct
            .batch_execute(&format!("SELECT pg_terminate_backend({first})"))
            .await
            .unwrap();
        wait_count(
            &direct,
            "the backend to end",
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {first}"),
            0,
        )
        .await;
        // The next client gets a new connection, not the dead one (its first query would
        // fail).
        let b = connect(s.addr()).await;
        assert_ne!(pid(&b).await, first);
        assert_eq!(row(&b, "SELECT n FROM stock").await, ["10"]);
    });
}

#[test]
fn pool_size_bounds_backends_when_a_client_leaves_mid_query() {
    let s = pooled(POOL_OF_ONE);
    runtime().block_on(async {
        let mine = "application_name=pooled";
        let (a, task) = connect_with(s.addr(), mine).await;
        let first = pid(&a).await;
        let a = std::sync::Arc::new(a);
        let running = {
            let a = std::sync::Arc::clone(&a);
            tokio::spawn(async move { a.batch_execute("SELECT pg_sleep(600)").await })
        };
        let direct = connect(&format!("127.0.0.1:{}", s.pg.port)).await;
        wait_count(
            &direct,
            "the query to run",
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {first} AND state = 'active'"
            ),
            1,
        )
        .await;
        // The client vanishes with its query running.
        running.abort();
        task.abort();
        let _ = task.await;
        drop(a);
        // Its place goes to the next client only once its backend is gone: one backend of
        // this pool's at a time, never two.
        let (b, _task) = connect_with(s.addr(), mine).await;
        assert_ne!(pid(&b).await, first);
        assert_eq!(
            row(
                &b,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pooled'"
            )
            .await,
            ["1"]
        );
    });
}

#[test]
fn a_client_that_leaves_an_unsynced_batch_commits_nothing_and_holds_no_place() {
    use std::io::Write;
    let s = pooled(POOL_OF_ONE);
    for failing in [false, true] {
        let mut raw = crate::raw_session(s.addr(), &[]);
        let mut out = Vec::new();
        let sql = if failing {
            "UPDATE stock SET n = 0 WHERE 1 / 0 = 1"
        } else {
            "UPDATE stock SET n = 0"
        };
        pg_wire::msg::parse(&mut out, b"", sql.as_bytes(), &[]);
        pg_wire::msg::bind(&mut out, b"", b"", &[]);
        pg_wire::msg::execute(&mut out, b"", 0);
        out.extend_from_slice(b"H\0\0\0\x04"); // Flush, and no Sync
        raw.write_all(&out).unwrap();
        // The replies come (an error, when it fails), then the client leaves.
        crate::read_until(&mut raw, if failing { b'E' } else { b'C' });
        let mut end = Vec::new();
        pg_wire::msg::terminate(&mut end);
        raw.write_all(&end).unwrap();
        drop(raw);
        // The next client gets in within pool_wait_ms (500 ms), and the write never committed.
        runtime().block_on(async {
            let b = connect(s.addr()).await;
            assert_eq!(
                row(&b, "SELECT n FROM stock").await,
                ["10"],
                "failing: {failing}"
            );
        });
    }
}
