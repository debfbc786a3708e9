//! The configuration: defaults, every command line and file form, and each refusal with its
//! reason.

use super::*;
use clap::Parser;

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("fence-proxy").chain(args.iter().copied())).unwrap()
}

fn file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, text).unwrap();
    let p = path.to_str().unwrap().to_string();
    (dir, p)
}

#[test]
fn the_database_of_a_url_is_found_as_libpq_finds_it() {
    for (url, db) in [
        ("postgres://app@db:5432/inventory", Some("inventory")),
        (
            "postgresql://app:pw@db/inv%20tory?sslmode=disable",
            Some("inv tory"),
        ),
        ("postgres://app@db:5432", Some("app")),
        ("postgres://app:secret@db/", Some("app")),
        ("postgres://db/x?dbname=other", Some("other")),
        ("postgres://db:5432", None),
    ] {
        assert_eq!(url_database(url).as_deref(), db, "{url}");
    }
}

#[test]
fn the_pg_subcommand_has_the_documented_defaults() {
    let c = Config::from_cli(&cli(&["pg"])).unwrap();
    assert_eq!(c.pg[0].listen.to_string(), "127.0.0.1:6543");
    assert_eq!(c.pg[0].upstream, "127.0.0.1:5432");
    assert_eq!(c.pg[0].fence_wait_ms, 1000);
    assert_eq!(c.pg[0].schema_wait_ms, 30_000);
    assert!(c.pg[0].trust_commit_hook);
    assert_eq!(c.workers, 0);
    assert!(c.http.is_empty());
    let c = Config::from_cli(&cli(&[
        "pg",
        "--upstream",
        "db:5433",
        "--upstream-tls",
        "require",
        "--schema-url",
        "postgres://a@db/x,postgres://a@db/y",
        "--workers",
        "1",
        "--schema-wait-ms",
        "0",
        "--trust-commit-hook",
        "false",
    ]))
    .unwrap();
    assert!(!c.pg[0].trust_commit_hook);
    assert!(!c.pg[0].relay(1, false).trust_commit_hook);
    assert_eq!(c.pg[0].schema_urls.len(), 2);
    assert_eq!(c.pg[0].schema_wait_ms, 0);
    assert_eq!((c.workers, c.workers()), (1, 1));
    assert!(matches!(
        cli(&["pg", "print-schema"]).mode,
        Some(Mode::Pg(PgArgs {
            action: Some(PgAction::PrintSchema),
            ..
        }))
    ));
}

#[test]
fn one_file_runs_both_modes() {
    let (_d, p) = file(
        r#"
        [[pg]]
        listen = "127.0.0.1:6543"
        upstream = "127.0.0.1:5432"
        schema_urls = ["postgres://postgres@127.0.0.1:5432/app"]
        fence_wait_ms = 500
        trust_commit_hook = false
        [[http]]
        listen = "127.0.0.1:8420"
        upstream = "http://127.0.0.1:8080"
        "#,
    );
    let c = Config::from_cli(&cli(&["--config", &p])).unwrap();
    assert_eq!((c.pg.len(), c.http.len()), (1, 1));
    assert_eq!(c.pg[0].fence_wait_ms, 500);
    assert!(!c.pg[0].trust_commit_hook);
    let (_d2, p2) = file(&c.to_toml());
    assert_eq!(Config::from_cli(&cli(&["--config", &p2])).unwrap(), c);
}

#[test]
fn the_http_subcommand_has_the_documented_defaults() {
    let c = Config::from_cli(&cli(&["http"])).unwrap();
    assert_eq!(c.http[0].listen.to_string(), "127.0.0.1:8420");
    assert_eq!(c.http[0].upstream, "http://127.0.0.1:8080");
    assert_eq!(c.data_dir, PathBuf::from("./fence-proxy-data"));
}

#[test]
fn a_file_configures_listeners_and_routes() {
    let (_d, p) = file(
        r#"
        data_dir = "/var/lib/fence-proxy"
        [fence]
        barrier_wait_ms = 1000
        [[http]]
        listen = "127.0.0.1:8420"
        upstream = "http://127.0.0.1:8080"
        path_reading = "decoded"
        [[http.routes]]
        methods = ["POST", "PUT"]
        path = "/inventory/{sku}"
        resource = "inventory:{sku}"
        [[http]]
        listen = "127.0.0.1:8421"
        upstream = "http://127.0.0.1:9090/api"
        "#,
    );
    let c = Config::from_cli(&cli(&["--config", &p])).unwrap();
    assert_eq!(c.http.len(), 2);
    assert_eq!(
        c.http[0].routes[0].resource.as_deref(),
        Some("inventory:{sku}")
    );
    assert_eq!(c.fence.barrier_wait_ms, 1000);
    assert_eq!(c.http[0].path_reading, PathReading::Decoded);
    assert_eq!(c.http[1].path_reading, PathReading::Strict, "the default");
    // --print-config output is itself a valid file with the same meaning.
    let (_d2, p2) = file(&c.to_toml());
    assert_eq!(Config::from_cli(&cli(&["--config", &p2])).unwrap(), c);
}

#[test]
fn garbage_is_refused_with_the_reason() {
    for (text, needle) in [
        (
            "[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"https://x\"",
            "needs upstream_ca",
        ),
        (
            "[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"ftp://x\"",
            "http:// or https://",
        ),
        (
            "[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"\n[[http.routes]]\npath = \"/a/{b}\"\nresource = \"r:{c}\"",
            "does not capture",
        ),
        (
            "[[http]]\nlisten = \"nope\"\nupstream = \"http://x\"",
            "invalid socket address",
        ),
        (
            "[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"\nbogus = 1",
            "unknown field",
        ),
        ("data_dir = \"x\"", "no listeners"),
        (
            "[[pg]]\nlisten = \"127.0.0.1:6543\"\nupstream = \"db\"",
            "must be host:port",
        ),
        (
            "[[pg]]\nlisten = \"127.0.0.1:6543\"\nupstream = \"db:5432\"\nfence_wait_ms = 0",
            "fence_wait_ms",
        ),
        (
            "[[pg]]\nlisten = \"127.0.0.1:6543\"\nupstream = \"db:5432\"\nschema_wait_ms = 3600001",
            "schema_wait_ms",
        ),
        (
            "[[pg]]\nlisten = \"127.0.0.1:6543\"\nupstream = \"db:5432\"\nschema_urls = [\"mysql://x:pw@h/d\"]",
            "must be a postgres:// URL",
        ),
        (
            "[[pg]]\nlisten = \"127.0.0.1:1\"\nupstream = \"db:5432\"\n[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"",
            "two listeners",
        ),
        (
            "[fence]\nbarrier_wait_ms = 0\n[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"",
            "at least 1",
        ),
        (
            "[fence]\nstore = \"postgres\"\n[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"",
            "needs fence.postgres_url",
        ),
        (
            "[fence]\nstore = \"mysql\"\n[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"",
            "unknown variant",
        ),
        (
            "[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"\npath_reading = \"loose\"",
            "unknown variant `loose`, expected `strict` or `decoded`",
        ),
        (
            "workers = 5000\n[[http]]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://x\"",
            "at most 1024",
        ),
    ] {
        let (_d, p) = file(text);
        let err = format!(
            "{:#}",
            Config::from_cli(&cli(&["--config", &p])).unwrap_err()
        );
        assert!(err.contains(needle), "{text:?}: {err}");
    }
    let both = Config::from_cli(&cli(&["--config", "x.toml", "http"]))
        .unwrap_err()
        .to_string();
    assert!(both.contains("either"), "{both}");
    let none = Config::from_cli(&cli(&[])).unwrap_err().to_string();
    assert!(none.contains("nothing to run"), "{none}");
}

/// docs/fence-proxy.md is the operators' reference: every key must be in it.
#[test]
fn the_reference_lists_every_setting() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/fence-proxy.md"
    ))
    .unwrap();
    let mut c = Config::from_cli(&cli(&["http"])).unwrap();
    c.http[0].routes.push(RouteConfig {
        methods: Some(vec!["POST".into()]),
        path: "/a/{b}".into(),
        resource: Some("a:{b}".into()),
        fenced: true,
    });
    c.http[0].unmatched = Some(Unmatched::Pass);
    c.fence.postgres_url = Some("postgres://localhost/db".into());
    c.admin_listen = Some("127.0.0.1:8421".parse().unwrap());
    c.audit_log = Some("-".into());
    let mut pg = PgConfig::new("127.0.0.1:6543".parse().unwrap(), "db:5432".into());
    pg.schema_urls
        .push("postgres://postgres@db:5432/app".into());
    c.pg.push(pg);
    let value: toml::Value = toml::from_str(&c.to_toml()).unwrap();
    let mut keys = Vec::new();
    collect(&value, "", &mut keys);
    assert!(keys.len() > 15, "{keys:?}");
    for key in keys {
        assert!(
            doc.contains(&format!("`{key}`")),
            "docs/fence-proxy.md does not mention `{key}`"
        );
    }
    for flag in [
        "--listen",
        "--upstream",
        "--data-dir",
        "--barrier-wait-ms",
        "--body-max-bytes",
        "--upstream-timeout-ms",
        "--log",
        "--log-format",
        "--workers",
        "--marks-store",
        "--postgres-url",
        "--schema-url",
        "--fence-wait-ms",
        "--connections-max",
        "--message-max-bytes",
        "--admin-listen",
        "--audit-log",
        "print-schema",
    ] {
        assert!(
            doc.contains(&format!("`{flag}`")),
            "docs/fence-proxy.md does not mention `{flag}`"
        );
    }
}

fn collect(v: &toml::Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if v.is_table()
                    || v.as_array()
                        .is_some_and(|a| a.iter().all(toml::Value::is_table) && !a.is_empty())
                {
                    collect(v, &key, out);
                } else {
                    out.push(key);
                }
            }
        }
        toml::Value::Array(a) => {
            for item in a {
                collect(item, prefix, out);
            }
            out.sort();
            out.dedup();
        }
        _ => {}
    }
}

#[test]
fn a_pool_needs_a_way_to_authenticate_its_clients() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.txt");
    std::fs::write(&users, "\"app\" \"pw\"\n").unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "; nobody yet\n").unwrap();
    let md5 = dir.path().join("md5.txt");
    std::fs::write(&md5, "\"app\" \"md5a3556571e93b0d20722ba62be61e8c2d\"\n").unwrap();
    let pg = "[[pg]]\nlisten = \"127.0.0.1:1\"\nupstream = \"127.0.0.1:5432\"\n";
    let (_d, p) = file(&format!(
        "{pg}pool_size = 5\nauth_file = \"{}\"\n",
        users.display()
    ));
    let c = Config::from_cli(&cli(&["--config", &p])).unwrap();
    let pool = c.pg[0].pool().unwrap().expect("a pool");
    assert_eq!(pool.size, 5);
    assert!(matches!(pool.auth, pg_relay::PoolAuth::Scram(_)));
    assert!(c.pg[0].pool_wait_ms > 0 && c.pg[0].pool_idle_ms > 0);
    for (text, needle) in [
        (format!("{pg}pool_size = 5\n"), "pool_size needs auth_file"),
        (
            format!("{pg}pool_size = 5\nauth_file = \"{}\"\n", md5.display()),
            "md5 hashes cannot check SCRAM-SHA-256 clients",
        ),
        (
            format!("{pg}pool_size = 5\nauth_file = \"/nonexistent/users\"\n"),
            "cannot read auth_file",
        ),
        (
            format!("{pg}auth_file = \"{}\"\n", users.display()),
            "only with pool_size",
        ),
        (format!("{pg}pool_auth = \"trust\"\n"), "only with pool_size"),
        (
            format!(
                "{pg}pool_size = 5\npool_auth = \"trust\"\nauth_file = \"{}\"\n",
                users.display()
            ),
            "auth_file with pool_auth = \"trust\"",
        ),
        (
            format!("{pg}pool_size = 5\nauth_file = \"{}\"\n", empty.display()),
            "lists no users",
        ),
        (
            "[[pg]]\nlisten = \"0.0.0.0:1\"\nupstream = \"db:5432\"\ntls_cert = \"c\"\ntls_key = \"k\"\npool_size = 2\npool_auth = \"trust\"\n".to_string(),
            "",
        ),
        (
            format!("{pg}pool_size = 200000\npool_auth = \"trust\"\n"),
            "pool_size must be at most 100000",
        ),
    ] {
        let (_d, p) = file(&text);
        let err = format!(
            "{:#}",
            Config::from_cli(&cli(&["--config", &p])).unwrap_err()
        );
        assert!(err.contains(needle), "{text:?}: {err}");
    }
    // Trust off loopback: refused unless insecure (checked apart from the listener's TLS).
    let open = "[[pg]]\nlisten = \"0.0.0.0:1\"\nupstream = \"127.0.0.1:5432\"\npool_size = 2\npool_auth = \"trust\"\n";
    let (_d, p) = file(&format!("insecure = true\n{open}"));
    Config::from_cli(&cli(&["--config", &p])).unwrap();
    let c: Config = toml::from_str(open).unwrap();
    let err = format!("{:#}", c.validate().unwrap_err());
    assert!(
        err.contains("plaintext") || err.contains("pool_auth = \"trust\""),
        "{err}"
    );
    // From the command line.
    let c = Config::from_cli(&cli(&[
        "pg",
        "--pool-size",
        "3",
        "--pool-auth",
        "trust",
        "--pool-wait-ms",
        "50",
    ]))
    .unwrap();
    assert_eq!(
        (c.pg[0].pool_size, c.pg[0].pool_auth, c.pg[0].pool_wait_ms),
        (3, PoolAuthMode::Trust, 50)
    );
}
