//! The fence check that PostgreSQL runs: schema `fencing` in the protected database.

/// The SQL that installs (or updates) the check; idempotent, safe to run from two proxies at
/// once. `fence-proxy pg print-schema` prints it.
pub const SQL: &str = include_str!("schema.sql");

/// The settings of the session, as the check statements read them (the start of a subquery
/// `q`), after `$fire` (an expression that is true, evaluated first: at a transaction's end,
/// [`FIRE`]): `(r, t)`, each `''` when unset (PostgreSQL keeps an empty placeholder after a
/// `RESET`), and `u`: this is a check at the transaction's commit point (`$2`), with some
/// fencing setting, in a transaction that has written nothing (no transaction id assigned).
/// Such a check need not judge: nothing is there to fence, and the statements that write later
/// are checked then. `h`: at the commit point, the session has a `WITH HOLD` cursor, which
/// can only be this transaction's (the checks refuse every commit with one, so none outlives
/// its transaction): PostgreSQL runs its query when the transaction commits, after this check,
/// so nothing can judge what it writes or declares, and the commit is refused
/// (`fencing.held_cursor`, FN006). The settings are read with `d.f` as `missing_ok`, so that
/// they are read after `$fire` has run (an argument is evaluated before its call), and the
/// xid and the cursors in the projection over that row. Schema-qualified throughout: the text
/// is parsed under the client's `search_path`, where an operator or function of the same name
/// could otherwise be found first.
macro_rules! settings {
    ($fire:expr) => {
        concat!(
            "(SELECT q.r, q.t, \
$2::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') \
AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, \
$2::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM \
(SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, \
COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, \
pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc \
FROM (SELECT ",
            $fire,
            " AS f OFFSET 0) d) q"
        )
    };
}

/// At a transaction's end (`$3`, or the lock statement's `$1`): its deferred triggers fire
/// now (`fencing.fire_deferred`: `SET CONSTRAINTS ALL IMMEDIATE`), not at `COMMIT` after the
/// check, so that the check judges what they write and declare (a deferred constraint trigger
/// that declares a stale token and writes), and so that a deferred constraint's error comes
/// before the commit point's answer, as it would at `COMMIT`. Only there: in the middle of a
/// transaction it would make the client's deferred constraints immediate.
macro_rules! fire {
    ($ends:literal) => {
        concat!(
            "CASE WHEN ",
            $ends,
            "::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END"
        )
    };
}

/// The check the relay runs when it does not believe the session's token to be the mark: the
/// common case of a session without a token costs one plain statement, two settings read and
/// compared, no function call. A session with any fencing setting at all (a token, or only
/// half of one) is handed to the general check (`fencing.check_token($1)`, `$1` the fence wait
/// in milliseconds), which decides, raises or refuses (FN001, FN002), unless `u` (above).
/// Returns the resource and the token accepted; a NULL token when the session has none; a
/// NULL resource when it did not judge. `$3`: the transaction ends here (see [`fire!`]).
pub const CHECK_ANY: &[u8] = concat!(
    "SELECT CASE WHEN s.u THEN NULL ELSE s.r END, \
CASE WHEN s.h THEN fencing.held_cursor() \
WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 \
WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token($1) END FROM ",
    settings!(fire!("$3")),
    ") s"
)
.as_bytes();

/// The check in a database where the fence check is not installed (the relay found out when it
/// prepared its statements): a session without a token passes; any fencing setting makes it
/// fail, with a cast error the relay reports as FN004 (fail closed: nothing here can check a
/// token), and so does a commit point with a held cursor open (`h`). It takes the same
/// parameters as [`CHECK_ANY`], so that it binds alike; nothing here can fire deferred
/// triggers early (a limit, docs/fence-proxy.md).
pub const CHECK_BARE: &[u8] = concat!(
    "SELECT s.r, CASE WHEN s.h THEN CAST('fence-proxy: no fence check in this database, and a WITH HOLD \
cursor is open at this commit point; fencing.resource = ' OPERATOR(pg_catalog.||) s.r AS pg_catalog.int8) \
WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' \
THEN NULL::pg_catalog.int8 ELSE CAST('fence-proxy: no fence check in this database; fencing.resource = ' \
OPERATOR(pg_catalog.||) s.r AS pg_catalog.int8) END FROM ",
    settings!("true"),
    ") s"
)
.as_bytes();

/// The fast path, first half: the resource's lock, shared. A statement of its own, so that the
/// read that follows takes its snapshot after the lock was granted (a raise that committed
/// while this waited is then seen). At a transaction's end (`$1`) it fires the deferred
/// triggers first ([`fire!`]): the settings it locks by, and the fast read after it, are then
/// the final ones. It only tries the lock: when a holder keeps it (a raise in progress, or a
/// session that took it by hand), `fencing.share` waits, and ends such a session after the
/// fence wait. Everything is schema-qualified: the text is parsed under the client's
/// `search_path`.
pub const CHECK_LOCK: &[u8] = concat!(
    "SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock_shared(fencing.lock_key(s.r)) \
THEN true ELSE fencing.share(s.r, NULL) END FROM (SELECT pg_catalog.current_setting('fencing.resource', ",
    fire!("$1"),
    ") AS r OFFSET 0) s"
)
.as_bytes();

/// The fast path, second half, for a transaction whose token the proxy believes is the mark
/// (a check with the same settings passed and no higher mark has been seen since): one read of
/// the mark. When the token is the mark under READ COMMITTED it answers (resource, token) by
/// itself, with no PL/pgSQL call; in every other case (stale, higher, missing, malformed, no
/// token, another isolation level, a plain token for a resource that needs signed ones) it
/// hands over to the general check. A signed token is the mark when it hashes to the
/// `signed_hash` its raise stored, under the version of the keys that is still current
/// (`fencing.keys_version`): the signature was verified then, by the general check
/// (`fencing.check_token($1)`), which decides, raises or refuses, unless `u` (above). Two plain
/// statements cost PostgreSQL about a third of what one PL/pgSQL call does (BENCHMARKS.md).
pub const CHECK_FAST: &[u8] = concat!(
    "SELECT CASE WHEN s.u AND NOT s.cur THEN NULL ELSE s.r END, \
CASE WHEN s.h THEN fencing.held_cursor() WHEN s.cur THEN s.mark \
WHEN s.u THEN NULL::pg_catalog.int8 \
ELSE fencing.check_token($1) END FROM (SELECT v.r, v.u, v.h, m.token AS mark, v.rc AND COALESCE(\
m.token::pg_catalog.text OPERATOR(pg_catalog.=) v.t \
AND NOT EXISTS (SELECT FROM fencing.signed_prefixes p \
WHERE pg_catalog.left(v.r, pg_catalog.length(p.prefix)) OPERATOR(pg_catalog.=) p.prefix) \
OR m.signed_hash OPERATOR(pg_catalog.=) \
pg_catalog.sha256(pg_catalog.convert_to(v.t, 'UTF8')) \
AND m.keys_version OPERATOR(pg_catalog.=) (SELECT k.v FROM fencing.keys_version k), false) AS cur FROM ",
    settings!("true"),
    ") v LEFT JOIN LATERAL (SELECT m.token, m.signed_hash, m.keys_version FROM fencing.tokens m \
WHERE m.resource OPERATOR(pg_catalog.=) v.r) m ON true) s"
)
.as_bytes();

/// The check before a transaction's statements where the commit hook judges the commits and
/// the proxy believes the token current: one call of the hook's fast check in C
/// (`fencing.hook_check`, which the schema creates where the hook's library is loaded), in
/// place of [`CHECK_LOCK`] and [`CHECK_FAST`]. It takes the resource's lock shared and reads
/// the mark after it, and hands anything else to the general check, as they do. Returns the
/// resource and the token accepted (NULL without a token). `$1`: the fence wait.
pub const CHECK_HOOKED: &[u8] =
    b"SELECT COALESCE(pg_catalog.current_setting('fencing.resource', true), ''), \
fencing.hook_check($1)";

/// The check as the relay writes it into a Query's text (where prepared statements cannot go:
/// after a statement of the same string, or before a `COPY FROM STDIN`). `current`: the proxy
/// believes the token is the mark; `at_commit`: at the transaction's commit point ([`CHECK_ANY`]
/// with `$2` true); `ends`: the transaction ends there (`$3`); `installed`: the check exists in
/// this database.
pub fn check_text(
    wait_ms: &str,
    current: bool,
    at_commit: bool,
    ends: bool,
    installed: bool,
) -> String {
    let flag = |b: bool| if b { "true" } else { "false" };
    let text = |form: &[u8]| {
        String::from_utf8_lossy(form)
            .replace("$1", wait_ms)
            .replace("$2", flag(at_commit))
            .replace("$3", flag(ends))
    };
    match (installed, at_commit) {
        (false, _) => text(CHECK_BARE),
        (true, true) => text(CHECK_ANY),
        (true, false) => format!("SELECT * FROM fencing.check({wait_ms}, {current})"),
    }
}

/// The statements the relay prepares on each server connection, by name, as text.
pub fn prepared_statements() -> Vec<(&'static str, String)> {
    crate::machine::STATEMENTS
        .iter()
        .map(|(name, text, _)| {
            (
                std::str::from_utf8(name).expect("ASCII names"),
                String::from_utf8_lossy(text).into_owned(),
            )
        })
        .collect()
}

/// Why the check could not be installed. (The sqlx error is part of the message rather than a
/// `source`: its own chain repeats its text, so a reporter that prints causes would say it
/// three times.)
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot connect to {url}: {cause}")]
    Connect { url: String, cause: sqlx::Error },
    #[error("installing the fence check with {url} failed: {cause}")]
    Install { url: String, cause: sqlx::Error },
    #[error("no answer from {url}")]
    NoAnswer { url: String },
    #[error("{url} was not ready within {waited_ms} ms (schema_wait_ms); the last attempt: {last}")]
    NotReady {
        url: String,
        waited_ms: u128,
        last: Box<InstallError>,
    },
}

impl InstallError {
    /// Whether trying again may succeed without anyone changing anything: PostgreSQL not
    /// listening yet or going away (an I/O error), still starting up or recovering (SQLSTATE
    /// 57P03), or shutting down for a restart (57P01, 57P02). A refused password, a missing
    /// database or a failing statement is not.
    pub fn transient(&self) -> bool {
        let (InstallError::Connect { cause, .. } | InstallError::Install { cause, .. }) = self
        else {
            return matches!(self, InstallError::NoAnswer { .. });
        };
        match cause {
            sqlx::Error::Io(_) => true,
            sqlx::Error::Database(db) => {
                matches!(db.code().as_deref(), Some("57P01" | "57P02" | "57P03"))
            }
            _ => false,
        }
    }
}

/// Installs the check in the database `url` names (a `postgres://` URL of a role that may create
/// the schema and end other sessions), in one transaction, with `signing`'s keys and prefixes
/// when given (without, those the database has are kept). Connecting may take up to
/// `connect_timeout` (an address that swallows packets would otherwise hold the caller for the
/// system's TCP timeout); the installation itself is not bounded (it may wait its turn behind
/// another proxy's).
pub async fn install(
    url: &str,
    connect_timeout: std::time::Duration,
    signing: Option<&fencing::signed::Policy>,
) -> Result<(), InstallError> {
    use sqlx::Connection;
    let shown = redact(url);
    let mut conn =
        match tokio::time::timeout(connect_timeout, sqlx::PgConnection::connect(url)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(cause)) => return Err(InstallError::Connect { url: shown, cause }),
            Err(_) => return Err(InstallError::NoAnswer { url: shown }),
        };
    let install = async {
        let mut tx = conn.begin().await?;
        sqlx::raw_sql(SQL).execute(&mut *tx).await?;
        if let Some(policy) = signing {
            install_signing(&mut tx, policy).await?;
        }
        tx.commit().await
    };
    install.await.map_err(|cause| InstallError::Install {
        url: shown.clone(),
        cause,
    })?;
    let _ = conn.close().await;
    Ok(())
}

/// Makes the database's keys and signed prefixes those of `policy`, in the installing
/// transaction (whose advisory lock keeps two proxies from interleaving): keys not in the key
/// file are deleted, so a key removed from it stops verifying; the prefixes are replaced.
async fn install_signing(
    tx: &mut sqlx::PgConnection,
    policy: &fencing::signed::Policy,
) -> Result<(), sqlx::Error> {
    let keys = policy.keys().map(|k| k.keys()).unwrap_or_default();
    let mut ids = Vec::new();
    let mut ipads: Vec<Option<Vec<u8>>> = Vec::new();
    let mut opads: Vec<Option<Vec<u8>>> = Vec::new();
    let mut retired = Vec::new();
    for key in keys {
        ids.push(key.id().to_string());
        let pads = key.pads();
        ipads.push(pads.map(|(i, _)| i.to_vec()));
        opads.push(pads.map(|(_, o)| o.to_vec()));
        retired.push(pads.is_none());
    }
    sqlx::query("DELETE FROM fencing.keys WHERE key_id <> ALL($1::text[])")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO fencing.keys (key_id, ipad, opad, retired) \
         SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bool[]) \
         ON CONFLICT (key_id) DO UPDATE SET ipad = EXCLUDED.ipad, opad = EXCLUDED.opad, retired = EXCLUDED.retired \
         WHERE (keys.ipad, keys.opad, keys.retired) IS DISTINCT FROM (EXCLUDED.ipad, EXCLUDED.opad, EXCLUDED.retired)",
    )
    .bind(&ids)
    .bind(&ipads)
    .bind(&opads)
    .bind(&retired)
    .execute(&mut *tx)
    .await?;
    // Only what differs is written: every change raises `fencing.keys_version`, which ends the
    // fast reads' hashes and fails every open REPEATABLE READ transaction's commit (with the
    // commit hook); an installation with the same key file changes nothing.
    sqlx::query("DELETE FROM fencing.signed_prefixes WHERE prefix <> ALL($1::text[])")
        .bind(policy.required_prefixes())
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO fencing.signed_prefixes SELECT DISTINCT unnest($1::text[]) ON CONFLICT DO NOTHING",
    )
    .bind(policy.required_prefixes())
    .execute(&mut *tx)
    .await?;
    // The hashes of other versions of the keys pass no fast read; dropped, they say so.
    sqlx::query(
        "UPDATE fencing.tokens SET signed_hash = NULL, keys_version = NULL WHERE signed_hash IS NOT NULL \
         AND keys_version IS DISTINCT FROM (SELECT v FROM fencing.keys_version)",
    )
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// [`install`], tried again while the failure is [`InstallError::transient`] (a sidecar often
/// starts before its PostgreSQL accepts connections) until `wait` has passed: attempts 0.1 s
/// apart at first, doubling up to 2 s; each connection attempt bounded by `connect_timeout`.
/// With `wait` zero there is exactly one attempt.
pub async fn install_waiting(
    url: &str,
    wait: std::time::Duration,
    connect_timeout: std::time::Duration,
    signing: Option<&fencing::signed::Policy>,
) -> Result<(), InstallError> {
    use std::time::{Duration, Instant};
    let shown = redact(url);
    let started = Instant::now();
    let deadline = started + wait;
    let mut pause = Duration::from_millis(100);
    loop {
        let error = match install(url, connect_timeout, signing).await {
            Ok(()) => return Ok(()),
            Err(e) if e.transient() => e,
            Err(e) => return Err(e),
        };
        if Instant::now() + pause > deadline {
            return Err(InstallError::NotReady {
                url: shown,
                waited_ms: started.elapsed().as_millis(),
                last: Box::new(error),
            });
        }
        tracing::warn!(url = %shown, error = %error, retry_in_ms = pause.as_millis() as u64,
            "PostgreSQL is not ready for the fence check; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Whether the check is installed in the database `url` names, for fence-proxy's `/readyz`:
/// `Err` says why not (not installed, or the database cannot be asked).
pub async fn probe(url: &str, connect_timeout: std::time::Duration) -> Result<(), String> {
    use sqlx::Connection;
    let shown = redact(url);
    let asked = tokio::time::timeout(connect_timeout, async {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let found: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'fencing' AND p.proname = 'check'",
        )
        .fetch_one(&mut conn)
        .await?;
        let _ = conn.close().await;
        Ok::<_, sqlx::Error>(found)
    })
    .await;
    match asked {
        Ok(Ok(0)) => Err(format!(
            "{shown}: the fence check is not installed (schema fencing has no check)"
        )),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!(
            "{shown}: cannot ask whether the check is installed: {e}"
        )),
        Err(_) => Err(format!("{shown}: no answer within {connect_timeout:?}")),
    }
}

/// `url` without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::InstallError;

    #[test]
    fn only_what_may_pass_by_itself_is_tried_again() {
        let url = || "postgres://x@db/y".to_string();
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let cases = [
            (
                InstallError::Connect {
                    url: url(),
                    cause: sqlx::Error::Io(refused),
                },
                true,
            ),
            (InstallError::NoAnswer { url: url() }, true),
            (
                InstallError::Connect {
                    url: url(),
                    cause: sqlx::Error::Configuration("bad url".into()),
                },
                false,
            ),
            (
                InstallError::Install {
                    url: url(),
                    cause: sqlx::Error::Protocol("unexpected message".into()),
                },
                false,
            ),
            (
                InstallError::NotReady {
                    url: url(),
                    waited_ms: 1,
                    last: Box::new(InstallError::NoAnswer { url: url() }),
                },
                false,
            ),
        ];
        for (e, transient) in cases {
            assert_eq!(e.transient(), transient, "{e}");
        }
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            super::redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(super::redact("postgres://app@db/x"), "postgres://app@db/x");
    }
}
