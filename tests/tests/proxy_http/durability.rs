//! High-water marks survive `kill -9` of the proxy.

use e2e::FenceProxy;
use e2e::client::{body, client, send};
use e2e::upstream::Upstream;

use crate::{proxy, runtime};

#[test]
fn after_kill_9_and_restart_a_stale_token_is_still_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let mut px = proxy(dir.path(), &upstream, "", "");
    let rt = runtime();
    let c = client();
    for i in 0..50u64 {
        let (r, t) = (format!("item-{i}"), (100 + i).to_string());
        let a = rt.block_on(send(
            &c,
            "PUT",
            &format!("{}/w", px.urls[0]),
            &[("fencing-resource", &r), ("fencing-token", &t)],
            body(""),
        ));
        assert_eq!(a.status, 200);
    }
    px.kill9();
    // Same data directory, new process (the configuration file is rewritten by the harness).
    let config = std::fs::read_to_string(dir.path().join("proxy.toml")).unwrap();
    let body_of_config = config.lines().skip(2).collect::<Vec<_>>().join("\n");
    let px = FenceProxy::start(dir.path(), &body_of_config, 1);
    px.process
        .wait_events("loaded the high-water marks", 1, |e| e["marks"] == 50);
    for i in 0..50u64 {
        let (r, t) = (format!("item-{i}"), (99 + i).to_string());
        let a = rt.block_on(send(
            &c,
            "PUT",
            &format!("{}/w", px.urls[0]),
            &[("fencing-resource", &r), ("fencing-token", &t)],
            body(""),
        ));
        assert_eq!(a.status, 409, "{r}: token {t} accepted after the restart");
        assert_eq!(a.json()["highest"].as_u64(), Some(100 + i));
    }
}
