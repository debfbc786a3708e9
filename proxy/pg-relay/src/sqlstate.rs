//! The one table of the errors the PostgreSQL mode reports itself, and their wording.
//!
//! The SQLSTATE is the API (none is in class 40, so drivers do not retry them on their own: a
//! stale token is not a transient error); the message text is for people. `FN001`, `FN002`,
//! `FN005` and `FN006` are also raised by the check inside PostgreSQL (`schema.sql`) with the
//! same wording.

use pg_wire::msg::{self, ErrorResponse};

/// The session's token is older than the highest accepted for its resource.
pub const STALE_TOKEN: &str = "FN001";
/// `fencing.resource` or `fencing.token` is malformed, or only one of them is set.
pub const BAD_SETTING: &str = "FN002";
/// The session's open transaction was ended because a newer token waited for it.
pub const FENCED_OUT: &str = "FN003";
/// The session has a token but the fence check is not installed in its database.
pub const NOT_INSTALLED: &str = "FN004";
/// A write to a protected table without a current token (raised by PostgreSQL itself).
pub const PROTECTED: &str = "FN005";
/// A commit point the fence cannot check: the transaction declared a `WITH HOLD` cursor, whose
/// query PostgreSQL runs at commit (raised by PostgreSQL itself, `fencing.held_cursor`).
pub const UNCHECKABLE: &str = "FN006";
/// A token that is not lockd's for the session's resource, or a bare number where a signed
/// token is required (raised by PostgreSQL itself, `fencing.refuse_signature`).
pub const FORGED: &str = "FN007";
pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const CANNOT_CONNECT: &str = "08001";
pub const CONNECTION_FAILURE: &str = "08006";
/// A session in plaintext where TLS is required, or SCRAM channel binding that cannot pass.
pub const INVALID_AUTHORIZATION: &str = "28000";
/// A pooled client's SCRAM proof was wrong, or its user unknown (as PostgreSQL says it).
pub const INVALID_PASSWORD: &str = "28P01";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";

const NEW_TOKEN_HINT: &str =
    "this client no longer holds the lock; acquire it again for a new token";

/// FN001, as PostgreSQL's check words it (the relay answers it from memory sometimes).
pub fn stale(out: &mut Vec<u8>, resource: &str, token: i64, highest: i64) {
    msg::error_response(
        out,
        &ErrorResponse {
            severity: "ERROR",
            code: STALE_TOKEN,
            message: &format!(
                "fencing token {token} for resource '{resource}' is stale: the highest accepted token is {highest}"
            ),
            detail: Some(&format!(
                "resource: {resource}, presented token: {token}, highest accepted token: {highest}"
            )),
            hint: Some(NEW_TOKEN_HINT),
        },
    );
}

/// FN004, in place of the error PostgreSQL gave for the check (`cause`).
pub fn not_installed(out: &mut Vec<u8>, cause: &[u8]) {
    msg::error_response(
        out,
        &ErrorResponse {
            severity: "ERROR",
            code: NOT_INSTALLED,
            message: "fence-proxy: the session has a fencing token but the fence check is not installed in this database (schema fencing), or is of another fence-proxy version",
            detail: Some(&String::from_utf8_lossy(cause)),
            hint: Some(
                "install it with `fence-proxy pg print-schema | psql ...`, or give fence-proxy a schema_urls entry for this database, then reconnect (with [signing], only schema_urls databases get the keys that verify signed tokens, and only they accept tokens)",
            ),
        },
    );
}

/// FN003, in place of PostgreSQL's FATAL "terminating connection due to administrator
/// command": an ERROR and a ReadyForQuery, as the answer to the client's request, and then the
/// connection closes. (As a FATAL, some drivers report a lost connection instead of the error:
/// asyncpg raises ConnectionDoesNotExistError; as an error that answers a request, every
/// driver tried raises it with its SQLSTATE.)
pub fn fenced_out(out: &mut Vec<u8>, resource: &str, token: i64, newer: Option<i64>) {
    let why = match newer {
        Some(h) => format!(
            "a newer token for the resource waited for it (the highest this proxy has seen is {h})"
        ),
        None => "most likely a newer token for the resource waited for it (or the server is shutting down)".to_string(),
    };
    msg::error_response(
        out,
        &ErrorResponse {
            severity: "ERROR",
            code: FENCED_OUT,
            message: &format!(
                "fenced: PostgreSQL ended this session's open transaction with fencing token {token} for resource '{resource}': {why}"
            ),
            detail: Some(
                "the transaction was rolled back; nothing it wrote was kept; this connection closes now",
            ),
            hint: Some(NEW_TOKEN_HINT),
        },
    );
    msg::ready_for_query(out, b'I');
}

/// A FATAL error of the proxy's own (the connection closes after it).
pub fn fatal(out: &mut Vec<u8>, code: &str, message: &str) {
    msg::error_response(
        out,
        &ErrorResponse {
            severity: "FATAL",
            code,
            message,
            detail: None,
            hint: None,
        },
    );
}

/// Reads "resource: R, presented token: T, highest accepted token: H" (FN001's DETAIL).
pub fn parse_stale_detail(detail: &[u8]) -> Option<(&str, i64, i64)> {
    let d = std::str::from_utf8(detail).ok()?;
    let rest = d.strip_prefix("resource: ")?;
    let (resource, rest) = rest.split_once(", presented token: ")?;
    let (token, highest) = rest.split_once(", highest accepted token: ")?;
    Some((resource, token.parse().ok()?, highest.parse().ok()?))
}

/// The resource, presented token and highest accepted token in the DETAIL of a refusal of
/// the fence's ("resource: R, presented token: T[, highest accepted token: H]"), as far as it
/// says them (empty and `None` otherwise).
pub fn parse_refusal_detail(detail: &[u8]) -> (&str, &str, Option<i64>) {
    let Some(rest) = std::str::from_utf8(detail)
        .ok()
        .and_then(|d| d.strip_prefix("resource: "))
    else {
        return ("", "", None);
    };
    let Some((resource, rest)) = rest.split_once(", presented token: ") else {
        return (rest, "", None);
    };
    match rest.split_once(", highest accepted token: ") {
        Some((token, highest)) => (resource, token, highest.parse().ok()),
        None => (resource, rest, None),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_stale_detail_is_read_back() {
        let mut out = Vec::new();
        super::stale(&mut out, "inv:1", 41, 42);
        let fields = pg_wire::msg::error_fields(&out).unwrap();
        assert_eq!(
            super::parse_stale_detail(fields.detail),
            Some(("inv:1", 41, 42))
        );
        assert_eq!(super::parse_stale_detail(b"resource: x"), None);
        assert_eq!(
            super::parse_refusal_detail(fields.detail),
            ("inv:1", "41", Some(42))
        );
        assert_eq!(
            super::parse_refusal_detail(b"resource: a, presented token: 7.k.ff"),
            ("a", "7.k.ff", None)
        );
        assert_eq!(super::parse_refusal_detail(b"no detail"), ("", "", None));
    }
}
