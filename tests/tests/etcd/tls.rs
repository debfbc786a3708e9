//! lockd instances over etcd serving mutual TLS: a follower forwards to the leader over TLS,
//! trusting the peers' CA and presenting its own certificate.

use e2e::certs::Ca;
use e2e::etcd::EtcdCluster;
use lockd_client::{AcquireOptions, Acquired, Client};

#[test]
fn a_follower_forwards_to_the_leader_over_mutual_tls() {
    let cluster = EtcdCluster::start(1);
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    // One CA for the instances (their server certificates, and their client certificates
    // when they forward) and the application.
    let ca = Ca::new(d, "cluster");
    let app = ca.issue(d, "app", &["app"], false);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let lockds: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let me = ca.issue(d, &format!("lockd-{i}"), &["127.0.0.1"], false);
            let args = [
                "--tls-cert".to_string(),
                me.cert.display().to_string(),
                "--tls-key".to_string(),
                me.key.display().to_string(),
                "--tls-client-ca".to_string(),
                ca.pem.display().to_string(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cluster.lockd(dir.path(), &args)
        })
        .collect();
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
    let opts = AcquireOptions {
        ttl: Some(std::time::Duration::from_secs(30)),
        wait: std::time::Duration::ZERO,
        holder: "app".into(),
        request_id: None,
    };
    let Acquired::Granted(g) = rt.block_on(client.acquire("job", opts)).unwrap() else {
        panic!("a free resource, through the follower")
    };
    let lease = rt.block_on(g.detach());
    // The leader granted it: it describes it too.
    let direct = Client::connect_tls(endpoints[leader], &files).unwrap();
    let d = rt.block_on(direct.describe("job")).unwrap();
    assert_eq!(d.token, Some(lease.token));
    assert_eq!(d.holder, "app");
}
