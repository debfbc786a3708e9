//! One fence-proxy process serving a PostgreSQL listener and an HTTP listener together.

use e2e::client::{body, client, send};
use e2e::pg::Postgres;
use e2e::upstream::Upstream;

use crate::{code, connect, runtime};

#[test]
fn one_process_fences_postgres_and_http_side_by_side() {
    let pg = Postgres::start();
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "data_dir = \"{}\"\n[[pg]]\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{}\"\nschema_urls = [\"{}\"]\n[[http]]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n",
        dir.path().join("data").display(),
        pg.port,
        pg.url(),
        upstream.url()
    );
    let proxy = e2e::FenceProxy::start_with(dir.path(), &config, 1, 1);
    pg.psql("CREATE TABLE t (v text); INSERT INTO t VALUES ('init')");
    let rt = runtime();
    rt.block_on(async {
        let c = connect(&proxy.pg[0]).await;
        c.batch_execute(
            "SET fencing.resource = 'sku-1'; SET fencing.token = '5'; UPDATE t SET v = 'pg'",
        )
        .await
        .unwrap();
        let e = c
            .batch_execute("SET fencing.token = '4'; UPDATE t SET v = 'stale'")
            .await
            .unwrap_err();
        assert_eq!(code(&e), "FN001", "{e}");

        let h = client();
        let url = format!("{}/inventory/sku-1", proxy.urls[0]);
        let put = |token: &'static str| {
            let h = &h;
            let url = &url;
            async move {
                send(
                    h,
                    "PUT",
                    url,
                    &[("fencing-resource", "sku-1"), ("fencing-token", token)],
                    body("n=1"),
                )
                .await
                .status
            }
        };
        assert_eq!(put("7").await, 200);
        assert_eq!(put("6").await, 409);
    });
    assert_eq!(pg.psql("SELECT v FROM t"), "pg");
}
