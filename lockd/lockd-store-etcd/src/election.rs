//! Who leads: the holder of `{p}/leader`, a key written under the holder's leadership lease.
//!
//! A candidate grants itself a lease and puts the key only if it does not exist (one
//! transaction); etcd deletes the key when the lease runs out, so a dead or paused leader is
//! replaced within the lease TTL (plus etcd's expiry check, every 500 ms).
//!
//! # Until when a leader may answer
//!
//! etcd starts a lease's TTL when it *receives* a grant or a keep-alive, and never expires it
//! earlier (an etcd leader change even gives every lease a full TTL again). So after a
//! keep-alive *sent* at `s` and answered with TTL `t`, nobody else can be leader before
//! `s + t` by etcd's clock. The leader's [`Term::in_force`] holds until `s + t - margin` by its
//! own clock, with `margin = TTL / 10` for the two clocks' rates (assumed within 1 % of each
//! other, far looser than NTP's 500 ppm). The clock is `CLOCK_BOOTTIME`: it keeps counting
//! while the process is stopped or the machine suspended, so a leader that wakes up knows at
//! once that its term may be over. Each keep-alive round also reads the leader key, so a key
//! deleted by hand ends the term within one round.
//!
//! The margin covers rates, not jumps: beside the keep-alives, each term checks its clock
//! against etcd's every 100 ms ([`clockcheck`](crate::clockcheck)), answers only
//! [`Term::trust`] past the last check that passed, lets leases expire only up to what etcd's
//! clock has proven ([`Term::proven`]), and ends when the two clocks disagree.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::clockcheck::{Baseline, CHECK_EVERY, CLOCK_LEASE_TTL_S, OVERLAP, Verdict, Witness};
use crate::keys::LeaderRecord;
use crate::{Cluster, EtcdError, conn, decimal};

pub use lockd_store_kv::boot_time;

pub use lockd_store_kv::Member;

/// One leader's time in office.
#[derive(Debug)]
pub struct Term {
    lease: i64,
    revision: i64,
    ttl: Duration,
    margin: Duration,
    /// Boot-time nanoseconds until which the leadership surely holds.
    deadline_ns: AtomicU64,
    /// Boot-time nanoseconds at which the last clock check that found this clock keeping
    /// etcd's time was sent (see [`clockcheck`](crate::clockcheck)); the clock is trusted
    /// [`Term::trust`] beyond it.
    verified_ns: watch::Sender<u64>,
    /// Boot-time nanoseconds up to which etcd's clock has surely run (in this clock's
    /// terms): leases expire only up to there ([`Term::proven`]).
    proven_ns: AtomicU64,
    /// The clock lease of the current check (0: none yet), and the next one while both are
    /// read; revoked with the term.
    clock_lease: AtomicI64,
    clock_next: AtomicI64,
    /// The term was ended before its lease ran out ([`Term::end`]), and why.
    over: AtomicBool,
    ended: std::sync::Mutex<Option<String>>,
}

impl Term {
    fn new(lease: i64, revision: i64, ttl: Duration, sent_at: Duration) -> Term {
        let term = Term {
            lease,
            revision,
            ttl,
            margin: ttl / 10,
            deadline_ns: AtomicU64::new(0),
            verified_ns: watch::channel(sent_at.as_nanos() as u64).0,
            proven_ns: AtomicU64::new(sent_at.as_nanos() as u64),
            clock_lease: AtomicI64::new(0),
            clock_next: AtomicI64::new(0),
            over: AtomicBool::new(false),
            ended: std::sync::Mutex::new(None),
        };
        term.extend(sent_at, ttl);
        term
    }

    /// How far beyond its last passing check this instance trusts its clock: a third of the
    /// leadership TTL. Past it, the term is not in force and the core's time stands still
    /// (see [`Term::trust_left_ns`]) until a check passes again.
    pub fn trust(&self) -> Duration {
        self.ttl / 3
    }

    /// How long the clock is still trusted, in nanoseconds: negative once the trust has run
    /// out (by as much as it is overdue).
    pub fn trust_left_ns(&self) -> i128 {
        self.trusted_until_ns() - boot_time().as_nanos() as i128
    }

    /// Boot-time nanoseconds until which the clock is trusted.
    fn trusted_until_ns(&self) -> i128 {
        *self.verified_ns.borrow() as i128 + self.trust().as_nanos() as i128
    }

    /// Resolves at the next clock check that passes.
    pub fn verified(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.verified_ns.subscribe();
        async move {
            let _ = rx.changed().await;
        }
    }

    /// The boot time up to which etcd's clock has surely run, by the clock checks: nothing
    /// may expire by a later time (the clock may have jumped since the last check).
    pub fn proven(&self) -> Duration {
        Duration::from_nanos(self.proven_ns.load(Ordering::Acquire))
    }

    fn proven_at(&self, proven: Duration) {
        self.proven_ns
            .fetch_max(proven.as_nanos() as u64, Ordering::AcqRel);
    }

    fn verified_at(&self, sent: Duration) {
        self.verified_ns.send_if_modified(|v| {
            let sent = sent.as_nanos() as u64;
            let later = sent > *v;
            if later {
                *v = sent;
            }
            later
        });
    }

    /// Ends the term at once (a clock fault): nothing is answered or committed from now on.
    pub fn end(&self, why: &str) {
        self.over.store(true, Ordering::Release);
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        ended.get_or_insert_with(|| why.to_string());
    }

    /// Why the term was ended early, if it was.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The leadership lease.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// The leader key's create revision: what every write of this term is conditional on.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Whether this instance surely still leads (see the module documentation), and its
    /// clock has been found keeping etcd's time within [`Term::trust`].
    pub fn in_force(&self) -> bool {
        let now = boot_time().as_nanos();
        !self.over.load(Ordering::Acquire)
            && (now as u64) < self.deadline_ns.load(Ordering::Acquire)
            && (now as i128) < self.trusted_until_ns()
    }

    /// Waits (up to `within`) until the term is in force, if only the clock's trust has run
    /// out (a clock check is late); `false` when the term is over or stays out of force.
    pub async fn wait_in_force(&self, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            let again = self.verified();
            if self.in_force() {
                return true;
            }
            let lease_left =
                (boot_time().as_nanos() as u64) < self.deadline_ns.load(Ordering::Acquire);
            if self.over.load(Ordering::Acquire) || !lease_left {
                return false;
            }
            if tokio::time::timeout_at(until, again).await.is_err() {
                return false;
            }
        }
    }

    /// Until when (boot time) the leadership surely holds.
    pub fn deadline(&self) -> Duration {
        Duration::from_nanos(self.deadline_ns.load(Ordering::Acquire))
    }

    fn extend(&self, sent_at: Duration, ttl: Duration) {
        let until = (sent_at + ttl).saturating_sub(self.margin);
        self.deadline_ns
            .fetch_max(until.as_nanos() as u64, Ordering::AcqRel);
    }
}

/// What a campaign came to.
#[derive(Debug)]
pub enum Campaign {
    Won(Term),
    /// Someone else leads: its record (`None`: the key holds something lockd did not
    /// write) and its leadership lease.
    Lost(Option<LeaderRecord>, i64),
}

fn etcd_ttl_s(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(2)
}

fn first_kv(r: Option<&TxnOpResponse>) -> Option<&etcd_client::KeyValue> {
    match r {
        Some(TxnOpResponse::Get(g)) => g.kvs().first(),
        _ => None,
    }
}

impl Cluster {
    /// Tries once to become the leader.
    pub async fn campaign(&self, me: &Member) -> Result<Campaign, EtcdError> {
        self.revoke_given_up().await;
        let ttl_s = etcd_ttl_s(self.leader_ttl);
        let sent_at = boot_time();
        let lease = self
            .etcd
            .call(
                self.deadline(),
                "granting the leadership lease",
                |mut c| async move { c.lease_grant(ttl_s, None).await },
            )
            .await?;
        let record = LeaderRecord {
            id: me.id.clone(),
            address: me.address.clone(),
            since_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        let key = self.keys.leader();
        let value = serde_json::to_string(&record).expect("a leader record serialises");
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease.id())),
            )])
            .or_else([TxnOp::get(key, None)]);
        let r = self.txn("campaigning for leadership", txn).await?;
        let ttl = Duration::from_secs(lease.ttl().max(0) as u64);
        if r.succeeded() {
            let revision = r.header().map_or(0, |h| h.revision());
            return Ok(Campaign::Won(Term::new(lease.id(), revision, ttl, sent_at)));
        }
        let responses = r.op_responses();
        let current = first_kv(responses.first());
        if let Some(kv) = current
            && kv.lease() == lease.id()
        {
            // An earlier attempt of this very transaction committed; its answer was lost.
            return Ok(Campaign::Won(Term::new(
                lease.id(),
                kv.create_revision(),
                ttl,
                sent_at,
            )));
        }
        self.revoke(lease.id()).await;
        Ok(Campaign::Lost(
            current.and_then(|kv| serde_json::from_slice(kv.value()).ok()),
            current.map_or(0, etcd_client::KeyValue::lease),
        ))
    }

    /// Keeps `term`'s lease alive, and checks this instance's clock against etcd's; returns
    /// why the term ended (it never ends otherwise).
    pub async fn keep_leading(&self, term: &Term) -> String {
        tokio::select! {
            why = self.keep_lease(term) => why,
            why = self.check_clock(term) => why,
        }
    }

    /// Checks, every third of [`Term::trust`], that this instance's clock keeps etcd's time
    /// (see [`clockcheck`](crate::clockcheck)); ends the term, and returns why, when it does
    /// not.
    async fn check_clock(&self, term: &Term) -> String {
        let mut witness: Option<Witness> = None;
        // The next clock lease, read beside the current one since the boot time given.
        let mut next: Option<(Witness, Duration)> = None;
        let mut failing = false;
        let mut last = boot_time();
        loop {
            let now = boot_time();
            if now + BACKWARDS_SLACK < last {
                let why = format!(
                    "this instance's clock went backwards by {:?}",
                    last.saturating_sub(now)
                );
                return self.clock_fault(term, why);
            }
            last = last.max(now);
            if term.trust_left_ns() < -(term.ttl.as_nanos() as i128) {
                let why = format!(
                    "this instance's clock could not be checked against etcd's for {:?}",
                    term.ttl + term.trust()
                );
                term.end(&why);
                return why;
            }
            let Some(w) = witness.as_mut() else {
                match self.clock_baseline(term).await {
                    Ok(b) => {
                        // A new clock lease proves nothing yet; the interval it cannot
                        // compare (an etcd leader change) does not end the trust either.
                        term.verified_at(b.sent);
                        witness = Some(Witness::new(b));
                        failing = false;
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut failing, true) {
                            warn!(error = %e, "cannot grant the clock lease; retrying");
                        }
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                }
                continue;
            };
            tokio::time::sleep(CHECK_EVERY).await;
            let sent = boot_time();
            let verdict = match self.read_clock(w, term).await {
                Ok(v) => v,
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        warn!(error = %e, "cannot read the clock lease; retrying");
                    }
                    continue;
                }
            };
            failing = false;
            match verdict {
                Verdict::Agrees { proven } => {
                    term.proven_at(proven);
                    term.verified_at(sent);
                }
                Verdict::Rebase => {
                    witness = None;
                    next = None;
                    for lease in [&term.clock_lease, &term.clock_next] {
                        let old = lease.swap(0, Ordering::AcqRel);
                        if old != 0 {
                            self.revoke_later(old);
                        }
                    }
                    continue;
                }
                Verdict::Ahead { by } => return self.clock_fault(term, ahead(by)),
                Verdict::Behind { by } => return self.clock_fault(term, behind(by)),
            }
            // Half the clock lease has run: the next one is read beside it for a while first.
            if w.aging() && next.is_none() {
                match self.clock_baseline(term).await {
                    Ok(b) => next = Some((Witness::new(b), boot_time())),
                    Err(e) => warn!(error = %e, "cannot grant the next clock lease; retrying"),
                }
            }
            if let Some((n, since)) = next.as_mut() {
                match self.read_clock(n, term).await {
                    Ok(Verdict::Ahead { by }) => return self.clock_fault(term, ahead(by)),
                    Ok(Verdict::Behind { by }) => return self.clock_fault(term, behind(by)),
                    Ok(Verdict::Rebase) => {
                        next = None;
                        let old = term.clock_next.swap(0, Ordering::AcqRel);
                        if old != 0 {
                            self.revoke_later(old);
                        }
                    }
                    Ok(Verdict::Agrees { .. }) if boot_time() > *since + OVERLAP => {
                        let old = w.baseline().lease;
                        witness = next.take().map(|(n, _)| n);
                        term.clock_next.store(0, Ordering::Release);
                        term.clock_lease.store(
                            witness.as_ref().map_or(0, |w| w.baseline().lease),
                            Ordering::Release,
                        );
                        self.revoke_later(old);
                    }
                    Ok(Verdict::Agrees { .. }) | Err(_) => {}
                }
            }
        }
    }

    /// One reading of `w`'s clock lease, judged.
    async fn read_clock(&self, w: &mut Witness, term: &Term) -> Result<Verdict, EtcdError> {
        let sent = boot_time();
        let id = w.baseline().lease;
        let r = self
            .etcd
            .call(
                Instant::now() + term.trust(),
                "reading the clock lease",
                |mut c| async move { c.lease_time_to_live(id, None).await },
            )
            .await?;
        let raft_term = r.header().map_or(0, |h| h.raft_term());
        Ok(w.judge(sent, boot_time(), r.ttl(), raft_term))
    }

    fn clock_fault(&self, term: &Term, why: String) -> String {
        error!(reason = %why, "clock fault: giving the leadership up before deciding anything by this clock");
        term.end(&why);
        why
    }

    /// Grants a new clock lease: the start of a clock check. The term keeps its id, to
    /// revoke it with the term.
    async fn clock_baseline(&self, term: &Term) -> Result<Baseline, EtcdError> {
        let sent = boot_time();
        let r = self
            .etcd
            .call(
                Instant::now() + term.trust(),
                "granting the clock lease",
                |mut c| async move { c.lease_grant(CLOCK_LEASE_TTL_S, None).await },
            )
            .await?;
        let (current, next) = (&term.clock_lease, &term.clock_next);
        if current.load(Ordering::Acquire) == 0 {
            current.store(r.id(), Ordering::Release);
        } else {
            let old = next.swap(r.id(), Ordering::AcqRel);
            if old != 0 {
                self.revoke_later(old);
            }
        }
        Ok(Baseline {
            lease: r.id(),
            ttl_s: r.ttl(),
            sent,
            answered: boot_time(),
            raft_term: r.header().map_or(0, |h| h.raft_term()),
        })
    }

    fn revoke_later(&self, lease: i64) {
        let mut c = self.etcd.any();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(conn::ATTEMPT_TIMEOUT, c.lease_revoke(lease)).await;
        });
    }

    /// Keeps `term`'s lease alive and returns why the term ended.
    async fn keep_lease(&self, term: &Term) -> String {
        let every = term.ttl / 3;
        let mut pause = every;
        loop {
            let deadline = term.deadline();
            let wake = (boot_time() + pause).min(deadline);
            tokio::time::sleep(wake.saturating_sub(boot_time())).await;
            if let Some(why) = term.ended() {
                return why;
            }
            if (boot_time().as_nanos() as u64) >= term.deadline_ns.load(Ordering::Acquire) {
                return format!(
                    "the leadership lease could not be renewed in time (TTL {:?}, last keep-alive answered more than {:?} ago)",
                    term.ttl,
                    term.ttl - term.margin
                );
            }
            let sent_at = boot_time();
            let left = term.deadline().saturating_sub(sent_at);
            match self.renew_term(term, left.min(every)).await {
                // A keep-alive gives the lease its granted TTL again.
                Ok(true) => {
                    term.extend(sent_at, term.ttl);
                    pause = every;
                }
                Ok(false) => return "the leadership lease or the leader key is gone".to_string(),
                Err(e) => {
                    warn!(error = %e, "cannot renew the leadership lease; retrying");
                    pause = RETRY_AFTER.min(every);
                }
            }
        }
    }

    /// One keep-alive of the term's lease, then a check that the leader key is still the
    /// term's. `Ok(false)`: the term is over.
    async fn renew_term(&self, term: &Term, within: Duration) -> Result<bool, EtcdError> {
        let deadline = Instant::now() + within;
        let id = term.lease;
        // etcd-client reads the keep-alive's answer itself: an error if the lease is gone.
        let alive = self
            .etcd
            .call(
                deadline,
                "keeping the leadership lease alive",
                |mut c| async move {
                    match c.lease_keep_alive(id).await {
                        Ok(_) => Ok(true),
                        Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                        Err(e) => Err(e),
                    }
                },
            )
            .await?;
        if !alive {
            return Ok(false);
        }
        let key = self.keys.leader();
        let r = self
            .etcd
            .call(deadline, "reading the leader key", |mut c| async move {
                c.get(key, None).await
            })
            .await?;
        Ok(r.kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == term.revision))
    }

    /// Gives the term up at once (its key goes with the lease), so that another instance
    /// need not wait for the TTL.
    pub async fn resign(&self, term: &Term) {
        let clock = term.clock_lease.swap(0, Ordering::AcqRel);
        let next = term.clock_next.swap(0, Ordering::AcqRel);
        for lease in [term.lease, clock, next] {
            if lease != 0 && !self.revoke(lease).await {
                // etcd could not take it (no quorum, say): the next campaign tries again, so
                // that a quorum back does not leave the others waiting for the TTL.
                let mut unrevoked = self.unrevoked.lock().unwrap_or_else(|e| e.into_inner());
                if unrevoked.len() >= MAX_UNREVOKED {
                    unrevoked.remove(0);
                }
                unrevoked.push(lease);
            }
        }
        info!(lease = term.lease, "resigned the leadership");
    }

    /// Revokes `lease`; whether it is gone (revoked now, or not found).
    async fn revoke(&self, lease: i64) -> bool {
        let mut c = self.etcd.any();
        match tokio::time::timeout(conn::ATTEMPT_TIMEOUT, c.lease_revoke(lease)).await {
            Ok(Ok(_)) => true,
            Ok(Err(etcd_client::Error::GRpcStatus(s))) => s.code() == tonic::Code::NotFound,
            _ => false,
        }
    }

    /// Revokes the leases of terms given up while etcd could not take their revocation.
    async fn revoke_given_up(&self) {
        let pending =
            std::mem::take(&mut *self.unrevoked.lock().unwrap_or_else(|e| e.into_inner()));
        for lease in pending {
            if self.revoke(lease).await {
                info!(
                    lease,
                    "revoked the lease of a term given up while etcd had no quorum"
                );
            } else {
                self.unrevoked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(lease);
            }
        }
    }

    /// Whether a leadership lease is still alive in etcd.
    pub async fn lease_alive(&self, lease: i64) -> Result<bool, EtcdError> {
        let r = self
            .etcd
            .call(
                self.deadline(),
                "reading a leadership lease",
                |mut c| async move { c.lease_time_to_live(lease, None).await },
            )
            .await?;
        Ok(r.ttl() > 0)
    }

    /// What a follower reads: the leader (if any) with its leadership lease; and the stored
    /// token high-water, which it writes down (see [`highwater`](crate::highwater)).
    pub async fn observe(&self) -> Result<Option<(LeaderRecord, i64)>, EtcdError> {
        let (leader, hw) = (self.keys.leader(), self.keys.high_water());
        let txn = Txn::new().and_then([TxnOp::get(leader, None), TxnOp::get(hw, None)]);
        let r = self.txn("reading the leader", txn).await?;
        let ops = r.op_responses();
        let leader = first_kv(ops.first()).and_then(|kv| {
            serde_json::from_slice(kv.value())
                .ok()
                .map(|l| (l, kv.lease()))
        });
        // A damaged high-water must not keep followers from seeing the leader go (the next
        // leader refuses to load it, loudly).
        let high_water = match first_kv(ops.get(1)).map(|kv| decimal(hw, kv.value())) {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                warn!(error = %e, "the stored token high-water is damaged");
                0
            }
            None => 0,
        };
        self.highwater.saw(high_water);
        Ok(leader)
    }
}

fn ahead(by: Duration) -> String {
    format!(
        "this instance's clock ran ahead of etcd's by at least {by:?} (a clock jump, or a clock running fast)"
    )
}

fn behind(by: Duration) -> String {
    format!("this instance's clock fell behind etcd's by at least {by:?} (a clock running slow)")
}

/// How far the clock may seem to go back (two readings on different CPUs) before it is a
/// clock fault.
const BACKWARDS_SLACK: Duration = Duration::from_millis(1);

/// Most leases of given-up terms kept for a later revocation (the oldest run out by
/// themselves).
const MAX_UNREVOKED: usize = 16;

/// The pause before a keep-alive is tried again after etcd did not answer.
const RETRY_AFTER: Duration = Duration::from_millis(200);
