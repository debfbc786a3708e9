//! The fence check that PostgreSQL runs: schema `fencing` in the protected database.

/// The SQL that installs (or updates) the check; idempotent, safe to run from two proxies at
/// once. `fence-proxy pg print-schema` prints it.
pub const SQL: &str = include_str!("schema.sql");

/// The general check as the relay runs it (prepared once per server connection), first in a
/// transaction whose token the proxy does not know to be the mark; `$1` is the fence wait in
/// milliseconds. Returns (resource, token), or no row when the session has no token.
pub const CHECK_FULL: &[u8] = b"SELECT * FROM fencing.check($1)";

/// The fast path, first half: the resource's lock, shared. A statement of its own, so that the
/// read that follows takes its snapshot after the lock was granted (a raise that committed
/// while this waited is then seen). Everything is schema-qualified: the text is parsed under the
/// client's `search_path`.
pub const CHECK_LOCK: &[u8] = b"SELECT pg_catalog.pg_advisory_xact_lock_shared(\
fencing.lock_key(pg_catalog.current_setting('fencing.resource', true)))";

/// The fast path, second half, for a transaction whose token the proxy believes is the mark
/// (a check with the same settings passed and no higher mark has been seen since): one read of
/// the mark. When the token is the mark under READ COMMITTED it answers (resource, token) by
/// itself, with no PL/pgSQL call; in every other case (stale, higher, missing, malformed, no
/// token, another isolation level) it hands over to the general check
/// (`fencing.check_token($1)`), which decides, raises or refuses. Two plain statements cost
/// PostgreSQL about a third of what one PL/pgSQL call does (BENCHMARKS.md).
pub const CHECK_FAST: &[u8] = b"SELECT s.r, CASE WHEN s.rc AND \
(SELECT m.token FROM fencing.tokens m WHERE m.resource OPERATOR(pg_catalog.=) s.r)\
::pg_catalog.text OPERATOR(pg_catalog.=) s.t THEN s.t::pg_catalog.int8 \
ELSE fencing.check_token($1) END \
FROM (SELECT pg_catalog.current_setting('fencing.resource', true) AS r, \
pg_catalog.current_setting('fencing.token', true) AS t, \
pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc) s";

/// Why the check could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot connect to {url}: {source}")]
    Connect { url: String, source: sqlx::Error },
    #[error("installing the fence check with {url} failed: {source}")]
    Install { url: String, source: sqlx::Error },
}

/// Installs the check in the database `url` names (a `postgres://` URL of a role that may create
/// the schema and end other sessions), in one transaction.
pub async fn install(url: &str) -> Result<(), InstallError> {
    use sqlx::Connection;
    let shown = redact(url);
    let mut conn =
        sqlx::PgConnection::connect(url)
            .await
            .map_err(|source| InstallError::Connect {
                url: shown.clone(),
                source,
            })?;
    let install = async {
        let mut tx = conn.begin().await?;
        sqlx::raw_sql(SQL).execute(&mut *tx).await?;
        tx.commit().await
    };
    install.await.map_err(|source| InstallError::Install {
        url: shown.clone(),
        source,
    })?;
    let _ = conn.close().await;
    Ok(())
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
    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            super::redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(super::redact("postgres://app@db/x"), "postgres://app@db/x");
    }
}
