//! Protected tables: PostgreSQL itself refuses a write to a protected table unless the session
//! presents a current token for a resource under the table's prefix, on any connection: a
//! direct one that goes around the proxy too.

use e2e::raw::Raw;

use crate::{Setup, setup};

fn protected() -> (Setup, String) {
    let s = setup(1000);
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100);
         SELECT fencing.protect('public.stock', 'inv:');",
    );
    let direct = format!("127.0.0.1:{}", s.pg.port);
    (s, direct)
}

fn with_token(addr: &str, resource: &str, token: &str) -> Raw {
    Raw::connect(
        addr,
        &[("fencing.resource", resource), ("fencing.token", token)],
    )
}

#[test]
fn a_direct_connection_writes_only_with_a_current_token() {
    let (s, direct) = protected();
    for write in [
        "UPDATE stock SET n = 0",
        "INSERT INTO stock VALUES ('b', 1)",
        "DELETE FROM stock",
        "TRUNCATE stock",
        "MERGE INTO stock USING (SELECT 'a' AS sku) v ON stock.sku = v.sku WHEN MATCHED THEN UPDATE SET n = 0",
    ] {
        let a = Raw::connect(&direct, &[]).simple(write);
        assert_eq!(a.code(), "FN005", "{write} without a token: {a:?}");
        let a = with_token(&direct, "inv:a", "1").simple(write);
        assert_eq!(a.code(), "FN001", "{write} with a stale token: {a:?}");
        let a = with_token(&direct, "other:a", "500").simple(write);
        assert_eq!(
            a.code(),
            "FN005",
            "{write} for a resource outside the prefix: {a:?}"
        );
        let a = with_token(&direct, "inv:a", "").simple(write);
        assert_eq!(a.code(), "FN002", "{write} with half a declaration: {a:?}");
    }
    assert_eq!(
        s.pg.psql("SELECT sku, n FROM stock"),
        "a|10",
        "nothing was written"
    );
    // The current token writes, directly and through the proxy; reads need none.
    let a = with_token(&direct, "inv:a", "100").simple("UPDATE stock SET n = 9");
    assert!(a.errors.is_empty(), "{a:?}");
    let a = with_token(s.addr(), "inv:b", "7").simple("UPDATE stock SET n = 8");
    assert!(
        a.errors.is_empty(),
        "a new resource under the prefix: {a:?}"
    );
    let a = Raw::connect(&direct, &[]).simple("SELECT n FROM stock");
    assert_eq!(a.rows, [[Some("8".to_string())]], "{a:?}");
    // The write through the proxy took its token's mark.
    assert_eq!(
        s.pg.psql("SELECT token FROM fencing.tokens WHERE resource = 'inv:b'"),
        "7"
    );
}

#[test]
fn copy_from_is_covered_and_a_partition_is_protected_with_its_table() {
    let (s, direct) = protected();
    let mut c = Raw::connect(&direct, &[]);
    // COPY FROM STDIN is refused before it asks for data (the statement trigger runs first).
    let a = c.simple("COPY stock FROM STDIN");
    assert_eq!(a.code(), "FN005", "{a:?}");
    s.pg.psql(
        "CREATE TABLE events (id int, at date) PARTITION BY RANGE (at);
         CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         SELECT fencing.protect('events', 'ev:');",
    );
    for write in [
        "INSERT INTO events VALUES (1, '2026-06-01')",
        "INSERT INTO events_2026 VALUES (1, '2026-06-01')",
    ] {
        let a = Raw::connect(&direct, &[]).simple(write);
        assert_eq!(a.code(), "FN005", "{write}: {a:?}");
        let a = with_token(&direct, "ev:1", "3").simple(write);
        assert!(a.errors.is_empty(), "{write} with a token: {a:?}");
    }
    assert_eq!(
        s.pg.psql("SELECT table_name || ' ' || prefix FROM fencing.protected_tables ORDER BY 1"),
        "events ev:\nevents_2026 ev:\nstock inv:"
    );
}

#[test]
fn unprotect_removes_it_and_bad_arguments_get_clear_errors() {
    let (s, direct) = protected();
    s.pg.psql("SELECT fencing.unprotect('stock')");
    let a = Raw::connect(&direct, &[]).simple("UPDATE stock SET n = 1");
    assert!(a.errors.is_empty(), "{a:?}");
    assert_eq!(
        s.pg.psql("SELECT count(*) FROM fencing.protected_tables"),
        "0"
    );
    let mut c = Raw::connect(&direct, &[]);
    let a = c.simple("SELECT fencing.protect('stock', 'has space')");
    assert_eq!(a.code(), "22023", "{a:?}");
    let a = c.simple("SELECT fencing.protect('stock', 'inv:', 0)");
    assert_eq!(a.code(), "22023", "{a:?}");
    let a = c.simple("SELECT fencing.protect('no_such_table', 'inv:')");
    assert_eq!(a.code(), "42P01", "{a:?}");
    // A role that does not own the table can neither protect nor unprotect it.
    s.pg.psql(
        "CREATE ROLE app LOGIN; GRANT ALL ON stock TO app; SELECT fencing.protect('stock', 'inv:')",
    );
    let mut app = Raw::connect_as(&direct, "app", &[]);
    let a = app.simple("SELECT fencing.unprotect('stock')");
    assert_eq!(a.code(), "42501", "{a:?}");
    let a = app.simple("ALTER TABLE stock DISABLE TRIGGER fencing_guard");
    assert_eq!(a.code(), "42501", "{a:?}");
}

#[test]
fn print_schema_shows_the_protection_functions() {
    let out = std::process::Command::new(e2e::bin("fence-proxy"))
        .args(["pg", "print-schema"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "FUNCTION fencing.protect(",
        "FUNCTION fencing.unprotect(",
        "VIEW fencing.protected_tables",
    ] {
        assert!(text.contains(needle), "print-schema lacks {needle}");
    }
}

#[test]
fn partitions_and_children_that_come_later_are_protected_too() {
    let (s, direct) = protected();
    s.pg.psql(
        "CREATE TABLE events (id int, at date) PARTITION BY RANGE (at);
         SELECT fencing.protect('events', 'ev:');
         CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         CREATE TABLE events_2027 (id int, at date);
         ALTER TABLE events ATTACH PARTITION events_2027 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
         CREATE TABLE stock_archive (old boolean) INHERITS (stock);",
    );
    for write in [
        "INSERT INTO events_2026 VALUES (1, '2026-06-01')",
        "INSERT INTO events_2027 VALUES (1, '2027-06-01')",
        "INSERT INTO stock_archive VALUES ('x', 1, true)",
    ] {
        let a = Raw::connect(&direct, &[]).simple(write);
        assert_eq!(a.code(), "FN005", "{write}: {a:?}");
    }
}
