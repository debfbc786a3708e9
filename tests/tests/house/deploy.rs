//! `deploy/`: every example configuration is accepted by its binary as written (so the
//! examples cannot rot), the systemd units verify and keep their hardening, and the alert
//! rules pass `promtool check rules` and their own `promtool test rules`.

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

#[test]
fn the_alert_rules_are_valid_and_fire_as_their_tests_say() {
    let dir = deploy().join("prometheus");
    let checked = promtool(&dir, &["check", "rules", "lockd-alerts.yml"])
        .unwrap_or_else(|e| panic!("promtool check rules: {e}"));
    assert!(checked.contains("SUCCESS: 4 rules found"), "{checked}");
    promtool(&dir, &["test", "rules", "lockd-alerts.test.yml"])
        .unwrap_or_else(|e| panic!("promtool test rules: {e}"));
    // A rule that no longer fires when it should is caught by the tests.
    let tmp = tempfile::tempdir().unwrap();
    let rules = std::fs::read_to_string(dir.join("lockd-alerts.yml")).unwrap();
    let broken = rules.replace(
        "max by (job) (lockd_leader) == 0",
        "max by (job) (lockd_leader) == 2",
    );
    assert_ne!(broken, rules);
    std::fs::write(tmp.path().join("lockd-alerts.yml"), broken).unwrap();
    std::fs::copy(
        dir.join("lockd-alerts.test.yml"),
        tmp.path().join("lockd-alerts.test.yml"),
    )
    .unwrap();
    let err = promtool(tmp.path(), &["test", "rules", "lockd-alerts.test.yml"])
        .expect_err("a broken rule fails its test");
    assert!(err.contains("LockdNoLeader"), "{err}");
}
