//! Who leads: the candidate whose node under `{p}/election` has the lowest sequence number.
//!
//! A candidate opens a ZooKeeper session of its own and creates an ephemeral sequential node
//! holding its [`LeaderRecord`]; if no node is lower, it leads. ZooKeeper deletes the node
//! when the session ends (closed, or expired because the leader was dead, paused or cut off
//! past the session timeout), and no node created later can be lower: a leader stays the
//! lowest for as long as its node lives.
//!
//! # Until when a leader may answer
//!
//! ZooKeeper expires a session no earlier than the session timeout after it last *received*
//! something of it. So after a call *sent* at `s` and answered, the session lives until at
//! least `s + timeout` by ZooKeeper's clock. The leader's [`Term::in_force`] holds until
//! `s + timeout - margin` by its own clock, with `margin = timeout / 10` for the two clocks'
//! rates. The clock is `CLOCK_BOOTTIME` ([`lockd_store_kv::boot_time`]): it keeps counting
//! while the process is stopped, so a leader that wakes up from a pause knows at once that
//! its term may be over. Each round of [`Cluster::keep_leading`] reads the leader's own node,
//! so a node deleted by hand ends the term within one round.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd_store_kv::records::LeaderRecord;
use lockd_store_kv::tenure::Tenure;
use lockd_store_kv::{Member, boot_time};
use tracing::{info, warn};
use zookeeper_client as zk;

use crate::{Cluster, ZkError, failed, session};

/// What a campaign ended with.
pub enum Campaign {
    Won(Term),
    /// Another candidate leads: its record (if it could be read) and its node's sequence
    /// number (for [`Cluster::leader_gone`]).
    Lost(Option<(LeaderRecord, u64)>),
}

/// One leader's time in office: its session, and its node.
pub struct Term {
    client: zk::Client,
    node: String,
    tenure: Tenure,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term").field("node", &self.node).finish()
    }
}

impl Term {
    fn new(client: zk::Client, node: String, sent_at: Duration) -> Term {
        Term {
            tenure: Tenure::new(client.session_timeout(), sent_at),
            client,
            node,
        }
    }

    /// The leader's election node (its path).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The session the term's calls go through.
    pub(crate) fn client(&self) -> &zk::Client {
        &self.client
    }

    /// The session timeout ZooKeeper granted.
    pub fn session_timeout(&self) -> Duration {
        self.tenure.timeout()
    }

    /// Whether this instance surely still leads.
    pub fn in_force(&self) -> bool {
        self.tenure.in_force()
    }

    /// Waits up to `within` for the term to be in force (a keep-alive round may be under
    /// way); false if it is not by then, or is over.
    pub async fn wait_in_force(&self, within: Duration) -> bool {
        self.tenure.wait_in_force(within).await
    }

    /// Ends the term (it will not be in force again), saying why.
    pub fn end(&self, why: &str) {
        self.tenure.end(why);
    }

    /// Why the term was ended, if it was.
    pub fn ended(&self) -> Option<String> {
        self.tenure.ended()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The sequence number ZooKeeper appended to a candidate's node name.
fn sequence(node: &str) -> Option<u64> {
    node.strip_prefix("member-")?.parse().ok()
}

impl Cluster {
    /// Runs for leadership as `me`: leads if its node is the lowest, else gives its node up
    /// and names the leader.
    pub async fn campaign(&self, me: &Member) -> Result<Campaign, ZkError> {
        let client = session(&self.connect, self.session_timeout, self.request_timeout).await?;
        let record = LeaderRecord {
            id: me.id.clone(),
            address: me.address.clone(),
            since_unix_ms: unix_ms(),
        };
        let data = serde_json::to_vec(&record).expect("a leader record serialises");
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let sent = boot_time();
        let candidate = self.paths.candidate();
        let (_, seq) = self
            .within(
                "creating the candidate's node",
                client.create(&candidate, &data, &options),
            )
            .await?;
        let node = format!("{candidate}{seq}");
        let mine = sequence(node.rsplit('/').next().unwrap_or_default());
        let lowest = self.lowest(&client).await?;
        match lowest {
            Some((seq, _)) if Some(seq) == mine => {
                info!(node = %node, "won the election");
                Ok(Campaign::Won(Term::new(client, node, sent)))
            }
            other => {
                // Given up at once; the session's end would delete it too.
                let _ = self
                    .answer("giving up the candidate's node", client.delete(&node, None))
                    .await;
                Ok(Campaign::Lost(
                    other.and_then(|(seq, record)| Some((record?, seq))),
                ))
            }
        }
    }

    /// The lowest candidate and its record, read through `client`.
    async fn lowest(
        &self,
        client: &zk::Client,
    ) -> Result<Option<(u64, Option<LeaderRecord>)>, ZkError> {
        let children = self
            .within(
                "listing the candidates",
                client.list_children(self.paths.election()),
            )
            .await?;
        let Some((seq, name)) = children
            .iter()
            .filter_map(|c| Some((sequence(c)?, c)))
            .min_by_key(|(seq, _)| *seq)
        else {
            return Ok(None);
        };
        let path = format!("{}/{name}", self.paths.election());
        let record = match self
            .answer("reading the leader", client.get_data(&path))
            .await?
        {
            Ok((data, _)) => serde_json::from_slice(&data).ok(),
            Err(zk::Error::NoNode) => None,
            Err(e) => return Err(failed("reading the leader", e)),
        };
        Ok(Some((seq, record)))
    }

    /// The current leader (its record and its node's sequence number), if there is one; the
    /// stored high-water is noted on the way (a follower's part of the high-water guard).
    pub async fn observe(&self) -> Result<Option<(LeaderRecord, u64)>, ZkError> {
        let client = self.reader().await?;
        let doing = "reading the token high-water";
        if let Ok(Ok((data, _))) = self
            .answer(doing, client.get_data(self.paths.high_water()))
            .await
            && let Ok(value) = lockd_store_kv::high_water_value(self.paths.high_water(), &data)
        {
            self.highwater.saw(value);
        }
        Ok(self
            .lowest(&client)
            .await?
            .and_then(|(seq, r)| Some((r?, seq))))
    }

    /// Returns when the leader's node (sequence number `seq`) is deleted or changed, or the
    /// session that watches it ends; at once if it is gone already. Never, if it cannot be
    /// watched (ZooKeeper unreachable): the follower's next poll finds out.
    pub async fn leader_gone(&self, seq: u64) {
        let Ok(client) = self.reader().await else {
            return std::future::pending().await;
        };
        let path = format!("{}/member-{seq:010}", self.paths.election());
        match self
            .answer(
                "watching the leader's node",
                client.check_and_watch_stat(&path),
            )
            .await
        {
            Ok(Ok((Some(_), watcher))) => {
                watcher.changed().await;
            }
            Ok(Ok((None, _))) => {}
            _ => std::future::pending().await,
        }
    }

    /// Keeps `term` in force: reads its node every sixth of the session timeout, extending
    /// the term by each answer. Returns why the term ended: its node is gone, its session
    /// expired, or no answer came before the term ran out.
    pub async fn keep_leading(&self, term: &Term) -> String {
        let every = term.session_timeout() / 6;
        loop {
            if let Some(why) = term.ended() {
                return why;
            }
            let sent = boot_time();
            match self
                .answer(
                    "reading the leader's node",
                    term.client.check_stat(&term.node),
                )
                .await
            {
                Ok(Ok(Some(_))) => term.tenure.extend(sent),
                Ok(Ok(None)) => {
                    term.end("the leader's election node was deleted");
                    continue;
                }
                Ok(Err(zk::Error::SessionExpired)) => {
                    term.end("the leader's ZooKeeper session expired");
                    continue;
                }
                Ok(Err(e)) => warn!(error = %e, "cannot read the leader's node"),
                Err(e) => warn!(error = %e, "cannot read the leader's node"),
            }
            if !term.in_force() {
                term.end("ZooKeeper did not answer before the session could have expired");
                continue;
            }
            term.tenure.pause(every).await;
        }
    }

    /// Ends `term` and deletes its node, so that the next candidate need not wait for the
    /// session to expire.
    pub async fn resign(&self, term: &Term) {
        term.end("resigned");
        if let Err(e) = self
            .within(
                "deleting the leader's node",
                term.client.delete(&term.node, None),
            )
            .await
        {
            warn!(error = %e, node = %term.node, "cannot delete the leader's node; it goes when its session expires");
        }
    }
}
