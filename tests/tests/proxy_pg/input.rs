//! Bad input closes only the offending connection, with an ErrorResponse saying why.

use std::io::{Read, Write};
use std::net::TcpStream;

use pg_wire::msg;

use crate::{closed, code, connect, error_of, raw_session, read_until, runtime, setup_with};
use e2e::pg::Postgres;
use e2e::raw::Raw;

#[test]
fn malformed_and_oversized_messages_close_only_that_connection() {
    let s = setup_with(Postgres::start(), 1000, "message_max_bytes = 4096");
    runtime().block_on(async {
        let bystander = connect(s.addr()).await;
        bystander.batch_execute("BEGIN").await.unwrap();

        for (what, bytes, needle) in [
            (
                "length below 4",
                b"Q\0\0\0\x02".to_vec(),
                "below the minimum",
            ),
            (
                "Query without its NUL",
                b"Q\0\0\0\x08abcd".to_vec(),
                "malformed Query",
            ),
            (
                "oversized",
                b"Q\0\x10\0\0".to_vec(),
                "exceeds message_max_bytes",
            ),
            (
                "Bind without names",
                b"B\0\0\0\x05x".to_vec(),
                "malformed Bind",
            ),
        ] {
            let mut raw = raw_session(s.addr(), &[]);
            raw.write_all(&bytes).unwrap();
            let got = read_until(&mut raw, b'E');
            let (severity, code, message) = error_of(&got);
            assert_eq!(
                (severity.as_str(), code.as_str()),
                ("FATAL", "08P01"),
                "{what}"
            );
            assert!(message.contains(needle), "{what}: {message}");
            assert!(closed(&mut raw), "{what}: the connection stays open");
        }
        // GSSENCRequest and SSLRequest are answered 'N', and the session goes on in clear.
        let mut raw = TcpStream::connect(s.addr()).unwrap();
        for code in [80_877_104u32, 80_877_103] {
            let mut packet = 8u32.to_be_bytes().to_vec();
            packet.extend_from_slice(&code.to_be_bytes());
            raw.write_all(&packet).unwrap();
            let mut answer = [0u8; 1];
            raw.read_exact(&mut answer).unwrap();
            assert_eq!(&answer, b"N");
        }
        let mut start = Vec::new();
        msg::startup(
            &mut start,
            &[(b"user", b"postgres"), (b"database", b"postgres")],
        );
        raw.write_all(&start).unwrap();
        read_until(&mut raw, b'Z');
        let mut q = Vec::new();
        msg::query(&mut q, b"SELECT 1");
        raw.write_all(&q).unwrap();
        assert!(read_until(&mut raw, b'Z').iter().any(|(t, _)| *t == b'D'));

        // A start-up packet of an unknown protocol version.
        let mut raw = TcpStream::connect(s.addr()).unwrap();
        raw.write_all(&[0, 0, 0, 8, 0, 2, 0, 0]).unwrap();
        let (severity, code, _) = error_of(&read_until(&mut raw, b'E'));
        assert_eq!((severity.as_str(), code.as_str()), ("FATAL", "0A000"));

        // The other session never noticed.
        bystander.batch_execute("SELECT 1; COMMIT").await.unwrap();
    });
    // And the proxy is still up.
    assert!(
        s.proxy
            .process
            .stderr
            .text()
            .contains("closing a client connection over a bad message")
    );
}

#[test]
fn an_upstream_down_and_the_connection_limit_get_clear_errors() {
    let s = setup_with(Postgres::start(), 1000, "connections_max = 2");
    runtime().block_on(async {
        let _a = connect(s.addr()).await;
        let _b = connect(s.addr()).await;
        let e = tokio_postgres::connect(&crate::conninfo(s.addr(), ""), tokio_postgres::NoTls)
            .await
            .err()
            .expect("a third connection is refused");
        assert_eq!(code(&e), "53300", "{e}");
        // libpq asks for TLS first (sslmode=prefer, its default): the refusal comes after the
        // SSLRequest was answered, so psql shows it.
        let (ok, _, err) = crate::psql(s.addr(), "SELECT 1", &[("PGSSLMODE", "prefer")]);
        assert!(!ok);
        assert!(
            err.contains("FATAL:  fence-proxy: too many connections"),
            "{err}"
        );
    });
    // A proxy whose PostgreSQL is not there.
    let dir = tempfile::tempdir().unwrap();
    let dead = e2e::free_loopback_addr();
    let proxy = e2e::FenceProxy::start_with(
        dir.path(),
        &format!("[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{dead}\"\n"),
        0,
        1,
    );
    runtime().block_on(async {
        let e = tokio_postgres::connect(&crate::conninfo(&proxy.pg[0], ""), tokio_postgres::NoTls)
            .await
            .err()
            .expect("no upstream, no session");
        assert_eq!(code(&e), "08001", "{e}");
        let message = e.as_db_error().unwrap().message().to_string();
        assert!(message.contains(&dead), "{message}");
    });
}

/// A proxy started before its PostgreSQL (a sidecar in the same pod) keeps trying to install
/// the check, then listens once it is in.
#[test]
fn the_check_is_installed_once_postgresql_comes_up() {
    let mut pg = Postgres::start();
    pg.stop();
    let dir = tempfile::tempdir().unwrap();
    let mut process = e2e::FenceProxy::spawn(
        dir.path(),
        &format!(
            "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nschema_wait_ms = 600000\n",
            pg.port,
            pg.url()
        ),
    );
    process.wait_events(
        "PostgreSQL is not ready for the fence check; trying again",
        2,
        |_| true,
    );
    assert!(process.running(), "{}", process.stderr.text());
    pg.resume();
    let listening = process.wait_events("listening (pg)", 1, |_| true);
    let addr = listening["addr"].as_str().unwrap().to_string();
    runtime().block_on(async {
        let c = crate::holder(&addr, "sidecar", 7).await;
        c.batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
            .await
            .unwrap();
    });
    assert_eq!(crate::mark(&pg, "sidecar"), "7");
}

/// What trying again cannot fix fails the start at once, saying why once; and the wait is
/// bounded.
#[test]
fn a_failed_install_stops_the_start_with_one_clear_message() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let start = |url: &str, wait_ms: u64| {
        let mut p = e2e::FenceProxy::spawn(
            dir.path(),
            &format!(
                "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{url}\"]\nschema_wait_ms = {wait_ms}\nconnect_timeout_ms = 300\n",
                pg.port
            ),
        );
        // A proxy that tried again for the whole wait would outlast the harness's patience.
        let status = p.wait();
        assert!(!status.success());
        let text = p.stderr.text();
        let last = text.lines().last().unwrap_or_default().to_string();
        (text, last)
    };
    let missing = format!("postgres://postgres@127.0.0.1:{}/nosuchdb", pg.port);
    let (text, last) = start(&missing, 600_000);
    assert!(!text.contains("trying again"), "{text}");
    assert_eq!(
        last.matches(r#"database "nosuchdb" does not exist"#)
            .count(),
        1,
        "{last}"
    );
    let dead = format!("postgres://postgres@{}/postgres", e2e::free_loopback_addr());
    let (text, last) = start(&dead, 300);
    assert!(last.contains("was not ready within"), "{text}");
    assert!(last.contains("schema_wait_ms"), "{last}");
    // Something that accepts connections and never answers: each attempt is bounded by
    // connect_timeout_ms (one attempt here), not by the system's TCP timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!(
        "postgres://postgres@{}/postgres",
        silent.local_addr().unwrap()
    );
    let (text, last) = start(&silent_url, 0);
    assert!(last.contains("no answer from"), "{text}");
}

/// Connections that never finish their start-up, from one address, take at most
/// `startups_per_peer_max` of the listener's `connections_max`: a client elsewhere still gets
/// in. (The flood comes from 127.0.0.2, psql from 127.0.0.1.)
#[test]
fn silent_connections_from_one_address_do_not_keep_others_out() {
    let s = setup_with(
        Postgres::start(),
        1000,
        "connections_max = 20\nstartups_per_peer_max = 4",
    );
    let addr: std::net::SocketAddr = s.addr().parse().unwrap();
    let flood: Vec<std::net::TcpStream> = (0..30)
        .map(|_| e2e::connect_from("127.0.0.2", addr))
        .collect();
    let refused = s.proxy.process.wait_events(
        "refusing a connection: too many in start-up from this address",
        26,
        |_| true,
    );
    assert_eq!(refused["max"], 4, "{refused}");
    let mut c = Raw::connect(s.addr(), &[]);
    assert_eq!(c.simple("SELECT 1").rows, vec![vec![Some("1".to_string())]]);
    drop(flood);
}
