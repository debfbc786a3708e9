//! The listening side: HTTP/1.1 connections from clients, keep-alive, bounded in number, with
//! a graceful shutdown.
//!
//! For throughput the binary runs one single-threaded runtime per CPU, each accepting on the
//! same listening socket ([`bind_shards`]) and with its own upstream pool, so that a request and
//! its upstream exchange never change threads.
//! Measured on the benchmark machine: one thread relays as much as a two-thread work-stealing
//! runtime did, because every request there crossed threads twice.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::relay::Relay;

/// Limits of the listening side.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// Client connections open at once; past it, new connections wait in the kernel's backlog.
    pub connections_max: usize,
    /// Longest time a client may take to send a request's headers (slow-loris guard), counted
    /// from when the proxy starts waiting for the request: it also closes a kept-alive
    /// connection idle for that long.
    pub header_read_timeout: Duration,
    /// On shutdown, how long requests in progress may take to finish.
    pub shutdown_grace: Duration,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            connections_max: 10_000,
            header_read_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Binds `addr` once and hands out `n` handles on the same socket, one per thread: each
/// thread's runtime waits on it, and whichever is free first takes the next connection, so
/// connections spread by load (with `SO_REUSEPORT` the kernel spreads them by hash, and a busy
/// thread gets as many as an idle one). Binding once also means a second process on the same
/// address is refused ("address in use").
pub fn bind_shards(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let mut out = Vec::with_capacity(n.max(1));
    for _ in 1..n.max(1) {
        out.push(listener.try_clone()?);
    }
    out.push(listener);
    Ok(out)
}

/// Serves `relay` on `listener` until `shutdown` completes, then lets requests in progress
/// finish (up to the grace period).
pub async fn serve(
    listener: TcpListener,
    relay: Arc<Relay>,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.connections_max));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = Arc::clone(&slots).acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: say so, keep serving the others.
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let relay = Arc::clone(&relay);
        let stop = stop_rx.clone();
        let header_read_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let _slot = permit;
            relay
                .serve_connection(stream, peer, header_read_timeout, stop)
                .await;
        });
    }
    let _ = stop_tx.send(true);
    // Wait for the connections to close, up to the grace period.
    let all = u32::try_from(limits.connections_max).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(limits.shutdown_grace, slots.acquire_many(all)).await;
}
