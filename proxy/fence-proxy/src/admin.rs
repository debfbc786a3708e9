//! `fence-proxy marks show|lower|reset`: reading and repairing high-water marks by hand.
//!
//! A mark only ever rises while the proxy runs (invariant 4). A mark raised by a token that
//! lockd never issued (a poisoned resource, docs/fence-proxy.md) refuses every legitimate
//! holder, and only an operator can put it right. Lowering a mark lets writes with tokens down
//! to the new mark through again, a zombie's included. So the command needs `--force` and a
//! `--reason`, and it writes a record of the change (who, why, from what to what) in the same
//! store and the same transaction as the change itself.
//!
//! The three stores:
//! - `--data-dir DIR`: the HTTP mode's embedded file (`marks.redb`; the proxy must be
//!   stopped, since the file has one writer), records in its table `mark_changes`;
//! - `--marks-url URL`: the HTTP mode's PostgreSQL store (`fence_proxy.marks`), records in
//!   `fence_proxy.mark_changes`;
//! - `--database-url URL`: the PostgreSQL mode's `fencing.tokens` in the protected database,
//!   records in `fencing.mark_changes`. The change takes the resource's fence lock exclusively,
//!   so it waits for the transactions that hold it.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Args, Subcommand};
use fencing::{FencingToken, ResourceName};
use redb::{Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition};

use crate::marks_redb::{MARKS, MARKS_FILE};

const CHANGES: TableDefinition<u64, &str> = TableDefinition::new("mark_changes");

#[derive(Args, Debug)]
pub struct MarksArgs {
    #[command(subcommand)]
    pub action: MarksAction,
}

/// Which store the marks are in: exactly one of the three.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct MarksTarget {
    /// The HTTP mode's embedded store in this data directory (stop that fence-proxy first).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The HTTP mode's PostgreSQL store (fence.postgres_url).
    #[arg(long, value_name = "URL")]
    pub marks_url: Option<String>,
    /// The PostgreSQL mode: the protected database's fencing.tokens (a role that owns it).
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
}

/// Who changes a mark, and why: both are recorded with the change.
#[derive(Args, Debug, Clone)]
pub struct ChangeArgs {
    /// Required: a lowered or reset mark lets writes with older tokens through again, a
    /// zombie's included.
    #[arg(long)]
    pub force: bool,
    /// Why (recorded).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Who (recorded) [default: the login name].
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// PostgreSQL stores: longest wait for the resource's lock (held by transactions in
    /// progress), in ms.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub wait_ms: u64,
}

#[derive(Subcommand, Debug)]
pub enum MarksAction {
    /// Print a resource's mark (every mark, up to 1000, without one) and the changes made by hand.
    Show {
        #[command(flatten)]
        target: MarksTarget,
        resource: Option<String>,
    },
    /// Set a resource's mark to a lower token (e.g. undo a forged token's raise).
    Lower {
        #[command(flatten)]
        target: MarksTarget,
        resource: String,
        /// The new mark: the highest token lockd really issued for the resource.
        #[arg(long, value_name = "TOKEN")]
        to: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Remove a resource's mark: the next token of any value becomes the mark.
    Reset {
        #[command(flatten)]
        target: MarksTarget,
        resource: String,
        #[command(flatten)]
        change: ChangeArgs,
    },
}

/// What to do to a mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Show,
    /// Set the mark to this token, which must be below the current mark.
    Lower(FencingToken),
    /// Remove the mark: the next token of any value is accepted and becomes the mark.
    Reset,
}

/// Where the marks are.
#[derive(Clone, Debug)]
pub enum Target {
    Redb(std::path::PathBuf),
    HttpPostgres(String),
    PgMode(String),
}

/// Who changes a mark, and why.
#[derive(Clone, Debug)]
pub struct Change {
    pub actor: String,
    pub reason: String,
    /// Longest wait for the locks of transactions in progress.
    pub wait: std::time::Duration,
}

/// One record of a change.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    at_unix_ms: u64,
    resource: String,
    action: String,
    old_token: Option<u64>,
    new_token: Option<u64>,
    actor: String,
    reason: String,
}

/// Runs `action` on `resource`'s mark (every mark, for `show` without a resource) and returns
/// what to print.
pub async fn run(
    target: &Target,
    resource: Option<&ResourceName>,
    action: Action,
    change: Option<&Change>,
) -> anyhow::Result<String> {
    if action != Action::Show && (resource.is_none() || change.is_none()) {
        bail!("lower and reset need a resource, --force and --reason");
    }
    match target {
        Target::Redb(dir) => redb_run(dir, resource, action, change),
        Target::HttpPostgres(url) => pg_run(url, Tables::HTTP, resource, action, change).await,
        Target::PgMode(url) => pg_run(url, Tables::PG_MODE, resource, action, change).await,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The new mark, or why not.
fn next(current: Option<u64>, action: Action, resource: &str) -> anyhow::Result<Option<u64>> {
    match (action, current) {
        (_, None) => bail!("{resource} has no mark: nothing to lower or reset"),
        (Action::Lower(to), Some(c)) if to.get() >= c => bail!(
            "the mark of {resource} is {c}; --to {to} is not below it (marks rise by themselves)"
        ),
        (Action::Lower(to), Some(_)) => Ok(Some(to.get())),
        (Action::Reset, Some(_)) => Ok(None),
        (Action::Show, _) => unreachable!("show changes nothing"),
    }
}

fn action_name(action: Action) -> &'static str {
    match action {
        Action::Show => "show",
        Action::Lower(_) => "lower",
        Action::Reset => "reset",
    }
}

fn describe_change(resource: &str, old: Option<u64>, new: Option<u64>, change: &Change) -> String {
    let show = |t: Option<u64>| t.map_or("none".to_string(), |t| t.to_string());
    format!(
        "{resource}: mark {} -> {} (by {:?}: {:?}); recorded",
        show(old),
        show(new),
        change.actor,
        change.reason
    )
}

fn redb_run(
    dir: &Path,
    resource: Option<&ResourceName>,
    action: Action,
    change: Option<&Change>,
) -> anyhow::Result<String> {
    let path = dir.join(MARKS_FILE);
    if !path.exists() {
        bail!(
            "{} does not exist: no marks in {}",
            path.display(),
            dir.display()
        );
    }
    let db = Database::builder().open(&path).map_err(|e| match e {
        DatabaseError::DatabaseAlreadyOpen => anyhow::anyhow!(
            "{} is in use by a running fence-proxy; stop it first (the file has one writer), then run this again",
            path.display()
        ),
        other => anyhow::anyhow!("cannot open {}: {other}", path.display()),
    })?;
    if action == Action::Show {
        let read = db.begin_read()?;
        let marks = read.open_table(MARKS)?;
        let mut out = String::new();
        match resource {
            Some(r) => {
                let mark = marks.get(r.as_str())?.map(|v| v.value());
                out.push_str(&format!(
                    "{r} {}\n",
                    mark.map_or("no mark".to_string(), |m| format!("mark={m}"))
                ));
            }
            None => {
                for entry in marks.iter()?.take(SHOW_MAX) {
                    let (k, v) = entry?;
                    out.push_str(&format!("{} mark={}\n", k.value(), v.value()));
                }
            }
        }
        if let Ok(changes) = read.open_table(CHANGES) {
            for entry in changes.iter()? {
                let (_, v) = entry?;
                let record: Record = serde_json::from_str(v.value())?;
                if resource.is_none_or(|r| r.as_str() == record.resource) {
                    out.push_str(&format!("change {}\n", serde_json::to_string(&record)?));
                }
            }
        }
        return Ok(out);
    }
    let (resource, change) = (resource.expect("checked"), change.expect("checked"));
    let tx = db.begin_write()?;
    let (old, new) = {
        let mut marks = tx.open_table(MARKS)?;
        let old = marks.get(resource.as_str())?.map(|v| v.value());
        let new = next(old, action, resource.as_str())?;
        match new {
            Some(t) => marks.insert(resource.as_str(), t)?,
            None => marks.remove(resource.as_str())?,
        };
        let mut changes = tx.open_table(CHANGES)?;
        let seq = changes.last()?.map_or(0, |(k, _)| k.value() + 1);
        let record = Record {
            at_unix_ms: now_ms(),
            resource: resource.as_str().to_string(),
            action: action_name(action).to_string(),
            old_token: old,
            new_token: new,
            actor: change.actor.clone(),
            reason: change.reason.clone(),
        };
        changes.insert(seq, serde_json::to_string(&record)?.as_str())?;
        (old, new)
    };
    tx.commit()?;
    Ok(describe_change(resource.as_str(), old, new, change))
}

/// Marks listed at most by `show` without a resource.
const SHOW_MAX: usize = 1000;

/// The tables of one PostgreSQL store.
struct Tables {
    marks: &'static str,
    changes: &'static str,
    /// Creates the changes table (the HTTP store's; the PostgreSQL mode's comes with the
    /// schema).
    create: Option<&'static str>,
    /// The statement that waits for the resource's fence lock (the PostgreSQL mode).
    lock: Option<&'static str>,
    /// More columns a lowered mark clears (the PostgreSQL mode's hash of the signed token
    /// that raised it).
    clear: &'static str,
}

impl Tables {
    const HTTP: Tables = Tables {
        marks: "fence_proxy.marks",
        changes: "fence_proxy.mark_changes",
        create: Some(crate::fence_pg::CHANGES_SCHEMA),
        lock: None,
        clear: "",
    };
    const PG_MODE: Tables = Tables {
        marks: "fencing.tokens",
        changes: "fencing.mark_changes",
        create: None,
        // It announces the largest token first, so that a raise waiting meanwhile does not
        // take it for an older transaction and end it (fencing.evict_older); after the wait it
        // ends the holders that proved no token (fencing.take_for_change).
        lock: Some("SELECT fencing.take_for_change($1)"),
        clear: ", signed_hash = NULL",
    };
}

async fn pg_run(
    url: &str,
    tables: Tables,
    resource: Option<&ResourceName>,
    action: Action,
    change: Option<&Change>,
) -> anyhow::Result<String> {
    use sqlx::{Connection, Row};
    let shown = pg_relay::schema::redact(url);
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {shown}: {e}"))?;
    if let Some(create) = tables.create {
        sqlx::raw_sql(create).execute(&mut conn).await.map_err(db)?;
    }
    let (marks, changes) = (tables.marks, tables.changes);
    if action == Action::Show {
        let rows = match resource {
            Some(r) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT resource, token FROM {marks} WHERE resource = $1"
                )))
                .bind(r.as_str())
                .fetch_all(&mut conn)
                .await
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT resource, token FROM {marks} ORDER BY resource LIMIT {SHOW_MAX}"
                )))
                .fetch_all(&mut conn)
                .await
            }
        }
        .map_err(|e| anyhow::anyhow!("reading {marks} in {shown}: {e}"))?;
        let mut out = String::new();
        if rows.is_empty()
            && let Some(r) = resource
        {
            out.push_str(&format!("{r} no mark\n"));
        }
        for row in rows {
            let (r, t): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            out.push_str(&format!("{r} mark={t}\n"));
        }
        let records = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT (extract(epoch FROM at) * 1000)::bigint, resource, action, old_token, new_token, actor, reason \
             FROM {changes} WHERE $1::text IS NULL OR resource = $1 ORDER BY at"
        )))
        .bind(resource.map(|r| r.as_str()))
        .fetch_all(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!("reading {changes} in {shown}: {e}"))?;
        for row in records {
            let record = Record {
                at_unix_ms: row.try_get::<i64, _>(0)? as u64,
                resource: row.try_get(1)?,
                action: row.try_get(2)?,
                old_token: row.try_get::<Option<i64>, _>(3)?.map(|t| t as u64),
                new_token: row.try_get::<Option<i64>, _>(4)?.map(|t| t as u64),
                actor: row.try_get(5)?,
                reason: row.try_get(6)?,
            };
            out.push_str(&format!("change {}\n", serde_json::to_string(&record)?));
        }
        return Ok(out);
    }
    let (resource, change) = (resource.expect("checked"), change.expect("checked"));
    let mut tx = conn.begin().await.map_err(db)?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET LOCAL lock_timeout = '{}ms'",
        change.wait.as_millis().max(1)
    )))
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    let locked = match tables.lock {
        Some(lock) => sqlx::query(lock)
            .bind(resource.as_str())
            .execute(&mut *tx)
            .await
            .map(|_| ()),
        None => Ok(()),
    };
    if let Err(e) = locked {
        if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03") {
            bail!(
                "{resource}: a transaction with a proved token held its fence lock for longer than {} ms at each of several tries (sessions that proved none were ended; see pg_locks); let it finish, end it, or raise --wait-ms",
                change.wait.as_millis()
            );
        }
        return Err(db(e));
    }
    let old: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT token FROM {marks} WHERE resource = $1 FOR UPDATE"
    )))
    .bind(resource.as_str())
    .fetch_optional(&mut *tx)
    .await
    .map_err(|e| match e.as_database_error().and_then(|d| d.code()).as_deref() {
        Some("55P03") => anyhow::anyhow!(
            "{resource}: a transaction in progress held its mark for longer than {} ms; retry, or raise --wait-ms",
            change.wait.as_millis()
        ),
        _ => db(e),
    })?;
    let old = old.map(|t| t as u64);
    let new = next(old, action, resource.as_str())?;
    match new {
        Some(t) => sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {marks} SET token = $2{} WHERE resource = $1",
            tables.clear
        )))
        .bind(resource.as_str())
        .bind(t as i64)
        .execute(&mut *tx)
        .await
        .map_err(db)?,
        None => sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {marks} WHERE resource = $1"
        )))
        .bind(resource.as_str())
        .execute(&mut *tx)
        .await
        .map_err(db)?,
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {changes} (resource, action, old_token, new_token, actor, reason) \
         VALUES ($1, $2, $3, $4, $5 || ' (as ' || session_user || ')', $6)"
    )))
    .bind(resource.as_str())
    .bind(action_name(action))
    .bind(old.map(|t| t as i64))
    .bind(new.map(|t| t as i64))
    .bind(&change.actor)
    .bind(&change.reason)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(describe_change(resource.as_str(), old, new, change))
}

/// A database error as one message (sqlx's own chain repeats its text).
fn db(e: sqlx::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}
