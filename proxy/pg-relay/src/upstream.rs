//! Connecting to PostgreSQL, for a session or a cancel request: TCP, then TLS when the
//! listener's `upstream_tls` asks for it. With TLS the relay sends an SSLRequest and needs
//! `S`: a PostgreSQL that answers `N` (ssl = off) is an error, never a fall back to
//! plaintext.

use std::sync::Arc;

use tlsconf::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::PgRelayConfig;

/// TLS towards PostgreSQL.
#[derive(Clone, Debug)]
pub struct UpstreamTls {
    /// The client configuration: verifying the server (`verify-full`) or not (`require`),
    /// and a client certificate for `hostssl ... cert` rules.
    pub client: Arc<tlsconf::ClientTls>,
    /// The name the server's certificate must carry (with `verify-full`), also sent as SNI.
    pub server_name: tlsconf::rustls::pki_types::ServerName<'static>,
}

/// Opens a connection to the upstream, within `connect_timeout` (TCP and TLS together). The
/// error is a sentence for the client's FATAL and the log.
pub(crate) async fn connect(config: &PgRelayConfig) -> Result<Stream, String> {
    let up = &config.upstream;
    let opened = tokio::time::timeout(config.connect_timeout, async {
        let tcp = TcpStream::connect(up)
            .await
            .map_err(|e| format!("cannot connect to PostgreSQL at {up}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        match &config.upstream_tls {
            None => Ok(Stream::Plain(tcp)),
            Some(tls) => handshake(tcp, tls, up).await,
        }
    })
    .await;
    match opened {
        Ok(r) => r,
        Err(_) => Err(format!(
            "connecting to PostgreSQL at {up} timed out after {} ms",
            config.connect_timeout.as_millis()
        )),
    }
}

async fn handshake(mut tcp: TcpStream, tls: &UpstreamTls, up: &str) -> Result<Stream, String> {
    let mut request = Vec::with_capacity(8);
    pg_wire::msg::ssl_request(&mut request);
    tcp.write_all(&request)
        .await
        .map_err(|e| format!("cannot ask PostgreSQL at {up} for TLS: {e}"))?;
    // Exactly one byte: whatever follows an `S` belongs to the handshake.
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .await
        .map_err(|e| format!("PostgreSQL at {up} closed the connection when asked for TLS: {e}"))?;
    match answer[0] {
        b'S' => {}
        b'N' => {
            return Err(format!(
                "PostgreSQL at {up} does not accept TLS (ssl = off?), and upstream_tls asks for it"
            ));
        }
        other => {
            return Err(format!(
                "PostgreSQL at {up} answered the SSLRequest with {:?}, not S or N",
                char::from(other)
            ));
        }
    }
    match tls
        .client
        .connector()
        .connect(tls.server_name.clone(), tcp)
        .await
    {
        Ok(s) => Ok(Stream::Client(Box::new(s))),
        Err(e) => Err(format!(
            "TLS to PostgreSQL at {up} failed: {}",
            tlsconf::client_handshake_error(&e)
        )),
    }
}

/// Sends a CancelRequest for backend `pid` (over TLS when sessions are: the key must not cross
/// the network in clear) and waits until PostgreSQL closes that connection, which it does once
/// it has signalled the backend. Best effort: a failure is logged.
pub(crate) async fn cancel(config: &PgRelayConfig, pid: i32, key: &[u8]) {
    let mut packet = Vec::new();
    pg_wire::msg::cancel_request(&mut packet, pid, key);
    let mut s = match connect(config).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "could not send a cancel request");
            return;
        }
    };
    let sent = tokio::time::timeout(config.connect_timeout, async {
        s.write_all(&packet).await?;
        s.shutdown().await?;
        let mut rest = [0u8; 64];
        while s.read(&mut rest).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not send a cancel request"),
        Err(_) => tracing::warn!("could not send a cancel request: it timed out"),
    }
}
