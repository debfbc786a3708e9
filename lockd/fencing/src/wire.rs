//! The names under which a resource and a token travel, so that every side spells them alike.

/// PostgreSQL custom setting naming the resource (`SET fencing.resource = '...'`).
pub const PG_SETTING_RESOURCE: &str = "fencing.resource";
/// PostgreSQL custom setting carrying the token (`SET fencing.token = '42'`).
pub const PG_SETTING_TOKEN: &str = "fencing.token";

/// HTTP request header naming the resource.
pub const HTTP_HEADER_RESOURCE: &str = "Fencing-Resource";
/// HTTP request header carrying the token.
pub const HTTP_HEADER_TOKEN: &str = "Fencing-Token";

/// Environment variable `lockctl run` gives the command: the resource it holds.
pub const ENV_RESOURCE: &str = "FENCING_RESOURCE";
/// Environment variable `lockctl run` gives the command: the token of its grant, in the form
/// to present to fence-proxy (signed, when lockd signs tokens).
pub const ENV_TOKEN: &str = "FENCING_TOKEN";
/// Environment variable `lockctl run` gives the command: the token's number alone.
pub const ENV_TOKEN_NUMBER: &str = "FENCING_TOKEN_NUMBER";
/// Environment variable `lockctl run` gives the command: every lock it holds, as
/// `RESOURCE=TOKEN` pairs joined by commas, in the order they were taken (neither a resource
/// name nor a token, signed or not, has a `,` or a `=`).
pub const ENV_TOKENS: &str = "FENCING_TOKENS";
