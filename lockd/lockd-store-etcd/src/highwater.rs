//! lockd's own high-water of tokens in etcd mode, kept in its data directory.
//!
//! Tokens are etcd revisions plus an offset. etcd's revisions have gone backwards after
//! crashes in etcd's own history (and a cluster restored from an old backup does the same), so
//! every lockd instance remembers the highest token it has answered, in a file it syncs every
//! 100 ms, and never answers a token at or below its *floor*: the file's value at start-up,
//! raised at run time to the highest token answered more than `lag` ago. (A grant answered
//! later than that was committed after every token answered before the lag began, so only a
//! revision that went backwards can fall below the floor; grants still in flight may
//! legitimately complete out of order and are not compared.) When a token would fall below the
//! floor, the grant is undone and the cluster's offset raised past it by [`MARGIN`], which
//! also covers tokens answered in the last 100 ms before a crash and by other instances.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How far past the floor the offset is raised when etcd is found behind.
pub const MARGIN: u64 = 1 << 32;

/// How often the high-water is written down.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

pub const FILE: &str = "etcd-token-high-water";

pub struct HighWater {
    path: PathBuf,
    lag: Duration,
    state: Mutex<State>,
}

struct State {
    floor: u64,
    answered: u64,
    persisted: u64,
    history: VecDeque<(Instant, u64)>,
}

impl HighWater {
    /// Reads the file in `dir` (creating the directory if needed; no file = 0).
    pub fn open(dir: &Path, lag: Duration) -> std::io::Result<HighWater> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE);
        let value = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse::<u64>().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} does not hold a token ({e}): {text:?}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(HighWater {
            path,
            lag,
            state: Mutex::new(State {
                floor: value,
                answered: value,
                persisted: value,
                history: VecDeque::new(),
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tokens must be above this.
    pub fn floor(&self) -> u64 {
        self.state().floor
    }

    pub fn answered(&self, token: u64) {
        let mut s = self.state();
        s.answered = s.answered.max(token);
    }

    /// Raises the floor from the history and writes the high-water down if it rose.
    pub fn tick(&self) -> std::io::Result<()> {
        let now = Instant::now();
        let write = {
            let mut s = self.state();
            let answered = s.answered;
            s.history.push_back((now, answered));
            while let Some(&(at, value)) = s.history.front() {
                if now.duration_since(at) < self.lag {
                    break;
                }
                s.floor = s.floor.max(value);
                s.history.pop_front();
            }
            (answered > s.persisted).then_some(answered)
        };
        if let Some(value) = write {
            let tmp = self.path.with_extension("tmp");
            let mut f = std::fs::File::create(&tmp)?;
            writeln!(f, "{value}")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            self.state().persisted = value;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_floor_follows_answers_after_the_lag_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let hw = HighWater::open(dir.path(), Duration::from_secs(1)).unwrap();
        assert_eq!(hw.floor(), 0);
        hw.answered(40);
        hw.tick().unwrap();
        // Within the lag a token below 40 may still be answered (grants complete out of order).
        assert_eq!(hw.floor(), 0);
        tokio::time::advance(Duration::from_millis(1500)).await;
        hw.tick().unwrap();
        assert_eq!(hw.floor(), 40);
        // Written down: a new instance starts with it as its floor.
        let again = HighWater::open(dir.path(), Duration::from_secs(1)).unwrap();
        assert_eq!(again.floor(), 40);
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "forty\n").unwrap();
        let Err(e) = HighWater::open(dir.path(), Duration::from_secs(1)) else {
            panic!("a damaged file was accepted");
        };
        assert!(e.to_string().contains(FILE), "{e}");
    }
}
