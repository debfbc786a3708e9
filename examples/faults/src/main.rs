//! The fault runner. N clients (separate processes) do read-modify-write on shared counters
//! under the lock, through fence-proxy in its HTTP or PostgreSQL mode, recording a history,
//! while faults chosen from a seed are injected: clients paused (SIGSTOP) past their lease,
//! `kill -9` and restart of lockd and of fence-proxy, a PostgreSQL crash and restart, delays
//! and cut connections through a userspace TCP fault proxy. At the end the history is checked
//! with `verify`'s checker.
//!
//!     cargo build --bins && target/debug/faults --mode http --seed 7
//!     target/debug/faults --mode pg --seed 7 --fault-count 10
//!     target/debug/faults --mode http --seed 7 --no-fencing    # must end in a violation
//!     target/debug/faults --backend etcd --seed 7               # lockd over etcd, HA faults
//!
//! Exit status: 0 the history holds every property, 1 it breaks one, 2 the run itself failed.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

mod client;
mod faultproxy;
mod ha;
mod runner;
mod store;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// A counter service behind fence-proxy's HTTP mode.
    Http,
    /// A table in a throwaway PostgreSQL behind fence-proxy's PostgreSQL mode.
    Pg,
}

/// Where lockd keeps its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// One lockd on its embedded store.
    Embedded,
    /// Several lockd instances over a three-member etcd cluster (high availability).
    Etcd,
}

/// The faults the runner can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Fault {
    /// SIGSTOP a client (half the time just before a write) until its lease has been taken
    /// over, or for 1.5 TTL if it held none; then SIGCONT.
    Pause,
    /// `kill -9` lockd (over etcd: the leading instance) and start it again on its data.
    Lockd,
    /// `kill -9` fence-proxy and start it again.
    Proxy,
    /// Crash PostgreSQL (immediate shutdown) and start it again (`--mode pg` only).
    Postgres,
    /// Delay every chunk on the clients' path to lockd or to the store for a while.
    Delay,
    /// Reset every connection on the clients' path to lockd or to the store.
    Cut,
    /// `--backend etcd`: SIGSTOP the leading lockd past its term, then SIGCONT.
    LeaderPause,
    /// `--backend etcd`: `kill -9` a lockd instance that does not lead, restarted.
    Follower,
    /// `--backend etcd`: `kill -9` one etcd member, restarted.
    Member,
    /// `--backend etcd`: `kill -9` two of the three etcd members (no quorum), restarted.
    Quorum,
    /// `--backend etcd`: the leading lockd cut off from etcd while its clients reach it.
    Isolate,
    /// `--backend etcd`: delay on the leading lockd's paths to etcd.
    EtcdDelay,
    /// `--backend etcd`: the leading lockd's clock jumps ahead (libfaketime).
    Clock,
}

impl Fault {
    /// The faults that act on lockd's high-availability mode only.
    pub const HA: [Fault; 7] = [
        Fault::LeaderPause,
        Fault::Follower,
        Fault::Member,
        Fault::Quorum,
        Fault::Isolate,
        Fault::EtcdDelay,
        Fault::Clock,
    ];

    pub fn needs_etcd(self) -> bool {
        Fault::HA.contains(&self)
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "faults",
    about = "Clients do read-modify-write under the lock through fence-proxy while faults are injected from a seed; the history is checked.",
    after_help = "Exit status: 0 no violation, 1 a violation, 2 the run failed. Replay a run with the command it prints (the seed fixes the faults, their order and the clients' choices; the interleaving of real processes still varies)."
)]
pub struct Cli {
    #[command(subcommand)]
    client: Option<Sub>,
    /// Which fence-proxy mode the clients write through.
    #[arg(long, value_enum, default_value = "http")]
    mode: Mode,
    /// Where lockd keeps its state: one embedded lockd, or instances over etcd.
    #[arg(long, value_enum, default_value = "embedded")]
    backend: Backend,
    /// `--backend etcd`: lockd instances.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=5))]
    lockds: u32,
    /// `--backend etcd`: the leadership lease's TTL, milliseconds (etcd's shortest is 2 s).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(2000..=60000))]
    leader_ttl_ms: u64,
    /// Seed of the fault schedule and of the clients' choices (random when not given).
    #[arg(long)]
    seed: Option<u64>,
    /// Client processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=32))]
    clients: u32,
    /// Counters (resources) the clients share.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    resources: u32,
    /// Faults to inject before the run ends.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100000))]
    fault_count: u32,
    /// Which faults to choose from (comma-separated); default all that apply to the mode.
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<Fault>,
    /// The clients' lease TTL, milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60000))]
    ttl_ms: u64,
    /// Writes bypass fence-proxy and go straight to the store: the checker must find a
    /// violation.
    #[arg(long)]
    no_fencing: bool,
    /// Directory for the history and the timeline (default: a new one in the temporary
    /// directory).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// One client (started by the runner; not for direct use).
    #[command(hide = true)]
    Client(client::Args),
}

fn main() {
    let cli = Cli::parse();
    if let Some(Sub::Client(args)) = cli.client {
        if let Err(e) = client::run(args) {
            eprintln!("faults client: {e:#}");
            std::process::exit(2);
        }
        return;
    }
    match runner::run(&cli) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("faults: the run failed: {e:#}");
            std::process::exit(2);
        }
    }
}
