//! The audit log: a record of every type (grant, release, expiry, long hold, refusal), none
//! with a lease id in clear, and the file reopened on SIGHUP (logrotate).

use e2e::{Lockd, PATIENCE, audit_records as records_when};
use serde_json::Value;

use crate::json;

fn of_type<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["type"] == kind).collect()
}

#[test]
fn every_record_type_is_written_without_a_lease_id_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let mut lockd = Lockd::start(
        &dir.path().join("data"),
        &[
            "--audit-log",
            log.to_str().unwrap(),
            "--hold-warn-after-ms",
            "200",
        ],
    );
    let endpoint = lockd.endpoint.clone();
    let ctl = |args: &[&str]| {
        let mut cmd = std::process::Command::new(e2e::bin("lockctl"));
        cmd.env("LOCKD_ENDPOINT", &endpoint);
        cmd.arg("--json").args(args);
        let (status, out, err) = e2e::output(cmd);
        (status.code(), out, err)
    };
    // A grant and its release; a grant that is held long and then expires; a refusal.
    let (_, out, _) = ctl(&["acquire", "a", "--ttl", "60s", "--holder", "web-1"]);
    let a = json(&out)["lease_id"].as_str().unwrap().to_string();
    assert_eq!(ctl(&["release", "a", &a]).0, Some(0));
    let (_, out, _) = ctl(&["acquire", "b", "--ttl", "1s"]);
    let b = json(&out)["lease_id"].as_str().unwrap().to_string();
    assert_eq!(
        ctl(&["renew", "a", &a]).0,
        Some(4),
        "a is no longer current"
    );
    // A set of two: a grant record for each member, which says the set's size.
    let (code, _, err) = ctl(&[
        "run", "--atomic", "--lock", "s1", "--lock", "s2", "--", "true",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let records = records_when(&log, |r| {
        ["grant", "release", "long_hold", "expiry", "refusal"]
            .iter()
            .all(|t| !of_type(r, t).is_empty())
            && of_type(r, "grant").iter().filter(|g| g["set"] == 2).count() == 2
    });
    let members: Vec<&Value> = of_type(&records, "grant")
        .into_iter()
        .filter(|g| g["set"] == 2)
        .collect();
    assert_eq!(
        (
            members[0]["resource"].as_str(),
            members[1]["resource"].as_str()
        ),
        (Some("s1"), Some("s2"))
    );
    assert!(members[1]["token"].as_u64() > members[0]["token"].as_u64());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains(&a) && !text.contains(&b),
        "a lease id in clear:\n{text}"
    );
    for r in &records {
        assert!(r["time"].as_str().unwrap().ends_with('Z'), "{r}");
        assert!(r["result"].is_string(), "{r}");
    }
    let grant = of_type(&records, "grant")[0];
    let release = of_type(&records, "release")[0];
    assert_eq!(grant["resource"], "a");
    assert_eq!(grant["holder"], "web-1");
    assert_eq!(grant["result"], "granted");
    assert!(
        grant["set"].is_null(),
        "a single grant is no set's: {grant}"
    );
    assert!(grant["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    let fingerprint = grant["lease"].as_str().unwrap();
    assert_eq!(fingerprint.len(), 16);
    assert_eq!(release["lease"], fingerprint, "one lease, one fingerprint");
    assert_eq!(
        (release["result"].as_str(), &release["token"]),
        (Some("released"), &grant["token"])
    );
    let expiry = of_type(&records, "expiry")[0];
    assert_eq!(
        (expiry["resource"].as_str(), expiry["result"].as_str()),
        (Some("b"), Some("expired"))
    );
    assert_eq!(of_type(&records, "long_hold")[0]["resource"], "b");
    let refusal = of_type(&records, "refusal")[0];
    assert_eq!(refusal["method"], "renew");
    assert_eq!(refusal["result"], "not_current");
    assert!(
        refusal["reason"]
            .as_str()
            .unwrap()
            .contains("not the current lease"),
        "{refusal}"
    );

    // logrotate: the file is moved away, SIGHUP, and new records go to a new file.
    let rotated = dir.path().join("audit.jsonl.1");
    std::fs::rename(&log, &rotated).unwrap();
    lockd.process.signal(libc::SIGHUP);
    // The reopen happens with the next record; keep granting until one lands in the new file.
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut n = 0;
    while !log.exists() {
        n += 1;
        assert_eq!(ctl(&["acquire", &format!("c{n}")]).0, Some(0));
        assert!(std::time::Instant::now() < deadline, "no new audit file");
    }
    let fresh = records_when(&log, |r| !r.is_empty());
    assert_eq!(fresh[0]["type"], "grant");
    assert!(std::fs::read_to_string(&rotated).unwrap().lines().count() >= records.len());
}
