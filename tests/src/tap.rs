//! A TCP relay that notes how each connection through it begins (its first 8 bytes: enough
//! to tell an SSLRequest from a CancelRequest or a StartupMessage), for tests that must show
//! what a proxy sends on the wire.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

pub struct Tap {
    pub addr: String,
    firsts: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Tap {
    /// Relays every connection to `target` (host:port), in threads, for as long as the test
    /// runs.
    pub fn start(target: &str) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the tap");
        let addr = listener.local_addr().expect("its address").to_string();
        let firsts = Arc::new(Mutex::new(Vec::new()));
        let (target, seen) = (target.to_string(), Arc::clone(&firsts));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                let (target, seen) = (target.clone(), Arc::clone(&seen));
                std::thread::spawn(move || {
                    let mut first = [0u8; 8];
                    if client.read_exact(&mut first).is_err() {
                        return;
                    }
                    seen.lock().unwrap().push(first.to_vec());
                    let Ok(mut server) = TcpStream::connect(&target) else {
                        return;
                    };
                    if server.write_all(&first).is_err() {
                        return;
                    }
                    let (mut c2, mut s2) =
                        (client.try_clone().unwrap(), server.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut c2, &mut s2);
                        let _ = s2.shutdown(std::net::Shutdown::Write);
                    });
                    let _ = std::io::copy(&mut server, &mut client);
                    let _ = client.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Tap { addr, firsts }
    }

    /// The first 8 bytes of each connection so far.
    pub fn firsts(&self) -> Vec<Vec<u8>> {
        self.firsts.lock().unwrap().clone()
    }
}
