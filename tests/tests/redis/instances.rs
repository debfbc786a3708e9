//! lockd instances over Redis with Sentinel: one leads, the others forward to it; what a
//! failure of either side does.

use std::time::Duration;

use e2e::Lockd;
use e2e::etcd::LEADING;
use e2e::ha::{acquire_raw, assert_unavailable, granted, opts};
use e2e::redis::RedisSet;
use lockd_client::Client;
use lockd_proto::v1::RenewRequest;
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use tonic::Code;

/// Two lockd instances over `redis`; the first starts first, so leads.
fn two(redis: &RedisSet, dirs: &[tempfile::TempDir; 2]) -> Vec<Lockd> {
    let first = redis.lockd(dirs[0].path(), &[]);
    first.wait_event(LEADING, |_| true);
    let second = redis.lockd(dirs[1].path(), &[]);
    vec![first, second]
}

#[test]
fn a_retry_through_the_other_instance_gets_the_original_grant_and_a_clean_stop_hands_over() {
    let redis = RedisSet::start(1, 1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut lockds = two(&redis, &dirs);
    let (leader, follower) = (0, 1);
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

    // SIGTERM of the leader: it deletes its key, the other takes over at once, and the lock
    // is still held, by the same lease.
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
    let redis = RedisSet::start(1, 1);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut lockds = two(&redis, &dirs);
    let (leader, follower) = (0, 1);
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
    // The killed leader's key expires (2 s), then the follower leads; the SDK retries
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

/// Without a replica a batch cannot be waited for: no grant. Renewals are not stored (a new
/// leader gives every lease a full TTL), so the leader still answers them while its key
/// lives. Without the master as well, the term runs out: no renewal either. Both resume
/// once the servers are back.
#[test]
fn without_a_replica_there_is_no_grant_and_without_the_master_no_renewal_and_service_resumes() {
    let mut redis = RedisSet::start(1, 1);
    let dir = tempfile::tempdir().unwrap();
    let lockd = redis.lockd(dir.path(), &["--redis-request-timeout-ms", "500"]);
    lockd.wait_event(LEADING, |_| true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rpc = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    let acquire = |rpc: &mut LockServiceClient<_>, resource: &str| acquire_raw(&rt, rpc, resource);
    let first = acquire(&mut rpc, "kept").unwrap_or_else(|e| {
        panic!(
            "{e:?}\n--- the master:\n{}\n--- the replica:\n{}",
            redis.log(0),
            redis.log(1)
        )
    });
    let held = match first.outcome {
        Some(Outcome::Granted(l)) => l,
        other => panic!("a free resource is granted: {other:?}"),
    };
    let renew = |rpc: &mut LockServiceClient<_>| {
        let mut r = tonic::Request::new(RenewRequest {
            resource: "kept".to_string(),
            lease_id: held.lease_id.clone(),
        });
        r.set_timeout(Duration::from_secs(30));
        rt.block_on(rpc.renew(r))
    };

    // The only replica down: a batch cannot reach it (redis_wait_replicas = 1).
    redis.kill9(1);
    let err = acquire(&mut rpc, "other").expect_err("no grant without a replica");
    assert_unavailable(&err);
    // The master stopped too (and no replica to promote): the term runs out.
    redis.pause(0, true);
    let err = renew(&mut rpc).expect_err("no renewal without the master");
    assert_unavailable(&err);
    let err = acquire(&mut rpc, "other").expect_err("no grant without the master");
    assert_unavailable(&err);

    // Back: service resumes, and the lease that was held is still there.
    redis.pause(0, false);
    redis.restart(1);
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    // A fresh name each time: a grant answered UNAVAILABLE may have landed on the master all
    // the same (nobody holds its lease id; it runs out with its TTL).
    for attempt in 0.. {
        match acquire(&mut rpc, &format!("resumed-{attempt}")) {
            Ok(r) => {
                assert!(
                    matches!(r.outcome, Some(Outcome::Granted(_))),
                    "a free resource is granted once the replica is back"
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
    renew(&mut rpc).expect("the lease held before the outage is renewed after it");
}

/// `kill -9` of the Redis master: the Sentinels promote the replica, lockd's term on the old
/// master ends, the next term runs on the new one, and every waited-for grant is there, with
/// tokens above the new epoch's floor.
#[test]
fn kill_9_of_the_redis_master_fails_over_and_tokens_jump_above_the_new_epoch() {
    let mut redis = RedisSet::start(2, 3);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let lockds = two(&redis, &dirs);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&lockds[1].endpoint).unwrap();
    let kept = granted(
        &rt,
        &client,
        "kept",
        opts(60, 0, None),
        "a free resource is granted",
    );
    redis.kill9(0);
    redis.wait_failover_from(0);
    let probe = granted(
        &rt,
        &client,
        "probe",
        opts(30, 0, None),
        "a free resource is granted after the Redis failover",
    );
    assert!(
        probe.token > 1 << lockd_store_redis::EPOCH_SHIFT,
        "the new master's tokens start above its epoch's floor: {}",
        probe.token
    );
    let d = rt.block_on(client.describe("kept")).unwrap();
    assert_eq!(d.token, Some(kept.token), "the waited-for grant survived");
    rt.block_on(client.renew("kept", &kept.lease_id))
        .expect("a lease granted before the failover is renewed after it");
}
