//! The bypass catalogue (issue 14, invariant 9): one test per way a session can declare its
//! token, each against a real PostgreSQL through the real proxy. Each shows that a stale
//! write (token 1 against a mark of 100) is refused and leaves the table unchanged, and that
//! the same way with a current token (100) still writes: closed must not mean "refuse
//! everything".
//!
//! The tests in `catalogue` each committed the stale write through the proxy before the
//! proxy checked every transaction (the proxy of commit a54c88f let them all through; the
//! closing note of issue 14 lists the run). The ones in `guards` were already refused then
//! and stay here so that they stay refused.
//!
//! Each runs twice: against a plain PostgreSQL, where the proxy's own checks judge, and
//! against one with fence_hook loaded, where the proxy sends no check at a commit point and
//! PostgreSQL judges every commit itself.

use e2e::raw::{Answer, Raw};

use e2e::pg::Postgres;

use crate::{Setup, setup_with};

const UPDATE: &str = "UPDATE stock SET n = n - 1 WHERE sku = 'a'";

/// A database with `stock` (n = 10), the mark of `inv:a` at 100, a role `app`, and a helper
/// function and procedure that set the token where the proxy cannot see it (the names are
/// spelled in pieces, so that no SQL text the proxy reads says "fencing").
fn prepared(pg: Postgres) -> Setup {
    let s = setup_with(pg, 1000, "");
    s.pg.psql(
        "CREATE TABLE stock (sku text PRIMARY KEY, n int); INSERT INTO stock VALUES ('a', 10);
         INSERT INTO fencing.tokens (resource, token) VALUES ('inv:a', 100);
         CREATE ROLE app LOGIN; GRANT ALL ON stock TO app;
         CREATE FUNCTION app_fence(r text, t text) RETURNS void LANGUAGE sql AS
           $$ SELECT set_config('fen' || 'cing.resource', r, false), set_config('fen' || 'cing.token', t, false) $$;
         CREATE PROCEDURE app_fence_p(r text, t text) LANGUAGE plpgsql AS
           $$ BEGIN PERFORM app_fence(r, t); END $$;
         CREATE FUNCTION app_work(r text, t text) RETURNS int LANGUAGE plpgsql AS
           $$ BEGIN PERFORM app_fence(r, t); UPDATE stock SET n = n - 1 WHERE sku = 'a'; RETURN 1; END $$;
         CREATE TABLE audit (t text);
         CREATE FUNCTION audit_fence() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM app_fence('inv:a', NEW.t); UPDATE stock SET n = n - 1 WHERE sku = 'a'; RETURN NEW; END $$;
         CREATE TRIGGER audit_fence BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION audit_fence();
         GRANT EXECUTE ON FUNCTION app_fence(text, text) TO app;",
    );
    s
}

fn stock(s: &Setup) -> String {
    s.pg.psql("SELECT n FROM stock")
}

/// The first error of a sequence of answers (or the last answer, when none failed).
fn first_error(answers: Vec<Answer>) -> Answer {
    answers
        .iter()
        .find(|a| !a.errors.is_empty())
        .cloned()
        .unwrap_or_else(|| answers.last().cloned().unwrap_or_default())
}

/// `write(s, token)` declares `token` for `inv:a` its way and writes once. With token 1 the
/// write must fail with `code` and change nothing; with 100 it must go through.
/// Both with the proxy's checks and with the commit hook's.
fn fenced(write: impl Fn(&Setup, &str) -> Answer, code: &str) {
    for (judge, pg) in [
        ("the proxy", Postgres::start()),
        ("fence_hook", Postgres::start_with_hook()),
    ] {
        let s = prepared(pg);
        let stale = write(&s, "1");
        assert_eq!(
            stale.code(),
            code,
            "the stale write, judged by {judge}: {stale:?}"
        );
        assert_eq!(
            stock(&s),
            "10",
            "the stale write changed the table ({judge})"
        );
        let current = write(&s, "100");
        assert!(
            current.errors.is_empty(),
            "the current write ({judge}): {current:?}"
        );
        assert_eq!(stock(&s), "9", "the current write did not land ({judge})");
    }
}

/// A transaction may turn read-only after it wrote (`SET TRANSACTION READ ONLY`, or the same
/// setting through `set_config`, is allowed at any point). The check once let a read-only transaction's token pass without raising the
/// mark, so a write under a newer token (declared unseen) committed, and the older token went
/// on writing after it. Now the raise is tried, and PostgreSQL refuses it in a read-only
/// transaction (25006): the write does not commit. With the commit hook the write's own check
/// raised the mark before the transaction turned read-only: both commit together, and the
/// older token is refused after. (Found by an outside breaker; failed before the fix under
/// both judges.)
#[test]
fn a_transaction_made_read_only_after_a_newer_token_wrote() {
    for (judge, pg, read_only) in [
        ("the proxy", Postgres::start(), "SET TRANSACTION READ ONLY"),
        (
            "fence_hook",
            Postgres::start_with_hook(),
            "SET TRANSACTION READ ONLY",
        ),
        (
            "the proxy",
            Postgres::start(),
            "SELECT set_config('transaction_read_only', 'on', true)",
        ),
        (
            "fence_hook",
            Postgres::start_with_hook(),
            "SELECT set_config('transaction_read_only', 'on', true)",
        ),
    ] {
        let s = prepared(pg);
        let mut c = Raw::connect(s.addr(), &[]);
        for q in ["BEGIN", "SELECT app_work('inv:a', '101')", read_only] {
            let a = c.simple(q);
            assert!(a.errors.is_empty(), "{q} ({judge}): {a:?}");
        }
        let commit = c.simple("COMMIT");
        if judge == "fence_hook" {
            // The hook judges the write before it runs, while the transaction may still write:
            // the raise to 101 commits with the write, and the older token is stale after it.
            assert!(commit.errors.is_empty(), "the COMMIT ({judge}): {commit:?}");
            assert_eq!(stock(&s), "9", "({judge})");
            assert_eq!(
                s.pg.psql("SELECT token FROM fencing.tokens WHERE resource = 'inv:a'"),
                "101",
                "the write committed without its raise ({judge})"
            );
            let older = c.simple("SELECT app_work('inv:a', '100')");
            assert_eq!(
                older.code(),
                "FN001",
                "the older token ({judge}): {older:?}"
            );
            assert_eq!(stock(&s), "9", "({judge})");
            continue;
        }
        assert_eq!(commit.code(), "25006", "the COMMIT ({judge}): {commit:?}");
        assert_eq!(
            stock(&s),
            "10",
            "the newer token's write committed ({judge})"
        );
        assert_eq!(
            s.pg.psql("SELECT token FROM fencing.tokens WHERE resource = 'inv:a'"),
            "100",
            "({judge})"
        );
    }
}

mod catalogue {
    use super::*;

    #[test]
    fn start_up_keys_of_their_own_as_asyncpg_and_pgx_send_them() {
        fenced(
            |s, t| {
                Raw::connect(
                    s.addr(),
                    &[("fencing.resource", "inv:a"), ("fencing.token", t)],
                )
                .simple(UPDATE)
            },
            "FN001",
        );
    }

    // A statement that declares the token is checked right after itself, in its own
    // transaction; having written nothing it passes whatever it declared, and the write after
    // it is judged by that.

    #[test]
    fn set_config_with_a_bound_token_in_the_extended_protocol() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple("SET fencing.resource = 'inv:a'");
                let declared = c.extended("SELECT set_config('fencing.token', $1, false)", &[t]);
                assert!(declared.errors.is_empty(), "{declared:?}");
                c.extended(UPDATE, &[])
            },
            "FN001",
        );
    }

    #[test]
    fn set_config_with_the_name_bound_too_one_setting_at_a_time() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                let half = c.extended(
                    "SELECT set_config($1, $2, false)",
                    &["fencing.resource", "inv:a"],
                );
                assert!(
                    half.errors.is_empty(),
                    "declaring the resource first: {half:?}"
                );
                let declared =
                    c.extended("SELECT set_config($1, $2, false)", &["fencing.token", t]);
                assert!(declared.errors.is_empty(), "{declared:?}");
                c.extended(UPDATE, &[])
            },
            "FN001",
        );
    }

    #[test]
    fn a_helper_function_then_a_write() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple(&format!("SELECT app_fence('inv:a', '{t}')"));
                c.simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn a_helper_function_inside_the_writing_transaction() {
        // The check at the first statement sees no token; the one at COMMIT sees it.
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                first_error(vec![
                    c.simple("BEGIN"),
                    c.simple(&format!("SELECT app_fence('inv:a', '{t}')")),
                    c.simple(UPDATE),
                    c.simple("COMMIT"),
                ])
            },
            "FN001",
        );
    }

    #[test]
    fn a_helper_function_and_the_write_in_one_batch() {
        fenced(
            |s, t| {
                Raw::connect(s.addr(), &[])
                    .batch(&[("SELECT app_fence($1, $2)", &["inv:a", t]), (UPDATE, &[])])
            },
            "FN001",
        );
    }

    #[test]
    fn a_helper_function_and_the_write_in_one_query_string() {
        fenced(
            |s, t| {
                Raw::connect(s.addr(), &[])
                    .simple(&format!("SELECT app_fence('inv:a', '{t}'); {UPDATE}"))
            },
            "FN001",
        );
    }

    #[test]
    fn a_function_that_declares_and_writes_in_one_statement() {
        // Checked where the statement's transaction commits, after it: by what it declared.
        fenced(
            |s, t| Raw::connect(s.addr(), &[]).simple(&format!("SELECT app_work('inv:a', '{t}')")),
            "FN001",
        );
    }

    #[test]
    fn a_function_that_declares_and_writes_in_the_extended_protocol_and_in_a_transaction() {
        fenced(
            |s, t| Raw::connect(s.addr(), &[]).extended("SELECT app_work('inv:a', $1)", &[t]),
            "FN001",
        );
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                first_error(vec![
                    c.simple("BEGIN"),
                    c.simple(&format!("SELECT app_work('inv:a', '{t}')")),
                    c.simple("COMMIT"),
                ])
            },
            "FN001",
        );
    }

    #[test]
    fn a_trigger_that_declares_and_writes() {
        fenced(
            |s, t| Raw::connect(s.addr(), &[]).simple(&format!("INSERT INTO audit VALUES ('{t}')")),
            "FN001",
        );
    }

    #[test]
    fn a_prepared_statement_swapped_by_sql_prepare() {
        // Parsed as a SHOW, replaced by an UPDATE of the same name: it is checked as what it
        // may now be.
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple(&format!(
                    "SET fencing.resource = 'inv:a'; SET fencing.token = '{t}'"
                ));
                c.prepare("s1", "SHOW work_mem");
                c.simple("DEALLOCATE s1");
                c.simple(&format!("PREPARE s1 AS {UPDATE}"));
                c.execute_prepared("s1")
            },
            "FN001",
        );
    }

    #[test]
    fn a_do_block_with_dynamic_sql() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple(&format!(
                    "DO $$ BEGIN EXECUTE 'SET fen' || 'cing.resource = ''inv:a'''; \
                     EXECUTE 'SET fen' || 'cing.token = ' || quote_literal('{t}'); END $$"
                ));
                c.simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn a_procedure() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple(&format!("CALL app_fence_p('inv:a', '{t}')"));
                c.simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn a_set_with_a_unicode_escaped_name() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple(r#"SET U&"fenc\0069ng.resource" = 'inv:a'"#);
                c.simple(&format!(r#"SET U&"fenc\0069ng.token" TO '{t}'"#));
                c.simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn role_defaults() {
        fenced(
            |s, t| {
                s.pg.psql(&format!(
                    "ALTER ROLE app SET fencing.resource = 'inv:a'; ALTER ROLE app SET fencing.token = '{t}'"
                ));
                Raw::connect_as(s.addr(), "app", &[]).simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn database_defaults() {
        fenced(
            |s, t| {
                // The admin's own session inherits the stale default of the first write; under
                // fence_hook its ALTER DATABASE (a catalogue write) is judged like any other,
                // so it clears the settings first (docs/fence-proxy.md, "The commit hook").
                s.pg.psql_each(&[
                    "SET fencing.resource = ''",
                    "SET fencing.token = ''",
                    "ALTER DATABASE postgres SET fencing.resource = 'inv:a'",
                    &format!("ALTER DATABASE postgres SET fencing.token = '{t}'"),
                ]);
                Raw::connect(s.addr(), &[]).simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn role_defaults_in_one_database() {
        fenced(
            |s, t| {
                s.pg.psql(&format!(
                    "ALTER ROLE app IN DATABASE postgres SET fencing.resource = 'inv:a';
                     ALTER ROLE app IN DATABASE postgres SET fencing.token = '{t}'"
                ));
                Raw::connect_as(s.addr(), "app", &[]).simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn the_server_configuration_reloaded_under_an_open_session() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple("SELECT 1");
                // ALTER SYSTEM takes a custom setting only once the session knows its name.
                s.pg.psql_each(&[
                    "SET fencing.resource = ''",
                    "SET fencing.token = ''",
                    "ALTER SYSTEM SET fencing.resource = 'inv:a'",
                    &format!("ALTER SYSTEM SET fencing.token = '{t}'"),
                    "SELECT pg_reload_conf()",
                ]);
                // The reload reaches the session when it next reads a command. (Asked without
                // naming the setting in the text, as an application would not; with the stale
                // token the read itself is refused once it has.)
                let seen = (0..1000)
                    .map(|_| c.simple("SELECT current_setting('fen' || 'cing.token', true)"))
                    .find(|a| {
                        a.code() == "FN001"
                            || a.rows.first().and_then(|r| r[0].clone()).as_deref() == Some(t)
                    });
                assert!(seen.is_some(), "the reload never reached the session");
                let a = c.simple(UPDATE);
                s.pg.psql_each(&["ALTER SYSTEM RESET ALL", "SELECT pg_reload_conf()"]);
                a
            },
            "FN001",
        );
    }

    /// Half a declaration, or an empty value, fails the transaction: `write` gets the half,
    /// the current way is the whole.
    fn half(params: &[(&str, &str)]) {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        fenced(
            move |s, t| {
                if t == "1" {
                    let p: Vec<(&str, &str)> = params
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    Raw::connect(s.addr(), &p).simple(UPDATE)
                } else {
                    Raw::connect(
                        s.addr(),
                        &[("fencing.resource", "inv:a"), ("fencing.token", t)],
                    )
                    .simple(UPDATE)
                }
            },
            "FN002",
        );
    }

    #[test]
    fn a_resource_without_a_token() {
        half(&[("fencing.resource", "inv:a")]);
    }

    #[test]
    fn a_token_without_a_resource() {
        half(&[("fencing.token", "1")]);
    }

    #[test]
    fn an_empty_token() {
        half(&[("options", "-c fencing.resource=inv:a -c fencing.token=")]);
    }

    #[test]
    fn an_empty_resource() {
        half(&[("fencing.resource", ""), ("fencing.token", "1")]);
    }
}

mod guards {
    use super::*;

    #[test]
    fn start_up_options() {
        fenced(
            |s, t| {
                let o = format!("-c fencing.resource=inv:a -c fencing.token={t}");
                Raw::connect(s.addr(), &[("options", &o)]).simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn start_up_options_in_their_long_form() {
        fenced(
            |s, t| {
                let o = format!("--fencing.resource=inv:a --fencing.token={t}");
                Raw::connect(s.addr(), &[("options", &o)]).simple(UPDATE)
            },
            "FN001",
        );
    }

    #[test]
    fn set_statements() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                c.simple(&format!(
                    "SET fencing.resource = 'inv:a'; SET SESSION fencing.token TO '{t}'"
                ));
                c.extended(UPDATE, &[])
            },
            "FN001",
        );
    }

    #[test]
    fn set_local_in_the_middle_of_a_checked_transaction() {
        fenced(
            |s, t| {
                let mut c = Raw::connect(s.addr(), &[]);
                first_error(vec![
                    c.simple("SET fencing.resource = 'inv:a'; SET fencing.token = '100'"),
                    c.simple("BEGIN"),
                    c.simple("SELECT n FROM stock"),
                    c.simple(&format!("SET LOCAL fencing.token = '{t}'")),
                    c.simple(UPDATE),
                    c.simple("COMMIT"),
                ])
            },
            "FN001",
        );
    }
}
