//! lockd instances over a ZooKeeper ensemble: one leads, the others forward to it; what a
//! failure of either side does.

use std::time::Duration;

use e2e::Lockd;
use e2e::etcd::LEADING;
use e2e::ha::{acquire_raw, assert_unavailable, granted, opts};
use e2e::zookeeper::ZkEnsemble;
use lockd_client::Client;
use lockd_proto::v1::RenewRequest;
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use tonic::Code;

/// Two lockd instances over `zk`, and which one leads (the first starts first, so leads).
fn two(zk: &ZkEnsemble, dirs: &[tempfile::TempDir; 2]) -> (Vec<Lockd>, usize) {
    let first = zk.lockd(dirs[0].path(), &[]);
    first.wait_event(LEADING, |_| true);
    let second = zk.lockd(dirs[1].path(), &[]);
    (vec![first, second], 0)
}

#[test]
fn a_retry_through_the_other_instance_gets_the_original_grant_and_a_clean_stop_hands_over() {
    let zk = ZkEnsemble::start(1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (mut lockds, leader) = two(&zk, &dirs);
    let follower = 1 - leader;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let clients: Vec<Client> = lockds
        .iter()
        .map(|l| Client::connect(&l.endpoint).unwrap())
        .collect();
    let first = granted(
        &rt,
        &clients[follower],
        "job",
        opts(60, 0, Some("retry-me")),
        "a free resource is granted through the follower",
    );
    let again = granted(
        &rt,
        &clients[leader],
        "job",
        opts(60, 0, Some("retry-me")),
        "a retry through the leader is answered with the original grant",
    );
    assert_eq!(
        (again.token, &again.lease_id),
        (first.token, &first.lease_id)
    );
    assert!(again.duplicate);

    // SIGTERM of the leader: it gives its node up, the other takes over at once, and the
    // lock is still held, by the same lease.
    lockds[leader].process.signal(libc::SIGTERM);
    assert!(lockds[leader].process.wait().success());
    lockds[follower].wait_event(LEADING, |e| e["leases"].as_u64() >= Some(1));
    rt.block_on(clients[follower].renew("job", &first.lease_id))
        .expect("the lease survives the hand-over");
    let retried = granted(
        &rt,
        &clients[follower],
        "job",
        opts(60, 0, Some("retry-me")),
        "a retry after the hand-over is answered with the original grant",
    );
    assert_eq!(retried.token, first.token);
    let next = granted(
        &rt,
        &clients[follower],
        "other",
        opts(60, 0, None),
        "a free resource is granted by the new leader",
    );
    assert!(next.token > first.token, "tokens rise across the hand-over");
}

#[test]
fn kill_9_of_the_lockd_leader_keeps_its_locks_and_tokens_rise() {
    let zk = ZkEnsemble::start(3);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (mut lockds, leader) = two(&zk, &dirs);
    let follower = 1 - leader;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&lockds[follower].endpoint).unwrap();
    let kept = granted(
        &rt,
        &client,
        "kept",
        opts(60, 0, None),
        "a free resource is granted",
    );
    lockds[leader].kill9();
    // The killed leader's session expires (2 s), then the follower leads; the SDK retries
    // through the failover.
    let probe = granted(
        &rt,
        &client,
        "probe",
        opts(30, 0, None),
        "a free resource is granted after the failover",
    );
    assert!(probe.token > kept.token, "tokens rise across the failover");
    lockds[follower].wait_event(LEADING, |e| e["leases"].as_u64() >= Some(1));
    let d = rt.block_on(client.describe("kept")).unwrap();
    assert_eq!(d.token, Some(kept.token));
    rt.block_on(client.renew("kept", &kept.lease_id))
        .expect("a lease granted before the kill is renewed after it");
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
