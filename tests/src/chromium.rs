//! Headless Chromium, for tests of what a page looks like: its DOM after its scripts ran, and
//! a screenshot. Each call starts a fresh browser with a throwaway profile, bounded in time:
//! one that has not finished within [`PATIENCE`](crate::PATIENCE) is killed (with everything
//! it started) and the test fails.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::channel;

use crate::PATIENCE;

/// The `chromium` on PATH, or a failed test saying how to get one.
fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("chromium is missing: apt-get install chromium, or run ./x deps test")
    })
}

/// A `file://` URL for a local file.
pub fn file_url(path: &Path) -> String {
    let path = path
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    format!("file://{}", path.display())
}

/// Runs headless Chromium on `url` in a `width` x `height` window with `extra` arguments;
/// returns what it printed, after checking that it succeeded.
fn run(url: &str, width: u32, height: u32, extra: &[String]) -> Output {
    let profile = tempfile::tempdir().expect("a profile directory");
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        // Scripts run and the page settles in virtual time: no waiting on the wall clock.
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--window-size={width},{height}"))
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(extra)
    .arg(url)
    // Its own process group: the browser's helpers are killed along with it.
    .process_group(0)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let pid = child.id() as i32;
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(PATIENCE) {
        Ok(out) => out.unwrap_or_else(|e| panic!("waiting for chromium: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the process group of the child we started (still running:
            // it has not been reaped, so its pid and group are still its own).
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
            panic!("chromium did not finish {url} within {PATIENCE:?}: killed");
        }
    };
    assert!(
        out.status.success(),
        "chromium on {url} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The page's DOM, serialised after its scripts ran, in a window `width` px wide.
pub fn dump_dom(url: &str, width: u32) -> String {
    let out = run(url, width, 900, &["--dump-dom".to_string()]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A PNG of the page's first `width` x `height` px at `path`; checked to be there and not
/// empty.
pub fn screenshot(url: &str, width: u32, height: u32, path: &Path) {
    let out = run(
        url,
        width,
        height,
        &[format!("--screenshot={}", path.display())],
    );
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    assert!(
        len > 0,
        "chromium wrote no screenshot of {url} to {}:\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
