//! The client SDK against a real lockd: renewal, the lost signal, retries through an outage.

use std::time::Duration;

use e2e::{Lockd, free_loopback_addr, output};
use lockd_client::{AcquireOptions, Acquired, AcquiredAll, Client, LostReason, Mode};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

fn opts(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions {
        ttl: Some(Duration::from_millis(ttl_ms)),
        ..AcquireOptions::default()
    }
}

#[test]
fn the_guard_keeps_the_lease_alive_past_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let Acquired::Granted(guard) = rt.block_on(client.acquire("kept", opts(3_000))).unwrap() else {
        panic!("a free resource is granted")
    };
    // Renewals every ttl/3: by the fourth, the lease has outlived its TTL.
    lockd.wait_events("renewed", 4, |e| e["resource"] == "kept");
    assert!(!guard.is_lost());
    let d = rt.block_on(client.describe("kept")).unwrap();
    assert_eq!(
        d.token,
        Some(guard.token()),
        "still held by the guard's lease"
    );
    assert!(
        rt.block_on(guard.release()).unwrap(),
        "the guard released its own lease"
    );
    assert!(!rt.block_on(client.describe("kept")).unwrap().held);
}

#[test]
fn lost_fires_when_lockd_says_the_lease_is_not_current() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let Acquired::Granted(guard) = rt.block_on(client.acquire("revoked", opts(600))).unwrap()
    else {
        panic!()
    };
    // Someone with the lease id ends the lease behind the guard's back.
    let mut release = lockd.lockctl();
    release.args(["release", "revoked", guard.lease_id()]);
    assert!(output(release).0.success());
    let reason = rt
        .block_on(async { tokio::time::timeout(e2e::PATIENCE, guard.lost()).await })
        .unwrap();
    assert!(
        matches!(reason, LostReason::NotCurrent(ref m) if m.contains("not the current lease")),
        "{reason:?}"
    );
    assert!(guard.is_lost());
}

#[test]
fn acquire_retries_while_lockd_is_down_and_succeeds_once_it_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_loopback_addr();
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&format!("http://{addr}")).unwrap();
    let pending =
        rt.spawn(async move { client.acquire("patient", AcquireOptions::default()).await });
    // The call is already failing and retrying; lockd comes up on the address it uses.
    let lockd = Lockd::start_on(dir.path(), &addr, &[]);
    let acquired = rt
        .block_on(pending)
        .unwrap()
        .expect("granted once lockd is up");
    let Acquired::Granted(guard) = acquired else {
        panic!("a free resource is granted")
    };
    let granted = lockd.wait_event("granted", |e| e["resource"] == "patient");
    assert_eq!(
        granted["token"].as_str().map(str::to_string),
        Some(guard.token().to_string())
    );
}

#[test]
fn dropping_a_guard_releases_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let Acquired::Granted(guard) = rt
        .block_on(client.acquire("dropped", opts(60_000)))
        .unwrap()
    else {
        panic!()
    };
    drop(guard);
    lockd.wait_event("released", |e| e["resource"] == "dropped");
    assert!(!rt.block_on(client.describe("dropped")).unwrap().held);
}

#[test]
fn a_cancelled_call_leaves_the_queue_and_full_queues_are_refused() {
    use lockd_proto::v1::AcquireRequest;
    use lockd_proto::v1::lock_service_client::LockServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &["--waiters-per-resource-max", "1"]);
    let rt = runtime();
    let acquire = |wait_ms| AcquireRequest {
        resource: "busy".into(),
        ttl_ms: 60_000,
        wait_timeout_ms: wait_ms,
        ..Default::default()
    };
    let mut client = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    rt.block_on(client.acquire(acquire(0))).unwrap();
    let mut waiting = client.clone();
    let call = rt.spawn(async move { waiting.acquire(acquire(60_000)).await });
    let queued = lockd.wait_event("queued", |e| e["resource"] == "busy");

    // The queue holds one waiter: the next is refused at once, with the stable code.
    let full = rt
        .block_on(client.acquire(acquire(60_000)))
        .expect_err("queue full");
    assert_eq!(full.code(), tonic::Code::ResourceExhausted, "{full}");
    assert_eq!(full.metadata().get("lockd-error").unwrap(), "queue_full");
    assert!(
        full.message().contains("wait queue of busy is full"),
        "{}",
        full.message()
    );

    // Cancelling the call (the connection stays open) takes the waiter out of the queue.
    call.abort();
    lockd.wait_event("waiter left: call cancelled or client disconnected", |e| {
        e["waiter"] == queued["waiter"]
    });
    let describe = lockd_proto::v1::DescribeRequest {
        resource: "busy".into(),
    };
    assert_eq!(
        rt.block_on(client.describe(describe))
            .unwrap()
            .into_inner()
            .waiters,
        0
    );
}

#[test]
fn a_reentrant_guard_nests_and_the_lease_ends_with_the_last_hold() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let owned = AcquireOptions {
        owner: Some(lockd_client::new_owner_id()),
        ..opts(30_000)
    };
    let Acquired::Granted(outer) = rt.block_on(client.acquire("nested", owned)).unwrap() else {
        panic!("a free resource is granted")
    };
    assert_eq!(outer.holds(), 1);
    let inner = rt.block_on(outer.reenter()).expect("the owner re-enters");
    assert_eq!(
        (inner.lease_id(), inner.token(), inner.holds()),
        (outer.lease_id(), outer.token(), 2),
        "the same lease and token, one more hold"
    );
    let deeper = rt.block_on(inner.reenter()).expect("nested again");
    assert_eq!(deeper.holds(), 3);
    let holds = |c: &Client| rt.block_on(c.describe("nested")).unwrap().holds;
    assert_eq!(holds(&client), Some(3));
    assert!(rt.block_on(deeper.release()).unwrap());
    drop(inner);
    // The dropped guard releases its hold in the background: wait for lockd to say so.
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    while holds(&client) != Some(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the inner hold was not released"
        );
        std::thread::yield_now();
    }
    assert!(!outer.is_lost(), "the outer hold goes on");
    assert!(rt.block_on(outer.release()).unwrap());
    assert!(!rt.block_on(client.describe("nested")).unwrap().held);

    // A lease without an owner cannot be nested; an ended one cannot be re-entered.
    let Acquired::Granted(plain) = rt.block_on(client.acquire("plain", opts(30_000))).unwrap()
    else {
        panic!("a free resource is granted")
    };
    let err = rt.block_on(plain.reenter()).expect_err("no owner");
    assert!(
        matches!(err, lockd_client::ClientError::InvalidArgument(ref m) if m.contains("no owner")),
        "{err}"
    );
    let owned = AcquireOptions {
        owner: Some("job-7".to_string()),
        ..opts(30_000)
    };
    let Acquired::Granted(gone) = rt.block_on(client.acquire("gone", owned)).unwrap() else {
        panic!("a free resource is granted")
    };
    assert!(
        rt.block_on(client.release("gone", gone.lease_id()))
            .unwrap()
    );
    let err = rt.block_on(gone.reenter()).expect_err("an ended lease");
    assert!(
        matches!(err, lockd_client::ClientError::LeaseNotCurrent(_)),
        "{err}"
    );
    assert!(
        !rt.block_on(client.describe("gone")).unwrap().held,
        "the new lease a failed re-entry got was released"
    );
}

/// Issue 19: the ordered helper takes a set in sorted order, so two callers naming it in
/// opposite orders queue behind each other instead of deadlocking; a member it cannot take in
/// time gives back what it took.
#[test]
fn ordered_sets_never_deadlock_and_a_failed_one_gives_back_what_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let taken = |r: Result<AcquiredAll, lockd_client::ClientError>| match r.unwrap() {
        AcquiredAll::Granted(guards) => guards,
        AcquiredAll::NotGranted { resource, why } => panic!("{resource} not granted: {why}"),
    };
    let first = taken(rt.block_on(client.acquire_ordered(&["set/y", "set/x"], opts(60_000))));
    let names: Vec<&str> = first.iter().map(|g| g.resource()).collect();
    assert_eq!(names, ["set/x", "set/y"], "taken in sorted order");
    let other = client.clone();
    let waiting = rt.spawn(async move {
        let wait = AcquireOptions {
            wait: Duration::from_secs(60),
            ..opts(60_000)
        };
        other.acquire_ordered(&["set/x", "set/y"], wait).await
    });
    lockd.wait_event("queued", |e| e["resource"] == "set/x");
    assert_eq!(
        rt.block_on(client.describe("set/y")).unwrap().waiters,
        0,
        "the second caller waits for the first lock, holding nothing"
    );
    let tokens: Vec<u64> = first.iter().map(|g| g.token()).collect();
    for g in first.into_iter().rev() {
        assert!(rt.block_on(g.release()).unwrap());
    }
    let second = taken(rt.block_on(waiting).unwrap());
    assert!(second[0].token() > tokens[1] && second[1].token() > second[0].token());

    // set/z is held: an ordered set taking set/a first gives it back when set/z is not granted.
    let held = taken(rt.block_on(client.acquire_ordered(&["set/z"], opts(60_000))));
    match rt
        .block_on(client.acquire_ordered(&["set/z", "set/a"], opts(60_000)))
        .unwrap()
    {
        AcquiredAll::NotGranted { resource, why } => {
            assert_eq!(resource, "set/z");
            assert_eq!(why.token, Some(held[0].token()));
        }
        AcquiredAll::Granted(_) => panic!("set/z is held"),
    }
    assert!(
        !rt.block_on(client.describe("set/a")).unwrap().held,
        "set/a was given back"
    );
    drop((second, held));
}

/// Issue 19: the SDK's AcquireAll: all or none, and with a wait it asks again until the set is
/// free (lockd never queues a set).
#[test]
fn acquire_all_takes_a_set_whole_and_asks_again_within_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let Acquired::Granted(q) = rt.block_on(client.acquire("all/q", opts(60_000))).unwrap() else {
        panic!("a free resource is granted")
    };
    match rt
        .block_on(client.acquire_all(&["all/p", "all/q"], opts(60_000)))
        .unwrap()
    {
        AcquiredAll::NotGranted { resource, why } => {
            assert_eq!((resource.as_str(), why.token), ("all/q", Some(q.token())));
        }
        AcquiredAll::Granted(_) => panic!("all/q is held"),
    }
    assert!(
        !rt.block_on(client.describe("all/p")).unwrap().held,
        "nothing of the set is held"
    );
    let other = client.clone();
    let waiting = rt.spawn(async move {
        let wait = AcquireOptions {
            wait: Duration::from_secs(60),
            ..opts(60_000)
        };
        other.acquire_all(&["all/p", "all/q"], wait).await
    });
    // Its first try was busy (the one above was too).
    lockd.wait_events("set busy", 2, |e| e["resource"] == "all/q");
    assert!(rt.block_on(q.release()).unwrap());
    let AcquiredAll::Granted(set) = rt.block_on(waiting).unwrap().unwrap() else {
        panic!("the set is granted once all/q is free")
    };
    let names: Vec<&str> = set.iter().map(|g| g.resource()).collect();
    assert_eq!(names, ["all/p", "all/q"], "in the order asked");
    for r in ["all/p", "all/q"] {
        assert!(rt.block_on(client.describe(r)).unwrap().held);
    }
    let err = rt
        .block_on(client.acquire_all(
            &["all/r"],
            AcquireOptions {
                owner: Some("o".into()),
                ..opts(60_000)
            },
        ))
        .expect_err("a set takes no owner");
    assert!(err.to_string().contains("not reentrant"), "{err}");
}

/// One worker's side of a history recorded by several: its events, in one shared list.
#[derive(Clone)]
struct Recorder {
    me: String,
    history: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Recorder {
    fn record(&self, kind: &str, f: &str, resource: &str, extra: serde_json::Value) {
        let e = e2e::history_event(kind, &self.me, f, resource, extra);
        self.history.lock().unwrap().push(e.to_string());
    }
}

/// Runs `workers` tasks against a fresh lockd, each `work(client, its recorder)`, and checks
/// that every one of `properties` holds on the history they recorded, as `verify` judges it.
fn judge_history<W, F>(workers: usize, work: W, properties: &[verifier::Property])
where
    W: Fn(Client, Recorder) -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let history = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let me = Recorder {
                me: format!("w{w}"),
                history: std::sync::Arc::clone(&history),
            };
            rt.spawn(work(client.clone(), me))
        })
        .collect();
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    let text = history.lock().unwrap().join("\n");
    let events = verifier::parse(text.as_bytes()).unwrap();
    let report = verifier::check(&events);
    for &p in properties {
        assert_eq!(
            report.verdict(p),
            &verifier::check::Verdict::Holds,
            "{}: {report}",
            p.name()
        );
    }
}

/// Issue 19: clients of one semaphore of 2 through the SDK, each taking and giving back a
/// permit in turn (waiting in lockd's queue when both are held), record a history; `verify`'s
/// checker finds at most 2 permits held at any instant, each permit held once at a time, and
/// tokens rising.
#[test]
fn a_semaphores_history_keeps_its_bound_as_verify_judges_it() {
    let work = |client: Client, me: Recorder| async move {
        for _ in 0..6 {
            me.record("invoke", "acquire", "pool", serde_json::json!({}));
            let o = AcquireOptions {
                permits: 2,
                wait: Duration::from_secs(60),
                ..opts(60_000)
            };
            let Acquired::Granted(guard) = client.acquire("pool", o).await.unwrap() else {
                panic!("a permit within the wait");
            };
            // Invoked on the semaphore, granted on the permit's own name.
            let permit = guard.resource().to_string();
            let granted =
                serde_json::json!({"token": guard.token(), "ttl_ms": 60_000, "permits": 2});
            me.record("ok", "acquire", &permit, granted);
            me.record("invoke", "release", &permit, serde_json::json!({}));
            assert!(guard.release().await.unwrap());
            me.record("ok", "release", &permit, serde_json::json!({}));
        }
    };
    use verifier::Property::*;
    judge_history(5, work, &[PermitsWithinBound, SingleHolder, MonotoneTokens]);
}

/// Issue 19: readers and writers of one read-write lock through the SDK (writers sometimes
/// downgrading to read), waiting in lockd's one queue, record a history; `verify`'s checker
/// finds no reader beside a writer, each slot held once at a time, and tokens rising.
#[test]
fn a_read_write_locks_history_keeps_readers_from_writers_as_verify_judges_it() {
    let work = |client: Client, me: Recorder| async move {
        let granted = |guard: &lockd_client::LockGuard, mode: &str| serde_json::json!({"token": guard.token(), "ttl_ms": 60_000, "mode": mode});
        // Two writers in six workers; every third round of a writer downgrades.
        let writer = me.me.ends_with('0') || me.me.ends_with('3');
        for round in 0..6 {
            let (mode, name) = match writer {
                true => (Mode::Write, "write"),
                false => (Mode::Read, "read"),
            };
            me.record(
                "invoke",
                "acquire",
                "doc",
                serde_json::json!({"mode": name}),
            );
            let o = AcquireOptions {
                mode,
                wait: Duration::from_secs(60),
                ..opts(60_000)
            };
            let Acquired::Granted(mut guard) = client.acquire("doc", o).await.unwrap() else {
                panic!("the lock within the wait");
            };
            me.record("ok", "acquire", guard.resource(), granted(&guard, name));
            if writer && round % 3 == 2 {
                // The write lease ends and a read lease starts in one step: recorded as the
                // writer's release and a reader's acquire.
                me.record("invoke", "release", "doc", serde_json::json!({}));
                me.record(
                    "invoke",
                    "acquire",
                    "doc",
                    serde_json::json!({"mode": "read"}),
                );
                guard = guard.downgrade().await.unwrap();
                me.record("ok", "release", "doc", serde_json::json!({}));
                me.record("ok", "acquire", guard.resource(), granted(&guard, "read"));
            }
            let resource = guard.resource().to_string();
            me.record("invoke", "release", &resource, serde_json::json!({}));
            assert!(guard.release().await.unwrap());
            me.record("ok", "release", &resource, serde_json::json!({}));
        }
    };
    use verifier::Property::*;
    judge_history(
        6,
        work,
        &[ReadersExcludeWriters, SingleHolder, MonotoneTokens],
    );
}

/// A waiting acquire dropped just as lockd grants it (found in the other SDKs by an outside
/// breaker): the answer is lost with the future, and without a clean-up the lease stays held
/// for its TTL with nobody to renew or release it. Round after round, the holder releases and
/// the waiter is dropped at once; every resource must then become free.
#[test]
fn a_wait_dropped_as_it_is_granted_leaves_nothing_held() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = runtime();
    let _in_runtime = rt.enter();
    let client = Client::connect(&lockd.endpoint).unwrap();
    let names: Vec<String> = (0..20).map(|i| format!("dropped-{i}")).collect();
    rt.block_on(async {
        for name in &names {
            let Acquired::Granted(a) = client.acquire(name, opts(30_000)).await.unwrap() else {
                panic!("a free resource is granted")
            };
            let waiter = {
                let (c, name) = (client.clone(), name.clone());
                let o = AcquireOptions {
                    wait: Duration::from_secs(60),
                    ..opts(30_000)
                };
                tokio::spawn(async move { c.acquire(&name, o).await })
            };
            while client.describe(name).await.unwrap().waiters != 1 {
                tokio::task::yield_now().await;
            }
            let release = tokio::spawn(a.release());
            tokio::task::yield_now().await;
            waiter.abort();
            release.await.unwrap().unwrap();
            // Granted before the abort took: a guard the caller holds, released here.
            if let Ok(Ok(Acquired::Granted(g))) = waiter.await {
                g.release().await.unwrap();
            }
        }
        for name in &names {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while client.describe(name).await.unwrap().held {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{name} stayed held: a dropped acquire's grant was left behind"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
}
