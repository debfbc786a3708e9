//! lockd's TLS listener: TCP connections accepted here, handshaken in tasks of their own
//! (bounded in number and time), and handed to tonic once they are TLS streams.
//!
//! The certificates come from a [`tlsconf::Reloadable`]; SIGHUP reads the files again
//! ([`tlsconf::reload_on_sighup`]), for connections accepted from then on. Connections already open
//! keep theirs. A failed handshake (a plaintext client, no or a refused client certificate) is
//! one log line and a closed connection: nothing else notices.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{info, warn};

/// A TLS stream, as tonic serves it.
pub type Stream = tlsconf::tokio_rustls::server::TlsStream<TcpStream>;

/// Longest a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; further connections wait to be accepted.
const HANDSHAKES_MAX: usize = 1024;
/// Handshakes in progress at once from one address: one client that opens connections and
/// sends nothing cannot take every slot.
const HANDSHAKES_PER_PEER_MAX: usize = 64;

/// The streams of the connections accepted on `listener` whose handshake succeeded.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<tlsconf::Reloadable>,
) -> ReceiverStream<Result<Stream, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    let per_peer = tlsconf::PerPeer::new(HANDSHAKES_PER_PEER_MAX);
    tokio::spawn(async move {
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let (socket, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: the next accept may succeed.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let Some(peer_slot) = per_peer.take(peer.ip()) else {
                tracing::debug!(%peer, max = HANDSHAKES_PER_PEER_MAX, "too many handshakes in progress from this address; connection closed");
                continue;
            };
            let _ = socket.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _slots = (slot, peer_slot);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, tlsconf::accept(&acceptor, socket))
                    .await
                {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        info!(%peer, reason = %tlsconf::handshake_error(&e), "TLS handshake failed; connection closed");
                    }
                    Err(_) => {
                        info!(%peer, timeout_ms = HANDSHAKE_TIMEOUT.as_millis() as u64, "TLS handshake not finished in time; connection closed");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
