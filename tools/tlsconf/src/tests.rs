//! Unit tests of tlsconf: real handshakes over in-memory pipes, with certificates made by rcgen.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    path: PathBuf,
}

fn ca(dir: &Path, name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} CA"));
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let path = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&path, issuer.pem()).unwrap();
    Ca { issuer, path }
}

fn leaf(dir: &Path, ca: &Ca, name: &str) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// A handshake between `server` and `client` over a pipe, and one byte each way.
async fn handshake(
    server: &Reloadable,
    client: Arc<ClientConfig>,
) -> (Result<(), String>, Result<(), String>) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let acceptor = server.acceptor();
    let srv = async move {
        let mut s = acceptor.accept(a).await.map_err(|e| handshake_error(&e))?;
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        s.write_all(&byte).await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())
    };
    let cli = async move {
        let connector = tokio_rustls::TlsConnector::from(client);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut s = connector
            .connect(name, b)
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(b"x").await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        Ok(())
    };
    tokio::join!(srv, cli)
}

#[tokio::test]
async fn mutual_tls_works_and_each_failure_says_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca1, other) = (ca(d, "one"), ca(d, "other"));
    let (cert, key) = leaf(d, &ca1, "server");
    let (ccert, ckey) = leaf(d, &ca1, "client");
    let server = Reloadable::new(
        ServerFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: Some(ca1.path.clone()),
            client_cert_optional: false,
        },
        &[],
    )
    .unwrap();
    let with = |ca: &Path, id: bool| {
        client_config(
            &ClientFiles {
                ca: Some(ca.to_path_buf()),
                cert: id.then(|| ccert.clone()),
                key: id.then(|| ckey.clone()),
            },
            &[],
        )
        .unwrap()
    };
    let (s, c) = handshake(&server, with(&ca1.path, true)).await;
    assert_eq!((s.clone(), c.clone()), (Ok(()), Ok(())), "{s:?} {c:?}");
    // No client certificate: the server says so.
    let (s, _) = handshake(&server, with(&ca1.path, false)).await;
    assert!(s.unwrap_err().contains("presented no certificate"));
    // The client does not trust the server's CA.
    let (_, c) = handshake(&server, with(&other.path, true)).await;
    assert!(c.unwrap_err().contains("UnknownIssuer"));

    // Plaintext on the TLS port.
    let (a, mut b) = tokio::io::duplex(1024);
    let acceptor = server.acceptor();
    let srv = tokio::spawn(async move { acceptor.accept(a).await.map(|_| ()) });
    b.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let e = srv.await.unwrap().unwrap_err();
    assert!(
        handshake_error(&e).contains("plaintext"),
        "{}",
        handshake_error(&e)
    );
}

#[tokio::test]
async fn a_reload_serves_new_connections_with_the_new_files_and_a_bad_one_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca1, ca2) = (ca(d, "one"), ca(d, "two"));
    let (cert, key) = leaf(d, &ca1, "server");
    let files = ServerFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: None,
        client_cert_optional: false,
    };
    let server = Reloadable::new(files, &[]).unwrap();
    let trusting = |ca: &Ca| {
        client_config(
            &ClientFiles {
                ca: Some(ca.path.clone()),
                ..ClientFiles::default()
            },
            &[],
        )
        .unwrap()
    };
    assert_eq!(handshake(&server, trusting(&ca1)).await.1, Ok(()));
    let (c2, k2) = leaf(d, &ca2, "server2");
    std::fs::copy(&c2, &cert).unwrap();
    std::fs::copy(&k2, &key).unwrap();
    server.reload().unwrap();
    assert_eq!(handshake(&server, trusting(&ca2)).await.1, Ok(()));
    assert!(handshake(&server, trusting(&ca1)).await.1.is_err());
    // A broken file: the reload fails and the configuration in force stays.
    std::fs::write(&key, "garbage").unwrap();
    assert!(matches!(server.reload(), Err(TlsError::Empty { .. })));
    assert_eq!(handshake(&server, trusting(&ca2)).await.1, Ok(()));
}

#[test]
fn bad_files_are_named_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca1 = ca(d, "one");
    let (cert, key) = leaf(d, &ca1, "server");
    let (_, other_key) = leaf(d, &ca1, "other");
    let garbage = d.join("garbage.pem");
    std::fs::write(&garbage, "not pem at all").unwrap();
    let files = |c: &Path, k: &Path| ServerFiles {
        cert: c.to_path_buf(),
        key: k.to_path_buf(),
        client_ca: None,
        client_cert_optional: false,
    };
    let missing = d.join("missing.pem");
    let msg = |f: ServerFiles| server_config(&f, &[]).unwrap_err().to_string();
    assert!(msg(files(&missing, &key)).contains("cannot read the certificate"));
    assert!(msg(files(&garbage, &key)).contains("holds no PEM certificate"));
    assert!(msg(files(&cert, &garbage)).contains("holds no PEM private key"));
    assert!(msg(files(&cert, &other_key)).contains("do not go together"));
    // Encrypted keys, in both forms, are named as such.
    let pkcs8 = d.join("pkcs8.pem");
    std::fs::write(
        &pkcs8,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    let traditional = d.join("traditional.pem");
    std::fs::write(
        &traditional,
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nMIIB\n-----END RSA PRIVATE KEY-----\n",
    )
    .unwrap();
    for k in [&pkcs8, &traditional] {
        assert!(
            msg(files(&cert, k)).contains("it is encrypted"),
            "{}",
            k.display()
        );
    }
    let mut with_ca = files(&cert, &key);
    with_ca.client_ca = Some(garbage.clone());
    assert!(msg(with_ca).contains("CA file"));
    assert!(ClientFiles::default().check().is_err());
    let half = ClientFiles {
        ca: Some(ca1.path.clone()),
        cert: Some(cert),
        key: None,
    };
    assert!(half.check().unwrap_err().to_string().contains("--key"));
}

#[test]
fn loopback_hosts_are_told_from_the_others() {
    for h in [
        "localhost",
        "LocalHost",
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "::ffff:127.0.0.1",
    ] {
        assert!(loopback_host(h), "{h}");
    }
    for h in [
        "10.0.0.1",
        "db",
        "::ffff:10.0.0.1",
        "0.0.0.0",
        "::",
        "",
        "localhost.evil.com",
    ] {
        assert!(!loopback_host(h), "{h}");
    }
}

#[test]
fn a_ca_file_without_a_ca_and_a_certificate_out_of_its_validity_are_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = ca(d, "a");
    let (cert, _) = leaf(d, &ca, "leaf");
    let certs = |p: &Path| parse_certs("CA file", p, &std::fs::read(p).unwrap()).unwrap();
    assert_eq!(no_ca_among(&certs(&ca.path)), None);
    let why = no_ca_among(&certs(&cert)).expect("a leaf is no CA");
    assert!(why.contains("holds no CA certificate"), "{why}");
    // A leaf and its CA in one file: there is a CA.
    let both = d.join("both.pem");
    let text = format!(
        "{}{}",
        std::fs::read_to_string(&cert).unwrap(),
        std::fs::read_to_string(&ca.path).unwrap()
    );
    std::fs::write(&both, text).unwrap();
    assert_eq!(no_ca_among(&certs(&both)), None);

    let dated = |from: (i32, u8, u8), to: (i32, u8, u8)| {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        params.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
        let key = KeyPair::generate().unwrap();
        params.signed_by(&key, &ca.issuer).unwrap().der().clone()
    };
    let (why, date) = outside_validity(&dated((2000, 1, 1), (2000, 12, 31))).expect("expired");
    assert!(
        why.contains("has expired") && date.contains("2000"),
        "{why} {date}"
    );
    let (why, date) =
        outside_validity(&dated((2999, 1, 1), (2999, 12, 31))).expect("not yet valid");
    assert!(
        why.contains("not valid yet") && date.contains("2999"),
        "{why} {date}"
    );
    assert_eq!(outside_validity(&dated((2000, 1, 1), (2999, 12, 31))), None);
}
