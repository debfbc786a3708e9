//! Start-up refusals, the connection cap, and a clean shutdown.

use std::process::Command;

use e2e::{Lockd, bin, output};
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, DescribeRequest, ReleaseRequest};

#[test]
fn a_second_lockd_on_the_same_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Lockd::start(dir.path(), &[]);
    let mut second = Command::new(bin("lockd"));
    second
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0"]);
    let (status, _, stderr) = output(second);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("in use by another lockd"), "{stderr}");
}

#[test]
fn garbage_configuration_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lockd.toml");
    std::fs::write(&config, "listen = 7420\n").unwrap();
    for (args, env, needle) in [
        (
            vec!["--config", config.to_str().unwrap()],
            None,
            "is not valid",
        ),
        (
            vec!["--ttl-min-ms", "0"],
            None,
            "ttl_min_ms must be at least 1",
        ),
        (
            vec!["--connections-max", "0"],
            None,
            "connections_max must be at least 1",
        ),
        (
            vec!["--admin-listen", "0.0.0.0:7421"],
            None,
            "admin_listen 0.0.0.0:7421 is not a loopback address",
        ),
        (
            vec![],
            Some(("LOCKD_LISTEN", "nowhere")),
            "invalid socket address",
        ),
    ] {
        let mut cmd = Command::new(bin("lockd"));
        cmd.arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(&args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let (status, _, stderr) = output(cmd);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert!(
        !dir.path().join("data").exists(),
        "nothing is created for a refused configuration"
    );
}

#[test]
fn sigterm_ends_waits_flushes_the_store_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut lockd = Lockd::start(dir.path(), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let endpoint = lockd.endpoint.clone();
    let acquire = |resource: &str, wait_ms| AcquireRequest {
        resource: resource.to_string(),
        ttl_ms: 600_000,
        wait_timeout_ms: wait_ms,
        ..Default::default()
    };
    let client = rt.block_on(async {
        let mut client = LockServiceClient::connect(endpoint).await.unwrap();
        // `released` is released just before the shutdown: a lazily synced release that the
        // clean shutdown must flush. `held` stays held.
        let Some(Outcome::Granted(l)) = client
            .acquire(acquire("released", 0))
            .await
            .unwrap()
            .into_inner()
            .outcome
        else {
            panic!()
        };
        client
            .release(ReleaseRequest {
                resource: "released".into(),
                lease_id: l.lease_id,
            })
            .await
            .unwrap();
        client.acquire(acquire("held", 0)).await.unwrap();
        client
    });
    let mut waiter = client.clone();
    let waiting = rt.spawn(async move { waiter.acquire(acquire("held", 60_000)).await });
    lockd.wait_event("queued", |e| e["resource"] == "held");
    lockd.process.signal(libc::SIGTERM);
    let status = lockd.process.wait();
    assert!(
        status.success(),
        "lockd exited with {status}: {}",
        lockd.process.stderr.text()
    );
    let ended = rt
        .block_on(waiting)
        .unwrap()
        .expect_err("the wait ends with an error");
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended}");
    assert_eq!(
        ended.metadata().get("lockd-error").unwrap(),
        "shutting_down"
    );

    let lockd = Lockd::start(dir.path(), &[]);
    rt.block_on(async {
        let mut client = LockServiceClient::connect(lockd.endpoint.clone())
            .await
            .unwrap();
        let d = |r: &str| DescribeRequest {
            resource: r.to_string(),
        };
        assert!(
            !client
                .describe(d("released"))
                .await
                .unwrap()
                .into_inner()
                .held,
            "the release was not flushed"
        );
        assert!(
            client.describe(d("held")).await.unwrap().into_inner().held,
            "the grant was lost"
        );
    });
}

/// At `connections_max`, lockd says so once and accepts no more connections until one closes;
/// then the waiting client is served, plaintext and TLS alike.
#[test]
fn at_connections_max_a_new_connection_waits_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = e2e::certs::Ca::new(d, "server");
    let server = ca.issue(d, "lockd", &["127.0.0.1"], false);
    let tls = [
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        server.key.to_str().unwrap(),
    ];
    for extra in [&[][..], &tls[..]] {
        let mut args = vec!["--connections-max", "2"];
        args.extend_from_slice(extra);
        let lockd = Lockd::start(&d.join(format!("data-{}", extra.len())), &args);
        let addr = lockd.endpoint.split("://").nth(1).unwrap().to_string();
        let first = std::net::TcpStream::connect(&addr).unwrap();
        let _second = std::net::TcpStream::connect(&addr).unwrap();
        lockd.wait_event(
            "connections_max connections are open; new ones wait to be accepted until one closes",
            |e| e["connections_max"] == 2,
        );
        let mut describe = lockd.lockctl();
        if !extra.is_empty() {
            describe.arg("--ca").arg(&ca.pem);
        }
        describe.args(["describe", "x"]);
        let waiting = std::thread::spawn(move || output(describe));
        drop(first);
        let (status, out, err) = waiting.join().unwrap();
        assert!(
            status.success(),
            "served once a connection closed: {out}{err}"
        );
    }
}
