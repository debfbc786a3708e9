//! The history format: one JSON object per line.
//!
//! ```text
//! {"type":"invoke","process":"A","time":1000,"f":"acquire","resource":"acct:1"}
//! {"type":"ok","process":"A","time":1500,"f":"acquire","resource":"acct:1","token":41,"ttl_ms":2000}
//! {"type":"invoke","process":"A","time":1600,"f":"write","resource":"acct:1","token":41,"value":"w1"}
//! {"type":"ok","process":"A","time":1900,"f":"write","resource":"acct:1","token":41,"value":"w1"}
//! {"type":"ok","process":"checker","time":9000,"f":"read","resource":"acct:1","value":["w1"]}
//! ```

use std::io::BufRead;

use serde::Deserialize;

/// What an event says about its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    /// The operation was started.
    Invoke,
    /// It took effect.
    Ok,
    /// It certainly did not take effect.
    Fail,
    /// Its outcome is unknown: it may have taken effect, or not (treated as "may have").
    Info,
}

/// The operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Take the lock; `ok` carries the granted `token` and the lease's `ttl_ms`.
    Acquire,
    /// Give it back (the lease ends at the latest when the release is invoked).
    Release,
    /// The lease ended by expiry (as lockd, or a client that saw its lease lost, recorded it).
    Expire,
    /// A write to the resource with `token`; `value` names the write (unique per write).
    Write,
    /// A read of the resource: `value` is the list of the writes it holds (the final read).
    Read,
    /// The process was paused (SIGSTOP, a GC pause...): for the timeline; not judged.
    Pause,
    /// The process was resumed.
    Resume,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(rename = "type")]
    kind: EventType,
    process: serde_json::Value,
    time: u64,
    f: Op,
    resource: String,
    #[serde(default)]
    token: Option<u64>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    value: Option<serde_json::Value>,
    /// The write's position in the resource's own order, when the store reports it.
    #[serde(default)]
    index: Option<u64>,
    /// Free text for the timeline (why a write was refused...).
    #[serde(default)]
    note: Option<String>,
    /// An acquire of a semaphore's permit: the semaphore's number of permits (the resource is
    /// the permit's name, `NAME@permit-K`).
    #[serde(default)]
    permits: Option<u32>,
    /// An acquire of a side of a read-write lock: `read` (the resource is the reader's slot,
    /// `NAME@read-K`) or `write` (the lock's name).
    #[serde(default)]
    mode: Option<Mode>,
    /// A release's `ok`: the lockd that answered holds the release in its store (lockd over
    /// etcd answers a release only once etcd has it).
    #[serde(default)]
    durable: Option<bool>,
    /// An acquire's `fail`: the token of the lease lockd named as the holder.
    #[serde(default)]
    current_token: Option<u64>,
}

/// A side of a read-write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Read,
    Write,
}

/// One event of a history.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Line number in the file (1-based), to point at it in reports.
    pub line: usize,
    pub kind: EventType,
    pub process: String,
    /// On the recorder's one monotonic clock (any unit; nanoseconds by convention).
    pub time: u64,
    pub f: Op,
    pub resource: String,
    pub token: Option<u64>,
    pub ttl_ms: Option<u64>,
    /// A write's name, or a read's list of write names.
    pub value: Option<serde_json::Value>,
    pub index: Option<u64>,
    pub note: Option<String>,
    /// A permit's acquire: how many permits its semaphore has.
    pub permits: Option<u32>,
    /// An acquire of a side of a read-write lock.
    pub mode: Option<Mode>,
    /// A release's `ok` that its lockd holds in its store.
    pub durable: bool,
    /// An acquire's `fail` (busy, or the wait ran out): the holder's token lockd named.
    pub current_token: Option<u64>,
}

impl Event {
    /// A write's name as text (numbers and strings alike).
    pub fn value_name(&self) -> Option<String> {
        self.value.as_ref().map(name_of)
    }
}

/// Numbers and strings name writes alike.
pub fn name_of(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Why a history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("cannot read the history: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads a history; blank lines are skipped. Every event is validated: tokens in the range of
/// `fencing::FencingToken`, resource names as `fencing::ResourceName` allows, the fields each
/// operation needs.
pub fn parse(input: impl BufRead) -> Result<Vec<Event>, HistoryError> {
    let mut out = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line_no = i + 1;
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| HistoryError::Line {
            line: line_no,
            message,
        };
        let raw: Raw = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        let process = match &raw.process {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            other => {
                return Err(bad(format!(
                    "process must be a string or a number, not {other}"
                )));
            }
        };
        fencing::ResourceName::validate(&raw.resource)
            .map_err(|e| bad(format!("resource {:?}: {e}", raw.resource)))?;
        if let Some(t) = raw.token
            && fencing::FencingToken::new(t).is_none()
        {
            return Err(bad(format!("token {t} is out of range")));
        }
        let needs = |what: &str, present: bool| {
            if present {
                Ok(())
            } else {
                Err(bad(what.to_string()))
            }
        };
        if raw.permits.is_some() {
            needs("only an acquire has permits", raw.f == Op::Acquire)?;
            needs(
                "permits goes with a permit's name (NAME@permit-K)",
                fencing::permit::permit_of(&raw.resource).is_some(),
            )?;
            needs("permits is 1 or more", raw.permits != Some(0))?;
        }
        if let Some(mode) = raw.mode {
            needs("only an acquire has a mode", raw.f == Op::Acquire)?;
            needs("a mode is not for a permit", raw.permits.is_none())?;
            let reader = fencing::reader::reader_of(&raw.resource).is_some();
            match (mode, raw.kind) {
                (Mode::Read, EventType::Invoke) | (Mode::Write, _) => needs(
                    "an acquire's invoke, and a write's, names the lock (not NAME@read-K)",
                    !fencing::is_reserved(&raw.resource),
                )?,
                (Mode::Read, _) => needs(
                    "a granted read goes with a reader's slot (NAME@read-K)",
                    reader || raw.kind != EventType::Ok,
                )?,
            }
        }
        if raw.durable.is_some() {
            needs(
                "durable is for a release's ok",
                raw.f == Op::Release && raw.kind == EventType::Ok,
            )?;
            needs("a durable release needs its token", raw.token.is_some())?;
        }
        if let Some(t) = raw.current_token {
            needs(
                "current_token is for an acquire's fail",
                raw.f == Op::Acquire && raw.kind == EventType::Fail,
            )?;
            needs(
                "current_token is in the token range",
                fencing::FencingToken::new(t).is_some(),
            )?;
        }
        match (raw.f, raw.kind) {
            (Op::Acquire, EventType::Ok) => {
                needs("an ok acquire needs its token", raw.token.is_some())?;
                needs("an ok acquire needs its ttl_ms", raw.ttl_ms.is_some())?;
            }
            (Op::Write, _) => {
                needs("a write needs its token", raw.token.is_some())?;
                needs(
                    "a write needs its value (the write's name)",
                    raw.value.is_some(),
                )?;
            }
            (Op::Read, EventType::Ok) => needs(
                "an ok read needs its value (the list of writes read)",
                raw.value.as_ref().is_some_and(|v| v.is_array()),
            )?,
            _ => {}
        }
        out.push(Event {
            line: line_no,
            kind: raw.kind,
            process,
            time: raw.time,
            f: raw.f,
            resource: raw.resource,
            token: raw.token,
            ttl_ms: raw.ttl_ms,
            value: raw.value,
            index: raw.index,
            note: raw.note,
            permits: raw.permits,
            mode: raw.mode,
            durable: raw.durable == Some(true),
            current_token: raw.current_token,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_with_their_lines() {
        let h = "{\"type\":\"invoke\",\"process\":\"A\",\"time\":1,\"f\":\"acquire\",\"resource\":\"r\"}\n\n\
                 {\"type\":\"ok\",\"process\":7,\"time\":2,\"f\":\"acquire\",\"resource\":\"r\",\"token\":4,\"ttl_ms\":10}\n";
        let e = parse(h.as_bytes()).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[1].line, e[1].process.as_str(), e[1].token),
            (3, "7", Some(4))
        );
    }

    #[test]
    fn bad_lines_are_refused_with_the_reason() {
        for (line, needle) in [
            ("not json", "expected"),
            (
                "{\"type\":\"ok\",\"process\":\"A\",\"time\":1,\"f\":\"acquire\",\"resource\":\"r\"}",
                "token",
            ),
            (
                "{\"type\":\"ok\",\"process\":\"A\",\"time\":1,\"f\":\"write\",\"resource\":\"r\",\"token\":0,\"value\":1}",
                "out of range",
            ),
            (
                "{\"type\":\"ok\",\"process\":\"A\",\"time\":1,\"f\":\"write\",\"resource\":\"a b\",\"token\":1,\"value\":1}",
                "resource",
            ),
            (
                "{\"type\":\"done\",\"process\":\"A\",\"time\":1,\"f\":\"write\",\"resource\":\"r\"}",
                "unknown variant",
            ),
            (
                "{\"type\":\"ok\",\"process\":\"A\",\"time\":1,\"f\":\"read\",\"resource\":\"r\",\"value\":3}",
                "list of writes",
            ),
            (
                "{\"type\":\"ok\",\"process\":\"A\",\"time\":-1,\"f\":\"read\",\"resource\":\"r\",\"value\":[]}",
                "invalid value",
            ),
            (
                "{\"type\":\"ok\",\"process\":\"A\",\"time\":1,\"f\":\"read\",\"resource\":\"r\",\"value\":[],\"extra\":1}",
                "unknown field",
            ),
        ] {
            let err = parse(line.as_bytes()).unwrap_err().to_string();
            assert!(
                err.starts_with("line 1:") && err.contains(needle),
                "{line}: {err}"
            );
        }
    }
}
