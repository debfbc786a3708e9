//! The house's own rules, checked, so that they cannot drift from ARCHITECTURE.md:
//!
//! - `tidy`: the dependency rules against `cargo metadata`, a `//!` at the head of every
//!   module, no `anyhow` in libraries, no unused dependencies, the line budget of a file;
//! - `deploy`: the example configurations of `deploy/` are accepted by the binaries, and the
//!   systemd units pass `systemd-analyze verify` with the hardening they promise, the alert
//!   rules of lockd and fence-proxy pass `promtool check rules` and their own unit tests, and
//!   the Grafana dashboard queries only documented metrics in PromQL promtool accepts;
//! - `cli_docs`: the man pages and completions `./x man` makes cover every subcommand;
//! - `entry`: `./x` installs what is missing as root, and otherwise says how.
//!
//! Needs the binaries: `cargo build --workspace --bins --tests` first.

mod cli_docs;
mod deploy;
mod entry;
mod tidy;
