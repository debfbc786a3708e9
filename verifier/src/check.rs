//! The properties a history can show (DESIGN.md section 2), each judged on its own.
//!
//! Times are on the recorder's one monotonic clock, in nanoseconds; `ttl_ms` is in
//! milliseconds. An operation's effect happened at some instant between its `invoke` and its
//! `ok`; an `info` operation may or may not have happened at all.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use crate::history::{Event, EventType, Mode, Op, name_of};

/// The properties, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    /// Invariant 1: no two leases of a resource are certainly valid at the same instant.
    SingleHolder,
    /// Invariant 2: every grant's token is above every token granted before it was asked for,
    /// and no token is granted twice.
    MonotoneTokens,
    /// Invariant 3: the resource never accepts a write with a token lower than one it had
    /// already accepted, in its own order.
    Fencing,
    /// Invariant 8: every acknowledged write is in the final read.
    AcknowledgedWritesPresent,
    /// A write reported as refused (`fail`) never took effect.
    FailedWritesAbsent,
    /// A semaphore of N has at most N permits certainly valid at any instant, each numbered
    /// 1 ..= N (a permit given twice at once breaks single holder too).
    PermitsWithinBound,
    /// A read-write lock's readers (each on its own slot, `NAME@read-K`) may hold it together,
    /// but never while a lease on the lock's own name (its writer's) is certainly valid.
    ReadersExcludeWriters,
    /// A lease whose release was acknowledged as durable is never named as the holder again.
    ReleasesKept,
}

impl Property {
    pub const ALL: [Property; 8] = [
        Property::SingleHolder,
        Property::MonotoneTokens,
        Property::Fencing,
        Property::AcknowledgedWritesPresent,
        Property::FailedWritesAbsent,
        Property::PermitsWithinBound,
        Property::ReadersExcludeWriters,
        Property::ReleasesKept,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Property::SingleHolder => "single holder",
            Property::MonotoneTokens => "monotone tokens",
            Property::Fencing => "fencing",
            Property::AcknowledgedWritesPresent => "acknowledged writes present",
            Property::FailedWritesAbsent => "failed writes absent",
            Property::PermitsWithinBound => "permits within bound",
            Property::ReadersExcludeWriters => "readers exclude writers",
            Property::ReleasesKept => "releases kept",
        }
    }
}

/// One way a history breaks a property, with the lines of the events involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub message: String,
    pub lines: Vec<usize>,
}

/// The verdict on one property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    /// The history has nothing that bears on it (no grants, no writes, no final read...).
    NotShown(String),
    Violated(Vec<Violation>),
}

#[derive(Debug, Clone)]
pub struct Report {
    pub events: usize,
    pub verdicts: Vec<(Property, Verdict)>,
}

impl Report {
    pub fn ok(&self) -> bool {
        !self
            .verdicts
            .iter()
            .any(|(_, v)| matches!(v, Verdict::Violated(_)))
    }

    pub fn verdict(&self, p: Property) -> &Verdict {
        &self
            .verdicts
            .iter()
            .find(|(q, _)| *q == p)
            .expect("every property is judged")
            .1
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} events", self.events)?;
        for (p, v) in &self.verdicts {
            match v {
                Verdict::Holds => writeln!(f, "  holds     {}", p.name())?,
                Verdict::NotShown(why) => writeln!(f, "  not shown {} ({why})", p.name())?,
                Verdict::Violated(vs) => {
                    writeln!(f, "  VIOLATED  {} ({} times)", p.name(), vs.len())?;
                    for v in vs.iter().take(20) {
                        let lines: Vec<String> = v.lines.iter().map(|l| l.to_string()).collect();
                        writeln!(f, "            {} [lines {}]", v.message, lines.join(", "))?;
                    }
                    if vs.len() > 20 {
                        writeln!(f, "            ... and {} more", vs.len() - 20)?;
                    }
                }
            }
        }
        write!(
            f,
            "verdict: {}",
            if self.ok() {
                "no violation"
            } else {
                "VIOLATION"
            }
        )
    }
}

/// A completed operation: its invoke (if recorded) and its completion.
struct Done<'a> {
    invoke: Option<&'a Event>,
    end: &'a Event,
}

impl Done<'_> {
    /// The earliest instant the effect may have happened.
    fn from(&self) -> u64 {
        self.invoke.map_or(0, |i| i.time)
    }
}

/// Pairs each completion with the latest earlier invoke of the same process, operation and
/// resource. A permit's acquire is invoked on its semaphore's name (the permit is known only
/// once granted) and completes on the permit's, so it is paired by the semaphore's name; a
/// reader's likewise, by its lock's.
fn completions(events: &[Event]) -> Vec<Done<'_>> {
    let mut open: HashMap<(&str, Op, &str), &Event> = HashMap::new();
    let mut out = Vec::new();
    for e in events {
        let slot = e.permits.is_some() || e.mode == Some(Mode::Read);
        let resource = match e.f {
            Op::Acquire if slot => fencing::owner_name(&e.resource),
            _ => e.resource.as_str(),
        };
        let key = (e.process.as_str(), e.f, resource);
        if e.kind == EventType::Invoke {
            open.insert(key, e);
        } else {
            out.push(Done {
                invoke: open.remove(&key),
                end: e,
            });
        }
    }
    out
}

/// Judges every property.
pub fn check(history: &[Event]) -> Report {
    let mut events: Vec<Event> = history.to_vec();
    // The recorder's order for equal times is the file's order.
    events.sort_by_key(|e| (e.time, e.line));
    let done = completions(&events);
    Report {
        events: events.len(),
        verdicts: vec![
            (Property::SingleHolder, single_holder(&events, &done)),
            (Property::MonotoneTokens, monotone_tokens(&done)),
            (Property::Fencing, fencing(&events, &done)),
            (
                Property::AcknowledgedWritesPresent,
                acknowledged_present(&events, &done),
            ),
            (Property::FailedWritesAbsent, failed_absent(&events, &done)),
            (
                Property::PermitsWithinBound,
                permits_within_bound(&events, &done),
            ),
            (
                Property::ReadersExcludeWriters,
                readers_exclude_writers(&events, &done),
            ),
            (Property::ReleasesKept, releases_kept(&done)),
        ],
    }
}

fn verdict(violations: Vec<Violation>) -> Verdict {
    if violations.is_empty() {
        Verdict::Holds
    } else {
        Verdict::Violated(violations)
    }
}

/// A lease as the history shows it: certainly valid from its grant's `ok` until the earliest
/// of the release's invoke, a recorded expiry, and the acquire's invoke plus the TTL.
pub struct LeaseSpan {
    pub process: String,
    pub resource: String,
    pub token: u64,
    pub from: u64,
    pub until: u64,
}

/// The leases of a history, as the single-holder check sees them (for the timeline).
pub fn leases(history: &[Event]) -> Vec<LeaseSpan> {
    let mut events: Vec<Event> = history.to_vec();
    events.sort_by_key(|e| (e.time, e.line));
    let done = completions(&events);
    lease_spans(&events, &done)
        .into_values()
        .flatten()
        .map(|l| LeaseSpan {
            process: l.grant.end.process.clone(),
            resource: l.grant.end.resource.clone(),
            token: l.token,
            from: l.grant.end.time,
            until: l.until,
        })
        .collect()
}

struct Lease<'a> {
    grant: &'a Done<'a>,
    token: u64,
    until: u64,
    ended_by: Option<&'a Event>,
}

fn lease_spans<'a>(events: &'a [Event], done: &'a [Done<'a>]) -> BTreeMap<&'a str, Vec<Lease<'a>>> {
    let mut leases: BTreeMap<&str, Vec<Lease<'_>>> = BTreeMap::new();
    for d in done
        .iter()
        .filter(|d| d.end.f == Op::Acquire && d.end.kind == EventType::Ok)
    {
        let token = d.end.token.expect("validated");
        let ttl_ns = d.end.ttl_ms.expect("validated").saturating_mul(1_000_000);
        let mut until = d.from().saturating_add(ttl_ns);
        let mut ended_by = None;
        // The first release invoked, or expiry recorded, for this lease after its grant.
        let end = events.iter().find(|e| {
            e.resource == d.end.resource
                && e.time >= d.end.time
                && e.line != d.end.line
                && match e.f {
                    Op::Release => e.kind == EventType::Invoke && e.process == d.end.process,
                    Op::Expire => {
                        e.token == Some(token) || e.token.is_none() && e.process == d.end.process
                    }
                    _ => false,
                }
        });
        if let Some(e) = end
            && e.time < until
        {
            until = e.time;
            ended_by = Some(e);
        }
        leases
            .entry(d.end.resource.as_str())
            .or_default()
            .push(Lease {
                grant: d,
                token,
                until,
                ended_by,
            });
    }
    leases
}

fn single_holder(events: &[Event], done: &[Done<'_>]) -> Verdict {
    let leases = lease_spans(events, done);
    if leases.is_empty() {
        return Verdict::NotShown("no granted acquire".into());
    }
    let mut violations = Vec::new();
    for (resource, ls) in &leases {
        for (i, a) in ls.iter().enumerate() {
            for b in &ls[i + 1..] {
                let start = a.grant.end.time.max(b.grant.end.time);
                if a.token != b.token && start < a.until.min(b.until) {
                    let mut lines = vec![a.grant.end.line, b.grant.end.line];
                    lines.extend(a.ended_by.map(|e| e.line));
                    lines.extend(b.ended_by.map(|e| e.line));
                    violations.push(Violation {
                        message: format!(
                            "{resource}: {} (token {}) and {} (token {}) both held the lock at time {start}",
                            a.grant.end.process, a.token, b.grant.end.process, b.token
                        ),
                        lines,
                    });
                }
            }
        }
    }
    verdict(violations)
}

/// At every instant, the permits of each semaphore certainly valid then number at most its N
/// (the smallest N among them, if grants disagree), and each permit's number is within N.
fn permits_within_bound(events: &[Event], done: &[Done<'_>]) -> Verdict {
    let mut by_semaphore: BTreeMap<&str, Vec<(Lease<'_>, u32, u32)>> = BTreeMap::new();
    for (resource, ls) in lease_spans(events, done) {
        let Some((semaphore, k)) = fencing::permit::permit_of(resource) else {
            continue;
        };
        for l in ls {
            if let Some(n) = l.grant.end.permits {
                by_semaphore.entry(semaphore).or_default().push((l, n, k));
            }
        }
    }
    if by_semaphore.is_empty() {
        return Verdict::NotShown("no granted permit".into());
    }
    let mut violations = Vec::new();
    for (semaphore, permits) in &by_semaphore {
        for (l, n, k) in permits.iter().filter(|(_, n, k)| k > n) {
            violations.push(Violation {
                message: format!(
                    "{semaphore}: {} was granted permit {k} of a semaphore of {n}",
                    l.grant.end.process
                ),
                lines: vec![l.grant.end.line],
            });
        }
        // A sweep over the certainly-valid spans: a lease ends before one starting at the same
        // instant begins (`until` is exclusive).
        let mut edges: Vec<(u64, bool, usize)> = Vec::new();
        for (i, (l, _, _)) in permits.iter().enumerate() {
            if l.grant.end.time < l.until {
                edges.push((l.grant.end.time, true, i));
                edges.push((l.until, false, i));
            }
        }
        edges.sort();
        let mut open: Vec<usize> = Vec::new();
        let mut over = false;
        for (time, starts, i) in edges {
            if !starts {
                open.retain(|&o| o != i);
                over = false;
                continue;
            }
            open.push(i);
            let bound = open.iter().map(|&o| permits[o].1).min().expect("one open");
            if open.len() > bound as usize && !over {
                over = true;
                let mut lines: Vec<usize> =
                    open.iter().map(|&o| permits[o].0.grant.end.line).collect();
                lines.sort_unstable();
                violations.push(Violation {
                    message: format!(
                        "{semaphore}: {} permits of a semaphore of {bound} were held at time {time}",
                        open.len()
                    ),
                    lines,
                });
            }
        }
    }
    verdict(violations)
}

/// No reader's lease (granted with mode `read` on `NAME@read-K`) is certainly valid at an
/// instant when a lease on `NAME` is: readers share a lock, never with its writer.
fn readers_exclude_writers(events: &[Event], done: &[Done<'_>]) -> Verdict {
    let leases = lease_spans(events, done);
    let mut violations = Vec::new();
    let mut readers = 0;
    for (resource, ls) in &leases {
        let Some((lock, _)) = fencing::reader::reader_of(resource) else {
            continue;
        };
        let writers = leases.get(lock).map_or(&[][..], Vec::as_slice);
        for r in ls.iter().filter(|l| l.grant.end.mode == Some(Mode::Read)) {
            readers += 1;
            for w in writers {
                let start = r.grant.end.time.max(w.grant.end.time);
                if start < r.until.min(w.until) {
                    let mut lines = vec![w.grant.end.line, r.grant.end.line];
                    lines.sort_unstable();
                    violations.push(Violation {
                        message: format!(
                            "{lock}: reader {} (token {}, on {resource}) and writer {} (token {}) both held the lock at time {start}",
                            r.grant.end.process, r.token, w.grant.end.process, w.token
                        ),
                        lines,
                    });
                }
            }
        }
    }
    if readers == 0 {
        return Verdict::NotShown("no granted reader".into());
    }
    verdict(violations)
}

/// After a release acknowledged as durable (its lockd holds it in its store), the lease is
/// gone for good: no acquire invoked after that acknowledgement is refused naming the
/// released lease's token as the holder. A durable release lost in a leader change or a
/// quorum loss would bring the lease back, and show here.
fn releases_kept(done: &[Done<'_>]) -> Verdict {
    let mut released: HashMap<(&str, u64), &Event> = HashMap::new();
    for d in done {
        if d.end.f == Op::Release && d.end.kind == EventType::Ok && d.end.durable {
            let token = d
                .end
                .token
                .expect("validated: a durable release has its token");
            released
                .entry((d.end.resource.as_str(), token))
                .and_modify(|e| {
                    if d.end.time < e.time {
                        *e = d.end;
                    }
                })
                .or_insert(d.end);
        }
    }
    if released.is_empty() {
        return Verdict::NotShown("no release acknowledged as durable".into());
    }
    let mut violations = Vec::new();
    for d in done {
        let (Op::Acquire, EventType::Fail, Some(t)) = (d.end.f, d.end.kind, d.end.current_token)
        else {
            continue;
        };
        if let Some(r) = released.get(&(d.end.resource.as_str(), t))
            && d.from() > r.time
        {
            violations.push(Violation {
                message: format!(
                    "{}: {} released token {t} (durable), and {} was later refused with token {t} named as the holder",
                    d.end.resource, r.process, d.end.process
                ),
                lines: vec![r.line, d.end.line],
            });
        }
    }
    verdict(violations)
}

fn monotone_tokens(done: &[Done<'_>]) -> Verdict {
    let grants: Vec<&Done<'_>> = done
        .iter()
        .filter(|d| d.end.f == Op::Acquire && d.end.kind == EventType::Ok)
        .collect();
    if grants.is_empty() {
        return Verdict::NotShown("no granted acquire".into());
    }
    let mut violations = Vec::new();
    let mut seen: HashMap<u64, &Done<'_>> = HashMap::new();
    for g in &grants {
        let t = g.end.token.expect("validated");
        if let Some(other) = seen.insert(t, g) {
            violations.push(Violation {
                message: format!(
                    "token {t} was granted twice ({} on {} and {} on {})",
                    other.end.process, other.end.resource, g.end.process, g.end.resource
                ),
                lines: vec![other.end.line, g.end.line],
            });
        }
    }
    // A grant asked for after another was granted must carry a higher token. The grants are in
    // time order, so the highest token granted before each invoke is a running maximum.
    let mut by_ok: Vec<&Done<'_>> = grants.clone();
    by_ok.sort_by_key(|g| g.end.time);
    for g in &grants {
        let t = g.end.token.expect("validated");
        if let Some(prev) = by_ok
            .iter()
            .take_while(|p| p.end.time < g.from())
            .filter(|p| p.end.token.expect("validated") >= t)
            .max_by_key(|p| p.end.token)
        {
            violations.push(Violation {
                message: format!(
                    "{} was granted token {t} on {}, asked for after token {} had been granted",
                    g.end.process,
                    g.end.resource,
                    prev.end.token.expect("validated")
                ),
                lines: vec![prev.end.line, g.end.line],
            });
        }
    }
    verdict(violations)
}

/// The final read of each resource: its last `ok` read.
fn final_reads(events: &[Event]) -> HashMap<&str, (&Event, HashSet<String>)> {
    let mut out = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e.f == Op::Read && e.kind == EventType::Ok)
    {
        let names = e
            .value
            .as_ref()
            .and_then(|v| v.as_array())
            .map(|a| a.iter().map(name_of).collect())
            .unwrap_or_default();
        out.insert(e.resource.as_str(), (e, names));
    }
    out
}

fn fencing(events: &[Event], done: &[Done<'_>]) -> Verdict {
    let reads = final_reads(events);
    // Writes the resource accepted: acknowledged ones, and unknown ones the final read shows.
    let mut accepted: BTreeMap<&str, Vec<&Done<'_>>> = BTreeMap::new();
    for d in done.iter().filter(|d| d.end.f == Op::Write) {
        let shown = reads
            .get(d.end.resource.as_str())
            .is_some_and(|(_, names)| d.end.value_name().is_some_and(|n| names.contains(&n)));
        if d.end.kind == EventType::Ok || d.end.kind == EventType::Info && shown {
            accepted.entry(d.end.resource.as_str()).or_default().push(d);
        }
    }
    if accepted.is_empty() {
        return Verdict::NotShown("no accepted write".into());
    }
    let mut violations = Vec::new();
    for (resource, ws) in &accepted {
        let token = |d: &Done<'_>| d.end.token.expect("validated");
        if ws.iter().all(|d| d.end.index.is_some()) {
            // The resource told us its order.
            let mut ordered = ws.clone();
            ordered.sort_by_key(|d| d.end.index);
            let mut highest: Option<&Done<'_>> = None;
            for d in ordered {
                if let Some(h) = highest {
                    if token(d) < token(h) {
                        violations.push(stale_write(resource, d, h));
                        continue;
                    }
                }
                if highest.is_none_or(|h| token(d) >= token(h)) {
                    highest = Some(d);
                }
            }
        } else {
            // Real-time order: a write invoked after another was acknowledged comes after it.
            for a in ws.iter().filter(|a| a.end.kind == EventType::Ok) {
                for b in ws.iter() {
                    if b.from() > a.end.time && token(b) < token(a) {
                        violations.push(stale_write(resource, b, a));
                    }
                }
            }
        }
    }
    verdict(violations)
}

fn stale_write(resource: &str, late: &Done<'_>, earlier: &Done<'_>) -> Violation {
    Violation {
        message: format!(
            "{resource}: write {} with token {} by {} was accepted after write {} with token {} by {}",
            late.end.value_name().unwrap_or_default(),
            late.end.token.unwrap_or(0),
            late.end.process,
            earlier.end.value_name().unwrap_or_default(),
            earlier.end.token.unwrap_or(0),
            earlier.end.process
        ),
        lines: vec![earlier.end.line, late.end.line],
    }
}

fn acknowledged_present(events: &[Event], done: &[Done<'_>]) -> Verdict {
    against_final_read(events, done, EventType::Ok, |d, name| {
        format!(
            "{}: acknowledged write {name} (token {}) by {} is missing from the final read",
            d.resource,
            d.token.unwrap_or(0),
            d.process
        )
    })
}

fn failed_absent(events: &[Event], done: &[Done<'_>]) -> Verdict {
    against_final_read(events, done, EventType::Fail, |d, name| {
        format!(
            "{}: write {name} (token {}) by {} was refused, yet the final read holds it",
            d.resource,
            d.token.unwrap_or(0),
            d.process
        )
    })
}

/// Judges the writes that ended with `kind` against their resource's final read: an
/// acknowledged write (`Ok`) that completed before the read must be in it; a refused one
/// (`Fail`) must never be.
fn against_final_read(
    events: &[Event],
    done: &[Done<'_>],
    kind: EventType,
    says: impl Fn(&Event, &str) -> String,
) -> Verdict {
    let present = kind == EventType::Ok;
    let reads = final_reads(events);
    let mut judged = false;
    let mut violations = Vec::new();
    for d in done
        .iter()
        .filter(|d| d.end.f == Op::Write && d.end.kind == kind)
    {
        let Some((read, names)) = reads.get(d.end.resource.as_str()) else {
            continue;
        };
        if present && d.end.time >= read.time {
            continue;
        }
        judged = true;
        let name = d.end.value_name().unwrap_or_default();
        if names.contains(&name) != present {
            violations.push(Violation {
                message: says(d.end, &name),
                lines: vec![d.end.line, read.line],
            });
        }
    }
    if !judged {
        return Verdict::NotShown(if present {
            "no acknowledged write before a final read".into()
        } else {
            "no refused write with a final read".into()
        });
    }
    verdict(violations)
}
