//! README's demo runs to the end.

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
