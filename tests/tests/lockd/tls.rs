//! lockd over TLS with lockctl and the SDK: mutual TLS, each certificate problem named on both
//! sides, plaintext on the TLS port, the refusal to serve plaintext off loopback, and
//! certificates reloaded on SIGHUP without dropping connections. Certificates are made at test
//! time (`e2e::certs`).

use std::path::Path;

use e2e::certs::{Ca, Pair};
use e2e::{Lockd, event, output};

/// lockd with `server` and, if given, mutual TLS with `clients`.
fn tls_lockd(dir: &Path, server: &Pair, clients: Option<&Ca>) -> Lockd {
    let mut args = vec![
        "--tls-cert".to_string(),
        server.cert.display().to_string(),
        "--tls-key".to_string(),
        server.key.display().to_string(),
    ];
    if let Some(ca) = clients {
        args.push("--tls-client-ca".into());
        args.push(ca.pem.display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Lockd::start(&dir.join("data"), &args)
}

/// `lockctl --json describe x` against `endpoint` with these TLS flags.
fn describe(endpoint: &str, flags: &[&Path]) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new(e2e::bin("lockctl"));
    cmd.env_remove("LOCKD_ENDPOINT")
        .args(["--endpoint", endpoint]);
    for (flag, file) in ["--ca", "--cert", "--key"].iter().zip(flags) {
        cmd.arg(flag).arg(file);
    }
    cmd.args(["--json", "describe", "x"]);
    let (status, out, err) = output(cmd);
    (status.code(), format!("{out}{err}"))
}

/// Waits for lockd's log line of a failed handshake, the `n`-th, and returns its reason.
fn handshake_failure(lockd: &Lockd, n: usize) -> String {
    let e = lockd.wait_events("TLS handshake failed; connection closed", n, |_| true);
    e["reason"].as_str().unwrap_or_default().to_string()
}

#[test]
fn lockctl_over_mutual_tls_and_each_certificate_problem_named_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, clients, stranger) = (
        Ca::new(d, "server"),
        Ca::new(d, "clients"),
        Ca::new(d, "stranger"),
    );
    let server = ca.issue(d, "lockd", &["127.0.0.1"], false);
    let client = clients.issue(d, "app", &["app"], false);
    let foreign = stranger.issue(d, "intruder", &["intruder"], false);
    let lockd = tls_lockd(d, &server, Some(&clients));
    let url = lockd.endpoint.clone();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ok = [
        ca.pem.as_path(),
        client.cert.as_path(),
        client.key.as_path(),
    ];
    let (code, out) = describe(&url, &ok);
    assert_eq!(code, Some(0), "{out}");

    // No client certificate.
    let (code, out) = describe(&url, &[&ca.pem]);
    assert_eq!(code, Some(1), "{out}");
    // lockd's alert says so, when it arrives before the connection is seen closed; either way
    // the message says what to do.
    assert!(
        out.contains("requires a client certificate") || out.contains("give --cert and --key"),
        "{out}"
    );
    assert!(handshake_failure(&lockd, 1).contains("presented no certificate"));
    // A client certificate of a CA lockd does not trust.
    let (code, out) = describe(&url, &[&ca.pem, &foreign.cert, &foreign.key]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("TLS"), "{out}");
    assert!(handshake_failure(&lockd, 2).contains("refused"));
    // lockctl does not trust lockd's CA.
    let (code, out) = describe(&url, &[&stranger.pem, &client.cert, &client.key]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("UnknownIssuer"), "{out}");
    assert!(handshake_failure(&lockd, 3).contains("client refused this server's certificate"));
    // lockd's certificate is for 127.0.0.1, not for localhost.
    let by_name = url.replace("127.0.0.1", "localhost");
    let (code, out) = describe(&by_name, &ok);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("not valid for name \"localhost\""), "{out}");
    assert!(handshake_failure(&lockd, 4).contains("client refused this server's certificate"));
    // Plaintext on the TLS port: the connection is closed, with one line in lockd's log.
    let plain = url.replace("https://", "http://");
    let (code, out) = describe(&plain, &[]);
    assert_ne!(code, Some(0), "{out}");
    assert!(handshake_failure(&lockd, 5).contains("did not speak TLS"));
    // An https:// endpoint without a CA, and TLS files for an http:// one: usage errors.
    let (code, out) = describe(&url, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("--ca"), "{out}");
    let (code, out) = describe(&plain, &ok);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("use https://"), "{out}");
    // None of it took lockd down.
    assert_eq!(describe(&url, &ok).0, Some(0));
}

#[test]
fn an_expired_certificate_is_named_by_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "server");
    let old = ca.issue(d, "lockd", &["127.0.0.1"], true);
    let lockd = tls_lockd(d, &old, None);
    // lockd warns of it at start.
    let warned = lockd.wait_event(
        "the certificate has expired: clients will refuse it; renew it and send SIGHUP",
        |_| true,
    );
    assert_eq!(warned["path"], old.cert.display().to_string());
    assert!(
        warned["date"].as_str().unwrap().contains("2000"),
        "{warned}"
    );
    let (code, out) = describe(&lockd.endpoint, &[&ca.pem]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("certificate expired"), "{out}");
    assert!(handshake_failure(&lockd, 1).contains("certificate"));
}

#[test]
fn a_client_ca_file_holding_no_ca_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "server");
    let server = ca.issue(d, "lockd", &["127.0.0.1"], false);
    let leaf = ca.issue(d, "someone", &["someone"], false);
    let lockd = Lockd::start(
        &d.join("data"),
        &[
            "--tls-cert",
            server.cert.to_str().unwrap(),
            "--tls-key",
            server.key.to_str().unwrap(),
            "--tls-client-ca",
            leaf.cert.to_str().unwrap(),
        ],
    );
    let warned = lockd.wait_event(
        "the CA file holds no CA certificate (none has basicConstraints CA:TRUE): certificates signed by a CA will not verify against it; was a leaf certificate given instead of its CA?",
        |_| true,
    );
    assert_eq!(warned["path"], leaf.cert.display().to_string());
}

#[test]
fn bad_tls_files_and_plaintext_off_loopback_are_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "server");
    let pair = ca.issue(d, "lockd", &["127.0.0.1"], false);
    let other = ca.issue(d, "other", &["127.0.0.1"], false);
    let garbage = d.join("garbage.pem");
    std::fs::write(&garbage, "garbage").unwrap();
    let fifo = d.join("fifo.pem");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let s = |p: &Path| p.display().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--listen".into(), "0.0.0.0:0".into()],
            "not a loopback address",
        ),
        (
            vec!["--tls-cert".into(), s(&pair.cert)],
            "tls_cert and tls_key go together",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&d.join("missing.pem")),
                "--tls-key".into(),
                s(&pair.key),
            ],
            "cannot read the certificate",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&pair.cert),
                "--tls-key".into(),
                s(&garbage),
            ],
            "holds no PEM private key",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&pair.cert),
                "--tls-key".into(),
                s(&other.key),
            ],
            "do not go together",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&pair.cert),
                "--tls-key".into(),
                s(&pair.key),
                "--tls-client-ca".into(),
                s(&garbage),
            ],
            "CA file",
        ),
        (
            vec!["--tls-client-ca".into(), s(&ca.pem)],
            "need tls_cert and tls_key",
        ),
        (
            vec![
                "--tls-cert".into(),
                s(&fifo),
                "--tls-key".into(),
                s(&pair.key),
            ],
            "not a regular file",
        ),
    ];
    for (args, want) in cases {
        let mut cmd = std::process::Command::new(e2e::bin("lockd"));
        cmd.arg("--data-dir")
            .arg(d.join("data"))
            .args(&args)
            .env_remove("LOCKD_CONFIG");
        let (status, _, err) = output(cmd);
        assert_eq!(status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: wanted {want:?} in {err}");
    }
    // With --insecure it serves, and says so.
    let lockd = Lockd::start_on(&d.join("data"), "0.0.0.0:0", &["--insecure"]);
    lockd.wait_event("serving plaintext gRPC on an address other than loopback (insecure = true): anyone who can reach it can take any lock and read lease ids in transit", |_| true);
}

#[test]
fn sighup_reloads_the_certificates_for_new_connections_and_keeps_open_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca1, ca2) = (Ca::new(d, "one"), Ca::new(d, "two"));
    let first = ca1.issue(d, "lockd", &["127.0.0.1"], false);
    let mut lockd = tls_lockd(d, &first, None);
    let url = lockd.endpoint.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // An SDK client with its connection open across the reload.
    let sdk = rt.block_on(async {
        let files = tlsconf::ClientFiles {
            ca: Some(ca1.pem.clone()),
            ..Default::default()
        };
        let c = lockd_client::Client::connect_tls(&url, &files).unwrap();
        c.describe("x").await.unwrap();
        c
    });
    // New files, signed by another CA, in place of the old ones.
    let second = ca2.issue(d, "lockd-2", &["127.0.0.1"], false);
    second.copy_over(&first);
    lockd.process.signal(libc::SIGHUP);
    lockd.wait_event(
        "reloaded the TLS certificates; new connections use them",
        |_| true,
    );
    assert_eq!(
        describe(&url, &[&ca2.pem]).0,
        Some(0),
        "new connections: the new files"
    );
    let (code, out) = describe(&url, &[&ca1.pem]);
    assert_eq!(code, Some(1), "the old CA no longer verifies: {out}");
    rt.block_on(sdk.describe("x"))
        .expect("the connection opened before the reload still works");
    // A broken file: the reload fails, is logged, and the files in use stay.
    std::fs::write(&first.key, "garbage").unwrap();
    lockd.process.signal(libc::SIGHUP);
    let e = lockd.wait_event(
        "reloading the TLS certificates failed; keeping the ones in use",
        |_| true,
    );
    assert!(e["error"].as_str().unwrap().contains("private key"), "{e}");
    assert_eq!(describe(&url, &[&ca2.pem]).0, Some(0));
    assert!(
        lockd
            .process
            .stderr
            .text()
            .lines()
            .filter_map(event)
            .all(|e| e["level"] != "ERROR"),
        "nothing went wrong beyond the reload"
    );
}

/// Connections that never finish their handshake, from one address, take at most a few of
/// lockd's handshake slots: a client elsewhere is still served. (The flood comes from
/// 127.0.0.2, the client from 127.0.0.1.)
#[test]
fn a_flood_of_silent_connections_from_one_address_does_not_keep_others_out() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new(d, "server");
    let server = ca.issue(d, "lockd", &["127.0.0.1"], false);
    let lockd = tls_lockd(d, &server, None);
    let addr: std::net::SocketAddr = lockd.endpoint["https://".len()..].parse().unwrap();
    let flood: Vec<std::net::TcpStream> = (0..1100)
        .map(|_| e2e::connect_from("127.0.0.2", addr))
        .collect();
    let refused = lockd.wait_event(
        "too many handshakes in progress from this address; connection closed",
        |e| {
            e["peer"]
                .as_str()
                .is_some_and(|p| p.starts_with("127.0.0.2:"))
        },
    );
    assert_eq!(refused["max"], 64, "{refused}");
    let (code, out) = describe(&lockd.endpoint, &[&ca.pem]);
    assert_eq!(code, Some(0), "{out}");
    drop(flood);
}
