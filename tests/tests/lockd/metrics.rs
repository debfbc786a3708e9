//! The admin listener: each metric moves as it should after a known sequence of calls, the
//! label cardinality stays bounded however many resources are used, promtool accepts the
//! exposition, and /healthz, /readyz and grpc.health.v1 answer.

use e2e::{Lockd, http_get, promtool, sample};
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, DescribeRequest, ReleaseRequest, RenewRequest};

fn req(resource: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.to_string(),
        request_id: String::new(),
        ttl_ms,
        wait_timeout_ms: wait_ms,
        holder: "metrics-test".to_string(),
        owner: Default::default(),
        permits: 0,
        mode: 0,
        downgrade_lease_id: String::new(),
    }
}

#[test]
fn each_metric_moves_as_the_calls_do() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &["--admin-listen", "127.0.0.1:0"]);
    let admin = lockd.admin();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut api = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    let acquire = |r: AcquireRequest| rt.block_on(api.clone().acquire(r));
    // 3 grants, 2 busy, 1 wait that times out, 1 invalid name.
    let granted =
        |o: Result<tonic::Response<lockd_proto::v1::AcquireResponse>, tonic::Status>| match o
            .unwrap()
            .into_inner()
            .outcome
        {
            Some(Outcome::Granted(l)) => l,
            other => panic!("granted, not {other:?}"),
        };
    let a = granted(acquire(req("a", 60_000, 0)));
    let b = granted(acquire(req("b", 60_000, 0)));
    let short = granted(acquire(req("short", 100, 0)));
    for _ in 0..2 {
        let o = acquire(req("a", 60_000, 0)).unwrap().into_inner().outcome;
        assert!(matches!(o, Some(Outcome::NotGranted(_))));
    }
    let o = acquire(req("b", 60_000, 100)).unwrap().into_inner().outcome;
    assert!(matches!(o, Some(Outcome::NotGranted(_))), "{o:?}");
    assert!(acquire(req("bad name", 60_000, 0)).is_err());
    // A release, a renew of a lease that is not current, a describe; the short one expires.
    let released = rt
        .block_on(api.release(ReleaseRequest {
            resource: "a".into(),
            lease_id: a.lease_id.clone(),
        }))
        .unwrap();
    assert!(released.into_inner().released);
    assert!(
        rt.block_on(api.renew(RenewRequest {
            resource: "a".into(),
            lease_id: a.lease_id.clone(),
        }))
        .is_err()
    );
    rt.block_on(api.describe(DescribeRequest {
        resource: "b".into(),
    }))
    .unwrap();
    lockd.wait_event("lease expired without renewal", |e| {
        e["resource"] == "short"
    });

    let (status, text) = http_get(&admin, "/metrics");
    assert_eq!(status, 200, "{text}");
    let count =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series}:\n{text}"));
    let calls = |method: &str, outcome: &str| {
        count(&format!(
            "lockd_requests_total{{method=\"{method}\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!(calls("acquire", "granted"), 3.0);
    assert_eq!(calls("acquire", "busy"), 2.0);
    assert_eq!(calls("acquire", "wait_timeout"), 1.0);
    assert_eq!(calls("acquire", "invalid"), 1.0);
    assert_eq!(calls("release", "released"), 1.0);
    assert_eq!(calls("renew", "not_current"), 1.0);
    assert_eq!(calls("describe", "described"), 1.0);
    assert_eq!(
        count("lockd_request_duration_seconds_count{method=\"acquire\"}"),
        7.0,
        "every answered Acquire is timed"
    );
    assert_eq!(count("lockd_lease_expiries_total"), 1.0);
    assert_eq!(
        count("lockd_lease_held_seconds_count"),
        2.0,
        "one release and one expiry"
    );
    assert_eq!(count("lockd_leases"), 1.0, "b is still held");
    assert_eq!(count("lockd_waiters"), 0.0);
    assert_eq!(count("lockd_token_high_water"), short.token as f64);
    assert!(short.token > b.token);
    assert!(count("lockd_commit_batch_ops_count") >= 1.0);
    assert!(count("lockd_commit_duration_seconds_count") >= 1.0);
    assert_eq!(
        count("lockd_resource_contention{resource=\"a\"}"),
        2.0,
        "two busy answers for a"
    );
    assert_eq!(count("lockd_resource_contention{resource=\"b\"}"), 1.0);
    let complaints = promtool(&text);
    assert!(!complaints.contains("error"), "promtool: {complaints}");

    let (status, body) = http_get(&admin, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _) = http_get(&admin, "/readyz");
    assert_eq!(status, 200);
    let (status, body) = http_get(&admin, "/nowhere");
    assert_eq!(status, 404);
    assert!(body.contains("/metrics"), "{body}");

    // The status page: the held locks, the longest hold first; the expiry; the refusal.
    let mut late = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    granted(rt.block_on(late.acquire(req("z-late", 60_000, 0))));
    let (status, page) = http_get(&admin, "/");
    assert_eq!(status, 200);
    let at = |needle: &str| {
        page.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in the status page:\n{page}"))
    };
    let held = at("<table id=\"held\"");
    let b_row = at("<td class=\"wrap\">b</td>");
    let late_row = at("<td class=\"wrap\">z-late</td>");
    assert!(held < b_row && b_row < late_row, "b was granted first");
    assert!(page[held..].contains("metrics-test"), "the holder");
    let expiries = at("<table id=\"expiries\"");
    assert!(
        page[expiries..].contains("<td class=\"wrap\">short</td>"),
        "{page}"
    );
    let refusals = at("<table id=\"refusals\"");
    assert!(page[refusals..].contains("bad name"), "{page}");
    assert!(page[refusals..].contains(">invalid<"), "{page}");
    assert!(page.contains("highest token"), "{page}");
}

/// 100,000 distinct resources, with waiters on a few hundred of them: the per-resource series
/// stay at the top 10 of each kind, and the whole exposition stays small.
#[test]
fn label_cardinality_stays_bounded_with_100000_resources() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &["--admin-listen", "127.0.0.1:0"]);
    let admin = lockd.admin();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..32u32 {
            let mut api = api.clone();
            tasks.spawn(async move {
                for i in 0..100_000u32 / 32 + 1 {
                    let n = i * 32 + worker;
                    if n >= 100_000 {
                        break;
                    }
                    let r = api.acquire(req(&format!("r-{n}"), 600_000, 0)).await;
                    r.expect("a grant");
                    // Every thousandth resource is contended too.
                    if n % 1000 == 0 {
                        api.acquire(req(&format!("r-{n}"), 600_000, 0))
                            .await
                            .unwrap();
                    }
                }
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
    });
    // Waiters on 300 resources, each queue a different length.
    let mut waiting = Vec::new();
    for q in 0..300u32 {
        for _ in 0..(1 + q % 5) {
            let mut api = api.clone();
            let r = req(&format!("r-{q}"), 600_000, 60_000);
            waiting.push(rt.spawn(async move { api.acquire(r).await }));
        }
    }
    let expected: u32 = (0..300u32).map(|q| 1 + q % 5).sum();
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    let text = loop {
        let (_, text) = http_get(&admin, "/metrics");
        let now = sample(&text, "lockd_waiters");
        if now == Some(f64::from(expected)) {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{now:?} waiters, expected {expected}"
        );
    };
    let per_resource = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{resource=")))
            .count()
    };
    assert_eq!(per_resource("lockd_resource_waiters"), 10, "{text}");
    assert_eq!(per_resource("lockd_resource_contention"), 10);
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    assert!(series < 200, "{series} series");
    assert_eq!(sample(&text, "lockd_leases"), Some(100_000.0));
    // The longest queues are shown: length 5 (q % 5 == 4).
    let longest = text
        .lines()
        .filter(|l| l.starts_with("lockd_resource_waiters{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap());
    assert!(longest.into_iter().all(|n| n == 5.0), "{text}");
    for w in waiting {
        w.abort();
    }
}

/// A lease renewed past `hold_warn_after_ms` is reported once: a warning naming it, and the
/// counter.
#[test]
fn a_long_hold_is_logged_once_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(
        dir.path(),
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--hold-warn-after-ms",
            "300",
        ],
    );
    let admin = lockd.admin();
    let mut cmd = lockd.lockctl();
    cmd.args([
        "acquire",
        "nightly",
        "--ttl",
        "60s",
        "--holder",
        "stuck-job",
    ]);
    let (status, _, err) = e2e::output(cmd);
    assert!(status.success(), "{err}");
    let e = lockd.wait_event(
        "lease held longer than hold_warn_after_ms (renewed all along): is its holder stuck?",
        |_| true,
    );
    assert_eq!(e["resource"], "nightly");
    assert_eq!(e["holder"], "stuck-job");
    assert!(e["held_ms"].as_u64().unwrap() >= 300, "{e}");
    let (_, text) = http_get(&admin, "/metrics");
    assert_eq!(
        sample(&text, "lockd_lease_long_holds_total"),
        Some(1.0),
        "{text}"
    );
}
