//! Who leads: the instance whose value `{p}:leader` holds.
//!
//! A candidate asks the Sentinels for the master, checks that it is a master that syncs its
//! append-only file on every write, and takes the key with `SET NX PX` (in [`CAMPAIGN`],
//! which also raises `{p}:epoch` to the term's epoch). The leader renews the key every sixth
//! of its TTL, by a script that extends it only while it holds this term's value, and its
//! term is in force until the TTL past the last renewal it *sent* and saw answered, less a
//! tenth ([`Tenure`]): Redis cannot expire the key before then by its own clock.
//!
//! A term runs on the master it was won on, through one connection: it ends when the key is
//! no longer its own, when the master refuses writes (demoted to a replica), when the
//! Sentinels name another master or another configuration epoch, or when no renewal was
//! answered before the term ran out.
//!
//! [`CAMPAIGN`]: crate::scripts::CAMPAIGN

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockd_store_kv::records::LeaderRecord;
use lockd_store_kv::tenure::Tenure;
use lockd_store_kv::{Member, boot_time};
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::scripts::{CAMPAIGN, RENEW, RESIGN};
use crate::{Cluster, Master, RedisError};

/// What the leader key holds: the leader's record, and what makes the value this term's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaderValue {
    #[serde(flatten)]
    pub record: LeaderRecord,
    /// The master the term was won on.
    pub master: String,
    /// Random per term.
    pub term: String,
}

/// What a campaign ended with.
pub enum Campaign {
    Won(Term),
    /// Another instance leads (its record, if it could be read).
    Lost(Option<LeaderRecord>),
}

/// One leader's time in office: its master, its connection and its key's value.
pub struct Term {
    conn: MultiplexedConnection,
    master: Master,
    value: String,
    epoch: u64,
    tenure: Tenure,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("master", &self.master)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl Term {
    /// The master the term runs on, as Sentinel named it when the term was won.
    pub fn master(&self) -> &Master {
        &self.master
    }

    /// The term's epoch: its tokens start above [`crate::epoch_floor`] of it.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The leader key's value in this term.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// How long the leader key lives past a renewal.
    pub fn ttl(&self) -> Duration {
        self.tenure.timeout()
    }

    /// The term's connection to its master.
    pub(crate) fn conn(&self) -> MultiplexedConnection {
        self.conn.clone()
    }

    /// Whether this instance surely still leads.
    pub fn in_force(&self) -> bool {
        self.tenure.in_force()
    }

    /// Waits up to `within` for the term to be in force; false if it is not by then, or is
    /// over.
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

    /// Returns once the term has been ended.
    pub async fn wait_ended(&self) {
        self.tenure.wait_ended().await;
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the operating system's random number generator failed");
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// The leader record in a leader key's value (`None`: not one lockd wrote).
fn record_of(value: &str) -> Option<LeaderRecord> {
    serde_json::from_str::<LeaderValue>(value)
        .ok()
        .map(|v| v.record)
}

impl Cluster {
    /// Runs for leadership as `me` on the master Sentinel names.
    pub async fn campaign(&self, me: &Member) -> Result<Campaign, RedisError> {
        let master = self.master().await?;
        if master.epoch > crate::MAX_EPOCH {
            return Err(RedisError::Corrupt(format!(
                "the Sentinels report configuration epoch {} for {}, above the highest lockd can fold into its tokens ({})",
                master.epoch,
                master.address,
                crate::MAX_EPOCH
            )));
        }
        let mut conn = self.open(&master.address).await?;
        self.check_master(&mut conn, &master).await?;
        let value = serde_json::to_string(&LeaderValue {
            record: LeaderRecord {
                id: me.id.clone(),
                address: me.address.clone(),
                since_unix_ms: unix_ms(),
            },
            master: master.address.clone(),
            term: random_hex(),
        })
        .expect("a leader value serialises");
        let ttl = self.options.leader_ttl;
        let sent = boot_time();
        let (won, answer): (i64, String) = self
            .within(
                "taking the leader key",
                redis::Script::new(CAMPAIGN)
                    .key(&self.keys.leader)
                    .key(&self.keys.epoch)
                    .arg(&value)
                    .arg(master.epoch)
                    .arg(ttl.as_millis() as u64)
                    .arg(crate::MAX_EPOCH)
                    .invoke_async(&mut conn),
            )
            .await?;
        if won != 1 {
            return match record_of(&answer) {
                Some(record) => Ok(Campaign::Lost(Some(record))),
                None => Err(RedisError::Corrupt(format!(
                    "{key} holds {:?}, which lockd did not write: no lockd of this cluster can lead until it is gone (it expires with its TTL, if it has one; else delete it: DEL {key})",
                    answer.chars().take(64).collect::<String>(),
                    key = self.keys.leader
                ))),
            };
        }
        let epoch = answer.parse::<u64>().map_err(|e| {
            RedisError::Corrupt(format!("the term's epoch {answer:?} is not a number: {e}"))
        })?;
        info!(master = %master.address, sentinel_epoch = master.epoch, epoch, "won the election");
        Ok(Campaign::Won(Term {
            conn,
            master,
            value,
            epoch,
            tenure: Tenure::new(ttl, sent),
        }))
    }

    /// Refuses a master that is not one, or that may lose an acknowledged write when it
    /// restarts ([`Cluster::check_durability`]).
    async fn check_master(
        &self,
        conn: &mut MultiplexedConnection,
        master: &Master,
    ) -> Result<(), RedisError> {
        let doing = format!("checking the master at {}", master.address);
        let role: Vec<redis::Value> = self
            .within(&doing, redis::cmd("ROLE").query_async(conn))
            .await?;
        if !matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            return Err(RedisError::Unavailable(format!(
                "{doing}: Sentinel names it the master, but it is not one (yet)"
            )));
        }
        self.check_durability(conn, master).await
    }

    /// A [`RedisError::Config`] if the master's append-only file is off or not synced on
    /// every write (checked at every term's start and every round of its keep-alive).
    async fn check_durability(
        &self,
        conn: &mut MultiplexedConnection,
        master: &Master,
    ) -> Result<(), RedisError> {
        let doing = format!("checking the master at {}", master.address);
        let config: Vec<String> = self
            .within(
                &doing,
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("append*")
                    .query_async(conn),
            )
            .await
            .map_err(|e| match e {
                RedisError::Refused(e) => RedisError::Config(format!(
                    "{e}: lockd reads appendonly and appendfsync to make sure the master loses no acknowledged write when it restarts; allow CONFIG GET to lockd's user"
                )),
                e => e,
            })?;
        let settings = crate::pairs(&config);
        let setting = |name: &str| settings.get(name).copied().unwrap_or_default();
        let (aof, fsync) = (setting("appendonly"), setting("appendfsync"));
        if aof != "yes" || fsync != "always" {
            return Err(RedisError::Config(format!(
                "the master at {} has appendonly {aof:?} and appendfsync {fsync:?}: lockd leads only over a Redis that syncs every write before it answers (appendonly yes, appendfsync always, on every server Sentinel may promote)",
                master.address
            )));
        }
        Ok(())
    }

    /// The current leader, if there is one; the stored high-water is noted on the way (a
    /// follower's part of the high-water guard).
    pub async fn observe(&self) -> Result<Option<LeaderRecord>, RedisError> {
        let mut conn = self.reader().await?;
        let read: Result<(Option<String>, Option<Vec<u8>>), RedisError> = self
            .within(
                "reading the leader key",
                redis::pipe()
                    .get(&self.keys.leader)
                    .get(&self.keys.high_water)
                    .query_async(&mut conn),
            )
            .await;
        let (leader, hw) = match read {
            Ok(r) => r,
            Err(e) => {
                self.drop_reader();
                return Err(e);
            }
        };
        if let Some(hw) = hw
            && let Ok(value) = lockd_store_kv::high_water_value(&self.keys.high_water, &hw)
        {
            self.highwater.saw(value);
        }
        Ok(leader.as_deref().and_then(record_of))
    }

    /// Keeps `term` in force: renews its key every sixth of the TTL, extending the term by
    /// each answer; and, beside the renewals (so that slow Sentinels never hold a renewal
    /// back), checks that the Sentinels still name its master and that the master still
    /// syncs every write. Returns why the term ended.
    pub async fn keep_leading(&self, term: &Term) -> String {
        tokio::join!(
            self.renew_while_leading(term),
            self.watch_while_leading(term)
        );
        term.ended().unwrap_or_default()
    }

    /// The renewals of `term`'s key, until the term ends.
    async fn renew_while_leading(&self, term: &Term) {
        let every = term.ttl() / 6;
        let mut conn = term.conn();
        while term.ended().is_none() {
            let sent = boot_time();
            let renewed: Result<i64, RedisError> = self
                .within(
                    "renewing the leader key",
                    redis::Script::new(RENEW)
                        .key(&self.keys.leader)
                        .arg(&term.value)
                        .arg(term.ttl().as_millis() as u64)
                        .invoke_async(&mut conn),
                )
                .await;
            match renewed {
                Ok(1) => term.tenure.extend(sent),
                Ok(_) => {
                    term.end("the leader key no longer holds this term's value");
                    return;
                }
                Err(e) if e.to_string().contains("READONLY") => {
                    term.end("the master became a replica");
                    return;
                }
                Err(e) => warn!(error = %e, "cannot renew the leader key"),
            }
            if !term.in_force() {
                term.end("Redis did not answer a renewal before the leader key could have expired");
                return;
            }
            term.tenure.pause(every).await;
        }
    }

    /// Every sixth of the TTL until `term` ends: the Sentinels' master, and the master's
    /// durability settings.
    async fn watch_while_leading(&self, term: &Term) {
        let every = term.ttl() / 6;
        let mut conn = term.conn();
        while term.ended().is_none() {
            let check = async {
                match self.master().await {
                    Ok(m) if m != term.master => {
                        return Some(format!(
                            "the Sentinels name another master ({} at configuration epoch {}, the term's {} at {})",
                            m.address, m.epoch, term.master.address, term.master.epoch
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "cannot ask the Sentinels for the master"),
                }
                match self.check_durability(&mut conn, &term.master).await {
                    Err(RedisError::Config(why)) => Some(why),
                    Err(e) => {
                        warn!(error = %e, "cannot read the master's durability settings");
                        None
                    }
                    Ok(()) => None,
                }
            };
            // The checks take up to a request timeout each; the term may end meanwhile.
            let ended = async {
                term.tenure.wait_ended().await;
                None
            };
            if let Some(why) = tokio::select! {
                why = check => why,
                none = ended => none,
            } {
                term.end(&why);
                return;
            }
            term.tenure.pause(every).await;
        }
    }

    /// Ends `term` and deletes its key, so that the next candidate need not wait for it to
    /// expire.
    pub async fn resign(&self, term: &Term) {
        term.end("resigned");
        let mut conn = term.conn();
        let resigned: Result<i64, RedisError> = self
            .within(
                "deleting the leader key",
                redis::Script::new(RESIGN)
                    .key(&self.keys.leader)
                    .arg(&term.value)
                    .invoke_async(&mut conn),
            )
            .await;
        if let Err(e) = resigned {
            warn!(error = %e, "cannot delete the leader key; it goes when it expires");
        }
    }
}
