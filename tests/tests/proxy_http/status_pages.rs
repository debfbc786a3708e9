//! The status pages of lockd and fence-proxy in headless Chromium (issue 18): with a real lock
//! held at lockd and a real stale write refused at the proxy, both appear; the pages fit a
//! phone's width; a linked sort orders the table.

use e2e::chromium::{dump_dom, screenshot};
use e2e::client::{body, client, send};
use e2e::upstream::Upstream;
use e2e::{FenceProxy, Lockd};
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, ReleaseRequest};
use serde_json::Value;

use crate::runtime;

/// The `#layout-check` report of the page at `url`, `width` px wide.
fn layout(url: &str, width: u32) -> (String, Value) {
    let sep = if url.contains('#') { '&' } else { '#' };
    let dom = dump_dom(&format!("{url}{sep}layout-check"), width);
    let start = dom
        .find("<pre id=\"layout-report\" hidden=\"\">")
        .unwrap_or_else(|| panic!("no layout report in\n{dom}"));
    let json = &dom[start..];
    let json = &json[json.find('>').unwrap() + 1..json.find("</pre>").unwrap()];
    let report: Value = serde_json::from_str(&json.replace("&quot;", "\"").replace("&amp;", "&"))
        .unwrap_or_else(|e| panic!("{e}: {json}"));
    (dom, report)
}

/// A phone's width: nothing but the tables' own scrolling boxes may be wider, and the type is
/// large enough to read.
fn fits_a_phone(report: &Value) {
    assert!(
        report["page"].as_f64().unwrap() <= report["viewport"].as_f64().unwrap(),
        "the page is wider than the phone: {report}"
    );
    assert!(report["font"].as_f64().unwrap() >= 16.0, "{report}");
}

fn first_column(report: &Value, table: &str) -> Vec<String> {
    report["tables"][table]["first"]
        .as_array()
        .unwrap_or_else(|| panic!("no table {table}: {report}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_status_pages_show_a_held_lock_and_a_refused_stale_write() {
    let dir = tempfile::tempdir().unwrap();
    let lockd = Lockd::start(
        &dir.path().join("lockd"),
        &["--admin-listen", "127.0.0.1:0"],
    );
    let lockd_admin = lockd.admin();
    let upstream = Upstream::start();
    let config = format!(
        "admin_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n",
        dir.path().join("marks").display(),
        upstream.url()
    );
    let px = FenceProxy::start(dir.path(), &config, 1);
    let proxy_admin = px.admin();
    let rt = runtime();
    let api = rt
        .block_on(LockServiceClient::connect(lockd.endpoint.clone()))
        .unwrap();
    let grant = |resource: &str, holder: &str| {
        let answer = rt
            .block_on(api.clone().acquire(AcquireRequest {
                resource: resource.into(),
                request_id: String::new(),
                ttl_ms: 600_000,
                wait_timeout_ms: 0,
                holder: holder.into(),
                owner: Default::default(),
                permits: 0,
                mode: 0,
                downgrade_lease_id: String::new(),
            }))
            .unwrap()
            .into_inner();
        match answer.outcome {
            Some(Outcome::Granted(l)) => l,
            other => panic!("granted, not {other:?}"),
        }
    };
    // A held the lock and lost it; B holds it now, and two more locks are held after it.
    let a = grant("inventory:sku-1", "worker-a");
    rt.block_on(api.clone().release(ReleaseRequest {
        resource: "inventory:sku-1".into(),
        lease_id: a.lease_id.clone(),
    }))
    .unwrap();
    let b = grant("inventory:sku-1", "worker-b");
    grant("inventory:sku-2", "worker-c");
    grant("inventory:sku-3", "worker-d");
    let c = client();
    let write = |token: u64| {
        rt.block_on(send(
            &c,
            "PUT",
            &format!("{}/stock/sku-1", px.urls[0]),
            &[
                ("fencing-resource", "inventory:sku-1"),
                ("fencing-token", &token.to_string()),
            ],
            body("n=9"),
        ))
        .status
    };
    assert_eq!(write(b.token), 200);
    assert_eq!(write(a.token), 409, "A's write with its old token");

    // lockd's page, on a phone: B's lock with its holder and token.
    let url = format!("http://{lockd_admin}/?refresh=0");
    let (dom, report) = layout(&url, 390);
    fits_a_phone(&report);
    assert_eq!(
        first_column(&report, "held"),
        ["inventory:sku-1", "inventory:sku-2", "inventory:sku-3"],
        "the longest hold first"
    );
    assert!(dom.contains("worker-b"), "{dom}");
    assert!(dom.contains(&format!(">{}<", b.token)), "{dom}");
    // Sorted by token, highest first, from the URL.
    let (_, sorted) = layout(&format!("{url}#sort=held:2:descending"), 1200);
    assert_eq!(
        first_column(&sorted, "held"),
        ["inventory:sku-3", "inventory:sku-2", "inventory:sku-1"]
    );
    screenshot(&url, 390, 1600, &dir.path().join("lockd.png"));

    // fence-proxy's page: the mark B's token raised, and A's refused write.
    let url = format!("http://{proxy_admin}/?refresh=0");
    let (dom, report) = layout(&url, 390);
    fits_a_phone(&report);
    assert_eq!(first_column(&report, "marks"), ["inventory:sku-1"]);
    assert_eq!(first_column(&report, "refusals").len(), 1, "{report}");
    let refusals = &dom[dom.find("id=\"refusals\"").unwrap()..];
    assert!(refusals.contains(">stale<"), "{refusals}");
    assert!(refusals.contains(&format!(">{}<", a.token)), "{refusals}");
    assert!(refusals.contains("PUT /stock/sku-1"), "{refusals}");
    assert!(dom.contains("stale write(s) refused"), "the banner: {dom}");
    screenshot(&url, 390, 1600, &dir.path().join("fence-proxy.png"));
    if let Ok(keep) = std::env::var("STATUS_PAGES_KEEP") {
        for name in ["lockd.png", "fence-proxy.png"] {
            std::fs::copy(
                dir.path().join(name),
                std::path::Path::new(&keep).join(name),
            )
            .unwrap();
        }
    }
}
