//! README's demos run to the end.

use std::process::Command;

use e2e::{bin, output};

#[test]
fn the_cron_dedup_demo_runs_to_the_end() {
    let (status, stdout, stderr) = output(Command::new(bin("cron-dedup")));
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("exited with 3 (3 = not granted)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("exited with 4 (4 = lease lost)"),
        "{stdout}"
    );
}

#[test]
fn the_zombie_demo_fences_the_paused_client_and_its_history_checks_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin("zombie"));
    cmd.arg("--out").arg(dir.path());
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "{stdout}\n{stderr}");
    // The real pause, the newer token, and the refusal, told in order.
    let pause = stdout
        .find("A is paused for real (SIGSTOP")
        .expect("the pause");
    let b = stdout
        .find("B: I hold inventory:sku-1 with token 2")
        .expect("B's grant");
    let refused = stdout.find("A: HTTP 409").expect("A refused");
    assert!(pause < b && b < refused, "{stdout}");
    assert!(
        stdout.contains("lockd signed it for inventory:sku-1: 1.demo."),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: no violation"), "{stdout}");
    // What it wrote is the history the checker judged, and the timeline shows the refusal.
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    assert!(
        history
            .lines()
            .any(|l| l.contains("\"type\":\"fail\"") && l.contains("\"a2\"")),
        "{history}"
    );
    let timeline = std::fs::read_to_string(dir.path().join("timeline.html")).unwrap();
    assert!(timeline.contains("refused token 1"), "{timeline}");
}

#[test]
fn the_zombie_demo_through_postgres_ends_the_zombies_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin("zombie"));
    cmd.arg("--postgres").arg("--out").arg(dir.path());
    let (status, stdout, stderr) = output(cmd);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("inside its open transaction"), "{stdout}");
    assert!(
        stdout.contains("lockd signed it for inventory:sku-1: 1.demo."),
        "{stdout}"
    );
    assert!(
        stdout.contains("A: COMMIT failed: FN003: fenced"),
        "{stdout}"
    );
    assert!(stdout.contains("applied writes: a1, b1"), "{stdout}");
    assert!(stdout.contains("verdict: no violation"), "{stdout}");
}
