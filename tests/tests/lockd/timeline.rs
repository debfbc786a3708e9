//! `verify`'s timeline as a browser lays it out: headless Chromium at 1400 px opens the page
//! with `#layout-check`, the page measures its own labels and writes a JSON report into
//! `#layout-report`, and the tests judge that report. No label is clipped by the SVG's box or
//! overlaps another; the zombie demo's story (B's grant, B's write, A's refused write) is
//! spread out and readable, with an axis and a break for A's pause; a fault run of thousands
//! of events lays out too; a violation is named in a banner above the picture.

use std::path::Path;
use std::process::Command;

use e2e::{bin, chromium, output};
use serde_json::Value;

const WIDTH: u32 = 1400;

/// A screenshot of `page` into `shot` (a sanity artefact), and the page's layout report.
fn layout(page: &Path, shot: &Path) -> Value {
    let url = chromium::file_url(page);
    chromium::screenshot(&url, WIDTH, 900, shot);
    let dom = chromium::dump_dom(&format!("{url}#layout-check"), WIDTH);
    let open = "<pre id=\"layout-report\">";
    let start = dom
        .find(open)
        .unwrap_or_else(|| panic!("no #layout-report in the page:\n{dom}"))
        + open.len();
    let len = dom[start..].find("</pre>").expect("the report's end");
    let text = dom[start..start + len]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&");
    assert!(
        !text.trim().is_empty(),
        "the page wrote no layout report (no script, or it failed)"
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

fn items<'a>(report: &'a Value, key: &str) -> &'a [Value] {
    report[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in the report"))
}

/// Every label inside the SVG's box and none overlapping another; returns how many there are.
fn labels_fit_and_keep_apart(report: &Value) -> usize {
    let (w, h) = (num(&report["svg"], "w"), num(&report["svg"], "h"));
    let mut labels: Vec<&Value> = items(report, "labels").iter().collect();
    for l in &labels {
        let (x, y, lw, lh) = (num(l, "x"), num(l, "y"), num(l, "w"), num(l, "h"));
        assert!(lw > 0.0 && lh > 0.0, "label {} has no box: {l}", l["text"]);
        assert!(
            x >= -0.5 && y >= -0.5 && x + lw <= w + 0.5 && y + lh <= h + 0.5,
            "label {} sticks out of the {w}x{h} SVG: {l}",
            l["text"]
        );
    }
    labels.sort_by(|a, b| num(a, "x").total_cmp(&num(b, "x")));
    for (i, a) in labels.iter().enumerate() {
        let a_right = num(a, "x") + num(a, "w");
        for b in labels[i + 1..]
            .iter()
            .take_while(|b| num(b, "x") < a_right - 0.5)
        {
            let dx = a_right.min(num(b, "x") + num(b, "w")) - num(b, "x");
            let dy = (num(a, "y") + num(a, "h")).min(num(b, "y") + num(b, "h"))
                - num(a, "y").max(num(b, "y"));
            assert!(
                dx <= 0.5 || dy <= 0.5,
                "labels {} and {} overlap:\n{a}\n{b}",
                a["text"],
                b["text"]
            );
        }
    }
    labels.len()
}

/// The one item of `key` whose data attributes include all of `want`.
fn the<'a>(report: &'a Value, key: &str, want: &[(&str, &str)]) -> &'a Value {
    let found: Vec<&Value> = items(report, key)
        .iter()
        .filter(|v| want.iter().all(|(k, x)| v["data"][*k] == *x))
        .collect();
    assert_eq!(found.len(), 1, "{key} with {want:?}: {found:?}");
    found[0]
}

/// A mark's horizontal centre.
fn centre(mark: &Value) -> f64 {
    num(mark, "x") + num(mark, "w") / 2.0
}

fn data_num(v: &Value, key: &str) -> u64 {
    v["data"][key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no data-{key} in {v}"))
}

#[test]
fn the_zombie_timeline_tells_its_story_at_1400_px() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin("zombie"));
    cmd.arg("--out").arg(dir.path());
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "{stdout}\n{stderr}");
    let report = layout(
        &dir.path().join("timeline.html"),
        &dir.path().join("zombie.png"),
    );
    labels_fit_and_keep_apart(&report);

    // The story is spread out: B's grant, B's write and A's refused write far enough apart to
    // tell, each labelled in full.
    let grant = the(&report, "marks", &[("event", "grant"), ("process", "B")]);
    let write = the(
        &report,
        "marks",
        &[("event", "write"), ("process", "B"), ("outcome", "ok")],
    );
    let refused = the(
        &report,
        "marks",
        &[("event", "write"), ("process", "A"), ("outcome", "refused")],
    );
    for (a, b, what) in [
        (grant, write, "B's grant and B's write"),
        (write, refused, "B's write and A's refused write"),
        (grant, refused, "B's grant and A's refused write"),
    ] {
        let apart = (centre(a) - centre(b)).abs();
        assert!(apart >= 60.0, "{what} are {apart:.1} px apart:\n{a}\n{b}");
    }
    let lease = the(&report, "labels", &[("event", "grant"), ("process", "B")]);
    assert!(
        lease["text"]
            .as_str()
            .is_some_and(|t| t.contains("inventory:sku-1") && t.contains("t=2")),
        "{lease}"
    );
    let refusal = the(
        &report,
        "labels",
        &[("event", "write"), ("process", "A"), ("outcome", "refused")],
    );
    assert!(
        refusal["text"]
            .as_str()
            .is_some_and(|t| t.contains("t=1") && t.contains("refused")),
        "{refusal}"
    );
    let accepted = the(
        &report,
        "labels",
        &[("event", "write"), ("process", "B"), ("outcome", "ok")],
    );
    assert!(
        accepted["text"]
            .as_str()
            .is_some_and(|t| t.contains("t=2 ok")),
        "{accepted}"
    );

    // An axis with ticks, and A's pause cut short by a break that says how long it was.
    let ticks = items(&report, "labels")
        .iter()
        .filter(|l| l["data"].get("tick").is_some())
        .count();
    assert!(ticks >= 3, "{ticks} ticks: {report}");
    let pause = the(&report, "pauses", &[("process", "A")]);
    let (from, to) = (data_num(pause, "from"), data_num(pause, "to"));
    assert!(
        items(&report, "breaks").iter().any(|b| {
            from <= data_num(b, "from") && data_num(b, "to") <= to && num(b, "w") > 0.0
        }),
        "no break within A's pause ({from}..{to}): {report}"
    );
    assert!(
        items(&report, "labels")
            .iter()
            .any(|l| l["data"].get("breakLabel").is_some()
                && l["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(" ms ") || t.contains(" s "))),
        "no break says what it elides: {report}"
    );
    assert!(report["banner"].is_null(), "a banner without a violation");
}

#[test]
fn a_fault_run_of_thousands_of_events_lays_out_without_clipped_or_overlapping_labels() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin("faults"));
    cmd.args([
        "--mode",
        "http",
        "--seed",
        "3",
        "--clients",
        "8",
        "--resources",
        "4",
        "--fault-count",
        "10",
        "--faults",
        "pause,delay,cut",
    ])
    .arg("--out")
    .arg(dir.path());
    let (status, stdout, stderr) = output(cmd);
    // The verdict is the fault tests' business; this one needs the history.
    assert!(matches!(status.code(), Some(0 | 1)), "{stdout}\n{stderr}");
    let history = dir.path().join("history.jsonl");
    let events = std::fs::read_to_string(&history).unwrap().lines().count();
    // A few thousand on a quiet machine; fewer when the machine is busy.
    assert!(events >= 1500, "only {events} events:\n{stdout}");

    let page = dir.path().join("drawn.html");
    let mut cmd = Command::new(bin("verify"));
    cmd.arg("check").arg(&history).arg("--html").arg(&page);
    let (status, out, err) = output(cmd);
    assert!(matches!(status.code(), Some(0 | 1)), "{out}\n{err}");

    let report = layout(&page, &dir.path().join("faults.png"));
    let labels = labels_fit_and_keep_apart(&report);
    let marks = items(&report, "marks").len();
    // Every grant and write is drawn: at least a quarter of the events (invokes are not).
    assert!(marks * 4 >= events, "{marks} marks for {events} events");
    assert!(labels >= 100, "{labels} labels for {marks} marks");
    // Bounded: the axis stops growing at 12,000 px.
    let (w, h) = (num(&report["svg"], "w"), num(&report["svg"], "h"));
    assert!(w <= 13_000.0 && h <= 4_000.0, "the SVG is {w}x{h}");
}

#[test]
fn a_violation_is_named_in_a_banner_above_the_picture_and_ringed() {
    // B's write with token 42 is acknowledged; A's with the older token 41 is accepted after
    // it: fencing is broken.
    let history = r#"{"type":"invoke","process":"B","time":1000000,"f":"write","resource":"r","token":42,"value":"b"}
{"type":"ok","process":"B","time":2000000,"f":"write","resource":"r","token":42,"value":"b"}
{"type":"invoke","process":"A","time":3000000,"f":"write","resource":"r","token":41,"value":"a"}
{"type":"ok","process":"A","time":4000000,"f":"write","resource":"r","token":41,"value":"a"}
{"type":"ok","process":"checker","time":5000000,"f":"read","resource":"r","value":["b","a"]}
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    std::fs::write(&path, history).unwrap();
    let page = dir.path().join("timeline.html");
    let mut cmd = Command::new(bin("verify"));
    cmd.arg("check").arg(&path).arg("--html").arg(&page);
    let (status, out, err) = output(cmd);
    assert_eq!(status.code(), Some(1), "{out}\n{err}");

    let report = layout(&page, &dir.path().join("violation.png"));
    labels_fit_and_keep_apart(&report);
    let banner = &report["banner"];
    assert!(banner.is_object(), "no banner: {report}");
    assert!(
        num(banner, "w") > 0.0 && num(banner, "h") > 0.0 && banner["visible"] == true,
        "the banner is not visible above the picture: {banner}"
    );
    let text = banner["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("VIOLATION") && text.contains("fencing") && text.contains("token 41"),
        "{text}"
    );
    // The late write is ringed and its label says so.
    let late = the(
        &report,
        "marks",
        &[("event", "write"), ("process", "A"), ("outcome", "ok")],
    );
    assert!(late["data"].get("violation").is_some(), "{late}");
    let label = the(&report, "labels", &[("event", "write"), ("process", "A")]);
    assert!(label["data"].get("violation").is_some(), "{label}");
}
