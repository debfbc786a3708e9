//! lockd instances over etcd serving mutual TLS: a follower forwards to the leader over TLS,
//! trusting the peers' CA and presenting its own certificate.

use std::path::Path;

use e2e::certs::Ca;
use e2e::etcd::EtcdCluster;
use lockd_client::{AcquireOptions, Acquired, Client};

/// Two lockd instances serving mutual TLS with certificates of `ca` (common names `lockd-0`
/// and `lockd-1`), with `extra` arguments.
fn mtls_instances(
    cluster: &EtcdCluster,
    d: &Path,
    ca: &Ca,
    extra: &[&str],
) -> (Vec<tempfile::TempDir>, Vec<e2e::Lockd>) {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let lockds = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let me = ca.issue(d, &format!("lockd-{i}"), &["127.0.0.1"], false);
            let mut args = vec![
                "--tls-cert".to_string(),
                me.cert.display().to_string(),
                "--tls-key".to_string(),
                me.key.display().to_string(),
                "--tls-client-ca".to_string(),
                ca.pem.display().to_string(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cluster.lockd(dir.path(), &args)
        })
        .collect();
    (dirs, lockds)
}

fn try_lock(holder: &str) -> AcquireOptions {
    AcquireOptions {
        ttl: Some(std::time::Duration::from_secs(30)),
        wait: std::time::Duration::ZERO,
        holder: holder.into(),
        request_id: None,
        owner: Default::default(),
        permits: 0,
        mode: lockd_client::Mode::Exclusive,
    }
}

#[test]
fn a_follower_forwards_to_the_leader_over_mutual_tls() {
    let cluster = EtcdCluster::start(1);
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    // One CA for the instances (their server certificates, and their client certificates
    // when they forward) and the application.
    let ca = Ca::new(d, "cluster");
    let app = ca.issue(d, "app", &["app"], false);
    let (_dirs, lockds) = mtls_instances(&cluster, d, &ca, &[]);
    let endpoints: Vec<&str> = lockds.iter().map(|l| l.endpoint.as_str()).collect();
    assert!(endpoints.iter().all(|e| e.starts_with("https://")));
    let leader = cluster.lockd_leader_among(&endpoints, None);
    let follower = 1 - leader;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let files = tlsconf::ClientFiles {
        ca: Some(ca.pem.clone()),
        cert: Some(app.cert.clone()),
        key: Some(app.key.clone()),
    };
    let client = Client::connect_tls(endpoints[follower], &files).unwrap();
    let Acquired::Granted(g) = rt.block_on(client.acquire("job", try_lock("app"))).unwrap() else {
        panic!("a free resource, through the follower")
    };
    let lease = rt.block_on(g.detach());
    // The leader granted it: it describes it too.
    let direct = Client::connect_tls(endpoints[leader], &files).unwrap();
    let d = rt.block_on(direct.describe("job")).unwrap();
    assert_eq!(d.token, Some(lease.token));
    assert_eq!(d.holder, "app");
}

/// With a policy, a follower forwards who the caller is: a bearer token as it came (the
/// leader checks it), a caller known by its certificate by name, which the leader takes only
/// from a peer. An application's certificate that names a caller itself is refused.
#[test]
fn a_follower_forwards_the_callers_identity_and_only_a_peer_may_name_one() {
    let cluster = EtcdCluster::start(1);
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    let ca = Ca::new(d, "cluster");
    let app = ca.issue(d, "app", &["app.internal"], false);
    let token = "a-token-of-the-batch-tenant-0123456789";
    let policy = d.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            r#"
            [[tenant]]
            name = "web"
            prefixes = ["web/"]
            [[tenant]]
            name = "batch"
            prefixes = ["batch/"]
            [[identity]]
            name = "web-app"
            tenant = "web"
            cert = "DNS:app.internal"
            [[identity]]
            name = "batch-job"
            tenant = "batch"
            token_sha256 = "{}"
            [[identity]]
            name = "lockd-0"
            peer = true
            cert = "CN:lockd-0"
            [[identity]]
            name = "lockd-1"
            peer = true
            cert = "CN:lockd-1"
            "#,
            e2e::sha256_hex(token)
        ),
    )
    .unwrap();
    let (_dirs, lockds) = mtls_instances(&cluster, d, &ca, &["--policy", policy.to_str().unwrap()]);
    let endpoints: Vec<&str> = lockds.iter().map(|l| l.endpoint.as_str()).collect();
    let leader = cluster.lockd_leader_among(&endpoints, None);
    let follower = 1 - leader;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let with_cert = tlsconf::ClientFiles {
        ca: Some(ca.pem.clone()),
        cert: Some(app.cert.clone()),
        key: Some(app.key.clone()),
    };
    let ca_only = tlsconf::ClientFiles {
        ca: Some(ca.pem.clone()),
        ..Default::default()
    };
    let web = Client::connect_tls(endpoints[follower], &with_cert).unwrap();
    let batch = Client::connect_tls(endpoints[follower], &ca_only)
        .unwrap()
        .with_token(token)
        .unwrap();
    for (client, resource, identity) in
        [(&web, "web/1", "web-app"), (&batch, "batch/1", "batch-job")]
    {
        let Acquired::Granted(g) = rt
            .block_on(client.acquire(resource, try_lock("x")))
            .unwrap()
        else {
            panic!("{resource} is free, through the follower")
        };
        drop(rt.block_on(g.detach()));
        // The leader recorded the identity the follower was shown.
        let on_leader = Client::connect_tls(endpoints[leader], &with_cert).unwrap();
        let on_leader = if identity == "batch-job" {
            Client::connect_tls(endpoints[leader], &ca_only)
                .unwrap()
                .with_token(token)
                .unwrap()
        } else {
            on_leader
        };
        let described = rt.block_on(on_leader.describe(resource)).unwrap();
        assert_eq!(described.holder, format!("{identity} (x)"));
        // And kept each to its tenant, through the follower too.
        let other = if identity == "web-app" {
            "batch/2"
        } else {
            "web/2"
        };
        let e = rt
            .block_on(client.acquire(other, try_lock("x")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("permission_denied") && e.contains(identity),
            "{e}"
        );
    }

    // The application calls the leader as if it were a follower, naming batch-job.
    let raw = rt.block_on(async {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(
                std::fs::read(&ca.pem).unwrap(),
            ))
            .identity(tonic::transport::Identity::from_pem(
                std::fs::read(&app.cert).unwrap(),
                std::fs::read(&app.key).unwrap(),
            ));
        let channel = tonic::transport::Endpoint::from_shared(endpoints[leader].to_string())
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut rpc = lockd_proto::v1::lock_service_client::LockServiceClient::new(channel);
        let mut r = tonic::Request::new(lockd_proto::v1::DescribeRequest {
            resource: "batch/1".into(),
        });
        r.metadata_mut()
            .insert("lockd-forwarded-by", "1".parse().unwrap());
        r.metadata_mut()
            .insert("lockd-forwarded-identity", "batch-job".parse().unwrap());
        rpc.describe(r).await
    });
    let s = raw.expect_err("an application may not name another caller");
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("web-app is not a peer"), "{s:?}");
}

/// lockd over etcd members that serve TLS and require client certificates, and what lockd says
/// when its certificate or CA is wrong.
#[test]
fn lockd_talks_to_etcd_over_mutual_tls_and_names_what_is_wrong() {
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    let (ca, other) = (Ca::new(d, "etcd"), Ca::new(d, "other"));
    let member = ca.issue(d, "member", &["127.0.0.1"], false);
    let lockd_cert = ca.issue(d, "lockd", &["lockd"], false);
    let cluster = EtcdCluster::start_with(
        1,
        Some(e2e::etcd::EtcdTls {
            cert: member.cert.clone(),
            key: member.key.clone(),
            client_ca: ca.pem.clone(),
        }),
    );
    let endpoints = cluster.endpoints();
    assert!(endpoints.starts_with("https://"), "{endpoints}");
    let s = |p: &std::path::Path| p.display().to_string();
    let good = [
        "--etcd-ca".to_string(),
        s(&ca.pem),
        "--etcd-cert".to_string(),
        s(&lockd_cert.cert),
        "--etcd-key".to_string(),
        s(&lockd_cert.key),
    ];
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<&str> = good.iter().map(String::as_str).collect();
    let lockd = cluster.lockd(dir.path(), &args);
    lockd.wait_event(e2e::etcd::LEADING, |_| true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let opts = AcquireOptions {
        ttl: Some(std::time::Duration::from_secs(30)),
        wait: std::time::Duration::ZERO,
        holder: "app".into(),
        request_id: None,
        owner: Default::default(),
        permits: 0,
        mode: lockd_client::Mode::Exclusive,
    };
    assert!(matches!(
        rt.block_on(client.acquire("job", opts)).unwrap(),
        Acquired::Granted(_)
    ));
    drop(lockd);

    // Without a client certificate, and trusting another CA: lockd serves no lock and says why
    // (etcd's alert when it arrives before the connection is seen closed, else what to check).
    for (flags, want) in [
        (vec!["--etcd-ca".to_string(), s(&ca.pem)], "etcd_cert"),
        (
            vec![
                "--etcd-ca".to_string(),
                s(&other.pem),
                "--etcd-cert".to_string(),
                s(&lockd_cert.cert),
                "--etcd-key".to_string(),
                s(&lockd_cert.key),
            ],
            "UnknownIssuer",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut args: Vec<&str> = vec!["--backend", "etcd", "--etcd-endpoints", &endpoints];
        args.extend(flags.iter().map(String::as_str));
        let lockd = e2e::Lockd::start(dir.path(), &args);
        let e = lockd.wait_event("cannot campaign for leadership; retrying", |e| {
            e["error"]
                .as_str()
                .is_some_and(|m| m.to_lowercase().contains(&want.to_lowercase()))
        });
        assert!(e["error"].as_str().unwrap().contains("etcd"), "{e}");
    }

    // Settings that cannot work are refused at start-up.
    let plain = endpoints.replace("https://", "http://");
    for (flags, want) in [
        (
            vec!["--etcd-endpoints".to_string(), endpoints.clone()],
            "need etcd_ca",
        ),
        (
            vec![
                "--etcd-endpoints".to_string(),
                plain.clone(),
                "--etcd-ca".to_string(),
                s(&ca.pem),
            ],
            "are for https://",
        ),
        (
            vec![
                "--etcd-endpoints".to_string(),
                endpoints.clone(),
                "--etcd-ca".to_string(),
                s(&ca.pem),
                "--etcd-cert".to_string(),
                s(&lockd_cert.cert),
            ],
            "etcd_cert and etcd_key go together",
        ),
        (
            vec![
                "--etcd-endpoints".to_string(),
                "http://10.0.0.1:2379".to_string(),
            ],
            "not on loopback",
        ),
    ] {
        let mut cmd = std::process::Command::new(e2e::bin("lockd"));
        cmd.args(["--backend", "etcd"])
            .args(&flags)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env_remove("LOCKD_CONFIG");
        let (status, _, err) = e2e::output(cmd);
        assert_eq!(status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: wanted {want:?} in {err}");
    }
}
