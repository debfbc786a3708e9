//! The fenced requests the proxy refuses, recorded for fence-proxy's metrics, status page and
//! audit log (opskit::fence): which outcome each refusal is, and what it names.

use std::net::SocketAddr;

use opskit::fence::{self as obs, Mode, Outcome, UpstreamError};

use crate::fence::Refusal;
use crate::problem::Problem;
use crate::relay::SendError;

/// A fenced request the proxy refuses (`method`, `path`), for the metrics, the status page and
/// the audit log.
pub(crate) fn refused(problem: &Problem, peer: SocketAddr, method: &http::Method, path: &str) {
    if !obs::observing() {
        return;
    }
    let (outcome, resource, token, highest) = match problem {
        Problem::Required { .. } => (Outcome::Malformed, String::new(), String::new(), None),
        Problem::MalformedToken { value, .. } => {
            (Outcome::Malformed, String::new(), value.clone(), None)
        }
        Problem::MalformedResource { value, .. } => {
            (Outcome::Malformed, value.clone(), String::new(), None)
        }
        Problem::Signature {
            resource, value, ..
        } => (Outcome::Forged, resource.clone(), value.clone(), None),
        Problem::Refused(Refusal::Stale {
            resource,
            token,
            highest,
        }) => (
            Outcome::Stale,
            resource.as_str().to_string(),
            token.to_string(),
            Some(highest.get()),
        ),
        Problem::Refused(Refusal::Barrier { resource, .. }) => (
            Outcome::BarrierTimeout,
            resource.as_str().to_string(),
            String::new(),
            None,
        ),
        Problem::Refused(
            Refusal::Store { resource, .. } | Refusal::Unavailable { resource, .. },
        ) => (
            Outcome::Unavailable,
            resource.as_str().to_string(),
            String::new(),
            None,
        ),
        Problem::Refused(Refusal::TooManyResources { .. }) => {
            (Outcome::Unavailable, String::new(), String::new(), None)
        }
        _ => return,
    };
    obs::get().refused(
        || obs::Refusal {
            mode: Mode::Http,
            outcome,
            resource,
            token,
            highest,
            peer: peer.to_string(),
            target: format!("{method} {path}"),
            reason: problem.title().to_string(),
        },
        outcome,
        Mode::Http,
    );
}

/// An exchange with the upstream that failed before a response head arrived.
pub(crate) fn send_failed(e: &SendError) {
    let kind = match e {
        SendError::ClientGone | SendError::TooLarge => return,
        SendError::Closed(_) => UpstreamError::Lost,
        SendError::Unreachable(_) => UpstreamError::Connect,
        SendError::BadResponse(_) => UpstreamError::BadResponse,
    };
    obs::get().upstream_error(Mode::Http, kind);
}
