//! Signed tokens in the PostgreSQL mode (invariant 10): PostgreSQL's own check verifies the
//! signature, so a token is refused (FN007) and the mark stays where it was, however the
//! session declared it: SET, set_config in a statement the proxy cannot see into, or a direct
//! connection to a protected table. And a poisoned mark lowered by hand, live.

use e2e::keys::{SECRET_A, SECRET_B, sign, write_key_file};
use e2e::pg::Postgres;
use e2e::raw::{Answer, Raw};
use fencing::signed::KeyState;

use crate::{Setup, mark, setup_with};

const R: &str = "inv:a";
const UPDATE: &str = "UPDATE stock SET n = n - 1 WHERE sku = 'a'";

/// A database with `stock` (n = 10) and a role `app` that is not a superuser, behind a proxy
/// that verifies with key `k2` (active) and knows `k1` as retired; `required`: the TOML list
/// of prefixes, or None for the default (every resource).
fn prepared(required: Option<&str>) -> Setup {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let file = write_key_file(
        dir.path(),
        "fence-keys.toml",
        &[
            ("k2", KeyState::Active, Some(SECRET_B)),
            ("k1", KeyState::Retired, None),
        ],
    );
    let required = required.map_or(String::new(), |r| format!("required_prefixes = {r}\n"));
    let extra = format!("[signing]\nkeys = \"{}\"\n{required}", file.display());
    let proxy = crate::start_proxy(&dir, &pg, 1000, &extra);
    let s = Setup { pg, proxy, dir };
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         CREATE ROLE app LOGIN; GRANT ALL ON stock TO app;
         CREATE FUNCTION app_fence(t text) RETURNS void LANGUAGE sql AS
           $$ SELECT set_config('fen' || 'cing.token', t, false) $$;
         GRANT EXECUTE ON FUNCTION app_fence(text) TO app;",
    );
    s
}

fn stock(s: &Setup) -> String {
    s.pg.psql("SELECT n FROM stock")
}

/// `UPDATE` as `app` through the proxy with `token` declared by SET.
fn write(s: &Setup, resource: &str, token: &str) -> Answer {
    let mut c = Raw::connect_as(s.addr(), "app", &[]);
    let set = c.simple(&format!(
        "SET fencing.resource = '{resource}'; SET fencing.token = '{token}'"
    ));
    assert!(set.errors.is_empty(), "{set:?}");
    c.simple(UPDATE)
}

fn refused(a: &Answer, why: &str) {
    assert_eq!(a.code(), "FN007", "{why}: {a:?}");
}

#[test]
fn forged_tokens_are_refused_by_postgresql_and_the_mark_does_not_move() {
    let s = prepared(None);
    let good = sign("k2", SECRET_B, R, 42);
    let a = write(&s, R, &good);
    assert!(a.errors.is_empty(), "the signed token: {a:?}");
    assert_eq!(mark(&s.pg, R), "42");

    let zeros = "0".repeat(64);
    let cases = [
        (
            format!("9223372036854775807.k2.{zeros}"),
            "i64::MAX, made up",
        ),
        (good.replacen("42.", "43.", 1), "the MAC of another token"),
        (sign("k2", SECRET_B, "inv:b", 100), "another resource's"),
        (sign("k1", SECRET_A, R, 100), "a retired key"),
        (sign("k9", SECRET_A, R, 100), "an unknown key"),
        ("100".to_string(), "unsigned"),
    ];
    for (token, why) in &cases {
        refused(&write(&s, R, token), why);
    }
    let retired = write(&s, R, &cases[3].0);
    assert!(retired.errors[0].1.contains("retired"), "{retired:?}");
    // A signed token is never shown whole, in the error or in the server's log: its MAC is cut
    // to 8 characters (it was shown whole before).
    let mac = cases[1].0.rsplit('.').next().unwrap();
    let shown = format!("{}…", &mac[..8]);
    let other = write(&s, R, &cases[1].0);
    let message = &other.errors[0].1;
    assert!(
        message.contains(&shown) && !message.contains(mac),
        "{message}"
    );
    // Nor in a malformed form that holds it (FN002): a character added, or a dot changed.
    for bent in [
        format!("{}x", cases[1].0),
        cases[1].0.replacen(".k2.", ".k2:", 1),
    ] {
        let a = write(&s, R, &bent);
        assert_eq!(a.code(), "FN002", "{a:?}");
        assert!(!a.errors[0].1.contains(mac), "{a:?}");
    }
    for part in ["ERROR", "DETAIL"] {
        let line = s.pg.wait_log(&format!("the {part} of the refusal"), |l| {
            l.contains(part) && l.contains(&shown)
        });
        assert!(!line.contains(mac), "{line}");
    }
    let unsigned = write(&s, R, "100");
    assert!(
        unsigned.errors[0]
            .1
            .contains("needs a token signed by lockd"),
        "{unsigned:?}"
    );
    // set_config by hand, in plain sight and inside a function the proxy cannot see into,
    // each in the statement before the write.
    let forged = format!("9223372036854775807.k2.{zeros}");
    for declare in [
        format!(
            "SELECT set_config('fencing.resource', '{R}', false), set_config('fencing.token', '{forged}', false)"
        ),
        format!("SELECT set_config('fencing.resource', '{R}', false), app_fence('{forged}')"),
    ] {
        let mut c = Raw::connect_as(s.addr(), "app", &[]);
        refused(&c.simple(&format!("{declare}; {UPDATE}")), &declare);
        let mut c = Raw::connect_as(s.addr(), "app", &[]);
        let a = c.simple(&declare);
        assert!(a.errors.is_empty(), "{a:?}");
        refused(&c.simple(UPDATE), &declare);
    }

    assert_eq!(mark(&s.pg, R), "42", "a forged token moved the mark");
    assert_eq!(stock(&s), "9", "a forged token wrote");
    // The keys are the check's alone: the application's role cannot read them to sign.
    let mut c = Raw::connect_as(s.addr(), "app", &[]);
    assert_eq!(c.simple("SELECT * FROM fencing.keys").code(), "42501");
    assert_eq!(
        c.simple(&format!("SELECT fencing.token_of('{R}', '5')"))
            .code(),
        "42501"
    );
    // The holder still writes; a newer signed grant raises the mark.
    assert!(write(&s, R, &good).errors.is_empty());
    assert!(write(&s, R, &sign("k2", SECRET_B, R, 43)).errors.is_empty());
    assert_eq!(mark(&s.pg, R), "43");
    assert_eq!(write(&s, R, &good).code(), "FN001");
}

/// The relay's fast path: after a signed token passed, the session swaps in the plain mark
/// where the proxy cannot see it. The proxy still believes the token current and uses its
/// fast read, which must not take the plain number for the signed one.
#[test]
fn a_plain_mark_swapped_in_behind_the_relays_back_is_refused() {
    let s = prepared(None);
    let good = sign("k2", SECRET_B, R, 42);
    let mut c = Raw::connect_as(s.addr(), "app", &[]);
    c.simple(&format!(
        "SET fencing.resource = '{R}'; SET fencing.token = '{good}'"
    ));
    for _ in 0..3 {
        let a = c.simple(UPDATE);
        assert!(a.errors.is_empty(), "{a:?}");
    }
    let a = c.simple("SELECT app_fence('42')");
    assert!(a.errors.is_empty(), "{a:?}");
    refused(
        &c.simple(UPDATE),
        "the plain mark, in an implicit transaction",
    );
    refused(
        &c.simple(&format!("BEGIN; {UPDATE}; COMMIT")),
        "the plain mark, in an explicit transaction",
    );
    assert_eq!(stock(&s), "7");
}

#[test]
fn protected_tables_verify_signatures_on_direct_connections_too() {
    let s = prepared(Some("[\"inv:\"]"));
    s.pg.psql("SELECT fencing.protect('stock', 'inv:')");
    let direct = format!("127.0.0.1:{}", s.pg.port);
    let declare = |token: &str| {
        let mut c = Raw::connect_as(&direct, "app", &[]);
        c.simple(&format!(
            "SET fencing.resource = '{R}'; SET fencing.token = '{token}'"
        ));
        c.simple(UPDATE)
    };
    refused(&declare("7"), "unsigned, direct");
    refused(
        &declare(&format!("7.k2.{}", "f".repeat(64))),
        "forged, direct",
    );
    let a = declare(&sign("k2", SECRET_B, R, 7));
    assert!(a.errors.is_empty(), "{a:?}");
    assert_eq!(mark(&s.pg, R), "7");
    // Outside the required prefixes, a plain token is still a token.
    s.pg.psql("CREATE TABLE other (n int); GRANT ALL ON other TO app");
    let mut c = Raw::connect_as(s.addr(), "app", &[]);
    c.simple("SET fencing.resource = 'other:x'; SET fencing.token = '3'");
    let a = c.simple("INSERT INTO other VALUES (1)");
    assert!(a.errors.is_empty(), "{a:?}");
}

/// The runbook for the PostgreSQL mode: the mark of a resource was raised by a forged token
/// (before signing was on); `fence-proxy marks lower` puts it back while the proxy runs, and
/// the holder writes again at once; the change is recorded in fencing.mark_changes.
#[test]
fn a_poisoned_mark_is_lowered_live_and_the_holder_writes_again() {
    let s = setup_with(Postgres::start(), 1000, "");
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         CREATE ROLE app LOGIN; GRANT ALL ON stock TO app;",
    );
    assert!(write(&s, R, "42").errors.is_empty());
    assert!(write(&s, R, "9223372036854775807").errors.is_empty());
    assert_eq!(write(&s, R, "42").code(), "FN001", "poisoned");
    let url = s.pg.url();
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(e2e::bin("fence-proxy"));
        cmd.args(["marks"])
            .args(args)
            .args(["--database-url", &url]);
        e2e::output(cmd)
    };
    let (st, out, err) = run(&["show", R]);
    assert!(st.success(), "{err}");
    assert!(out.contains("mark=9223372036854775807"), "{out}");
    let (st, out, err) = run(&[
        "lower",
        R,
        "--to",
        "42",
        "--force",
        "--by",
        "ops-bob",
        "--reason",
        "poisoned by a forged token",
    ]);
    assert!(st.success(), "{err}");
    assert!(out.contains("-> 42"), "{out}");
    assert_eq!(mark(&s.pg, R), "42");
    assert!(
        write(&s, R, "42").errors.is_empty(),
        "the holder writes again"
    );
    assert_eq!(write(&s, R, "41").code(), "FN001");
    assert_eq!(
        s.pg.psql("SELECT actor || '|' || reason || '|' || old_token || '|' || new_token FROM fencing.mark_changes"),
        "ops-bob (as postgres)|poisoned by a forged token|9223372036854775807|42"
    );
    let (st, _, err) = run(&["reset", R, "--reason", "x"]);
    assert_eq!(st.code(), Some(2), "reset without --force: {err}");
    assert_eq!(mark(&s.pg, R), "42");
}

/// A signing proxy relays to databases it did not install its keys in (a DBA's schema, an
/// older proxy's): PostgreSQL there could not verify a signature, so no token is taken there
/// at all; sessions without one still work.
#[test]
fn a_database_without_the_proxys_keys_takes_no_token() {
    let s = prepared(None);
    s.pg.psql("CREATE DATABASE other");
    crate::install_schema(&s.pg, "other");
    let other = format!("postgres://postgres@127.0.0.1:{}/other", s.pg.port);
    // Connect to `other` (a raw start-up packet: user and database only).
    let mut c = raw_to(s.addr(), "other");
    assert!(c.simple("CREATE TABLE t (n int)").errors.is_empty());
    let zeros = "0".repeat(64);
    for token in [format!("9223372036854775807.k2.{zeros}"), "5".to_string()] {
        let a = c.simple(&format!(
            "SET fencing.resource = '{R}'; SET fencing.token = '{token}'; INSERT INTO t VALUES (1)"
        ));
        assert_eq!(a.code(), "FN004", "{token}: {a:?}");
        c.simple("RESET fencing.resource; RESET fencing.token");
    }
    let a = c.simple("INSERT INTO t VALUES (2)");
    assert!(a.errors.is_empty(), "a session without a token: {a:?}");
    let marks = std::process::Command::new("psql")
        .args([&other, "-Atc", "SELECT count(*) FROM fencing.tokens"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&marks.stdout).trim(), "0");
}

/// A session without a token that takes a resource's fence lock by hand, exclusively, does not
/// keep the new holder out (it is ended after the fence wait), nor `marks reset`, which ends it
/// after its own wait (it failed with "held its fence lock" before issue 38).
#[test]
fn a_fence_lock_taken_by_hand_neither_blocks_the_holder_nor_the_admin_command() {
    let s = prepared(None);
    let direct = format!("127.0.0.1:{}", s.pg.port);
    let take = || {
        let mut blocker = Raw::connect_as(&direct, "app", &[]);
        let a = blocker.simple(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(fencing.lock_key('{R}'))"
        ));
        assert!(a.errors.is_empty(), "{a:?}");
        blocker
    };
    assert!(write(&s, R, &sign("k2", SECRET_B, R, 3)).errors.is_empty());
    let _blocker = take();
    let url = s.pg.url();
    let mut cmd = std::process::Command::new(e2e::bin("fence-proxy"));
    cmd.args([
        "marks",
        "reset",
        R,
        "--force",
        "--reason",
        "x",
        "--wait-ms",
        "200",
    ])
    .args(["--database-url", &url]);
    let (st, out, err) = e2e::output(cmd);
    assert!(st.success(), "{out}{err}");
    assert_eq!(
        s.pg.psql(&format!(
            "SELECT count(*) FROM fencing.tokens WHERE resource = '{R}'"
        )),
        "0"
    );
    // The holder's raise ends another such blocker (fence_wait_ms = 1000) and writes.
    let _blocker = take();
    let a = write(&s, R, &sign("k2", SECRET_B, R, 5));
    assert!(a.errors.is_empty(), "the holder: {a:?}");
    assert_eq!(mark(&s.pg, R), "5");
}

/// A raw session as `postgres` to `database`.
fn raw_to(addr: &str, database: &str) -> Raw {
    Raw::connect_startup(addr, &[("user", "postgres"), ("database", database)])
}

/// PostgreSQL takes the last of two `database` keys; the relay must not judge by the first.
#[test]
fn a_start_up_packet_with_two_databases_is_refused() {
    let s = prepared(None);
    let mut stream = std::net::TcpStream::connect(s.addr()).unwrap();
    let mut packet = Vec::new();
    pg_wire::msg::startup(
        &mut packet,
        &[
            (b"user", b"postgres"),
            (b"database", b"postgres"),
            (b"database", b"other"),
        ],
    );
    use std::io::Write;
    stream.write_all(&packet).unwrap();
    let got = crate::read_until(&mut stream, b'E');
    let (severity, code, message) = crate::error_of(&got);
    assert_eq!(
        (severity.as_str(), code.as_str()),
        ("FATAL", "08P01"),
        "{message}"
    );
    assert!(message.contains("twice"), "{message}");
}

/// The relay's fast read takes a signed token as the mark when it hashes to the signed form
/// that raised it. A key retired by another proxy in front of the same database (its start-up
/// installs the keys) must stop that at once, for sessions of this proxy too.
#[test]
fn a_key_retired_by_another_proxy_stops_the_fast_read_at_once() {
    let s = prepared(None);
    let good = sign("k2", SECRET_B, R, 42);
    let mut c = Raw::connect_as(s.addr(), "app", &[]);
    c.simple(&format!(
        "SET fencing.resource = '{R}'; SET fencing.token = '{good}'"
    ));
    for _ in 0..3 {
        let a = c.simple(UPDATE);
        assert!(a.errors.is_empty(), "{a:?}");
    }
    assert_eq!(
        s.pg.psql(&format!(
            "SELECT signed_hash IS NOT NULL FROM fencing.tokens WHERE resource = '{R}'"
        )),
        "t",
        "the raise stored the hash the fast read compares with"
    );
    // A second proxy, with k2 retired and k3 active.
    let dir = tempfile::tempdir().unwrap();
    let file = write_key_file(
        dir.path(),
        "fence-keys.toml",
        &[
            ("k3", KeyState::Active, Some(SECRET_A)),
            ("k2", KeyState::Retired, None),
        ],
    );
    let _other = crate::start_proxy(
        &dir,
        &s.pg,
        1000,
        &format!("[signing]\nkeys = \"{}\"\n", file.display()),
    );
    let a = c.simple(UPDATE);
    assert_eq!(
        a.code(),
        "FN007",
        "the retired key's token, through the first proxy: {a:?}"
    );
    assert!(a.errors[0].1.contains("retired"), "{a:?}");
}

/// Every way of declaring a token reaches the same verification inside PostgreSQL: a forged
/// signed token declared at start-up (options, or a start-up key of its own), with a bound
/// `set_config`, or as role and database defaults, is refused and moves nothing.
#[test]
fn a_forged_token_is_refused_however_it_is_declared() {
    let s = prepared(None);
    assert!(write(&s, R, &sign("k2", SECRET_B, R, 42)).errors.is_empty());
    let forged = format!("9223372036854775807.k2.{}", "0".repeat(64));
    let options = format!("-c fencing.resource={R} -c fencing.token={forged}");
    type Way<'a> = (&'static str, Box<dyn Fn() -> Answer + 'a>);
    let ways: Vec<Way> = vec![
        (
            "options",
            Box::new(|| Raw::connect_as(s.addr(), "app", &[("options", &options)]).simple(UPDATE)),
        ),
        (
            "start-up keys",
            Box::new(|| {
                Raw::connect_as(
                    s.addr(),
                    "app",
                    &[("fencing.resource", R), ("fencing.token", &forged)],
                )
                .simple(UPDATE)
            }),
        ),
        (
            "bound set_config",
            Box::new(|| {
                let mut c = Raw::connect_as(s.addr(), "app", &[]);
                c.batch(&[
                    (
                        "SELECT set_config('fencing.resource', $1, false), set_config('fencing.token', $2, false)",
                        &[R, forged.as_str()],
                    ),
                    (UPDATE, &[]),
                ])
            }),
        ),
        (
            "role defaults",
            Box::new(|| {
                s.pg.psql(&format!(
                    "ALTER ROLE app SET fencing.resource = '{R}'; ALTER ROLE app SET fencing.token = '{forged}'"
                ));
                let a = Raw::connect_as(s.addr(), "app", &[]).simple(UPDATE);
                s.pg.psql("ALTER ROLE app RESET ALL");
                a
            }),
        ),
        (
            "database defaults",
            Box::new(|| {
                s.pg.psql(&format!(
                    "ALTER DATABASE postgres SET fencing.resource = '{R}'; ALTER DATABASE postgres SET fencing.token = '{forged}'"
                ));
                let a = Raw::connect_as(s.addr(), "app", &[]).simple(UPDATE);
                s.pg.psql("ALTER DATABASE postgres RESET ALL");
                a
            }),
        ),
    ];
    for (way, write) in &ways {
        refused(&write(), way);
        assert_eq!(mark(&s.pg, R), "42", "{way}: the mark moved");
    }
    assert_eq!(stock(&s), "9", "a forged token wrote");
}
