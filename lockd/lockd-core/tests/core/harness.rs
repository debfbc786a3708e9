//! A driver for the core that records a readable transcript, and a store that keeps the
//! persisted ops so that `restart` can rebuild the core from them.

use std::collections::BTreeMap;
use std::fmt::Write;

use expect_test::Expect;
use fencing::{FencingToken, LeaseId, ResourceName};
use lockd_core::{
    AcquireAllOutcome, AcquireAllRequest, AcquireOutcome, AcquireRequest, Core, Description,
    Effect, Holder, LeaseRecord, Limits, Millis, Op, Owner, Reentrant, ReleaseOutcome, RequestId,
    Snapshot, WaiterId,
};

/// Lease ids for tests: a counter in the last bytes, printed as `L<n>`.
pub fn lease_id(n: u64) -> LeaseId {
    let mut b = [0u8; 16];
    b[8..].copy_from_slice(&n.to_be_bytes());
    LeaseId::from_bytes(b)
}

pub fn lease_name(id: LeaseId) -> String {
    let n = u64::from_be_bytes(id.as_bytes()[8..].try_into().unwrap());
    format!("L{n}")
}

fn counter_ids(start: u64) -> Box<dyn lockd_core::LeaseIdSource> {
    let mut next = start;
    Box::new(move || {
        next += 1;
        lease_id(next)
    })
}

/// What a store would hold after applying the ops: `durable` up to the last grant (a grant is
/// synced, and a sync makes everything before it durable), `all` including lazy ops after it.
#[derive(Default, Clone)]
pub struct MemStore {
    pub last_token: Option<FencingToken>,
    pub leases: BTreeMap<ResourceName, LeaseRecord>,
    pub requests: BTreeMap<String, LeaseRecord>,
}

impl MemStore {
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Atomic(parts) => {
                assert!(!parts.is_empty(), "an empty atomic op");
                for part in parts {
                    assert!(matches!(part, Op::Grant(_)), "an atomic op of grants only");
                    self.apply(part);
                }
            }
            Op::Grant(rec) => {
                assert!(
                    Some(rec.token) > self.last_token,
                    "tokens persist in increasing order"
                );
                self.last_token = Some(rec.token);
                assert!(
                    self.leases
                        .insert(rec.resource.clone(), rec.clone())
                        .is_none(),
                    "grant of a held resource"
                );
                if let Some(id) = &rec.request_id {
                    self.requests.insert(id.clone(), rec.clone());
                }
            }
            Op::Remove { resource, lease_id } => {
                let rec = self
                    .leases
                    .remove(resource)
                    .expect("remove of a stored lease");
                assert_eq!(rec.lease_id, *lease_id);
            }
            Op::ForgetRequest { request_id } => {
                self.requests
                    .remove(request_id)
                    .expect("forget of a remembered request");
            }
            Op::Reenter {
                resource,
                lease_id,
                holds,
                request_id,
            } => {
                self.reentrant(resource, *lease_id).holds = *holds;
                if let Some(id) = request_id {
                    let rec = self.leases[resource].remembered_as(id);
                    assert!(
                        self.requests.insert(id.clone(), rec).is_none(),
                        "a re-entry's request id remembered twice"
                    );
                }
            }
            Op::Unhold {
                resource,
                lease_id,
                holds,
            } => self.reentrant(resource, *lease_id).holds = *holds,
        }
    }

    fn reentrant(&mut self, resource: &ResourceName, lease_id: LeaseId) -> &mut Reentrant {
        let rec = self
            .leases
            .get_mut(resource)
            .expect("holds of a stored lease");
        assert_eq!(rec.lease_id, lease_id);
        rec.reentrant.as_mut().expect("holds of a reentrant lease")
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            last_token: self.last_token,
            leases: self.leases.values().cloned().collect(),
            requests: self.requests.values().cloned().collect(),
        }
    }
}

/// A core plus everything needed to restart it like lockd would.
pub struct Rig {
    pub core: Core,
    pub limits: Limits,
    pub now: Millis,
    /// State as of the last synced op.
    pub durable: MemStore,
    /// State including ops after the last sync.
    pub latest: MemStore,
    ids_issued: u64,
    /// Tenants in force (`tenant` lines), again after a restart.
    tenants: Vec<lockd_core::Tenant>,
}

impl Rig {
    pub fn new(limits: Limits) -> Rig {
        limits.validate().unwrap();
        Rig {
            core: Core::new(limits.clone(), counter_ids(0)),
            limits,
            now: 0,
            durable: MemStore::default(),
            latest: MemStore::default(),
            ids_issued: 0,
            tenants: Vec::new(),
        }
    }

    /// Feeds effects' persist ops to the stores and returns the effects.
    pub fn persist(&mut self, fx: &[Effect]) {
        for e in fx {
            if let Effect::Persist(op) = e {
                self.latest.apply(op);
                if op.needs_sync() {
                    self.durable = self.latest.clone();
                }
                for part in op.parts() {
                    if let Op::Grant(rec) = part {
                        let n =
                            u64::from_be_bytes(rec.lease_id.as_bytes()[8..].try_into().unwrap());
                        self.ids_issued = self.ids_issued.max(n);
                    }
                }
            }
        }
    }

    /// Restarts from the stored state; `lose_unsynced` drops the lazy ops after the last sync
    /// (what a crash may do), otherwise a clean shutdown is modelled (everything flushed).
    pub fn restart(&mut self, lose_unsynced: bool) {
        if lose_unsynced {
            self.latest = self.durable.clone();
        } else {
            self.durable = self.latest.clone();
        }
        self.core = Core::recover(
            self.limits.clone(),
            counter_ids(self.ids_issued),
            self.latest.snapshot(),
            self.now,
        )
        .expect("recover");
        self.set_tenancy();
    }

    /// Puts `self.tenants` in force.
    fn set_tenancy(&mut self) {
        let t = lockd_core::Tenancy::new(self.tenants.clone()).expect("valid tenants");
        self.core.set_tenancy(Some(std::sync::Arc::new(t)));
    }

    pub fn acquire(
        &mut self,
        resource: &str,
        holder: &str,
        ids: (Option<&str>, Option<&str>),
        times: (u64, u64, u32),
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, lockd_core::AcquireError> {
        self.acquire_as(resource, holder, ids, times, None, fx)
    }

    /// An Acquire, of a side of a read-write lock when `rw` is set.
    pub fn acquire_as(
        &mut self,
        resource: &str,
        holder: &str,
        (request_id, owner): (Option<&str>, Option<&str>),
        (ttl_ms, wait_ms, permits): (u64, u64, u32),
        rw: Option<lockd_core::Rw>,
        fx: &mut Vec<Effect>,
    ) -> Result<AcquireOutcome, lockd_core::AcquireError> {
        let req = AcquireRequest {
            resource: ResourceName::new(resource).unwrap(),
            request_id: request_id.map(|id| RequestId::new(id, &self.limits).unwrap()),
            holder: Holder::new(holder, &self.limits).unwrap(),
            ttl_ms,
            wait_ms,
            owner: owner.map(|o| Owner::new(o).unwrap()),
            permits,
            rw,
        };
        self.core.acquire(self.now, req, fx)
    }
}

// ---- transcripts -----------------------------------------------------------------------------

/// Runs a script and compares the transcript with `expect`.
///
/// Script lines (blank lines and `#` comments are skipped):
///
/// ```text
/// @T                       set the time to T (ms); may prefix a command: `@T acquire ...`
/// acquire RES [holder=H] [req=ID] [owner=O] [ttl=MS] [wait=MS] [permits=N]
///         [mode=read|write] [downgrade=L<n>]   (downgrade: mode read, from that write lease)
/// acquire-all RES,RES... [holder=H] [req=ID] [ttl=MS]   atomic, try-only; `-` is no resource
/// renew RES L<n>           release RES L<n>        cancel w<n>        describe RES
/// tick                     restart                 crash (restart losing unsynced ops)
/// limits KEY=VALUE...      (only before the first command)
/// tenant NAME prefixes=P,P [leases=N] [waiters=N] [requests=N] [rate=PER_SECOND/BURST]
/// ```
/// `tenant` adds a tenant and puts every tenant so far in force; the transcript shows each
/// tenant's leases and waiters as the core counts them (`usage`).
/// ```text
/// ```
pub fn check(script: &str, expect: Expect) {
    // Reports of long holds only where a script asks for them (`limits hold_warn_after_ms=`).
    let mut limits = Limits {
        hold_warn_after_ms: 0,
        ..Limits::default()
    };
    let mut rig: Option<Rig> = None;
    let mut out = String::new();
    for raw in script.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words: Vec<&str> = line.split_whitespace().collect();
        if words[0] == "limits" {
            assert!(rig.is_none(), "`limits` must come before the first command");
            for kv in &words[1..] {
                let (k, v) = kv.split_once('=').unwrap();
                set_limit(&mut limits, k, v.parse().unwrap());
            }
            continue;
        }
        let rig = rig.get_or_insert_with(|| Rig::new(limits.clone()));
        if let Some(t) = words[0].strip_prefix('@') {
            rig.now = t.parse().unwrap();
            words.remove(0);
        }
        if words.is_empty() {
            continue;
        }
        writeln!(out, "@{} {}", rig.now, words.join(" ")).unwrap();
        let mut fx = Vec::new();
        let result = run(rig, &words, &mut fx);
        writeln!(out, "  => {result}").unwrap();
        rig.persist(&fx);
        for e in &fx {
            writeln!(out, "  ! {}", effect(e)).unwrap();
        }
    }
    expect.assert_eq(&out);
}

fn set_limit(l: &mut Limits, key: &str, v: u64) {
    match key {
        "ttl_min_ms" => l.ttl_min_ms = v,
        "ttl_max_ms" => l.ttl_max_ms = v,
        "ttl_default_ms" => l.ttl_default_ms = v,
        "wait_max_ms" => l.wait_max_ms = v,
        "waiters_per_resource_max" => l.waiters_per_resource_max = v as usize,
        "waiters_total_max" => l.waiters_total_max = v as usize,
        "leases_max" => l.leases_max = v as usize,
        "request_retention_ms" => l.request_retention_ms = v,
        "requests_max" => l.requests_max = v as usize,
        "hold_warn_after_ms" => l.hold_warn_after_ms = v,
        other => panic!("unknown limit {other}"),
    }
}

fn arg<'a>(words: &[&'a str], key: &str) -> Option<&'a str> {
    words
        .iter()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn lease_arg(word: &str) -> LeaseId {
    lease_id(
        word.strip_prefix('L')
            .expect("lease ids are written L<n>")
            .parse()
            .unwrap(),
    )
}

fn run(rig: &mut Rig, words: &[&str], fx: &mut Vec<Effect>) -> String {
    let now = rig.now;
    let res = |i: usize| ResourceName::new(words[i]).unwrap();
    match words[0] {
        "acquire" => {
            let num = |k: &str| arg(words, k).map_or(0, |v| v.parse().unwrap());
            let rw = match (arg(words, "mode"), arg(words, "downgrade")) {
                (None, None) => None,
                (Some("read"), Some(lease)) => Some(lockd_core::Rw::Downgrade(lease_arg(lease))),
                (Some("read"), None) => Some(lockd_core::Rw::Read),
                (Some("write"), None) => Some(lockd_core::Rw::Write),
                other => panic!("mode and downgrade: {other:?}"),
            };
            let outcome = rig.acquire_as(
                words[1],
                arg(words, "holder").unwrap_or(""),
                (arg(words, "req"), arg(words, "owner")),
                (num("ttl"), num("wait"), num("permits") as u32),
                rw,
                fx,
            );
            match outcome {
                Ok(o) => acquire_outcome(&o),
                Err(e) => format!("error: {e}"),
            }
        }
        "acquire-all" => {
            let req = AcquireAllRequest {
                // `-` is the empty set.
                resources: words[1]
                    .split(',')
                    .filter(|r| *r != "-")
                    .map(|r| ResourceName::new(r).unwrap())
                    .collect(),
                request_id: arg(words, "req").map(|id| RequestId::new(id, &rig.limits).unwrap()),
                holder: Holder::new(arg(words, "holder").unwrap_or(""), &rig.limits).unwrap(),
                ttl_ms: arg(words, "ttl").map_or(0, |v| v.parse().unwrap()),
            };
            match rig.core.acquire_all(now, req, fx) {
                Ok(o) => acquire_all_outcome(&o),
                Err(e) => format!("error: {e}"),
            }
        }
        "renew" => match rig.core.renew(now, &res(1), lease_arg(words[2]), fx) {
            Ok(r) => format!("renewed expires={} ttl={}", r.expires_at, r.ttl_ms),
            Err(e) => format!("error: {e}"),
        },
        "release" => match rig.core.release(now, &res(1), lease_arg(words[2]), fx) {
            ReleaseOutcome::Released { token, held_ms } => {
                format!("released token={token} held={held_ms}")
            }
            ReleaseOutcome::Unheld { token, holds } => {
                format!("unheld token={token} holds={holds}")
            }
            ReleaseOutcome::NotHeld {
                current,
                semaphore: None,
                reader_slot: None,
            } => format!("not held (current token {current:?})"),
            ReleaseOutcome::NotHeld {
                semaphore: Some(n), ..
            } => format!("not held: a semaphore of {n} permits"),
            ReleaseOutcome::NotHeld {
                reader_slot: Some(k),
                ..
            } => format!("not held: the lease of its reader on slot {k}"),
        },
        "cancel" => {
            let w = WaiterId(words[1].strip_prefix('w').unwrap().parse().unwrap());
            format!("cancelled={}", rig.core.cancel(now, w, fx))
        }
        "describe" => describe(&rig.core.describe(now, &res(1), fx)),
        "tenant" => {
            let num = |key| arg(words, key).map(|v: &str| v.parse().unwrap());
            let rate = arg(words, "rate").map(|r| {
                let (per_second, burst) = r.split_once('/').unwrap();
                lockd_core::Rate {
                    per_second: per_second.parse().unwrap(),
                    burst: burst.parse().unwrap(),
                }
            });
            rig.tenants.push(lockd_core::Tenant {
                name: words[1].to_string(),
                prefixes: arg(words, "prefixes")
                    .unwrap()
                    .split(',')
                    .map(str::to_string)
                    .collect(),
                quota: lockd_core::Quota {
                    leases_max: num("leases"),
                    waiters_max: num("waiters"),
                    requests_max: num("requests"),
                    acquire_rate: rate,
                },
            });
            rig.set_tenancy();
            usage(&rig.core)
        }
        "usage" => usage(&rig.core),
        "tick" => {
            rig.core.tick(now, fx);
            format!("next deadline {:?}", rig.core.next_deadline())
        }
        "restart" | "crash" => {
            rig.restart(words[0] == "crash");
            let s = rig.core.stats();
            format!(
                "recovered leases={} requests={} last_token={:?}",
                s.leases,
                s.requests,
                rig.core.last_token().map(|t| t.get())
            )
        }
        other => panic!("unknown command {other}"),
    }
}

fn usage(core: &Core) -> String {
    core.tenant_usage()
        .map(|(name, leases, waiters, requests)| {
            format!("{name}: leases={leases} waiters={waiters} requests={requests}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn acquire_outcome(o: &AcquireOutcome) -> String {
    match o {
        AcquireOutcome::Granted(g) => {
            format!(
                "granted {}token={} lease={} expires={}",
                permit(g),
                g.token,
                lease_name(g.lease_id),
                g.expires_at
            )
        }
        AcquireOutcome::Duplicate { grant: g, held } => format!(
            "duplicate {}token={} lease={} expires={} held={held}",
            permit(g),
            g.token,
            lease_name(g.lease_id),
            g.expires_at
        ),
        AcquireOutcome::Reentered(g) => format!(
            "reentered token={} lease={} expires={} holds={}",
            g.token,
            lease_name(g.lease_id),
            g.expires_at,
            g.holds
        ),
        AcquireOutcome::Busy(b) => {
            format!(
                "busy holder={:?} token={} expires={} waiters={}",
                b.holder.as_str(),
                b.token,
                b.expires_at,
                b.waiters
            )
        }
        AcquireOutcome::Queued { waiter, position } => {
            format!("queued w{} position={position}", waiter.0)
        }
        AcquireOutcome::Rejoined { waiter, position } => {
            format!("rejoined w{} position={position}", waiter.0)
        }
    }
}

/// A permit's or a reader's name, for a grant of one (a lock's grant is on the name asked
/// for).
fn permit(g: &lockd_core::Grant) -> String {
    match lockd_core::permits::owner_name(g.resource.as_str()) == g.resource.as_str() {
        false => format!("{} ", g.resource),
        true => String::new(),
    }
}

pub fn acquire_all_outcome(o: &AcquireAllOutcome) -> String {
    let grant = |g: &lockd_core::Grant| {
        format!(
            "{} token={} lease={} expires={}",
            g.resource,
            g.token,
            lease_name(g.lease_id),
            g.expires_at
        )
    };
    match o {
        AcquireAllOutcome::Granted(gs) => format!(
            "granted all [{}]",
            gs.iter().map(grant).collect::<Vec<_>>().join("; ")
        ),
        AcquireAllOutcome::Duplicate(gs) => format!(
            "duplicate [{}]",
            gs.iter()
                .map(|(g, held)| format!("{} held={held}", grant(g)))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        AcquireAllOutcome::Busy { resource, busy } => format!(
            "busy {resource} holder={:?} token={} expires={} waiters={}",
            busy.holder.as_str(),
            busy.token,
            busy.expires_at,
            busy.waiters
        ),
    }
}

fn describe(d: &Description) -> String {
    match &d.held {
        Some(h) => format!(
            "held holder={:?} token={} expires={} ttl={} waiters={}{}",
            h.holder.as_str(),
            h.token,
            h.expires_at,
            h.ttl_ms,
            d.waiters,
            match h.holds {
                1 => String::new(),
                n => format!(" holds={n}"),
            }
        ),
        None => match (d.permits, d.readers) {
            (Some(p), _) => format!(
                "semaphore permits={} held={} waiters={}",
                p.permits, p.held, d.waiters
            ),
            (None, Some(n)) => format!("read-write readers={n} waiters={}", d.waiters),
            (None, None) => format!("free waiters={}", d.waiters),
        },
    }
}

/// An op as the transcripts show it.
fn op(op: &Op) -> String {
    match op {
        Op::Atomic(parts) => format!(
            "atomic [{}]",
            parts.iter().map(self::op).collect::<Vec<_>>().join("; ")
        ),
        Op::Grant(r) => format!(
            "grant {} token={} lease={} holder={:?} ttl={} req={}{}{}",
            r.resource,
            r.token,
            lease_name(r.lease_id),
            r.holder,
            r.ttl_ms,
            r.request_id.as_deref().unwrap_or("-"),
            match &r.reentrant {
                None => String::new(),
                Some(re) => format!(" owner={} holds={}", re.owner, re.holds),
            },
            match (r.permits, r.rw) {
                (None, None) => String::new(),
                (Some(n), _) => format!(" permits={n}"),
                (None, Some(lockd_core::RwRole::Read)) => " rw=read".to_string(),
                (None, Some(lockd_core::RwRole::Write)) => " rw=write".to_string(),
            }
        ),
        Op::Reenter {
            resource,
            lease_id,
            holds,
            request_id,
        } => format!(
            "reenter {resource} {} holds={holds} req={}",
            lease_name(*lease_id),
            request_id.as_deref().unwrap_or("-")
        ),
        Op::Unhold {
            resource,
            lease_id,
            holds,
        } => format!("unhold {resource} {} holds={holds}", lease_name(*lease_id)),
        Op::Remove { resource, lease_id } => {
            format!("remove {resource} {}", lease_name(*lease_id))
        }
        Op::ForgetRequest { request_id } => format!("forget {request_id}"),
    }
}

pub fn effect(e: &Effect) -> String {
    match e {
        Effect::Persist(o) => format!("persist {}", op(o)),
        Effect::Granted { waiter, grant: g } => format!(
            "hand-off w{}: {}token={} lease={} expires={}",
            waiter.0,
            permit(g),
            g.token,
            lease_name(g.lease_id),
            g.expires_at
        ),
        Effect::WaitTimedOut { waiter, busy } => match busy {
            Some(b) => format!("wait timed out w{}: held with token {}", waiter.0, b.token),
            None => format!("wait timed out w{}: no grant possible", waiter.0),
        },
        Effect::Expired {
            resource,
            lease_id: _,
            token,
            holder,
            held_ms,
        } => format!(
            "expired {resource} token={token} holder={:?} held={held_ms}",
            holder.as_str()
        ),
        Effect::HeldLong {
            resource,
            lease_id: _,
            token,
            holder,
            held_ms,
        } => format!(
            "held long {resource} token={token} holder={:?} held={held_ms}",
            holder.as_str()
        ),
    }
}
