//! Invariant 4 for the PostgreSQL mode: the marks live in the protected database, so two proxies
//! in front of it, and a proxy restarted after `kill -9`, keep them.

use crate::{code, holder, runtime, setup, start_proxy};

#[test]
fn two_proxies_and_a_restart_keep_the_marks() {
    let mut s = setup(1000);
    let dir2 = tempfile::tempdir().unwrap();
    let second = start_proxy(&dir2, &s.pg, 1000, "");
    s.pg.psql("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'init')");
    let write = |addr: String, token: i64, v: &'static str| async move {
        let c = holder(&addr, "shared", token).await;
        c.execute("UPDATE t SET v = $1 WHERE id = 1", &[&v]).await
    };
    runtime().block_on(async {
        write(s.addr().to_string(), 10, "ten").await.unwrap();
        // The second proxy has never seen token 10: PostgreSQL refuses 9 anyway.
        let e = write(second.pg[0].clone(), 9, "nine").await.unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");
        write(second.pg[0].clone(), 11, "eleven").await.unwrap();
        let e = write(s.addr().to_string(), 10, "ten again")
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");
    });
    s.proxy.kill9();
    s.proxy = start_proxy(&s.dir, &s.pg, 1000, "");
    runtime().block_on(async {
        let e = write(s.addr().to_string(), 10, "after restart")
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");
        write(s.addr().to_string(), 11, "eleven again")
            .await
            .unwrap();
    });
    assert_eq!(s.pg.psql("SELECT v FROM t"), "eleven again");
}
