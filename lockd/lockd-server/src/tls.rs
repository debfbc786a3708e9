//! lockd's listener: TCP connections accepted here, at most `connections_max` open at once
//! (past that, lockd stops accepting until one closes: the kernel's backlog holds the rest),
//! and handed to tonic; with TLS, once their handshake, run in a task of its own (bounded in
//! number and time), has succeeded.
//!
//! The certificates come from a [`tlsconf::Reloadable`]; SIGHUP reads the files again
//! ([`tlsconf::reload_on_sighup`]), for connections accepted from then on. Connections already open
//! keep theirs. A failed handshake (a plaintext client, no or a refused client certificate) is
//! one log line and a closed connection: nothing else notices.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::{info, warn};

/// A TLS stream, as tonic serves it.
pub type Stream = Counted<tlsconf::tokio_rustls::server::TlsStream<TcpStream>>;

/// A connection that holds one of `connections_max` slots while it is open.
pub struct Counted<S> {
    inner: S,
    _slot: OwnedSemaphorePermit,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The inner connection's information (peer address, TLS certificates) as tonic needs it.
impl<S: Connected> Connected for Counted<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> S::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The `connections_max` slots, and whether lockd said it is full (said once per time).
struct Slots {
    open: Arc<Semaphore>,
    max: usize,
    said_full: bool,
}

impl Slots {
    fn new(max: usize) -> Slots {
        Slots {
            open: Arc::new(Semaphore::new(max)),
            max,
            said_full: false,
        }
    }

    /// A slot for the next connection: at once, or once a connection closes.
    async fn take(&mut self) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = Arc::clone(&self.open).try_acquire_owned() {
            self.said_full = false;
            return Some(slot);
        }
        if !self.said_full {
            warn!(
                connections_max = self.max,
                "connections_max connections are open; new ones wait to be accepted until one closes"
            );
            self.said_full = true;
        }
        Arc::clone(&self.open).acquire_owned().await.ok()
    }
}

use opskit::admin::accept;

/// The plaintext connections accepted on `listener`, at most `connections_max` open at once.
pub fn incoming_plain(
    listener: TcpListener,
    connections_max: usize,
) -> ReceiverStream<Result<Counted<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let mut slots = Slots::new(connections_max);
    tokio::spawn(async move {
        loop {
            let Some(slot) = slots.take().await else {
                return;
            };
            let (socket, _) = accept(&listener).await;
            let _ = socket.set_nodelay(true);
            let counted = Counted {
                inner: socket,
                _slot: slot,
            };
            if tx.send(Ok(counted)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Longest a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; further connections wait to be accepted.
const HANDSHAKES_MAX: usize = 1024;
/// Handshakes in progress at once from one address: one client that opens connections and
/// sends nothing cannot take every slot.
const HANDSHAKES_PER_PEER_MAX: usize = 64;

/// The streams of the connections accepted on `listener` whose handshake succeeded, at most
/// `connections_max` open (or in a handshake) at once.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<tlsconf::Reloadable>,
    connections_max: usize,
) -> ReceiverStream<Result<Stream, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let mut open = Slots::new(connections_max);
    let slots = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    let per_peer = tlsconf::PerPeer::new(HANDSHAKES_PER_PEER_MAX);
    tokio::spawn(async move {
        loop {
            let Some(connection) = open.take().await else {
                return;
            };
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let (socket, peer) = accept(&listener).await;
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
                        let counted = Counted {
                            inner: stream,
                            _slot: connection,
                        };
                        let _ = tx.send(Ok(counted)).await;
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
