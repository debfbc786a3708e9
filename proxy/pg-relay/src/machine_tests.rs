//! The session machine from data: a script of client and server messages in, a transcript of
//! what went where out, through one `check` helper.
//!
//! Script lines: `C` and a client message (`Q sql`, `P name sql`, `B portal statement`,
//! `E portal`, `D`, `S`, `F`, `X`); `S` and a server message (`1`, `2`, `3`, `n`, `T`, `D cols`,
//! `C tag`, `E code [detail]`, `F code` for a FATAL, `Z status`); `mark resource token` sets
//! the relay's memory. The transcript says, for each client message, what the relay sent to
//! the server (or whether it deferred it or answered it itself), and for each server message
//! whether the client got it.

use std::cell::RefCell;
use std::collections::HashMap;

use expect_test::{Expect, expect};
use pg_wire::{Backend, Frontend, msg};

use super::{Local, Machine, Marks, Step, Verdict};

#[derive(Default)]
struct TestMarks(RefCell<HashMap<String, i64>>);

impl Marks for TestMarks {
    fn mark(&self, resource: &str) -> Option<i64> {
        self.0.borrow().get(resource).copied()
    }
    fn raise(&self, resource: &str, token: i64) {
        let mut m = self.0.borrow_mut();
        let e = m.entry(resource.to_string()).or_insert(token);
        *e = (*e).max(token);
    }
}

fn client_message(line: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
    match kind {
        "Q" => msg::query(&mut out, rest.as_bytes()),
        "P" => {
            let (name, sql) = rest.split_once(' ').unwrap();
            let name = if name == "-" { "" } else { name };
            msg::parse(&mut out, name.as_bytes(), sql.as_bytes(), &[]);
        }
        "B" => {
            let (portal, statement) = rest.split_once(' ').unwrap();
            let un = |s: &str| {
                if s == "-" {
                    String::new()
                } else {
                    s.to_string()
                }
            };
            msg::bind(
                &mut out,
                un(portal).as_bytes(),
                un(statement).as_bytes(),
                &[],
            );
        }
        "E" => msg::execute(&mut out, if rest == "-" { b"" } else { rest.as_bytes() }, 0),
        "S" => msg::sync(&mut out),
        "D" => out.extend_from_slice(b"D\0\0\0\x06P\0"),
        "c" => out.extend_from_slice(b"c\0\0\0\x04"),
        "F" => out.extend_from_slice(b"F\0\0\0\x04"),
        "X" => msg::terminate(&mut out),
        other => panic!("unknown client message {other}"),
    }
    out
}

fn tagged(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn server_message(line: &str) -> Vec<u8> {
    let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
    match kind {
        "1" | "2" | "3" | "n" => tagged(kind.as_bytes()[0], b""),
        "G" => tagged(b'G', b"\0\0\0"),
        "T" => tagged(b'T', b"\0\0"),
        "D" => {
            let cols: Vec<&str> = rest.split(' ').collect();
            let mut body = (cols.len() as i16).to_be_bytes().to_vec();
            for c in cols {
                if c == "NULL" {
                    body.extend_from_slice(&(-1i32).to_be_bytes());
                } else {
                    let c = if c == "''" { "" } else { c };
                    body.extend_from_slice(&(c.len() as i32).to_be_bytes());
                    body.extend_from_slice(c.as_bytes());
                }
            }
            tagged(b'D', &body)
        }
        "C" => tagged(b'C', format!("{rest}\0").as_bytes()),
        "Z" => tagged(b'Z', rest.as_bytes()),
        "E" | "F" => {
            let (code, detail) = rest.split_once(' ').unwrap_or((rest, ""));
            let mut out = Vec::new();
            msg::error_response(
                &mut out,
                &msg::ErrorResponse {
                    severity: if kind == "E" { "ERROR" } else { "FATAL" },
                    code,
                    message: "m",
                    detail: (!detail.is_empty()).then_some(detail),
                    hint: None,
                },
            );
            out
        }
        "S" => {
            let (name, value) = rest.split_once(' ').unwrap();
            tagged(b'S', format!("{name}\0{value}\0").as_bytes())
        }
        other => panic!("unknown server message {other}"),
    }
}

/// Short names of the statements the relay prepares.
fn short(name: &[u8]) -> String {
    let n = String::from_utf8_lossy(name).to_string();
    n.strip_prefix("__fence_proxy_")
        .map_or(n.clone(), str::to_string)
}

/// The text parameters of a Bind (the relay binds no formats).
fn bind_params(m: &[u8]) -> Vec<Vec<u8>> {
    let mut r = msg::Reader::body(m);
    r.cstr("p").unwrap();
    r.cstr("s").unwrap();
    let formats = r.i16("f").unwrap();
    r.take(formats as usize * 2, "f").unwrap();
    let n = r.i16("n").unwrap();
    (0..n)
        .map(|_| {
            let len = r.i32("l").unwrap();
            r.take(len.max(0) as usize, "v").unwrap().to_vec()
        })
        .collect()
}

/// What a stream of client messages says, one per line.
fn describe_client(bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Ok(Some(h)) = pg_wire::header(rest, usize::MAX) {
        let (m, tail) = rest.split_at(h.total);
        rest = tail;
        out.push(match Frontend::decode(m).unwrap() {
            Frontend::Query { text } => format!("Query {:?}", String::from_utf8_lossy(text)),
            Frontend::Parse { name, text } if name.starts_with(b"__fence_proxy") => {
                let _ = text;
                format!("Parse {}", short(name))
            }
            Frontend::Parse { name, text } => {
                format!("Parse {} {:?}", short(name), String::from_utf8_lossy(text))
            }
            Frontend::Bind { portal, statement } => {
                // A check at a commit point says so in its second parameter, and one at the
                // transaction's end (its deferred triggers fire first) in its third (the lock
                // statement's only one).
                let params = bind_params(m);
                let flag = |i: usize| params.get(i).map(Vec::as_slice) == Some(b"t");
                let lock = statement.ends_with(b"lock");
                let at_commit = if !lock && flag(1) { " at commit" } else { "" };
                let ends = if flag(if lock { 0 } else { 2 }) {
                    ", ends"
                } else {
                    ""
                };
                format!(
                    "Bind {:?} {}{at_commit}{ends}",
                    short(portal),
                    short(statement)
                )
            }
            Frontend::Execute { portal, .. } => format!("Execute {:?}", short(portal)),
            Frontend::Close { target, name } => format!("Close {target:?} {}", short(name)),
            other => format!("{other:?}"),
        });
    }
    out
}

fn describe_server(bytes: &[u8]) -> String {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Ok(Some(h)) = pg_wire::header(rest, usize::MAX) {
        let (m, tail) = rest.split_at(h.total);
        rest = tail;
        out.push(match Backend::decode(m).unwrap() {
            Backend::Error(f) => format!(
                "{} {}",
                String::from_utf8_lossy(f.severity),
                String::from_utf8_lossy(f.code)
            ),
            Backend::ReadyForQuery { status } => format!("Z {}", status as char),
            Backend::CommandComplete { tag } => format!("C {}", String::from_utf8_lossy(tag)),
            other => format!("{other:?}"),
        });
    }
    out.join(", ")
}

/// Runs `script` through a machine that has finished its start-up (the probe answered; with
/// `installed` false, the probe's second statement failed).
fn run(script: &str, installed: bool) -> String {
    run_after(Machine::new(1000), &[], script, installed)
}

/// [`run`], for machine `m`, after the server messages `startup` (ParameterStatus and the
/// like, before the first ReadyForQuery).
fn run_after(m: Machine, startup: &[&str], script: &str, installed: bool) -> String {
    let replies: &[&str] = if installed {
        &["1", "1", "1", "1", "1", "Z I"]
    } else {
        &["1", "E 3F000", "Z I"]
    };
    run_probed(m, startup, script, replies)
}

/// [`run_after`], the probe answered with `replies` (a ParseComplete for each statement
/// parsed, up to the first error, then ReadyForQuery; one too many "1" is ignored).
fn run_probed(mut m: Machine, startup: &[&str], script: &str, replies: &[&str]) -> String {
    let marks = TestMarks::default();
    for s in startup {
        assert_eq!(m.server(&server_message(s), &marks), Verdict::Forward);
    }
    assert_eq!(m.server(&server_message("Z I"), &marks), Verdict::Hide);
    let probe = describe_client(&m.take_to_server());
    // The hook's check is parsed only where the start-up reported the hook.
    let hook = startup.contains(&"S fence_hook.active on") && !m.hook_ignored();
    let mut expected = vec!["Parse bare", "Parse any", "Parse lock", "Parse fast"];
    if hook {
        expected.push("Parse hooked");
    }
    expected.push("Sync");
    assert_eq!(probe, expected);
    let parses = expected.len() - 1;
    let replies: Vec<&str> = replies
        .iter()
        .copied()
        .enumerate()
        .filter(|(i, r)| *r != "1" || *i < parses)
        .map(|(_, r)| r)
        .collect();
    for r in replies {
        let v = m.server(&server_message(r), &marks);
        assert_eq!(
            v,
            if r == "Z I" {
                Verdict::Forward
            } else {
                Verdict::Hide
            }
        );
    }
    let mut t = String::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (who, what) = line.split_once(' ').unwrap();
        match who {
            "C" => {
                let mut out = Vec::new();
                let step = m.client(&client_message(what), &mut out, &marks).unwrap();
                t.push_str(&format!("{line}\n"));
                if step == Step::Defer {
                    t.push_str("    deferred\n");
                }
                for s in describe_client(&out) {
                    t.push_str(&format!("    → {s}\n"));
                }
                while let Some(l) = m.take_local() {
                    let Local::Fatal(b) = &l;
                    t.push_str(&format!("    ↩ {}\n", describe_server(b)));
                }
            }
            "S" => {
                let v = m.server(&server_message(what), &marks);
                let shown = match v {
                    Verdict::Forward => "forward".to_string(),
                    Verdict::Hide => "hide".to_string(),
                    Verdict::Replace(b) => format!("replace: {}", describe_server(&b)),
                    Verdict::Hold(b) => format!("hold: {}", describe_server(&b)),
                };
                t.push_str(&format!("{line:<24} {shown}\n"));
                for s in describe_client(&m.take_to_server()) {
                    t.push_str(&format!("    → {s} (the relay's own)\n"));
                }
            }
            "mark" => {
                let (r, tok) = what.split_once(' ').unwrap();
                marks.raise(r, tok.parse().unwrap());
                t.push_str(&format!("{line}\n"));
            }
            other => panic!("unknown line {other}"),
        }
    }
    t
}

fn check(script: &str, expected: Expect) {
    expected.assert_eq(&run(script, true));
}

#[test]
fn nothing_reaches_the_client_before_the_probe_is_answered() {
    let marks = TestMarks::default();
    let mut m = Machine::new(1000);
    let mut out = Vec::new();
    assert_eq!(
        m.client(&client_message("Q SELECT 1"), &mut out, &marks),
        Ok(Step::Defer)
    );
    assert!(out.is_empty());
    assert_eq!(m.server(&server_message("Z I"), &marks), Verdict::Hide);
    assert!(!m.take_to_server().is_empty());
    assert!(!m.wants_progress());
    assert_eq!(
        m.client(&client_message("Q SELECT 1"), &mut out, &marks),
        Ok(Step::Defer)
    );
    for r in ["1", "1", "1", "1"] {
        assert_eq!(m.server(&server_message(r), &marks), Verdict::Hide);
    }
    assert_eq!(m.server(&server_message("Z I"), &marks), Verdict::Forward);
    assert!(m.wants_progress(), "the deferred query may go now");
    assert_eq!(
        m.client(&client_message("Q SELECT 1"), &mut out, &marks),
        Ok(Step::Done)
    );
}

#[test]
fn every_autocommit_statement_is_checked_and_the_check_is_hidden() {
    // The first: before (nothing is known of the session's settings yet) and after (where the
    // implicit transaction commits: what the statement may have set is judged there); then,
    // with no token found, after only. A simple Query of one statement goes as Parse, Bind,
    // Describe and Execute so that the check can follow it. In an explicit transaction of a
    // session without a token, the check waits for the COMMIT.
    check(
        "
        C Q UPDATE t SET v = 1
        S 2
        S D '' NULL
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S 2
        S D NULL
        S C SELECT 1
        S 2
        S D '' NULL
        S C SELECT 1
        S Z I
        C Q SELECT v FROM t
        S 1
        S 2
        S T
        S D 1
        S C SELECT 1
        S 2
        S D '' NULL
        S C SELECT 1
        S Z I
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 2
        S C UPDATE 1
        S Z T
        C Q COMMIT
        ",
        expect![[r#"
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C UPDATE 1             hide
            S 2                      hide
            S D NULL                 hide
            S C SELECT 1             hide
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S Z I                    replace: C UPDATE 1, Z I
            C Q SELECT v FROM t
                → Parse  "SELECT v FROM t"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" any at commit, ends
                → Execute ""
                → Sync
            S 1                      hide
            S 2                      hide
            S T                      forward
            S D 1                    forward
            S C SELECT 1             hide
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S Z I                    replace: C SELECT 1, Z I
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C Q UPDATE t SET v = 2
                → Query "UPDATE t SET v = 2"
            S C UPDATE 1             forward
            S Z T                    forward
            C Q COMMIT
                → Bind "" any at commit, ends
                → Execute ""
                → Parse  "COMMIT"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
        "#]],
    );
}

#[test]
fn a_token_found_current_takes_the_fast_form_next() {
    check(
        "
        C Q UPDATE t SET v = 1
        S 2
        S D '' NULL
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S 2
        S D NULL
        S C SELECT 1
        S 2
        S D r 5
        S C SELECT 1
        S Z I
        C Q UPDATE t SET v = 2
        mark r 6
        C Q UPDATE t SET v = 3
        ",
        expect![[r#"
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C UPDATE 1             hide
            S 2                      hide
            S D NULL                 hide
            S C SELECT 1             hide
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S Z I                    replace: C UPDATE 1, Z I
            C Q UPDATE t SET v = 2
                → Parse  "UPDATE t SET v = 2"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            mark r 6
            C Q UPDATE t SET v = 3
                → Parse  "UPDATE t SET v = 3"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" any at commit, ends
                → Execute ""
                → Sync
        "#]],
    );
}

#[test]
fn an_explicit_transaction_is_checked_at_its_first_write_and_again_at_commit() {
    // BEGIN needs no check; the first UPDATE does; the second runs in the checked transaction
    // but after a statement that may have changed the settings (a function, a trigger), so the
    // COMMIT gets a check of its own. ROLLBACK never does. What the client sends after a
    // COMMIT with a check waits for its answer (a refused one is ended first).
    check(
        "
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 1
        S 2
        S D r 5
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S Z T
        C Q UPDATE t SET v = 2
        S C UPDATE 1
        S Z T
        C Q COMMIT
        S 2
        S D NULL
        S C SELECT 1
        S 2
        S D r 5
        S C SELECT 1
        S 1
        S 2
        S n
        S C COMMIT
        S Z I
        C Q RESET ALL
        C Q BEGIN
        C Q UPDATE t SET v = 3
        C Q ROLLBACK
        C Q BEGIN
        C Q SELECT f()
        C Q COMMIT
        C Q SELECT 1
        ",
        expect![[r#"
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C UPDATE 1             forward
            S Z T                    forward
            C Q UPDATE t SET v = 2
                → Query "UPDATE t SET v = 2"
            S C UPDATE 1             forward
            S Z T                    forward
            C Q COMMIT
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Parse  "COMMIT"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            S 2                      hide
            S D NULL                 hide
            S C SELECT 1             hide
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C COMMIT               forward
            S Z I                    forward
            C Q RESET ALL
                → Query "RESET ALL"
            C Q BEGIN
                → Query "BEGIN"
            C Q UPDATE t SET v = 3
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 3"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            C Q ROLLBACK
                → Query "ROLLBACK"
            C Q BEGIN
                → Query "BEGIN"
            C Q SELECT f()
                → Bind "" any
                → Execute ""
                → Parse  "SELECT f()"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            C Q COMMIT
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Parse  "COMMIT"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            C Q SELECT 1
                deferred
        "#]],
    );
}

#[test]
fn a_batch_of_several_statements_is_checked_before_the_first_and_at_its_sync() {
    // JDBC's executeBatch, psycopg's executemany: many Executes, one Sync, one implicit
    // transaction. A setting visibly changed in the middle is checked before the next write.
    check(
        "
        C P s1 INSERT INTO t VALUES ($1)
        C B - s1
        C E -
        C B - s1
        C E -
        C P s2 SELECT set_config($1, $2, false)
        C B - s2
        C E -
        C B - s1
        C E -
        C S
        C B - s1
        C E -
        C S
        ",
        expect![[r#"
            C P s1 INSERT INTO t VALUES ($1)
                → Parse s1 "INSERT INTO t VALUES ($1)"
            C B - s1
                → Bind "" any
                → Execute ""
                → Bind "" s1
            C E -
                → Execute ""
            C B - s1
                → Bind "" s1
            C E -
                → Execute ""
            C P s2 SELECT set_config($1, $2, false)
                → Parse s2 "SELECT set_config($1, $2, false)"
            C B - s2
                → Bind "" s2
            C E -
                → Execute ""
            C B - s1
                → Bind "" any
                → Execute ""
                → Bind "" s1
            C E -
                → Execute ""
            C S
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            C B - s1
                → Bind "" any
                → Execute ""
                → Bind "" s1
            C E -
                → Execute ""
            C S
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
        "#]],
    );
}

#[test]
fn a_known_stale_token_waits_for_the_commit_point_in_autocommit_only() {
    // With a token known stale (the relay saw a higher mark since), an autocommit statement is
    // checked only where it commits (it may be the one that declares a new token, in a
    // function the relay cannot see into); in an explicit transaction it is refused at once.
    check(
        "
        C Q UPDATE t SET v = 0
        S 2
        S D r 5
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S 2
        S D NULL
        S C SELECT 1
        S 2
        S D r 5
        S C SELECT 1
        S Z I
        mark r 9
        C Q SELECT app.declare('r', '10')
        C Q BEGIN
        C Q UPDATE t SET v = 2
        ",
        expect![[r#"
            C Q UPDATE t SET v = 0
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 0"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C UPDATE 1             hide
            S 2                      hide
            S D NULL                 hide
            S C SELECT 1             hide
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S Z I                    replace: C UPDATE 1, Z I
            mark r 9
            C Q SELECT app.declare('r', '10')
                → Parse  "SELECT app.declare('r', '10')"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" any at commit, ends
                → Execute ""
                → Sync
            C Q BEGIN
                → Query "BEGIN"
            C Q UPDATE t SET v = 2
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 2"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
        "#]],
    );
}

#[test]
fn a_fenced_session_idle_in_its_transaction_gets_its_error_when_it_speaks() {
    check(
        "
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 1
        S 2
        S D r 5
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S Z T
        mark r 6
        S F 57P01
        ",
        expect![[r#"
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C UPDATE 1             forward
            S Z T                    forward
            mark r 6
            S F 57P01                hold: ERROR FN003, Z I
        "#]],
    );
    // Waiting for an answer (which might be a COMMIT that made it), PostgreSQL's own error.
    check(
        "
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 1
        S 2
        S D r 5
        S C SELECT 1
        S F 57P01
        C Q SELECT 1
        S F 57P01
        ",
        expect![[r#"
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S F 57P01                forward
            C Q SELECT 1
                → Query "SELECT 1"
            S F 57P01                forward
        "#]],
    );
}

#[test]
fn without_the_check_installed_the_bare_form_passes_sessions_without_a_token() {
    expect![[r#"
        C Q UPDATE t SET v = 1
            → Bind "" bare
            → Execute ""
            → Parse  "UPDATE t SET v = 1"
            → Bind "" 
            → Describe { target: Portal, name: [] }
            → Execute ""
            → Bind "" bare at commit, ends
            → Execute ""
            → Sync
        S 2                      hide
        S D '' NULL              hide
        S C SELECT 1             hide
        S 1                      hide
        S 2                      hide
        S n                      hide
        S C UPDATE 1             hide
        S 2                      hide
        S D '' NULL              hide
        S C SELECT 1             hide
        S Z I                    replace: C UPDATE 1, Z I
        C Q UPDATE t SET v = 1
            → Parse  "UPDATE t SET v = 1"
            → Bind "" 
            → Describe { target: Portal, name: [] }
            → Execute ""
            → Bind "" bare at commit, ends
            → Execute ""
            → Sync
        S 1                      hide
        S 2                      hide
        S n                      hide
        S C UPDATE 1             hide
        S 2                      hide
        S E 22P02                replace: ERROR FN004
        S Z I                    forward
    "#]]
    .assert_eq(&run(
        "
        C Q UPDATE t SET v = 1
        S 2
        S D '' NULL
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S 2
        S D '' NULL
        S C SELECT 1
        S Z I
        C Q UPDATE t SET v = 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S 2
        S E 22P02
        S Z I
        ",
        false,
    ));
    // Installed at start-up, dropped since: FN004, and the bare form from then on.
    check(
        "
        C Q UPDATE t SET v = 1
        S 2
        S E 42883
        S Z I
        C Q UPDATE t SET v = 1
        ",
        expect![[r#"
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            S 2                      hide
            S E 42883                replace: ERROR FN004
            S Z I                    forward
            C Q UPDATE t SET v = 1
                → Close Statement bare
                → Parse bare
                → Bind "" bare
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" bare at commit, ends
                → Execute ""
                → Sync
        "#]],
    );
}

#[test]
fn copy_from_stdin_and_checks_inside_a_string_go_into_its_text() {
    check(
        "
        C Q COPY t FROM STDIN
        C Q UPDATE a SET v = 1; COMMIT; UPDATE b SET v = 2; -- end
        C Q BEGIN; UPDATE a SET v = 1; SET LOCAL fencing.token = '7'; UPDATE b SET v = 2; COMMIT
        C Q SELECT f(); UPDATE a SET v = 1
        ",
        expect![[r#"
            C Q COPY t FROM STDIN
                → Query "SELECT * FROM fencing.check(1000, false); COPY t FROM STDIN\n;SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s"
            C Q UPDATE a SET v = 1; COMMIT; UPDATE b SET v = 2; -- end
                → Query "UPDATE a SET v = 1; COMMIT; UPDATE b SET v = 2; -- end"
            C Q BEGIN; UPDATE a SET v = 1; SET LOCAL fencing.token = '7'; UPDATE b SET v = 2; COMMIT
                → Query "BEGIN; UPDATE a SET v = 1; SET LOCAL fencing.token = '7'; UPDATE b SET v = 2; COMMIT"
            C Q SELECT f(); UPDATE a SET v = 1
                → Query "SELECT f(); UPDATE a SET v = 1"
        "#]],
    );
}

#[test]
fn replies_to_checks_in_the_text_are_hidden_and_an_error_ends_the_string() {
    check(
        "
        C Q COPY t FROM STDIN
        S T
        S D '' NULL
        S C SELECT 1
        S G
        C c
        S C COPY 2
        S T
        S D '' NULL
        S C SELECT 1
        S Z I
        C Q SELECT f(); UPDATE a SET v = 1
        S T
        S D 1
        S C SELECT 1
        S C UPDATE 1
        S E FN001 resource: r, presented token: 4, highest accepted token: 9
        S Z I
        ",
        expect![[r#"
            C Q COPY t FROM STDIN
                → Query "SELECT * FROM fencing.check(1000, false); COPY t FROM STDIN\n;SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s"
            S T                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S G                      forward
            C c
                → CopyDone
            S C COPY 2               hide
            S T                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S Z I                    replace: C COPY 2, Z I
            C Q SELECT f(); UPDATE a SET v = 1
                → Query "SELECT f(); UPDATE a SET v = 1\n;SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s"
            S T                      forward
            S D 1                    forward
            S C SELECT 1             forward
            S C UPDATE 1             hide
            S E FN001 resource: r, presented token: 4, highest accepted token: 9 forward
            S Z I                    forward
        "#]],
    );
}

#[test]
fn what_drops_our_statements_has_them_prepared_again() {
    check(
        "
        C Q DISCARD ALL
        C Q UPDATE t SET v = 1
        C P __fence_proxy_any SELECT 1
        C Q UPDATE t SET v = 1
        ",
        expect![[r#"
            C Q DISCARD ALL
                → Query "DISCARD ALL"
            C Q UPDATE t SET v = 1
                → Close Statement any
                → Parse any
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Close Statement lock
                → Parse lock
                → Close Statement fast
                → Parse fast
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            C P __fence_proxy_any SELECT 1
                → Parse any
            C Q UPDATE t SET v = 1
                → Query "SELECT * FROM fencing.check(1000, false); UPDATE t SET v = 1\n;SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s"
        "#]],
    );
}

#[test]
fn a_portal_bound_earlier_is_checked_in_a_portal_of_ours() {
    check(
        "
        C Q BEGIN
        S C BEGIN
        S Z T
        C P s SELECT * FROM t
        C B c s
        C S
        S 1
        S 2
        S Z T
        C Q SET fencing.token = '5'
        S C SET
        S Z T
        C E c
        C S
        ",
        expect![[r#"
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C P s SELECT * FROM t
                → Parse s "SELECT * FROM t"
            C B c s
                → Bind "" any
                → Execute ""
                → Bind "c" s
            C S
                → Sync
            S 1                      forward
            S 2                      hide
            S Z T                    forward
            C Q SET fencing.token = '5'
                → Query "SET fencing.token = '5'"
            S C SET                  forward
            S Z T                    forward
            C E c
                → Bind "__fence_proxy" any
                → Execute "__fence_proxy"
                → Close Portal __fence_proxy
                → Execute "c"
            C S
                → Sync
        "#]],
    );
}

#[test]
fn text_that_reads_differently_under_a_changing_setting_waits_for_the_replies() {
    check(
        "
        C Q SET standard_conforming_strings = off
        C Q UPDATE t SET v = 'a\\'; COMMIT; --'
        S C SET
        S S standard_conforming_strings off
        S Z I
        C Q UPDATE t SET v = 'a\\'; COMMIT; --'
        C Q UPDATE t SET v = 'no backslash'
        ",
        expect![[r#"
            C Q SET standard_conforming_strings = off
                → Query "SET standard_conforming_strings = off"
            C Q UPDATE t SET v = 'a\'; COMMIT; --'
                deferred
            S C SET                  forward
            S S standard_conforming_strings off forward
            S Z I                    forward
            C Q UPDATE t SET v = 'a\'; COMMIT; --'
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 'a\\'; COMMIT; --'"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            C Q UPDATE t SET v = 'no backslash'
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 'no backslash'"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
        "#]],
    );
}

#[test]
fn a_function_call_is_checked_like_a_query() {
    check(
        "
        C F
        S 2
        S D '' NULL
        S C SELECT 1
        S Z I
        ",
        expect![[r#"
            C F
                → Bind "" any
                → Execute ""
                → FunctionCall
                → Sync
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S Z I                    forward
        "#]],
    );
}

#[test]
fn a_check_goes_ahead_of_a_plain_begin_but_after_one_with_modes() {
    // One check, after BEGIN in the string: ahead of the Query if the BEGIN is plain; in the
    // text if it has modes (which must come before any query of the transaction). With a
    // COMMIT in the string too, both checks go into the text.
    check(
        "
        C Q BEGIN; UPDATE t SET v = 1
        C Q ROLLBACK
        C Q BEGIN ISOLATION LEVEL REPEATABLE READ; UPDATE t SET v = 1
        C Q ROLLBACK
        C Q BEGIN; UPDATE t SET v = 1; COMMIT
        ",
        expect![[r#"
            C Q BEGIN; UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Query "BEGIN; UPDATE t SET v = 1"
                → Sync
            C Q ROLLBACK
                → Query "ROLLBACK"
            C Q BEGIN ISOLATION LEVEL REPEATABLE READ; UPDATE t SET v = 1
                → Query "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM fencing.check(1000, false); UPDATE t SET v = 1"
            C Q ROLLBACK
                → Query "ROLLBACK"
            C Q BEGIN; UPDATE t SET v = 1; COMMIT
                → Query "BEGIN; SELECT * FROM fencing.check(1000, false); UPDATE t SET v = 1; SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s; COMMIT"
        "#]],
    );
}

#[test]
fn a_sync_sent_with_copy_data_is_not_waited_for_once_the_copy_began() {
    // tokio-postgres: Bind, Execute and Sync of the COPY, then the data, CopyDone and Sync.
    // PostgreSQL ignores the first Sync in copy mode; had the COPY failed at once, it would
    // have answered both.
    check(
        "
        C P s COPY t FROM STDIN
        C S
        S 1
        S Z I
        C B - s
        C E -
        C S
        S 2
        S D '' NULL
        S C SELECT 1
        S 2
        S G
        C c
        C S
        S C COPY 1
        S 2
        S D '' NULL
        S C SELECT 1
        S Z I
        C Q SELECT 1
        ",
        expect![[r#"
            C P s COPY t FROM STDIN
                → Parse s "COPY t FROM STDIN"
            C S
                → Sync
            S 1                      forward
            S Z I                    forward
            C B - s
                → Bind "" any
                → Execute ""
                → Bind "" s
            C E -
                → Execute ""
            C S
                → Sync
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S 2                      forward
            S G                      forward
            C c
                → CopyDone
            C S
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            S C COPY 1               forward
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S Z I                    forward
            C Q SELECT 1
                → Parse  "SELECT 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" any at commit, ends
                → Execute ""
                → Sync
        "#]],
    );
}

#[test]
fn a_statement_that_declares_the_token_is_checked_right_after_itself() {
    // A check before it would see half a declaration (the resource, set by the SET) and
    // refuse it; the check after it sees what it declared, in its own transaction.
    check(
        "
        C Q SET fencing.resource = 'r'
        C P - SELECT set_config('fencing.token', $1, false)
        C B - -
        C E -
        C S
        C Q SELECT set_config('fencing.token', '5', false)
        C Q SELECT set_config('fencing.token', '5', false); UPDATE t SET v = 1
        ",
        expect![[r#"
            C Q SET fencing.resource = 'r'
                → Query "SET fencing.resource = 'r'"
            C P - SELECT set_config('fencing.token', $1, false)
                → Parse  "SELECT set_config('fencing.token', $1, false)"
            C B - -
                → Bind "" 
            C E -
                → Execute ""
                → Bind "__fence_proxy" any at commit
                → Execute "__fence_proxy"
                → Close Portal __fence_proxy
            C S
                → Bind "" any at commit, ends
                → Execute ""
                → Sync
            C Q SELECT set_config('fencing.token', '5', false)
                → Parse  "SELECT set_config('fencing.token', '5', false)"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" any at commit, ends
                → Execute ""
                → Sync
            C Q SELECT set_config('fencing.token', '5', false); UPDATE t SET v = 1
                → Query "SELECT set_config('fencing.token', '5', false); SELECT * FROM fencing.check(1000, false); UPDATE t SET v = 1\n;SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s"
        "#]],
    );
}

/// PostgreSQL sends a simple Query's last completion only once its implicit transaction has
/// committed; a commit refused by the check answers with the error alone (psql would otherwise
/// print `UPDATE 1` and then the error, and psycopg's `copy()` fails to read the tag). Both
/// forms: one statement (sent as extended-protocol messages) and several (the check in the
/// text).
#[test]
fn a_refused_commit_point_answers_with_the_error_alone() {
    check(
        "
        C Q SET fencing.resource = 'r'
        S C SET
        S Z I
        C Q UPDATE t SET v = 1
        S 2
        S D r 5
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S 2
        S E FN001
        S Z I
        C Q UPDATE t SET v = 1; UPDATE u SET v = 2
        S C UPDATE 1
        S C UPDATE 1
        S T
        S E FN001
        S Z I
        C Q UPDATE t SET v = 1; UPDATE u SET v = 2
        S C UPDATE 1
        S C UPDATE 1
        S T
        S D r 5
        S C SELECT 1
        S Z I
        ",
        expect![[r#"
            C Q SET fencing.resource = 'r'
                → Query "SET fencing.resource = 'r'"
            S C SET                  forward
            S Z I                    forward
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Sync
            S 2                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C UPDATE 1             hide
            S 2                      hide
            S E FN001                forward
            S Z I                    forward
            C Q UPDATE t SET v = 1; UPDATE u SET v = 2
                → Query "UPDATE t SET v = 1; UPDATE u SET v = 2\n;SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s"
            S C UPDATE 1             forward
            S C UPDATE 1             hide
            S T                      hide
            S E FN001                forward
            S Z I                    forward
            C Q UPDATE t SET v = 1; UPDATE u SET v = 2
                → Query "UPDATE t SET v = 1; UPDATE u SET v = 2\n;SELECT CASE WHEN s.u THEN NULL ELSE s.r END, CASE WHEN s.h THEN fencing.held_cursor() WHEN s.r OPERATOR(pg_catalog.=) '' AND s.t OPERATOR(pg_catalog.=) '' THEN NULL::pg_catalog.int8 WHEN s.u THEN NULL::pg_catalog.int8 ELSE fencing.check_token(1000) END FROM (SELECT q.r, q.t, true::pg_catalog.bool AND NOT (q.r OPERATOR(pg_catalog.=) '' AND q.t OPERATOR(pg_catalog.=) '') AND pg_catalog.pg_current_xact_id_if_assigned() IS NULL AS u, q.rc, true::pg_catalog.bool AND EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable) AS h FROM (SELECT COALESCE(pg_catalog.current_setting('fencing.resource', d.f), '') AS r, COALESCE(pg_catalog.current_setting('fencing.token', d.f), '') AS t, pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' AS rc FROM (SELECT CASE WHEN true::pg_catalog.bool THEN fencing.fire_deferred() ELSE true END AS f OFFSET 0) d) q) s"
            S C UPDATE 1             forward
            S C UPDATE 1             hide
            S T                      hide
            S D r 5                  hide
            S C SELECT 1             hide
            S Z I                    replace: C UPDATE 1, Z I
        "#]],
    );
}

/// A `COMMIT` whose check fails is skipped by PostgreSQL, and the transaction sits aborted
/// (ReadyForQuery `E`), where a `COMMIT` that fails in PostgreSQL ends it (`I`): the relay ends
/// it with a `ROLLBACK` of its own, hidden but for its ReadyForQuery; what the client sends
/// meanwhile waits for that. An implicit transaction is over already. A `COMMIT` of a
/// transaction that an error aborted gets no check (PostgreSQL answers it `ROLLBACK`).
#[test]
fn a_refused_commit_ends_its_transaction_as_a_failed_commit_does() {
    check(
        "
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 1
        S 2
        S D '' NULL
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S Z T
        C Q COMMIT
        S 2
        S C SELECT 1
        S 2
        S E FN001
        S Z E
        S C ROLLBACK
        S Z I
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 1
        S C UPDATE 1
        S Z T
        C P - COMMIT
        C B - -
        C E -
        C S
        C Q SELECT 1
        S 1
        S 2
        S E FN001
        S Z E
        S C ROLLBACK
        S Z I
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 1
        S E 22012
        S Z E
        C Q COMMIT
        S C ROLLBACK
        S Z I
        ",
        expect![[r#"
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C Q UPDATE t SET v = 1
                → Bind "" any
                → Execute ""
                → Parse  "UPDATE t SET v = 1"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            S 2                      hide
            S D '' NULL              hide
            S C SELECT 1             hide
            S 1                      hide
            S 2                      hide
            S n                      hide
            S C UPDATE 1             forward
            S Z T                    forward
            C Q COMMIT
                → Bind "" lock, ends
                → Execute ""
                → Bind "" fast at commit
                → Execute ""
                → Parse  "COMMIT"
                → Bind "" 
                → Describe { target: Portal, name: [] }
                → Execute ""
                → Sync
            S 2                      hide
            S C SELECT 1             hide
            S 2                      hide
            S E FN001                forward
            S Z E                    hide
                → Query "ROLLBACK" (the relay's own)
            S C ROLLBACK             hide
            S Z I                    forward
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C Q UPDATE t SET v = 1
                → Query "UPDATE t SET v = 1"
            S C UPDATE 1             forward
            S Z T                    forward
            C P - COMMIT
                → Parse  "COMMIT"
            C B - -
                → Bind "" any at commit, ends
                → Execute ""
                → Bind "" 
            C E -
                → Execute ""
            C S
                → Sync
            C Q SELECT 1
                deferred
            S 1                      forward
            S 2                      hide
            S E FN001                forward
            S Z E                    hide
                → Query "ROLLBACK" (the relay's own)
            S C ROLLBACK             hide
            S Z I                    forward
            C Q BEGIN
                → Query "BEGIN"
            S C BEGIN                forward
            S Z T                    forward
            C Q UPDATE t SET v = 1
                → Query "UPDATE t SET v = 1"
            S E 22012                forward
            S Z E                    forward
            C Q COMMIT
                → Query "COMMIT"
            S C ROLLBACK             forward
            S Z I                    forward
        "#]],
    );
}

#[test]
fn only_a_start_up_report_of_the_commit_hook_leaves_commit_points_to_postgresql() {
    // An autocommit write (checked before, the token not known current), then an explicit
    // transaction's write and COMMIT. With fence_hook reported at start-up in a database with
    // the check, no check goes at a commit point; every other way keeps them.
    let script = "
        C Q UPDATE t SET v = 1
        S Z I
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 2
        S C UPDATE 1
        S Z T
        C Q COMMIT
    ";
    let hook = ["S fence_hook.active on"];
    let trusted = run_after(Machine::new(1000), &hook, script, true);
    assert!(!trusted.contains("at commit"), "{trusted}");
    assert!(
        trusted.contains("Bind \"\" any"),
        "the check before stays: {trusted}"
    );
    // Without the report, and with a report of anything but `on`.
    for startup in [
        &[][..],
        &["S fence_hook.active off"],
        &["S fence_hook.active ON"],
    ] {
        let t = run_after(Machine::new(1000), startup, script, true);
        assert_eq!(t.matches("at commit").count(), 2, "{startup:?}: {t}");
    }
    // A report after start-up (the setting cannot change; whatever sends it later is not
    // the start-up of the session).
    let t = run(&format!("S S fence_hook.active on\n{script}"), true);
    assert_eq!(t.matches("at commit").count(), 2, "{t}");
    // In a database without the check: the bare form, at commit points too.
    let t = run_after(Machine::new(1000), &hook, script, false);
    assert_eq!(t.matches("bare at commit").count(), 2, "{t}");
    // On a listener that does not trust the report.
    let mut m = Machine::new(1000);
    m.ignore_hook();
    let t = run_after(m, &hook, script, true);
    assert_eq!(t.matches("at commit").count(), 2, "{t}");
}

#[test]
fn with_the_hook_a_current_tokens_check_before_is_one_call_of_the_hooks_check() {
    // The first write's check learns the token (5 for r); the check before the write of the
    // next, explicit, transaction (an implicit one's waits for its commit point, which the hook
    // judges) is, where the hook judges and its check exists here, the hook's check in C
    // alone: no lock and fast read.
    let script = "
        C Q UPDATE t SET v = 1
        S 2
        S D r 5
        S C SELECT 1
        S 1
        S 2
        S n
        S C UPDATE 1
        S Z I
        C Q BEGIN
        S C BEGIN
        S Z T
        C Q UPDATE t SET v = 2
    ";
    let hook = ["S fence_hook.active on"];
    let t = run_after(Machine::new(1000), &hook, script, true);
    let second = t.split("C Q UPDATE t SET v = 2").nth(1).unwrap();
    assert!(second.contains("Bind \"\" hooked"), "{t}");
    assert!(!second.contains("lock") && !second.contains("fast"), "{t}");
    // A database without the hook's check (an older installation, or one by a role that is
    // not a superuser): the probe's last Parse fails, the check is still installed, and the
    // check before is the lock and the fast read.
    let t = run_probed(
        Machine::new(1000),
        &hook,
        script,
        &["1", "1", "1", "1", "E 42883", "Z I"],
    );
    let second = t.split("C Q UPDATE t SET v = 2").nth(1).unwrap();
    assert!(
        second.contains("Bind \"\" lock") && second.contains("Bind \"\" fast"),
        "{t}"
    );
    assert!(!t.contains("bare"), "still installed: {t}");
    // Without the hook's report, never the hook's check.
    let t = run_after(Machine::new(1000), &[], script, true);
    assert!(!t.contains("hooked"), "{t}");
    // On a listener that does not trust the report, neither.
    let mut m = Machine::new(1000);
    m.ignore_hook();
    let t = run_after(m, &hook, script, true);
    assert!(!t.contains("hooked"), "{t}");
}
