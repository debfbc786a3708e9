//! `verify`: checks a recorded history (JSON Lines, Jepsen-style) for the safety invariants
//! of DESIGN.md section 2 that a history can show. docs/history.md describes the format.
//!
//! - [`history`]: the events and their parsing, with the line each came from;
//! - [`check`]: the properties, each reported as holding or with the events that break it;
//! - [`timeline`]: the history drawn as SVG in an HTML page;
//! - [`model`]: a model of the protocol, explored exhaustively for a small scope.
//!
//! Depends only on `fencing` (the vocabulary), never on lockd's or the proxy's code, so that it
//! cannot share their bugs.

pub mod check;
pub mod history;
pub mod model;
pub mod timeline;

pub use check::{Property, Report, check};
pub use history::{Event, EventType, HistoryError, Op, parse};
