//! The checker against handcrafted histories: for each property one that breaks it and one that
//! keeps it, so that a checker that cannot fail would be caught here.

use verifier::check::Verdict;
use verifier::{Property, check, parse};

/// Builds a history line by line: `ev(kind, process, time_ms, f, resource, extra_json)`.
fn h(lines: &[String]) -> Vec<verifier::Event> {
    parse(lines.join("\n").as_bytes()).unwrap()
}

fn ev(kind: &str, process: &str, ms: u64, f: &str, resource: &str, extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(",{extra}")
    };
    format!(
        "{{\"type\":\"{kind}\",\"process\":\"{process}\",\"time\":{},\"f\":\"{f}\",\"resource\":\"{resource}\"{extra}}}",
        ms * 1_000_000
    )
}

fn acquire(p: &str, invoke_ms: u64, ok_ms: u64, r: &str, token: u64, ttl_ms: u64) -> Vec<String> {
    vec![
        ev("invoke", p, invoke_ms, "acquire", r, ""),
        ev(
            "ok",
            p,
            ok_ms,
            "acquire",
            r,
            &format!("\"token\":{token},\"ttl_ms\":{ttl_ms}"),
        ),
    ]
}

fn write(
    p: &str,
    invoke_ms: u64,
    end_ms: u64,
    kind: &str,
    r: &str,
    token: u64,
    name: &str,
) -> Vec<String> {
    let extra = format!("\"token\":{token},\"value\":\"{name}\"");
    vec![
        ev("invoke", p, invoke_ms, "write", r, &extra),
        ev(kind, p, end_ms, "write", r, &extra),
    ]
}

fn read(ms: u64, r: &str, names: &[&str]) -> String {
    let list: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    ev(
        "ok",
        "checker",
        ms,
        "read",
        r,
        &format!("\"value\":[{}]", list.join(",")),
    )
}

fn violated(v: &Verdict) -> bool {
    matches!(v, Verdict::Violated(_))
}

/// The zombie story, fenced: A's lease expires while it is paused, B takes the lock and writes,
/// A's late write with its old token is refused.
fn zombie_fenced() -> Vec<String> {
    let mut l = Vec::new();
    l.extend(acquire("A", 0, 1, "acct:1", 41, 1000));
    l.extend(write("A", 2, 3, "ok", "acct:1", 41, "a1"));
    l.push(ev("ok", "lockd", 1001, "expire", "acct:1", "\"token\":41"));
    l.extend(acquire("B", 1002, 1003, "acct:1", 42, 1000));
    l.extend(write("B", 1004, 1005, "ok", "acct:1", 42, "b1"));
    l.extend(write("A", 1006, 1007, "fail", "acct:1", 41, "a2"));
    l.push(read(2000, "acct:1", &["a1", "b1"]));
    l
}

#[test]
fn the_fenced_zombie_story_keeps_every_property() {
    let r = check(&h(&zombie_fenced()));
    assert!(r.ok(), "{r}");
    for p in Property::ALL {
        if matches!(
            p,
            Property::PermitsWithinBound | Property::ReadersExcludeWriters | Property::ReleasesKept
        ) {
            // The story has no semaphore, no read-write lock and no durable release.
            assert!(matches!(r.verdict(p), Verdict::NotShown(_)), "{r}");
            continue;
        }
        assert_eq!(r.verdict(p), &Verdict::Holds, "{}: {r}", p.name());
    }
}

#[test]
fn an_unfenced_zombie_write_breaks_fencing_and_is_named() {
    let mut l = zombie_fenced();
    // The store took A's late write after B's: what happens without the fence.
    let last = l.len() - 1;
    l.remove(last);
    let a2_end = l.len() - 1;
    l[a2_end] = l[a2_end].replace("\"type\":\"fail\"", "\"type\":\"ok\"");
    l.push(read(2000, "acct:1", &["a1", "b1", "a2"]));
    let r = check(&h(&l));
    assert!(!r.ok());
    let Verdict::Violated(vs) = r.verdict(Property::Fencing) else {
        panic!("{r}");
    };
    assert!(
        vs[0]
            .message
            .contains("write a2 with token 41 by A was accepted after write b1 with token 42 by B"),
        "{r}"
    );
    assert!(r.to_string().contains("VIOLATED  fencing"), "{r}");
}

#[test]
fn fencing_follows_the_resources_own_order_when_it_is_given() {
    // Overlapping writes: real time cannot order them, the store's index does.
    let mut l = vec![
        ev("invoke", "A", 0, "write", "r", r#""token":5,"value":"x""#),
        ev("invoke", "B", 0, "write", "r", r#""token":6,"value":"y""#),
        ev(
            "ok",
            "B",
            2,
            "write",
            "r",
            r#""token":6,"value":"y","index":1"#,
        ),
        ev(
            "ok",
            "A",
            3,
            "write",
            "r",
            r#""token":5,"value":"x","index":2"#,
        ),
    ];
    assert!(violated(check(&h(&l)).verdict(Property::Fencing)));
    // The other order is fine.
    l[2] = l[2].replace("\"index\":1", "\"index\":3");
    assert_eq!(check(&h(&l)).verdict(Property::Fencing), &Verdict::Holds);
}

#[test]
fn an_unknown_outcome_counts_only_if_the_store_shows_it() {
    let mut l = Vec::new();
    l.extend(write("B", 0, 1, "ok", "r", 42, "b"));
    l.extend(write("A", 2, 3, "info", "r", 41, "a"));
    l.push(read(10, "r", &["b"]));
    assert_eq!(check(&h(&l)).verdict(Property::Fencing), &Verdict::Holds);
    let last = l.len() - 1;
    l[last] = read(10, "r", &["b", "a"]);
    assert!(violated(check(&h(&l)).verdict(Property::Fencing)));
}

#[test]
fn two_holders_at_once_break_single_holder() {
    let mut l = Vec::new();
    l.extend(acquire("A", 0, 1, "r", 1, 1000));
    l.extend(acquire("B", 2, 3, "r", 2, 1000));
    let r = check(&h(&l));
    let Verdict::Violated(vs) = r.verdict(Property::SingleHolder) else {
        panic!("{r}");
    };
    assert!(
        vs[0]
            .message
            .contains("A (token 1) and B (token 2) both held"),
        "{r}"
    );
    // After A releases (or its lease runs out) B may hold it.
    let mut l = Vec::new();
    l.extend(acquire("A", 0, 1, "r", 1, 1000));
    l.push(ev("invoke", "A", 2, "release", "r", ""));
    l.push(ev("ok", "A", 3, "release", "r", ""));
    l.extend(acquire("B", 2, 3, "r", 2, 1000));
    l.extend(acquire("C", 1000, 1001, "r", 3, 1000));
    l.extend(acquire("D", 2004, 2005, "r", 4, 1000));
    let r = check(&h(&l));
    assert!(
        violated(r.verdict(Property::SingleHolder)),
        "B's and C's overlap: {r}"
    );
    l.truncate(l.len() - 4);
    assert_eq!(
        check(&h(&l)).verdict(Property::SingleHolder),
        &Verdict::Holds
    );
}

#[test]
fn tokens_must_rise_and_never_repeat() {
    let mut l = Vec::new();
    l.extend(acquire("A", 0, 1, "r", 7, 10));
    l.extend(acquire("B", 100, 101, "s", 7, 10));
    let r = check(&h(&l));
    let Verdict::Violated(vs) = r.verdict(Property::MonotoneTokens) else {
        panic!("{r}");
    };
    assert!(
        vs.iter()
            .any(|v| v.message.contains("token 7 was granted twice")),
        "{r}"
    );
    let mut l = Vec::new();
    l.extend(acquire("A", 0, 1, "r", 7, 10));
    l.extend(acquire("B", 100, 101, "s", 5, 10));
    assert!(violated(check(&h(&l)).verdict(Property::MonotoneTokens)));
    // Concurrent requests may be granted in either order.
    let mut l = Vec::new();
    l.extend(acquire("A", 0, 5, "r", 7, 10));
    l.extend(acquire("B", 1, 4, "s", 8, 10));
    l.extend(acquire("C", 100, 101, "r", 9, 10));
    assert_eq!(
        check(&h(&l)).verdict(Property::MonotoneTokens),
        &Verdict::Holds
    );
}

#[test]
fn a_lost_acknowledged_write_and_a_refused_write_that_landed_are_caught() {
    let mut l = Vec::new();
    l.extend(write("A", 0, 1, "ok", "r", 1, "a"));
    l.extend(write("B", 2, 3, "fail", "r", 1, "b"));
    l.push(read(10, "r", &["b"]));
    let r = check(&h(&l));
    assert!(
        violated(r.verdict(Property::AcknowledgedWritesPresent)),
        "{r}"
    );
    assert!(violated(r.verdict(Property::FailedWritesAbsent)), "{r}");
    let last = l.len() - 1;
    l[last] = read(10, "r", &["a"]);
    let r = check(&h(&l));
    assert_eq!(
        r.verdict(Property::AcknowledgedWritesPresent),
        &Verdict::Holds
    );
    assert_eq!(r.verdict(Property::FailedWritesAbsent), &Verdict::Holds);
}

#[test]
fn properties_a_history_cannot_show_are_said_so() {
    let r = check(&h(&[read(1, "r", &[])]));
    assert!(matches!(
        r.verdict(Property::SingleHolder),
        Verdict::NotShown(_)
    ));
    assert!(matches!(r.verdict(Property::Fencing), Verdict::NotShown(_)));
    assert!(r.ok());
}

/// A permit's acquire: invoked on the semaphore, granted on the permit `r` with the
/// semaphore's number of permits.
fn permit(p: &str, invoke_ms: u64, ok_ms: u64, r: &str, token: u64, n: u32) -> Vec<String> {
    let (semaphore, _) = r.rsplit_once("@permit-").expect("a permit's name");
    vec![
        ev("invoke", p, invoke_ms, "acquire", semaphore, ""),
        ev(
            "ok",
            p,
            ok_ms,
            "acquire",
            r,
            &format!("\"token\":{token},\"ttl_ms\":1000,\"permits\":{n}"),
        ),
    ]
}

#[test]
fn a_semaphore_of_two_holds_two_permits_and_a_third_at_once_is_caught() {
    let mut l = permit("A", 0, 1, "jobs@permit-1", 1, 2);
    l.extend(permit("B", 2, 3, "jobs@permit-2", 2, 2));
    // C gets permit 1 after A's lease ended: never more than two at once.
    l.extend(permit("C", 1_500, 1_501, "jobs@permit-1", 3, 2));
    let r = check(&h(&l));
    assert_eq!(
        r.verdict(Property::PermitsWithinBound),
        &Verdict::Holds,
        "{r}"
    );
    assert!(r.ok(), "{r}");

    // A planted bug: a third permit while both are held.
    l.extend(permit("D", 900, 901, "jobs@permit-3", 4, 2));
    let r = check(&h(&l));
    let Verdict::Violated(vs) = r.verdict(Property::PermitsWithinBound) else {
        panic!("a third permit of two must be caught: {r}");
    };
    let messages: Vec<&str> = vs.iter().map(|v| v.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("permit 3 of a semaphore of 2"))
            && messages
                .iter()
                .any(|m| m.contains("3 permits of a semaphore of 2")),
        "{messages:?}"
    );
}

#[test]
fn a_permit_given_twice_at_once_is_caught() {
    let mut l = permit("A", 0, 1, "jobs@permit-1", 1, 8);
    l.extend(permit("B", 2, 3, "jobs@permit-1", 2, 8));
    let r = check(&h(&l));
    let Verdict::Violated(vs) = r.verdict(Property::SingleHolder) else {
        panic!("permit 1 given twice must be caught: {r}");
    };
    assert!(vs[0].message.contains("jobs@permit-1"), "{vs:?}");
    // Within the bound of 8, so that property holds: each says what it judges.
    assert_eq!(r.verdict(Property::PermitsWithinBound), &Verdict::Holds);
}

#[test]
fn permits_are_only_a_permits_acquires() {
    for (line, needle) in [
        (
            ev(
                "ok",
                "A",
                1,
                "acquire",
                "jobs",
                "\"token\":1,\"ttl_ms\":10,\"permits\":2",
            ),
            "permit's name",
        ),
        (
            ev(
                "ok",
                "A",
                1,
                "acquire",
                "jobs@permit-1",
                "\"token\":1,\"ttl_ms\":10,\"permits\":0",
            ),
            "1 or more",
        ),
        (
            ev(
                "ok",
                "A",
                1,
                "write",
                "jobs@permit-1",
                "\"token\":1,\"value\":1,\"permits\":2",
            ),
            "only an acquire",
        ),
    ] {
        let err = parse(line.as_bytes()).expect_err(&line);
        assert!(err.to_string().contains(needle), "{line}: {err}");
    }
}

#[test]
fn a_permits_acquire_is_paired_with_its_invoke_on_the_semaphore() {
    // B asked after A's grant and got a higher token: fine. C asked after B's grant (token 3)
    // and got a lower one, which only its invoke, on the semaphore's name, can show.
    let mut l = permit("A", 0, 1, "jobs@permit-1", 1, 2);
    l.extend(permit("B", 2, 3, "jobs@permit-2", 3, 2));
    let r = check(&h(&l));
    assert_eq!(r.verdict(Property::MonotoneTokens), &Verdict::Holds, "{r}");
    l.extend(permit("C", 5, 6, "jobs@permit-1", 2, 2));
    let r = check(&h(&l));
    assert!(
        violated(r.verdict(Property::MonotoneTokens)),
        "C's acquire was invoked (on jobs) after token 3 was granted: {r}"
    );
}

/// An acquire of a side of a read-write lock: invoked on the lock, granted on `r` (a reader's
/// slot for `read`, the lock for `write`).
fn side(p: &str, invoke_ms: u64, ok_ms: u64, r: &str, token: u64, mode: &str) -> Vec<String> {
    let lock = fencing::owner_name(r);
    vec![
        ev(
            "invoke",
            p,
            invoke_ms,
            "acquire",
            lock,
            &format!("\"mode\":\"{mode}\""),
        ),
        ev(
            "ok",
            p,
            ok_ms,
            "acquire",
            r,
            &format!("\"token\":{token},\"ttl_ms\":1000,\"mode\":\"{mode}\""),
        ),
    ]
}

#[test]
fn readers_share_a_lock_and_a_reader_beside_its_writer_is_caught() {
    // Two readers at once, then a writer after both released, then a reader after it.
    let mut l = side("A", 0, 1, "doc@read-1", 1, "read");
    l.extend(side("B", 2, 3, "doc@read-2", 2, "read"));
    l.push(ev("invoke", "A", 10, "release", "doc@read-1", ""));
    l.push(ev("invoke", "B", 11, "release", "doc@read-2", ""));
    l.extend(side("W", 5, 12, "doc", 3, "write"));
    l.push(ev("invoke", "W", 20, "release", "doc", ""));
    l.extend(side("C", 13, 21, "doc@read-1", 4, "read"));
    let r = check(&h(&l));
    for p in [
        Property::ReadersExcludeWriters,
        Property::SingleHolder,
        Property::MonotoneTokens,
    ] {
        assert_eq!(r.verdict(p), &Verdict::Holds, "{}: {r}", p.name());
    }

    // A planted bug: a reader granted while the writer holds.
    l.extend(side("D", 14, 15, "doc@read-2", 5, "read"));
    let r = check(&h(&l));
    let Verdict::Violated(vs) = r.verdict(Property::ReadersExcludeWriters) else {
        panic!("a reader beside the writer must be caught: {r}");
    };
    assert!(
        vs.iter().any(|v| v.message.contains("reader D")
            && v.message.contains("writer W")
            && v.message.starts_with("doc:")),
        "{vs:?}"
    );
    // Each slot held once at a time, so single holder holds: each says what it judges.
    assert_eq!(r.verdict(Property::SingleHolder), &Verdict::Holds, "{r}");
}

#[test]
fn a_readers_acquire_is_paired_with_its_invoke_on_the_lock() {
    // C asked (on doc) after the writer's token 3 was granted and got token 2: only its
    // invoke on the lock's name shows it.
    let mut l = side("W", 0, 1, "doc", 3, "write");
    l.push(ev("invoke", "W", 2, "release", "doc", ""));
    l.extend(side("C", 5, 6, "doc@read-1", 2, "read"));
    let r = check(&h(&l));
    assert!(
        violated(r.verdict(Property::MonotoneTokens)),
        "C's acquire was invoked (on doc) after token 3 was granted: {r}"
    );
}

#[test]
fn a_mode_is_only_a_read_write_locks_acquires() {
    for (line, needle) in [
        (
            ev(
                "ok",
                "A",
                1,
                "acquire",
                "doc",
                "\"token\":1,\"ttl_ms\":10,\"mode\":\"read\"",
            ),
            "reader's slot",
        ),
        (
            ev(
                "ok",
                "A",
                1,
                "acquire",
                "doc@read-1",
                "\"token\":1,\"ttl_ms\":10,\"mode\":\"write\"",
            ),
            "not NAME@read-K",
        ),
        (
            ev(
                "ok",
                "A",
                1,
                "write",
                "doc",
                "\"token\":1,\"value\":1,\"mode\":\"write\"",
            ),
            "only an acquire",
        ),
        (
            ev(
                "ok",
                "A",
                1,
                "acquire",
                "doc",
                "\"token\":1,\"ttl_ms\":10,\"mode\":\"upgrade\"",
            ),
            "unknown variant",
        ),
    ] {
        let err = parse(line.as_bytes()).expect_err(&line);
        assert!(err.to_string().contains(needle), "{line}: {err}");
    }
}

/// A busy answer naming a lease whose durable release was acknowledged before the acquire was
/// invoked: the release was lost (a leader change undid it).
#[test]
fn releases_kept_catches_a_lease_back_after_its_durable_release() {
    let released = |durable: bool| {
        let extra = if durable {
            "\"token\":5,\"durable\":true"
        } else {
            "\"token\":5"
        };
        let mut lines = acquire("A", 0, 10, "r", 5, 10_000);
        lines.push(ev("invoke", "A", 20, "release", "r", "\"token\":5"));
        lines.push(ev("ok", "A", 30, "release", "r", extra));
        lines
    };
    let refused = |invoke_ms: u64| {
        vec![
            ev("invoke", "B", invoke_ms, "acquire", "r", ""),
            ev(
                "fail",
                "B",
                invoke_ms + 5,
                "acquire",
                "r",
                "\"note\":\"busy\",\"current_token\":5",
            ),
        ]
    };
    // Refused naming token 5 after its durable release: violated.
    let mut lines = released(true);
    lines.extend(refused(40));
    let report = check(&h(&lines));
    match report.verdict(Property::ReleasesKept) {
        Verdict::Violated(v) => assert!(v[0].message.contains("released token 5"), "{v:?}"),
        other => panic!("a lease back after its durable release: {other:?}"),
    }
    assert!(!report.ok());
    // Invoked before the release was acknowledged: the answer may predate it.
    let mut lines = released(true);
    lines.extend(refused(25));
    assert_eq!(
        check(&h(&lines)).verdict(Property::ReleasesKept),
        &Verdict::Holds
    );
    // A release not said to be durable (the embedded store's, answered before its sync)
    // promises nothing across a crash.
    let mut lines = released(false);
    lines.extend(refused(40));
    assert!(matches!(
        check(&h(&lines)).verdict(Property::ReleasesKept),
        Verdict::NotShown(_)
    ));
}

#[test]
fn durable_and_current_token_go_only_where_they_mean_something() {
    for (line, needle) in [
        (
            ev(
                "ok",
                "A",
                1,
                "acquire",
                "r",
                "\"token\":1,\"ttl_ms\":5,\"durable\":true",
            ),
            "durable is for a release's ok",
        ),
        (
            ev("ok", "A", 1, "release", "r", "\"durable\":true"),
            "a durable release needs its token",
        ),
        (
            ev(
                "ok",
                "A",
                1,
                "release",
                "r",
                "\"token\":1,\"current_token\":2",
            ),
            "current_token is for an acquire's fail",
        ),
        (
            ev("fail", "A", 1, "acquire", "r", "\"current_token\":0"),
            "current_token is in the token range",
        ),
    ] {
        let err = parse(line.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(needle), "{line}: {err}");
    }
}
