//! http-relay: a reverse proxy for HTTP services that fences writes by token.
//!
//! - `path`: request paths as the upstream reads them (a path common upstream stacks read
//!   differently is refused, unless the upstream's reading is configured), in their normal
//!   form (RFC 3986 §6.2.2), which the routes judge and the upstream receives;
//! - `routes`: which requests are fenced and which resource they name;
//! - `fence`: the rule (stale refused, equal shared, higher raises) and the barrier that keeps a
//!   new token from overtaking older requests still at the upstream; durable marks behind a
//!   [`MarkStore`];
//! - `h1`: HTTP/1.1 framing: heads parsed in place and written on as bytes (hop-by-hop headers
//!   out, forwarding headers in), chunked bodies decoded and encoded again;
//! - `relay`: one task per client connection relaying its requests, streaming, to the upstream
//!   connection it keeps (limits, timeouts, the fence's permit);
//! - `upstream`: upstream connections, in plain HTTP or TLS (`https://`), and whether an idle
//!   one is still usable;
//! - `problem`: the proxy's own answers, `application/problem+json`, in one table;
//! - `server`: accepting client connections (HTTPS when a certificate is given), bounded in
//!   number, graceful shutdown.
//!
//! Among the project's crates it depends on `fencing`, `shards` and `tlsconf`; the stores of
//! marks live in the `fence-proxy` binary.
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
mod h1;
mod marks;
mod path;
mod problem;
mod relay;
mod routes;
mod server;
mod tally;
mod upstream;

pub use fence::{
    BoxFuture, Fence, FenceLimits, LocalFence, MarkStore, MemoryMarks, Permit, Refusal,
};
pub use path::PathReading;
pub use problem::Problem;
pub use relay::{Relay, RelayConfig, parse_upstream};
pub use routes::{Classification, RouteConfig, RouteError, Routes, Unmatched, is_safe};
pub use server::{ServerLimits, serve};
