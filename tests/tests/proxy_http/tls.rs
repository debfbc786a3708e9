//! HTTPS in the HTTP mode, with curl as the client: an HTTPS listener in front of an
//! `https://` upstream that asks for the proxy's client certificate, every failure with its
//! clear answer, mutual TLS on the listener, the secure defaults, and SIGHUP.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use e2e::certs::{Ca, Pair};
use e2e::upstream::Upstream;
use e2e::{FenceProxy, output};

/// An HTTPS upstream whose certificate is `up_ca`'s, asking for a client certificate of
/// `clients_ca`.
fn https_upstream(d: &Path, up_ca: &Ca, clients_ca: &Ca) -> Upstream {
    let pair = up_ca.issue(d, "upstream", &["127.0.0.1"], false);
    let tls = tlsconf::Reloadable::new(
        tlsconf::ServerFiles {
            cert: pair.cert,
            key: pair.key,
            client_ca: Some(clients_ca.pem.clone()),
            client_cert_optional: false,
        },
        &[b"http/1.1"],
    )
    .unwrap();
    Upstream::start_tls(Arc::new(tls))
}

fn start(d: &Path, sub: &str, listener: &str) -> FenceProxy {
    let dir = d.join(sub);
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "data_dir = \"{}\"\n[[http]]\nlisten = \"127.0.0.1:0\"\n{listener}\n",
        dir.join("data").display()
    );
    FenceProxy::start(&dir, &config, 1)
}

fn files(pair: &Pair, prefix: &str) -> String {
    format!(
        "{prefix}_cert = \"{}\"\n{prefix}_key = \"{}\"\n",
        pair.cert.display(),
        pair.key.display()
    )
}

/// curl `PUT url` with `args` and fencing headers; (exit code, HTTP status, body, stderr).
fn put(url: &str, args: &[&str], resource: &str, token: &str) -> (i32, String, String, String) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-X",
        "PUT",
        "-w",
        "\n%{http_code}",
        "--max-time",
        "20",
    ])
    .args(["-H", &format!("Fencing-Resource: {resource}")])
    .args(["-H", &format!("Fencing-Token: {token}")])
    .args(args)
    .arg(url);
    let (status, out, err) = output(cmd);
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (
        status.code().unwrap_or(-1),
        code.to_string(),
        body.to_string(),
        err,
    )
}

/// The [[http]] keys for the HTTPS `upstream`, verified against `ca`, with `client` as the
/// proxy's client certificate.
fn to_https(upstream: &Upstream, ca: &Ca, client: Option<&Pair>) -> String {
    format!(
        "upstream = \"https://{}\"\nupstream_ca = \"{}\"\n{}",
        upstream.addr,
        ca.pem.display(),
        client.map_or(String::new(), |c| files(c, "upstream"))
    )
}

/// The proxy's URL in HTTPS.
fn https(proxy: &FenceProxy) -> String {
    proxy.urls[0].replacen("http://", "https://", 1)
}

#[test]
fn curl_over_https_through_the_proxy_to_an_https_upstream_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (up_ca, clients_ca, proxy_ca) =
        (Ca::new(d, "up"), Ca::new(d, "clients"), Ca::new(d, "proxy"));
    let upstream = https_upstream(d, &up_ca, &clients_ca);
    let proxy_pair = proxy_ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    let proxy_client = clients_ca.issue(d, "proxy-client", &[], false);
    let proxy = start(
        d,
        "p",
        &format!(
            "{}{}",
            to_https(&upstream, &up_ca, Some(&proxy_client)),
            files(&proxy_pair, "tls")
        ),
    );
    let url = format!("{}/inventory/a", https(&proxy));
    let ca = proxy_ca.pem.to_str().unwrap();
    let (code, status, _, err) = put(&url, &["--cacert", ca], "inv:a", "5");
    assert_eq!(
        (code, status.as_str()),
        (0, "200"),
        "a fenced write over HTTPS: {err}"
    );
    let (code, status, body, _) = put(&url, &["--cacert", ca], "inv:a", "4");
    assert_eq!(
        (code, status.as_str()),
        (0, "409"),
        "a stale token over HTTPS: {body}"
    );
    assert!(body.contains("stale-token"), "{body}");
    let seen = upstream.seen();
    assert_eq!(
        seen.len(),
        1,
        "only the current write reached the upstream: {seen:?}"
    );
}

#[test]
fn failures_on_either_side_each_get_a_clear_answer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (up_ca, clients_ca, proxy_ca, stranger) = (
        Ca::new(d, "up"),
        Ca::new(d, "clients"),
        Ca::new(d, "proxy"),
        Ca::new(d, "stranger"),
    );
    let upstream = https_upstream(d, &up_ca, &clients_ca);
    let proxy_pair = proxy_ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    let proxy_client = clients_ca.issue(d, "proxy-client", &[], false);
    let ca = proxy_ca.pem.to_str().unwrap().to_string();

    // Towards the client: a wrong CA, a wrong name, plaintext on the HTTPS port.
    let proxy = start(
        d,
        "p",
        &format!(
            "{}{}",
            to_https(&upstream, &up_ca, Some(&proxy_client)),
            files(&proxy_pair, "tls")
        ),
    );
    let url = format!("{}/x", https(&proxy));
    let (code, _, _, err) = put(
        &url,
        &["--cacert", stranger.pem.to_str().unwrap()],
        "r",
        "1",
    );
    assert_eq!(
        code, 60,
        "curl refuses a certificate of a CA it does not trust: {err}"
    );
    proxy
        .process
        .wait_handshake_failure("refused this server's certificate");
    let by_name = url.replacen("127.0.0.1", "localhost", 1);
    let (code, _, _, err) = put(&by_name, &["--cacert", &ca], "r", "1");
    assert_eq!(code, 60, "a name the certificate does not carry: {err}");
    let (code, _, _, _) = put(&format!("{}/x", proxy.urls[0]), &[], "r", "1");
    assert_ne!(code, 0, "plain HTTP to the HTTPS port");
    proxy.process.wait_handshake_failure("did not speak TLS");
    let (code, status, _, err) = put(&url, &["--cacert", &ca], "r", "1");
    assert_eq!(
        (code, status.as_str()),
        (0, "200"),
        "the proxy still serves: {err}"
    );

    // Towards the upstream: a CA that did not sign its certificate, then no client
    // certificate where one is asked for.
    let wrong_ca = start(
        d,
        "wrong-ca",
        &to_https(&upstream, &stranger, Some(&proxy_client)),
    );
    let (_, status, body, _) = put(&format!("{}/x", wrong_ca.urls[0]), &[], "r", "1");
    assert_eq!(status, "502", "{body}");
    assert!(
        body.contains("the server's certificate was refused"),
        "{body}"
    );
    let no_client_cert = start(d, "no-client-cert", &to_https(&upstream, &up_ca, None));
    let (_, status, body, _) = put(&format!("{}/x", no_client_cert.urls[0]), &[], "r", "2");
    assert_eq!(status, "502", "{body}");
    assert!(body.contains("CertificateRequired"), "{body}");
    assert_eq!(
        upstream.seen().len(),
        1,
        "only the good request reached the upstream"
    );

    // Mutual TLS on the listener.
    let alice = clients_ca.issue(d, "alice", &[], false);
    let mtls = start(
        d,
        "m",
        &format!(
            "{}tls_client_ca = \"{}\"\n{}",
            to_https(&upstream, &up_ca, Some(&proxy_client)),
            clients_ca.pem.display(),
            files(&proxy_pair, "tls")
        ),
    );
    let murl = format!("{}/x", https(&mtls));
    let (code, _, _, _) = put(&murl, &["--cacert", &ca], "m", "1");
    assert_ne!(code, 0, "no client certificate");
    mtls.process
        .wait_handshake_failure("presented no certificate");
    let (cert, key) = (alice.cert.to_str().unwrap(), alice.key.to_str().unwrap());
    let (code, status, _, err) = put(
        &murl,
        &["--cacert", &ca, "--cert", cert, "--key", key],
        "m",
        "1",
    );
    assert_eq!(
        (code, status.as_str()),
        (0, "200"),
        "a client certificate of the CA: {err}"
    );
}

#[test]
fn plaintext_off_loopback_needs_insecure_and_tls_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let upstream = Upstream::start();
    let ca = Ca::new(d, "proxy");
    let pair = ca.issue(d, "proxy-server", &["127.0.0.1"], false);
    let refused = |listener: &str, want: &str| {
        let config = format!(
            "data_dir = \"{}\"\n[[http]]\n{listener}\n",
            d.join("data").display()
        );
        let text = FenceProxy::refused(d, &config);
        assert!(text.contains(want), "{listener}: wanted {want:?} in {text}");
    };
    refused(
        &format!("listen = \"0.0.0.0:0\"\nupstream = \"{}\"", upstream.url()),
        "is not on loopback and serves plain HTTP",
    );
    refused(
        "listen = \"127.0.0.1:0\"\nupstream = \"http://10.1.2.3:80\"",
        "in plain HTTP (use https://",
    );
    refused(
        "listen = \"127.0.0.1:0\"\nupstream = \"http://[::ffff:10.1.2.3]:80\"",
        "in plain HTTP (use https://",
    );
    refused(
        "listen = \"127.0.0.1:0\"\nupstream = \"https://10.1.2.3:443\"",
        "needs upstream_ca",
    );
    refused(
        &format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\ntls_cert = \"{}\"",
            upstream.url(),
            pair.cert.display()
        ),
        "tls_cert and tls_key go together",
    );
    refused(
        &format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"",
            upstream.url(),
            pair.cert.display(),
            pair.cert.display()
        ),
        "holds no PEM private key",
    );
    // HTTPS off loopback needs nothing more.
    let config = format!(
        "data_dir = \"{}\"\n[[http]]\nlisten = \"0.0.0.0:0\"\nupstream = \"{}\"\n{}",
        d.join("data").display(),
        upstream.url(),
        files(&pair, "tls")
    );
    let p = FenceProxy::start(d, &config, 1);
    let port = p.urls[0].rsplit_once(':').unwrap().1;
    let (code, status, _, err) = put(
        &format!("https://127.0.0.1:{port}/x"),
        &["--cacert", ca.pem.to_str().unwrap()],
        "r",
        "1",
    );
    assert_eq!((code, status.as_str()), (0, "200"), "{err}");
}

#[test]
fn sighup_reloads_the_listener_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let upstream = Upstream::start();
    let (one, two) = (Ca::new(d, "one"), Ca::new(d, "two"));
    let first = one.issue(d, "proxy-server", &["127.0.0.1"], false);
    let mut proxy = start(
        d,
        "p",
        &format!(
            "upstream = \"{}\"\n{}",
            upstream.url(),
            files(&first, "tls")
        ),
    );
    let url = format!("{}/x", https(&proxy));
    let with = |ca: &Ca| put(&url, &["--cacert", ca.pem.to_str().unwrap()], "r", "1").0;
    assert_eq!(with(&one), 0);
    let second = two.issue(d, "second", &["127.0.0.1"], false);
    second.copy_over(&first);
    proxy.process.signal(libc::SIGHUP);
    proxy.process.wait_events(
        "reloaded the TLS certificates; new connections use them",
        1,
        |_| true,
    );
    assert_eq!(with(&two), 0, "new connections get the new certificate");
    assert_eq!(with(&one), 60, "the old CA no longer verifies");
}
