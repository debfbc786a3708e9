//! How long a leader may answer: until a deadline on the boot-time clock, moved on by each
//! answered keep-alive, or until the term is ended.
//!
//! A service that ends a leadership some time after it last heard of the leader (a ZooKeeper
//! session, a Redis key's expiry) keeps it at least until `sent + timeout` by the service's
//! clock, for a keep-alive *sent* at `sent` and answered. The leader holds its term until
//! `sent + timeout - timeout / 10` by its own clock, the margin for the two clocks' rates.
//! The clock is `CLOCK_BOOTTIME` ([`crate::boot_time`]): it keeps counting while the process
//! is stopped, so a leader that wakes up from a pause knows at once that its term may be over.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::boot_time;

pub struct Tenure {
    timeout: Duration,
    /// Boot-time nanoseconds until which the leadership surely lives.
    deadline_ns: AtomicU64,
    /// Woken when the deadline moves or the term ends (for [`Tenure::wait_in_force`]).
    changed: tokio::sync::Notify,
    over: AtomicBool,
    ended: Mutex<Option<String>>,
}

impl Tenure {
    /// A tenure of a leadership that lasts `timeout` past its last keep-alive, the first of
    /// which was sent at `sent_at` (boot time).
    pub fn new(timeout: Duration, sent_at: Duration) -> Tenure {
        let tenure = Tenure {
            timeout,
            deadline_ns: AtomicU64::new(0),
            changed: tokio::sync::Notify::new(),
            over: AtomicBool::new(false),
            ended: Mutex::new(None),
        };
        tenure.extend(sent_at);
        tenure
    }

    /// How long the leadership lasts past a keep-alive.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A keep-alive sent at `sent_at` was answered: the leadership lives until
    /// `sent_at + timeout` by the service's clock.
    pub fn extend(&self, sent_at: Duration) {
        let until = sent_at + self.timeout - self.timeout / 10;
        self.deadline_ns
            .fetch_max(until.as_nanos() as u64, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// Whether the leader surely still leads.
    pub fn in_force(&self) -> bool {
        !self.over.load(Ordering::Acquire)
            && (boot_time().as_nanos() as u64) < self.deadline_ns.load(Ordering::Acquire)
    }

    /// Waits up to `within` for the term to be in force (a keep-alive round may be under
    /// way); false if it is not by then, or is over.
    pub async fn wait_in_force(&self, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            // Registered before the checks, so that a change between them wakes it.
            let changed = self.changed.notified();
            if self.in_force() {
                return true;
            }
            if self.over.load(Ordering::Acquire)
                || tokio::time::timeout_at(until, changed).await.is_err()
            {
                return false;
            }
        }
    }

    /// Ends the term (it will not be in force again), saying why; the first reason stays.
    pub fn end(&self, why: &str) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.is_none() {
            *ended = Some(why.to_string());
        }
        self.over.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Returns once the term has been ended.
    pub async fn wait_ended(&self) {
        loop {
            // Registered before the check, so that an end between them wakes it.
            let changed = self.changed.notified();
            if self.over.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    /// Waits `for_` between two keep-alive rounds, or less if the term ends meanwhile: a
    /// term's loops then stop as soon as it is over, not a round later.
    pub async fn pause(&self, for_: Duration) {
        tokio::select! {
            () = tokio::time::sleep(for_) => {}
            () = self.wait_ended() => {}
        }
    }

    /// Why the term was ended, if it was.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenure_lasts_nine_tenths_of_the_timeout_past_the_keep_alive_and_ends_for_good() {
        let now = boot_time();
        let t = Tenure::new(Duration::from_secs(3600), now);
        assert!(t.in_force());
        // A keep-alive sent long ago does not move the deadline back.
        t.extend(Duration::ZERO);
        assert!(t.in_force());
        t.end("first");
        t.end("second");
        assert!(!t.in_force());
        t.extend(boot_time());
        assert!(!t.in_force(), "an ended term stays ended");
        assert_eq!(t.ended().as_deref(), Some("first"));
        // Sent a whole timeout ago: over by the clock.
        let old = Tenure::new(
            Duration::from_millis(10),
            now.saturating_sub(Duration::from_millis(10)),
        );
        assert!(!old.in_force());
    }

    #[tokio::test]
    async fn a_waiter_is_woken_by_an_extension_and_by_the_end() {
        let t = std::sync::Arc::new(Tenure::new(Duration::from_millis(10), Duration::ZERO));
        assert!(!t.in_force());
        let waiter = tokio::spawn({
            let t = std::sync::Arc::clone(&t);
            async move { t.wait_in_force(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        t.extend(boot_time() + Duration::from_secs(3600));
        assert!(waiter.await.unwrap());
        let ended = std::sync::Arc::new(Tenure::new(Duration::from_millis(10), Duration::ZERO));
        let waiter = tokio::spawn({
            let t = std::sync::Arc::clone(&ended);
            async move { t.wait_in_force(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        ended.end("test");
        assert!(!waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_pause_between_rounds_ends_with_the_term() {
        let t = std::sync::Arc::new(Tenure::new(Duration::from_secs(3600), boot_time()));
        let paused = tokio::spawn({
            let t = std::sync::Arc::clone(&t);
            async move { t.pause(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        assert!(!paused.is_finished(), "a pause lasts while the term does");
        t.end("test");
        tokio::time::timeout(Duration::from_secs(60), paused)
            .await
            .expect("the pause outlived the term")
            .unwrap();
    }
}
