//! A bounded ring of recent events, with the time each happened: what the status pages show
//! as "recent expiries", "recent refusals", "ended zombies".

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::SystemTime;

pub struct Recent<T> {
    cap: usize,
    items: Mutex<VecDeque<(SystemTime, T)>>,
}

impl<T: Clone> Recent<T> {
    /// Keeps the last `cap` events.
    pub fn new(cap: usize) -> Recent<T> {
        Recent {
            cap: cap.max(1),
            items: Mutex::new(VecDeque::new()),
        }
    }

    pub fn push(&self, item: T) {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        if items.len() == self.cap {
            items.pop_front();
        }
        items.push_back((SystemTime::now(), item));
    }

    /// The events kept, newest first.
    pub fn newest_first(&self) -> Vec<(SystemTime, T)> {
        let items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        items.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_last_events_are_kept_newest_first() {
        let r = super::Recent::new(3);
        for i in 0..5 {
            r.push(i);
        }
        let kept: Vec<i32> = r.newest_first().into_iter().map(|(_, i)| i).collect();
        assert_eq!(kept, vec![4, 3, 2]);
    }
}
