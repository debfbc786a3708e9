//! Readiness over etcd: `/readyz` and grpc.health.v1 say SERVING while a leader is known and
//! NOT_SERVING while etcd is gone (no instance can lead), and recover with it; the leader's
//! metrics count its taking over.

use e2e::etcd::{EtcdCluster, LEADING};
use e2e::{PATIENCE, http_get, sample};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// grpc.health.v1's answer for the whole server and for the lock service.
fn health(rt: &tokio::runtime::Runtime, endpoint: &str) -> (i32, i32) {
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let c = HealthClient::new(channel);
        let of = |service: &str| {
            let r = HealthCheckRequest {
                service: service.to_string(),
            };
            let mut c = c.clone();
            async move { c.check(r).await.unwrap().into_inner().status }
        };
        (of("").await, of("fencing.lock.v1.LockService").await)
    })
}

/// Waits until `/readyz` answers `status` (and grpc.health.v1 the matching status).
fn wait_ready(rt: &tokio::runtime::Runtime, admin: &str, endpoint: &str, status: u16) {
    let want = if status == 200 {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    } as i32;
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (got, body) = http_get(admin, "/readyz");
        if got == status && health(rt, endpoint) == (want, want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "readyz stayed {got} ({body}), expected {status}"
        );
    }
}

#[test]
fn readyz_and_grpc_health_follow_the_leader() {
    let mut cluster = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let lockd = cluster.lockd(dir.path(), &["--admin-listen", "127.0.0.1:0"]);
    lockd.wait_event(LEADING, |_| true);
    let admin = lockd.admin();
    let rt = tokio::runtime::Runtime::new().unwrap();
    wait_ready(&rt, &admin, &lockd.endpoint, 200);
    let (_, text) = http_get(&admin, "/metrics");
    assert_eq!(sample(&text, "lockd_leader"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "lockd_leader_changes_total"), Some(1.0));
    assert_eq!(sample(&text, "lockd_failover_seconds_count"), Some(1.0));

    // Without etcd no instance can lead: not ready, and the body says why.
    cluster.kill9(0);
    lockd.wait_event("stopped leading", |_| true);
    wait_ready(&rt, &admin, &lockd.endpoint, 503);
    let (_, body) = http_get(&admin, "/readyz");
    assert!(body.contains("no leader is known"), "{body}");
    let (_, text) = http_get(&admin, "/metrics");
    assert_eq!(sample(&text, "lockd_leader"), Some(0.0));
    assert_eq!(
        sample(&text, "lockd_leases"),
        None,
        "no state where nothing leads"
    );
    // /healthz: the process is alive all along.
    assert_eq!(http_get(&admin, "/healthz").0, 200);

    cluster.restart(0, true);
    lockd.wait_events(LEADING, 2, |_| true);
    wait_ready(&rt, &admin, &lockd.endpoint, 200);
    let (_, text) = http_get(&admin, "/metrics");
    assert_eq!(sample(&text, "lockd_leader_changes_total"), Some(2.0));
}
