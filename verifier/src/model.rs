//! A model of the protocol, explored exhaustively (breadth first) for a small scope.
//!
//! Actors: lockd (one lease at a time, a token counter, expiry by its own clock), clients that
//! acquire, release, write with the token they believe they hold, and can be paused at any
//! moment (and resumed), a network that delays each write for as long as it likes, and the
//! resource, which accepts or, with the fence, refuses a write by its token. A client does not
//! learn that its lease expired while it is paused: the zombie.
//!
//! The property: the resource never accepts a write with a token lower than one it accepted
//! before (invariant 3). With the fence it holds in every reachable state; without it the
//! explorer finds the shortest counterexample and prints it as a story.

use std::collections::{HashMap, VecDeque};
use std::fmt;

/// What is explored.
#[derive(Debug, Clone, Copy)]
pub struct Scope {
    pub clients: usize,
    /// Grants lockd may make in a run.
    pub grants: u8,
    /// Writes each client may send in a run.
    pub writes: u8,
    /// Whether the resource checks tokens.
    pub fence: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Client {
    /// The token the client believes it holds.
    token: Option<u8>,
    paused: bool,
    /// A write on its way to the resource, with its token.
    in_flight: Option<u8>,
    sent: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    /// lockd: the current lease's holder, if the lease is valid.
    holder: Option<u8>,
    granted: u8,
    clients: Vec<Client>,
    /// The resource: the highest token it accepted.
    highest: u8,
    /// It accepted a write below `highest` (the property broken).
    broken: bool,
}

/// One step of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Acquire { client: u8, token: u8 },
    Release { client: u8 },
    Expire { client: u8 },
    Notice { client: u8 },
    Pause { client: u8 },
    Resume { client: u8 },
    Send { client: u8, token: u8 },
    Accept { client: u8, token: u8, stale: bool },
    Refuse { client: u8, token: u8, highest: u8 },
}

fn name(c: u8) -> char {
    (b'A' + c) as char
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Step::Acquire { client, token } => {
                write!(
                    f,
                    "{} acquires the lock and gets token {token}",
                    name(client)
                )
            }
            Step::Release { client } => write!(f, "{} releases the lock", name(client)),
            Step::Expire { client } => write!(
                f,
                "{}'s lease expires (lockd's clock); {} is not told",
                name(client),
                name(client)
            ),
            Step::Notice { client } => {
                write!(f, "{} notices it no longer holds the lock", name(client))
            }
            Step::Pause { client } => write!(f, "{} is paused (GC, SIGSTOP)", name(client)),
            Step::Resume { client } => write!(f, "{} is resumed", name(client)),
            Step::Send { client, token } => write!(
                f,
                "{} sends a write with token {token} (it believes it holds the lock)",
                name(client)
            ),
            Step::Accept {
                client,
                token,
                stale: false,
            } => write!(
                f,
                "the resource accepts {}'s write (token {token})",
                name(client)
            ),
            Step::Accept {
                client,
                token,
                stale: true,
            } => write!(
                f,
                "the resource accepts {}'s write with token {token} after a higher one: VIOLATION",
                name(client)
            ),
            Step::Refuse {
                client,
                token,
                highest,
            } => write!(
                f,
                "the resource refuses {}'s write: token {token} is below {highest}",
                name(client)
            ),
        }
    }
}

/// What exploring a scope found.
#[derive(Debug)]
pub struct Outcome {
    /// Distinct states reached.
    pub states: usize,
    /// The shortest run that breaks the property, if any.
    pub counterexample: Option<Vec<Step>>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.counterexample {
            None => write!(
                f,
                "{} states explored: the resource never accepts an older token after a newer one",
                self.states
            ),
            Some(steps) => {
                writeln!(
                    f,
                    "{} states explored: COUNTEREXAMPLE in {} steps:",
                    self.states,
                    steps.len()
                )?;
                for (i, s) in steps.iter().enumerate() {
                    writeln!(f, "  {:>2}. {s}", i + 1)?;
                }
                Ok(())
            }
        }
    }
}

fn successors(s: &State, scope: &Scope) -> Vec<(Step, State)> {
    let mut out = Vec::new();
    for i in 0..s.clients.len() {
        let c = &s.clients[i];
        let id = i as u8;
        let mut next = |step: Step, f: &dyn Fn(&mut State)| {
            let mut n = s.clone();
            f(&mut n);
            out.push((step, n));
        };
        if !c.paused {
            if s.holder.is_none() && c.token.is_none() && s.granted < scope.grants {
                let token = s.granted + 1;
                next(Step::Acquire { client: id, token }, &|n| {
                    n.granted = token;
                    n.holder = Some(id);
                    n.clients[i].token = Some(token);
                });
            }
            if s.holder == Some(id) {
                next(Step::Release { client: id }, &|n| {
                    n.holder = None;
                    n.clients[i].token = None;
                });
            }
            if c.token.is_some() && s.holder != Some(id) {
                next(Step::Notice { client: id }, &|n| n.clients[i].token = None);
            }
            if let Some(token) = c.token
                && c.in_flight.is_none()
                && c.sent < scope.writes
            {
                next(Step::Send { client: id, token }, &|n| {
                    n.clients[i].in_flight = Some(token);
                    n.clients[i].sent += 1;
                });
            }
            next(Step::Pause { client: id }, &|n| n.clients[i].paused = true);
        } else {
            next(Step::Resume { client: id }, &|n| {
                n.clients[i].paused = false
            });
        }
        if s.holder == Some(id) {
            // Expiry needs no cooperation from the client: paused or not, lockd's clock runs.
            next(Step::Expire { client: id }, &|n| n.holder = None);
        }
        // The network delivers a write whenever it likes, even while its sender is paused.
        if let Some(token) = c.in_flight {
            if scope.fence && token < s.highest {
                let highest = s.highest;
                next(
                    Step::Refuse {
                        client: id,
                        token,
                        highest,
                    },
                    &|n| n.clients[i].in_flight = None,
                );
            } else {
                let stale = token < s.highest;
                next(
                    Step::Accept {
                        client: id,
                        token,
                        stale,
                    },
                    &|n| {
                        n.clients[i].in_flight = None;
                        n.broken |= token < n.highest;
                        n.highest = n.highest.max(token);
                    },
                );
            }
        }
    }
    out
}

/// Explores every state reachable within `scope`, breadth first.
pub fn explore(scope: Scope) -> Outcome {
    let start = State {
        holder: None,
        granted: 0,
        clients: vec![
            Client {
                token: None,
                paused: false,
                in_flight: None,
                sent: 0,
            };
            scope.clients
        ],
        highest: 0,
        broken: false,
    };
    // Each state with the state and step it was first reached from.
    let mut seen: HashMap<State, Option<(State, Step)>> = HashMap::new();
    seen.insert(start.clone(), None);
    let mut queue = VecDeque::from([start]);
    while let Some(s) = queue.pop_front() {
        if s.broken {
            let mut steps = Vec::new();
            let mut at = s;
            while let Some(Some((prev, step))) = seen.get(&at) {
                steps.push(*step);
                at = prev.clone();
            }
            steps.reverse();
            return Outcome {
                states: seen.len(),
                counterexample: Some(steps),
            };
        }
        for (step, n) in successors(&s, &scope) {
            if !seen.contains_key(&n) {
                seen.insert(n.clone(), Some((s.clone(), step)));
                queue.push_back(n);
            }
        }
    }
    Outcome {
        states: seen.len(),
        counterexample: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_the_fence_no_reachable_state_breaks_fencing() {
        for clients in [2, 3] {
            let o = explore(Scope {
                clients,
                grants: 3,
                writes: 2,
                fence: true,
            });
            assert!(o.counterexample.is_none(), "{o}");
            // The scope was really explored (pauses, expiries, delays all interleaved).
            assert!(o.states > 1_000, "only {} states", o.states);
        }
    }

    #[test]
    fn without_the_fence_the_zombie_is_found_and_told() {
        let o = explore(Scope {
            clients: 2,
            grants: 3,
            writes: 2,
            fence: false,
        });
        let steps = o.counterexample.as_ref().expect("a counterexample");
        let story = o.to_string();
        assert!(story.contains("VIOLATION"), "{story}");
        // The shortest one: A gets a token and its write is delayed past the end of its lease,
        // B gets a newer token and its write lands, then A's late write lands.
        assert!(
            matches!(steps.last(), Some(Step::Accept { stale: true, .. })),
            "{story}"
        );
        let grants: Vec<u8> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Acquire { client, .. } => Some(*client),
                _ => None,
            })
            .collect();
        assert_eq!(grants, [0, 1], "{story}");
        assert_eq!(steps.len(), 7, "{story}");
    }
}
