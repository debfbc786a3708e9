//! The answers the proxy gives itself, as `application/problem+json` (RFC 9457), from one
//! table: each refusal's status code, stable type and title are here and nowhere else.
//!
//! Types are URNs (`urn:fencing:problem:stale-token`); they, the status codes and the
//! `resource` / `token` / `highest` members are the API. The `detail` text is for people.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
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
    /// The fence refused the request.
    Refused(Refusal),
    /// The request body is larger than the limit.
    BodyTooLarge { limit: u64 },
    /// The upstream could not be reached (connection refused, reset, DNS...).
    UpstreamUnreachable { reason: String },
    /// The upstream did not answer in time.
    UpstreamTimeout { after_ms: u64 },
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
        }
    }

    /// The HTTP status of this answer.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The answer: status, `application/problem+json` body, `Retry-After` where a retry helps.
    pub fn response<B: From<Bytes>>(&self) -> Response<B> {
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
        };
        body["detail"] = json!(detail);
        let mut response = Response::new(B::from(Bytes::from(body.to_string())));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
