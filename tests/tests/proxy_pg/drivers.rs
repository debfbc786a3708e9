//! Real drivers we did not write, each declaring its token its idiomatic way, through the
//! zombie scenario: A (token 41) writes in an open transaction and stalls; B (42) writes the
//! same row, waits the fence wait, and PostgreSQL ends A's transaction; A's COMMIT must fail
//! with FN003; a stale write in autocommit must fail with FN001; the current token still
//! writes. What each driver reports is in docs/fence-proxy.md (driver compatibility).
//!
//! The drivers come from `.ci/run` (PyPI: psycopg 3, asyncpg; npm: node-postgres; Debian:
//! libpostgresql-jdbc-java); a missing one fails the test with the command that installs it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use crate::setup;

fn drivers_dir() -> PathBuf {
    e2e::workspace().join("tests/drivers")
}

/// A driver script's report: one JSON object per line, by its `case`.
fn reported(stdout: &str, what: &str) -> HashMap<String, serde_json::Value> {
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{what} printed {l:?}: {e}"));
            (v["case"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

/// Runs the scenario script `cmd` (given the proxy's host and port) and checks its report.
fn scenario(mut cmd: Command, what: &str) {
    let s = setup(300);
    s.pg.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init')",
    );
    let (host, port) = s.addr().rsplit_once(':').unwrap();
    cmd.args([host, port]);
    let (status, stdout, stderr) = e2e::output(cmd);
    assert!(status.success(), "{what} failed: {stdout}\n{stderr}");
    let cases = reported(&stdout, what);
    let case = |name: &str| {
        cases
            .get(name)
            .unwrap_or_else(|| panic!("{what} did not report {name}: {stdout}\n{stderr}"))
    };
    assert_eq!(case("newer_write")["ok"], true, "{what}: {stdout}");
    assert_eq!(case("zombie_commit")["ok"], false, "{what}: {stdout}");
    assert_eq!(
        case("zombie_commit")["sqlstate"],
        "FN003",
        "{what}: the zombie's COMMIT must surface FN003: {stdout}"
    );
    assert_eq!(
        case("stale_autocommit")["sqlstate"],
        "FN001",
        "{what}: {stdout}"
    );
    assert_eq!(case("current_write")["ok"], true, "{what}: {stdout}");
    assert_eq!(s.pg.psql("SELECT owner FROM acct"), "D", "{what}");
}

fn python(module: &str, script: &str) -> Command {
    let probe = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 (the first on PATH) with {module} is needed: ./x deps, or python3 -m pip install -r tests/drivers/requirements.txt"
    );
    let mut cmd = Command::new("python3");
    cmd.arg(drivers_dir().join(script));
    cmd
}

#[test]
fn psycopg_with_set_and_options() {
    scenario(python("psycopg", "psycopg_zombie.py"), "psycopg");
}

#[test]
fn asyncpg_with_server_settings() {
    scenario(python("asyncpg", "asyncpg_zombie.py"), "asyncpg");
}

#[test]
fn node_postgres_with_options() {
    let dir = drivers_dir().join("node");
    assert!(
        dir.join("node_modules/pg").is_dir(),
        "node-postgres is needed: npm ci --prefix tests/drivers/node"
    );
    let mut cmd = Command::new("node");
    cmd.arg(dir.join("pg_zombie.js"));
    scenario(cmd, "node-postgres");
}

#[test]
fn jdbc_with_set_and_options() {
    let jar = PathBuf::from("/usr/share/java/postgresql.jar");
    assert!(
        jar.is_file(),
        "pgjdbc is needed: apt-get install libpostgresql-jdbc-java (and a JDK, for `java`)"
    );
    let mut cmd = Command::new("java");
    cmd.arg("-cp")
        .arg(&jar)
        .arg(drivers_dir().join("Zombie.java"));
    scenario(cmd, "JDBC");
}

/// SQLAlchemy's pool, one connection handed out again and again (docs/fence-proxy.md, "Under
/// a connection pool"): a token declared per transaction reaches no later checkout; one
/// declared with a session-level `SET` does, and the next user's unrelated write is refused
/// under it, which is why the docs say never to.
#[test]
fn sqlalchemys_pool_keeps_a_per_transaction_token_to_its_transaction() {
    let s = setup(300);
    s.pg.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, owner text); INSERT INTO acct VALUES (1, 'init'); \
         CREATE TABLE other (v int); INSERT INTO other VALUES (0)",
    );
    let (host, port) = s.addr().rsplit_once(':').unwrap();
    let mut cmd = python("sqlalchemy", "sqlalchemy_pool.py");
    cmd.args([host, port]);
    let (status, stdout, stderr) = e2e::output(cmd);
    assert!(status.success(), "{stdout}\n{stderr}");
    let cases = reported(&stdout, "SQLAlchemy");
    let case = |name: &str| {
        cases
            .get(name)
            .unwrap_or_else(|| panic!("{name}: {stdout}"))
    };
    assert_eq!(case("per_transaction_write")["ok"], true, "{stdout}");
    let seen = &case("per_transaction_next_checkout")["value"];
    assert!(
        seen.is_null() || seen == "",
        "the next checkout inherited {seen}: {stdout}"
    );
    assert_eq!(
        case("per_transaction_unrelated_write")["ok"],
        true,
        "{stdout}"
    );
    assert_eq!(
        case("per_transaction_stale_write")["sqlstate"],
        "FN001",
        "{stdout}"
    );
    assert_eq!(s.pg.psql("SELECT owner FROM acct"), "holder");
    // The hazard: a session-level SET stays on the pooled connection.
    assert_eq!(case("session_set_next_checkout")["value"], "49", "{stdout}");
    assert_eq!(
        case("session_set_unrelated_write")["sqlstate"],
        "FN001",
        "{stdout}"
    );
    assert_eq!(s.pg.psql("SELECT v FROM other"), "1");
}
