//! lockd instances over a ZooKeeper ensemble: one leads, the others forward to it; what a
//! failure of either side does.

use std::time::Duration;

use e2e::etcd::LEADING;
use e2e::ha::{self, acquire_raw, assert_unavailable};
use e2e::zookeeper::ZkEnsemble;
use lockd_proto::v1::RenewRequest;
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use tonic::Code;

#[test]
fn a_retry_through_the_other_instance_gets_the_original_grant_and_a_clean_stop_hands_over() {
    let zk = ZkEnsemble::start(1);
    ha::a_retry_through_the_other_instance_gets_the_original_grant_and_a_clean_stop_hands_over(
        &|dir| zk.lockd(dir, &[]),
    );
}

#[test]
fn kill_9_of_the_lockd_leader_keeps_its_locks_and_tokens_rise() {
    let zk = ZkEnsemble::start(3);
    ha::kill_9_of_the_lockd_leader_keeps_its_locks_and_tokens_rise(&|dir| zk.lockd(dir, &[]));
}

#[test]
fn without_a_quorum_there_is_no_grant_and_no_renewal_and_service_resumes_after() {
    let mut zk = ZkEnsemble::start(3);
    let dir = tempfile::tempdir().unwrap();
    let lockd = zk.lockd(dir.path(), &[]);
    lockd.wait_event(LEADING, |_| true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rpc = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    let acquire = |rpc: &mut LockServiceClient<_>, resource: &str| acquire_raw(&rt, rpc, resource);
    let held = match acquire(&mut rpc, "kept").unwrap().outcome {
        Some(Outcome::Granted(l)) => l,
        other => panic!("a free resource is granted: {other:?}"),
    };

    // Two of three servers down: no quorum.
    zk.kill9(0);
    zk.kill9(1);
    let err = acquire(&mut rpc, "other").expect_err("no grant without a quorum");
    assert_unavailable(&err);
    let mut renew = tonic::Request::new(RenewRequest {
        resource: "kept".to_string(),
        lease_id: held.lease_id.clone(),
    });
    renew.set_timeout(Duration::from_secs(30));
    let err = rt
        .block_on(rpc.renew(renew))
        .expect_err("no renewal without a quorum");
    assert_unavailable(&err);

    // Back: service resumes, and the lease that was held is still there. (The refused grant
    // of "other" may have landed all the same: ZooKeeper's next leader commits what its
    // predecessor logged. Its answer said no grant, so nobody holds its lease id, and it
    // runs out with its TTL; a retry with a request id would have been given it.)
    zk.restart(0, false);
    zk.restart(1, true);
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    loop {
        match acquire(&mut rpc, "resumed") {
            Ok(r) => {
                assert!(
                    matches!(r.outcome, Some(Outcome::Granted(_))),
                    "a free resource is granted once ZooKeeper has a quorum again"
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
    rt.block_on(rpc.renew(RenewRequest {
        resource: "kept".to_string(),
        lease_id: held.lease_id,
    }))
    .expect("the lease held before the outage is renewed after it");
}
