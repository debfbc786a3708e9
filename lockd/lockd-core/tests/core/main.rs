//! Tests of the core state machine, from data.
//!
//! - `transcripts`: scripted calls in, outcomes and effects out, through one `check` helper;
//!   `sets`: the same, for the atomic AcquireAll; `semaphores`: for semaphores; `rwlocks`: for
//!   read-write locks;
//! - `expiry`: leases held past their deadline while the expiry limit says so;
//! - `model`: random interleavings against a simple reference model (proptest).

mod expiry;
mod harness;
mod model;
mod rwlocks;
mod semaphores;
mod sets;
mod transcripts;
