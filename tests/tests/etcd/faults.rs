//! etcd members failing under lockd.

use std::time::Duration;

use e2e::etcd::EtcdCluster;
use e2e::ha::{acquire_raw, assert_unavailable};
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{RenewRequest, acquire_response::Outcome};
use tonic::Code;

use crate::{Load, lockd_on};

#[test]
fn kill_9_of_the_etcd_leader_during_a_burst_of_grants() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = EtcdCluster::start(3);
    let lockd = lockd_on(dir.path(), &cluster);
    let load = Load::start(std::slice::from_ref(&lockd.endpoint), 6, 3);
    load.recorder.wait_grants(40, "grants before the kill");
    let leader = cluster.leader();
    cluster.kill9(leader);
    // A new leader is elected; grants go on, tokens keep rising.
    load.recorder
        .wait_grants(40, "grants after the leader was killed");
    cluster.restart(leader, true);
    load.recorder
        .wait_grants(20, "grants after the member came back");
    load.finish();
}

#[test]
fn a_stopped_etcd_leader_does_not_stop_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = EtcdCluster::start(3);
    let lockd = lockd_on(dir.path(), &cluster);
    let load = Load::start(std::slice::from_ref(&lockd.endpoint), 4, 2);
    load.recorder.wait_grants(20, "grants before the stop");
    let leader = cluster.leader();
    cluster.pause(leader, true);
    // The stopped member still accepts connections and never answers: lockd moves on to the
    // others, which elect a new leader.
    load.recorder
        .wait_grants(30, "grants while the old leader is stopped");
    cluster.pause(leader, false);
    load.recorder.wait_grants(20, "grants after it was resumed");
    load.finish();
}

#[test]
fn without_a_majority_there_is_no_grant_and_no_renewal_and_service_resumes_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = EtcdCluster::start(3);
    let lockd = lockd_on(dir.path(), &cluster);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rpc = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    let acquire = |rpc: &mut LockServiceClient<_>, resource: &str| acquire_raw(&rt, rpc, resource);
    let held = match acquire(&mut rpc, "kept").unwrap().outcome {
        Some(Outcome::Granted(l)) => l,
        other => panic!("a free resource is granted: {other:?}"),
    };

    // Two of three members down: no quorum.
    let leader = cluster.leader();
    let other = (leader + 1) % 3;
    cluster.kill9(leader);
    cluster.kill9(other);
    let err = acquire(&mut rpc, "other").expect_err("no grant without a majority");
    assert_unavailable(&err);
    let mut renew = tonic::Request::new(RenewRequest {
        resource: "kept".to_string(),
        lease_id: held.lease_id.clone(),
    });
    renew.set_timeout(Duration::from_secs(30));
    let err = rt
        .block_on(rpc.renew(renew))
        .expect_err("no renewal without a majority");
    assert_unavailable(&err);

    // Back: service resumes, and the lease that was held is still there (etcd gives every
    // lease a full TTL after a leader change).
    cluster.restart(leader, false);
    cluster.restart(other, false);
    cluster.wait_member(leader);
    cluster.wait_member(other);
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    loop {
        match acquire(&mut rpc, "other") {
            Ok(r) => {
                assert!(
                    matches!(r.outcome, Some(Outcome::Granted(_))),
                    "a free resource is granted once etcd has a quorum again"
                );
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                assert!(
                    std::time::Instant::now() < deadline,
                    "service did not resume: {e:?}"
                );
            }
        }
    }
    let renewed = rt
        .block_on(rpc.renew(RenewRequest {
            resource: "kept".to_string(),
            lease_id: held.lease_id,
        }))
        .expect("the lease held before the outage is renewed after it");
    assert!(renewed.into_inner().ttl_ms >= 60_000);
}

/// A release answered OK is in etcd: the leader answers it once committed. Its term lasts
/// (leadership TTL 30 s) well past the moment two of three members die, so a release
/// answered from memory would be OK here and then lost with the term.
#[test]
fn a_release_during_quorum_loss_is_refused_or_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = EtcdCluster::start(3);
    let lockd = cluster.lockd(dir.path(), &["--etcd-leader-ttl-ms", "30000"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = lockd_client::Client::connect(&lockd.endpoint).unwrap();
    let opts = lockd_client::AcquireOptions {
        ttl: Some(Duration::from_secs(60)),
        wait: Duration::ZERO,
        holder: "test".to_string(),
        request_id: None,
        owner: Default::default(),
        permits: 0,
        mode: lockd_client::Mode::Exclusive,
    };
    let lease = match rt.block_on(client.acquire("r", opts)).unwrap() {
        lockd_client::Acquired::Granted(g) => rt.block_on(g.detach()),
        lockd_client::Acquired::NotGranted(why) => panic!("a free resource is granted, not {why}"),
    };
    let leader = cluster.leader();
    let other = (leader + 1) % 3;
    cluster.kill9(leader);
    cluster.kill9(other);
    let released = rt.block_on(client.release("r", &lease.lease_id));
    assert!(
        matches!(released, Err(lockd_client::ClientError::Unavailable(_))),
        "a release etcd could not take was answered {released:?}"
    );

    // Back: the lock is still held by that lease (its release was never answered OK), and
    // releasing it again works.
    cluster.restart(leader, false);
    cluster.restart(other, false);
    cluster.wait_member(leader);
    cluster.wait_member(other);
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    let released = loop {
        match rt.block_on(client.release("r", &lease.lease_id)) {
            Ok(released) => break released,
            Err(lockd_client::ClientError::Unavailable(e)) => assert!(
                std::time::Instant::now() < deadline,
                "service did not resume: {e}"
            ),
            Err(e) => panic!("{e}"),
        }
    };
    assert!(
        released,
        "the lease whose release was refused is held after the outage"
    );
}
