//! Sends COUNT fenced writes, each for a new resource (so each raises and stores a mark), to a
//! fence-proxy at URL, CONCURRENCY at a time; prints the rate. Used by bench/http.sh to measure
//! the proxy's memory with a million marks.
//!
//! Run: `cargo run --release -p http-relay --example fill_marks -- http://127.0.0.1:8420 1000000 64`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, count, concurrency) = match &args[..] {
        [_, url, count, concurrency] => (
            url.clone(),
            count.parse::<u64>().expect("COUNT"),
            concurrency.parse::<u64>().expect("CONCURRENCY"),
        ),
        _ => {
            eprintln!("usage: fill_marks URL COUNT CONCURRENCY");
            std::process::exit(2);
        }
    };
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, next, failed, url) = (
            client.clone(),
            Arc::clone(&next),
            Arc::clone(&failed),
            url.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let req = hyper::Request::post(format!("{url}/m"))
                    .header("fencing-resource", format!("mark-{i:08}"))
                    .header("fencing-token", "1")
                    .body(Empty::new())
                    .expect("a valid request");
                match client.request(req).await {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.into_body().collect().await;
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("a filler task");
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "sent={count} failed={} seconds={secs:.1} rate={:.0}",
        failed.load(Ordering::Relaxed),
        count as f64 / secs
    );
}
