//! The fence check that PostgreSQL runs: schema `fencing` in the protected database.

/// The SQL that installs (or updates) the check; idempotent, safe to run from two proxies at
/// once. `fence-proxy pg print-schema` prints it.
pub const SQL: &str = include_str!("schema.sql");

/// The statement the relay runs as the first of a checked transaction; `$1` is the fence wait
/// in milliseconds, `$2` whether the proxy believes the session's token is the mark.
pub const CHECK_SQL_EXTENDED: &[u8] = b"SELECT * FROM fencing.check($1, $2)";

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
