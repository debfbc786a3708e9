//! One listening socket served by several worker threads, each running its own single-threaded
//! runtime, with every new connection taken by a worker that has the fewest open connections.
//!
//! Why: when the workers simply all wait on the socket, whichever is awake first takes
//! everything that is queued. A burst of connections (a pool warming up, a benchmark starting)
//! then lands on one thread: measured with 64 connections opened at once, one worker of two got
//! all 64 in two runs out of three, and the proxy relayed 70k requests/s instead of 90k, with
//! one CPU idle. `SO_REUSEPORT` spreads connections by a hash of their addresses instead, which
//! ignores load.
//!
//! Here a worker accepts only while its count of open connections is the lowest (ties
//! allowed); the others wait until a count changes. A connection's [`Load`] guard keeps it
//! counted until it is dropped. Binding once also means that a second process on the same
//! address is refused ("address in use").

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::sync::Notify;

/// The open-connection counts of a socket's workers.
struct Balance {
    loads: Vec<AtomicUsize>,
    /// Per worker: woken when its turn may have come (or, for its own accept, gone).
    changed: Vec<Notify>,
}

impl Balance {
    fn new(workers: usize) -> Arc<Balance> {
        Arc::new(Balance {
            loads: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            changed: (0..workers).map(|_| Notify::new()).collect(),
        })
    }

    fn notify_all(&self) {
        for n in &self.changed {
            n.notify_waiters();
        }
    }

    /// Whether worker `i` has (one of) the fewest open connections.
    fn is_turn_of(&self, i: usize) -> bool {
        let mine = self.loads[i].load(Ordering::Acquire);
        self.loads.iter().all(|l| l.load(Ordering::Acquire) >= mine)
    }

    /// Counts a connection of worker `i` opened or closed, and wakes only the workers whose
    /// turn it may have changed: a wake of another worker is a thread's wake-up (a system
    /// call and a context switch), which with a connection per transaction cost as much as
    /// the connection's own work. A worker `j` gets its turn from `i`'s new connection only
    /// if its count is now equal to `i`'s (before, `i` had fewer); a closed connection gives
    /// the turn to no one but `i` itself (everyone else's stays or goes; one that goes on
    /// accepting a little longer only evens out later).
    fn add(&self, i: usize, up: bool) {
        if up {
            let now = self.loads[i].fetch_add(1, Ordering::AcqRel) + 1;
            for j in (0..self.loads.len()).filter(|j| *j != i) {
                if self.loads[j].load(Ordering::Acquire) == now && self.is_turn_of(j) {
                    self.changed[j].notify_waiters();
                }
            }
        } else {
            self.loads[i].fetch_sub(1, Ordering::AcqRel);
            self.changed[i].notify_waiters();
        }
    }
}

/// A worker's handle on the socket, before its runtime exists.
pub struct Shard {
    listener: std::net::TcpListener,
    index: usize,
    balance: Arc<Balance>,
}

/// Binds `addr` once and returns `n` shards of it (at least one), one per worker.
pub fn bind(addr: SocketAddr, n: usize) -> io::Result<Vec<Shard>> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let n = n.max(1);
    let balance = Balance::new(n);
    let mut listeners = Vec::with_capacity(n);
    for _ in 1..n {
        listeners.push(listener.try_clone()?);
    }
    listeners.push(listener);
    Ok(listeners
        .into_iter()
        .enumerate()
        .map(|(index, listener)| Shard {
            listener,
            index,
            balance: Arc::clone(&balance),
        })
        .collect())
}

impl Shard {
    /// The address the socket is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The worker's listener, registered with the runtime it is called in.
    pub fn listen(self) -> io::Result<Listener> {
        Ok(Listener {
            listener: tokio::net::TcpListener::from_std(self.listener)?,
            index: self.index,
            balance: self.balance,
        })
    }
}

/// A worker's listener.
pub struct Listener {
    listener: tokio::net::TcpListener,
    index: usize,
    balance: Arc<Balance>,
}

/// Counts a connection as open on its worker until dropped.
pub struct Load {
    index: usize,
    balance: Arc<Balance>,
}

/// A worker that stops serving (its listener dropped: shutdown, or its thread ended) no longer
/// counts as the least loaded, so the others do not wait for it to take its turn.
const GONE: usize = usize::MAX / 2;

impl Drop for Listener {
    fn drop(&mut self) {
        self.balance.loads[self.index].store(GONE, Ordering::Release);
        self.balance.notify_all();
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.balance.add(self.index, false);
    }
}

impl Listener {
    /// A listener that is the only worker of its socket.
    pub fn single(listener: tokio::net::TcpListener) -> Listener {
        Listener {
            listener,
            index: 0,
            balance: Balance::new(1),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits until this worker has the fewest open connections, then for a connection.
    /// Cancel-safe: dropped while waiting, nothing is lost.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr, Load)> {
        loop {
            let changed = self.balance.changed[self.index].notified();
            tokio::pin!(changed);
            // Registered before the check, so that a change right after it is not missed.
            changed.as_mut().enable();
            if !self.balance.is_turn_of(self.index) {
                changed.await;
                continue;
            }
            // Accept, unless the counts change meanwhile and it is no longer this worker's
            // turn (another one took connections, or this one's closed: both re-checked).
            tokio::select! {
                biased;
                accepted = self.listener.accept() => {
                    let (stream, peer) = accepted?;
                    self.balance.add(self.index, true);
                    let load = Load { index: self.index, balance: Arc::clone(&self.balance) };
                    return Ok((stream, peer, load));
                }
                () = changed => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections opened in a burst while one worker's runtime is not running yet: the
    /// other takes no more than its share, and they end up spread evenly.
    #[test]
    fn a_burst_of_connections_is_spread_over_the_workers() {
        let shards = bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = shards[0].local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<(usize, std::net::TcpStream, Load)>();
        let late = Arc::new(std::sync::Barrier::new(2));
        for shard in shards {
            let (tx, late) = (tx.clone(), Arc::clone(&late));
            std::thread::spawn(move || {
                let index = shard.index;
                if index == 1 {
                    late.wait();
                }
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = shard.listen().unwrap();
                    loop {
                        let (stream, _, load) = listener.accept().await.unwrap();
                        let stream = stream.into_std().unwrap();
                        if tx.send((index, stream, load)).is_err() {
                            return;
                        }
                    }
                });
            });
        }
        drop(tx);
        // All queued in the kernel before worker 1 starts.
        let clients: Vec<std::net::TcpStream> = (0..64)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        late.wait();
        let mut per_worker = [0usize; 2];
        let mut open = Vec::new();
        for _ in 0..64 {
            let (index, stream, load) = rx.recv().unwrap();
            per_worker[index] += 1;
            open.push((stream, load));
        }
        // A worker accepts only while it has no more than the other: one ahead at most.
        assert!(
            per_worker[0].abs_diff(per_worker[1]) <= 1,
            "connections per worker: {per_worker:?}"
        );
        drop(clients);
    }

    /// Two workers' listeners on one socket, in this runtime, and the socket's address.
    fn two_workers() -> (Listener, Listener, SocketAddr) {
        let shards = bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = shards[0].local_addr().unwrap();
        let mut shards = shards.into_iter().map(|s| s.listen().unwrap());
        (shards.next().unwrap(), shards.next().unwrap(), addr)
    }

    /// A worker with fewer connections takes the next ones; closing connections gives a
    /// worker its turn back.
    #[tokio::test]
    async fn the_least_loaded_worker_takes_the_next_connection() {
        let (a, b, addr) = two_workers();
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let (_s1, _, a1) = a.accept().await.unwrap();
        // a has one, b none: a does not accept the next connection, b does.
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let (_s2, _, b1) = tokio::select! {
            biased;
            r = a.accept() => panic!("a accepted with more connections than b: {:?}", r.map(|r| r.1)),
            r = b.accept() => r.unwrap(),
        };
        // Both have one: either may take the next; after b's closes, only b may.
        drop(b1);
        let _c3 = TcpStream::connect(addr).await.unwrap();
        tokio::select! {
            biased;
            r = a.accept() => panic!("a accepted with more connections than b: {:?}", r.map(|r| r.1)),
            r = b.accept() => drop(r.unwrap()),
        };
        drop(a1);
    }

    /// A worker whose listener is gone does not hold the others back.
    #[tokio::test]
    async fn a_worker_that_stopped_serving_is_not_waited_for() {
        let (a, b, addr) = two_workers();
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let (_s1, _, _b1) = b.accept().await.unwrap();
        // b has one, a none: b waits for a's turn, until a stops serving.
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let second = b.accept();
        tokio::pin!(second);
        tokio::select! {
            biased;
            r = &mut second => panic!("b accepted while a, with fewer connections, serves: {:?}", r.map(|r| r.1)),
            () = std::future::ready(()) => {}
        };
        drop(a);
        let (_s2, _, _b2) = tokio::time::timeout(std::time::Duration::from_secs(20), second)
            .await
            .expect("b accepts once a is gone")
            .unwrap();
    }
}
