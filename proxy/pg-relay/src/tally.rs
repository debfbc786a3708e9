//! The session machine's events ([`Event`]) recorded for fence-proxy's metrics, status page
//! and audit log (opskit::fence), with what only the session knows: the peer and the database.

use std::net::SocketAddr;

use opskit::fence::{self as obs, Mode};

use crate::machine::Event;

/// Who a session is.
pub(crate) struct Who {
    pub(crate) peer: SocketAddr,
    pub(crate) database: String,
}

/// Records and empties `events`.
pub(crate) fn record(events: &mut Vec<Event>, who: &Who) {
    let metrics = obs::get();
    for event in events.drain(..) {
        match event {
            Event::Passed { took, raised } => {
                metrics.passed(Mode::Pg, Some(took));
                if let Some((resource, token)) = raised {
                    metrics.raised(Mode::Pg, &resource, token.unsigned_abs());
                }
            }
            Event::Refused {
                outcome,
                took,
                resource,
                token,
                highest,
                message,
            } => {
                metrics.check_took(Mode::Pg, took);
                metrics.refused(
                    || obs::Refusal {
                        mode: Mode::Pg,
                        outcome,
                        resource,
                        token,
                        highest: highest.map(i64::unsigned_abs),
                        peer: who.peer.to_string(),
                        target: who.database.clone(),
                        reason: message,
                    },
                    outcome,
                    Mode::Pg,
                );
            }
            Event::FencedOut {
                resource,
                token,
                newer,
            } => metrics.zombie_ended(|| obs::Zombie {
                resource: resource.to_string(),
                token,
                newer,
                peer: who.peer.to_string(),
                database: who.database.clone(),
            }),
        }
    }
}
