//! Three lockd instances over one etcd cluster: one leads, the others forward to it.

use std::time::{Duration, Instant};

use e2e::Lockd;
use e2e::etcd::{EtcdCluster, LEADING};
use e2e::ha::{granted, opts};
use lockd_client::{Acquired, Client};
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, DescribeRequest, RenewRequest, acquire_response::Outcome};
use tonic::Code;

use crate::{Load, lockd_on};

struct Three {
    cluster: EtcdCluster,
    lockds: Vec<Lockd>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Three {
    fn start() -> Three {
        let cluster = EtcdCluster::start(3);
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let lockds = dirs.iter().map(|d| lockd_on(d.path(), &cluster)).collect();
        Three {
            cluster,
            lockds,
            _dirs: dirs,
        }
    }

    /// Three instances, their endpoints, a runtime for clients, and which one leads.
    fn with_runtime() -> (Three, Vec<String>, tokio::runtime::Runtime, usize) {
        let three = Three::start();
        let endpoints = three.endpoints();
        let leader = three.leader(None);
        (
            three,
            endpoints,
            tokio::runtime::Runtime::new().unwrap(),
            leader,
        )
    }

    fn endpoints(&self) -> Vec<String> {
        self.lockds.iter().map(|l| l.endpoint.clone()).collect()
    }

    /// The index of the instance that leads (not `not`).
    fn leader(&self, not: Option<usize>) -> usize {
        let endpoints = self.endpoints();
        let refs: Vec<&str> = endpoints.iter().map(String::as_str).collect();
        self.cluster.lockd_leader_among(&refs, not.map(|i| refs[i]))
    }
}

#[test]
fn any_instance_serves_and_a_clean_stop_of_the_leader_hands_over() {
    let mut three = Three::start();
    let endpoints = three.endpoints();
    let load = Load::start(&endpoints, 6, 3);
    load.recorder
        .wait_grants(40, "grants through all three instances");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let leader = three.leader(None);
    let (f1, f2) = ((leader + 1) % 3, (leader + 2) % 3);
    let clients: Vec<Client> = endpoints
        .iter()
        .map(|e| Client::connect(e).unwrap())
        .collect();
    // A grant through one follower, retried with the same request id through the other.
    let first = granted(
        &rt,
        &clients[f1],
        "job",
        opts(60, 0, Some("retry-me")),
        "a free resource is granted through a follower",
    );
    let again = granted(
        &rt,
        &clients[f2],
        "job",
        opts(60, 0, Some("retry-me")),
        "a retry is answered with the original grant",
    );
    assert_eq!(
        (again.token, &again.lease_id),
        (first.token, &first.lease_id)
    );
    assert!(again.duplicate);
    // Renewed through the leader itself, described through a follower.
    rt.block_on(clients[leader].renew("job", &first.lease_id))
        .expect("a lease granted through a follower is renewed through the leader");
    let d = rt.block_on(clients[f2].describe("job")).unwrap();
    assert_eq!(d.token, Some(first.token));

    // SIGTERM of the leader: it gives the leadership up, another instance takes over at
    // once (no TTL to wait out), and the lock is still held, by the same lease.
    three.lockds[leader].process.signal(libc::SIGTERM);
    assert!(three.lockds[leader].process.wait().success());
    let next = three.leader(Some(leader));
    assert_ne!(next, leader);
    three.lockds[next].wait_event(LEADING, |e| e["leases"].as_u64() >= Some(1));
    let survivor = (next + 1) % 3;
    let survivor = if survivor == leader {
        (next + 2) % 3
    } else {
        survivor
    };
    rt.block_on(clients[survivor].renew("job", &first.lease_id))
        .expect("the lease survives the hand-over");
    load.recorder
        .wait_grants(40, "grants after the leader stopped");
    load.finish();
}

#[test]
fn kill_9_of_the_lockd_leader_during_a_burst_keeps_its_locks() {
    let (mut three, endpoints, rt, leader) = Three::with_runtime();
    let _in = rt.enter();
    let follower = (leader + 1) % 3;
    let client = Client::connect(&endpoints[follower]).unwrap();
    let kept = granted(
        &rt,
        &client,
        "kept",
        opts(60, 0, None),
        "a free resource is granted",
    );

    let load = Load::start(&endpoints, 6, 3);
    load.recorder.wait_grants(40, "grants before the kill");
    let killed_at = Instant::now();
    three.lockds[leader].kill9();
    // The SDK retries through the failover: this grant is the new leader's first ones'.
    let probe = granted(
        &rt,
        &client,
        "probe",
        opts(30, 0, None),
        "a free resource is granted",
    );
    eprintln!(
        "failover: the first grant after the kill came {:?} after it",
        killed_at.elapsed()
    );
    assert!(probe.token > kept.token);
    let next = three.leader(Some(leader));
    // The new leader started from its warm copy of the state, not from a full read.
    three.lockds[next].wait_event(LEADING, |e| e["loaded_from"] == "warm copy");
    load.recorder
        .wait_grants(40, "grants after the lockd leader was killed");
    // The lock granted before the kill is held still, by the same lease and token.
    let d = rt.block_on(client.describe("kept")).unwrap();
    assert_eq!(d.token, Some(kept.token));
    rt.block_on(client.renew("kept", &kept.lease_id))
        .expect("a lease granted before the kill is renewed after it");
    let after = granted(
        &rt,
        &client,
        "fresh",
        opts(30, 0, None),
        "a free resource is granted",
    );
    assert!(after.token > kept.token);
    load.finish();
}

/// A raw client with a long deadline of its own, so that lockd's answer is what is judged.
fn rpc(
    rt: &tokio::runtime::Runtime,
    endpoint: &str,
) -> LockServiceClient<tonic::transport::Channel> {
    rt.block_on(LockServiceClient::connect(endpoint.to_string()))
        .unwrap()
}

#[test]
fn a_paused_lockd_leader_neither_grants_nor_renews_when_it_wakes() {
    let (mut three, endpoints, rt, leader) = Three::with_runtime();
    let _in = rt.enter();
    let follower = (leader + 1) % 3;
    let to_leader = Client::connect(&endpoints[leader]).unwrap();
    let held = granted(
        &rt,
        &to_leader,
        "r",
        opts(6, 0, None),
        "a free resource is granted",
    );
    // The last renewal the leader answers: from its sending, the lease is the holder's for
    // its TTL, and nobody else may hold "r" before that has run out.
    let renewed_at = Instant::now();
    rt.block_on(to_leader.renew("r", &held.lease_id))
        .expect("the leader renews its lease");
    let ttl = Duration::from_millis(held.ttl.as_millis() as u64);
    // A lease still valid in the paused leader's memory when it wakes: were the woken leader
    // to renew it, its holder would count on it past the expiry the next leader gave it.
    let long = granted(
        &rt,
        &to_leader,
        "long",
        opts(120, 0, None),
        "a free resource is granted",
    );
    // Clients of the followers go on through the pause and the failover; their history is
    // judged at the end.
    let others = [
        endpoints[follower].clone(),
        endpoints[(leader + 2) % 3].clone(),
    ];
    let load = Load::start(&others, 4, 2);
    load.recorder.wait_grants(10, "grants before the pause");

    three.lockds[leader].process.signal(libc::SIGSTOP);
    // A waiter through a follower: served by the next leader, once the renewal ran out.
    let waiting = {
        let client = Client::connect(&endpoints[follower]).unwrap();
        rt.spawn(async move {
            let got = client.acquire("r", opts(6, 40, Some("next"))).await;
            (got, Instant::now())
        })
    };
    let next = three.leader(Some(leader));
    assert_ne!(next, leader);
    let (got, at) = rt.block_on(waiting).unwrap();
    let Acquired::Granted(next_lease) = got.expect("the waiter is answered") else {
        panic!("the waiter is granted by the new leader");
    };
    let next_lease = rt.block_on(next_lease.detach());
    assert!(next_lease.token > held.token);
    assert!(
        at >= renewed_at + ttl,
        "\"r\" was granted again {:?} after the paused leader's last renewal was sent, within its TTL {ttl:?}",
        at - renewed_at
    );

    // Calls that reach the paused leader wait in its socket; it wakes to them.
    let mut stale = rpc(&rt, &endpoints[leader]);
    // Many renewals, so that some reach it before it has noticed that its term is over.
    let renewals: Vec<_> = (0..32)
        .map(|i| {
            let mut c = stale.clone();
            let (resource, lease_id) = if i % 2 == 0 {
                ("r", held.lease_id.clone())
            } else {
                ("long", long.lease_id.clone())
            };
            rt.spawn(async move {
                let mut r = tonic::Request::new(RenewRequest {
                    resource: resource.to_string(),
                    lease_id,
                });
                r.set_timeout(Duration::from_secs(30));
                c.renew(r).await
            })
        })
        .collect();
    let acquire = rt.spawn(async move {
        let mut r = tonic::Request::new(AcquireRequest {
            resource: "z".to_string(),
            request_id: String::new(),
            ttl_ms: 30_000,
            wait_timeout_ms: 0,
            holder: "late".to_string(),
            owner: Default::default(),
            permits: 0,
            mode: 0,
            downgrade_lease_id: String::new(),
        });
        r.set_timeout(Duration::from_secs(30));
        stale.acquire(r).await
    });
    three.lockds[leader].process.signal(libc::SIGCONT);
    for renew in renewals {
        match rt.block_on(renew).unwrap() {
            // Forwarded to the new leader, which renews "long" (whether the woken leader
            // renewed it instead, its log says, below).
            Ok(r) if r.get_ref().ttl_ms == 120_000 => {}
            Ok(r) => panic!("\"r\" was renewed after it expired: {r:?}"),
            // Refused by the woken leader itself, or by the new one ("r" has expired).
            Err(e) => assert!(
                matches!(e.code(), Code::Unavailable | Code::FailedPrecondition),
                "{e:?}"
            ),
        }
    }
    match rt.block_on(acquire).unwrap() {
        Err(e) => assert_eq!(e.code(), Code::Unavailable, "{e:?}"),
        // Only as the new leader's grant (it forwarded the call once it knew it was deposed).
        Ok(r) => {
            let Some(Outcome::Granted(l)) = r.into_inner().outcome else {
                panic!("a free resource is granted or refused");
            };
            let mut c = rpc(&rt, &endpoints[next]);
            let d = rt
                .block_on(c.describe(DescribeRequest {
                    resource: "z".to_string(),
                }))
                .unwrap()
                .into_inner();
            assert_eq!(d.token, l.token, "the grant is the new leader's");
            assert!(l.token > next_lease.token);
        }
    }
    three.lockds[leader].wait_event("stopped leading", |_| true);
    let woken: Vec<serde_json::Value> = three.lockds[leader]
        .process
        .stderr
        .text()
        .lines()
        .filter_map(e2e::event)
        .filter(|e| {
            (e["message"] == "renewed" && e["resource"] == "long")
                || (e["message"] == "granted" && e["resource"] == "z")
        })
        .collect();
    assert!(
        woken.is_empty(),
        "the woken leader renewed or granted: {woken:?}"
    );
    load.recorder.wait_grants(10, "grants after the failover");
    load.finish();
}

#[test]
fn tokens_stay_above_what_was_answered_when_etcd_loses_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let old = EtcdCluster::start(1);
    let mut lockd = lockd_on(dir.path(), &old);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let mut last = 0;
    for i in 0..10 {
        let g = granted(
            &rt,
            &client,
            &format!("h{i}"),
            opts(30, 0, None),
            "a free resource is granted",
        );
        last = last.max(g.token);
    }
    // lockd stops cleanly (its high-water is written down), and etcd is replaced by an empty
    // cluster.
    lockd.process.signal(libc::SIGTERM);
    assert!(lockd.process.wait().success());
    drop(old);
    let fresh = EtcdCluster::start(1);
    let lockd = lockd_on(dir.path(), &fresh);
    lockd.wait_event(LEADING, |_| true);
    let client = Client::connect(&lockd.endpoint).unwrap();
    let g = granted(
        &rt,
        &client,
        "h0",
        opts(30, 0, None),
        "a free resource is granted",
    );
    assert!(
        g.token > last + (1 << 32),
        "token {} after {last}: tokens must continue above the high-water plus its margin",
        g.token
    );
    lockd.wait_event("etcd's token high-water is behind tokens this lockd has seen (etcd lost data, or was restored from a backup); tokens continue above this instance's high-water plus a margin", |_| true);
}

#[test]
fn the_leader_compacts_etcds_history() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = EtcdCluster::start(1);
    let lockd = cluster.lockd(dir.path(), &["--etcd-compact-every-ms", "1000"]);
    lockd.wait_event(LEADING, |_| true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    for i in 0..5 {
        granted(
            &rt,
            &client,
            &format!("c{i}"),
            opts(30, 0, None),
            "a free resource is granted",
        );
    }
    // The first round only notes the revision; the second compacts up to it.
    let e = lockd.wait_event("compacted etcd's history", |_| true);
    let revision = e["revision"]
        .as_i64()
        .expect("the event names the revision");
    assert!(revision > 5, "{e}");
    let mut cmd = std::process::Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.endpoints()))
        .args(["get", "/lockd/high-water", "--rev=1"]);
    let (status, _, stderr) = e2e::output(cmd);
    assert!(
        !status.success() && stderr.contains("compacted"),
        "revision 1 is still readable: {stderr}"
    );
}

#[test]
fn a_leader_whose_advertised_address_is_not_its_own_gives_the_leadership_up() {
    let cluster = EtcdCluster::start(1);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let addr_a = e2e::free_loopback_addr();
    let mut a = cluster.lockd_at(dirs[0].path(), &addr_a, &[]);
    a.wait_event(LEADING, |_| true);
    // B advertises A's address (a copied config, say): harmless while it follows.
    let b = cluster.lockd(dirs[1].path(), &["--advertise", &a.endpoint]);
    a.process.signal(libc::SIGTERM);
    assert!(a.process.wait().success());
    b.wait_event(LEADING, |_| true);
    // Another lockd now answers on A's address: nobody can forward to B.
    let a2 = cluster.lockd_at(dirs[2].path(), &addr_a, &[]);
    b.wait_event(
        "the advertised address does not reach this instance: the others cannot forward to it, so it gives the leadership up and will only follow (fix advertise)",
        |_| true,
    );
    a2.wait_event(LEADING, |_| true);
    // B serves by forwarding to the new leader.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let through_b = Client::connect(&b.endpoint).unwrap();
    let g = granted(
        &rt,
        &through_b,
        "via-b",
        opts(30, 0, None),
        "a free resource is granted through B",
    );
    let d = rt
        .block_on(Client::connect(&a2.endpoint).unwrap().describe("via-b"))
        .unwrap();
    assert_eq!(d.token, Some(g.token));
}

#[test]
fn a_leader_key_deleted_by_hand_gives_no_second_holder() {
    let cluster = EtcdCluster::start(1);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = cluster.lockd(dirs[0].path(), &[]);
    a.wait_event(LEADING, |_| true);
    let b = cluster.lockd(dirs[1].path(), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let (to_a, to_b) = (
        Client::connect(&a.endpoint).unwrap(),
        Client::connect(&b.endpoint).unwrap(),
    );
    let held = granted(
        &rt,
        &to_a,
        "d",
        opts(1, 0, None),
        "a free resource is granted",
    );
    let ttl = held.ttl;
    // The holder renews through the leader, before and for a while after the key goes.
    let mut last_ok = Instant::now();
    let renew_for = |until: Instant, last_ok: &mut Instant| {
        while Instant::now() < until {
            let sent = Instant::now();
            if rt.block_on(to_a.renew("d", &held.lease_id)).is_ok() {
                *last_ok = sent;
            }
        }
    };
    renew_for(Instant::now() + Duration::from_millis(300), &mut last_ok);
    let mut del = std::process::Command::new("etcdctl");
    del.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.endpoints()))
        .args(["del", "/lockd/leader"]);
    let (status, _, stderr) = e2e::output(del);
    assert!(status.success(), "{stderr}");
    renew_for(Instant::now() + Duration::from_millis(300), &mut last_ok);
    // Someone else waits through the other instance: it may have the lock only once the
    // holder's last answered renewal has run out.
    let got = rt.block_on(to_b.acquire("d", opts(5, 30, Some("second"))));
    let at = Instant::now();
    let Acquired::Granted(_) = got.expect("the waiter is answered") else {
        panic!("the waiter is granted once the lease ran out");
    };
    assert!(
        at >= last_ok + ttl,
        "\"d\" was granted again {:?} after its last answered renewal was sent, within its TTL {ttl:?}",
        at - last_ok
    );
}

#[test]
fn calls_in_flight_through_a_follower_when_the_leader_is_killed_end_in_lockds_answers() {
    let cluster = EtcdCluster::start(1);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut a = cluster.lockd(dirs[0].path(), &[]);
    a.wait_event(LEADING, |_| true);
    let b = cluster.lockd(dirs[1].path(), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (grant_tx, grants) = std::sync::mpsc::channel::<()>();
    // Raw clients (no SDK retries) acquire through the follower, each call with its own
    // request id, until stopped; every answer that is not a grant is returned.
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (endpoint, stop, grant_tx) = (b.endpoint.clone(), stop.clone(), grant_tx.clone());
            rt.spawn(async move {
                let mut rpc = LockServiceClient::connect(endpoint).await.unwrap();
                let mut refused = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let mut r = tonic::Request::new(AcquireRequest {
                        resource: format!("f{t}-{n}"),
                        request_id: format!("f{t}-{n}"),
                        ttl_ms: 30_000,
                        wait_timeout_ms: 0,
                        holder: "raw".to_string(),
                        owner: Default::default(),
                        permits: 0,
                        mode: 0,
                        downgrade_lease_id: String::new(),
                    });
                    r.set_timeout(Duration::from_secs(30));
                    match rpc.acquire(r).await {
                        Ok(_) => {
                            let _ = grant_tx.send(());
                        }
                        Err(e) => refused.push(e),
                    }
                }
                refused
            })
        })
        .collect();
    let wait_grants = |n: usize| {
        for _ in 0..n {
            grants
                .recv_timeout(e2e::PATIENCE)
                .expect("grants through the follower stopped");
        }
    };
    wait_grants(50);
    a.kill9();
    wait_grants(50);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        for e in rt.block_on(t).unwrap() {
            // Calls cut off with the leader go on to the next one; what a client may see is
            // lockd's own UNAVAILABLE (with its code), never a bare transport error.
            assert_eq!(e.code(), Code::Unavailable, "{e:?}");
            assert!(e.metadata().contains_key("lockd-error"), "{e:?}");
        }
    }
}

#[test]
fn an_inconsistent_state_written_by_hand_is_refused_without_an_exit_until_repaired() {
    let cluster = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    // Two locks with one token: no core may be rebuilt from that.
    let record = |lease: &str| {
        format!(
            r#"{{"lease_id":"{}","token":7,"holder":"hand","ttl_ms":1000}}"#,
            lease.repeat(32)
        )
    };
    let etcdctl = |args: &[&str]| {
        let mut cmd = std::process::Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", cluster.endpoints()))
            .args(args);
        let (status, _, stderr) = e2e::output(cmd);
        assert!(status.success(), "etcdctl {args:?}: {stderr}");
    };
    etcdctl(&["put", "/lockd/locks/x", &record("a")]);
    etcdctl(&["put", "/lockd/locks/y", &record("b")]);
    let mut lockd = Lockd::start(
        dir.path(),
        &[
            "--backend",
            "etcd",
            "--etcd-endpoints",
            &cluster.endpoints(),
            "--etcd-leader-ttl-ms",
            e2e::etcd::LEADER_TTL_MS,
        ],
    );
    lockd.wait_events(
        "the state in etcd is inconsistent; giving the leadership up",
        2,
        |e| {
            e["error"]
                .as_str()
                .is_some_and(|m| m.contains("two stored leases with token 7"))
        },
    );
    assert!(lockd.process.running(), "lockd exited over damaged data");
    etcdctl(&["del", "/lockd/locks/y"]);
    lockd.wait_event(LEADING, |e| e["leases"] == 1);
}
