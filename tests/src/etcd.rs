//! A throwaway etcd cluster for the tests: three members on loopback ports, each a separate
//! `etcd` process in a temporary directory, that a test can `kill -9`, stop (SIGSTOP) and
//! start again on the same data. The binary is looked for in `ETCD_BIN`, else on the PATH; if
//! it is missing the test fails and says how to install it (never skipped).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::{Spawned, free_loopback_addr, output};

/// One member: its ports, and its process while it runs.
pub struct Member {
    pub name: String,
    pub client_url: String,
    peer_url: String,
    process: Option<Spawned>,
}

pub struct EtcdCluster {
    pub members: Vec<Member>,
    dir: tempfile::TempDir,
    initial_cluster: String,
    tls: Option<EtcdTls>,
}

/// TLS for the members' client URLs: their certificate (for 127.0.0.1) and key, and the CA
/// their clients' certificates must chain to (`--client-cert-auth`).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

fn etcd_bin() -> PathBuf {
    let path = std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
    let found = Command::new(&path)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "etcd not found ({}): install it (apt-get install etcd-server etcd-client) or set ETCD_BIN",
        path.display()
    );
    path
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one serves clients.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_with(n, None)
    }

    /// [`EtcdCluster::start`], the client URLs over TLS with `tls`.
    pub fn start_with(n: usize, tls: Option<EtcdTls>) -> EtcdCluster {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let bin = etcd_bin();
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut members = Vec::new();
        for i in 1..=n {
            members.push(Member {
                name: format!("m{i}"),
                client_url: format!("{scheme}://{}", free_loopback_addr()),
                peer_url: format!("http://{}", free_loopback_addr()),
                process: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            dir,
            initial_cluster,
            tls,
        };
        // All at once: a member waits for a quorum before it serves.
        for i in 0..n {
            cluster.launch(&bin, i);
        }
        for i in 0..n {
            cluster.wait_serving(i);
        }
        cluster
    }

    fn launch(&mut self, bin: &PathBuf, i: usize) {
        let data = self.dir.path().join(&self.members[i].name);
        let m = &mut self.members[i];
        let mut cmd = Command::new(bin);
        cmd.args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--listen-client-urls",
                &m.client_url,
                "--advertise-client-urls",
                &m.client_url,
                "--listen-peer-urls",
                &m.peer_url,
                "--initial-advertise-peer-urls",
                &m.peer_url,
                "--initial-cluster",
                &self.initial_cluster,
                "--initial-cluster-state",
                "new",
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ]);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.cert)
                .arg("--key-file")
                .arg(&t.key)
                .arg("--trusted-ca-file")
                .arg(&t.client_ca)
                .arg("--client-cert-auth");
        }
        m.process = Some(Spawned::spawn(cmd));
    }

    fn wait_serving(&self, i: usize) {
        let m = &self.members[i];
        let process = m.process.as_ref().expect("started");
        process
            .stderr
            .wait_for(&format!("etcd member {} to serve clients", m.name), |l| {
                l.contains("serving client traffic")
            });
    }

    /// The client URLs, comma-separated (for `--etcd-endpoints`).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client_url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `kill -9` of member `i`; waits until it is gone.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            p.signal(libc::SIGKILL);
            p.wait();
        }
    }

    /// Starts member `i` again on its data; with `wait`, returns once it serves clients (which
    /// needs a quorum).
    pub fn restart(&mut self, i: usize, wait: bool) {
        self.kill9(i);
        self.launch(&etcd_bin(), i);
        if wait {
            self.wait_serving(i);
        }
    }

    /// Waits until restarted member `i` serves clients.
    pub fn wait_member(&self, i: usize) {
        self.wait_serving(i);
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to member `i`.
    pub fn pause(&mut self, i: usize, stop: bool) {
        if let Some(p) = self.members[i].process.as_mut() {
            p.signal(if stop { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// The index of the current leader, as the members that answer say (waits until they
    /// agree on one).
    pub fn leader(&self) -> usize {
        let deadline = std::time::Instant::now() + crate::PATIENCE;
        loop {
            if let Some(i) = self.leader_now() {
                return i;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the etcd members did not agree on a leader"
            );
        }
    }

    fn leader_now(&self) -> Option<usize> {
        let running: Vec<&Member> = self
            .members
            .iter()
            .filter(|m| m.process.is_some())
            .collect();
        let endpoints: Vec<&str> = running.iter().map(|m| m.client_url.as_str()).collect();
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(["--command-timeout=2s", "endpoint", "status", "-w", "json"]);
        let (status, stdout, stderr) = output(cmd);
        assert!(
            status.success() || !stdout.is_empty(),
            "etcdctl endpoint status failed (apt-get install etcd-client): {stderr}"
        );
        let v: Value = serde_json::from_str(stdout.trim()).ok()?;
        let entries = v.as_array()?;
        let leader = entries.first()?["Status"]["leader"].as_u64()?;
        if leader == 0
            || entries
                .iter()
                .any(|e| e["Status"]["leader"].as_u64() != Some(leader))
        {
            return None;
        }
        let endpoint = entries
            .iter()
            .find(|e| e["Status"]["header"]["member_id"].as_u64() == Some(leader))?["Endpoint"]
            .as_str()?
            .to_string();
        self.members.iter().position(|m| m.client_url == endpoint)
    }
}

/// What lockd logs when it starts leading, and when it follows a leader.
pub const LEADING: &str = "leading: every stored lease gets a full TTL from now";
pub const FOLLOWING: &str = "following";

/// The leadership lease the tests give lockd: etcd's shortest (2 s), so failovers are quick.
pub const LEADER_TTL_MS: &str = "2000";

impl EtcdCluster {
    /// lockd over this cluster (leadership lease [`LEADER_TTL_MS`] unless `extra` sets one,
    /// then `extra`), returned once it leads or follows.
    pub fn lockd(&self, dir: &std::path::Path, extra: &[&str]) -> crate::Lockd {
        self.lockd_at(dir, "127.0.0.1:0", extra)
    }

    /// Like [`EtcdCluster::lockd`], listening on `listen`.
    pub fn lockd_at(&self, dir: &std::path::Path, listen: &str, extra: &[&str]) -> crate::Lockd {
        self.lockd_with_env(dir, listen, extra, &[])
    }

    /// Like [`EtcdCluster::lockd_at`], with these environment variables set (a faked clock).
    pub fn lockd_with_env(
        &self,
        dir: &std::path::Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> crate::Lockd {
        let endpoints = self.endpoints();
        let mut args = vec!["--backend", "etcd", "--etcd-endpoints", &endpoints];
        if !extra.contains(&"--etcd-leader-ttl-ms") {
            args.extend(["--etcd-leader-ttl-ms", LEADER_TTL_MS]);
        }
        args.extend_from_slice(extra);
        let lockd = crate::Lockd::start_with_env(dir, listen, &args, env);
        lockd
            .process
            .stderr
            .wait_for("lockd to lead or follow", |l| {
                crate::event(l)
                    .is_some_and(|e| e["message"] == LEADING || e["message"] == FOLLOWING)
            });
        lockd
    }
}

impl EtcdCluster {
    /// The address in the lockd leader key under `/lockd`, if a leader is recorded.
    pub fn lockd_leader(&self) -> Option<String> {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.running_endpoints()))
            .args([
                "--command-timeout=2s",
                "get",
                "/lockd/leader",
                "--print-value-only",
            ]);
        let (status, stdout, stderr) = output(cmd);
        assert!(
            status.success(),
            "etcdctl get failed (apt-get install etcd-client): {stderr}"
        );
        let v: Value = serde_json::from_str(stdout.trim()).ok()?;
        v["address"].as_str().map(str::to_string)
    }

    fn running_endpoints(&self) -> String {
        self.members
            .iter()
            .filter(|m| m.process.is_some())
            .map(|m| m.client_url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Which of `instances` (lockd endpoints) leads; waits until the leader key names one of
    /// them other than `not`.
    pub fn lockd_leader_among(&self, instances: &[&str], not: Option<&str>) -> usize {
        let deadline = std::time::Instant::now() + crate::PATIENCE;
        loop {
            if let Some(a) = self.lockd_leader()
                && Some(a.as_str()) != not
                && let Some(i) = instances.iter().position(|e| *e == a)
            {
                return i;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no lockd instance took the leadership"
            );
        }
    }
}
