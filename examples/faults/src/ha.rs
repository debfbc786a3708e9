//! The high-availability system of `--backend etcd`: three etcd members, and lockd instances
//! over them, each reaching every member through fault proxies of its own (so that one
//! instance can be cut off from etcd while its clients still reach it), each on a clock
//! libfaketime can move (when clock faults are drawn). The faults that act on it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use e2e::Lockd;
use e2e::etcd::{EtcdCluster, FOLLOWING, LEADING};
use rand::Rng;
use rand::rngs::StdRng;

use crate::faultproxy::FaultProxy;

/// libfaketime's library for threaded programs (Debian's `libfaketime`).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// How long the runner waits for a leader before a fault that needs one is skipped.
const LEADER_WAIT: Duration = Duration::from_secs(15);

struct Instance {
    lockd: Option<Lockd>,
    dir: PathBuf,
    /// host:port it listens on (and advertises).
    addr: String,
    /// Its paths to the etcd members.
    to_etcd: Vec<FaultProxy>,
    /// The libfaketime offset file, and the offset in it (milliseconds ahead of real time).
    clock: Option<(PathBuf, u64)>,
}

pub struct Ha {
    pub etcd: EtcdCluster,
    instances: Vec<Instance>,
    leader_ttl: Duration,
    /// The arguments every instance gets beside its own.
    args: Vec<String>,
    /// Why terms ended, in the logs of instance processes since killed.
    ended_before: BTreeMap<&'static str, usize>,
}

/// What the faults need from the runner: to let the run go on for a while (taking in the
/// clients' messages meanwhile).
pub type Wait<'a> = &'a mut dyn FnMut(Duration);

impl Ha {
    /// Starts three etcd members and `n` lockd instances (each with its fault proxies to the
    /// members, and on a libfaketime clock when `clocks`); returns once one leads.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        dir: &Path,
        n: usize,
        leader_ttl: Duration,
        lockd_args: &[&str],
        clocks: bool,
    ) -> anyhow::Result<Ha> {
        if clocks && !Path::new(LIBFAKETIME).exists() {
            bail!("clock faults need {LIBFAKETIME}: apt-get install libfaketime (./x installs it)");
        }
        let etcd = EtcdCluster::start(3);
        let members: Vec<String> = etcd
            .endpoints()
            .split(',')
            .map(|u| u.trim_start_matches("http://").to_string())
            .collect();
        let mut instances = Vec::new();
        for i in 0..n {
            let to_etcd = members
                .iter()
                .map(|m| rt.block_on(FaultProxy::start(m.clone())))
                .collect::<Result<Vec<_>, _>>()?;
            let clock = if clocks {
                let file = dir.join(format!("clock-{i}"));
                std::fs::write(&file, "+0\n")?;
                Some((file, 0))
            } else {
                None
            };
            // A free port, and not one an instance before drew (none listens yet).
            let addr = loop {
                let a = e2e::free_loopback_addr();
                if instances.iter().all(|i: &Instance| i.addr != a) {
                    break a;
                }
            };
            instances.push(Instance {
                lockd: None,
                dir: dir.join(format!("lockd-{i}")),
                addr,
                to_etcd,
                clock,
            });
        }
        let mut ha = Ha {
            etcd,
            instances,
            leader_ttl,
            args: lockd_args.iter().map(|s| s.to_string()).collect(),
            ended_before: BTreeMap::new(),
        };
        for i in 0..n {
            ha.launch(i)?;
        }
        ha.wait_leader()
            .context("no lockd instance took the leadership at start")?;
        Ok(ha)
    }

    /// The addresses the instances listen on.
    pub fn addrs(&self) -> Vec<String> {
        self.instances.iter().map(|i| i.addr.clone()).collect()
    }

    /// Starts instance `i` (again), on its data directory and address; returns once it leads
    /// or follows.
    fn launch(&mut self, i: usize) -> anyhow::Result<()> {
        let inst = &self.instances[i];
        let endpoints: Vec<String> = inst
            .to_etcd
            .iter()
            .map(|p| format!("http://{}", p.addr))
            .collect();
        let endpoints = endpoints.join(",");
        let ttl = self.leader_ttl.as_millis().to_string();
        let advertise = format!("http://{}", inst.addr);
        let mut args: Vec<&str> = vec![
            "--backend",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-leader-ttl-ms",
            &ttl,
            "--advertise",
            &advertise,
        ];
        args.extend(self.args.iter().map(String::as_str));
        let env: Vec<(&str, OsString)> = match &inst.clock {
            Some((file, _)) => vec![
                ("LD_PRELOAD", OsString::from(LIBFAKETIME)),
                ("FAKETIME_TIMESTAMP_FILE", file.clone().into_os_string()),
                // Read again every second: a jump takes effect within one.
                ("FAKETIME_CACHE_DURATION", OsString::from("1")),
            ],
            None => Vec::new(),
        };
        let env: Vec<(&str, &std::ffi::OsStr)> =
            env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        let lockd = Lockd::start_with_env(&inst.dir, &inst.addr, &args, &env);
        lockd
            .process
            .stderr
            .wait_for("lockd to lead or follow", |l| {
                e2e::event(l).is_some_and(|e| e["message"] == LEADING || e["message"] == FOLLOWING)
            });
        self.instances[i].lockd = Some(lockd);
        Ok(())
    }

    /// The instance the leader key names now, if etcd answers and names one of them.
    fn leader_now(&self) -> Option<usize> {
        let mut cmd = std::process::Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.etcd.endpoints()))
            .args([
                "--command-timeout=1s",
                "get",
                "/lockd/leader",
                "--print-value-only",
            ]);
        let out = cmd.output().ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let address = v["address"].as_str()?.trim_start_matches("http://");
        self.instances.iter().position(|i| i.addr == address)
    }

    /// Waits (up to [`LEADER_WAIT`]) for a leader among the instances.
    fn wait_leader(&self) -> Option<usize> {
        let until = Instant::now() + LEADER_WAIT;
        loop {
            if let Some(i) = self.leader_now() {
                return Some(i);
            }
            if Instant::now() >= until {
                return None;
            }
            // etcdctl's own round trip paces this loop.
            std::thread::yield_now();
        }
    }

    fn lockd(&mut self, i: usize) -> &mut Lockd {
        self.instances[i]
            .lockd
            .as_mut()
            .expect("every instance runs between faults")
    }

    /// `kill -9` of the leader (`leader`) or of a follower, then a restart.
    pub fn kill(&mut self, leader: bool, rng: &mut StdRng) -> anyhow::Result<String> {
        let Some(l) = self.wait_leader() else {
            return Ok("no lockd leader to find: skipped".to_string());
        };
        let i = if leader {
            l
        } else {
            let others: Vec<usize> = (0..self.instances.len()).filter(|&i| i != l).collect();
            others[rng.random_range(0..others.len())]
        };
        for (why, n) in terms_ended(self.lockd(i)) {
            *self.ended_before.entry(why).or_default() += n;
        }
        self.lockd(i).kill9();
        self.launch(i)?;
        Ok(format!(
            "lockd {i} ({}): kill -9, restarted",
            if leader { "the leader" } else { "a follower" }
        ))
    }

    /// SIGSTOP of the leader for 1.5 to 3 leadership TTLs (past its term), then SIGCONT.
    pub fn pause_leader(&mut self, rng: &mut StdRng, wait: Wait<'_>) -> String {
        let Some(l) = self.wait_leader() else {
            return "no lockd leader to find: skipped".to_string();
        };
        let d = self.leader_ttl.mul_f64(rng.random_range(1.5..3.0));
        self.lockd(l).process.signal(libc::SIGSTOP);
        wait(d);
        self.lockd(l).process.signal(libc::SIGCONT);
        format!("lockd {l} (the leader): SIGSTOP for {d:?}, SIGCONT")
    }

    /// `kill -9` of one etcd member, restarted.
    pub fn kill_member(&mut self, rng: &mut StdRng, wait: Wait<'_>) -> String {
        let m = rng.random_range(0..3);
        let d = Duration::from_millis(rng.random_range(300..=1500));
        self.etcd.kill9(m);
        wait(d);
        self.etcd.restart(m, true);
        format!("etcd member {m}: kill -9, restarted after {d:?}")
    }

    /// Two members killed (no quorum) for 1 to 3 s, restarted.
    pub fn lose_quorum(&mut self, rng: &mut StdRng, wait: Wait<'_>) -> String {
        let a = rng.random_range(0..3);
        let b = (a + rng.random_range(1..3)) % 3;
        let d = Duration::from_millis(rng.random_range(1000..=3000));
        self.etcd.kill9(a);
        self.etcd.kill9(b);
        wait(d);
        self.etcd.restart(a, false);
        self.etcd.restart(b, false);
        self.etcd.wait_member(a);
        self.etcd.wait_member(b);
        format!("etcd members {a} and {b}: kill -9 (no quorum) for {d:?}, restarted")
    }

    /// The leader's paths to etcd frozen (half the time every connection reset first) for 1
    /// to 2.5 leadership TTLs; its clients still reach it.
    pub fn isolate_leader(&mut self, rng: &mut StdRng, wait: Wait<'_>) -> String {
        let Some(l) = self.wait_leader() else {
            return "no lockd leader to find: skipped".to_string();
        };
        let reset = rng.random_bool(0.5);
        let d = self.leader_ttl.mul_f64(rng.random_range(1.0..2.5));
        for p in &self.instances[l].to_etcd {
            p.set_frozen(true);
            if reset {
                p.cut_all();
            }
        }
        wait(d);
        for p in &self.instances[l].to_etcd {
            p.set_frozen(false);
        }
        format!(
            "lockd {l} (the leader) cut off from etcd ({}) for {d:?}",
            if reset {
                "reset, then silent"
            } else {
                "silent"
            }
        )
    }

    /// Every chunk between the leader and etcd delayed 20-500 ms for 0.5-2 s.
    pub fn delay_leader(&mut self, rng: &mut StdRng, wait: Wait<'_>) -> String {
        let Some(l) = self.wait_leader() else {
            return "no lockd leader to find: skipped".to_string();
        };
        let delay = Duration::from_millis(rng.random_range(20..=500));
        let d = Duration::from_millis(rng.random_range(500..=2000));
        for p in &self.instances[l].to_etcd {
            p.set_delay(delay);
        }
        wait(d);
        for p in &self.instances[l].to_etcd {
            p.set_delay(Duration::ZERO);
        }
        format!("lockd {l} (the leader) to etcd: {delay:?} per chunk for {d:?}")
    }

    /// The leader's clock jumps ahead (libfaketime; it stays ahead after): half the time by
    /// 1 s to nine tenths of the leadership TTL (within the term, where only the check
    /// against etcd's clock can see it), half the time by 2 to 60 s.
    pub fn jump_clock(&mut self, rng: &mut StdRng, wait: Wait<'_>) -> anyhow::Result<String> {
        let Some(l) = self.wait_leader() else {
            return Ok("no lockd leader to find: skipped".to_string());
        };
        let ttl_ms = self.leader_ttl.as_millis() as u64;
        let jump = if rng.random_bool(0.5) {
            rng.random_range(1000..=(ttl_ms * 9 / 10).max(1000))
        } else {
            rng.random_range(2000..=60_000)
        };
        let (file, offset) = self.instances[l]
            .clock
            .as_mut()
            .context("clock faults start every instance on a libfaketime clock")?;
        *offset += jump;
        std::fs::write(
            &*file,
            format!("+{}.{:03}\n", *offset / 1000, *offset % 1000),
        )?;
        let (jump, offset) = (Duration::from_millis(jump), Duration::from_millis(*offset));
        // libfaketime reads the file again within a second; the leader's check sees the
        // jump within a ninth of the TTL after that.
        wait(Duration::from_secs(1) + self.leader_ttl);
        Ok(format!(
            "lockd {l} (the leader): clock {jump:?} ahead (now {offset:?} ahead of real time)"
        ))
    }

    /// Why the instances' terms ended, over the whole run.
    pub fn terms_ended(&self) -> BTreeMap<&'static str, usize> {
        let mut all = self.ended_before.clone();
        for lockd in self.instances.iter().filter_map(|i| i.lockd.as_ref()) {
            for (why, n) in terms_ended(lockd) {
                *all.entry(why).or_default() += n;
            }
        }
        all
    }
}

/// Why `lockd`'s terms ended, from its log ("stopped leading" and its reason).
fn terms_ended(lockd: &Lockd) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for e in lockd.process.stderr.text().lines().filter_map(e2e::event) {
        if e["message"] != "stopped leading" {
            continue;
        }
        let reason = e["reason"].as_str().unwrap_or_default();
        let why = if reason.contains("clock ran ahead") || reason.contains("clock fell behind") {
            "its clock disagreed with etcd's"
        } else if reason.contains("could not be renewed in time") {
            "its lease was not renewed in time"
        } else if reason.contains("etcd refused or failed a batch") {
            "etcd refused or failed a batch"
        } else if reason.contains("lease or the leader key is gone") {
            "its lease or key was gone"
        } else {
            "other"
        };
        *out.entry(why).or_default() += 1;
    }
    out
}
