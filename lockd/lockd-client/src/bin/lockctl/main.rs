//! `lockctl`: the command line client of lockd.
//!
//! Exit codes (stable, documented in `lockctl --help` and docs/lockctl.md):
//! 0 success · 1 error · 2 usage error · 3 not granted within the wait · 4 lease lost or not
//! current. `run` exits with the command's own status when it ran to completion under the
//! lock (128 + signal number when a signal ended it).

mod run;

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, CommandFactory, Parser, Subcommand};
use lockd_client::{
    AcquireOptions, Acquired, AcquiredAll, Client, ClientError, DEFAULT_ENDPOINT, Mode, NotGranted,
    NotGrantedReason,
};
use serde_json::json;

/// Exit status: not granted within the wait.
pub const EXIT_NOT_GRANTED: u8 = 3;
/// Exit status: the lease was lost (run) or is not current (renew).
pub const EXIT_LEASE_LOST: u8 = 4;

#[derive(Parser, Debug)]
#[command(
    name = "lockctl",
    version,
    about = "Command line client of lockd: acquire, renew, release and describe locks, or run a command under one.",
    after_help = "Exit codes: 0 success, 1 error, 2 usage error, 3 not granted within the wait, \
                  4 lease lost (run) or not current (renew). `run` otherwise exits with the \
                  command's status (128+N when signal N ended it)."
)]
struct Cli {
    /// lockd's gRPC endpoint; several lockd instances (etcd backend) separated by commas, tried in turn.
    #[arg(long, global = true, env = "LOCKD_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    endpoint: String,

    /// Print results as one JSON object on stdout.
    #[arg(long, global = true)]
    json: bool,

    /// CA (PEM) that lockd's certificate must chain to, for an https:// endpoint.
    #[arg(long, global = true, env = "LOCKD_CA", value_name = "FILE")]
    ca: Option<std::path::PathBuf>,

    /// Client certificate (PEM), for a lockd that requires one (mutual TLS).
    #[arg(long, global = true, env = "LOCKD_CERT", value_name = "FILE")]
    cert: Option<std::path::PathBuf>,

    /// Private key (PEM) of --cert.
    #[arg(long, global = true, env = "LOCKD_KEY", value_name = "FILE")]
    key: Option<std::path::PathBuf>,

    /// File holding this caller's bearer token, for a lockd with a policy (readable by its
    /// owner only; the token never goes on the command line).
    #[arg(long, global = true, env = "LOCKD_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire a lock and print its lease (it is not renewed: renew or release it yourself).
    Acquire {
        resource: String,
        #[command(flatten)]
        lock: LockArgs,
        /// Request id that makes retries of this acquire safe (random if omitted).
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Renew a lease once; more leases (further RESOURCE LEASE_ID pairs) in one call.
    Renew {
        resource: String,
        lease_id: String,
        /// Further RESOURCE LEASE_ID pairs, renewed in the same call (up to 1000 leases).
        #[arg(value_name = "RESOURCE LEASE_ID")]
        more: Vec<String>,
    },
    /// Release a lease (succeeds, saying so, when it was no longer current); more leases
    /// (further RESOURCE LEASE_ID pairs) in one call and one commit.
    Release {
        resource: String,
        lease_id: String,
        /// Further RESOURCE LEASE_ID pairs, released in the same call (up to 1000 leases).
        #[arg(value_name = "RESOURCE LEASE_ID")]
        more: Vec<String>,
    },
    /// Trade a write lease of a read-write lock (acquire --write) for a reader's lease, in one
    /// step: no writer can take the lock in between. Prints the reader's lease (on its own
    /// slot, RESOURCE@read-K, with a new token); the write lease has ended.
    Downgrade {
        resource: String,
        lease_id: String,
        /// The reader's lease length; lockd's default when omitted.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
    },
    /// Show who holds a resource, with which token, and how many wait.
    Describe { resource: String },
    /// List the held locks, the longest held first: holder, token, held for, waiters.
    List {
        /// Only resources whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Locks fetched per call (lockd's maximum is 1000).
        #[arg(long, default_value_t = 500)]
        page_size: u32,
    },
    /// The hottest resources now: the held locks with the most waiters (then the longest held).
    Top {
        /// Only resources whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// How many to show.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: usize,
    },
    /// Run a command while holding the lock (or several); stop it if a lease is lost.
    ///
    /// The command gets FENCING_RESOURCE, FENCING_TOKEN and FENCING_TOKEN_NUMBER in its
    /// environment (with one lock), and FENCING_TOKENS, every lock as RESOURCE=TOKEN pairs
    /// joined by commas, and runs in its own process group. The leases are renewed while it
    /// runs. If a lease is lost, or lockd has not confirmed a renewal by the time the whole
    /// stop must begin, the group gets SIGTERM, then SIGKILL after the grace period, and
    /// lockctl exits with 4; the command is dead before the lease could expire at lockd, so
    /// before anyone else can hold it. SIGINT, SIGTERM and SIGHUP sent to lockctl are passed on
    /// to the command. When the command ends, the locks are released and lockctl exits with the
    /// command's status.
    ///
    /// Several locks (--lock, repeated) are taken in sorted order, each waiting in its queue,
    /// all within --wait; with --atomic, all at once or none, in one call (at most 32, try-only
    /// at lockd: within --wait lockctl asks again).
    ///
    /// With --permits N, the command holds one of the N permits of the semaphore RESOURCE:
    /// FENCING_RESOURCE is the permit's name (RESOURCE@permit-K), the name to fence with.
    ///
    /// With --read or --write, the command holds a side of the read-write lock RESOURCE (every
    /// --lock, in sorted order; not with --atomic): a reader's FENCING_RESOURCE is its own slot
    /// (RESOURCE@read-K), the writer's RESOURCE.
    Run {
        /// The resource to lock (or give --lock, once or more).
        #[arg(required_unless_present = "locks", conflicts_with = "locks")]
        resource: Option<String>,
        /// A resource to lock; repeat it for several.
        #[arg(long = "lock", value_name = "RESOURCE")]
        locks: Vec<String>,
        /// Take every --lock at once or none (one AcquireAll) instead of one after another.
        #[arg(long)]
        atomic: bool,
        #[command(flatten)]
        lock: LockArgs,
        /// Time between SIGTERM and SIGKILL when the lease is lost or about to be [default: a
        /// fifth of the lease's TTL, at most 10s, less if that would not fit]. The grace and
        /// 250ms for SIGKILL must fit in half the TTL.
        #[arg(long, value_parser = humantime::parse_duration)]
        grace: Option<Duration>,
        /// The command and its arguments.
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<String>,
    },
}

#[derive(Args, Debug)]
struct LockArgs {
    /// Lease length (e.g. 30s, 500ms, 2m); lockd's default when omitted.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// How long to wait for the lock (0s = try once).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Who is asking, shown by describe [default: host:pid].
    #[arg(long)]
    holder: Option<String>,
    /// Make the lock reentrant for this owner id: an acquire (or run) with the owner of the
    /// current lease gets that lease with one more hold; each release ends one hold.
    #[arg(long, value_name = "ID")]
    owner: Option<String>,
    /// Take one of the N permits of the semaphore RESOURCE instead of its lock (1 ..= 1000;
    /// every client of a semaphore gives the same N). The lease is on the permit's own name,
    /// RESOURCE@permit-K: renew, release and fence with that name.
    // 1000 is lockd's `limits::PERMITS_MAX`.
    #[arg(long, value_name = "N", conflicts_with = "owner",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    permits: Option<u32>,
    /// Take a reader's lease of the read-write lock RESOURCE: shared with other readers,
    /// never with its writer. The lease is on the reader's own slot, RESOURCE@read-K: renew
    /// and release with that name.
    #[arg(long, conflicts_with_all = ["owner", "permits", "write"])]
    read: bool,
    /// Take the writer's lease of the read-write lock RESOURCE: alone, and not overtaken by
    /// readers that come after a waiting writer.
    #[arg(long, conflicts_with_all = ["owner", "permits"])]
    write: bool,
}

impl LockArgs {
    fn options(&self, request_id: Option<String>) -> AcquireOptions {
        let mut o = AcquireOptions {
            ttl: self.ttl,
            wait: self.wait,
            request_id,
            owner: self.owner.clone(),
            permits: self.permits.unwrap_or(0),
            mode: match (self.read, self.write) {
                (true, _) => Mode::Read,
                (_, true) => Mode::Write,
                _ => Mode::Exclusive,
            },
            ..AcquireOptions::default()
        };
        if let Some(h) = &self.holder {
            o.holder = h.clone();
        }
        o
    }
}

fn main() -> ExitCode {
    cli_docs::generate_if_asked(Cli::command);
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockctl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lockctl: {e}");
            ExitCode::from(match e {
                ClientError::LeaseNotCurrent(_) => EXIT_LEASE_LOST,
                _ => 1,
            })
        }
    }
}

async fn dispatch(cli: Cli) -> Result<ExitCode, ClientError> {
    let tls = tlsconf::ClientFiles {
        ca: cli.ca.clone(),
        cert: cli.cert.clone(),
        key: cli.key.clone(),
    };
    let mut client = Client::connect_tls(&cli.endpoint, &tls)?;
    if let Some(path) = &cli.token_file {
        let token = tlsconf::read_secret(path).map_err(|why| {
            ClientError::InvalidArgument(format!("--token-file {}: {why}", path.display()))
        })?;
        client = client.with_token(&token)?;
    }
    match cli.command {
        Command::Downgrade {
            resource,
            lease_id,
            ttl,
        } => {
            let guard = client.downgrade(&resource, &lease_id, ttl).await?;
            print_granted(guard.detach().await, cli.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Acquire {
            resource,
            lock,
            request_id,
        } => match client.acquire(&resource, lock.options(request_id)).await? {
            Acquired::Granted(guard) => {
                print_granted(guard.detach().await, cli.json);
                Ok(ExitCode::SUCCESS)
            }
            Acquired::NotGranted(why) => Ok(not_granted(&resource, &why, cli.json)),
        },
        Command::Renew {
            resource,
            lease_id,
            more,
        } if more.is_empty() => {
            let r = client.renew(&resource, &lease_id).await?;
            print_renewed(&resource, &r, cli.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Renew {
            resource,
            lease_id,
            more,
        } => {
            let leases = pairs(&resource, &lease_id, &more)?;
            let results = client.renew_many(&leases).await?;
            let mut lost = false;
            for ((resource, _), result) in leases.iter().zip(&results) {
                match result {
                    lockd_client::Renewal::Renewed(r) => print_renewed(resource, r, cli.json),
                    lockd_client::Renewal::NotCurrent { current_token } => {
                        lost = true;
                        if cli.json {
                            println!(
                                "{}",
                                json!({"resource": resource, "renewed": false, "current_token": current_token})
                            );
                        } else {
                            println!(
                                "{resource}: that lease is not current (expired or released); not renewed"
                            );
                        }
                    }
                }
            }
            Ok(ExitCode::from(if lost { EXIT_LEASE_LOST } else { 0 }))
        }
        Command::Release {
            resource,
            lease_id,
            more,
        } => {
            let leases = pairs(&resource, &lease_id, &more)?;
            let released = match leases.len() {
                1 => vec![client.release_hold(&resource, &lease_id).await?],
                _ => client.release_many(&leases).await?,
            };
            for ((resource, _), released) in leases.iter().zip(released) {
                if cli.json {
                    println!(
                        "{}",
                        json!({"resource": resource, "released": released.is_some(), "holds": released.unwrap_or(0)})
                    );
                    continue;
                }
                match released {
                    Some(0) => println!("released {resource}"),
                    Some(left) => println!("released one hold of {resource}; {left} left"),
                    None => println!(
                        "{resource}: that lease was not current (already released or expired); nothing to do"
                    ),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::List { prefix, page_size } => {
            let mut locks = client.list_all(&prefix, page_size).await?;
            locks.sort_by(|a, b| {
                b.held_for_ms
                    .cmp(&a.held_for_ms)
                    .then_with(|| a.resource.cmp(&b.resource))
            });
            print_locks(&locks, cli.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Top { prefix, count } => {
            let mut locks = client.list_all(&prefix, 1000).await?;
            locks.sort_by(|a, b| {
                b.waiters
                    .cmp(&a.waiters)
                    .then_with(|| b.held_for_ms.cmp(&a.held_for_ms))
                    .then_with(|| a.resource.cmp(&b.resource))
            });
            locks.truncate(count);
            print_locks(&locks, cli.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Describe { resource } => {
            let d = client.describe(&resource).await?;
            if cli.json {
                println!("{}", serde_json::to_string(&d).expect("serialisable"));
            } else if d.held {
                println!(
                    "{resource}: held by {:?} token={} ttl={} expires_at={} waiters={}",
                    d.holder,
                    d.token.unwrap_or(0),
                    humantime::format_duration(Duration::from_millis(d.ttl_ms.unwrap_or(0))),
                    wall(d.expires_at_ms.unwrap_or(0)),
                    d.waiters
                );
            } else if let Some(readers) = d.readers {
                println!(
                    "{resource}: read-write lock held by {readers} readers, waiters={} (each reader is {resource}@read-K)",
                    d.waiters
                );
            } else if let (Some(n), Some(held)) = (d.permits, d.permits_held) {
                println!(
                    "{resource}: semaphore of {n} permits, {held} held, waiters={} (each permit is {resource}@permit-K)",
                    d.waiters
                );
            } else {
                println!("{resource}: free waiters={}", d.waiters);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            resource,
            locks,
            atomic,
            lock,
            grace,
            command,
        } => {
            if atomic && resource.is_some() {
                eprintln!("lockctl: --atomic takes the --lock set; name the resources with --lock");
                return Ok(ExitCode::from(2));
            }
            if atomic && (lock.read || lock.write) {
                eprintln!(
                    "lockctl: --atomic takes exclusive locks only: without --atomic, --read and --write take each --lock in sorted order"
                );
                return Ok(ExitCode::from(2));
            }
            if lock.permits.is_some() && resource.is_none() {
                eprintln!(
                    "lockctl: --permits takes one semaphore: give RESOURCE instead of --lock"
                );
                return Ok(ExitCode::from(2));
            }
            // The TTL given: a grace that cannot fit is refused before anything is taken.
            if let (Some(g), Some(ttl)) = (grace, lock.ttl)
                && let Err(e) = run::stop_budget(Some(g), ttl)
            {
                eprintln!("lockctl: {e}");
                return Ok(ExitCode::from(2));
            }
            let guards = match resource {
                Some(resource) => match client.acquire(&resource, lock.options(None)).await? {
                    Acquired::Granted(guard) => vec![guard],
                    Acquired::NotGranted(why) => return Ok(not_granted(&resource, &why, cli.json)),
                },
                None => {
                    // A name given twice is one lock, in both ways (its first place counts).
                    let mut names: Vec<&str> = Vec::with_capacity(locks.len());
                    for l in &locks {
                        if !names.contains(&l.as_str()) {
                            names.push(l);
                        }
                    }
                    let taken = match atomic {
                        true => client.acquire_all(&names, lock.options(None)).await?,
                        false => client.acquire_ordered(&names, lock.options(None)).await?,
                    };
                    match taken {
                        AcquiredAll::Granted(guards) => guards,
                        AcquiredAll::NotGranted { resource, why } => {
                            return Ok(not_granted(&resource, &why, cli.json));
                        }
                    }
                }
            };
            // Every lease has the TTL asked (or lockd's default): the budget is the shortest's.
            let ttl = guards.iter().map(|g| g.lease().ttl).min().expect("a lock");
            match run::stop_budget(grace, ttl) {
                Ok(budget) => Ok(run::run(guards, &command, budget).await),
                Err(e) => {
                    eprintln!("lockctl: {e}");
                    run::release_all(guards).await;
                    Ok(ExitCode::from(2))
                }
            }
        }
    }
}

fn not_granted(resource: &str, why: &NotGranted, json_out: bool) -> ExitCode {
    if json_out {
        let reason = match why.reason {
            NotGrantedReason::Busy => "busy",
            NotGrantedReason::WaitTimeout => "wait_timeout",
        };
        println!(
            "{}",
            json!({"resource": resource, "granted": false, "reason": reason, "holder": why.holder, "token": why.token, "waiters": why.waiters})
        );
    } else {
        eprintln!("lockctl: {resource} not granted: {why}");
    }
    ExitCode::from(EXIT_NOT_GRANTED)
}

/// Unix milliseconds as RFC 3339 (UTC), for people.
fn print_renewed(resource: &str, r: &lockd_client::RenewReply, json: bool) {
    if json {
        println!(
            "{}",
            json!({"resource": resource, "renewed": true, "expires_at_ms": r.expires_at_ms, "ttl_ms": r.ttl.as_millis() as u64})
        );
    } else {
        println!(
            "renewed {resource} ttl={} expires_at={}",
            humantime::format_duration(r.ttl),
            wall(r.expires_at_ms)
        );
    }
}

/// The leases of `renew` or `release`: the first pair, then the further ones.
fn pairs<'a>(
    resource: &'a str,
    lease_id: &'a str,
    more: &'a [String],
) -> Result<Vec<(&'a str, &'a str)>, ClientError> {
    if more.len() % 2 != 0 {
        return Err(ClientError::InvalidArgument(format!(
            "{} has no LEASE_ID after it: give leases as RESOURCE LEASE_ID pairs",
            more[more.len() - 1]
        )));
    }
    let mut leases = vec![(resource, lease_id)];
    leases.extend(more.chunks(2).map(|p| (p[0].as_str(), p[1].as_str())));
    Ok(leases)
}

fn wall(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(
        t.max(UNIX_EPOCH)
            .min(SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799)),
    )
    .to_string()
}

/// Held locks as a table (or one JSON object: `{"locks": [...]}`).
fn print_locks(locks: &[lockd_client::HeldLock], json: bool) {
    if json {
        println!("{}", json!({ "locks": locks }));
        return;
    }
    println!(
        "{:<40} {:>20} {:>12} {:>8}  HOLDER",
        "RESOURCE", "TOKEN", "HELD FOR", "WAITERS"
    );
    for l in locks {
        let held = humantime::format_duration(Duration::from_secs(l.held_for_ms / 1000));
        println!(
            "{:<40} {:>20} {:>12} {:>8}  {}",
            l.resource,
            l.token,
            held.to_string(),
            l.waiters,
            l.holder
        );
    }
}

/// A granted lease, as `acquire` and `downgrade` print it.
fn print_granted(lease: lockd_client::Lease, as_json: bool) {
    if as_json {
        println!(
            "{}",
            json!({
                "resource": lease.resource,
                "lease_id": lease.lease_id,
                "token": lease.token,
                "signed_token": lease.signed_token,
                "expires_at_ms": lease.expires_at_ms,
                "ttl_ms": lease.ttl.as_millis() as u64,
                "duplicate": lease.duplicate,
                "holds": lease.holds,
            })
        );
    } else {
        let mut signed = match &lease.signed_token {
            Some(s) => format!(" signed_token={s}"),
            None => String::new(),
        };
        if lease.holds > 1 {
            signed.push_str(&format!(" holds={}", lease.holds));
        }
        println!(
            "granted {} token={} lease_id={} ttl={} expires_at={}{signed}",
            lease.resource,
            lease.token,
            lease.lease_id,
            humantime::format_duration(lease.ttl),
            wall(lease.expires_at_ms)
        );
    }
}
