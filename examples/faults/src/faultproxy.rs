//! A userspace TCP fault proxy (the kernel here has no `tc netem`): relays every connection to
//! one upstream address, and on demand delays each chunk it forwards, in both directions,
//! holds every chunk until it is let go (a frozen path: connections stay open, nothing
//! passes), or cuts every connection it relays at once (with a reset).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct FaultProxy {
    pub addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    cuts: watch::Sender<u64>,
    frozen: watch::Sender<bool>,
}

impl FaultProxy {
    /// Listens on a free loopback port and relays to `upstream`.
    pub async fn start(upstream: String) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (cuts, _) = watch::channel(0u64);
        let (frozen, _) = watch::channel(false);
        let proxy = FaultProxy {
            addr,
            delay_ms: Arc::clone(&delay_ms),
            cuts: cuts.clone(),
            frozen: frozen.clone(),
        };
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(relay(
                    client,
                    upstream.clone(),
                    Arc::clone(&delay_ms),
                    cuts.subscribe(),
                    frozen.subscribe(),
                ));
            }
        });
        Ok(proxy)
    }

    /// Every chunk forwarded from now on waits `delay` first (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Holds every chunk (and every new connection's first) until [`FaultProxy::set_frozen`]
    /// with `false`: the path is silent, as a partition is, while its connections stay open.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Resets every connection relayed at this moment.
    pub fn cut_all(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

async fn relay(
    client: TcpStream,
    upstream: String,
    delay_ms: Arc<AtomicU64>,
    mut cuts: watch::Receiver<u64>,
    frozen: watch::Receiver<bool>,
) {
    cuts.mark_unchanged();
    let Ok(server) = TcpStream::connect(&upstream).await else {
        reset(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let fds = [client.as_raw_fd(), server.as_raw_fd()];
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let both = async {
        tokio::join!(
            pump(cr, sw, Arc::clone(&delay_ms), frozen.clone()),
            pump(sr, cw, delay_ms, frozen)
        );
    };
    tokio::pin!(both);
    tokio::select! {
        () = &mut both => return,
        _ = cuts.changed() => {}
    }
    // Cut: the sockets are still open (`both` owns them); with linger 0 their close is a reset.
    for fd in fds {
        // SAFETY: `both` still owns the stream this descriptor belongs to; it is dropped below.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = socket2::SockRef::from(&fd).set_linger(Some(Duration::ZERO));
    }
}

/// Copies one direction, delaying each chunk by the current delay.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Arc<AtomicU64>,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let delay = delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if frozen.wait_for(|f| !*f).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}
