//! The SDK conformance suite (clients/conformance/scenarios.json), run by the Rust SDK against
//! the test bed (clients/testbed), as every other SDK runs it with its own test runner. The
//! PostgreSQL and HTTP steps declare the lease's fence token themselves (tokio-postgres, hyper):
//! the Rust SDK has no fencing helpers.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use lockd_client::{
    AcquireOptions, Acquired, AcquiredAll, Client, ClientError, LockGuard, LostReason, Mode,
    NotGrantedReason,
};
use serde_json::Value;
use tokio::task::JoinHandle;

/// The test bed: its servers, and its command line.
struct Bed {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    servers: Value,
}

impl Bed {
    fn start() -> Bed {
        Bed::start_with(&[])
    }

    fn start_with(args: &[&str]) -> Bed {
        let mut child = Command::new(e2e::bin("testbed"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the test bed");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("the test bed's description");
        let servers = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the test bed described its servers as {line:?}: {e}"));
        Bed {
            stdin: child.stdin.take(),
            child,
            stdout,
            servers,
        }
    }

    fn command(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .expect("to the test bed");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("the test bed's answer");
        assert!(answer.starts_with("ok"), "test bed {line:?}: {answer}");
    }

    /// A client of one of the bed's servers (plaintext), inside a runtime.
    fn client(&self, server: &str) -> Client {
        Client::connect_tls(&self.endpoint(server), &Default::default()).expect("a client")
    }

    fn endpoint(&self, server: &str) -> String {
        self.servers[server]["endpoint"]
            .as_str()
            .expect("an endpoint")
            .to_string()
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// What a lease name stands for: its facts, and its guards while held.
struct Named {
    token: u64,
    resource: String,
    lease_id: String,
    fence_token: String,
    ttl: Duration,
    guards: Vec<LockGuard>,
    client: Client,
}

type Outcome = Result<Vec<LockGuard>, String>;

struct Run<'a> {
    bed: &'a mut Bed,
    id: String,
    clients: HashMap<String, Client>,
    leases: HashMap<String, Named>,
    pending: HashMap<String, JoinHandle<Outcome>>,
    paused_at: Option<Instant>,
}

fn outcome_of(e: &ClientError) -> String {
    match e {
        ClientError::InvalidArgument(_) => "invalid".into(),
        ClientError::Rejected { code, .. } if *code == tonic::Code::PermissionDenied => {
            "permission_denied".into()
        }
        ClientError::Rejected { code, .. } if *code == tonic::Code::Unauthenticated => {
            "unauthenticated".into()
        }
        ClientError::Unavailable(_) => "unavailable".into(),
        other => format!("error: {other}"),
    }
}

fn not_granted(reason: NotGrantedReason) -> String {
    match reason {
        NotGrantedReason::Busy => "busy".into(),
        NotGrantedReason::WaitTimeout => "timeout".into(),
    }
}

fn one(r: Result<Acquired, ClientError>) -> Outcome {
    match r {
        Ok(Acquired::Granted(g)) => Ok(vec![g]),
        Ok(Acquired::NotGranted(why)) => Err(not_granted(why.reason)),
        Err(e) => Err(outcome_of(&e)),
    }
}

fn all(r: Result<AcquiredAll, ClientError>) -> Outcome {
    match r {
        Ok(AcquiredAll::Granted(gs)) => Ok(gs),
        Ok(AcquiredAll::NotGranted { why, .. }) => Err(not_granted(why.reason)),
        Err(e) => Err(outcome_of(&e)),
    }
}

fn ms(step: &Value, key: &str) -> Option<Duration> {
    step[key].as_u64().map(Duration::from_millis)
}

impl Run<'_> {
    fn s(&self, v: &Value) -> String {
        v.as_str().expect("a string").replace("{run}", &self.id)
    }

    fn options(&self, step: &Value) -> AcquireOptions {
        AcquireOptions {
            ttl: ms(step, "ttl_ms"),
            wait: ms(step, "wait_ms").unwrap_or_default(),
            request_id: step.get("request_id").map(|v| self.s(v)),
            owner: step.get("owner").map(|v| self.s(v)),
            permits: step["permits"].as_u64().unwrap_or(0) as u32,
            mode: match step["mode"].as_str() {
                Some("read") => Mode::Read,
                Some("write") => Mode::Write,
                _ => Mode::Exclusive,
            },
            ..AcquireOptions::default()
        }
    }

    fn client(&mut self, step: &Value) {
        let names: Vec<String> = match step.get("servers") {
            Some(list) => list.as_array().unwrap().iter().map(|v| self.s(v)).collect(),
            None => vec![self.s(&step["server"])],
        };
        let endpoints: Vec<String> = names.iter().map(|n| self.bed.endpoint(n)).collect();
        let mut tls = tlsconf::ClientFiles::default();
        let secure = &self.bed.servers["secure"];
        let mut token = None;
        if names[0] == "secure" {
            tls.ca = secure["ca"].as_str().map(Into::into);
            let tenant = &secure["tenants"][step["tenant"].as_str().unwrap_or("-")];
            if let Some(f) = tenant["token_file"].as_str() {
                token = Some(std::fs::read_to_string(f).expect("the token file"));
            }
            tls.cert = tenant["cert"].as_str().map(Into::into);
            tls.key = tenant["key"].as_str().map(Into::into);
        }
        let mut c = Client::connect_tls(&endpoints.join(","), &tls).expect("a client");
        if let Some(t) = token {
            c = c.with_token(&t).expect("a bearer token");
        }
        self.clients.insert(self.s(&step["name"]), c);
    }

    /// Checks an acquire's outcome against the step, and names what was granted.
    fn granted(&mut self, step: &Value, name: &str, client: Client, got: Outcome) {
        let expect = step["expect"].as_str().expect("expect");
        let guards = match got {
            Ok(guards) => {
                assert_eq!(expect, "granted", "{name}: granted, expected {expect}");
                guards
            }
            Err(outcome) => {
                assert_eq!(outcome, expect, "{name}");
                return;
            }
        };
        let first = guards[0].lease().clone();
        let token = first.token;
        let above = |other: &str, leases: &HashMap<String, Named>| leases[other].token;
        if let Some(other) = step["token_above"].as_str() {
            assert!(
                token > above(other, &self.leases),
                "{name}: token {token} not above {other}'s"
            );
        }
        if let Some(other) = step["same_token_as"].as_str() {
            assert_eq!(
                token,
                above(other, &self.leases),
                "{name}: not {other}'s token"
            );
        }
        if let Some(holds) = step["holds"].as_u64() {
            assert_eq!(first.holds as u64, holds, "{name}: holds");
        }
        if let Some(prefix) = step.get("resource_starts") {
            assert!(
                first.resource.starts_with(&self.s(prefix)),
                "{name}: {}",
                first.resource
            );
        }
        if let Some(list) = step["resources_held"].as_array() {
            let want: Vec<String> = list.iter().map(|v| self.s(v)).collect();
            let got: Vec<String> = guards.iter().map(|g| g.resource().to_string()).collect();
            assert_eq!(got, want, "{name}: the set's resources");
        }
        if step["signed"].as_bool() == Some(true) {
            let signed = first
                .signed_token
                .clone()
                .expect("a signed token from a lockd that signs");
            assert!(signed.starts_with(&format!("{token}.")), "{signed}");
            assert_eq!(first.fence_token(), signed);
        }
        self.leases.insert(
            name.to_string(),
            Named {
                token,
                resource: first.resource.clone(),
                lease_id: first.lease_id.clone(),
                fence_token: first.fence_token(),
                ttl: first.ttl,
                guards,
                client,
            },
        );
    }

    async fn step(&mut self, step: &Value) {
        let op = step["op"].as_str().expect("op");
        let name = step["as"].as_str().unwrap_or_default().to_string();
        let client = || self.clients[step["client"].as_str().unwrap_or_default()].clone();
        match op {
            "client" => self.client(step),
            "acquire" => {
                let c = client();
                let got = one(c
                    .acquire(&self.s(&step["resource"]), self.options(step))
                    .await);
                self.granted(step, &name, c, got);
            }
            "start_acquire" => {
                let (c, resource, opts) = (client(), self.s(&step["resource"]), self.options(step));
                let task = tokio::spawn(async move { one(c.acquire(&resource, opts).await) });
                self.pending.insert(name, task);
            }
            "await" => {
                let of = step["of"].as_str().unwrap();
                let task = self.pending.remove(of).expect("a started acquire");
                let got = match tokio::time::timeout(e2e::PATIENCE, task).await {
                    Ok(Ok(outcome)) => outcome,
                    Ok(Err(e)) if e.is_cancelled() => Err("cancelled".to_string()),
                    Ok(Err(e)) => panic!("{of}: {e}"),
                    Err(_) => panic!("{of} did not finish"),
                };
                let c = self.clients.values().next().unwrap().clone();
                self.granted(step, of, c, got);
            }
            // Dropping the acquire's future cancels its call: lockd forgets the waiter.
            "cancel" => self.pending[step["of"].as_str().unwrap()].abort(),
            "cut_renewals" => self.bed.command(if step["on"].as_bool().unwrap() {
                "cut-renewals on"
            } else {
                "cut-renewals off"
            }),
            "hold_next_call" => self.bed.command(&format!(
                "hold-next-call {}",
                step["after"].as_u64().unwrap_or(0)
            )),
            "wait_held" => self.bed.command("wait-held"),
            "wait_held_answered" => self.bed.command("wait-held-answered"),
            "wait_cuts" => self
                .bed
                .command(&format!("wait-cuts {}", step["at_least"].as_u64().unwrap())),
            "wait_free" => wait_free(&client(), &self.s(&step["resource"])).await,
            "wait_waiters" => {
                let (c, resource) = (client(), self.s(&step["resource"]));
                let want = step["waiters"].as_u64().unwrap() as u32;
                let deadline = Instant::now() + e2e::PATIENCE;
                while c.describe(&resource).await.unwrap().waiters != want {
                    assert!(
                        Instant::now() < deadline,
                        "{resource}: never {want} waiters"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            "release" => {
                let lease = self
                    .leases
                    .get_mut(step["lease"].as_str().unwrap())
                    .unwrap();
                let mut released = !lease.guards.is_empty();
                for g in lease.guards.drain(..).rev() {
                    released &= g.release().await.unwrap();
                }
                assert_eq!(
                    Some(released),
                    step["expect"].as_bool(),
                    "release of {step}"
                );
            }
            "end_behind" => {
                let l = &self.leases[step["lease"].as_str().unwrap()];
                assert!(l.client.release(&l.resource, &l.lease_id).await.unwrap());
            }
            "release_by_id" => {
                let l = &self.leases[step["lease"].as_str().unwrap()];
                let got = client().release(&l.resource, &l.lease_id).await.unwrap();
                assert_eq!(
                    Some(got),
                    step["expect"].as_bool(),
                    "release_by_id of {step}"
                );
            }
            "describe" => {
                let d = client().describe(&self.s(&step["resource"])).await.unwrap();
                if let Some(held) = step["held"].as_bool() {
                    assert_eq!(d.held, held, "{d:?}");
                }
                if let Some(by) = step["held_by"].as_str() {
                    assert_eq!(d.token, Some(self.leases[by].token), "{d:?}");
                }
                if let Some(w) = step["waiters"].as_u64() {
                    assert_eq!(d.waiters as u64, w, "{d:?}");
                }
            }
            "pause" | "resume" => {
                if op == "pause" {
                    self.paused_at = Some(Instant::now());
                }
                self.bed
                    .command(&format!("{op} {}", self.s(&step["server"])));
            }
            "drop_next_answer" => self.bed.command(&format!(
                "drop-next-answer {}",
                step["after"].as_u64().unwrap_or(0)
            )),
            "await_lost" => {
                let l = &self.leases[step["lease"].as_str().unwrap()];
                let lost = l.guards[0].lost();
                let reason = tokio::time::timeout(e2e::PATIENCE, lost)
                    .await
                    .expect("no loss signalled");
                if step["within_ttl_of_pause"].as_bool() == Some(true) {
                    let after = self.paused_at.expect("a pause").elapsed();
                    assert!(
                        after < l.ttl,
                        "the loss came {after:?} after the pause, TTL {:?}",
                        l.ttl
                    );
                    assert_eq!(reason, LostReason::DeadlinePassed);
                }
                if step["reason"].as_str() == Some("not_current") {
                    assert!(matches!(reason, LostReason::NotCurrent(_)), "{reason:?}");
                }
            }
            "acquire_all" | "acquire_ordered" => {
                let c = client();
                let names: Vec<String> = step["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| self.s(v))
                    .collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let got = match op {
                    "acquire_all" => all(c.acquire_all(&names, self.options(step)).await),
                    _ => all(c.acquire_ordered(&names, self.options(step)).await),
                };
                self.granted(step, &name, c, got);
            }
            "pg_write" | "pg_read" | "pg_pool_check" => self.pg(step).await,
            "http_write" => {
                let l = &self.leases[step["lease"].as_str().unwrap()];
                let url = format!(
                    "{}{}",
                    self.bed.servers["http"]["url"].as_str().unwrap(),
                    self.s(&step["path"])
                );
                let headers = [
                    ("fencing-resource", l.resource.as_str()),
                    ("fencing-token", l.fence_token.as_str()),
                ];
                let a = e2e::client::send(
                    &e2e::client::client(),
                    "PUT",
                    &url,
                    &headers,
                    e2e::client::body("{}"),
                )
                .await;
                let got = match a.status {
                    200 => "ok",
                    409 => "stale",
                    other => panic!("PUT {url}: {other} {}", a.text()),
                };
                assert_eq!(Some(got), step["expect"].as_str(), "http_write with {step}");
            }
            other => panic!("unknown step {other:?}"),
        }
    }

    async fn pg(&mut self, step: &Value) {
        let dsn = self.bed.servers["pg"]["dsn"].as_str().unwrap();
        let (c, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
            .await
            .expect("connecting through fence-proxy");
        tokio::spawn(conn);
        let declare = "SELECT set_config('fencing.resource', $1, true), set_config('fencing.token', $2, true)";
        let upsert =
            "INSERT INTO conformance VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v";
        let key = self.s(&step["key"]);
        let mut c = c;
        match step["op"].as_str().unwrap() {
            "pg_write" => {
                let l = &self.leases[step["lease"].as_str().unwrap()];
                let value = self.s(&step["value"]);
                let tx = c.transaction().await.unwrap();
                let write = async {
                    tx.query(declare, &[&l.resource, &l.fence_token]).await?;
                    tx.execute(upsert, &[&key, &value]).await?;
                    tx.commit().await
                };
                let got = match write.await {
                    Ok(()) => "ok".to_string(),
                    Err(e) => match e.code().map(|c| c.code()) {
                        Some("FN001") | Some("FN003") => "stale".to_string(),
                        _ => panic!("pg_write: {e}"),
                    },
                };
                assert_eq!(
                    Some(got.as_str()),
                    step["expect"].as_str(),
                    "pg_write with {step}"
                );
            }
            "pg_read" => {
                let row = c
                    .query_one("SELECT v FROM conformance WHERE k = $1", &[&key])
                    .await
                    .unwrap();
                assert_eq!(row.get::<_, String>(0), self.s(&step["value"]));
            }
            _ => {
                let l = &self.leases[step["lease"].as_str().unwrap()];
                let settings = "SELECT coalesce(current_setting('fencing.resource', true), ''), coalesce(current_setting('fencing.token', true), '')";
                for commit in [true, false] {
                    let tx = c.transaction().await.unwrap();
                    tx.query(declare, &[&l.resource, &l.fence_token])
                        .await
                        .unwrap();
                    tx.execute(upsert, &[&key, &"rust"]).await.unwrap();
                    match commit {
                        true => tx.commit().await.unwrap(),
                        false => tx.rollback().await.unwrap(),
                    }
                    let row = c.query_one(settings, &[]).await.unwrap();
                    let seen: (String, String) = (row.get(0), row.get(1));
                    assert_eq!(
                        seen,
                        (String::new(), String::new()),
                        "after a {} transaction",
                        if commit { "committed" } else { "rolled back" }
                    );
                }
            }
        }
    }
}

#[test]
fn every_scenario_of_the_suite_passes_with_the_rust_sdk() {
    let text = std::fs::read_to_string(e2e::workspace().join("clients/conformance/scenarios.json"))
        .expect("the conformance suite");
    let suite: Value = serde_json::from_str(&text).expect("scenarios.json is JSON");
    let scenarios = suite["scenarios"].as_array().expect("scenarios");
    assert!(scenarios.len() >= 18, "the suite lost scenarios");
    let mut bed = Bed::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (n, scenario) in scenarios.iter().enumerate() {
        let title = scenario["name"].as_str().unwrap();
        eprintln!("scenario {title}");
        let mut run = Run {
            bed: &mut bed,
            id: format!("rust{n}-{}", std::process::id()),
            clients: HashMap::new(),
            leases: HashMap::new(),
            pending: HashMap::new(),
            paused_at: None,
        };
        rt.block_on(async {
            for (i, step) in scenario["steps"].as_array().unwrap().iter().enumerate() {
                eprintln!("  step {i}: {step}");
                run.step(step).await;
            }
        });
    }
}

/// A set's acquire given up while its request has not reached lockd: the test bed holds the
/// AcquireAll back, drops its cancellation, and passes it on once lockd has answered a later
/// call on the connection. lockd then grants the given-up set; the SDK's clean-up must ask
/// again under the same request id (the later call) and release what that finds. Without a
/// clean-up for sets, nothing is asked again and `wait-held-answered` fails.
#[test]
fn a_set_handled_after_it_was_given_up_leaves_nothing_held() {
    let (mut bed, rt) = (
        Bed::start_with(&["--no-pg"]),
        tokio::runtime::Runtime::new().unwrap(),
    );
    let _in_rt = rt.enter();
    let (direct, lossy) = (bed.client("lockd"), bed.client("lossy"));
    let names: Vec<String> = ["x", "y"]
        .iter()
        .map(|n| format!("set-late/{}/{n}", std::process::id()))
        .collect();
    bed.command("hold-next-call");
    let given_up = {
        let names = names.clone();
        rt.spawn(async move {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let opts = AcquireOptions {
                ttl: Some(Duration::from_secs(30)),
                wait: Duration::from_secs(60),
                ..AcquireOptions::default()
            };
            lossy.acquire_all(&refs, opts).await
        })
    };
    bed.command("wait-held");
    given_up.abort();
    let ended = rt.block_on(given_up);
    assert!(
        ended.is_err_and(|e| e.is_cancelled()),
        "the set's acquire ended before it was given up"
    );
    bed.command("wait-held-answered");
    rt.block_on(async {
        for r in &names {
            wait_free(&direct, r).await;
        }
    });
}

/// A downgrade dropped after lockd made it (its answer lost, its retry held back by the test
/// bed until a later call is answered) leaves no reader behind: the clean-up asks again under
/// the same request id and releases the reader. Without a clean-up for downgrades, nothing
/// is asked again and `wait-held-answered` fails.
#[test]
fn a_downgrade_given_up_midway_leaves_nothing_held() {
    let (mut bed, rt) = (
        Bed::start_with(&["--no-pg"]),
        tokio::runtime::Runtime::new().unwrap(),
    );
    let _in_rt = rt.enter();
    let (direct, lossy) = (bed.client("lockd"), bed.client("lossy"));
    let r = format!("downgrade-late/{}", std::process::id());
    let opts = AcquireOptions {
        ttl: Some(Duration::from_secs(30)),
        mode: Mode::Write,
        ..AcquireOptions::default()
    };
    let writer = match rt.block_on(lossy.acquire(&r, opts)).unwrap() {
        Acquired::Granted(g) => g,
        Acquired::NotGranted(why) => panic!("{r}: {why:?}"),
    };
    for cmd in ["cut-renewals off", "hold-next-call 1", "drop-next-answer"] {
        bed.command(cmd);
    }
    let given_up = rt.spawn(writer.downgrade());
    bed.command("wait-cuts 1");
    bed.command("wait-held");
    given_up.abort();
    let ended = rt.block_on(given_up);
    assert!(
        ended.is_err_and(|e| e.is_cancelled()),
        "the downgrade ended before it was given up"
    );
    bed.command("wait-held-answered");
    rt.block_on(wait_free(&direct, &r));
}

/// Returns once `resource` has no holder, permit or reader; fails after 10 s, long before the
/// 30 s TTL of a lease left behind. An SDK's clean-up runs in the background, with nothing
/// else to wait on; each look is a round trip.
async fn wait_free(c: &Client, resource: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = c.describe(resource).await.unwrap();
        if !d.held && d.permits_held.unwrap_or(0) == 0 && d.readers.unwrap_or(0) == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{resource} stayed held: {d:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
