//! TLS in the PostgreSQL mode, both hops, with psql (libpq) as the client: `verify-full`
//! through the proxy to a PostgreSQL that takes TLS only, a cancel request, every failure
//! with its clear answer on the side that sees it, SCRAM channel binding, and certificates
//! read again on SIGHUP. Certificates are made at test time (rcgen).

use std::path::Path;
use std::process::Command;

use e2e::certs::{Ca, Pair};
use e2e::pg::{PgTls, Postgres};
use e2e::raw::{Raw, Tls};
use e2e::{FenceProxy, output};

/// Refuses every connection to PostgreSQL that is not in TLS.
const TLS_ONLY: &str = "hostnossl all all 0.0.0.0/0 reject";

/// A PostgreSQL that takes TLS only, its CA, and a directory for the rest.
struct World {
    dir: tempfile::TempDir,
    pg_ca: Ca,
    pg: Postgres,
}

fn world(rules: &[&str], verify_clients: bool) -> World {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pg_ca = Ca::new(d, "pg");
    let server = pg_ca.issue(d, "pg-server", &["127.0.0.1", "localhost"], false);
    let mut all = vec![TLS_ONLY];
    all.extend_from_slice(rules);
    let pg = Postgres::start_tls(
        &PgTls {
            server: &server,
            client_ca: verify_clients.then_some(pg_ca.pem.as_path()),
        },
        &all,
    );
    World { dir, pg_ca, pg }
}

impl World {
    fn d(&self) -> &Path {
        self.dir.path()
    }

    /// A proxy in `sub` with `listener` (TOML keys of the [[pg]] section besides listen and
    /// upstream).
    fn proxy(&self, sub: &str, listener: &str) -> FenceProxy {
        let dir = self.d().join(sub);
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\n{listener}\n",
            self.pg.port
        );
        FenceProxy::start_with(&dir, &config, 0, 1)
    }

    /// TOML keys for TLS towards PostgreSQL, verified.
    fn upstream_verified(&self) -> String {
        format!(
            "upstream_tls = \"verify-full\"\nupstream_ca = \"{}\"\n",
            self.pg_ca.pem.display()
        )
    }
}

/// TOML keys for TLS towards clients with `pair`.
fn listener_tls(pair: &Pair) -> String {
    format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        pair.cert.display(),
        pair.key.display()
    )
}

/// psql through `addr` with `conninfo` added; `sql` in one -c. Status, stdout, stderr.
fn psql(addr: &str, conninfo: &str, sql: &str) -> (bool, String, String) {
    let mut cmd = psql_command(addr, conninfo);
    cmd.args(["-c", sql]);
    let (status, out, err) = output(cmd);
    (status.success(), out.trim().to_string(), err)
}

fn psql_command(addr: &str, conninfo: &str) -> Command {
    let port = addr.rsplit_once(':').unwrap().1;
    let mut cmd = Postgres::client_tool("psql");
    cmd.arg(format!(
        "host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=10 {conninfo}"
    ))
    .args(["-X", "-tA", "-v", "ON_ERROR_STOP=1"])
    .env_remove("PGSSLMODE")
    .env_remove("PGCHANNELBINDING");
    cmd
}

/// `sslmode=verify-full` against `ca`.
fn verify_full(ca: &Path) -> String {
    format!("sslmode=verify-full sslrootcert={}", ca.display())
}

fn fails_with(got: (bool, String, String), want: &str, what: &str) {
    assert!(!got.0, "{what}: psql succeeded: {}", got.1);
    assert!(got.2.contains(want), "{what}: wanted {want:?} in {}", got.2);
}

#[test]
fn psql_verify_full_through_the_proxy_to_a_postgresql_that_takes_tls_only() {
    let w = world(&[], false);
    let d = w.d();
    // PostgreSQL takes no plaintext: the proxy's way to it must be TLS for this to work.
    let direct = format!("127.0.0.1:{}", w.pg.port);
    fails_with(
        psql(&direct, "sslmode=disable", "SELECT 1"),
        "no encryption",
        "plaintext straight to PostgreSQL",
    );
    let proxy_ca = Ca::new(d, "proxy");
    let pair = proxy_ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    // The check is installed over TLS as well, verified (sqlx reads sslmode from the URL).
    let schema_url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        w.pg.port,
        w.pg_ca.pem.display()
    );
    // The proxy reaches PostgreSQL through a tap that notes how each connection begins.
    let tap = e2e::tap::Tap::start(&format!("127.0.0.1:{}", w.pg.port));
    let proxy_dir = d.join("p");
    std::fs::create_dir_all(&proxy_dir).unwrap();
    let proxy = FenceProxy::start_with(
        &proxy_dir,
        &format!(
            "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n{}{}schema_urls = [\"{schema_url}\"]\n",
            tap.addr,
            listener_tls(&pair),
            w.upstream_verified()
        ),
        0,
        1,
    );
    let addr = &proxy.pg[0];
    let tls = verify_full(&proxy_ca.pem);
    w.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10)",
    );
    let (ok, out, err) = psql(
        addr,
        &tls,
        "SET fencing.resource = 'inv:a'; SET fencing.token = '5'; \
         UPDATE stock SET n = n - 1 WHERE sku = 'a'; \
         SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    );
    assert!(ok, "a fenced write over TLS on both hops: {err}");
    assert_eq!(
        out.lines().last(),
        Some("t"),
        "PostgreSQL sees a TLS session: {out}"
    );
    fails_with(
        psql(
            addr,
            &tls,
            "SET fencing.resource = 'inv:a'; SET fencing.token = '4'; \
             UPDATE stock SET n = n - 1 WHERE sku = 'a'",
        ),
        "is stale",
        "the fence works the same in TLS",
    );
    // Declared in the start-up packet's options instead, after an SSLRequest and with direct
    // TLS: refused the same way.
    for direct in [false, true] {
        let tls = e2e::raw::Tls::with_alpn(&proxy_ca.pem, &[b"postgresql"], direct);
        let options = [("options", "-c fencing.resource=inv:a -c fencing.token=4")];
        let mut c = Raw::connect_tls_with(addr, &tls, &options).expect("a TLS session");
        let a = c.simple("UPDATE stock SET n = n - 1 WHERE sku = 'a'");
        assert_eq!(a.code(), "FN001", "direct = {direct}: {a:?}");
    }
    assert_eq!(w.pg.psql("SELECT n FROM stock"), "9");

    // A cancel request (libpq 15 sends it in plaintext, on a connection of its own) reaches
    // PostgreSQL over TLS.
    let mut sleeper = psql_command(addr, &tls);
    sleeper.args(["-c", "SELECT pg_sleep(600)"]);
    let mut sleeper = e2e::Spawned::spawn(sleeper);
    w.pg.wait_until(
        "the sleeping query",
        "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.query = 'SELECT pg_sleep(600)' AND s.ssl",
        "1",
    );
    sleeper.signal(libc::SIGINT);
    let status = sleeper.wait();
    assert!(!status.success());
    let said = sleeper.stderr.text();
    assert!(
        said.contains("canceling statement due to user request"),
        "cancelled through the proxy: {said}"
    );
    // Every connection of the proxy to PostgreSQL (sessions and the cancel) began with an
    // SSLRequest: nothing, not even a cancel key, went in clear.
    let mut ssl_request = Vec::new();
    pg_wire::msg::ssl_request(&mut ssl_request);
    let firsts = tap.firsts();
    assert!(firsts.len() >= 4, "three sessions and a cancel: {firsts:?}");
    assert!(firsts.iter().all(|f| *f == ssl_request), "{firsts:?}");
}

#[test]
fn client_side_failures_each_get_a_clear_answer() {
    let w = world(&[], false);
    let d = w.d();
    let proxy_ca = Ca::new(d, "proxy");
    let other_ca = Ca::new(d, "other");
    let pair = proxy_ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    let mut proxy = w.proxy(
        "p",
        &format!("{}{}", listener_tls(&pair), w.upstream_verified()),
    );
    let addr = proxy.pg[0].clone();
    let good = verify_full(&proxy_ca.pem);

    fails_with(
        psql(&addr, &verify_full(&other_ca.pem), "SELECT 1"),
        "certificate verify failed",
        "a CA that did not sign the proxy's certificate",
    );
    proxy
        .process
        .wait_handshake_failure("refused this server's certificate");
    fails_with(
        psql(&addr, &format!("{good} host=localhost"), "SELECT 1"),
        "does not match host name",
        "a name the certificate does not carry",
    );
    fails_with(
        psql(&addr, "sslmode=disable", "SELECT 1"),
        "accepts TLS sessions only",
        "plaintext where TLS is required",
    );

    // Bytes after the SSLRequest, sent before the handshake: anyone on the path could have
    // put them there.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let mut bytes = Vec::new();
    pg_wire::msg::ssl_request(&mut bytes);
    pg_wire::msg::startup(&mut bytes, &[(b"user", b"postgres")]);
    std::io::Write::write_all(&mut s, &bytes).unwrap();
    let got = crate::read_until(&mut s, b'E');
    let (_, code, message) = crate::error_of(&got);
    assert_eq!(
        (code.as_str(), message.as_str()),
        (
            "08P01",
            "fence-proxy: received unencrypted data after SSLRequest"
        )
    );
    // Plaintext where the handshake should be.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let mut bytes = Vec::new();
    pg_wire::msg::ssl_request(&mut bytes);
    std::io::Write::write_all(&mut s, &bytes).unwrap();
    let mut answer = [0u8; 1];
    std::io::Read::read_exact(&mut s, &mut answer).unwrap();
    assert_eq!(&answer, b"S");
    let mut bytes = Vec::new();
    pg_wire::msg::startup(&mut bytes, &[(b"user", b"postgres")]);
    std::io::Write::write_all(&mut s, &bytes).unwrap();
    proxy.process.wait_handshake_failure("did not speak TLS");
    let mut said = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut said);
    assert_eq!(
        said.first(),
        Some(&0x15),
        "a TLS alert, then the end: {said:?}"
    );

    // A direct TLS handshake (libpq 17's sslnegotiation=direct) needs ALPN "postgresql".
    let direct =
        |alpn: &[&[u8]]| Raw::connect_tls(&addr, &Tls::with_alpn(&proxy_ca.pem, alpn, true));
    let mut raw = direct(&[b"postgresql"]).expect("direct TLS with ALPN postgresql");
    assert_eq!(
        raw.simple("SELECT 1").rows,
        vec![vec![Some("1".to_string())]]
    );
    assert!(direct(&[]).is_err(), "direct TLS without ALPN is closed");
    proxy.process.wait_events(
        "a direct TLS handshake without ALPN \"postgresql\"; connection closed",
        1,
        |_| true,
    );
    // A second encryption request inside TLS.
    let tls = Tls::to_loopback(&proxy_ca.pem);
    let mut raw = Raw::connect_tls(&addr, &tls).expect("TLS after an SSLRequest");
    assert_eq!(
        raw.simple("SELECT 2").rows,
        vec![vec![Some("2".to_string())]]
    );

    // A cancel request inside TLS (libpq 17 sends it so) ends with TLS's close_notify: a
    // client that reads an unexpected end reports its cancel as failed.
    let mut cancel = Vec::new();
    pg_wire::msg::cancel_request(&mut cancel, 12345, &[0; 4]);
    Raw::tls_exchange(&addr, &tls, &cancel).expect("a cancel request in TLS ends cleanly");

    // Mutual TLS: a listener that asks clients for a certificate of its CA.
    let client_ca = Ca::new(d, "clients");
    let alice = client_ca.issue(d, "alice", &[], false);
    let mallory = other_ca.issue(d, "mallory", &[], false);
    let mtls = w.proxy(
        "m",
        &format!(
            "{}tls_client_ca = \"{}\"\n{}",
            listener_tls(&pair),
            client_ca.pem.display(),
            w.upstream_verified()
        ),
    );
    let maddr = &mtls.pg[0];
    let with_cert = |p: &Pair| {
        format!(
            "{good} sslcert={} sslkey={}",
            p.cert.display(),
            p.key.display()
        )
    };
    let (ok, out, err) = psql(maddr, &with_cert(&alice), "SELECT 'in'");
    assert!(ok && out == "in", "a client certificate of the CA: {err}");
    let no_cert = psql(maddr, &good, "SELECT 1");
    assert!(!no_cert.0, "no client certificate: {}", no_cert.1);
    mtls.process
        .wait_handshake_failure("presented no certificate");
    assert!(
        !psql(maddr, &with_cert(&mallory), "SELECT 1").0,
        "another CA's certificate"
    );
    mtls.process
        .wait_handshake_failure("certificate was refused");
    // Nothing of this took either process down.
    assert!(proxy.process.running() && w.pg.psql("SELECT 1") == "1");
    let (ok, _, err) = psql(&addr, &good, "SELECT 1");
    assert!(ok, "the proxy still serves: {err}");
}

#[test]
fn upstream_side_failures_each_get_a_clear_answer_and_a_client_certificate_is_reloaded() {
    // certuser must show a certificate of the PostgreSQL CA whose name is its own.
    let w = world(
        &["hostssl all certuser 127.0.0.1/32 trust clientcert=verify-full"],
        true,
    );
    let d = w.d();
    w.pg.psql("CREATE ROLE certuser LOGIN");
    let as_certuser = "user=certuser";

    // A CA that did not sign PostgreSQL's certificate.
    let stranger = Ca::new(d, "stranger");
    let wrong = w.proxy(
        "wrong-ca",
        &format!(
            "upstream_tls = \"verify-full\"\nupstream_ca = \"{}\"\n",
            stranger.pem.display()
        ),
    );
    fails_with(
        psql(&wrong.pg[0], "sslmode=disable", "SELECT 1"),
        "the server's certificate was refused",
        "PostgreSQL's certificate against the wrong CA",
    );
    // Another name than the one in PostgreSQL's certificate.
    let misnamed = w.proxy(
        "misnamed",
        &format!(
            "{}upstream_server_name = \"db.example\"\n",
            w.upstream_verified()
        ),
    );
    fails_with(
        psql(&misnamed.pg[0], "sslmode=disable", "SELECT 1"),
        "NotValidForName",
        "a name PostgreSQL's certificate does not carry",
    );

    // A client certificate PostgreSQL does not trust, then (after SIGHUP) one it does.
    let untrusted = stranger.issue(d, "certuser", &[], false);
    let files = Pair {
        cert: d.join("upstream-client.pem"),
        key: d.join("upstream-client-key.pem"),
    };
    untrusted.copy_over(&files);
    let mut with_cert = w.proxy(
        "client-cert",
        &format!(
            "{}upstream_cert = \"{}\"\nupstream_key = \"{}\"\n",
            w.upstream_verified(),
            files.cert.display(),
            files.key.display()
        ),
    );
    let addr = with_cert.pg[0].clone();
    fails_with(
        psql(&addr, &format!("sslmode=disable {as_certuser}"), "SELECT 1"),
        "the server refused the handshake",
        "a client certificate of a CA PostgreSQL does not trust",
    );
    let trusted = w.pg_ca.issue(d, "certuser", &[], false);
    trusted.copy_over(&files);
    with_cert.process.signal(libc::SIGHUP);
    with_cert.process.wait_events(
        "reloaded the TLS certificates; new connections use them",
        1,
        |e| {
            e["what"]
                .as_str()
                .is_some_and(|w| w.contains("upstream-client.pem"))
        },
    );
    let (ok, out, err) = psql(
        &addr,
        &format!("sslmode=disable {as_certuser}"),
        "SELECT current_user",
    );
    assert!(
        ok && out == "certuser",
        "the reloaded client certificate: {err}"
    );

    // TLS asked of a PostgreSQL that has none.
    let plain = Postgres::start();
    let dir = d.join("plain");
    std::fs::create_dir_all(&dir).unwrap();
    let to_plain = FenceProxy::start_with(
        &dir,
        &format!(
            "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nupstream_tls = \"require\"\n",
            plain.port
        ),
        0,
        1,
    );
    fails_with(
        psql(&to_plain.pg[0], "sslmode=disable", "SELECT 1"),
        "does not accept TLS",
        "a PostgreSQL with ssl = off",
    );
    // `require` encrypts without checking: it reaches the TLS PostgreSQL whatever its CA.
    let encrypt_only = w.proxy("require", "upstream_tls = \"require\"\n");
    let (ok, out, err) = psql(
        &encrypt_only.pg[0],
        "sslmode=disable",
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    );
    assert!(ok && out == "t", "upstream_tls = require: {err}");
}

#[test]
fn scram_channel_binding_is_refused_clearly_unless_the_proxy_presents_postgresqls_certificate() {
    let w = world(&["hostssl all app 127.0.0.1/32 scram-sha-256"], false);
    let d = w.d();
    w.pg.psql("SET password_encryption = 'scram-sha-256'; CREATE ROLE app LOGIN PASSWORD 'pw'");
    let proxy_ca = Ca::new(d, "proxy");
    let own = proxy_ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    let proxy = w.proxy(
        "own",
        &format!("{}{}", listener_tls(&own), w.upstream_verified()),
    );
    let run = |addr: &str, ca: &Path, binding: &str| {
        let mut cmd = psql_command(addr, &format!("{} user=app {binding}", verify_full(ca)));
        cmd.env("PGPASSWORD", "pw")
            .args(["-c", "SELECT current_user"]);
        let (status, out, err) = output(cmd);
        (status.success(), out.trim().to_string(), err)
    };
    // libpq's default, channel_binding=prefer, chooses SCRAM-SHA-256-PLUS in TLS.
    fails_with(
        run(&proxy.pg[0], &proxy_ca.pem, ""),
        "SCRAM channel binding cannot pass this proxy",
        "channel binding over a proxy with its own certificate",
    );
    let (ok, out, err) = run(&proxy.pg[0], &proxy_ca.pem, "channel_binding=disable");
    assert!(ok && out == "app", "SCRAM without channel binding: {err}");
    // With PostgreSQL's own certificate and key, the binding holds end to end.
    let server = Pair {
        cert: d.join("pg-server.pem"),
        key: d.join("pg-server-key.pem"),
    };
    let same = w.proxy(
        "same",
        &format!("{}{}", listener_tls(&server), w.upstream_verified()),
    );
    let (ok, out, err) = run(&same.pg[0], &w.pg_ca.pem, "channel_binding=require");
    assert!(
        ok && out == "app",
        "channel binding through a proxy with PostgreSQL's certificate: {err}"
    );
}

#[test]
fn sighup_reloads_the_certificate_for_new_sessions_and_keeps_open_ones() {
    let w = world(&[], false);
    let d = w.d();
    let (one, two) = (Ca::new(d, "one"), Ca::new(d, "two"));
    let first = one.issue(d, "proxy-server", &["127.0.0.1"], false);
    let mut proxy = w.proxy(
        "p",
        &format!("{}{}", listener_tls(&first), w.upstream_verified()),
    );
    let addr = proxy.pg[0].clone();
    let tls = |ca: &Ca| Tls::to_loopback(&ca.pem);
    let mut open = Raw::connect_tls(&addr, &tls(&one)).expect("a session before the reload");
    let reload = |proxy: &mut FenceProxy, n: usize| {
        proxy.process.signal(libc::SIGHUP);
        proxy.process.wait_events(
            "reloaded the TLS certificates; new connections use them",
            n,
            |e| {
                e["what"]
                    .as_str()
                    .is_some_and(|w| w.contains("proxy-server.pem"))
            },
        );
    };
    // An expired certificate swapped in: new sessions are told so by their client.
    let expired = one.issue(d, "expired", &["127.0.0.1"], true);
    expired.copy_over(&first);
    reload(&mut proxy, 1);
    fails_with(
        psql(&addr, &verify_full(&one.pem), "SELECT 1"),
        "certificate verify failed",
        "an expired certificate",
    );
    proxy.process.wait_handshake_failure("CertificateExpired");
    // Then one of another CA.
    let second = two.issue(d, "second", &["127.0.0.1"], false);
    second.copy_over(&first);
    reload(&mut proxy, 2);
    let (ok, _, err) = psql(&addr, &verify_full(&two.pem), "SELECT 1");
    assert!(ok, "new sessions get the new certificate: {err}");
    assert!(
        Raw::connect_tls(&addr, &tls(&one)).is_err(),
        "the old CA no longer verifies"
    );
    assert_eq!(
        open.simple("SELECT 'still here'").rows,
        vec![vec![Some("still here".to_string())]],
        "the session opened before the reloads goes on"
    );
    // A broken key: the reload fails, says why, and the certificate in use stays.
    std::fs::write(&first.key, "garbage").unwrap();
    proxy.process.signal(libc::SIGHUP);
    let e = proxy.process.wait_events(
        "reloading the TLS certificates failed; keeping the ones in use",
        1,
        |_| true,
    );
    assert!(e["error"].as_str().unwrap().contains("private key"), "{e}");
    assert!(psql(&addr, &verify_full(&two.pem), "SELECT 1").0);
}

/// The zombie idle in a transaction over TLS on both hops: PostgreSQL ends its session while
/// the proxy is stopped and its COMMIT waits; the proxy reads PostgreSQL's end first (the
/// peek under TLS) and tells it FN003, as in plaintext (`fencing::a_commit_that_meets_...`).
#[test]
fn a_zombie_idle_in_tls_is_told_fn003_as_in_plaintext() {
    let w = world(&[], false);
    let d = w.d();
    let proxy_ca = Ca::new(d, "proxy");
    let pair = proxy_ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    let schema_url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        w.pg.port,
        w.pg_ca.pem.display()
    );
    let mut proxy = w.proxy(
        "p",
        &format!(
            "{}{}schema_urls = [\"{schema_url}\"]\nfence_wait_ms = 300\n",
            listener_tls(&pair),
            w.upstream_verified()
        ),
    );
    w.pg.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init')",
    );
    let tls = Tls::to_loopback(&proxy_ca.pem);
    let mut a = Raw::connect_tls(&proxy.pg[0], &tls).expect("a TLS session");
    let set = a.simple("SET fencing.resource = 'acct:1'; SET fencing.token = '41'");
    assert!(set.errors.is_empty(), "{set:?}");
    assert!(a.simple("BEGIN").errors.is_empty());
    let wrote = a.simple("UPDATE acct SET owner = 'A' WHERE id = 1");
    assert!(wrote.errors.is_empty(), "{wrote:?}");
    proxy.process.signal(libc::SIGSTOP);
    w.pg.psql(
        "SET fencing.resource = 'acct:1'; SET fencing.token = '42'; BEGIN; \
         SELECT fencing.check_token(300); UPDATE acct SET owner = 'B' WHERE id = 1; COMMIT",
    );
    assert_eq!(
        w.pg.psql("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'"),
        "0"
    );
    a.send_simple("COMMIT");
    proxy.process.signal(libc::SIGCONT);
    let answer = a.read_answer();
    assert_eq!(answer.code(), "FN003", "{answer:?}");
    assert_eq!(w.pg.psql("SELECT owner FROM acct"), "B");
}

#[test]
fn plaintext_off_loopback_in_the_pg_mode_needs_insecure_and_tls_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "proxy");
    let pair = ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    let refused = |listener: &str, want: &str| {
        let text = FenceProxy::refused(d, &format!("[[pg]]\n{listener}\n"));
        assert!(text.contains(want), "{listener}: wanted {want:?} in {text}");
    };
    let tls = listener_tls(&pair);
    refused(
        "listen = \"0.0.0.0:0\"\nupstream = \"127.0.0.1:5432\"",
        "is not on loopback and takes plaintext sessions",
    );
    refused(
        &format!(
            "listen = \"0.0.0.0:0\"\nupstream = \"127.0.0.1:5432\"\n{tls}tls_required = false"
        ),
        "is not on loopback and takes plaintext sessions",
    );
    for upstream in [
        "10.1.2.3:5432",
        "db.internal:5432",
        "[::ffff:10.1.2.3]:5432",
        "localhost.evil:5432",
    ] {
        refused(
            &format!("listen = \"127.0.0.1:0\"\nupstream = \"{upstream}\""),
            "not on loopback, in plaintext",
        );
    }
    refused(
        "listen = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:5432\"\nupstream_tls = \"verify-full\"",
        "needs upstream_ca",
    );
    refused(
        "listen = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:5432\"\nupstream_tls = \"maybe\"",
        "upstream_tls",
    );
    // TLS towards clients and towards PostgreSQL: nothing more is needed off loopback.
    let p = FenceProxy::start_with(
        d,
        &format!(
            "[[pg]]\nlisten = \"0.0.0.0:0\"\nupstream = \"10.1.2.3:5432\"\n{tls}upstream_tls = \"require\"\n"
        ),
        0,
        1,
    );
    assert!(p.pg[0].starts_with("0.0.0.0:"), "{:?}", p.pg);
}
