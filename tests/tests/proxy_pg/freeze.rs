//! A session without a token cannot freeze a resource (issue 38). As an ordinary role, through
//! the proxy, it takes the resource's fence lock at session level and the two-key locks with
//! which transactions announce their token, announcing the largest one, and sits idle. Its
//! announcement proves nothing (`fencing.holders`: a real one carries a lock on a MAC no
//! application role can compute): the newer holder ends it after the fence wait and writes,
//! and `fence-proxy marks lower` ends it and lowers the mark. Through the proxy of 33166a7
//! the holder waited until its statement_timeout, and `marks lower` failed. A transaction that
//! really announced a newer token is still waited for.

use e2e::raw::Raw;

use crate::{Setup, mark, setup};

const R: &str = "inv:a";
const UPDATE: &str = "UPDATE stock SET n = n - 1 WHERE sku = 'a'";

/// `stock` (n = 10), a role `app` with no privileges but on it, and the mark of `inv:a` at 100.
fn prepared() -> Setup {
    let s = setup(300);
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         CREATE ROLE app LOGIN; GRANT ALL ON stock TO app;
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100);",
    );
    s
}

/// The forger: as `app`, through the proxy, the fence lock of `inv:a` at session level and an
/// announcement of the largest token, held by an idle session.
fn forge(s: &Setup, lock: &str) -> Raw {
    let mut c = Raw::connect_as(s.addr(), "app", &[]);
    let a = c.simple(&format!(
        "SELECT {lock}(fencing.lock_key('{R}')), \
         pg_advisory_lock_shared(fencing.signed32(fencing.lock_key('{R}') >> 32), \
                                 fencing.signed32(9223372036854775807 & 4294967295)), \
         pg_advisory_lock_shared(fencing.signed32(fencing.lock_key('{R}') & 4294967295), \
                                 (9223372036854775807 >> 32)::integer)"
    ));
    assert!(a.errors.is_empty(), "the forger: {a:?}");
    c
}

/// A session of `postgres` through the proxy with `token` for `inv:a`, bounded by a statement
/// timeout so that a freeze fails the test instead of hanging it.
fn holder(s: &Setup, token: &str) -> Raw {
    let mut c = Raw::connect(s.addr(), &[]);
    let a = c.simple(&format!(
        "SET statement_timeout = '20s'; SET fencing.resource = '{R}'; SET fencing.token = '{token}'"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    c
}

/// `fence-proxy marks lower R --to 50`, waiting 200 ms for the fence lock: its exit status,
/// stdout and stderr.
fn marks_lower(s: &Setup) -> (std::process::ExitStatus, String, String) {
    let mut cmd = std::process::Command::new(e2e::bin("fence-proxy"));
    cmd.args(["marks", "lower", R, "--to", "50", "--force", "--by", "ops"])
        .args([
            "--reason",
            "a test",
            "--wait-ms",
            "200",
            "--database-url",
            &s.pg.url(),
        ]);
    e2e::output(cmd)
}

#[test]
fn a_forged_announcement_does_not_keep_the_newer_holder_waiting() {
    for lock in ["pg_advisory_lock", "pg_advisory_lock_shared"] {
        let s = prepared();
        let _forger = forge(&s, lock);
        let a = holder(&s, "101").simple(UPDATE);
        assert!(a.errors.is_empty(), "the newer holder ({lock}): {a:?}");
        assert_eq!(mark(&s.pg, R), "101");
        assert_eq!(s.pg.psql("SELECT n FROM stock"), "9");
    }
}

#[test]
fn marks_lower_works_on_a_resource_held_by_a_forged_announcement() {
    let s = prepared();
    let _forger = forge(&s, "pg_advisory_lock");
    let (st, out, err) = marks_lower(&s);
    assert!(st.success(), "{out}{err}");
    assert_eq!(mark(&s.pg, R), "50");
}

/// A real announcement is still believed: a transaction that raised the mark to 105 and is
/// still open keeps `marks lower` out (it says so), and its commit stands.
#[test]
fn a_proved_announcement_is_still_waited_for() {
    let s = prepared();
    let mut raiser = holder(&s, "105");
    let a = raiser.simple(&format!("BEGIN; {UPDATE}"));
    assert!(a.errors.is_empty(), "{a:?}");
    let (st, _, err) = marks_lower(&s);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains("with a proved token held its fence lock"),
        "{err}"
    );
    let a = raiser.simple("COMMIT");
    assert!(a.errors.is_empty(), "{a:?}");
    assert_eq!(mark(&s.pg, R), "105");
}

/// Every role may read `fencing.tokens`, so any session can hold it (found by an outside
/// breaker: the installation of a proxy starting meanwhile queued for the table exclusively,
/// and every session that needed the marks queued behind it, for as long as that session
/// stayed). The installation takes no lock on it when nothing changes: a new proxy starts, and
/// sessions through both write.
#[test]
fn a_session_holding_the_marks_table_holds_up_no_installation() {
    let s = prepared();
    let mut reader = Raw::connect_as(s.addr(), "app", &[]);
    let a = reader.simple("BEGIN; LOCK TABLE fencing.tokens IN ACCESS SHARE MODE");
    assert!(a.errors.is_empty(), "{a:?}");
    let again = crate::start_proxy(&s.dir, &s.pg, 300, "");
    let mut through_new = Raw::connect(&again.pg[0], &[]);
    let a = through_new.simple(&format!(
        "SET statement_timeout = '20s'; SET fencing.resource = '{R}'; SET fencing.token = '101'"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    let a = through_new.simple(UPDATE);
    assert!(a.errors.is_empty(), "{a:?}");
    let a = holder(&s, "101").simple(UPDATE);
    assert!(a.errors.is_empty(), "{a:?}");
    assert_eq!(mark(&s.pg, R), "101");
}

/// A prepared transaction keeps its locks after its session, and no session can end it: with
/// the commit hook, one that holds a fence lock (taken by hand, as an ordinary role, through
/// the proxy) is not prepared (an outside breaker froze a resource so), and the newer holder
/// writes.
#[test]
fn with_the_hook_no_transaction_holding_a_fence_lock_is_prepared() {
    let mut pg = e2e::pg::Postgres::start_with_hook();
    pg.psql_each(&["ALTER SYSTEM SET max_prepared_transactions = 5"]);
    pg.restart();
    let s = crate::setup_with(pg, 300, "");
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         CREATE ROLE app LOGIN; GRANT ALL ON stock TO app;
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100);",
    );
    let mut c = Raw::connect_as(s.addr(), "app", &[]);
    let a = c.simple(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock(fencing.lock_key('{R}'))"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    let a = c.simple("PREPARE TRANSACTION 'frozen'");
    assert_eq!(a.code(), "0A000", "{a:?}");
    assert_eq!(s.pg.psql("SELECT count(*) FROM pg_prepared_xacts"), "0");
    let a = holder(&s, "101").simple(UPDATE);
    assert!(a.errors.is_empty(), "{a:?}");
}

/// A transaction whose commit check takes the fence lock (a client with a token, straight to
/// PostgreSQL) is not prepared either: the hook refuses after its check, not before it (an
/// outside breaker's finding: the prepared transaction kept the lock, and a raise waited on
/// it until `COMMIT PREPARED`).
#[test]
fn with_the_hook_a_fenced_transaction_is_not_prepared() {
    let mut pg = e2e::pg::Postgres::start_with_hook();
    pg.psql_each(&["ALTER SYSTEM SET max_prepared_transactions = 5"]);
    pg.restart();
    let s = crate::setup_with(pg, 300, "");
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100);",
    );
    let direct = format!("127.0.0.1:{}", s.pg.port);
    let mut c = Raw::connect(
        &direct,
        &[("options", "-c fencing.resource=inv:a -c fencing.token=100")],
    );
    let a = c.simple(&format!("BEGIN; {UPDATE}"));
    assert!(a.errors.is_empty(), "{a:?}");
    let a = c.simple("PREPARE TRANSACTION 'fenced'");
    assert_eq!(a.code(), "0A000", "{a:?}");
    assert_eq!(s.pg.psql("SELECT count(*) FROM pg_prepared_xacts"), "0");
    let a = holder(&s, "101").simple(UPDATE);
    assert!(a.errors.is_empty(), "{a:?}");
}

/// Without the hook nothing refuses a prepared transaction a fence lock: a server that allows
/// prepared transactions is refused at the installation (fence-proxy does not start), unless
/// the database accepts that.
#[test]
fn without_the_hook_a_server_that_allows_prepared_transactions_is_refused_unless_accepted() {
    let mut pg = e2e::pg::Postgres::start();
    pg.psql_each(&["ALTER SYSTEM SET max_prepared_transactions = 5"]);
    pg.restart();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\nschema_wait_ms = 0\n",
        pg.port,
        pg.url()
    );
    let mut p = e2e::FenceProxy::spawn(dir.path(), &config);
    assert_eq!(p.wait().code(), Some(1), "{}", p.stderr.text());
    assert!(
        p.stderr.text().contains("allows prepared transactions"),
        "{}",
        p.stderr.text()
    );
    pg.psql("ALTER DATABASE postgres SET fencing.allow_prepared_transactions = on");
    let s = crate::setup_with(pg, 300, "");
    assert_eq!(s.pg.psql("SELECT count(*) FROM fencing.tokens"), "0");
}

/// Any role can compute the keys with which the next tokens will be announced, and those of
/// `marks lower`'s announcement, and hold them exclusively (a second breaker's finding: the
/// newer holder waited on its announcement for ever, and `marks lower` failed). A session that
/// holds an announcement key exclusively is ended.
#[test]
fn holding_the_announcement_keys_keeps_no_announcement_out() {
    let s = prepared();
    let mut forger = Raw::connect_as(s.addr(), "app", &[]);
    let a = forger.simple(&format!(
        "SELECT pg_advisory_lock(fencing.signed32(fencing.lock_key('{R}') >> 32), t) \
         FROM generate_series(101, 110) t; \
         SELECT pg_advisory_lock(fencing.signed32(fencing.lock_key('{R}') >> 32), -1)"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    let a = holder(&s, "101").simple(UPDATE);
    assert!(a.errors.is_empty(), "the newer holder: {a:?}");
    assert_eq!(mark(&s.pg, R), "101");
    let mut forger = Raw::connect_as(s.addr(), "app", &[]);
    let a = forger.simple(&format!(
        "SELECT pg_advisory_lock(fencing.signed32(fencing.lock_key('{R}') >> 32), -1)"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    let (st, out, err) = marks_lower(&s);
    assert!(st.success(), "{out}{err}");
    assert_eq!(mark(&s.pg, R), "50");
}

/// The installation takes its turn by a lock no application role may take once the schema
/// exists, and replaces no view that readers may hold (a second breaker kept every proxy from
/// starting with an advisory lock on the installer's key, or by reading
/// `fencing.protected_tables` in an open transaction).
#[test]
fn no_role_can_keep_a_proxy_from_starting() {
    let s = prepared();
    let mut squatter = Raw::connect_as(s.addr(), "app", &[]);
    let a = squatter.simple(
        "SELECT pg_advisory_lock(1178946114); BEGIN; \
         SELECT count(*) FROM fencing.protected_tables; SELECT count(*) FROM fencing.signed_prefixes",
    );
    assert!(a.errors.is_empty(), "{a:?}");
    let again = crate::start_proxy(&s.dir, &s.pg, 300, "");
    let mut c = Raw::connect(&again.pg[0], &[]);
    let a = c.simple(&format!(
        "SET fencing.resource = '{R}'; SET fencing.token = '101'; {UPDATE}"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
}

/// The current holder shares the resource's lock: a session that holds it exclusively, by
/// hand, kept every transaction with the current token waiting for ever, the relay's fast path
/// and the general check alike. It is ended after the fence wait.
#[test]
fn a_lock_held_by_hand_does_not_keep_the_current_holder_waiting() {
    let s = prepared();
    let mut current = holder(&s, "100");
    assert!(current.simple(UPDATE).errors.is_empty());
    for lock in ["pg_advisory_lock", "pg_advisory_xact_lock"] {
        let mut squatter = Raw::connect_as(s.addr(), "app", &[]);
        let a = squatter.simple(&format!("BEGIN; SELECT {lock}(fencing.lock_key('{R}'))"));
        assert!(a.errors.is_empty(), "{a:?}");
        // The relay believes the token current: its fast path.
        let a = current.simple(UPDATE);
        assert!(a.errors.is_empty(), "the current holder ({lock}): {a:?}");
    }
    // A new session, judged by the general check.
    let _squatter = forge(&s, "pg_advisory_lock");
    let a = holder(&s, "100").simple(UPDATE);
    assert!(a.errors.is_empty(), "{a:?}");
    assert_eq!(s.pg.psql("SELECT n FROM stock"), "6");
    assert_eq!(mark(&s.pg, R), "100");
}

/// PostgreSQL queues every later shared request behind a waiting exclusive one: a session kept
/// waiting for the lock exclusively, by hand, behind another that shares it, froze the current
/// holder, a newer one and `marks lower` (a third breaker's finding). Waiting exclusive
/// requests that prove no token are ended as holders are.
#[test]
fn a_request_kept_waiting_by_hand_keeps_nobody_out() {
    let s = prepared();
    let direct = format!("127.0.0.1:{}", s.pg.port);
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let queue = || {
        let mut sharer = Raw::connect_as(&direct, "app", &[]);
        let a = sharer.simple(&format!(
            "SELECT pg_advisory_lock_shared(fencing.lock_key('{R}'))"
        ));
        assert!(a.errors.is_empty(), "{a:?}");
        let mut queued = Raw::connect_as(&direct, "app", &[]);
        queued.send_simple(&format!("SELECT pg_advisory_lock(fencing.lock_key('{R}'))"));
        s.pg.wait_until("the request to wait", waiting, "1");
        (sharer, queued)
    };
    let _in_the_way = queue();
    let a = holder(&s, "100").simple(UPDATE);
    assert!(a.errors.is_empty(), "the current holder: {a:?}");
    let _in_the_way = queue();
    let a = holder(&s, "101").simple(UPDATE);
    assert!(a.errors.is_empty(), "the newer holder: {a:?}");
    assert_eq!(mark(&s.pg, R), "101");
    let _in_the_way = queue();
    let (st, out, err) = marks_lower(&s);
    assert!(st.success(), "{out}{err}");
    assert_eq!(mark(&s.pg, R), "50");
}

/// The key of an announcement's proof cannot be computed, but it can be read in pg_locks while
/// the announcement holds it, and the same session announces the same token under the same
/// key: held exclusively by hand, it froze that session's next announcement (a third breaker's
/// finding). Such a holder is ended.
#[test]
fn a_copied_proof_key_keeps_no_announcement_waiting() {
    let s = prepared();
    let direct = format!("127.0.0.1:{}", s.pg.port);
    let mut h = holder(&s, "0100");
    let pid = h.simple("SELECT pg_backend_pid()").rows[0][0]
        .clone()
        .unwrap();
    // A read-only transaction with the token announces it (the general check: "0100" is not
    // the fast path's spelling of the mark).
    let a = h.simple("BEGIN READ ONLY; SELECT n FROM stock");
    assert!(a.errors.is_empty(), "{a:?}");
    let key = s.pg.psql(&format!(
        "SELECT (classid::text::bigint << 32) | objid::text::bigint FROM pg_locks \
         WHERE pid = {pid} AND locktype = 'advisory' AND objsubid = 1 \
         AND ((classid::text::bigint << 32) | objid::text::bigint) <> fencing.lock_key('{R}')"
    ));
    assert!(
        !key.is_empty() && !key.contains('\n'),
        "the proof key: {key:?}"
    );
    assert!(h.simple("COMMIT").errors.is_empty());
    let mut copier = Raw::connect_as(&direct, "app", &[]);
    let a = copier.simple(&format!("SELECT pg_advisory_lock({key})"));
    assert!(a.errors.is_empty(), "{a:?}");
    let a = h.simple("BEGIN READ ONLY; SELECT n FROM stock");
    assert!(a.errors.is_empty(), "the holder's next announcement: {a:?}");
    assert!(h.simple("COMMIT").errors.is_empty());
}

/// The proofs of a holder's announcements are tried pair by pair: a session with thousands of
/// announcement-shaped locks made each judgement take seconds (a fourth breaker measured 25 s
/// per write with 1,500 of each half). More of them than a check takes prove nothing.
#[test]
fn a_pile_of_announcement_shaped_locks_proves_nothing() {
    let s = prepared();
    let direct = format!("127.0.0.1:{}", s.pg.port);
    let mut pile = Raw::connect_as(&direct, "app", &[]);
    let a = pile.simple(&format!(
        "SELECT count(pg_advisory_lock_shared(fencing.signed32(fencing.lock_key('{R}') >> 32), i)) \
         FROM generate_series(1, 1200) i; \
         SELECT count(pg_advisory_lock_shared(fencing.signed32(fencing.lock_key('{R}')), i)) \
         FROM generate_series(1, 1200) i; \
         SELECT pg_advisory_lock(fencing.lock_key('{R}'))"
    ));
    assert!(a.errors.is_empty(), "{a:?}");
    // Judged as proving nothing, without trying 1.4 million pairs.
    let holders = s.pg.psql(&format!(
        "SET statement_timeout = '5s'; SELECT count(*) FROM fencing.holders('{R}') WHERE token IS NULL"
    ));
    assert_eq!(holders, "SET\n1");
    let a = holder(&s, "100").simple(UPDATE);
    assert!(a.errors.is_empty(), "the current holder: {a:?}");
}

/// A raise under REPEATABLE READ or SERIALIZABLE ended no holder: a session sharing the lock
/// by hand kept it waiting for ever (a fourth breaker's finding). It ends unproven holders as
/// a READ COMMITTED raise does.
#[test]
fn a_repeatable_read_raise_is_not_kept_waiting_by_a_shared_lock_held_by_hand() {
    for isolation in ["REPEATABLE READ", "SERIALIZABLE"] {
        let s = prepared();
        let direct = format!("127.0.0.1:{}", s.pg.port);
        let mut sharer = Raw::connect_as(&direct, "app", &[]);
        let a = sharer.simple(&format!(
            "SELECT pg_advisory_lock_shared(fencing.lock_key('{R}'))"
        ));
        assert!(a.errors.is_empty(), "{a:?}");
        let mut c = holder(&s, "101");
        let a = c.simple(&format!(
            "BEGIN ISOLATION LEVEL {isolation}; {UPDATE}; COMMIT"
        ));
        assert!(a.errors.is_empty(), "{isolation}: {a:?}");
        assert_eq!(mark(&s.pg, R), "101", "{isolation}");
    }
}
