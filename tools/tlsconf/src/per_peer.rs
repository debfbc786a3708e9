//! [`PerPeer`]: connections still negotiating (a TLS handshake, a PostgreSQL start-up), counted
//! per peer address and bounded, so that one client that opens connections and sends nothing
//! cannot take every slot of a listener: clients elsewhere are still served.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// At most `max` connections negotiating at once from one address.
pub struct PerPeer {
    max: usize,
    table: Mutex<HashMap<IpAddr, usize>>,
}

/// One negotiating connection counted against its address; uncounted when dropped.
pub struct PeerSlot {
    table: Arc<PerPeer>,
    ip: IpAddr,
}

impl PerPeer {
    pub fn new(max: usize) -> Arc<PerPeer> {
        Arc::new(PerPeer {
            max,
            table: Mutex::new(HashMap::new()),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for a connection from `ip`, or `None` when that address has `max` already.
    /// IPv4-mapped IPv6 addresses count as their IPv4 address.
    pub fn take(self: &Arc<PerPeer>, ip: IpAddr) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let n = t.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            table: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut t = self.table.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_own_bound_and_a_slot_comes_back_when_dropped() {
        let p = PerPeer::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let one = p.take(a).unwrap();
        let _two = p.take(mapped).unwrap();
        assert!(
            p.take(a).is_none(),
            "the mapped form counts as the same address"
        );
        assert!(p.take(b).is_some(), "another address is not held back");
        drop(one);
        assert!(p.take(a).is_some());
    }
}
