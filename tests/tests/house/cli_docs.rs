//! The man pages and completions of each binary, as `./x man` makes them: one page per
//! subcommand, options documented, completions for three shells.

use std::process::Command;

use e2e::{bin, output};

/// Each binary and the pages it must have (its subcommands).
const BINARIES: &[(&str, &[&str], &str)] = &[
    ("lockd", &["lockd"], "--data-dir"),
    (
        "lockctl",
        &[
            "lockctl",
            "lockctl-acquire",
            "lockctl-renew",
            "lockctl-release",
            "lockctl-describe",
            "lockctl-downgrade",
            "lockctl-list",
            "lockctl-top",
            "lockctl-run",
        ],
        "--ttl",
    ),
    (
        "fence-proxy",
        &[
            "fence-proxy",
            "fence-proxy-pg",
            "fence-proxy-http",
            "fence-proxy-pg-print-schema",
            "fence-proxy-pg-print-checks",
            "fence-proxy-marks",
            "fence-proxy-marks-show",
            "fence-proxy-marks-lower",
            "fence-proxy-marks-reset",
        ],
        "--upstream",
    ),
    (
        "verify",
        &["verify", "verify-check", "verify-model"],
        "--html",
    ),
];

#[test]
fn every_binary_writes_its_man_pages_and_completions() {
    for (binary, pages, option) in BINARIES {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin(binary));
        cmd.env("CLI_DOCS_OUT", dir.path());
        let (status, stdout, stderr) = output(cmd);
        assert!(status.success(), "{binary}: {stderr}");
        let mut written: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        written.sort();
        let mut expected: Vec<String> = pages.iter().map(|p| format!("{p}.1")).collect();
        expected.extend([
            format!("{binary}.bash"),
            format!("_{binary}"),
            format!("{binary}.fish"),
        ]);
        expected.sort();
        assert_eq!(written, expected, "{binary}");
        assert_eq!(stdout.lines().count(), expected.len(), "{stdout}");
        let all_pages: String = pages
            .iter()
            .map(|p| std::fs::read_to_string(dir.path().join(format!("{p}.1"))).unwrap())
            .collect();
        // roff escapes hyphens: `\-\-data\-dir`.
        let roff = option.replace('-', "\\-");
        assert!(
            all_pages.contains(&roff),
            "{binary}: no {option} in its pages"
        );
        let bash = std::fs::read_to_string(dir.path().join(format!("{binary}.bash"))).unwrap();
        assert!(bash.contains(option), "{binary}.bash lacks {option}");
    }
}

#[test]
fn an_unwritable_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let mut cmd = Command::new(bin("verify"));
    cmd.env("CLI_DOCS_OUT", &file);
    let (status, _, stderr) = output(cmd);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("verify: cannot write the man pages and completions into"),
        "{stderr}"
    );
}
