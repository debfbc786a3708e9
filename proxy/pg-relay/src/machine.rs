//! The session machine: everything the relay decides about one client session, with no I/O.
//! The session (`session.rs`) feeds it whole messages from either side and writes what it
//! says; the tests feed it from data (`machine_tests.rs`).
//!
//! # The rule it keeps (invariant 9, fail closed)
//!
//! Every transaction in which a statement that may touch data ran runs the fence check *inside
//! itself*, and the check reads the session's settings inside PostgreSQL: however the settings
//! got there (start-up keys, `options`, `SET`, `set_config` with bound values, a function, a
//! trigger, a `DO` block, role and database defaults), the check sees what PostgreSQL sees.
//! The relay never decides from the SQL text *whether* to check, only *where*:
//!
//! - at the transaction's commit point (a `COMMIT`, the Sync of an implicit transaction, the
//!   end of its query string), after its statements, so that it judges what they declared. In
//!   a transaction that wrote nothing it need not judge (nothing to fence; the writes later
//!   are judged);
//! - before its first statement that may touch data, where liveness needs it (`Machine::defer`):
//!   unless the relay believes the session has no token or, in an implicit transaction, holds
//!   the mark or a known stale token;
//! - before the next such statement after one that visibly changes the settings (`SET`,
//!   `ROLLBACK TO`, text that mentions `fencing` or `set_config`); right after a statement
//!   whose text declares the token ([`check_after`]).
//!
//! Which form a check takes is only a matter of speed, never of safety: every form reads the
//! real settings and hands over to the general check when the relay's belief is wrong.
//!
//! # States
//!
//! - `Phase`: `Auth` (the start-up exchange, relayed as it is) → `Probing` (the relay prepares
//!   its statements in a batch of its own before the client's first query; irreversible once
//!   its ReadyForQuery arrives) → `Ready`.
//! - [`Plan`]: the transaction the client's stream is in, as predicted message by message (the
//!   client may pipeline); when nothing is in flight, the last ReadyForQuery corrects it.
//! - `expect`: one entry per message PostgreSQL answers, in order, saying whose it is: the
//!   client's replies are forwarded, the relay's own are read and hidden.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use compact_str::CompactString;
use opskit::fence::Outcome;
use pg_wire::WireError;
use pg_wire::backend::Backend;
use pg_wire::frontend::{Frontend, Target};
use pg_wire::msg;
use pg_wire::sql::{self, Class, Encoding, Kind, Lexing};

use crate::{schema, sqlstate};

/// The relay's marks (the in-memory map of highest tokens): a cache, never the authority.
pub(crate) trait Marks {
    fn mark(&self, resource: &str) -> Option<i64>;
    fn raise(&self, resource: &str, token: i64);
}

/// The relay's prepared statements, on every server connection: name, text, parameter types.
const ANY: &[u8] = b"__fence_proxy_any";
const LOCK: &[u8] = b"__fence_proxy_lock";
const FAST: &[u8] = b"__fence_proxy_fast";
const BARE: &[u8] = b"__fence_proxy_bare";
const HOOKED: &[u8] = b"__fence_proxy_hooked";
/// Parameters (see `schema.rs`): the fence wait in milliseconds (int4), whether the check is
/// at the transaction's commit point (bool), whether the transaction ends there (bool: its
/// deferred triggers fire first). The lock statement takes only the last; the fast read, which
/// always follows it, the first two.
/// The statements every connection of a database with the check has: the first four of
/// `STATEMENTS`. The fifth, the commit hook's check in C ([`schema::CHECK_HOOKED`]), exists
/// only where the hook's library is loaded and a superuser installed the check; the probe
/// parses it only where the start-up reported the hook, and its absence is no fault.
pub(crate) const BASE_STATEMENTS: usize = 4;
/// The first four of `STATEMENTS` prepared.
const BASE_PREPARED: u8 = (1 << BASE_STATEMENTS) - 1;
/// The bit of `prepared` for [`HOOKED`].
const HOOKED_BIT: u8 = 1 << BASE_STATEMENTS;

/// How many of `STATEMENTS` a probe parses: the hook's check too where the start-up
/// reported the hook (and the listener trusts it).
pub(crate) fn probe_len(hook: bool) -> usize {
    if hook {
        STATEMENTS.len()
    } else {
        BASE_STATEMENTS
    }
}

/// The first `n` of `STATEMENTS` prepared (as a probe that stopped at an error leaves them).
pub(crate) fn parsed_mask(n: usize) -> u8 {
    ((1u16 << n.min(STATEMENTS.len())) - 1) as u8
}

pub(crate) const STATEMENTS: [(&[u8], &[u8], &[u32]); 5] = [
    (BARE, schema::CHECK_BARE, &[23, 16, 16]),
    (ANY, schema::CHECK_ANY, &[23, 16, 16]),
    (LOCK, schema::CHECK_LOCK, &[16]),
    (FAST, schema::CHECK_FAST, &[23, 16]),
    (HOOKED, schema::CHECK_HOOKED, &[23]),
];
/// The portal of a check placed before a client's Execute (the client's own portal, bound
/// earlier, may be the unnamed one, which a Bind of ours would replace).
const PORTAL: &[u8] = b"__fence_proxy";

/// SQLSTATEs with which PostgreSQL says the check (or a piece of it) does not exist here or
/// may not be used: undefined function, schema, table or prepared statement, no privilege.
const NOT_INSTALLED: [&[u8]; 4] = [b"42883", b"3F000", b"42P01", b"42501"];
/// "Current transaction is aborted, commands ignored until end of transaction block".
const IN_FAILED_TRANSACTION: &[u8] = b"25P02";
/// "Prepared statement does not exist": one of ours was dropped where the relay could not
/// see it (inside a function); it prepares them again for the next check.
const STATEMENT_GONE: &[u8] = b"26000";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Auth,
    Probing,
    Ready,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Installed {
    Unknown,
    Yes,
    No,
}

/// Where the client's stream is, transaction-wise (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    No,
    Implicit,
    Explicit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    open: Open,
    /// The open transaction has run a check whose lock it still holds.
    checked: bool,
    /// The settings visibly changed since that check.
    pending: bool,
    /// Statements that may touch data since that check (saturating).
    data: u32,
    /// A check before the statements ran in this transaction (it took the resource's lock and
    /// made the token the mark, if it passed): the check at the commit point takes the fast
    /// form.
    before_checked: bool,
}

/// Whether the check a statement needs goes right after it instead of before it: the
/// statement visibly sets the fencing settings (`SELECT set_config('fencing.token', $1,
/// false)`, the usual way to bind a token), so a check before it would judge the declaration
/// half made and refuse it (FN002). The check right after it, in the same transaction, judges
/// what it declared ([`Form::Declared`]); whatever the statement wrote commits only if that
/// passes. The plan does not count it as the transaction's check (the settings visibly
/// changed: the next statement that may touch data is checked in full).
fn check_after(class: Class) -> bool {
    class.kind == Kind::Data && class.mentions_settings
}

impl Plan {
    const IDLE: Plan = Plan {
        open: Open::No,
        checked: false,
        pending: false,
        data: 0,
        before_checked: false,
    };

    /// Whether the transaction needs a check for a statement of this kind: for one that may
    /// touch data, a check that has not run yet (or ran before a visible settings change);
    /// for a commit, a check after the statements that may have touched data since the last
    /// one; for a statement of unknown text, both (it may be either). Where the check goes
    /// (before the statement, right after it, or at the commit point) the machine decides
    /// (`Machine::defer`, [`check_after`]).
    ///
    /// `hook`: PostgreSQL judges every commit itself ([`Machine::hook_judges`]), so no commit
    /// point needs a check of ours; the checks before statements remain.
    fn needs_check(&self, kind: Kind, hook: bool) -> bool {
        let commit_point = self.commit_point_needs_check(hook);
        match kind {
            Kind::Data | Kind::CopyIn => !self.checked || self.pending,
            Kind::Commit { .. } => commit_point,
            Kind::Unknown => !self.checked || self.pending || commit_point,
            _ => false,
        }
    }

    /// Whether a commit point needs a check of ours: a statement that may touch data ran since
    /// the last check, and PostgreSQL does not judge the commit itself (`hook`).
    fn commit_point_needs_check(&self, hook: bool) -> bool {
        !hook && self.data >= 1
    }

    /// Whether the end of the unit (a Sync, the end of a query string) is a commit point that
    /// needs a check: that of an implicit transaction ([`Plan::commit_point_needs_check`]).
    fn end_needs_check(&self, hook: bool) -> bool {
        self.open == Open::Implicit && self.commit_point_needs_check(hook)
    }

    /// A declared check ran ([`Form::Declared`]): it may have passed half a declaration, so
    /// the next statement that may touch data needs a full one; and the statements before it
    /// still count for the commit point, whose check fires the deferred triggers they queued
    /// (which run at the commit, after this check).
    fn declared_now(&mut self) {
        if self.open == Open::No {
            self.open = Open::Implicit;
        }
        self.pending = true;
    }

    /// A check before the statements ran ([`Form::Before`]).
    fn checked_before(&mut self) {
        self.checked_now();
        self.before_checked = true;
    }

    fn checked_now(&mut self) {
        if self.open == Open::No {
            self.open = Open::Implicit;
        }
        self.checked = true;
        self.pending = false;
        self.data = 0;
    }

    /// A statement of `class` ran. Returns whether it visibly changed the settings. (The end
    /// of a transaction undoes its `SET LOCAL`s, and `ROLLBACK TO` its later `SET`s: they went
    /// back to what they were, which the relay's hints were about; hints are verified inside
    /// PostgreSQL anyway.)
    fn ran(&mut self, class: Class) -> bool {
        let ended = |chain: bool| Plan {
            open: if chain { Open::Explicit } else { Open::No },
            ..Plan::IDLE
        };
        match class.kind {
            Kind::Begin => {
                if self.open == Open::No {
                    *self = Plan {
                        open: Open::Explicit,
                        ..Plan::IDLE
                    };
                } else {
                    self.open = Open::Explicit;
                }
                false
            }
            Kind::Commit { chain } | Kind::Rollback { chain } => {
                *self = ended(chain);
                false
            }
            Kind::RollbackTo => {
                // The check's lock may have been taken after the savepoint: it is gone.
                self.checked = false;
                self.before_checked = false;
                self.pending = true;
                false
            }
            Kind::Settings => {
                self.pending = true;
                true
            }
            Kind::Savepoint | Kind::Inert => false,
            Kind::Standalone => {
                *self = Plan::IDLE;
                false
            }
            Kind::Data | Kind::CopyIn => {
                if self.open == Open::No {
                    self.open = Open::Implicit;
                }
                self.data = self.data.saturating_add(1);
                self.pending |= class.mentions_settings;
                class.mentions_settings
            }
            Kind::Unknown => {
                // It may have written, changed the settings, or ended the check's transaction.
                if self.open == Open::No {
                    self.open = Open::Implicit;
                }
                self.data = self.data.saturating_add(1);
                self.pending = true;
                self.checked = false;
                true
            }
        }
    }

    /// The unit ended: an implicit transaction committed (or failed).
    fn unit_ended(&mut self) {
        match self.open {
            Open::Implicit => *self = Plan::IDLE,
            Open::No | Open::Explicit => {}
        }
    }

    /// Nothing is in flight and the last ReadyForQuery said `status`.
    fn settle(&mut self, status: u8) {
        match status {
            b'I' => *self = Plan::IDLE,
            _ if self.open != Open::Explicit => {
                self.open = Open::Explicit;
                self.checked = false;
            }
            _ => {}
        }
    }
}

/// Which check to send, and what the plan makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Form {
    /// Right after a statement that declares the token: at its commit point, and the next
    /// statement that may touch data is checked before it ([`Plan::declared_now`]).
    Declared,
    /// At the transaction's commit point, after its statements: in a transaction that has
    /// written nothing it need not judge (a stale or half declaration is refused where the
    /// writes are). The transaction ends right after it: its deferred triggers fire first.
    Commit,
    /// Before the statements: it judges, raises or refuses, and takes the resource's lock.
    Before,
}

/// One check the relay sent, as the reply to it is awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Check {
    /// The settings generation it was sent under.
    generation: u64,
    /// The bare form (no check installed): its cast error means "a token, and no check".
    bare: bool,
    /// At a commit point: it may answer without judging (a NULL resource).
    at_commit: bool,
    /// The transaction ends right after it ([`Form::Commit`]): before a `COMMIT` (or `END`,
    /// `PREPARE TRANSACTION`), or at the end of an implicit transaction.
    ends: bool,
    /// When it was queued for PostgreSQL, if the machine observes (its duration is a metric).
    sent: Option<Instant>,
}

impl Check {
    /// How long it has been since it was sent (zero when the machine does not observe).
    fn took(&self) -> Duration {
        self.sent.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

/// What a check found, or a refusal of the fence's, for fence-proxy's metrics, status page and
/// audit log: kept only when the machine observes, and drained by the session after each
/// message (it knows the peer and the database).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A check with a token passed; `raised`: with a token above the mark this relay knew.
    Passed {
        took: Duration,
        raised: Option<(CompactString, i64)>,
    },
    /// PostgreSQL refused a check of ours with one of the fence's SQLSTATEs (`FN00x`), after
    /// `took`. (A refusal inside a client's statement, a protected table's trigger, is not
    /// one: the client could raise the same SQLSTATE itself.)
    Refused {
        outcome: Outcome,
        took: Duration,
        resource: String,
        token: String,
        highest: Option<i64>,
        message: String,
    },
    /// PostgreSQL ended this session's open transaction for a newer token (said as FN003).
    FencedOut {
        resource: CompactString,
        token: i64,
        newer: Option<i64>,
    },
}

/// What PostgreSQL will answer next, in order.
#[derive(Debug)]
enum Expect {
    Parse {
        ours: bool,
    },
    Bind {
        ours: bool,
    },
    Close {
        ours: bool,
    },
    Describe,
    Execute,
    /// A client's simple Query of one statement, sent as Parse, Bind, Describe and Execute so
    /// that a check can follow it in its transaction (`Machine::send_converted`): its
    /// ParseComplete, BindComplete and NoData are hidden, its RowDescription, rows and
    /// completion forwarded, and its errors are the client's.
    QueryParse,
    QueryBind,
    QueryDescribe,
    QueryExecute,
    /// The Execute of a check of ours: its row is read, everything hidden.
    Check(Check),
    /// The Execute of the fast path's lock statement: hidden. `ends`: at the transaction's end
    /// (it fires the deferred triggers).
    Lock {
        ends: bool,
    },
    /// `ours`: a Sync of the relay's (its ReadyForQuery hidden).
    Sync {
        ours: bool,
    },
    /// The relay's `ROLLBACK` of a transaction whose end the check refused: its completion
    /// hidden (`answers`: forwarded, as the answer to the client's `COMMIT`), its
    /// ReadyForQuery the client's.
    Rollback {
        answers: bool,
    },
    /// A client's Sync sent after a `COPY FROM STDIN` began and before its data ended:
    /// PostgreSQL ignores it if the COPY starts (there is then no ReadyForQuery for it), and
    /// answers it if the COPY failed at once.
    SyncInCopy,
    /// A simple Query or a FunctionCall, run-length encoded into the client's statements and
    /// the checks placed in its text. `after_check`: sent right after a check of ours in
    /// extended-protocol messages (PostgreSQL skips it if that check fails).
    Query {
        units: VecDeque<Unit>,
        after_check: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Unit {
    check: Option<Check>,
    /// Statements in this run (`u32::MAX`: all the rest).
    count: u32,
    /// The check at the end of the text, after every statement of the client's.
    end: bool,
}

impl Expect {
    fn query(after_check: bool) -> Expect {
        Expect::Query {
            units: VecDeque::from([Unit {
                check: None,
                count: u32::MAX,
                end: false,
            }]),
            after_check,
        }
    }
}

/// What the client direction did with one message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Handled (forwarded, changed, or answered locally).
    Done,
    /// The client said Terminate.
    Terminate,
    /// Not handled yet: try again once nothing is in flight (the message cannot be read right
    /// before the replies to what precedes it: the start-up probe, or text whose statements
    /// depend on a setting still changing).
    Defer,
}

/// What to do with one server message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Forward,
    Hide,
    Replace(Vec<u8>),
    /// Give this to the client in answer to whatever it sends next, then close (the fenced
    /// error of a session that was idle when PostgreSQL ended it: drivers surface an error
    /// that answers a request, not one that arrives unasked).
    Hold(Vec<u8>),
}

/// Something the client direction answers by itself, for the other direction to write.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Local {
    /// A FATAL error; then the connection closes.
    Fatal(Vec<u8>),
}

pub(crate) struct Machine {
    /// What the checks found, while `observe` (see [`Event`]).
    pub(crate) events: Vec<Event>,
    observe: bool,
    wait_param: String,
    phase: Phase,
    installed: Installed,
    /// Which of `STATEMENTS` are prepared on this server connection (bit i: the i-th), each
    /// prepared when a check first needs it.
    prepared: u8,
    lexing: Lexing,
    expect: VecDeque<Expect>,
    status: u8,
    plan: Plan,
    /// Bumped whenever the settings visibly changed.
    generation: u64,
    /// The client's extended-protocol batch: messages sent since the last Sync (0: none).
    batch_len: u32,
    statements: HashMap<Vec<u8>, Class>,
    unnamed_statement: Class,
    portals: HashMap<Vec<u8>, Class>,
    unnamed_portal: Class,
    /// The last check's result, a hint for the next one's form: (resource, token, generation).
    hint: Option<(CompactString, i64, u64)>,
    /// The last check found no token, under this settings generation.
    no_token: Option<u64>,
    /// The open transaction passed a check: with this token, or `None` without one.
    checked_txn: Option<Option<(CompactString, i64)>>,
    /// The row of the check being answered.
    check_row: Option<CheckRow>,
    local: VecDeque<Local>,
    /// Bytes for the server that the server direction decided on (the probe).
    to_server: Vec<u8>,
    /// Statements of the probe prepared so far (the bare form is the first).
    probe_parsed: usize,
    /// The client is sending COPY data (from the Execute or Query of a `COPY FROM STDIN` to its
    /// CopyDone or CopyFail).
    copy_in: bool,
    /// The client direction is waiting (a deferred message).
    deferred: bool,
    /// The fenced error for a client that was idle when PostgreSQL ended its session.
    held: Option<Vec<u8>>,
    /// A check at a transaction's end failed: if PostgreSQL then reports the transaction
    /// aborted (the client's `COMMIT` was skipped), the relay ends it, as a failed `COMMIT`
    /// would have.
    refused_end: Option<RefusedEnd>,
    /// A check before an explicit transaction's end is in the batch being sent; once its
    /// Sync is, `commit_in_flight`.
    commit_unsynced: bool,
    /// Such a check and its Sync were sent and not yet answered: the client's next messages
    /// wait (deferred), so that a refused end can be ended by the relay before they run, as
    /// PostgreSQL's failed COMMIT would have ended it.
    commit_in_flight: bool,
    /// The last ReadyForQuery said the transaction is aborted, and no statement has been sent
    /// since: a `COMMIT` now is a `ROLLBACK` in PostgreSQL and needs no check.
    aborted: bool,
    /// The completion of a simple Query's last statement, kept until its ReadyForQuery (then
    /// sent just before it), and dropped if an error comes first: PostgreSQL sends it only once
    /// the implicit transaction has committed, and a refused or failed commit (the check, a
    /// deferred constraint, a serialization failure) answers with the error alone.
    held_complete: Option<Vec<u8>>,
    /// Notifications, notices and parameter reports that came after the held completion: they
    /// go after it, as PostgreSQL sends them after the commit.
    held_after: Vec<u8>,
    /// SCRAM channel binding cannot pass this relay (TLS on both sides, with different
    /// certificates): a client that chooses SCRAM-SHA-256-PLUS is told so.
    no_channel_binding: bool,
    /// PostgreSQL asked for SASL: the client's next authentication message names the mechanism.
    sasl_asked: bool,
    /// The server's start-up reported `fence_hook.active = on` (see [`Machine::hook_judges`]).
    hook_reported: bool,
    /// The listener does not trust that report (`trust_commit_hook = false`).
    hook_ignored: bool,
    /// The commit hook's check in C exists in this database (the probe prepared [`HOOKED`]):
    /// where the hook judges, a check before the statements of a token believed current is
    /// that one statement, not the lock and the fast read.
    hooked: bool,
    /// The server connection outlives the client's (pooled): its Terminate is not passed on.
    keep_server: bool,
    /// A pooled connection whose statements the pool prepared and checked: (the check is
    /// installed, our statements are prepared). Its start-up's ReadyForQuery then goes
    /// straight to the client, with no probe.
    preprobed: Option<(bool, u8, bool)>,
    /// A check before any visible change of the settings found no token: the session's
    /// defaults (start-up, role, database) declare none. They are fixed for a backend's life,
    /// so the next client of a pooled connection may start from that belief.
    defaults_tokenless: bool,
}

impl Machine {
    pub(crate) fn new(fence_wait_ms: u128) -> Machine {
        Machine {
            events: Vec::new(),
            observe: false,
            wait_param: fence_wait_ms.clamp(1, i32::MAX as u128).to_string(),
            phase: Phase::Auth,
            installed: Installed::Unknown,
            prepared: 0,
            lexing: Lexing::default(),
            expect: VecDeque::new(),
            status: b'I',
            plan: Plan::IDLE,
            generation: 0,
            batch_len: 0,
            statements: HashMap::new(),
            unnamed_statement: Class::UNKNOWN,
            portals: HashMap::new(),
            unnamed_portal: Class::UNKNOWN,
            hint: None,
            no_token: None,
            checked_txn: None,
            check_row: None,
            local: VecDeque::new(),
            to_server: Vec::new(),
            probe_parsed: 0,
            copy_in: false,
            deferred: false,
            held: None,
            refused_end: None,
            commit_unsynced: false,
            commit_in_flight: false,
            aborted: false,
            held_complete: None,
            held_after: Vec::new(),
            no_channel_binding: false,
            sasl_asked: false,
            hook_reported: false,
            hook_ignored: false,
            keep_server: false,
            preprobed: None,
            hooked: false,
            defaults_tokenless: false,
        }
    }

    /// Whether a check found the session's defaults to declare no token (see the field).
    pub(crate) fn defaults_tokenless(&self) -> bool {
        self.defaults_tokenless
    }

    /// A pooled connection whose earlier client found its defaults to declare no token:
    /// start from the belief that the session has none (checks wait for commit points, where
    /// they judge whatever is set then; a wrong belief costs time, never safety).
    pub(crate) fn assume_tokenless_defaults(&mut self) {
        self.no_token = Some(self.generation);
        self.defaults_tokenless = true;
    }

    /// The pool prepared our statements on this connection and checked them since its last
    /// client (see `pool::reset`): what the probe would have learnt.
    pub(crate) fn probed(&mut self, installed: bool, prepared: u8, hooked: bool) {
        self.preprobed = Some((installed, prepared, hooked));
    }

    /// The server connection goes back to a pool when the client leaves: the client's
    /// Terminate stays here.
    pub(crate) fn keep_server(&mut self) {
        self.keep_server = true;
    }

    /// Whether the server connection may serve another client once reset: the session is past
    /// its start-up, nothing is in flight, no transaction is open, no COPY, nothing held.
    pub(crate) fn reusable(&self) -> bool {
        self.phase == Phase::Ready
            && self.idle()
            && self.status == b'I'
            // An extended-protocol batch without its Sync: an implicit transaction may be open.
            && self.batch_len == 0
            && !self.copy_in
            && self.held.is_none()
            && self.local.is_empty()
            && self.to_server.is_empty()
            && self.held_complete.is_none()
            && self.refused_end.is_none()
    }

    /// Keeps [`Event`]s in `events` from now on.
    pub(crate) fn observe(&mut self) {
        self.observe = true;
    }

    /// The client's TLS ends here and PostgreSQL's is another certificate's: a client's
    /// channel binding (tls-server-end-point: a hash of the certificate the client saw) can
    /// only fail at PostgreSQL.
    pub(crate) fn refuse_channel_binding(&mut self) {
        self.no_channel_binding = true;
    }

    /// For a database where nothing may be fenced (signed tokens are on, and this proxy did
    /// not install its keys here): from the start, the bare check, which refuses any fencing
    /// setting (FN004) and passes sessions without one.
    pub(crate) fn refuse_tokens(&mut self) {
        self.installed = Installed::No;
    }

    /// For a listener with `trust_commit_hook = false`: the server's report of fence_hook is
    /// not taken, and every commit point is checked here.
    pub(crate) fn ignore_hook(&mut self) {
        self.hook_ignored = true;
    }

    /// Keeps `error` for the client's next message (see [`Verdict::Hold`]).
    pub(crate) fn hold(&mut self, error: Vec<u8>) {
        self.held = Some(error);
    }

    /// Whether an end of the session by PostgreSQL now would be said as FN003 (see
    /// [`Verdict::Hold`]): nothing in flight, in a transaction that passed a check with a token.
    pub(crate) fn may_hold(&self) -> bool {
        self.idle() && matches!(self.checked_txn, Some(Some(_)))
    }

    pub(crate) fn held(&self) -> bool {
        self.held.is_some()
    }

    pub(crate) fn held_error(&self) -> Option<Vec<u8>> {
        self.held.clone()
    }

    /// Whether the client direction should be woken: bytes for the server are waiting, or a
    /// deferred message can now be read.
    pub(crate) fn wants_progress(&self) -> bool {
        !self.to_server.is_empty() || (self.deferred && self.phase == Phase::Ready && self.idle())
    }

    /// Nothing is in flight: every message sent has been answered.
    pub(crate) fn idle(&self) -> bool {
        self.expect.is_empty()
    }

    pub(crate) fn take_local(&mut self) -> Option<Local> {
        self.local.pop_front()
    }

    pub(crate) fn has_local(&self) -> bool {
        !self.local.is_empty()
    }

    /// Bytes the server direction wants sent to the server (written before any client bytes).
    pub(crate) fn take_to_server(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.to_server)
    }

    /// The session is being closed over a bad client message: tell the client why.
    pub(crate) fn refuse(&mut self, why: &str) {
        let mut out = Vec::new();
        sqlstate::fatal(
            &mut out,
            sqlstate::PROTOCOL_VIOLATION,
            &format!("fence-proxy: {why}"),
        );
        self.local.push_back(Local::Fatal(out));
    }
}

// ---------------------------------------------------------------------------------------------
// Client to server.

impl Machine {
    /// One whole client message; what goes to the server is appended to `out`.
    pub(crate) fn client(
        &mut self,
        message: &[u8],
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) -> Result<Step, WireError> {
        let step = if self.commit_in_flight && self.phase == Phase::Ready {
            Step::Defer
        } else {
            let step = self.client_message(message, out, marks)?;
            if matches!(message.first(), Some(b'Q' | b'F')) {
                // A Query (or FunctionCall) ends its own batch.
                self.commit_in_flight |= std::mem::take(&mut self.commit_unsynced);
            }
            step
        };
        self.deferred = step == Step::Defer;
        Ok(step)
    }

    fn client_message(
        &mut self,
        message: &[u8],
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) -> Result<Step, WireError> {
        let m = Frontend::decode(message)?;
        if self.phase != Phase::Ready
            && !matches!(m, Frontend::Authentication | Frontend::Terminate)
        {
            return Ok(Step::Defer);
        }
        if self.copy_in {
            // Nothing may be injected into COPY data; a Sync here may go unanswered.
            match m {
                Frontend::CopyDone | Frontend::CopyFail => self.copy_in = false,
                Frontend::Sync => self.expect.push_back(Expect::SyncInCopy),
                Frontend::Terminate => {
                    if !self.keep_server {
                        out.extend_from_slice(message);
                    }
                    return Ok(Step::Terminate);
                }
                _ => {}
            }
            out.extend_from_slice(message);
            return Ok(Step::Done);
        }
        if m == Frontend::Authentication
            && std::mem::take(&mut self.sasl_asked)
            && self.no_channel_binding
            && message
                .get(5..)
                .is_some_and(|b| b.starts_with(b"SCRAM-SHA-256-PLUS\0"))
        {
            let mut fatal = Vec::new();
            sqlstate::fatal(
                &mut fatal,
                sqlstate::INVALID_AUTHORIZATION,
                "fence-proxy: SCRAM channel binding cannot pass this proxy: TLS ends here, and PostgreSQL's certificate is another one; connect with channel_binding=disable (the password is still checked by PostgreSQL), or give fence-proxy PostgreSQL's own certificate and key",
            );
            self.local.push_back(Local::Fatal(fatal));
            return Ok(Step::Terminate);
        }
        let fresh = self.batch_len == 0;
        if fresh && self.idle() {
            self.plan.settle(self.status);
        }
        match m {
            Frontend::Query { text } => return self.on_query(message, text, out, marks),
            Frontend::FunctionCall => self.on_function_call(message, out, marks),
            Frontend::Parse { name, text } => self.on_parse(message, name, text, out),
            Frontend::Bind { portal, statement } => {
                return Ok(self.on_bind(message, portal, statement, out, marks));
            }
            Frontend::Execute { portal, .. } => {
                return Ok(self.on_execute(message, portal, out, marks));
            }
            Frontend::Describe { .. } => self.send(message, Expect::Describe, out),
            Frontend::Close { target, name } => {
                match target {
                    Target::Statement if !name.is_empty() => self.statements.remove(name),
                    Target::Portal if !name.is_empty() => self.portals.remove(name),
                    _ => None,
                };
                self.send(message, Expect::Close { ours: false }, out);
            }
            Frontend::Sync => self.on_sync(message, out, marks),
            Frontend::Terminate => {
                if !self.keep_server {
                    out.extend_from_slice(message);
                }
                return Ok(Step::Terminate);
            }
            // Flush, COPY data, authentication: PostgreSQL judges them.
            Frontend::Flush
            | Frontend::CopyData
            | Frontend::CopyDone
            | Frontend::CopyFail
            | Frontend::Authentication => out.extend_from_slice(message),
        }
        Ok(Step::Done)
    }

    fn send(&mut self, message: &[u8], expect: Expect, out: &mut Vec<u8>) {
        self.batch_len += 1;
        self.expect.push_back(expect);
        out.extend_from_slice(message);
    }

    fn on_parse(&mut self, message: &[u8], name: &[u8], text: &[u8], out: &mut Vec<u8>) {
        let class = sql::classify(text);
        if name.starts_with(b"__fence_proxy") {
            // The client takes one of our names: ours may be gone or replaced.
            self.prepared = 0;
        }
        if name.is_empty() {
            self.unnamed_statement = class;
        } else {
            self.statements.insert(name.to_vec(), class);
        }
        self.send(message, Expect::Parse { ours: false }, out);
    }

    fn on_bind(
        &mut self,
        message: &[u8],
        portal: &[u8],
        statement: &[u8],
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) -> Step {
        let class = if statement.is_empty() {
            self.unnamed_statement
        } else {
            self.statements
                .get(statement)
                .copied()
                .unwrap_or(Class::UNKNOWN)
        };
        if self.needs_check(class.kind) && !check_after(class) && !self.defer(class, marks) {
            // Before the client's Bind, so that our unnamed portal is gone before its own.
            self.push_form(out, b"", marks, form_before(class));
        }
        if portal.is_empty() {
            self.unnamed_portal = class;
        } else {
            self.portals.insert(portal.to_vec(), class);
        }
        self.send(message, Expect::Bind { ours: false }, out);
        Step::Done
    }

    fn on_execute(
        &mut self,
        message: &[u8],
        portal: &[u8],
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) -> Step {
        let class = if portal.is_empty() {
            self.unnamed_portal
        } else {
            self.portals.get(portal).copied().unwrap_or(Class::UNKNOWN)
        };
        let needs = self.needs_check(class.kind);
        if needs && !check_after(class) && !self.defer(class, marks) {
            // The client's portal is bound already: ours must not replace it.
            self.push_form(out, PORTAL, marks, form_before(class));
        }
        self.ran(class);
        self.copy_in = class.kind == Kind::CopyIn;
        self.send(message, Expect::Execute, out);
        if needs && check_after(class) {
            // In a portal of ours: the client may execute its own portal again.
            self.push_form(out, PORTAL, marks, Form::Declared);
        }
        Step::Done
    }

    fn on_sync(&mut self, message: &[u8], out: &mut Vec<u8>, marks: &dyn Marks) {
        if self.plan.end_needs_check(self.hook_judges()) {
            self.push_form(out, b"", marks, Form::Commit);
        }
        self.commit_in_flight |= std::mem::take(&mut self.commit_unsynced);
        self.plan.unit_ended();
        self.expect.push_back(Expect::Sync { ours: false });
        out.extend_from_slice(message);
        self.batch_len = 0;
    }

    /// Whether a statement of `kind` needs a check now: as the plan says, except a `COMMIT`
    /// of a transaction PostgreSQL reported aborted with nothing sent since, which commits
    /// nothing (PostgreSQL answers it `ROLLBACK`; a check would only fail with 25P02 and leave
    /// the transaction open).
    fn needs_check(&self, kind: Kind) -> bool {
        !(self.aborted && matches!(kind, Kind::Commit { .. }))
            && self.plan.needs_check(kind, self.hook_judges())
    }

    /// Whether PostgreSQL judges every commit of this session by the fence check itself: its
    /// start-up reported `fence_hook.active = on` (proxy/pg-hook: a read-only setting that only
    /// the loaded library defines, and a report that only the server sends), and the check is
    /// installed in this database. Then the relay sends no check at a commit point; PostgreSQL
    /// runs the general check at every commit, after the deferred triggers and held cursors,
    /// inside procedures too. Not in a database without the check, nor where tokens are
    /// refused here ([`Machine::refuse_tokens`]): the bare check says FN004 there.
    #[cfg(test)]
    pub(crate) fn hook_ignored(&self) -> bool {
        self.hook_ignored
    }

    pub(crate) fn hook_judges(&self) -> bool {
        self.hook_reported && !self.hook_ignored && self.installed == Installed::Yes
    }

    /// A statement of `class` is being sent: the plan and the settings generation follow it.
    fn ran(&mut self, class: Class) {
        self.aborted = false;
        if self.plan.ran(class) {
            self.generation += 1;
        }
        if class.drops_statements {
            self.prepared = 0;
            // A name it frees may be prepared again by SQL PREPARE, with any text.
            for c in self.statements.values_mut() {
                *c = Class::UNKNOWN;
            }
        }
    }

    /// FunctionCall (the large-object API): one statement that may touch data, answered like
    /// a simple Query.
    fn on_function_call(&mut self, message: &[u8], out: &mut Vec<u8>, marks: &dyn Marks) {
        let class = Class::UNKNOWN;
        let check = self.needs_check(class.kind);
        if check {
            self.push_check(out, b"", marks);
        }
        self.ran(class);
        self.plan.unit_ended();
        self.expect.push_back(Expect::query(check));
        out.extend_from_slice(message);
        if check {
            msg::sync(out);
            self.expect.push_back(Expect::Sync { ours: true });
        }
        self.batch_len = 0;
    }

    /// Sends a check as extended-protocol messages (preparing our statements first if they
    /// are gone), in `portal`. The plan counts it as run.
    fn push_check(&mut self, out: &mut Vec<u8>, portal: &[u8], marks: &dyn Marks) {
        self.push_form(out, portal, marks, Form::Before);
    }

    fn push_form(&mut self, out: &mut Vec<u8>, portal: &[u8], marks: &dyn Marks, form: Form) {
        let check = Check {
            generation: self.generation,
            bare: self.installed == Installed::No,
            at_commit: form != Form::Before,
            ends: form == Form::Commit,
            sent: self.observe.then(Instant::now),
        };
        let wait = self.wait_param.clone();
        let expect = Expect::Check(check);
        let flag = |b: bool| -> &'static [u8] { if b { b"t" } else { b"f" } };
        let ends = flag(form == Form::Commit);
        let params: [&[u8]; 3] = [wait.as_bytes(), flag(check.at_commit), ends];
        if check.bare {
            self.prepare_ours(out, &[BARE]);
            self.execute_ours(out, portal, BARE, &params, expect);
        } else if form == Form::Before
            && self.hooked
            && self.hook_judges()
            && self.known_current(marks)
        {
            // The commit hook judges the commit; this check is for liveness (a stale token is
            // refused before it takes row locks, a current one holds the fence lock that a
            // raise may end): the hook's fast check does both halves in one statement.
            self.prepare_ours(out, &[HOOKED]);
            self.execute_ours(out, portal, HOOKED, &params[..1], expect);
        } else if self.known_current(marks)
            || (form != Form::Before && self.plan.before_checked && !self.plan.pending)
        {
            self.prepare_ours(out, &[LOCK, FAST]);
            let lock = Expect::Lock { ends: check.ends };
            self.execute_ours(out, portal, LOCK, &[ends], lock);
            self.execute_ours(out, portal, FAST, &params[..2], expect);
        } else {
            self.prepare_ours(out, &[ANY]);
            self.execute_ours(out, portal, ANY, &params, expect);
        }
        if form == Form::Commit && self.plan.open == Open::Explicit {
            self.commit_unsynced = true;
        }
        match form {
            Form::Before => self.plan.checked_before(),
            Form::Commit => self.plan.checked_now(),
            Form::Declared => self.plan.declared_now(),
        }
    }

    /// Prepares those of `names` (of `STATEMENTS`) that are not prepared here yet, ahead of
    /// the check that needs them.
    fn prepare_ours(&mut self, out: &mut Vec<u8>, names: &[&[u8]]) {
        for (i, (name, text, types)) in STATEMENTS.into_iter().enumerate() {
            if !names.contains(&name) || self.prepared & (1 << i) != 0 {
                continue;
            }
            // Closing first: a missing statement is no error, a survivor would be one.
            msg::close(out, b'S', name);
            self.expect.push_back(Expect::Close { ours: true });
            msg::parse(out, name, text, types);
            self.expect.push_back(Expect::Parse { ours: true });
            self.prepared |= 1 << i;
        }
    }

    fn execute_ours(
        &mut self,
        out: &mut Vec<u8>,
        portal: &[u8],
        statement: &[u8],
        params: &[&[u8]],
        expect: Expect,
    ) {
        msg::bind(out, portal, statement, params);
        self.expect.push_back(Expect::Bind { ours: true });
        msg::execute(out, portal, 0);
        self.expect.push_back(expect);
        if !portal.is_empty() {
            msg::close(out, b'P', portal);
            self.expect.push_back(Expect::Close { ours: true });
        }
    }

    /// Whether the check a statement of `class` needs may wait for the transaction's commit
    /// point instead of going before it. The check at the commit point is the one that
    /// decides (it sees what the statements may have changed: a function that declares a
    /// token and writes in one statement is judged by what it declared); a check before the
    /// statement is needed only to hold the resource's lock while the transaction works, so
    /// that a newer token can end it if it stalls, or so that a new token's raise ends older
    /// transactions before this one waits behind their row locks. So it waits when the
    /// relay believes the session has no token, and, in an implicit transaction (which cannot
    /// stall between its statements), when it believes the token is the mark.
    ///
    /// In an implicit transaction it also waits when the relay knows the token to be stale: a
    /// check before the statement would refuse it, and the statement may be the one that
    /// declares a new token (a helper function the relay cannot see into); at the commit point
    /// the write is refused just the same. In an explicit transaction a known stale token is
    /// refused at once, before the transaction can take row locks that a stalled zombie would
    /// keep from the new holder.
    fn defer(&self, class: Class, marks: &dyn Marks) -> bool {
        if !matches!(class.kind, Kind::Data | Kind::CopyIn) || self.plan.pending {
            return false;
        }
        let no_token = self.no_token == Some(self.generation);
        let implicit = self.plan.open != Open::Explicit;
        no_token || (implicit && (self.known_current(marks) || self.known_stale(marks)))
    }

    /// Whether the last check's token, under the same settings, is below the relay's mark.
    fn known_stale(&self, marks: &dyn Marks) -> bool {
        self.hint
            .as_ref()
            .is_some_and(|(r, t, g)| *g == self.generation && marks.mark(r).is_some_and(|m| m > *t))
    }

    /// Whether the last check found the session's token to be the mark, under the same
    /// settings, and the mark has not moved since.
    fn known_current(&self, marks: &dyn Marks) -> bool {
        self.hint
            .as_ref()
            .is_some_and(|(r, t, g)| *g == self.generation && marks.mark(r) == Some(*t))
    }
}

// ---------------------------------------------------------------------------------------------
// Simple Query.

/// Where the checks of one query string go.
struct QueryPlan {
    statements: Vec<sql::Statement>,
    /// Before which statements (indices, in order), and which form.
    before: Vec<(usize, Form)>,
    /// At the end of the text (the commit point of an implicit transaction, or right after a
    /// last statement that declares the token).
    at_end: Option<Form>,
}

/// Notes a check at `at` (a statement index, or `n` for the end); two at one place are one,
/// of the form that judges more.
fn note_check(q: &mut QueryPlan, at: usize, form: Form) {
    if at == q.statements.len() {
        q.at_end = Some(q.at_end.map_or(form, |f| f.max(form)));
    } else if let Some(last) = q.before.last_mut().filter(|(i, _)| *i == at) {
        last.1 = last.1.max(form);
    } else {
        q.before.push((at, form));
    }
}

/// The form of the check a statement of `class` needs before it: at a commit point for a
/// `COMMIT`, else one that judges (an unknown statement may be anything).
fn form_before(class: Class) -> Form {
    match class.kind {
        Kind::Commit { .. } => Form::Commit,
        _ => Form::Before,
    }
}

impl Machine {
    fn on_query(
        &mut self,
        message: &[u8],
        text: &[u8],
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) -> Result<Step, WireError> {
        if !self.idle() && self.lexing_undecided(text) {
            return Ok(Step::Defer);
        }
        let fresh = self.batch_len == 0;
        let before = (self.plan, self.generation);
        let q = self.plan_query(text, marks);
        self.copy_in = q.statements.iter().any(|s| s.class.kind == Kind::CopyIn);
        if q.before.is_empty() && q.at_end.is_none() {
            self.expect.push_back(Expect::query(false));
            out.extend_from_slice(message);
        } else if let Some((check_before, check_after)) = converted(&q, fresh) {
            self.send_converted(text, check_before, check_after, before, out, marks);
        } else if let Some(form) = pipelined(text, &q, fresh) {
            self.send_pipelined(message, form, before, out, marks);
        } else {
            self.send_with_checks_in_text(text, &q, before.1, out, marks);
        }
        self.batch_len = 0;
        Ok(Step::Done)
    }

    /// Whether, with replies still to come, the text's statements could depend on a reading
    /// setting that is still changing: the text holds a backslash and splits differently
    /// under another `standard_conforming_strings` or client encoding.
    fn lexing_undecided(&self, text: &[u8]) -> bool {
        if !text.contains(&b'\\') {
            return false;
        }
        let now = sql::split(text, self.lexing);
        [true, false].into_iter().any(|standard_strings| {
            [
                Encoding::AsciiSafe,
                Encoding::Sjis,
                Encoding::DoubleByte,
                Encoding::Johab,
            ]
            .into_iter()
            .any(|encoding| {
                sql::split(
                    text,
                    Lexing {
                        standard_strings,
                        encoding,
                    },
                ) != now
            })
        })
    }

    /// Walks the statements of `text` through the plan, noting where the checks go.
    fn plan_query(&mut self, text: &[u8], marks: &dyn Marks) -> QueryPlan {
        let mut q = QueryPlan {
            statements: sql::split(text, self.lexing),
            before: Vec::new(),
            at_end: None,
        };
        let n = q.statements.len();
        for i in 0..n {
            let class = q.statements[i].class;
            let needs = self.needs_check(class.kind);
            if needs && !check_after(class) && !self.defer(class, marks) {
                let form = form_before(class);
                if form == Form::Commit && self.plan.open == Open::Explicit {
                    self.commit_unsynced = true;
                }
                note_check(&mut q, i, form);
                match form {
                    Form::Before => self.plan.checked_before(),
                    _ => self.plan.checked_now(),
                }
            }
            self.ran(class);
            if needs && check_after(class) {
                note_check(&mut q, i + 1, Form::Declared);
                self.plan.declared_now();
            }
        }
        if self.plan.end_needs_check(self.hook_judges()) {
            note_check(&mut q, n, Form::Commit);
            self.plan.checked_now();
        }
        self.plan.unit_ended();
        q
    }

    /// A Query of one statement as Parse, Bind, Describe and Execute of the unnamed statement,
    /// with the checks before and after it as prepared statements, and one Sync: one
    /// transaction, one ReadyForQuery, and a check after the statement, which is where an
    /// implicit transaction commits (a simple Query can hold nothing after its statement).
    /// The client sees what it would have seen for the Query (errors at their own positions).
    #[allow(clippy::too_many_arguments)]
    fn send_converted(
        &mut self,
        text: &[u8],
        check_before: Option<Form>,
        after: Option<Form>,
        before: (Plan, u64),
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) {
        if let Some(form) = check_before {
            let planned = (self.plan, self.generation);
            (self.plan, self.generation) = before;
            self.push_form(out, b"", marks, form);
            (self.plan, self.generation) = planned;
        }
        msg::parse(out, b"", text, &[]);
        self.expect.push_back(Expect::QueryParse);
        msg::bind(out, b"", b"", &[]);
        self.expect.push_back(Expect::QueryBind);
        msg::describe(out, b'P', b"");
        self.expect.push_back(Expect::QueryDescribe);
        msg::execute(out, b"", 0);
        self.expect.push_back(Expect::QueryExecute);
        if let Some(form) = after {
            // The plan counted it already (plan_query), and has moved past the unit; the check
            // before, if any, made the fast form the likely one.
            let plan = self.plan;
            self.plan.before_checked = check_before == Some(Form::Before);
            self.push_form(out, b"", marks, form);
            self.plan = plan;
        }
        msg::sync(out);
        self.expect.push_back(Expect::Sync { ours: false });
        // A simple Query destroys the unnamed statement and portal; so did this.
        self.unnamed_statement = Class::UNKNOWN;
        self.unnamed_portal = Class::UNKNOWN;
    }

    /// The check as prepared statements, then the Query, then a Sync of ours that ends what the
    /// check began (its ReadyForQuery hidden, or the Query's when the check failed and
    /// PostgreSQL skipped the Query).
    fn send_pipelined(
        &mut self,
        message: &[u8],
        form: Form,
        before: (Plan, u64),
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) {
        // The check runs before the text's statements: under the plan and settings from before.
        let after = (self.plan, self.generation);
        (self.plan, self.generation) = before;
        self.push_form(out, b"", marks, form);
        (self.plan, self.generation) = after;
        self.expect.push_back(Expect::query(true));
        out.extend_from_slice(message);
        msg::sync(out);
        self.expect.push_back(Expect::Sync { ours: true });
    }

    /// The Query with the checks written into its text: before the statements that need them,
    /// and at the end (after a newline, so that a final `--` comment cannot swallow it).
    fn send_with_checks_in_text(
        &mut self,
        text: &[u8],
        q: &QueryPlan,
        generation_before: u64,
        out: &mut Vec<u8>,
        marks: &dyn Marks,
    ) {
        let current = self.generation == generation_before && self.known_current(marks);
        let installed = self.installed != Installed::No;
        let sql = |form: Form| {
            schema::check_text(
                &self.wait_param,
                current,
                form != Form::Before,
                form == Form::Commit,
                installed,
            )
        };
        let mut check = Check {
            generation: generation_before,
            bare: !installed,
            at_commit: false,
            ends: false,
            sent: self.observe.then(Instant::now),
        };
        let mut new_text = Vec::with_capacity(text.len() + (q.before.len() + 1) * 64);
        let mut units = VecDeque::new();
        let (mut copied, mut done) = (0, 0usize);
        for &(i, form) in &q.before {
            let start = q.statements[i].start;
            new_text.extend_from_slice(&text[copied..start]);
            copied = start;
            push_client_units(&mut units, i - done);
            done = i;
            new_text.extend_from_slice(sql(form).as_bytes());
            new_text.extend_from_slice(b"; ");
            check.at_commit = form != Form::Before;
            check.ends = form == Form::Commit;
            units.push_back(Unit {
                check: Some(check),
                count: 1,
                end: false,
            });
        }
        new_text.extend_from_slice(&text[copied..]);
        if let Some(form) = q.at_end {
            push_client_units(&mut units, q.statements.len() - done);
            new_text.extend_from_slice(b"\n;");
            new_text.extend_from_slice(sql(form).as_bytes());
            check.at_commit = form != Form::Before;
            check.ends = form == Form::Commit;
            units.push_back(Unit {
                check: Some(check),
                count: 1,
                end: true,
            });
        }
        units.push_back(Unit {
            check: None,
            count: u32::MAX,
            end: false,
        });
        self.expect.push_back(Expect::Query {
            units,
            after_check: false,
        });
        msg::query(out, &new_text);
    }
}

/// Whether the text's one check may go ahead of the Query as prepared statements: it is the
/// only one, only a plain `BEGIN` or inert statements come before it (so that it is in the
/// same transaction and reads the same settings; a `BEGIN` with an isolation level must come
/// before any query of its transaction), no `COPY FROM STDIN` follows (its data would swallow
/// our Sync), and no batch of the client's is open (our Sync would end it).
fn pipelined(text: &[u8], q: &QueryPlan, fresh: bool) -> Option<Form> {
    let [(i, form)] = q.before[..] else {
        return None;
    };
    let quiet_before = q.statements[..i].iter().all(|s| match s.class.kind {
        Kind::Inert => true,
        Kind::Begin => plain_begin(&text[s.start..s.end]),
        _ => false,
    });
    let copy = q.statements.iter().any(|s| s.class.kind == Kind::CopyIn);
    (fresh && q.at_end.is_none() && quiet_before && !copy).then_some(form)
}

/// Whether a Query goes as extended-protocol messages with its checks around it (see
/// `Machine::send_converted`): one statement that needs a check (not a `COPY FROM STDIN`, whose
/// data must follow it at once), with at most one check before it, and no batch of the
/// client's open (our Sync would end it). Returns the checks before and after it.
fn converted(q: &QueryPlan, fresh: bool) -> Option<(Option<Form>, Option<Form>)> {
    let [s] = &q.statements[..] else {
        return None;
    };
    let before = match q.before[..] {
        [] => None,
        [(0, form)] => Some(form),
        _ => return None,
    };
    let kind_ok = !matches!(s.class.kind, Kind::CopyIn | Kind::Standalone);
    (fresh && kind_ok).then_some((before, q.at_end))
}

/// `BEGIN`, `BEGIN WORK`, `BEGIN TRANSACTION` or `START TRANSACTION`, with no modes.
fn plain_begin(statement: &[u8]) -> bool {
    let text = String::from_utf8_lossy(statement).to_ascii_lowercase();
    let words: Vec<&str> = text
        .trim_end_matches([';', ' ', '\t', '\n', '\r'])
        .split_ascii_whitespace()
        .collect();
    matches!(
        words[..],
        ["begin"] | ["begin", "work"] | ["begin", "transaction"] | ["start", "transaction"]
    )
}

fn push_client_units(units: &mut VecDeque<Unit>, n: usize) {
    if n > 0 {
        units.push_back(Unit {
            check: None,
            count: n as u32,
            end: false,
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Server to client.

impl Machine {
    /// Whether the next DataRow answers a check of ours (it is then read whole, never streamed).
    pub(crate) fn next_is_hidden(&self) -> bool {
        match self.expect.front() {
            Some(Expect::Check(_) | Expect::Lock { .. }) => true,
            Some(Expect::Query { units, .. }) => units.front().is_some_and(|u| u.check.is_some()),
            _ => false,
        }
    }

    /// One whole server message.
    pub(crate) fn server(&mut self, message: &[u8], marks: &dyn Marks) -> Verdict {
        let verdict = self.server_message(message, marks);
        if self.held_complete.is_some()
            && matches!(message.first(), Some(b'A' | b'N' | b'S'))
            && verdict == Verdict::Forward
        {
            self.held_after.extend_from_slice(message);
            return Verdict::Hide;
        }
        verdict
    }

    fn server_message(&mut self, message: &[u8], marks: &dyn Marks) -> Verdict {
        let Ok(m) = Backend::decode(message) else {
            return Verdict::Forward;
        };
        match m {
            Backend::ParseComplete if self.phase == Phase::Probing => {
                self.probe_parsed += 1;
                self.pop_ours(|_| Some(true))
            }
            Backend::ParseComplete => self.pop_ours(|e| match e {
                Expect::Parse { ours } => Some(*ours),
                Expect::QueryParse => Some(true),
                _ => None,
            }),
            Backend::BindComplete => self.pop_ours(|e| match e {
                Expect::Bind { ours } => Some(*ours),
                Expect::QueryBind => Some(true),
                _ => None,
            }),
            Backend::CloseComplete => self.pop_ours(|e| match e {
                Expect::Close { ours } => Some(*ours),
                _ => None,
            }),
            Backend::ParameterDescription => Verdict::Forward,
            Backend::NoData => self.on_description(false),
            Backend::RowDescription => self.on_description(true),
            Backend::DataRow { message } => self.on_data_row(message),
            Backend::CommandComplete { .. }
            | Backend::EmptyQueryResponse
            | Backend::PortalSuspended => self.on_complete(message, marks),
            Backend::Error(fields) => {
                // The commit the held completion waited for failed: the error says so alone
                // (after what came meanwhile).
                let after = match self.held_complete.take() {
                    Some(_) => std::mem::take(&mut self.held_after),
                    None => Vec::new(),
                };
                let verdict = self.on_error(&fields, marks);
                prepend(after, verdict, message)
            }
            Backend::ReadyForQuery { status } => {
                let verdict = self.on_ready(status);
                // No error came: the implicit transaction committed; its completion goes first.
                let mut held = self.held_complete.take().unwrap_or_default();
                held.append(&mut self.held_after);
                prepend(held, verdict, message)
            }
            Backend::CopyInResponse => {
                // The COPY started: the Syncs sent with its data will not be answered.
                let first = self
                    .expect
                    .iter()
                    .position(|e| matches!(e, Expect::SyncInCopy));
                if let Some(first) = first {
                    while matches!(self.expect.get(first), Some(Expect::SyncInCopy)) {
                        self.expect.remove(first);
                    }
                }
                Verdict::Forward
            }
            Backend::BackendKeyData { .. } => Verdict::Forward,
            Backend::Authentication if self.phase == Phase::Auth => {
                // AuthenticationSASL is code 10.
                self.sasl_asked = message.get(5..9) == Some(&10i32.to_be_bytes()[..]);
                Verdict::Forward
            }
            Backend::ParameterStatus { name, value } => {
                if name == b"fence_hook.active" {
                    // Only a report of the start-up counts: it is there from the session's
                    // first transaction.
                    self.hook_reported = self.phase == Phase::Auth && value == b"on";
                } else if name == b"standard_conforming_strings" {
                    self.lexing.standard_strings = value == b"on";
                } else if name == b"client_encoding" {
                    self.lexing.encoding = Encoding::from_name(value);
                }
                Verdict::Forward
            }
            _ => Verdict::Forward,
        }
    }

    /// Pops the expectation a reply answers; hides it if it answers a message of ours.
    fn pop_ours(&mut self, ours: impl Fn(&Expect) -> Option<bool>) -> Verdict {
        match self.expect.front().and_then(&ours) {
            Some(mine) => {
                self.expect.pop_front();
                if mine {
                    Verdict::Hide
                } else {
                    Verdict::Forward
                }
            }
            None => Verdict::Forward,
        }
    }

    fn on_description(&mut self, row_description: bool) -> Verdict {
        match self.expect.front() {
            Some(Expect::Describe) => {
                self.expect.pop_front();
                Verdict::Forward
            }
            // A simple Query gets a RowDescription only for a statement that returns rows.
            Some(Expect::QueryDescribe) => {
                self.expect.pop_front();
                if row_description {
                    Verdict::Forward
                } else {
                    Verdict::Hide
                }
            }
            _ if self.next_is_hidden() => Verdict::Hide,
            _ => Verdict::Forward,
        }
    }

    fn on_data_row(&mut self, message: &[u8]) -> Verdict {
        if !self.next_is_hidden() {
            return Verdict::Forward;
        }
        if !matches!(self.expect.front(), Some(Expect::Lock { .. })) {
            self.check_row = read_check_row(message);
        }
        Verdict::Hide
    }

    fn on_complete(&mut self, message: &[u8], marks: &dyn Marks) -> Verdict {
        let check = match self.expect.front_mut() {
            Some(Expect::Lock { .. }) => {
                self.expect.pop_front();
                return Verdict::Hide;
            }
            // Its ReadyForQuery ends it.
            Some(Expect::Rollback { answers }) => {
                return if *answers {
                    Verdict::Forward
                } else {
                    Verdict::Hide
                };
            }
            Some(Expect::Check(c)) => {
                let c = *c;
                self.expect.pop_front();
                Some(c)
            }
            Some(Expect::Execute) => {
                self.expect.pop_front();
                None
            }
            Some(Expect::QueryExecute) => {
                self.expect.pop_front();
                let check_follows = self
                    .expect
                    .iter()
                    .take_while(|e| !matches!(e, Expect::Sync { .. }))
                    .any(|e| matches!(e, Expect::Check(_)));
                return self.complete_or_hold(message, check_follows);
            }
            Some(Expect::Query { units, .. }) => match units.front_mut() {
                Some(u) => {
                    let c = u.check;
                    if u.count != u32::MAX {
                        u.count -= 1;
                        if u.count == 0 {
                            units.pop_front();
                            // The client's last statement, and only the commit point's check
                            // after it (then the catch-all of anything PostgreSQL adds).
                            let last = c.is_none()
                                && matches!(
                                    units.make_contiguous(),
                                    [
                                        Unit {
                                            check: Some(Check {
                                                at_commit: true,
                                                ..
                                            }),
                                            end: true,
                                            ..
                                        },
                                        Unit {
                                            check: None,
                                            count: u32::MAX,
                                            ..
                                        },
                                    ]
                                );
                            if last {
                                return self.complete_or_hold(message, true);
                            }
                        }
                    }
                    c
                }
                None => None,
            },
            _ => None,
        };
        match check {
            None => Verdict::Forward,
            Some(c) => {
                self.check_passed(c, marks);
                Verdict::Hide
            }
        }
    }

    /// A client statement's completion: kept back until the implicit transaction it ends has
    /// committed (the check of its commit point follows it).
    fn complete_or_hold(&mut self, message: &[u8], check_follows: bool) -> Verdict {
        if !check_follows || message.first() != Some(&b'C') {
            return Verdict::Forward;
        }
        self.held_complete = Some(message.to_vec());
        Verdict::Hide
    }

    /// A check of ours answered without an error.
    fn check_passed(&mut self, check: Check, marks: &dyn Marks) {
        match self.check_row.take() {
            Some(CheckRow::Token(resource, token)) => {
                if self.observe {
                    let raised = marks.mark(&resource).is_none_or(|m| m < token);
                    self.events.push(Event::Passed {
                        took: check.took(),
                        raised: raised.then(|| (resource.clone(), token)),
                    });
                }
                marks.raise(&resource, token);
                self.hint = Some((resource.clone(), token, check.generation));
                self.no_token = None;
                self.checked_txn = Some(Some((resource, token)));
            }
            // A check at a commit point with nothing written passed without judging: the
            // session has some setting, of which nothing is known.
            Some(CheckRow::Unjudged) => {
                self.hint = None;
                self.no_token = None;
            }
            // No row (the text form) or a NULL token: no token.
            Some(CheckRow::NoToken) | None => {
                self.hint = None;
                self.defaults_tokenless |= check.generation == 0;
                self.no_token = Some(check.generation);
                self.checked_txn = Some(None);
            }
        }
    }

    fn on_ready(&mut self, status: u8) -> Verdict {
        if self.phase == Phase::Auth {
            let Some((installed, prepared, hooked)) = self.preprobed.take() else {
                return self.start_probe();
            };
            self.phase = Phase::Ready;
            self.prepared = prepared;
            self.hooked = hooked;
            if self.installed == Installed::Unknown {
                self.installed = if installed {
                    Installed::Yes
                } else {
                    Installed::No
                };
            }
            self.status = status;
            return Verdict::Forward;
        }
        let mut hide = false;
        while let Some(e) = self.expect.pop_front() {
            match e {
                Expect::Sync { ours } => {
                    hide = ours;
                    break;
                }
                Expect::SyncInCopy | Expect::Query { .. } | Expect::Rollback { .. } => break,
                _ => {}
            }
        }
        if !hide {
            self.commit_in_flight = false;
        }
        self.aborted = status == b'E';
        let refused = self.refused_end.take();
        if let Some(refused) = refused.filter(|_| status == b'E' && !hide && self.idle()) {
            // The check refused the transaction's end: PostgreSQL skipped the client's COMMIT
            // and the transaction sits aborted, where a COMMIT that fails in PostgreSQL ends
            // it. End it too, so that the client finds the session as PostgreSQL would leave
            // it; its ReadyForQuery is the client's. (Not when the client sent more already:
            // that would run before this.)
            msg::query(&mut self.to_server, b"ROLLBACK");
            self.expect.push_back(Expect::Rollback {
                answers: refused == RefusedEnd::Aborted,
            });
            self.status = status;
            self.checked_txn = None;
            return Verdict::Hide;
        }
        self.status = status;
        if status != b'T' {
            self.checked_txn = None;
        }
        if self.phase == Phase::Probing && self.idle() {
            // The probe's ReadyForQuery is the one the client waits for after start-up.
            self.phase = Phase::Ready;
            if self.installed == Installed::Unknown
                && self.prepared & BASE_PREPARED == BASE_PREPARED
            {
                self.installed = Installed::Yes;
            }
            self.hooked = self.prepared & HOOKED_BIT != 0;
            return Verdict::Forward;
        }
        if hide {
            Verdict::Hide
        } else {
            Verdict::Forward
        }
    }

    /// The start-up is done: before the client may send its first query, prepare our
    /// statements in a batch of our own, and learn whether the check is installed here. The
    /// bare form first: it needs nothing of ours, so it is there even when the rest fails.
    fn start_probe(&mut self) -> Verdict {
        self.phase = Phase::Probing;
        let mut out = Vec::new();
        let n = probe_len(self.hook_reported && !self.hook_ignored);
        for (name, text, types) in &STATEMENTS[..n] {
            msg::parse(&mut out, name, text, types);
            self.expect.push_back(Expect::Parse { ours: true });
        }
        msg::sync(&mut out);
        // Forwarded: it answers the client's start-up.
        self.expect.push_back(Expect::Sync { ours: false });
        self.to_server.extend_from_slice(&out);
        self.prepared = parsed_mask(n);
        Verdict::Hide
    }

    fn on_error(&mut self, fields: &msg::ErrorFields<'_>, marks: &dyn Marks) -> Verdict {
        // A message of the check at the transaction's end (the check, or the fast path's
        // lock, which fires the deferred triggers, or a Bind of either) failed.
        let ends = match self.expect.front() {
            Some(Expect::Query { units, .. }) => {
                units.front().and_then(|u| u.check).is_some_and(|c| c.ends)
            }
            _ => self
                .expect
                .iter()
                .take_while(|e| !matches!(e, Expect::Sync { .. } | Expect::Query { .. }))
                .any(|e| {
                    matches!(e, Expect::Check(c) if c.ends)
                        || matches!(e, Expect::Lock { ends: true })
                }),
        };
        let (from_check, check) = self.failed_check();
        // Only the answer to a check of ours is the fence's: any statement of the client's
        // may raise any SQLSTATE with any DETAIL (`RAISE ... USING ERRCODE = 'FN001'`).
        if self.observe
            && self.phase != Phase::Probing
            && let Some(check) = check
            && let Some(outcome) = refusal(fields.code, check.bare)
        {
            let (resource, token, highest) = sqlstate::parse_refusal_detail(fields.detail);
            self.events.push(Event::Refused {
                outcome,
                took: check.took(),
                resource: resource.to_string(),
                token: token.to_string(),
                highest,
                message: String::from_utf8_lossy(fields.message).into_owned(),
            });
        }
        if self.phase == Phase::Probing {
            // A statement of the probe failed: the check is not usable in this database. The
            // bare form, first, is what remains (if it was prepared). Unless it was only the
            // hook's check, last, which a database may lack ([`BASE_STATEMENTS`]).
            if self.probe_parsed < BASE_STATEMENTS {
                self.installed = Installed::No;
            }
            self.prepared = parsed_mask(self.probe_parsed);
            self.skip_to_sync();
            return Verdict::Hide;
        }
        self.skip_to_sync();
        if from_check
            && matches!(
                self.expect.front(),
                Some(Expect::Query {
                    after_check: true,
                    ..
                })
            )
        {
            // PostgreSQL skipped the Query that followed the check: the Sync's ReadyForQuery
            // is the Query's now.
            self.expect.pop_front();
            if let Some(Expect::Sync { ours }) = self.expect.front_mut() {
                *ours = false;
            }
        }
        self.check_row = None;
        if from_check && ends && fields.code == IN_FAILED_TRANSACTION {
            // The transaction was aborted before its COMMIT (an error the client saw): nothing
            // to check, and PostgreSQL answers such a COMMIT with `ROLLBACK`. So will the relay.
            self.refused_end = Some(RefusedEnd::Aborted);
            return Verdict::Hide;
        }
        if from_check {
            if ends {
                self.refused_end = Some(RefusedEnd::Refused);
            }
            return self.on_check_error(fields, check, marks);
        }
        // PostgreSQL ended the session while it sat idle in a transaction that passed a check
        // with a token: nothing of it can have committed (nothing was in flight), and a newer
        // token ending it is what fence_wait_ms does. Said as FN003, in answer to the client's
        // next message. With anything in flight the outcome is not known (a shutdown may have
        // raced a commit): PostgreSQL's own error goes as it is.
        if fields.severity == b"FATAL" && fields.code == b"57P01" && self.may_hold() {
            if let Some(Some((resource, token))) = &self.checked_txn {
                let newer = marks.mark(resource).filter(|h| h > token);
                let mut out = Vec::new();
                sqlstate::fenced_out(&mut out, resource, *token, newer);
                if self.observe {
                    self.events.push(Event::FencedOut {
                        resource: resource.clone(),
                        token: *token,
                        newer,
                    });
                }
                return Verdict::Hold(out);
            }
        }
        Verdict::Forward
    }

    /// Whether the error answers a message of ours (and which check, if a check).
    fn failed_check(&mut self) -> (bool, Option<Check>) {
        match self.expect.front_mut() {
            Some(Expect::Parse { ours: true }) => {
                self.prepared = 0;
                (true, None)
            }
            Some(
                Expect::Bind { ours: true } | Expect::Close { ours: true } | Expect::Lock { .. },
            ) => (true, None),
            Some(Expect::Check(c)) => (true, Some(*c)),
            Some(Expect::Query { units, .. }) => {
                let c = units.front().and_then(|u| u.check);
                // PostgreSQL skips the rest of the query string.
                units.clear();
                (c.is_some(), c)
            }
            _ => (false, None),
        }
    }

    /// After an error PostgreSQL skips the extended-protocol messages up to the next Sync.
    fn skip_to_sync(&mut self) {
        while matches!(
            self.expect.front(),
            Some(
                Expect::Parse { .. }
                    | Expect::Bind { .. }
                    | Expect::QueryParse
                    | Expect::QueryBind
                    | Expect::QueryDescribe
                    | Expect::Execute
                    | Expect::QueryExecute
                    | Expect::Check(_)
                    | Expect::Lock { .. }
                    | Expect::Describe
                    | Expect::Close { .. }
            )
        ) {
            self.expect.pop_front();
        }
    }

    fn on_check_error(
        &mut self,
        fields: &msg::ErrorFields<'_>,
        check: Option<Check>,
        marks: &dyn Marks,
    ) -> Verdict {
        let code = fields.code;
        if code == sqlstate::STALE_TOKEN.as_bytes()
            && let Some((resource, _, highest)) = sqlstate::parse_stale_detail(fields.detail)
        {
            // What PostgreSQL said the mark is: the next check of this token takes the full
            // form (the fast one would hand over anyway).
            marks.raise(resource, highest);
            return Verdict::Forward;
        }
        if code == STATEMENT_GONE {
            self.prepared = 0;
            return Verdict::Forward;
        }
        let bare_refusal = check.is_some_and(|c| c.bare) && code == b"22P02";
        if bare_refusal || NOT_INSTALLED.contains(&code) {
            // Not here, or gone since the probe: from now on the bare form, which passes
            // sessions without a token and refuses the others.
            self.installed = Installed::No;
            self.prepared = 0;
            let mut out = Vec::new();
            sqlstate::not_installed(&mut out, fields.message);
            return Verdict::Replace(out);
        }
        Verdict::Forward
    }
}

/// `before`, then what `verdict` sends for `message`.
fn prepend(mut before: Vec<u8>, verdict: Verdict, message: &[u8]) -> Verdict {
    if before.is_empty() {
        return verdict;
    }
    match verdict {
        Verdict::Forward => before.extend_from_slice(message),
        Verdict::Replace(out) => before.extend_from_slice(&out),
        Verdict::Hide => {}
        // The connection closes after it: what came before goes first.
        Verdict::Hold(out) => {
            before.extend_from_slice(&out);
            return Verdict::Hold(before);
        }
    }
    Verdict::Replace(before)
}

/// Why the relay ends a transaction whose `COMMIT` PostgreSQL skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefusedEnd {
    /// The check refused it (its error was the answer).
    Refused,
    /// It was aborted already (the check could not run: 25P02, hidden); the `ROLLBACK`'s
    /// completion is the answer, as PostgreSQL's to a `COMMIT` of an aborted transaction.
    Aborted,
}

/// What the row of a check says.
#[derive(Debug)]
enum CheckRow {
    /// It accepted this token for this resource.
    Token(CompactString, i64),
    /// The session has no token (a NULL, or no valid, token).
    NoToken,
    /// A check at a commit point with nothing written did not judge (a NULL resource).
    Unjudged,
}

/// Reads the (resource, token) row of a check.
fn read_check_row(message: &[u8]) -> Option<CheckRow> {
    let cols = msg::data_row(message).ok()?;
    let [r, t] = cols[..] else {
        return None;
    };
    let Some(r) = r else {
        return Some(CheckRow::Unjudged);
    };
    let resource = std::str::from_utf8(r).ok()?;
    let token = t
        .and_then(|t| std::str::from_utf8(t).ok())
        .and_then(|t| t.parse::<i64>().ok())
        .filter(|t| {
            u64::try_from(*t)
                .ok()
                .and_then(fencing::FencingToken::new)
                .is_some()
        });
    match token {
        Some(t) if fencing::ResourceName::validate(resource).is_ok() => {
            Some(CheckRow::Token(resource.into(), t))
        }
        _ => Some(CheckRow::NoToken),
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;

/// What a check's error with SQLSTATE `code` refused, if it is a refusal of the fence's: one
/// of the check's own SQLSTATEs, or a check that is not installed (the bare form's cast
/// error, or the check missing: said as FN004).
fn refusal(code: &[u8], bare: bool) -> Option<Outcome> {
    Some(match code {
        c if c == sqlstate::STALE_TOKEN.as_bytes() => Outcome::Stale,
        c if c == sqlstate::BAD_SETTING.as_bytes() => Outcome::Malformed,
        c if c == sqlstate::UNCHECKABLE.as_bytes() => Outcome::Uncheckable,
        c if c == sqlstate::FORGED.as_bytes() => Outcome::Forged,
        c if c == sqlstate::NOT_INSTALLED.as_bytes() || NOT_INSTALLED.contains(&c) => {
            Outcome::NotInstalled
        }
        b"22P02" if bare => Outcome::NotInstalled,
        _ => return None,
    })
}
