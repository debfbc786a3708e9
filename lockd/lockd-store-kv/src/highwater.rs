//! The token high-water as this lockd instance last saw it, kept in its data directory: the
//! guard against a coordination service (etcd, ZooKeeper) that was emptied or restored from
//! an old backup.
//!
//! Tokens continue from the high-water stored in the service. If it loses data, that value
//! goes back, and a new leader would hand out tokens that were handed out before (breaking
//! invariant 2 at every fenced store). So every instance also writes down the highest token
//! it has seen: the leader the tokens it commits, followers the stored high-water they read
//! while following. The file is synced every [`FLUSH_EVERY`] (and on a clean shutdown), so it
//! may lag by that much. A new leader that finds the service below its file continues at the
//! file's value plus [`MARGIN`], which covers what the lag and the other instances saw and
//! the file could not.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// How far past this instance's high-water tokens jump when the service is found behind it.
pub const MARGIN: u64 = 1 << 32;

/// How often the high-water is written down.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

pub struct HighWater {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    seen: u64,
    persisted: u64,
}

impl HighWater {
    /// Reads the file `file` in `dir` (creating the directory if needed; no file = 0).
    pub fn open(dir: &Path, file: &str) -> std::io::Result<HighWater> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(file);
        let value = match std::fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&v| v <= fencing::FencingToken::MAX.get())
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{} does not hold a token (a decimal up to {}): {text:?}",
                            path.display(),
                            fencing::FencingToken::MAX
                        ),
                    )
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(HighWater {
            path,
            state: Mutex::new(State {
                seen: value,
                persisted: value,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The highest token seen (written down or not).
    pub fn value(&self) -> u64 {
        self.state().seen
    }

    /// Notes a token seen (granted, or read from the service); a value outside the token range is
    /// not one and is ignored.
    pub fn saw(&self, token: u64) {
        if token > fencing::FencingToken::MAX.get() {
            return;
        }
        let mut s = self.state();
        s.seen = s.seen.max(token);
    }

    /// The high-water rule of a new leader's load: tokens continue above `stored` (the
    /// service's high-water) and `floor` (the Redis mode's epoch floor; 0 elsewhere), and, if
    /// this instance has seen tokens above both (the service lost data, or was restored from
    /// a backup), above this instance's high-water plus [`MARGIN`] (logged, naming
    /// `service`). Within the token range: at its top the core answers tokens_exhausted.
    pub fn continue_at(&self, stored: u64, floor: u64, service: &str) -> u64 {
        let at_least = stored.max(floor);
        let local = self.value();
        if local <= at_least {
            return at_least;
        }
        let last = local
            .saturating_add(MARGIN)
            .min(fencing::FencingToken::MAX.get());
        tracing::error!(
            stored,
            local,
            continue_at = last,
            "{service}'s token high-water is behind tokens this lockd has seen ({service} lost data, or was restored from a backup); tokens continue above this instance's high-water plus a margin"
        );
        last
    }

    /// Writes the high-water down (atomically, synced) if it rose since the last time.
    pub fn flush(&self) -> std::io::Result<()> {
        let write = {
            let s = self.state();
            (s.seen > s.persisted).then_some(s.seen)
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
            let mut s = self.state();
            s.persisted = s.persisted.max(value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "token-high-water";

    #[test]
    fn a_leader_continues_above_the_service_the_floor_and_what_this_instance_saw() {
        let dir = tempfile::tempdir().unwrap();
        let hw = HighWater::open(dir.path(), FILE).unwrap();
        assert_eq!(hw.continue_at(7, 0, "test"), 7);
        assert_eq!(hw.continue_at(7, 1 << 40, "test"), 1 << 40);
        hw.saw(40);
        assert_eq!(
            hw.continue_at(7, 0, "test"),
            40 + MARGIN,
            "the service lost data"
        );
        assert_eq!(hw.continue_at(40, 0, "test"), 40, "the service has it all");
        assert_eq!(
            hw.continue_at(7, 1 << 40, "test"),
            1 << 40,
            "the floor is above"
        );
        hw.saw(fencing::FencingToken::MAX.get() - 1);
        assert_eq!(
            hw.continue_at(0, 0, "test"),
            fencing::FencingToken::MAX.get()
        );
    }

    #[test]
    fn the_high_water_only_rises_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let hw = HighWater::open(dir.path(), FILE).unwrap();
        assert_eq!(hw.value(), 0);
        hw.saw(40);
        hw.saw(12);
        assert_eq!(hw.value(), 40);
        // Not written down yet: a crash now loses it (the margin covers that).
        assert_eq!(HighWater::open(dir.path(), FILE).unwrap().value(), 0);
        hw.flush().unwrap();
        assert_eq!(HighWater::open(dir.path(), FILE).unwrap().value(), 40);
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "forty\n").unwrap();
        let Err(e) = HighWater::open(dir.path(), FILE) else {
            panic!("a damaged file was accepted");
        };
        assert!(e.to_string().contains(FILE), "{e}");
    }
}
