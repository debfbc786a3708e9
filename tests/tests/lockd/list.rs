//! Listing held locks: the List RPC a page at a time (each lock exactly once across pages,
//! bad page requests refused), and `lockctl list` and `lockctl top` over 10,000 held locks.

use std::collections::HashSet;

use e2e::{Lockd, output};
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, ListRequest};

use crate::json;

fn req(resource: &str, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.to_string(),
        request_id: String::new(),
        ttl_ms: 600_000,
        wait_timeout_ms: wait_ms,
        holder: format!("holder-of-{resource}"),
        owner: Default::default(),
        permits: 0,
        mode: 0,
        downgrade_lease_id: String::new(),
    }
}

#[test]
fn ten_thousand_held_locks_are_listed_a_page_at_a_time_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(dir.path(), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..16u32 {
            let mut api = api.clone();
            tasks.spawn(async move {
                for n in (worker..10_000).step_by(16) {
                    api.acquire(req(&format!("job/{n:05}"), 0)).await.unwrap();
                }
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
    });
    // Waiters: 3 on job/00007, 2 on job/00042, 1 on job/09999.
    let mut waiting = Vec::new();
    for (resource, n) in [("job/00007", 3), ("job/00042", 2), ("job/09999", 1)] {
        for _ in 0..n {
            let mut api = api.clone();
            let r = req(resource, 60_000);
            waiting.push(rt.spawn(async move { api.acquire(r).await }));
        }
    }

    let mut page_api = api.clone();
    let mut list = |page_size: u32, page_token: &str, prefix: &str| {
        rt.block_on(page_api.list(ListRequest {
            prefix: prefix.to_string(),
            page_size,
            page_token: page_token.to_string(),
        }))
    };
    // Raw pages of 500: every lock once, no page above its size.
    let (mut seen, mut pages, mut token) = (HashSet::new(), 0, String::new());
    loop {
        let page = list(500, &token, "").unwrap().into_inner();
        pages += 1;
        assert!(page.locks.len() <= 500);
        for l in &page.locks {
            assert!(
                seen.insert(l.resource.clone()),
                "{} listed twice",
                l.resource
            );
            assert_eq!(l.holder, format!("holder-of-{}", l.resource));
            assert!(l.token > 0 && l.ttl_ms == 600_000);
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen.len(), 10_000);
    assert!(pages >= 20, "{pages} pages");
    // A prefix narrows it (a page may come back short, or empty, with a token to go on).
    let (mut found, mut token) = (Vec::new(), String::new());
    loop {
        let page = list(1000, &token, "job/0999").unwrap().into_inner();
        found.extend(page.locks.into_iter().map(|l| l.resource));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    found.sort();
    let expected: Vec<String> = (9990..10_000).map(|n| format!("job/{n:05}")).collect();
    assert_eq!(found, expected);
    // Bad page requests say what is wrong.
    for (size, token, prefix, expected) in [
        (1001, "", "", "above the maximum 1000"),
        (10, "garbage", "", "page_token is not one lockd gave"),
        (10, "", "a b", "prefix"),
    ] {
        let s = list(size, token, prefix).unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains(expected), "{s:?}");
    }
    // Wait for the queued waiters to be counted before lockctl looks.
    let deadline = std::time::Instant::now() + e2e::PATIENCE;
    while list(1000, "", "job/00007")
        .unwrap()
        .into_inner()
        .locks
        .first()
        .map(|l| l.waiters)
        != Some(3)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiters did not queue"
        );
    }

    // lockctl list: all 10,000, longest held first.
    let mut cmd = lockd.lockctl();
    cmd.args(["--json", "list", "--page-size", "700"]);
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{err}");
    let locks = json(&out)["locks"].as_array().unwrap().clone();
    assert_eq!(locks.len(), 10_000);
    let held: Vec<u64> = locks
        .iter()
        .map(|l| l["held_for_ms"].as_u64().unwrap())
        .collect();
    assert!(held.windows(2).all(|w| w[0] >= w[1]), "longest held first");
    // lockctl top: the most waited-for first.
    let mut cmd = lockd.lockctl();
    cmd.args(["--json", "top", "-n", "3"]);
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{err}");
    let top: Vec<(String, u64)> = json(&out)["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["resource"].as_str().unwrap().to_string(),
                l["waiters"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        top,
        vec![
            ("job/00007".to_string(), 3),
            ("job/00042".to_string(), 2),
            ("job/09999".to_string(), 1)
        ]
    );
    // And as a table for people.
    let mut cmd = lockd.lockctl();
    cmd.args(["top", "-n", "1"]);
    let (status, out, _) = output(cmd);
    assert!(status.success());
    assert!(out.lines().next().unwrap().starts_with("RESOURCE"), "{out}");
    assert!(
        out.contains("job/00007") && out.contains("holder-of-job/00007"),
        "{out}"
    );
    for w in waiting {
        w.abort();
    }
}
