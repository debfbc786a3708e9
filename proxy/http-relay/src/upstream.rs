//! Connections to the upstream: opened (TCP, and TLS for an `https://` upstream), and judged
//! while kept idle.

use bytes::BytesMut;
use tlsconf::Stream;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::relay::{READ_CHUNK, Relay};

/// A connection to the upstream and the bytes read from it not yet relayed.
pub(crate) struct Upstream {
    pub(crate) stream: Stream,
    pub(crate) input: BytesMut,
}

/// A new upstream connection: TCP, and TLS for an `https://` upstream, both within
/// `connect_timeout`.
pub(crate) async fn connect(relay: &Relay) -> Result<Upstream, String> {
    let stream = tokio::time::timeout(relay.config.connect_timeout, async {
        let tcp = TcpStream::connect(&relay.address)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", relay.address))?;
        let _ = tcp.set_nodelay(true);
        match (&relay.config.upstream_tls, &relay.server_name) {
            (Some(tls), Some(name)) => tls
                .connector()
                .connect(name.clone(), tcp)
                .await
                .map(|s| Stream::Client(Box::new(s)))
                .map_err(|e| {
                    format!(
                        "TLS to {} failed: {}",
                        relay.address,
                        tlsconf::client_handshake_error(&e)
                    )
                }),
            (None, None) => Ok(Stream::Plain(tcp)),
            _ => Err(format!(
                "the upstream {} is https:// but has no TLS settings (or a host that is no TLS name)",
                relay.config.upstream
            )),
        }
    })
    .await
    .map_err(|_| {
        format!(
            "connecting to {} timed out after {} ms",
            relay.address,
            relay.config.connect_timeout.as_millis()
        )
    })??;
    Ok(Upstream {
        stream,
        input: BytesMut::with_capacity(READ_CHUNK),
    })
}

/// Resolves when the kept upstream connection, if any, has something to read (a close, most
/// likely); never without one.
pub(crate) async fn kept_readable(kept: &Option<(Upstream, Instant)>) {
    match kept {
        Some((up, _)) => {
            let _ = up.stream.tcp().readable().await;
        }
        None => std::future::pending().await,
    }
}

/// An idle connection is usable when there is nothing to read on it (no close, no stray bytes).
pub(crate) fn alive(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}
