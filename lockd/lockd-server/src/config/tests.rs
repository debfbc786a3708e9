//! The configuration's tests: precedence, defaults, refusals, and the reference's coverage.
use super::*;

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("lockd").chain(args.iter().copied())).unwrap()
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = Config::from_cli(&cli(&[])).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:7420");
    assert_eq!(c.data_dir, PathBuf::from("./lockd-data"));
    assert_eq!(c.limits, Limits::default());
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lockd.toml");
    std::fs::write(&file, "listen = \"127.0.0.1:9000\"\ndata_dir = \"/var/lib/lockd\"\n[limits]\nttl_max_ms = 60000\n").unwrap();
    let path = file.to_str().unwrap();
    let c = Config::from_cli(&cli(&["--config", path, "--data-dir", "/tmp/x"])).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
    assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
    assert_eq!(c.limits.ttl_max_ms, 60_000);
    assert_eq!(c.limits.ttl_default_ms, 30_000);
}

#[test]
fn garbage_config_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lockd.toml");
    for (text, needle) in [
        ("listne = \"x\"", "unknown field `listne`"),
        ("listen = \"not an address\"", "invalid socket address"),
        (
            "[limits]\nttl_min_ms = 99999999",
            "ttl_min_ms <= ttl_default_ms",
        ),
        ("sync_interval_ms = -1", "invalid value"),
        ("this is not toml", "config file"),
        ("backend = \"consul\"", "unknown variant"),
        (
            "backend = \"zookeeper\"\nzk_endpoints = []",
            "at least one ZooKeeper server",
        ),
        (
            "backend = \"zookeeper\"\nzk_endpoints = [\"http://127.0.0.1:2181\"]",
            "must be host:port",
        ),
        (
            "backend = \"zookeeper\"\nzk_endpoints = [\"127.0.0.1\"]",
            "must be host:port",
        ),
        (
            "backend = \"zookeeper\"\nzk_endpoints = [\"10.0.0.1:2181\"]",
            "not on loopback",
        ),
        (
            "backend = \"zookeeper\"\nzk_prefix = \"lockd\"",
            "does not start with /",
        ),
        (
            "backend = \"zookeeper\"\nzk_prefix = \"/zookeeper/x\"",
            "ZooKeeper's own",
        ),
        (
            "backend = \"zookeeper\"\nzk_session_timeout_ms = 10",
            "zk_session_timeout_ms must be",
        ),
        (
            "backend = \"zookeeper\"\nlisten = \"0.0.0.0:7420\"\ninsecure = true",
            "set advertise",
        ),
        (
            "backend = \"redis\"\nredis_endpoints = []",
            "at least one Sentinel",
        ),
        (
            "backend = \"redis\"\nredis_endpoints = [\"redis://127.0.0.1:26379\"]",
            "must be host:port",
        ),
        (
            "backend = \"redis\"\nredis_endpoints = [\"10.0.0.1:26379\"]",
            "not on loopback",
        ),
        (
            "backend = \"redis\"\nredis_master = \"\"",
            "redis_master \"\" must be",
        ),
        (
            "backend = \"redis\"\nredis_master = \"my master\"",
            "redis_master \"my master\" must be",
        ),
        (
            "backend = \"redis\"\nredis_prefix = \"lockd{x}\"",
            "redis_prefix \"lockd{x}\" must be",
        ),
        (
            "backend = \"redis\"\nredis_leader_ttl_ms = 10",
            "redis_leader_ttl_ms must be",
        ),
        (
            "backend = \"redis\"\nredis_request_timeout_ms = 0",
            "redis_request_timeout_ms must be",
        ),
        (
            "backend = \"redis\"\nredis_wait_replicas = 17",
            "redis_wait_replicas must be",
        ),
        (
            "backend = \"redis\"\nredis_wait_replicas = -1",
            "invalid value",
        ),
        (
            "backend = \"etcd\"\netcd_endpoints = []",
            "at least one etcd member",
        ),
        (
            "backend = \"etcd\"\netcd_endpoints = [\"h1:2379\"]",
            "must be an http:// or https:// URL",
        ),
        (
            "backend = \"etcd\"\netcd_endpoints = [\"http://localhost:x@192.0.2.2:2379\"]",
            "must not contain user information",
        ),
        (
            "backend = \"etcd\"\netcd_leader_ttl_ms = 500",
            "etcd_leader_ttl_ms must be",
        ),
        (
            "backend = \"etcd\"\netcd_max_txn_ops = 1",
            "etcd_max_txn_ops must be",
        ),
        (
            "backend = \"etcd\"\netcd_max_txn_ops = 65",
            "etcd_max_txn_ops must be 66 ..= 100000, so that an AcquireAll of 32",
        ),
        (
            "backend = \"etcd\"\netcd_compact_every_ms = 10",
            "etcd_compact_every_ms must be",
        ),
        (
            "backend = \"etcd\"\nadvertise = \"10.0.0.5:7420\"",
            "advertise \"10.0.0.5:7420\" must be an http:// or https:// URL",
        ),
        (
            "backend = \"etcd\"\nlisten = \"0.0.0.0:7420\"",
            "set advertise",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let err = Config::from_cli(&cli(&["--config", file.to_str().unwrap()])).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{text:?} gave {msg:?}");
    }
    let missing = Config::from_cli(&cli(&["--config", "/nonexistent/lockd.toml"])).unwrap_err();
    assert!(format!("{missing:#}").contains("cannot read config file"));
    assert!(Cli::try_parse_from(["lockd", "--listen", "nowhere"]).is_err());
    let bad_log = Config::from_cli(&cli(&["--log", "lockd=[[["])).unwrap_err();
    assert!(format!("{bad_log:#}").contains("log filter"));
}

#[test]
fn loopback_urls_are_told_from_the_others() {
    for (url, loopback) in [
        ("http://127.0.0.1:2379", true),
        ("http://127.8.9.1:2379", true),
        ("http://localhost:2379", true),
        ("http://[::1]:2379", true),
        ("http://[fe80::1]:2379", false),
        ("http://10.0.0.1:2379", false),
        ("http://etcd-1:2379", false),
        ("http://127.0.0.1.example.com:2379", false),
    ] {
        assert_eq!(super::loopback_url(url), loopback, "{url}");
    }
}

#[test]
fn etcd_endpoints_come_comma_separated() {
    let c = Config::from_cli(&cli(&[
        "--backend",
        "etcd",
        "--etcd-endpoints",
        "http://h1:2379,http://h2:2379,http://h3:2379",
        "--insecure",
    ]))
    .unwrap();
    assert_eq!(c.backend, Backend::Etcd);
    assert_eq!(c.etcd_endpoints.len(), 3);
    assert_eq!(c.etcd_endpoints[2], "http://h3:2379");
}

#[test]
fn print_config_round_trips_through_the_file_format() {
    let c = Config::default();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lockd.toml");
    std::fs::write(&file, c.to_toml()).unwrap();
    assert_eq!(
        Config::from_cli(&cli(&["--config", file.to_str().unwrap()])).unwrap(),
        c
    );
}

/// docs/config.md is the operators' reference: every key, flag and variable must be in it.
#[test]
fn the_config_reference_lists_every_setting() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md"))
        .unwrap();
    // Every optional setting set, so that it is printed and checked too.
    let p = Some(PathBuf::from("f"));
    let all = Config {
        etcd_ca: p.clone(),
        etcd_cert: p.clone(),
        etcd_key: p.clone(),
        advertise: Some("https://a".into()),
        fence_keys: p.clone(),
        policy: p.clone(),
        tls_cert: p.clone(),
        tls_key: p.clone(),
        tls_client_ca: p.clone(),
        tls_peer_ca: p,
        admin_listen: Some(SocketAddr::from(([127, 0, 0, 1], 7421))),
        audit_log: Some("-".into()),
        ..Config::default()
    };
    let value: toml::Value = toml::from_str(&all.to_toml()).unwrap();
    let mut keys = Vec::new();
    for (k, v) in value.as_table().unwrap() {
        match v.as_table() {
            Some(t) => keys.extend(t.keys().map(|sub| (format!("{k}.{sub}"), sub.clone()))),
            None => keys.push((k.clone(), k.clone())),
        }
    }
    assert!(keys.len() > 35, "{keys:?}");
    for (key, leaf) in keys {
        let flag = format!("--{}", leaf.replace('_', "-"));
        let env = format!("LOCKD_{}", leaf.to_uppercase());
        for needle in [format!("`{key}`"), format!("`{flag}`"), format!("`{env}`")] {
            assert!(
                doc.contains(&needle),
                "docs/config.md does not mention {needle}"
            );
        }
    }
}
