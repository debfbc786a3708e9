//! Waiters: the FIFO queue of each held resource (or full semaphore), joined, rejoined under
//! a request id, and left.

use std::collections::VecDeque;

use fencing::ResourceName;

use super::{AcquireRequest, Core, Counted, Waiter};
use crate::error::AcquireError;
use crate::outcome::AcquireOutcome;
use crate::types::WaiterId;

impl Core {
    pub(super) fn rejoin(
        &mut self,
        waiter: WaiterId,
        req: AcquireRequest,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<AcquireOutcome, AcquireError> {
        let w = self
            .waiters
            .get_mut(&waiter)
            .expect("waiting request ids name waiters");
        let reads = matches!(req.rw, Some(super::Rw::Read | super::Rw::Downgrade(_)));
        let downgrade = matches!(req.rw, Some(super::Rw::Downgrade(_)));
        if w.resource == req.resource && (w.reads != reads || downgrade) {
            let side = |reads| if reads { "a reader" } else { "its writer" };
            return Err(AcquireError::RequestIdWaitsAs {
                request_id: req
                    .request_id
                    .map(|id| id.as_str().to_string())
                    .unwrap_or_default(),
                resource: req.resource,
                waits_as: side(w.reads),
                asked_as: if downgrade {
                    "a downgrade (which never waits)"
                } else {
                    side(reads)
                },
            });
        }
        if w.resource != req.resource {
            return Err(AcquireError::RequestIdReused {
                request_id: req
                    .request_id
                    .map(|id| id.as_str().to_string())
                    .unwrap_or_default(),
                original: w.resource.clone(),
                requested: req.resource,
            });
        }
        let removed = self.wait_deadlines.remove(&(w.deadline, waiter));
        debug_assert!(removed, "waiters have deadlines");
        w.deadline = self.now.saturating_add(wait_ms);
        w.ttl_ms = ttl_ms;
        w.holder = req.holder;
        w.owner = req.owner;
        self.wait_deadlines.insert((w.deadline, waiter));
        let position = self.position(&req.resource, waiter);
        Ok(AcquireOutcome::Rejoined { waiter, position })
    }

    /// Queues `req` behind the resource's waiters; `reads`: as a reader of a read-write lock.
    pub(super) fn enqueue(
        &mut self,
        req: AcquireRequest,
        (ttl_ms, wait_ms): (u64, u64),
        reads: bool,
    ) -> Result<AcquireOutcome, AcquireError> {
        let queued = self.queues.get(&req.resource).map_or(0, VecDeque::len);
        if queued >= self.limits.waiters_per_resource_max {
            return Err(AcquireError::QueueFull {
                resource: req.resource,
                max: self.limits.waiters_per_resource_max,
            });
        }
        if self.waiters.len() >= self.limits.waiters_total_max {
            return Err(AcquireError::WaitersExhausted {
                max: self.limits.waiters_total_max,
            });
        }
        self.check_request_room(&req)?;
        let waiter = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        let deadline = self.now.saturating_add(wait_ms);
        self.wait_deadlines.insert((deadline, waiter));
        if let Some(id) = &req.request_id {
            self.waiting_requests.insert(id.clone(), waiter);
        }
        self.count(req.resource.as_str(), Counted::Waiters, 1);
        let queue = self.queues.entry(req.resource.clone()).or_default();
        queue.push_back(waiter);
        let position = queue.len();
        self.waiters.insert(
            waiter,
            Waiter {
                resource: req.resource,
                request_id: req.request_id,
                holder: req.holder,
                ttl_ms,
                deadline,
                owner: req.owner,
                reads,
            },
        );
        Ok(AcquireOutcome::Queued { waiter, position })
    }

    /// Remembering a request id must not push the table past its limit. Waiters are checked
    /// when they queue, so the table can exceed `requests_max` by at most the waiters granted
    /// later (bounded by `waiters_total_max`).
    pub(super) fn check_request_room(&self, req: &AcquireRequest) -> Result<(), AcquireError> {
        let Some(id) = &req.request_id else {
            return Ok(());
        };
        // Never a set's id, even one whose first member alone was forgotten (a crash may keep
        // a prefix of a batch of forgets).
        if let Some(reused) = self.names_a_set(id) {
            return Err(reused);
        }
        if self.leases.remembered_count() >= self.limits.requests_max {
            return Err(AcquireError::RequestsExhausted {
                max: self.limits.requests_max,
            });
        }
        self.check_quota(self.owner(&req.resource), Counted::Requests, 1)
    }

    /// Removes every trace of a waiter that has already been taken out of `waiters`.
    pub(super) fn forget_waiter(&mut self, waiter: WaiterId, w: &Waiter) {
        self.count(w.resource.as_str(), Counted::Waiters, -1);
        self.wait_deadlines.remove(&(w.deadline, waiter));
        if let Some(id) = &w.request_id {
            self.waiting_requests.remove(id);
        }
        let queue = self
            .queues
            .get_mut(&w.resource)
            .expect("a waiter's resource has a queue");
        // Queues are bounded by `waiters_per_resource_max`, so a linear search is fine.
        if let Some(at) = queue.iter().position(|&q| q == waiter) {
            queue.remove(at);
        }
        if queue.is_empty() {
            self.queues.remove(&w.resource);
        }
    }

    pub(super) fn position(&self, resource: &ResourceName, waiter: WaiterId) -> usize {
        let queue = &self.queues[resource];
        queue
            .iter()
            .position(|&w| w == waiter)
            .expect("a waiter is in its resource's queue")
            + 1
    }
}
