//! A throwaway ZooKeeper ensemble for the tests: `n` servers on loopback ports, each a
//! separate `java` process (Debian's `zookeeper` package) in a temporary directory, that a test
//! can `kill -9`, stop (SIGSTOP) and start again on the same data. The jar is looked for in
//! `ZOOKEEPER_JAR`, else where Debian puts it; if it is missing the test fails and says how to
//! install it (never skipped).
//!
//! Every ensemble runs in quorum mode (`standaloneEnabled=false`), even of one server, so that
//! each server says the same thing when it serves: its peer state reached `broadcast`.

use std::path::PathBuf;
use std::process::Command;

use crate::{Spawned, free_loopback_addr};

/// Debian's jar of the server (its manifest names the libraries it needs).
const DEBIAN_JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logger for the server's log to stderr, where the tests read it.
const LOGGER_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// One server: its client address, and its process while it runs.
pub struct Server {
    pub client: String,
    config: PathBuf,
    process: Option<Spawned>,
}

pub struct ZkEnsemble {
    pub servers: Vec<Server>,
    _dir: tempfile::TempDir,
}

fn jar() -> PathBuf {
    let path =
        std::env::var_os("ZOOKEEPER_JAR").map_or_else(|| PathBuf::from(DEBIAN_JAR), PathBuf::from);
    assert!(
        path.exists() && std::path::Path::new(LOGGER_JAR).exists(),
        "ZooKeeper not found ({} and {LOGGER_JAR}): install it (apt-get install zookeeper) or set ZOOKEEPER_JAR",
        path.display()
    );
    path
}

/// The port of a `127.0.0.1:port` address.
fn port(addr: &str) -> &str {
    addr.rsplit(':').next().expect("an address with a port")
}

impl ZkEnsemble {
    /// Starts `n` servers and waits until every one serves clients.
    pub fn start(n: usize) -> ZkEnsemble {
        let dir = tempfile::tempdir().expect("temporary directory");
        let peers: Vec<(String, String)> = (0..n)
            .map(|_| (free_loopback_addr(), free_loopback_addr()))
            .collect();
        let members: String = peers
            .iter()
            .enumerate()
            .map(|(i, (quorum, election))| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    i + 1,
                    port(quorum),
                    port(election)
                )
            })
            .collect();
        let mut servers = Vec::new();
        for i in 0..n {
            let data = dir.path().join(format!("s{}", i + 1));
            std::fs::create_dir_all(&data).expect("data directory");
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
            let client = free_loopback_addr();
            // A short tick so that sessions may be short (2 to 20 ticks) and failovers quick.
            let config = format!(
                "tickTime=200\ninitLimit=50\nsyncLimit=10\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nstandaloneEnabled=false\n4lw.commands.whitelist=srvr\n{members}",
                data.display(),
                port(&client),
            );
            let path = data.join("zoo.cfg");
            std::fs::write(&path, config).expect("zoo.cfg");
            servers.push(Server {
                client,
                config: path,
                process: None,
            });
        }
        let mut ensemble = ZkEnsemble { servers, _dir: dir };
        // All at once: a server waits for a quorum before it serves.
        for i in 0..n {
            ensemble.launch(i);
        }
        for i in 0..n {
            ensemble.wait_serving(i);
        }
        ensemble
    }

    fn launch(&mut self, i: usize) {
        let s = &mut self.servers[i];
        let mut cmd = Command::new("java");
        cmd.arg("-Xmx256m")
            .arg("-cp")
            .arg(format!("{}:{LOGGER_JAR}", jar().display()))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(&s.config);
        s.process = Some(Spawned::spawn(cmd));
    }

    fn wait_serving(&self, i: usize) {
        let process = self.servers[i].process.as_ref().expect("started");
        process
            .stderr
            .wait_for(&format!("ZooKeeper server {} to serve", i + 1), |l| {
                l.contains("Peer state changed:") && l.ends_with("- broadcast")
            });
    }

    /// The client addresses, for `--zk-endpoints`.
    pub fn endpoints(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.client.clone()).collect()
    }

    /// `kill -9` of server `i`; waits until it is gone.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut p) = self.servers[i].process.take() {
            p.signal(libc::SIGKILL);
            p.wait();
        }
    }

    /// Starts server `i` again on its data; with `wait`, returns once it serves (which needs
    /// a quorum).
    pub fn restart(&mut self, i: usize, wait: bool) {
        self.kill9(i);
        self.launch(i);
        if wait {
            self.wait_serving(i);
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to server `i`.
    pub fn pause(&mut self, i: usize, stop: bool) {
        if let Some(p) = self.servers[i].process.as_mut() {
            p.signal(if stop { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }
}

/// The session timeout the tests give lockd: short, so failovers are quick (the servers'
/// tick of 200 ms allows 400 ms to 4 s).
pub const SESSION_TIMEOUT_MS: &str = "2000";

impl ZkEnsemble {
    /// lockd over this ensemble (session timeout [`SESSION_TIMEOUT_MS`] unless `extra` sets
    /// one, then `extra`), returned once it leads or follows.
    pub fn lockd(&self, dir: &std::path::Path, extra: &[&str]) -> crate::Lockd {
        let endpoints = self.endpoints().join(",");
        let mut args = vec!["--backend", "zookeeper", "--zk-endpoints", &endpoints];
        if !extra.contains(&"--zk-session-timeout-ms") {
            args.extend(["--zk-session-timeout-ms", SESSION_TIMEOUT_MS]);
        }
        args.extend_from_slice(extra);
        let lockd = crate::Lockd::start_with_env(dir, "127.0.0.1:0", &args, &[]);
        lockd
            .process
            .stderr
            .wait_for("lockd to lead or follow", |l| {
                crate::event(l).is_some_and(|e| {
                    e["message"] == crate::etcd::LEADING || e["message"] == crate::etcd::FOLLOWING
                })
            });
        lockd
    }
}
