//! Clients we did not write, through the proxy, with and without a token.

use futures_util::{SinkExt, StreamExt};
use tokio_postgres::NoTls;

use e2e::pg::Postgres;

use crate::{
    code, connect, connect_with, conninfo, mark, psql, runtime, setup, setup_with, wait_count,
};

#[test]
fn psql_scripts_run_unchanged_with_ssl_refused_and_notifications_delivered() {
    let s = setup(1000);
    // psql asks for TLS first (sslmode=prefer): the proxy says no and psql goes on in clear.
    let (ok, out, err) = psql(
        s.addr(),
        "CREATE TABLE notes (id serial PRIMARY KEY, body text);\n\
         SET fencing.resource = 'notes';\n\
         SET fencing.token = '7';\n\
         INSERT INTO notes (body) VALUES ('a'), ('b');\n\
         COPY notes (body) FROM STDIN;\nc\nd\n\\.\n\
         SELECT string_agg(body, ',' ORDER BY id) FROM notes;\n\
         COPY (SELECT body FROM notes ORDER BY id) TO STDOUT;\n\
         LISTEN ch;\n\
         NOTIFY ch, 'hello';\n\
         SELECT 'done';\n",
        &[("PGSSLMODE", "prefer")],
    );
    assert!(ok, "{err}");
    assert!(out.contains("a,b,c,d"), "{out}");
    assert!(out.contains("a\nb\nc\nd\n"), "{out}");
    assert!(
        out.contains("Asynchronous notification \"ch\" with payload \"hello\""),
        "{out}"
    );
    assert!(out.trim_end().ends_with("done"), "{out}");
    assert_eq!(s.pg.psql("SELECT token FROM fencing.tokens"), "7");
}

fn pgbench(addr: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut cmd = Postgres::client_tool("pgbench");
    cmd.args(["-h", host, "-p", port, "-U", "postgres"])
        .args(args)
        .arg("postgres")
        .envs(env.iter().copied());
    let (status, stdout, stderr) = e2e::output(cmd);
    assert!(
        status.success(),
        "pgbench {args:?} failed: {stdout}\n{stderr}"
    );
    stdout
}

#[test]
fn pgbench_initialises_and_runs_in_every_query_mode() {
    let s = setup(1000);
    // -i loads with COPY and builds indexes; then short runs of the built-in script.
    pgbench(s.addr(), &["-i", "-s", "1", "-q"], &[]);
    s.pg.psql("CREATE TABLE hits (id int PRIMARY KEY, n int); INSERT INTO hits SELECT g, 0 FROM generate_series(1, 10) g");
    for mode in ["simple", "extended", "prepared"] {
        let out = pgbench(s.addr(), &["-c", "2", "-t", "30", "-M", mode], &[]);
        assert!(
            out.contains("number of transactions actually processed: 60/60"),
            "{mode}: {out}"
        );
        // And with a token on every connection (start-up options), updating one row a time.
        let script = s.dir.path().join("update.sql");
        std::fs::write(
            &script,
            "\\set id random(1, 10)\nUPDATE hits SET n = n + 1 WHERE id = :id;\n",
        )
        .unwrap();
        let out = pgbench(
            s.addr(),
            &[
                "-c",
                "2",
                "-t",
                "30",
                "-M",
                mode,
                "-f",
                script.to_str().unwrap(),
            ],
            &[("PGOPTIONS", "-c fencing.resource=bench -c fencing.token=5")],
        );
        assert!(
            out.contains("number of transactions actually processed: 60/60"),
            "{mode} with a token: {out}"
        );
    }
    assert_eq!(s.pg.psql("SELECT sum(n) FROM hits"), "180");
    assert_eq!(mark(&s.pg, "bench"), "5");
}

#[test]
fn extended_protocol_with_pipelining_and_copy_both_ways() {
    let s = setup(1000);
    runtime().block_on(async {
        let (c, _conn) = connect_with(
            s.addr(),
            "options='-c fencing.resource=items -c fencing.token=3'",
        )
        .await;
        c.batch_execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
            .await
            .unwrap();
        let insert = c
            .prepare("INSERT INTO items VALUES ($1, $2)")
            .await
            .unwrap();
        // Pipelined: all 50 Bind/Execute/Sync batches are sent before the first answer is read.
        let futures = (0..50).map(|i| {
            let (c, insert) = (&c, &insert);
            async move { c.execute(insert, &[&i, &format!("n{i}")]).await }
        });
        let results = futures_util::future::join_all(futures).await;
        assert!(results.iter().all(|r| matches!(r, Ok(1))), "{results:?}");

        // COPY in, then out.
        let sink = c.copy_in("COPY items (id, name) FROM STDIN").await.unwrap();
        futures_util::pin_mut!(sink);
        let mut data = String::new();
        for i in 50..2050 {
            data.push_str(&format!("{i}\tcopied-{i}\n"));
        }
        sink.send(bytes::Bytes::from(data)).await.unwrap();
        assert_eq!(sink.finish().await.unwrap(), 2000);
        let stream = c
            .copy_out("COPY (SELECT id FROM items ORDER BY id) TO STDOUT")
            .await
            .unwrap();
        let chunks: Vec<_> = stream.collect().await;
        let text: String = chunks
            .into_iter()
            .map(|c| String::from_utf8(c.unwrap().to_vec()).unwrap())
            .collect();
        assert_eq!(text.lines().count(), 2050);
        let n: i64 = c
            .query_one("SELECT count(*) FROM items", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 2050);
    });
    assert_eq!(mark(&s.pg, "items"), "3");
}

#[test]
fn a_cancel_request_reaches_the_right_session() {
    let s = setup(1000);
    runtime().block_on(async {
        let c = connect(s.addr()).await;
        let other = connect(s.addr()).await;
        let token = c.cancel_token();
        let sleeping = tokio::spawn(async move {
            c.batch_execute("SELECT pg_sleep(600) /* cancel me */").await
        });
        // Wait until PostgreSQL runs it (each look is a round trip).
        wait_count(
            &other,
            "the query to run",
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%cancel me%' AND pid <> pg_backend_pid()",
            1,
        )
        .await;
        token.cancel_query(NoTls).await.unwrap();
        let e = sleeping.await.unwrap().unwrap_err();
        assert_eq!(code(&e), "57014", "{e}");
        // The other session was not touched.
        other.batch_execute("SELECT 1").await.unwrap();
    });
}

#[test]
fn md5_and_scram_passwords_pass_through() {
    let pg = Postgres::start_with_hba(&[
        "host all fp_md5 127.0.0.1/32 md5",
        "host all fp_scram 127.0.0.1/32 scram-sha-256",
    ]);
    pg.psql("SET password_encryption = 'md5'; CREATE ROLE fp_md5 LOGIN PASSWORD 'pw-md5'");
    pg.psql(
        "SET password_encryption = 'scram-sha-256'; CREATE ROLE fp_scram LOGIN PASSWORD 'pw-scram'",
    );
    let s = setup_with(pg, 1000, "");
    runtime().block_on(async {
        for (user, password) in [("fp_md5", "pw-md5"), ("fp_scram", "pw-scram")] {
            let info = conninfo(s.addr(), &format!("password={password}"))
                .replace("user=postgres", &format!("user={user}"));
            let (c, conn) = tokio_postgres::connect(&info, NoTls)
                .await
                .unwrap_or_else(|e| panic!("{user}: {e}"));
            tokio::spawn(conn);
            let who: String = c
                .query_one("SELECT current_user::text", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(who, user);
            let bad = conninfo(s.addr(), "password=wrong")
                .replace("user=postgres", &format!("user={user}"));
            let e = tokio_postgres::connect(&bad, NoTls)
                .await
                .err()
                .expect("wrong password refused");
            assert_eq!(code(&e), "28P01", "{user}: {e}");
        }
    });
}
