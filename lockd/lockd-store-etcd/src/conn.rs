//! The connection to the etcd cluster: one client per member, and calls that fail over.
//!
//! etcd-client balances one channel over every endpoint, but a member that is stopped
//! (SIGSTOP, a frozen VM) still accepts connections and then never answers, so a call routed
//! to it hangs. Here every call has a per-attempt timeout and moves to the next member when an
//! attempt fails or times out, until the call's deadline; then the caller answers UNAVAILABLE.
//! Calls that change state are written so that a retry after an attempt that did commit is
//! recognised (conditional transactions on values the attempt wrote), never applied twice.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::Instant;

use crate::LockError;

/// Longest a single attempt on one member may take before the next member is tried: a bit
/// more than etcd's default election timeout, so that a leader change is waited out once.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);

pub struct Etcd {
    members: Vec<(String, Client)>,
    preferred: AtomicUsize,
}

impl Etcd {
    /// Clients for each endpoint (connections are made lazily: a member that is down now is
    /// simply skipped by calls until it is back).
    pub async fn connect(endpoints: &[String]) -> Result<Etcd, LockError> {
        let mut members = Vec::new();
        for e in endpoints {
            let options = ConnectOptions::new()
                .with_connect_timeout(ATTEMPT_TIMEOUT)
                .with_keep_alive(Duration::from_secs(2), ATTEMPT_TIMEOUT)
                // A member without a leader refuses at once instead of queueing the request.
                .with_require_leader(true);
            let client = Client::connect([e.as_str()], Some(options))
                .await
                .map_err(|err| LockError::Config(format!("etcd endpoint {e:?}: {err}")))?;
            members.push((e.clone(), client));
        }
        if members.is_empty() {
            return Err(LockError::Config("no etcd endpoints given".to_string()));
        }
        Ok(Etcd {
            members,
            preferred: AtomicUsize::new(0),
        })
    }

    /// Asks the members which one leads, and sends calls there first: a write sent to a
    /// follower is forwarded to the leader, one more hop. Members that do not answer within
    /// `budget` are skipped; with no answer the preference stays as it was.
    pub async fn prefer_leader(&self, budget: Duration) {
        let mut asks = tokio::task::JoinSet::new();
        for (i, (_, c)) in self.members.iter().enumerate() {
            let mut c = c.clone();
            asks.spawn(async move { (i, tokio::time::timeout(budget, c.status()).await) });
        }
        let mut leader = None;
        let mut ids = Vec::new();
        while let Some(Ok((i, answer))) = asks.join_next().await {
            if let Ok(Ok(s)) = answer {
                if let Some(h) = s.header() {
                    ids.push((h.member_id(), i));
                }
                if s.leader() != 0 {
                    leader = Some(s.leader());
                }
            }
        }
        if let Some(l) = leader
            && let Some(&(_, i)) = ids.iter().find(|(id, _)| *id == l)
        {
            self.preferred.store(i, Ordering::Relaxed);
        }
    }

    /// The member calls go to first (for fire-and-forget clean-ups).
    pub fn any(&self) -> Client {
        let i = self.preferred.load(Ordering::Relaxed) % self.members.len();
        self.members[i].1.clone()
    }

    /// Runs `op` on one member after another until it succeeds, fails for good, or `deadline`
    /// passes (UNAVAILABLE, naming `what` and the last failure).
    pub async fn call<T, F, Fut>(
        &self,
        deadline: Instant,
        what: &str,
        mut op: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = String::from("no attempt was made");
        for attempt in 0.. {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let i = (first + attempt) % n;
            let (name, client) = &self.members[i];
            let budget = (deadline - now).min(ATTEMPT_TIMEOUT);
            match tokio::time::timeout(budget, op(client.clone())).await {
                Ok(Ok(v)) => {
                    if i != first {
                        self.preferred.store(i, Ordering::Relaxed);
                    }
                    return Ok(v);
                }
                Ok(Err(e)) if !retryable(&e) => {
                    return Err(LockError::Etcd(format!("{what}: {e}")));
                }
                Ok(Err(e)) => last = format!("{name}: {e}"),
                Err(_) => last = format!("{name}: no answer within {budget:?}"),
            }
        }
        Err(LockError::Unavailable(format!(
            "etcd did not complete {what} in time (no quorum, or unreachable); last failure: {last}"
        )))
    }
}

/// Whether another member, or a later attempt, may succeed where this one failed.
fn retryable(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Unknown
                | Code::Cancelled
                | Code::Aborted
                | Code::Internal
        ),
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::WatchError(_) => true,
        _ => false,
    }
}
