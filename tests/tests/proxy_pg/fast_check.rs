//! fence_hook's fast check (proxy/pg-hook): at a commit, a READ COMMITTED transaction whose
//! token is its resource's mark passes in C, without the PL/pgSQL check; everything else goes
//! to the general check, which decides as before. These connect straight to PostgreSQL (the
//! hook judges every client, with or without the proxy) with `client_min_messages = debug1`,
//! under which the hook says when the fast check passed, and show that it passes only where
//! the general check would: never a stale token, a plain token where a signature is needed, a
//! signed token whose text is not the one that raised the mark, or a token whose raise is
//! still in progress; and that it finds the marks in a database whose collation orders them
//! otherwise than bytes do.

use e2e::keys::{SECRET_B, sign, write_key_file};
use e2e::pg::Postgres;
use e2e::raw::{Answer, Raw};
use fencing::signed::KeyState;

const R: &str = "inv:a";
const UPDATE: &str = "UPDATE stock SET n = n - 1 WHERE sku = 'a'";
const FAST: &str = "(the fast check)";

/// A PostgreSQL with the hook and the check, `stock` (n = 10) and the mark of inv:a at 100.
pub(crate) fn database() -> Postgres {
    let pg = Postgres::start_with_hook();
    crate::install_schema(&pg, "postgres");
    pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100)",
    );
    pg
}

/// A PostgreSQL (with the hook, or not), `stock` (n = 10), behind a proxy that installed the
/// check and key k2 (active); every resource needs a signature. The directory and the proxy
/// live as long as the test holds them.
fn signed(hook: bool) -> (Postgres, tempfile::TempDir, e2e::FenceProxy) {
    let pg = if hook {
        Postgres::start_with_hook()
    } else {
        Postgres::start()
    };
    let dir = tempfile::tempdir().unwrap();
    let file = write_key_file(
        dir.path(),
        "fence-keys.toml",
        &[("k2", KeyState::Active, Some(SECRET_B))],
    );
    let proxy = crate::start_proxy(
        &dir,
        &pg,
        1000,
        &format!("[signing]\nkeys = \"{}\"\n", file.display()),
    );
    pg.psql("CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10)");
    (pg, dir, proxy)
}

/// A session straight to PostgreSQL that hears the hook's DEBUG1 messages.
pub(crate) fn session(pg: &Postgres, db: &str) -> Raw {
    let port = pg.port.to_string();
    let mut c = Raw::connect(&format!("127.0.0.1:{port}"), &[("database", db)]);
    let a = c.simple("SET client_min_messages = debug1");
    assert!(a.errors.is_empty(), "{a:?}");
    c
}

pub(crate) fn declare(c: &mut Raw, resource: &str, token: &str) {
    let a = c.simple(&format!(
        "SET fencing.resource = '{resource}'; SET fencing.token = '{token}'"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
}

fn fast(a: &Answer) -> bool {
    a.notices.iter().any(|n| n.contains(FAST))
}

fn stock(pg: &Postgres) -> String {
    pg.psql("SELECT n FROM stock")
}

#[test]
fn the_fast_check_passes_the_mark_and_nothing_else() {
    let pg = database();
    let mut c = session(&pg, "postgres");

    // The mark, plain: passed in C.
    declare(&mut c, R, "100");
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty() && fast(&a), "the mark: {a:?}");
    assert_eq!(stock(&pg), "9");
    // The same number spelled with a leading zero is the same token to the general check.
    declare(&mut c, R, "0100");
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty() && fast(&a), "0100: {a:?}");

    // Stale: the general check refuses it.
    declare(&mut c, R, "99");
    let a = c.simple(UPDATE);
    assert_eq!(a.code(), "FN001", "{a:?}");
    assert!(!fast(&a), "{a:?}");
    assert_eq!(stock(&pg), "8");

    // Malformed, or half a declaration: refused, not passed.
    for (resource, token, code) in [
        (R, "1e2", "FN002"),
        (R, "100 ", "FN002"),
        (R, "+100", "FN002"),
        ("", "100", "FN002"),
        (R, "", "FN002"),
        ("inv a", "100", "FN002"),
    ] {
        declare(&mut c, resource, token);
        let a = c.simple(UPDATE);
        assert_eq!(a.code(), code, "{resource:?} {token:?}: {a:?}");
        assert!(!fast(&a), "{a:?}");
    }
    assert_eq!(stock(&pg), "8");

    // Under REPEATABLE READ the general check reads the mark FOR SHARE: not the fast one.
    declare(&mut c, R, "100");
    let a = c.simple(&format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; {UPDATE}; COMMIT"
    ));
    assert!(a.errors.is_empty() && !fast(&a), "{a:?}");

    // A higher token raises the mark in the general check (at the write; the commit then
    // finds it the mark); then it is the mark.
    declare(&mut c, R, "101");
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty(), "{a:?}");
    assert_eq!(crate::mark(&pg, R), "101");
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty() && fast(&a), "{a:?}");
    assert_eq!(stock(&pg), "5");

    // A plain token for a resource that needs a signed one is refused though it is the mark,
    // also where the transaction being judged is the one that says so.
    let a = c.simple("INSERT INTO fencing.signed_prefixes VALUES ('inv:')");
    assert_eq!(a.code(), "FN007", "{a:?}");
    pg.psql("INSERT INTO fencing.signed_prefixes VALUES ('inv:')");
    let a = c.simple(UPDATE);
    assert_eq!(a.code(), "FN007", "{a:?}");
    assert!(!fast(&a), "{a:?}");
    assert_eq!(stock(&pg), "5");
}

#[test]
fn a_signed_mark_passes_only_in_the_text_that_raised_it() {
    // A proxy with key k2 installs the check and the key; every resource needs a signature.
    let (pg, _dir, _proxy) = signed(true);
    let token = sign("k2", SECRET_B, R, 7);
    let mut c = session(&pg, "postgres");
    declare(&mut c, R, &token);
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty(), "the raise: {a:?}");
    assert_eq!(crate::mark(&pg, R), "7");
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty() && fast(&a), "the mark, signed: {a:?}");

    // The same number with its MAC altered, or signed for another resource: not the text
    // that raised the mark, so the general check verifies it and refuses it.
    let mut forged = token.clone().into_bytes();
    let last = forged.len() - 1;
    forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
    let forged = String::from_utf8(forged).unwrap();
    for t in [forged, sign("k2", SECRET_B, "inv:b", 7)] {
        declare(&mut c, R, &t);
        let a = c.simple(UPDATE);
        assert_eq!(a.code(), "FN007", "{t}: {a:?}");
        assert!(!fast(&a), "{a:?}");
    }
    // The plain number is refused too.
    declare(&mut c, R, "7");
    assert_eq!(c.simple(UPDATE).code(), "FN007");
    assert_eq!(stock(&pg), "8");

    // A key retired by hand, its hashes left in place (fence-proxy's installation clears
    // them): the fast check looks the key up, and the general check refuses the mark's text.
    pg.psql("UPDATE fencing.keys SET retired = true, ipad = NULL, opad = NULL WHERE key_id = 'k2'");
    assert_eq!(
        pg.psql("SELECT count(*) FROM fencing.tokens WHERE signed_hash IS NOT NULL"),
        "1"
    );
    declare(&mut c, R, &token);
    let a = c.simple(UPDATE);
    assert_eq!(a.code(), "FN007", "{a:?}");
    assert!(!fast(&a), "{a:?}");
    assert_eq!(stock(&pg), "8");
}

#[test]
fn a_raise_in_progress_keeps_the_fast_check_waiting_and_then_refuses() {
    let pg = database();
    // Session b raises the mark to 101 and keeps its transaction open: it holds the
    // resource's lock exclusively.
    let mut b = session(&pg, "postgres");
    declare(&mut b, R, "101");
    let a = b.simple("BEGIN; SELECT * FROM fencing.check(1000)");
    assert!(a.errors.is_empty(), "{a:?}");
    // Session a, with 100 (still the committed mark), writes: its write's check (the hook
    // judges a transaction's first write) waits for the lock, as the fast check does not pass
    // a token whose raise is under way.
    let mut a = session(&pg, "postgres");
    declare(&mut a, R, "100");
    let pid = a.simple("SELECT pg_backend_pid()").rows[0][0]
        .clone()
        .unwrap();
    assert!(a.simple("BEGIN").errors.is_empty());
    a.send_simple(UPDATE);
    pg.wait_until(
        "the write waiting for the fence lock",
        &format!(
            "SELECT count(*) FROM pg_locks WHERE pid = {pid} AND locktype = 'advisory' AND NOT granted"
        ),
        "1",
    );
    let done = b.simple("COMMIT");
    assert!(done.errors.is_empty(), "{done:?}");
    let w = a.read_answer();
    assert_eq!(w.code(), "FN001", "{w:?}");
    assert_eq!(stock(&pg), "10");
}

#[test]
fn the_fast_check_finds_marks_in_a_database_ordered_by_icu() {
    // An index ordered by ICU's en-US collation (case and punctuation second), which bytes do
    // not follow: a look-up in the wrong collation misses marks that are there.
    let pg = Postgres::start_with_hook();
    pg.psql(
        "CREATE DATABASE icu TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C' \
         LOCALE_PROVIDER icu ICU_LOCALE 'en-US'",
    );
    crate::install_schema(&pg, "icu");
    let names: Vec<String> = (0..300)
        .map(|i| {
            let stem = ["a", "B", "_c", "D-", "@e", "f.", "G:", "h/"][i % 8];
            format!("{stem}{}{}", i % 7, if i % 2 == 0 { "X" } else { "y" }) + &format!("-{i}")
        })
        .collect();
    let values: Vec<String> = names.iter().map(|n| format!("('{n}', 3)")).collect();
    let url = format!("postgres://postgres@127.0.0.1:{}/icu", pg.port);
    let out = std::process::Command::new("psql")
        .args([&url, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c"])
        .arg(format!(
            "CREATE TABLE t (n int); INSERT INTO fencing.tokens (resource, token) VALUES {}",
            values.join(", ")
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = session(&pg, "icu");
    let mut missed = Vec::new();
    for name in names.iter().step_by(7) {
        declare(&mut c, name, "3");
        let a = c.simple("INSERT INTO t VALUES (1)");
        assert!(a.errors.is_empty(), "{name}: {a:?}");
        if !fast(&a) {
            missed.push(name.clone());
        }
    }
    assert!(
        missed.is_empty(),
        "marks the fast check did not find: {missed:?}"
    );
}

/// Without any key, the general check takes a signed form's number unverified; a raise by such
/// a text stores no hash, so that once keys come the text is verified, not passed by the fast
/// check (an outside breaker's finding: a forged token went on committing after signing was
/// switched on by hand).
#[test]
fn a_signed_form_taken_without_keys_is_verified_once_keys_come() {
    let pg = database();
    let forged = format!("300.zz.{}", "ab".repeat(32));
    let mut c = session(&pg, "postgres");
    declare(&mut c, R, &forged);
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty(), "taken as 300 without keys: {a:?}");
    assert_eq!(
        pg.psql("SELECT token, signed_hash IS NULL FROM fencing.tokens WHERE resource = 'inv:a'"),
        "300|t"
    );
    pg.psql(
        "INSERT INTO fencing.keys (key_id, ipad, opad) \
         VALUES ('k9', decode(repeat('36', 64), 'hex'), decode(repeat('5c', 64), 'hex'))",
    );
    let a = c.simple(UPDATE);
    assert_eq!(a.code(), "FN007", "{a:?}");
    assert!(!fast(&a), "{a:?}");
    assert_eq!(stock(&pg), "9");
}

/// A raise verifies its signature, then may wait for the lock; a change of keys that commits
/// meanwhile (fence-proxy's installation retiring the key and clearing the hashes) is verified
/// against again before the raise writes its hash (an outside breaker's finding: the hash
/// written after the clearing let a retired key's token pass the fast check at every commit).
#[test]
fn a_key_retired_while_a_raise_waits_refuses_the_raise() {
    let (pg, _dir, _proxy) = signed(true);
    let five = sign("k2", SECRET_B, R, 5);
    let six = sign("k2", SECRET_B, R, 6);
    let mut x = session(&pg, "postgres");
    declare(&mut x, R, &five);
    assert!(x.simple(UPDATE).errors.is_empty());
    // x holds the resource's lock shared in an open transaction with the mark, 5.
    let a = x.simple(&format!(
        "BEGIN; {UPDATE}; SELECT * FROM fencing.check(1000)"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    // The raiser verifies 6 and waits for x (for a minute before it would end it).
    let mut raiser = session(&pg, "postgres");
    declare(&mut raiser, R, &six);
    let pid = raiser.simple("SELECT pg_backend_pid()").rows[0][0]
        .clone()
        .unwrap();
    raiser.send_simple("BEGIN; SELECT * FROM fencing.check(60000)");
    pg.wait_until(
        "the raise waiting for the fence lock",
        &format!(
            "SELECT count(*) FROM pg_locks WHERE pid = {pid} AND locktype = 'advisory' AND NOT granted"
        ),
        "1",
    );
    // What fence-proxy's installation runs for a key file that retires k2.
    pg.psql(
        "BEGIN; UPDATE fencing.keys SET retired = true, ipad = NULL, opad = NULL WHERE key_id = 'k2';
         UPDATE fencing.tokens SET signed_hash = NULL WHERE signed_hash IS NOT NULL; COMMIT",
    );
    let a = x.simple("COMMIT");
    assert_eq!(a.code(), "FN007", "x, its key retired: {a:?}");
    let a = raiser.read_answer();
    assert_eq!(
        a.code(),
        "FN007",
        "the raise, its key retired meanwhile: {a:?}"
    );
    raiser.simple("ROLLBACK");
    assert_eq!(
        pg.psql("SELECT token, signed_hash IS NULL FROM fencing.tokens WHERE resource = 'inv:a'"),
        "5|t"
    );
    declare(&mut raiser, R, &six);
    let a = raiser.simple(UPDATE);
    assert_eq!(a.code(), "FN007", "{a:?}");
    assert_eq!(stock(&pg), "9");
}

/// A signed mark's hash is passed only under the version of the keys it was verified under: a
/// key's secret changed by hand (same id, hashes left in place) sends the mark's text to the
/// general check, which verifies it under the new secret and refuses it, in the commit hook's
/// fast check and in the relay's fast read alike.
#[test]
fn a_signed_mark_is_not_passed_once_the_keys_change() {
    for hook in [true, false] {
        let (pg, _dir, proxy) = signed(hook);
        let token = sign("k2", SECRET_B, R, 7);
        let mut c = if hook {
            session(&pg, "postgres")
        } else {
            Raw::connect(&proxy.pg[0], &[])
        };
        declare(&mut c, R, &token);
        for _ in 0..2 {
            let a = c.simple(UPDATE);
            assert!(a.errors.is_empty(), "hook {hook}: {a:?}");
        }
        if hook {
            assert!(fast(&c.simple(UPDATE)), "hook: the mark passes in C");
        }
        // Under session_replication_role = replica, as a restore with triggers disabled or
        // logical replication's apply writes: the version's triggers fire all the same.
        pg.psql_each(&[
            "SET session_replication_role = replica",
            "UPDATE fencing.keys SET ipad = decode(repeat('36', 64), 'hex'), \
             opad = decode(repeat('5c', 64), 'hex') WHERE key_id = 'k2'",
        ]);
        assert_eq!(
            pg.psql("SELECT count(*) FROM fencing.tokens WHERE signed_hash IS NOT NULL"),
            "1"
        );
        let a = c.simple(UPDATE);
        assert_eq!(a.code(), "FN007", "hook {hook}: {a:?}");
        assert!(!fast(&a), "{a:?}");
        assert_eq!(stock(&pg), if hook { "7" } else { "8" }, "hook {hook}");
    }
}

/// A REPEATABLE READ transaction judges by the keys and prefixes of its snapshot; when they
/// changed since, the commit hook refuses it (40001, to be retried) rather than judge by keys
/// that are no longer the fence's (an outside breaker's finding: a prefix added, or a key
/// retired, while such a transaction was open, and its write committed).
#[test]
fn a_snapshot_older_than_the_keys_is_refused() {
    let pg = database();
    let mut c = session(&pg, "postgres");
    declare(&mut c, R, "100");
    let a = c.simple("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM stock");
    assert!(a.errors.is_empty(), "{a:?}");
    pg.psql("INSERT INTO fencing.signed_prefixes VALUES ('inv:')");
    let a = c.simple(&format!("{UPDATE}; COMMIT"));
    assert_eq!(a.code(), "40001", "{a:?}");
    c.simple("ROLLBACK");
    assert_eq!(stock(&pg), "10");
    // Retried, under the keys now in force: the plain token needs a signature.
    let a = c.simple(&format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; {UPDATE}; COMMIT"
    ));
    assert_eq!(a.code(), "FN007", "{a:?}");
    c.simple("ROLLBACK");
    // A snapshot taken after the change is judged as before.
    pg.psql("DELETE FROM fencing.signed_prefixes");
    let a = c.simple(&format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; {UPDATE}; COMMIT"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    assert_eq!(stock(&pg), "9");
}

/// Through fence-proxy with the hook, the check before an explicit transaction's first write
/// (a token the proxy believes current) is one call of the hook's check in C, which the
/// schema created from the loaded library; and it still refuses, before the write, a token
/// that went stale where the proxy could not see (a raise straight to PostgreSQL), so that
/// the stale transaction takes no row lock a paused client could keep.
#[test]
fn the_check_before_an_explicit_transaction_is_the_hooks_through_the_proxy() {
    // Without a pool and through the pool (whose own probe prepares the statements).
    for pool in ["", "pool_size = 2\npool_auth = \"trust\"\n"] {
        let pg = database();
        assert_eq!(
            pg.psql(
                "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang \
                 WHERE p.oid = 'fencing.hook_check(integer)'::regprocedure"
            ),
            "c"
        );
        pg.psql_each(&[
            "ALTER SYSTEM SET log_statement = 'all'",
            "SELECT pg_reload_conf()",
        ]);
        let dir = tempfile::tempdir().unwrap();
        let proxy = crate::start_proxy(&dir, &pg, 1000, pool);
        let mut c = Raw::connect(&proxy.pg[0], &[]);
        declare(&mut c, R, "100");
        assert!(c.simple(UPDATE).errors.is_empty());
        for sql in ["BEGIN", UPDATE, "COMMIT"] {
            let a = c.simple(sql);
            assert!(a.errors.is_empty(), "{pool:?} {sql}: {a:?}");
        }
        let log = pg.wait_log("the hook's check run by the proxy", |log| {
            log.contains("execute __fence_proxy_hooked")
        });
        assert!(
            !log.contains("execute __fence_proxy_lock"),
            "{pool:?}: the lock statement ran: {log}"
        );
        // A raise the proxy does not see.
        let mut d = session(&pg, "postgres");
        declare(&mut d, R, "101");
        assert!(d.simple(UPDATE).errors.is_empty());
        assert!(c.simple("BEGIN").errors.is_empty());
        let a = c.simple(UPDATE);
        assert_eq!(a.code(), "FN001", "{pool:?}: {a:?}");
        c.simple("ROLLBACK");
        assert_eq!(stock(&pg), "7", "{pool:?}");
    }
}

/// A proxy that starts with the same key file installs nothing new: the version of the keys
/// stays, the signed mark keeps its fast path, and a REPEATABLE READ transaction open across
/// the start commits (a third outside breaker's finding: every start raised the version, so
/// every rollout of sidecar proxies failed the open transactions with 40001).
#[test]
fn a_proxy_started_with_the_same_keys_changes_nothing() {
    let pg = Postgres::start_with_hook();
    let dir = tempfile::tempdir().unwrap();
    let file = write_key_file(
        dir.path(),
        "fence-keys.toml",
        &[
            ("k2", KeyState::Active, Some(SECRET_B)),
            ("k1", KeyState::Retired, None),
        ],
    );
    let signing = format!(
        "[signing]\nkeys = \"{}\"\nrequired_prefixes = [\"inv:\", \"pay:\"]\n",
        file.display()
    );
    let _first = crate::start_proxy(&dir, &pg, 1000, &signing);
    pg.psql("CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10)");
    let token = sign("k2", SECRET_B, R, 7);
    let mut c = session(&pg, "postgres");
    declare(&mut c, R, &token);
    assert!(c.simple(UPDATE).errors.is_empty());
    let version = pg.psql("SELECT v FROM fencing.keys_version");
    let a = c.simple("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM stock");
    assert!(a.errors.is_empty(), "{a:?}");
    let other = tempfile::tempdir().unwrap();
    let _second = crate::start_proxy(&other, &pg, 1000, &signing);
    assert_eq!(pg.psql("SELECT v FROM fencing.keys_version"), version);
    let a = c.simple(&format!("{UPDATE}; COMMIT"));
    assert!(a.errors.is_empty(), "{a:?}");
    let a = c.simple(UPDATE);
    assert!(a.errors.is_empty() && fast(&a), "the hash kept: {a:?}");
    assert_eq!(stock(&pg), "7");
}

/// With the hook, a transaction holds its resource's fence lock from its first write, however
/// its client sends its statements, so that a client paused with row locks is ended by a newer
/// token's raise (an outside breaker's finding: an implicit transaction through the proxy, its
/// check left for the commit point, paused in a COPY whose data never came, or in an
/// extended-protocol batch never synced, held its row lock with no fence lock, and the newer
/// holder waited for ever). Through the proxy and straight to PostgreSQL.
#[test]
fn a_client_paused_inside_an_implicit_transaction_is_ended_by_a_newer_token() {
    let pg = database();
    pg.psql("ALTER TABLE stock ADD COLUMN note text");
    let dir = tempfile::tempdir().unwrap();
    let proxy = crate::start_proxy(&dir, &pg, 1000, "");
    let direct = format!("127.0.0.1:{}", pg.port);
    pg.psql("CREATE MATERIALIZED VIEW stock_view AS SELECT * FROM stock");
    let mut mark = 100;
    for (how, addr) in [
        ("copy", &proxy.pg[0]),
        ("unsynced", &proxy.pg[0]),
        ("copy", &direct),
        ("unsynced", &direct),
        ("lock", &direct),
        ("refresh", &direct),
    ] {
        let mut zombie = Raw::connect(addr, &[]);
        declare(&mut zombie, R, &mark.to_string());
        // The proxy learns the token current.
        assert!(zombie.simple(UPDATE).errors.is_empty(), "{how} {addr}");
        match how {
            "copy" => zombie.send_simple(&format!("{UPDATE}; COPY stock (sku) FROM STDIN")),
            "lock" => {
                assert!(zombie.simple("BEGIN").errors.is_empty());
                zombie.send_unsynced("LOCK TABLE stock IN EXCLUSIVE MODE")
            }
            "refresh" => zombie.send_unsynced("REFRESH MATERIALIZED VIEW stock_view"),
            _ => zombie.send_unsynced(UPDATE),
        }
        // The zombie holds what its statement took (a row, a table) and sends nothing more.
        let held = match how {
            "lock" => "SELECT count(*) FROM pg_locks WHERE locktype = 'relation' \
                       AND relation = 'stock'::regclass AND mode = 'ExclusiveLock' AND granted"
                .to_string(),
            _ => format!(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' \
                 AND a.query LIKE '{}%' AND a.backend_type = 'client backend'",
                if how == "refresh" {
                    "REFRESH"
                } else {
                    "UPDATE stock"
                }
            ),
        };
        pg.wait_until("the zombie's statement to hold its locks", &held, "1");
        mark += 1;
        // A table lock is waited for while the newer statement is parsed, before any check of
        // the hook's can run: the newer holder's check must come first, as fence-proxy sends
        // it (docs/fence-proxy.md, "The commit hook").
        let newer_addr = if matches!(how, "lock" | "refresh") {
            &proxy.pg[0]
        } else {
            addr
        };
        let mut newer = Raw::connect(newer_addr, &[]);
        let a = newer.simple("SET lock_timeout = '60s'");
        assert!(a.errors.is_empty());
        declare(&mut newer, R, &mark.to_string());
        let a = newer.simple(UPDATE);
        assert!(
            a.errors.is_empty(),
            "{how} {addr}: the newer token waited: {a:?}"
        );
        assert_eq!(crate::mark(&pg, R), mark.to_string(), "{how} {addr}");
    }
}
