//! `kill -9` of lockd during a burst of concurrent grants, then a restart on the same data
//! directory: no acknowledged grant is lost, and no token is ever issued twice.
//!
//! Uses the raw gRPC client (no SDK retries), so that "acknowledged" means exactly "a reply
//! with a grant arrived before the kill".

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use e2e::Lockd;
use lockd_proto::v1::acquire_response::Outcome;
use lockd_proto::v1::lock_service_client::LockServiceClient;
use lockd_proto::v1::{AcquireRequest, DescribeRequest, RenewRequest};
use tonic::transport::Channel;

const WRITERS: usize = 32;
const KILL_AFTER_ACKS: usize = 300;

#[derive(Clone, Debug)]
struct Acked {
    resource: String,
    lease_id: String,
    token: u64,
}

async fn connect(endpoint: &str) -> LockServiceClient<Channel> {
    LockServiceClient::new(
        Channel::from_shared(endpoint.to_string())
            .unwrap()
            .connect()
            .await
            .expect("connect to lockd"),
    )
}

fn acquire(resource: &str, request_id: &str) -> AcquireRequest {
    AcquireRequest {
        resource: resource.to_string(),
        request_id: request_id.to_string(),
        ttl_ms: 600_000,
        wait_timeout_ms: 0,
        holder: "crash-test".to_string(),
        owner: Default::default(),
        permits: 0,
        mode: 0,
        downgrade_lease_id: String::new(),
    }
}

#[test]
fn kill_9_during_a_burst_of_grants_loses_no_acknowledged_grant() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut lockd = Lockd::start(dir.path(), &[]);

    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let unacked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    rt.block_on(async {
        let client = connect(&lockd.endpoint).await;
        let count = Arc::new(AtomicUsize::new(0));
        let enough = Arc::new(tokio::sync::Notify::new());
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let (mut client, acked, unacked) = (client.clone(), acked.clone(), unacked.clone());
            let (count, enough) = (count.clone(), enough.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0.. {
                    let (resource, request_id) = (format!("burst-{w}-{i}"), format!("req-{w}-{i}"));
                    match client
                        .acquire(acquire(&resource, &request_id))
                        .await
                        .map(|r| r.into_inner().outcome)
                    {
                        Ok(Some(Outcome::Granted(l))) => {
                            acked.lock().unwrap().push(Acked {
                                resource,
                                lease_id: l.lease_id,
                                token: l.token,
                            });
                            if count.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AFTER_ACKS {
                                enough.notify_one();
                            }
                        }
                        other => {
                            // The kill: the outcome of this request is unknown.
                            assert!(
                                !matches!(other, Ok(Some(Outcome::NotGranted(_)))),
                                "fresh resources are never busy"
                            );
                            unacked.lock().unwrap().push((resource, request_id));
                            return;
                        }
                    }
                }
            }));
        }
        enough.notified().await;
        lockd.kill9();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let acked = acked.lock().unwrap().clone();
    let unacked = unacked.lock().unwrap().clone();
    assert!(acked.len() >= KILL_AFTER_ACKS);
    let max_acked = acked.iter().map(|a| a.token).max().unwrap();
    let mut tokens: HashSet<u64> = acked.iter().map(|a| a.token).collect();
    assert_eq!(tokens.len(), acked.len(), "acknowledged tokens are unique");

    let lockd = Lockd::start(dir.path(), &[]);
    rt.block_on(async {
        let mut client = connect(&lockd.endpoint).await;
        // Every acknowledged grant survived, with its token, and its holder can still renew it.
        for a in &acked {
            let d = client.describe(DescribeRequest { resource: a.resource.clone() }).await.unwrap().into_inner();
            assert!(d.held && d.token == a.token, "acknowledged grant {a:?} lost: {d:?}");
            let renew = RenewRequest { resource: a.resource.clone(), lease_id: a.lease_id.clone() };
            client.renew(renew).await.unwrap_or_else(|s| panic!("renew of {a:?} after restart: {s}"));
        }
        // Requests whose outcome was unknown: a retry with the same request id either finds the
        // grant made before the kill (a duplicate) or gets a new one, never a second lease.
        let mut pre_crash_unacknowledged = 0;
        for (resource, request_id) in &unacked {
            let reply = client.acquire(acquire(resource, request_id)).await.unwrap().into_inner();
            let Some(Outcome::Granted(l)) = reply.outcome else { panic!("retry of {request_id} not granted: {reply:?}") };
            assert!(tokens.insert(l.token), "token {} issued twice", l.token);
            if l.duplicate {
                pre_crash_unacknowledged += 1;
            } else {
                assert!(l.token > max_acked, "token {} issued after the restart is not above {max_acked}", l.token);
            }
        }
        // Fresh grants after the restart are above every token acknowledged before it.
        for i in 0..20 {
            let reply = client.acquire(acquire(&format!("after-{i}"), &format!("after-{i}"))).await.unwrap().into_inner();
            let Some(Outcome::Granted(l)) = reply.outcome else { panic!("{reply:?}") };
            assert!(l.token > max_acked && tokens.insert(l.token), "token {} after restart; max acknowledged {max_acked}", l.token);
        }
        eprintln!(
            "acknowledged {} grants (max token {max_acked}); {} in flight at the kill, {pre_crash_unacknowledged} of them granted before it",
            acked.len(),
            unacked.len()
        );
    });
}
