//! The answers the proxy gives itself, as `application/problem+json` (RFC 9457), from one
//! table: each refusal's status code, stable type and title are here and nowhere else.
//!
//! Types are URNs (`urn:fencing:problem:stale-token`); they, the status codes and the
//! `resource` / `token` / `highest` members are the API. The `detail` text is for people.

use http::StatusCode;
use serde_json::json;

use crate::fence::Refusal;

/// Why the proxy answered instead of the upstream.
#[derive(Debug)]
pub enum Problem {
    /// A fenced route without the token or the resource header.
    Required { missing: &'static str },
    /// The `Fencing-Token` header is not a token.
    MalformedToken { value: String, reason: String },
    /// The resource (header or path) is not a valid name.
    MalformedResource { value: String, reason: String },
    /// The token is not signed by lockd for this resource (forged, another resource's, an
    /// unknown or retired key), or is unsigned where a signature is required.
    Signature {
        resource: String,
        value: String,
        refusal: fencing::signed::Refusal,
    },
    /// The fence refused the request.
    Refused(Refusal),
    /// The request body is larger than the limit.
    BodyTooLarge { limit: u64 },
    /// The upstream could not be reached (connection refused, reset, DNS...).
    UpstreamUnreachable { reason: String },
    /// The upstream did not answer in time.
    UpstreamTimeout { after_ms: u64 },
    /// The upstream's answer cannot be relayed (malformed, or an upgrade).
    UpstreamBadResponse { reason: String },
    /// The request is not HTTP/1.1 the proxy can relay unambiguously.
    BadRequest { reason: String },
    /// The request head is longer than `limit` bytes or has more than `fields` fields.
    HeadTooLarge { limit: usize, fields: usize },
    /// A well-formed request the proxy does not relay (CONNECT, transfer codings other than
    /// chunked).
    NotImplemented { reason: String },
}

impl From<crate::h1::Reject> for Problem {
    fn from(reject: crate::h1::Reject) -> Problem {
        use crate::h1::{HEAD_MAX, HEADERS_MAX, Reject};
        match reject {
            Reject::Bad(reason) => Problem::BadRequest { reason },
            Reject::TooLarge => Problem::HeadTooLarge {
                limit: HEAD_MAX,
                fields: HEADERS_MAX,
            },
            Reject::NotImplemented(reason) => Problem::NotImplemented { reason },
        }
    }
}

impl Problem {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Problem::Required { .. } => (
                StatusCode::PRECONDITION_REQUIRED,
                "fencing-required",
                "This route needs a fencing token and resource",
            ),
            Problem::MalformedToken { .. } => (
                StatusCode::BAD_REQUEST,
                "malformed-token",
                "Malformed fencing token",
            ),
            Problem::MalformedResource { .. } => (
                StatusCode::BAD_REQUEST,
                "malformed-resource",
                "Malformed fencing resource",
            ),
            Problem::Signature {
                refusal: fencing::signed::Refusal::Unsigned,
                ..
            } => (
                StatusCode::FORBIDDEN,
                "unsigned-token",
                "This resource needs a fencing token signed by lockd",
            ),
            Problem::Signature { .. } => (
                StatusCode::FORBIDDEN,
                "forged-token",
                "Fencing token not signed by lockd for this resource",
            ),
            Problem::Refused(Refusal::Stale { .. }) => {
                (StatusCode::CONFLICT, "stale-token", "Stale fencing token")
            }
            Problem::Refused(Refusal::Barrier { .. }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "older-requests-in-flight",
                "Older-token requests still in flight",
            ),
            Problem::Refused(Refusal::TooManyResources { .. }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too-many-resources",
                "Too many fenced resources",
            ),
            Problem::Refused(Refusal::Store { .. }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "mark-store-failed",
                "High-water mark store failed",
            ),
            Problem::Refused(Refusal::Unavailable { .. }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "fence-unavailable",
                "Fence store unavailable",
            ),
            Problem::BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
            ),
            Problem::UpstreamUnreachable { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream unreachable",
            ),
            Problem::UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timed out",
            ),
            Problem::UpstreamBadResponse { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream-bad-response",
                "Upstream answer cannot be relayed",
            ),
            Problem::BadRequest { .. } => {
                (StatusCode::BAD_REQUEST, "bad-request", "Malformed request")
            }
            Problem::HeadTooLarge { .. } => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "head-too-large",
                "Request head too large",
            ),
            Problem::NotImplemented { .. } => (
                StatusCode::NOT_IMPLEMENTED,
                "not-relayed",
                "Request not relayed",
            ),
        }
    }

    /// The answer's title (what the client was told, in short).
    pub fn title(&self) -> &'static str {
        self.parts().2
    }

    /// The HTTP status of this answer.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// Appends the answer as an HTTP/1.1 response: status, `application/problem+json` body,
    /// `Retry-After` where a retry helps, `Connection: close` when the connection closes after.
    pub fn write_response(&self, out: &mut Vec<u8>, close: bool) {
        use std::io::Write;
        let status = self.status();
        let body = self.json();
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            out.extend_from_slice(b"retry-after: 1\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body.as_bytes());
    }

    /// The `application/problem+json` body.
    pub fn json(&self) -> String {
        let (status, kind, title) = self.parts();
        let mut body = json!({
            "type": format!("urn:fencing:problem:{kind}"),
            "title": title,
            "status": status.as_u16(),
        });
        let detail = match self {
            Problem::Required { missing } => {
                format!(
                    "send the lock's token in Fencing-Token and its resource in Fencing-Resource; missing: {missing}"
                )
            }
            Problem::MalformedToken { value, reason } => {
                body["token"] = json!(value);
                format!("Fencing-Token {value:?}: {reason}")
            }
            Problem::MalformedResource { value, reason } => {
                body["resource"] = json!(value);
                format!("resource {value:?}: {reason}")
            }
            Problem::Signature {
                resource,
                value,
                refusal,
            } => {
                body["resource"] = json!(resource);
                body["token"] = json!(value);
                if let fencing::signed::Refusal::UnknownKey { key_id }
                | fencing::signed::Refusal::RetiredKey { key_id }
                | fencing::signed::Refusal::BadSignature { key_id } = refusal
                {
                    body["key_id"] = json!(key_id);
                }
                format!("Fencing-Token for {resource:?}: {refusal}")
            }
            Problem::Refused(r) => {
                match r {
                    Refusal::Stale {
                        resource,
                        token,
                        highest,
                    } => {
                        body["resource"] = json!(resource.as_str());
                        body["token"] = json!(token.get());
                        body["highest"] = json!(highest.get());
                    }
                    Refusal::Barrier { resource, older } => {
                        body["resource"] = json!(resource.as_str());
                        body["older_in_flight"] = json!(older);
                    }
                    Refusal::Store { resource, .. } | Refusal::Unavailable { resource, .. } => {
                        body["resource"] = json!(resource.as_str())
                    }
                    Refusal::TooManyResources { .. } => {}
                }
                r.to_string()
            }
            Problem::BodyTooLarge { limit } => {
                format!("the request body is larger than the proxy's limit of {limit} bytes")
            }
            Problem::UpstreamUnreachable { reason } => {
                format!("the upstream could not be reached: {reason}")
            }
            Problem::UpstreamTimeout { after_ms } => {
                format!("the upstream did not answer within {after_ms} ms")
            }
            Problem::UpstreamBadResponse { reason } => {
                format!("the upstream's answer cannot be relayed: {reason}")
            }
            Problem::BadRequest { reason } => reason.clone(),
            Problem::HeadTooLarge { limit, fields } => format!(
                "the request head is longer than {limit} bytes or has more than {fields} fields"
            ),
            Problem::NotImplemented { reason } => reason.clone(),
        };
        body["detail"] = json!(detail);
        body.to_string()
    }
}
