//! A throwaway Redis with Sentinel for the tests: a master and its replicas (Debian's
//! `redis-server`, each durable: `appendonly yes`, `appendfsync always`) and Sentinels
//! (`redis-sentinel`) that monitor them under the name [`MASTER`], on loopback ports in a
//! temporary directory. A test can `kill -9`, stop (SIGSTOP) and start again any of them. If a
//! binary is missing the test fails and says how to install it (never skipped).

use std::path::PathBuf;
use std::process::Command;

use crate::{Spawned, free_loopback_addr};

/// The name the Sentinels monitor the master under (lockd's default `redis_master`).
pub const MASTER: &str = "lockd";

/// One process: its address, its configuration file, and the process while it runs.
pub struct Node {
    pub addr: String,
    config: PathBuf,
    process: Option<Spawned>,
}

pub struct RedisSet {
    /// Server 0 is the first master; the others replicate it.
    pub servers: Vec<Node>,
    pub sentinels: Vec<Node>,
    _dir: tempfile::TempDir,
}

fn binary(name: &str) -> &str {
    let found = Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} not found: install it (apt-get install redis-server redis-sentinel)"
    );
    name
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().expect("an address with a port")
}

impl RedisSet {
    /// A master, `replicas` replicas of it and `sentinels` Sentinels (a majority of them
    /// decides a failover); returns once every replica has synced and every Sentinel knows
    /// every replica and every other Sentinel.
    pub fn start(replicas: usize, sentinels: usize) -> RedisSet {
        RedisSet::start_with(replicas, sentinels, "appendfsync always")
    }

    /// As [`RedisSet::start`], with `durability` as the servers' fsync setting.
    pub fn start_with(replicas: usize, sentinels: usize, durability: &str) -> RedisSet {
        binary("redis-server");
        binary("redis-sentinel");
        let dir = tempfile::tempdir().expect("temporary directory");
        let master = free_loopback_addr();
        let mut set = RedisSet {
            servers: Vec::new(),
            sentinels: Vec::new(),
            _dir: dir,
        };
        for i in 0..=replicas {
            let addr = if i == 0 {
                master.clone()
            } else {
                free_loopback_addr()
            };
            let data = set._dir.path().join(format!("r{i}"));
            std::fs::create_dir_all(&data).expect("data directory");
            let mut config = format!(
                "port {}\nbind 127.0.0.1\ndir {}\nappendonly yes\n{durability}\nsave \"\"\nlogfile \"\"\nreplica-announce-ip 127.0.0.1\nrepl-diskless-sync-delay 0\n",
                port(&addr),
                data.display()
            );
            if i > 0 {
                config.push_str(&format!("replicaof 127.0.0.1 {}\n", port(&master)));
            }
            let path = data.join("redis.conf");
            std::fs::write(&path, config).expect("redis.conf");
            set.servers.push(Node {
                addr,
                config: path,
                process: None,
            });
        }
        let quorum = sentinels / 2 + 1;
        for i in 0..sentinels {
            let addr = free_loopback_addr();
            let data = set._dir.path().join(format!("s{i}"));
            std::fs::create_dir_all(&data).expect("data directory");
            // Short timeouts, so that failovers in the tests are quick.
            let config = format!(
                "port {}\nbind 127.0.0.1\ndir {}\nlogfile \"\"\nsentinel announce-ip 127.0.0.1\nsentinel monitor {MASTER} 127.0.0.1 {} {quorum}\nsentinel down-after-milliseconds {MASTER} 1000\nsentinel failover-timeout {MASTER} 4000\n",
                port(&addr),
                data.display(),
                port(&master)
            );
            let path = data.join("sentinel.conf");
            std::fs::write(&path, config).expect("sentinel.conf");
            set.sentinels.push(Node {
                addr,
                config: path,
                process: None,
            });
        }
        set.launch_server(0);
        set.wait_line(&set.servers[0], "the master to serve", |l| {
            l.contains("Ready to accept connections")
        });
        for i in 1..=replicas {
            set.launch_server(i);
        }
        for i in 1..=replicas {
            set.wait_line(&set.servers[i], "a replica to sync", |l| {
                l.contains("MASTER <-> REPLICA sync: Finished with success")
            });
        }
        set.wait_replicas_online(0, replicas);
        for i in 0..sentinels {
            set.launch_sentinel(i);
        }
        for s in &set.sentinels {
            let p = s.process.as_ref().expect("started");
            p.stdout
                .wait_for("the Sentinel to monitor the master", |l| {
                    l.contains("+monitor master")
                });
            if replicas > 0 {
                p.stdout
                    .wait_for_nth("the Sentinel to know every replica", replicas, |l| {
                        l.contains("+slave slave")
                    });
            }
            if sentinels > 1 {
                p.stdout.wait_for_nth(
                    "the Sentinel to know the other Sentinels",
                    sentinels - 1,
                    |l| l.contains("+sentinel sentinel"),
                );
            }
        }
        for s in &set.sentinels {
            // Sentinel reads each server's INFO every 10 s by default: a demoted master would
            // be made a replica that late.
            let client = ::redis::Client::open(format!("redis://{}/", s.addr)).expect("a URL");
            let mut conn = client.get_connection().expect("the Sentinel serves");
            let _: () = ::redis::cmd("SENTINEL")
                .arg("DEBUG")
                .arg("info-period")
                .arg(500)
                .query(&mut conn)
                .expect("SENTINEL DEBUG info-period");
            set.wait_replicas_known(s, replicas);
        }
        set
    }

    /// Returns once server `master` streams to `replicas` replicas: a write, and `WAIT` for
    /// it. (A replica that has loaded the master's data is streamed to only after its first
    /// acknowledgement, up to a second later; until then no WAIT counts it.)
    fn wait_replicas_online(&self, master: usize, replicas: usize) {
        let addr = &self.servers[master].addr;
        let client = ::redis::Client::open(format!("redis://{addr}/")).expect("a URL");
        let mut conn = client.get_connection().expect("the master serves");
        let (_, reached): ((), usize) = ::redis::pipe()
            .set("harness:replicas-online", 1)
            .cmd("WAIT")
            .arg(replicas)
            .arg(crate::PATIENCE.as_millis() as u64)
            .query(&mut conn)
            .expect("SET and WAIT");
        assert_eq!(
            reached, replicas,
            "the master at {addr} streams to {reached} of {replicas} replicas"
        );
    }

    /// Asks the Sentinel `s` until it has read every replica's state (a replica whose state
    /// it has not read yet is no candidate for promotion: "NOGOODSLAVE"). Each ask is a
    /// round trip; nothing sleeps.
    fn wait_replicas_known(&self, s: &Node, replicas: usize) {
        let client = ::redis::Client::open(format!("redis://{}/", s.addr)).expect("a URL");
        let mut conn = client.get_connection().expect("the Sentinel serves");
        let deadline = std::time::Instant::now() + crate::PATIENCE;
        loop {
            let listed: Vec<Vec<String>> = ::redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(MASTER)
                .query(&mut conn)
                .expect("SENTINEL REPLICAS");
            let ready = listed
                .iter()
                .filter(|fields| {
                    let field = |name: &str| {
                        fields
                            .chunks(2)
                            .find(|kv| kv[0] == name)
                            .and_then(|kv| kv.get(1).cloned())
                            .unwrap_or_default()
                    };
                    field("flags") == "slave"
                        && field("info-refresh")
                            .parse::<u64>()
                            .is_ok_and(|ms| ms < 10_000)
                })
                .count();
            if ready == replicas {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the Sentinel at {} has read {ready} of {replicas} replicas",
                s.addr
            );
        }
    }

    fn wait_line(&self, node: &Node, what: &str, pred: impl Fn(&str) -> bool) {
        node.process
            .as_ref()
            .expect("started")
            .stdout
            .wait_for(what, pred);
    }

    fn launch_server(&mut self, i: usize) {
        let n = &mut self.servers[i];
        let mut cmd = Command::new("redis-server");
        cmd.arg(&n.config);
        n.process = Some(Spawned::spawn(cmd));
    }

    fn launch_sentinel(&mut self, i: usize) {
        let n = &mut self.sentinels[i];
        let mut cmd = Command::new("redis-sentinel");
        cmd.arg(&n.config);
        n.process = Some(Spawned::spawn(cmd));
    }

    /// The Sentinels' addresses, for `--redis-endpoints`.
    pub fn endpoints(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| s.addr.clone()).collect()
    }

    /// `kill -9` of server `i`; waits until it is gone.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut p) = self.servers[i].process.take() {
            p.signal(libc::SIGKILL);
            p.wait();
        }
    }

    /// Starts server `i` again on its data (as the Sentinels last configured it).
    pub fn restart(&mut self, i: usize) {
        self.kill9(i);
        self.launch_server(i);
        self.wait_line(&self.servers[i], "the server to load its data", |l| {
            l.contains("Ready to accept connections")
        });
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to server `i`.
    pub fn pause(&mut self, i: usize, stop: bool) {
        if let Some(p) = self.servers[i].process.as_mut() {
            p.signal(if stop { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to Sentinel `i`.
    pub fn pause_sentinel(&mut self, i: usize, stop: bool) {
        if let Some(p) = self.sentinels[i].process.as_mut() {
            p.signal(if stop { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// Waits until every Sentinel that runs has switched to a master other than server `i`
    /// (a failover); returns the new master's index.
    pub fn wait_failover_from(&self, i: usize) -> usize {
        let old = &self.servers[i].addr;
        let mut new = None;
        for s in self.sentinels.iter().filter(|s| s.process.is_some()) {
            let line = s
                .process
                .as_ref()
                .expect("runs")
                .stdout
                .wait_for("the Sentinels to fail the master over", |l| {
                    l.contains("+switch-master") && l.contains(&format!("127.0.0.1 {}", port(old)))
                });
            // `+switch-master <name> <old ip> <old port> <new ip> <new port>`
            let to = line
                .split_whitespace()
                .rev()
                .take(2)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(":");
            new = self.servers.iter().position(|n| n.addr == to);
        }
        new.expect("the new master is one of the servers")
    }

    /// What server `i` has logged, for a failure's message.
    pub fn log(&self, i: usize) -> String {
        self.servers[i]
            .process
            .as_ref()
            .map_or_else(|| "(not running)".to_string(), |p| p.stdout.text())
    }

    /// Waits until a Sentinel has made server `i` (a master that was failed over from) a
    /// replica of the new master.
    pub fn wait_demoted(&self, i: usize) {
        let needle = format!("+convert-to-slave slave {}", self.servers[i].addr);
        let s = self
            .sentinels
            .iter()
            .find_map(|s| s.process.as_ref())
            .expect("a Sentinel runs");
        s.stdout
            .wait_for("the old master to be made a replica", |l| {
                l.contains(&needle)
            });
    }

    /// lockd over these Sentinels, returned once it leads or follows.
    pub fn lockd(&self, dir: &std::path::Path, extra: &[&str]) -> crate::Lockd {
        let endpoints = self.endpoints().join(",");
        let mut args = vec!["--backend", "redis", "--redis-endpoints", &endpoints];
        if !extra.contains(&"--redis-leader-ttl-ms") {
            args.extend(["--redis-leader-ttl-ms", "2000"]);
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
