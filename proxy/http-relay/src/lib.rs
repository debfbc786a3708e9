//! http-relay: a reverse proxy for HTTP services that fences writes by token.
//!
//! - `routes`: which requests are fenced and which resource they name;
//! - `fence`: the rule (stale refused, equal shared, higher raises) and the barrier that keeps a
//!   new token from overtaking older requests still at the upstream; durable marks behind a
//!   [`MarkStore`];
//! - `relay`: the streaming relay to the upstream (headers, limits, timeouts);
//! - `upstream`: connections to the upstream, one kept per client connection, bounded;
//! - `problem`: the proxy's own answers, `application/problem+json`, in one table;
//! - `server`: HTTP/1.1 connections from clients.
//!
//! It depends on `fencing` only among the project's crates; the stores of marks live in the
//! `fence-proxy` binary.
//!
//! # What the fence guarantees, and what it cannot
//!
//! Guaranteed, per resource, at this proxy: once a request with token `t` has been admitted, no
//! request with a lower token is admitted; and a request with a new, higher token is relayed
//! only after every older-token request this proxy relayed has finished, meaning the upstream's
//! response was relayed completely or the exchange was abandoned.
//!
//! Not guaranteed: what an upstream does with a request whose connection was dropped (the
//! client gave up, or the proxy timed out waiting). Such an upstream may still apply the old
//! request after the new one; no proxy can see or stop that. Upstreams that cancel work when the
//! connection closes, or that check the `Fencing-Token` header themselves, close that gap.

mod fence;
mod marks;
mod problem;
mod relay;
mod routes;
mod server;
mod upstream;

pub use fence::{
    BoxFuture, Fence, FenceLimits, LocalFence, MarkStore, MemoryMarks, Permit, Refusal,
};
pub use problem::Problem;
pub use relay::{BoxError, Relay, RelayBody, RelayConfig, parse_upstream, strip_hop_by_hop};
pub use routes::{Classification, RouteConfig, RouteError, Routes, Unmatched, is_safe};
pub use server::{ServerLimits, bind_shards, serve};
pub use upstream::Slot;
