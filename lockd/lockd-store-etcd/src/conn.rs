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

use crate::EtcdError;

/// Longest a single attempt on one member may take before the next member is tried: a bit
/// more than etcd's default election timeout, so that a leader change is waited out once.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);

/// The pause after a round in which every member failed, doubling up to [`MAX_ROUND_PAUSE`]:
/// members that refuse at once (no leader, connection refused) are not asked in a busy loop.
const FIRST_ROUND_PAUSE: Duration = Duration::from_millis(50);
const MAX_ROUND_PAUSE: Duration = Duration::from_millis(500);

pub struct Etcd {
    members: Vec<(String, Client)>,
    preferred: AtomicUsize,
    /// The members are reached over TLS: a connection they close may be a refused
    /// certificate, which the error then says it may be.
    tls: bool,
}

impl Etcd {
    /// Clients for each endpoint (connections are made lazily: a member that is down now is
    /// simply skipped by calls until it is back).
    pub async fn connect(
        endpoints: &[String],
        tls: Option<&etcd_client::TlsOptions>,
    ) -> Result<Etcd, EtcdError> {
        let mut members = Vec::new();
        for e in endpoints {
            let mut options = ConnectOptions::new()
                .with_connect_timeout(ATTEMPT_TIMEOUT)
                .with_keep_alive(Duration::from_secs(2), ATTEMPT_TIMEOUT)
                // A member without a leader refuses at once instead of queueing the request.
                .with_require_leader(true);
            if let Some(tls) = tls {
                options = options.with_tls(tls.clone());
            }
            let client = Client::connect([e.as_str()], Some(options))
                .await
                .map_err(|err| EtcdError::Config(format!("etcd endpoint {e:?}: {err}")))?;
            members.push((e.clone(), client));
        }
        if members.is_empty() {
            return Err(EtcdError::Config("no etcd endpoints given".to_string()));
        }
        Ok(Etcd {
            members,
            preferred: AtomicUsize::new(0),
            tls: tls.is_some(),
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

    /// Member `i`, tried first by a call, just failed: if calls still go to it first, send
    /// them to the next one. (Only a call's first member is moved off: a round in which every
    /// member fails would otherwise bring the preference back to where it started.)
    fn avoid(&self, i: usize) {
        let next = (i + 1) % self.members.len();
        let _ = self
            .preferred
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs `op` on one member after another until it succeeds, fails for good, or `deadline`
    /// passes (UNAVAILABLE, naming `what` and the last failure).
    ///
    /// An attempt takes at most [`ATTEMPT_TIMEOUT`], and at most half of what is left while
    /// other members are still untried in this round, so a short call (the session's
    /// keep-alive) reaches a second member even when the first never answers. A member that
    /// a call tries first and that fails is no longer tried first by the calls that follow
    /// (unless another call has moved the preference meanwhile); the leader check brings
    /// calls back to the leader.
    pub async fn call<T, F, Fut>(
        &self,
        deadline: Instant,
        what: &str,
        mut op: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut last = String::from("no attempt was made");
        let mut round_pause = FIRST_ROUND_PAUSE;
        for attempt in 0.. {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let i = (first + attempt) % n;
            let (name, client) = &self.members[i];
            let left = deadline - now;
            let mut budget = left.min(ATTEMPT_TIMEOUT);
            if attempt % n + 1 < n {
                budget = budget.min(left / 2);
            }
            match tokio::time::timeout(budget, op(client.clone())).await {
                Ok(Ok(v)) => {
                    if i != first {
                        self.preferred.store(i, Ordering::Relaxed);
                    }
                    return Ok(v);
                }
                Ok(Err(e)) if !retryable(&e) => {
                    return Err(EtcdError::Etcd(format!("{what}: {}", causes(&e))));
                }
                Ok(Err(e)) => {
                    last = format!("{name}: {}", causes(&e));
                    if self.tls
                        && matches!(
                            e,
                            etcd_client::Error::GRpcStatus(_)
                                | etcd_client::Error::TransportError(_)
                        )
                    {
                        last.push_str(" (over TLS: a closed connection may be a certificate refused; does etcd_ca verify the member, and does the member accept etcd_cert?)");
                    }
                }
                Err(_) => last = format!("{name}: no answer within {budget:?}"),
            }
            if attempt == 0 {
                self.avoid(i);
            }
            if attempt % n + 1 == n {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                tokio::time::sleep(round_pause.min(deadline - now)).await;
                round_pause = (round_pause * 2).min(MAX_ROUND_PAUSE);
            }
        }
        Err(EtcdError::Unavailable(format!(
            "etcd did not complete {what} in time (no quorum, or unreachable); last failure: {last}"
        )))
    }
}

/// An error and its causes, each after a colon: a transport error says only "transport
/// error" itself, and its cause is what an operator needs (a refused TLS certificate, a
/// refused connection).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Three members on ports nothing listens on: the calls below never use the client they
    /// are given, they only count attempts (attempt k goes to member (first + k) % 3).
    async fn three() -> Etcd {
        let endpoints: Vec<String> = (1..=3).map(|p| format!("http://127.0.0.1:{p}")).collect();
        Etcd::connect(&endpoints, None)
            .await
            .expect("connecting is lazy")
    }

    fn refused() -> etcd_client::Error {
        etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_call_reaches_a_second_member_when_the_first_never_answers() {
        let etcd = three().await;
        let attempts = Arc::new(AtomicUsize::new(0));
        // The session keep-alive's deadline with a 2 s TTL: shorter than ATTEMPT_TIMEOUT.
        let deadline = Instant::now() + Duration::from_millis(666);
        let got = etcd
            .call(deadline, "a keep-alive", |_| {
                let k = attempts.fetch_add(1, Ordering::Relaxed);
                async move {
                    if k == 0 {
                        std::future::pending::<()>().await;
                    }
                    Ok(k)
                }
            })
            .await;
        assert_eq!(got.expect("the second member answers in time"), 1);
        assert_eq!(etcd.preferred.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_call_does_not_start_at_the_member_that_failed() {
        let etcd = three().await;
        let deadline = Instant::now() + Duration::from_secs(3);
        let got: Result<(), _> = etcd
            .call(deadline, "a read", |_| std::future::pending())
            .await;
        let err = got.expect_err("no member answers");
        assert!(matches!(err, EtcdError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("no answer within"), "{err}");
        assert_eq!(
            etcd.preferred.load(Ordering::Relaxed),
            1,
            "calls still start at the member that never answered"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn members_that_refuse_at_once_are_not_asked_in_a_busy_loop() {
        let etcd = three().await;
        let attempts = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + Duration::from_secs(3);
        let got: Result<(), _> = etcd
            .call(deadline, "a write", |_| {
                let k = attempts.fetch_add(1, Ordering::Relaxed);
                // Without pauses the clock (paused) never moves: end the loop for good.
                async move {
                    Err(if k >= 1000 {
                        etcd_client::Error::InvalidArgs("spinning".to_string())
                    } else {
                        refused()
                    })
                }
            })
            .await;
        let err = got.expect_err("every member refuses");
        assert!(matches!(err, EtcdError::Unavailable(_)), "{err:?}");
        // Rounds at 0, 50, 150, 350, 750 ms, then every 500 ms until 3 s: 9 rounds of 3.
        assert_eq!(attempts.load(Ordering::Relaxed), 27);
    }
}
