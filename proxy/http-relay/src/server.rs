//! The listening side: HTTP/1.1 connections from clients, keep-alive, bounded in number, with
//! a graceful shutdown.
//!
//! For throughput the binary runs one single-threaded runtime per CPU, each accepting on the
//! same listening socket (a [`shards::Listener`]: the worker with the fewest connections takes
//! the next) and with its own upstream connections, so that a request and its upstream exchange
//! never change threads.
//! Measured on the benchmark machine: one thread relays as much as a two-thread work-stealing
//! runtime did, because every request there crossed threads twice.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shards::Listener;
use tlsconf::Stream;
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
    /// Connections from one address that have not yet sent their first request head (TLS
    /// handshake included) at once; one more is closed at accept, so that one client's silent
    /// connections cannot take every slot of `connections_max`.
    pub startups_per_peer_max: usize,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            connections_max: 10_000,
            header_read_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            startups_per_peer_max: 256,
        }
    }
}

/// Serves `relay` on `listener` until `shutdown` completes, then lets requests in progress
/// finish (up to the grace period). With `tls`, every connection is HTTPS: its handshake must
/// finish within `header_read_timeout`, and a failed one is a log line and a closed connection.
pub async fn serve(
    listener: Listener,
    relay: Arc<Relay>,
    limits: ServerLimits,
    tls: Option<Arc<tlsconf::Reloadable>>,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.connections_max));
    let starting = tlsconf::PerPeer::new(limits.startups_per_peer_max);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = Arc::clone(&slots).acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (stream, peer, load) = tokio::select! {
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
        let Some(start) = starting.take(peer.ip()) else {
            tracing::info!(%peer, max = starting.max(), "refusing a connection: too many in start-up from this address");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let relay = Arc::clone(&relay);
        let stop = stop_rx.clone();
        let header_read_timeout = limits.header_read_timeout;
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        tokio::spawn(async move {
            let _counted = (
                permit,
                load,
                opskit::fence::get().connection(opskit::fence::Mode::Http),
            );
            let stream = match acceptor {
                None => Stream::Plain(stream),
                Some(acceptor) => {
                    let shaken = tokio::time::timeout(
                        header_read_timeout,
                        tlsconf::accept(&acceptor, stream),
                    )
                    .await;
                    match shaken {
                        Ok(Ok(s)) => Stream::Server(Box::new(s)),
                        Ok(Err(e)) => {
                            tracing::info!(%peer, reason = %tlsconf::handshake_error(&e), "TLS handshake failed; connection closed");
                            return;
                        }
                        Err(_) => {
                            tracing::info!(%peer, "TLS handshake not finished within the header read timeout; connection closed");
                            return;
                        }
                    }
                }
            };
            relay
                .serve_connection(stream, peer, header_read_timeout, stop, start)
                .await;
        });
    }
    let _ = stop_tx.send(true);
    // Wait for the connections to close, up to the grace period.
    let all = u32::try_from(limits.connections_max).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(limits.shutdown_grace, slots.acquire_many(all)).await;
}
