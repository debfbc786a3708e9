//! `deploy/`: every example configuration is accepted by its binary as written (so the
//! examples cannot rot), the systemd units verify and keep their hardening, the alert rules
//! pass `promtool check rules` and their own `promtool test rules`, and the Grafana
//! dashboard's queries are valid PromQL over documented metrics.

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::{bin, output, workspace};

fn deploy() -> PathBuf {
    workspace().join("deploy")
}

/// `BIN --config FILE --print-config`: the effective configuration, or the refusal.
fn print_config(binary: &str, file: &Path) -> Result<String, String> {
    let mut cmd = Command::new(bin(binary));
    cmd.arg("--config").arg(file).arg("--print-config");
    let (status, stdout, stderr) = output(cmd);
    if status.success() {
        Ok(stdout)
    } else {
        Err(stderr)
    }
}

/// Which binary reads each example, and a line its effective configuration must contain (so
/// that the file was read, not ignored).
const EXAMPLES: &[(&str, &str, &str)] = &[
    (
        "lockd-embedded.toml",
        "lockd",
        "data_dir = \"/var/lib/lockd\"",
    ),
    ("lockd-etcd.toml", "lockd", "backend = \"etcd\""),
    ("fence-proxy.toml", "fence-proxy", "[[http.routes]]"),
];

#[test]
fn every_example_configuration_is_accepted() {
    let dir = deploy().join("config");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    let mut listed: Vec<String> = EXAMPLES.iter().map(|(f, _, _)| f.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "every file in deploy/config is checked here");
    for (file, binary, expect) in EXAMPLES {
        let printed = print_config(binary, &dir.join(file))
            .unwrap_or_else(|e| panic!("{binary} refuses deploy/config/{file}: {e}"));
        assert!(printed.contains(expect), "{file}: {printed}");
    }
    // A fence-proxy example also has its PostgreSQL listener.
    let printed = print_config("fence-proxy", &dir.join("fence-proxy.toml")).unwrap();
    assert!(printed.contains("[[pg]]"), "{printed}");
}

/// `lockd --print-config --policy FILE` with mutual TLS (the example has identities known by
/// certificates): accepted, or the refusal.
fn check_policy(file: &Path) -> Result<String, String> {
    let tmp = tempfile::tempdir().unwrap();
    let ca = e2e::certs::Ca::new(tmp.path(), "ca");
    let pair = ca.issue(tmp.path(), "lockd", &["127.0.0.1"], false);
    let mut cmd = Command::new(bin("lockd"));
    cmd.arg("--policy")
        .arg(file)
        .arg("--tls-cert")
        .arg(&pair.cert)
        .arg("--tls-key")
        .arg(&pair.key)
        .arg("--tls-client-ca")
        .arg(&ca.pem)
        .arg("--print-config");
    let (status, stdout, stderr) = output(cmd);
    if status.success() {
        Ok(stdout)
    } else {
        Err(stderr)
    }
}

#[test]
fn the_example_policy_is_accepted_and_a_broken_one_would_be_caught() {
    let file = deploy().join("policy").join("lockd-policy.toml");
    let printed = check_policy(&file).unwrap_or_else(|e| panic!("lockd refuses it: {e}"));
    assert!(printed.contains("policy = "), "{printed}");
    let text = std::fs::read_to_string(&file).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("policy.toml");
    std::fs::write(&broken, text.replace("\"cron/\"", "\"payments/cron/\"")).unwrap();
    let err = check_policy(&broken).expect_err("overlapping prefixes");
    assert!(err.contains("one owner"), "{err}");
}

#[test]
fn a_broken_example_would_be_caught() {
    let tmp = tempfile::tempdir().unwrap();
    for (file, binary, _) in EXAMPLES {
        let text = std::fs::read_to_string(deploy().join("config").join(file)).unwrap();
        let broken = tmp.path().join(file);
        std::fs::write(&broken, format!("{text}\nno_such_setting = 1\n")).unwrap();
        let err = print_config(binary, &broken).expect_err(file);
        assert!(err.contains("no_such_setting"), "{file}: {err}");
    }
}

/// The hardening each unit promises (docs: deploy/README.md).
const HARDENING: &[&str] = &[
    "DynamicUser=yes",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "Restart=on-failure",
    "RestartPreventExitStatus=2",
];

#[test]
fn the_systemd_units_verify_and_are_hardened() {
    let analyze = Path::new("/usr/bin/systemd-analyze");
    assert!(
        analyze.is_file(),
        "systemd-analyze is missing (apt-get install systemd; `./x test` installs it)"
    );
    let tmp = tempfile::tempdir().unwrap();
    for (unit, binary, state) in [
        ("lockd.service", "lockd", "StateDirectory=lockd"),
        (
            "fence-proxy.service",
            "fence-proxy",
            "StateDirectory=fence-proxy",
        ),
    ] {
        let text = std::fs::read_to_string(deploy().join("systemd").join(unit)).unwrap();
        for key in HARDENING.iter().chain([&state]) {
            assert!(text.lines().any(|l| l.trim() == *key), "{unit} lacks {key}");
        }
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit} has no ExecStart"));
        let installed = format!("/usr/local/bin/{binary}");
        assert!(exec.starts_with(&installed), "{unit}: {exec}");
        // systemd-analyze wants the program to exist: point it at the one just built.
        let local = tmp.path().join(unit);
        std::fs::write(
            &local,
            text.replace(&installed, &bin(binary).display().to_string()),
        )
        .unwrap();
        let mut cmd = Command::new(analyze);
        cmd.arg("verify").arg(&local);
        let (status, stdout, stderr) = output(cmd);
        // Unknown keys are only warned about: any message at all fails the test.
        assert!(
            status.success() && stderr.trim().is_empty() && stdout.trim().is_empty(),
            "systemd-analyze verify {unit}: {status}\n{stdout}\n{stderr}"
        );
    }
}

/// `promtool ARGS` in `dir`: its output, or why it failed. Fails clearly without promtool.
fn promtool(dir: &Path, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("promtool");
    cmd.current_dir(dir).args(args);
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("promtool is missing ({e}): apt-get install prometheus, or run ./x test")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// `promtool check rules RULES` finds `count` rules and `promtool test rules` passes on its
/// tests (`RULES` with `.test.yml`); and each mutation `(from, to, alert)` of the rules makes the
/// tests fail, naming `alert` (so each rule's tests can catch a broken rule).
fn check_alert_rules(rules: &str, count: usize, mutations: &[(&str, &str, &str)]) {
    let dir = deploy().join("prometheus");
    let tests = rules.replace(".yml", ".test.yml");
    let checked = promtool(&dir, &["check", "rules", rules])
        .unwrap_or_else(|e| panic!("promtool check rules {rules}: {e}"));
    assert!(
        checked.contains(&format!("SUCCESS: {count} rules found")),
        "{checked}"
    );
    promtool(&dir, &["test", "rules", &tests])
        .unwrap_or_else(|e| panic!("promtool test rules {tests}: {e}"));
    let text = std::fs::read_to_string(dir.join(rules)).unwrap();
    for (from, to, alert) in mutations {
        let tmp = tempfile::tempdir().unwrap();
        let broken = text.replace(from, to);
        assert_ne!(broken, text, "{from} is not in {rules}");
        std::fs::write(tmp.path().join(rules), broken).unwrap();
        std::fs::copy(dir.join(&tests), tmp.path().join(&tests)).unwrap();
        let err = promtool(tmp.path(), &["test", "rules", &tests])
            .expect_err("a broken rule fails its test");
        assert!(err.contains(alert), "{from} -> {to}: {err}");
    }
}

#[test]
fn the_alert_rules_are_valid_and_fire_as_their_tests_say() {
    // A rule that no longer fires when it should is caught by the tests.
    check_alert_rules(
        "lockd-alerts.yml",
        4,
        &[(
            "max by (job) (lockd_leader) == 0",
            "max by (job) (lockd_leader) == 2",
            "LockdNoLeader",
        )],
    );
}

#[test]
fn fence_proxy_alert_rules_are_valid_and_fire_as_their_tests_say() {
    check_alert_rules(
        "fence-proxy-alerts.yml",
        3,
        &[
            // No longer fires on one stale write.
            (
                r#"{outcome="stale"}[5m])) > 0"#,
                r#"{outcome="stale"}[5m])) > 1"#,
                "FenceProxyStaleWrites",
            ),
            // No longer pages.
            ("severity: page", "severity: warn", "FenceProxyForgedTokens"),
            // Fires on a single lost connection, and before 5 minutes of errors.
            ("        for: 5m\n", "", "FenceProxyUpstreamErrors"),
        ],
    );
}

const DASHBOARD_DS: &str = "${DS_PROMETHEUS}";

/// Every panel of a dashboard, those inside (collapsed) rows included, rows left out.
fn dashboard_panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    let mut todo: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    while let Some(panel) = todo.pop() {
        if panel["type"] == "row" {
            todo.extend(panel["panels"].as_array().into_iter().flatten());
        } else {
            out.push(panel);
        }
    }
    out
}

/// An expression with Grafana's variables made concrete for promtool: `$__rate_interval`,
/// `$__range` and the like become `5m`, a template variable (`$job`, `${job}`) `.*`.
fn concrete_expr(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, used) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced.find('}').unwrap_or(braced.len());
                let name = braced[..end].split(':').next().unwrap_or_default();
                (name, (end + 2).min(after.len()))
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        out.push_str(match name {
            "" => "$",
            n if n.starts_with("__") => "5m",
            _ => ".*",
        });
        rest = &after[used..];
    }
    out.push_str(rest);
    out
}

/// The metric names of lockd and fence-proxy in an expression, a histogram's series
/// (`_bucket`, `_sum`, `_count`) by the histogram's name.
fn metric_names(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let starts = (i == 0 || !ident(bytes[i - 1]))
            && (rest.starts_with(b"lockd_") || rest.starts_with(b"fence_proxy_"));
        if !starts {
            i += 1;
            continue;
        }
        let len = rest
            .iter()
            .position(|&b| !(b.is_ascii_lowercase() || b == b'_'))
            .unwrap_or(rest.len());
        let name = std::str::from_utf8(&rest[..len]).expect("ASCII");
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.push(name.to_string());
        i += len;
    }
    names
}

/// What is wrong with a dashboard: a panel without `${DS_PROMETHEUS}` or without a query, a
/// query promtool refuses, a metric docs/operations.md does not list. Empty when all is well.
fn dashboard_problems(dashboard: &str, docs: &str) -> Vec<String> {
    let dashboard: serde_json::Value = match serde_json::from_str(dashboard) {
        Ok(d) => d,
        Err(e) => return vec![format!("not JSON: {e}")],
    };
    let mut problems = Vec::new();
    let variables = dashboard["templating"]["list"].as_array();
    let ds_variable = variables.into_iter().flatten().any(|v| {
        v["name"] == "DS_PROMETHEUS" && v["type"] == "datasource" && v["query"] == "prometheus"
    });
    if !ds_variable {
        problems.push("no datasource variable DS_PROMETHEUS of Prometheus".to_string());
    }
    let mut exprs = Vec::new();
    // The template variables' queries (`label_values(METRIC, job)`) name metrics too.
    for v in variables.into_iter().flatten() {
        let query = v["query"]["query"].as_str().or(v["query"].as_str());
        if v["type"] == "query" {
            if let Some(q) = query {
                exprs.push((format!("variable {}", v["name"]), q.to_string(), false));
            }
        }
    }
    let panels = dashboard_panels(&dashboard);
    if panels.is_empty() {
        problems.push("no panels".to_string());
    }
    for panel in panels {
        let title = format!("panel {}", panel["title"]);
        let is_ds = |ds: &serde_json::Value| ds["uid"] == DASHBOARD_DS || *ds == DASHBOARD_DS;
        if !is_ds(&panel["datasource"]) {
            problems.push(format!("{title}: datasource {}", panel["datasource"]));
        }
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if targets.is_empty() {
            problems.push(format!("{title}: no targets"));
        }
        for target in targets {
            if !target["datasource"].is_null() && !is_ds(&target["datasource"]) {
                problems.push(format!(
                    "{title}: target datasource {}",
                    target["datasource"]
                ));
            }
            match target["expr"].as_str() {
                Some(expr) if !expr.trim().is_empty() => {
                    exprs.push((title.clone(), expr.to_string(), true));
                }
                _ => problems.push(format!("{title}: a target without expr")),
            }
        }
    }
    for (whose, expr, _) in &exprs {
        for name in metric_names(expr) {
            let listed =
                docs.contains(&format!("`{name}`")) || docs.contains(&format!("`{name}{{"));
            if !listed {
                problems.push(format!("{whose}: {name} is not in docs/operations.md"));
            }
        }
    }
    // promtool parses each query as the expression of a recording rule (JSON is YAML).
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .filter(|(_, _, promql)| *promql)
        .enumerate()
        .map(|(n, (_, expr, _))| {
            serde_json::json!({"record": format!("dashboard:expr_{n}"), "expr": concrete_expr(expr)})
        })
        .collect();
    let count = rules.len();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("dashboard.yml"), file.to_string()).unwrap();
    match promtool(tmp.path(), &["check", "rules", "dashboard.yml"]) {
        Ok(out) if out.contains(&format!("SUCCESS: {count} rules found")) => {}
        Ok(out) | Err(out) => problems.push(format!("promtool check rules: {out}")),
    }
    problems
}

fn dashboard_and_docs() -> (String, String) {
    let dashboard = std::fs::read_to_string(deploy().join("grafana").join("lockd.json")).unwrap();
    let docs = std::fs::read_to_string(workspace().join("docs").join("operations.md")).unwrap();
    (dashboard, docs)
}

#[test]
fn the_dashboard_queries_documented_metrics_in_valid_promql() {
    let (text, docs) = dashboard_and_docs();
    let problems = dashboard_problems(&text, &docs);
    assert!(
        problems.is_empty(),
        "deploy/grafana/lockd.json:\n{problems:#?}"
    );
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "lockd: calls",
            "lockd: leases and store",
            "lockd: HA",
            "fence-proxy"
        ]
    );
    let panels = dashboard_panels(&dashboard);
    let mut ids: Vec<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "each panel has an id of its own");
    // The metrics docs/operations.md promises the dashboard shows.
    let all = text.as_str();
    for metric in [
        "lockd_requests_total",
        "lockd_request_duration_seconds_bucket",
        "lockd_leases",
        "lockd_waiters",
        "lockd_commit_duration_seconds_bucket",
        "lockd_leader_changes_total",
        "fence_proxy_checks_total",
        "fence_proxy_check_duration_seconds_bucket",
        "fence_proxy_mark_raises_total",
        "fence_proxy_barrier_waits_total",
        "fence_proxy_zombies_ended_total",
    ] {
        assert!(all.contains(metric), "the dashboard does not show {metric}");
    }
}

#[test]
fn a_broken_dashboard_would_be_caught() {
    let (text, docs) = dashboard_and_docs();
    let caught = |broken: &str, expect: &str| {
        assert_ne!(broken, text);
        let problems = dashboard_problems(broken, &docs);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "{expect}: {problems:#?}"
        );
    };
    // A misspelled metric.
    caught(
        &text.replace("lockd_leases{", "lockd_leasez{"),
        "lockd_leasez is not in docs/operations.md",
    );
    caught(
        &text.replace(
            "fence_proxy_zombies_ended_total",
            "fence_proxy_zombie_ended_total",
        ),
        "fence_proxy_zombie_ended_total is not in docs/operations.md",
    );
    // A query that is not PromQL.
    caught(
        &text.replacen("histogram_quantile(0.99, ", "histogram_quantile(0.99 ", 1),
        "promtool check rules",
    );
    // Not JSON.
    caught(&text.replacen('{', "", 1), "not JSON");
    // A panel with another data source, one without queries.
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut broken = dashboard.clone();
    let panel = broken["panels"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["type"] != "row")
        .unwrap();
    panel["datasource"] = serde_json::json!({"type": "prometheus", "uid": "prometheus"});
    caught(&broken.to_string(), "datasource");
    let mut broken = dashboard;
    let panel = broken["panels"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["type"] != "row")
        .unwrap();
    panel["targets"] = serde_json::json!([]);
    caught(&broken.to_string(), "no targets");
}
