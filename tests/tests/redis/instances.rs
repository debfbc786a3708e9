//! lockd instances over Redis with Sentinel: one leads, the others forward to it; what a
//! failure of either side does.

use std::time::Duration;

use e2e::etcd::LEADING;
use e2e::ha::{self, acquire_raw, assert_unavailable, granted, opts};
use e2e::redis::RedisSet;
use lockd_client::Client;
use lockd_proto::v1::RenewRequest;
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use tonic::Code;

#[test]
fn a_retry_through_the_other_instance_gets_the_original_grant_and_a_clean_stop_hands_over() {
    let redis = RedisSet::start(1, 1);
    ha::a_retry_through_the_other_instance_gets_the_original_grant_and_a_clean_stop_hands_over(
        &|dir| redis.lockd(dir, &[]),
    );
}

#[test]
fn kill_9_of_the_lockd_leader_keeps_its_locks_and_tokens_rise() {
    let redis = RedisSet::start(1, 1);
    ha::kill_9_of_the_lockd_leader_keeps_its_locks_and_tokens_rise(&|dir| redis.lockd(dir, &[]));
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
    // Nor through the SDK, which retries with its request id: the next term must not answer
    // the retry with the grant that is on the master only (an outside tester's finding).
    let sdk = {
        let _in = rt.enter();
        Client::connect(&lockd.endpoint).unwrap()
    };
    match rt.block_on(sdk.acquire("retried", opts(60, 0, Some("retried-id")))) {
        Err(e) => assert!(
            e.to_string().contains("navailable") || e.to_string().contains("leader"),
            "{e}"
        ),
        Ok(_) => panic!("a grant no replica has was answered to a retry"),
    }
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
    let lockds = ha::two(&|dir| redis.lockd(dir, &[]), &dirs);
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

/// An outside tester's finding: while a campaign fails for a lasting reason (here a leader key
/// lockd did not write), every instance logged the same warning five times a second. It is
/// logged once (then again every 30 s), and each retry at debug level.
#[test]
fn a_lasting_campaign_error_is_warned_once_not_at_every_retry() {
    let redis = RedisSet::start(1, 1);
    let master = ::redis::Client::open(format!("redis://{}/", redis.servers[0].addr)).unwrap();
    let mut conn = master.get_connection().unwrap();
    let _: () = ::redis::cmd("SET")
        .arg("lockd:leader")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let endpoints = redis.endpoints().join(",");
    let lockd = e2e::Lockd::start_with_env(
        dir.path(),
        "127.0.0.1:0",
        &["--backend", "redis", "--redis-endpoints", &endpoints],
        &[],
    );
    let failed = "cannot campaign for leadership; retrying";
    let retry = lockd.wait_events(failed, 4, |e| e["level"] == "DEBUG");
    assert!(
        retry["error"]
            .as_str()
            .is_some_and(|e| e.contains("DEL lockd:leader")),
        "{retry}"
    );
    let log = lockd.process.stderr.text();
    let warned = log
        .lines()
        .filter_map(e2e::event)
        .filter(|e| e["message"] == failed && e["level"] == "WARN")
        .count();
    assert_eq!(warned, 1, "{log}");
}
