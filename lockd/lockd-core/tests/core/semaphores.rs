//! Transcripts of semaphores: N permits, each its own lease and token on its own name.

use expect_test::expect;

use crate::harness::check;

#[test]
fn permits_are_granted_lowest_first_then_busy_then_handed_to_waiters_in_order() {
    check(
        r#"
        @0 acquire jobs holder=a ttl=1000 permits=2
        @1 acquire jobs holder=b ttl=1000 permits=2
        @2 acquire jobs holder=c ttl=1000 permits=2
        @3 acquire jobs holder=d ttl=1000 permits=2 wait=5000
        @4 acquire jobs holder=e ttl=1000 permits=2 wait=5000
        @5 describe jobs
        @6 describe jobs@permit-2
        # each permit is renewed and released under its own name, not the semaphore's
        @6 renew jobs L2
        @6 release jobs L2
        @7 renew jobs@permit-2 L2
        @8 release jobs@permit-1 L1
        @9 release jobs@permit-2 L2
        @10 describe jobs
        @11 release jobs@permit-1 L3
        @12 release jobs@permit-2 L4
        # unused again: it is forgotten, and the next Acquire may choose another number
        @13 describe jobs
        @14 acquire jobs holder=f permits=3
        "#,
        expect![[r#"
            @0 acquire jobs holder=a ttl=1000 permits=2
              => granted jobs@permit-1 token=1 lease=L1 expires=1000
              ! persist grant jobs@permit-1 token=1 lease=L1 holder="a" ttl=1000 req=- permits=2
            @1 acquire jobs holder=b ttl=1000 permits=2
              => granted jobs@permit-2 token=2 lease=L2 expires=1001
              ! persist grant jobs@permit-2 token=2 lease=L2 holder="b" ttl=1000 req=- permits=2
            @2 acquire jobs holder=c ttl=1000 permits=2
              => busy holder="a" token=1 expires=1000 waiters=0
            @3 acquire jobs holder=d ttl=1000 permits=2 wait=5000
              => queued w1 position=1
            @4 acquire jobs holder=e ttl=1000 permits=2 wait=5000
              => queued w2 position=2
            @5 describe jobs
              => semaphore permits=2 held=2 waiters=2
            @6 describe jobs@permit-2
              => held holder="b" token=2 expires=1001 ttl=1000 waiters=2
            @6 renew jobs L2
              => error: jobs is a semaphore of 2 permits, not a lease: a permit is renewed and released under its own name, jobs@permit-K (the resource its grant names)
            @6 release jobs L2
              => not held: a semaphore of 2 permits
            @7 renew jobs@permit-2 L2
              => renewed expires=1007 ttl=1000
            @8 release jobs@permit-1 L1
              => released token=1 held=8
              ! persist remove jobs@permit-1 L1
              ! persist grant jobs@permit-1 token=3 lease=L3 holder="d" ttl=1000 req=- permits=2
              ! hand-off w1: jobs@permit-1 token=3 lease=L3 expires=1008
            @9 release jobs@permit-2 L2
              => released token=2 held=8
              ! persist remove jobs@permit-2 L2
              ! persist grant jobs@permit-2 token=4 lease=L4 holder="e" ttl=1000 req=- permits=2
              ! hand-off w2: jobs@permit-2 token=4 lease=L4 expires=1009
            @10 describe jobs
              => semaphore permits=2 held=2 waiters=0
            @11 release jobs@permit-1 L3
              => released token=3 held=3
              ! persist remove jobs@permit-1 L3
            @12 release jobs@permit-2 L4
              => released token=4 held=3
              ! persist remove jobs@permit-2 L4
            @13 describe jobs
              => free waiters=0
            @14 acquire jobs holder=f permits=3
              => granted jobs@permit-1 token=5 lease=L5 expires=30014
              ! persist grant jobs@permit-1 token=5 lease=L5 holder="f" ttl=30000 req=- permits=3
        "#]],
    );
}

#[test]
fn a_name_is_one_kind_at_a_time_and_a_semaphore_keeps_its_number_of_permits() {
    check(
        r#"
        @0 acquire lock holder=a
        @1 acquire lock holder=b permits=2
        @2 acquire sem holder=a permits=2
        @3 acquire sem holder=b
        @4 acquire sem holder=b permits=3
        @5 acquire-all lock2,sem holder=b
        # the permits' names are the semaphore's to hand out
        @6 acquire sem@permit-2 holder=b
        @7 acquire sem@permit-02 holder=b
        @8 acquire-all other,sem@permit-1 holder=b
        @9 acquire sem holder=b permits=2 owner=o
        @10 acquire x holder=b permits=1001
        "#,
        expect![[r#"
            @0 acquire lock holder=a
              => granted token=1 lease=L1 expires=30000
              ! persist grant lock token=1 lease=L1 holder="a" ttl=30000 req=-
            @1 acquire lock holder=b permits=2
              => error: lock is held as an exclusive lock, and was asked for as a semaphore of 2 permits; use one kind per name
            @2 acquire sem holder=a permits=2
              => granted sem@permit-1 token=2 lease=L2 expires=30002
              ! persist grant sem@permit-1 token=2 lease=L2 holder="a" ttl=30000 req=- permits=2
            @3 acquire sem holder=b
              => error: sem is held as a semaphore of 2 permits, and was asked for as an exclusive lock; use one kind per name
            @4 acquire sem holder=b permits=3
              => error: the semaphore sem has 2 permits, and was asked for with 3; every client must ask with the same number
            @5 acquire-all lock2,sem holder=b
              => error: sem is held as a semaphore of 2 permits, and was asked for as an exclusive lock; use one kind per name
            @6 acquire sem@permit-2 holder=b
              => error: sem@permit-2 is the name of a semaphore's permit (names ending in @permit- and digits are reserved): acquire the semaphore with permits, then renew and release the permit it grants
            @7 acquire sem@permit-02 holder=b
              => error: sem@permit-02 is the name of a semaphore's permit (names ending in @permit- and digits are reserved): acquire the semaphore with permits, then renew and release the permit it grants
            @8 acquire-all other,sem@permit-1 holder=b
              => error: resources[1]: sem@permit-1 is the name of a semaphore's permit (names ending in @permit- and digits are reserved): acquire the semaphore with permits, then renew and release the permit it grants
            @9 acquire sem holder=b permits=2 owner=o
              => error: a semaphore's permits are not reentrant: send permits or owner, not both
            @10 acquire x holder=b permits=1001
              => error: permits is 1001; a semaphore has 1 ..= 1000 permits (0 asks for an exclusive lock)
        "#]],
    );
}

#[test]
fn permits_and_their_number_survive_a_restart_and_a_retry_gets_its_permit() {
    check(
        r#"
        @0 acquire jobs holder=a req=q1 ttl=1000 permits=2
        @1 acquire jobs holder=b req=q2 ttl=1000 permits=2
        @2 crash
        @3 acquire jobs holder=c permits=3
        @4 acquire jobs holder=c permits=2
        # a retry is answered with the permit it got, for the semaphore only
        @5 acquire jobs holder=b req=q2 permits=2
        @6 acquire jobs@permit-2 holder=b req=q2
        @7 acquire jobs holder=b req=q2
        @8 acquire other holder=b req=q2
        @9 describe jobs
        "#,
        expect![[r#"
            @0 acquire jobs holder=a req=q1 ttl=1000 permits=2
              => granted jobs@permit-1 token=1 lease=L1 expires=1000
              ! persist grant jobs@permit-1 token=1 lease=L1 holder="a" ttl=1000 req=q1 permits=2
            @1 acquire jobs holder=b req=q2 ttl=1000 permits=2
              => granted jobs@permit-2 token=2 lease=L2 expires=1001
              ! persist grant jobs@permit-2 token=2 lease=L2 holder="b" ttl=1000 req=q2 permits=2
            @2 crash
              => recovered leases=2 requests=2 last_token=Some(2)
            @3 acquire jobs holder=c permits=3
              => error: the semaphore jobs has 2 permits, and was asked for with 3; every client must ask with the same number
            @4 acquire jobs holder=c permits=2
              => busy holder="a" token=1 expires=1002 waiters=0
            @5 acquire jobs holder=b req=q2 permits=2
              => duplicate jobs@permit-2 token=2 lease=L2 expires=1002 held=true
            @6 acquire jobs@permit-2 holder=b req=q2
              => error: jobs@permit-2 is the name of a semaphore's permit (names ending in @permit- and digits are reserved): acquire the semaphore with permits, then renew and release the permit it grants
            @7 acquire jobs holder=b req=q2
              => error: request_id "q2" was already used to acquire jobs@permit-2; use a new request id for jobs
            @8 acquire other holder=b req=q2
              => error: request_id "q2" was already used to acquire jobs@permit-2; use a new request id for other
            @9 describe jobs
              => semaphore permits=2 held=2 waiters=0
        "#]],
    );
}

#[test]
fn a_permit_counts_against_its_semaphores_tenant() {
    check(
        r#"
        tenant batch prefixes=batch/ leases=2
        # owns the permits' names of jobs, but not jobs: the permits are not its own
        tenant other prefixes=jobs@
        @0 acquire batch/jobs holder=a permits=3
        @1 acquire batch/jobs holder=a permits=3
        @2 acquire batch/jobs holder=a permits=3
        @3 acquire jobs holder=a permits=3
        @4 usage
        "#,
        expect![[r#"
            @0 tenant batch prefixes=batch/ leases=2
              => batch: leases=0 waiters=0 requests=0
            @0 tenant other prefixes=jobs@
              => batch: leases=0 waiters=0 requests=0, other: leases=0 waiters=0 requests=0
            @0 acquire batch/jobs holder=a permits=3
              => granted batch/jobs@permit-1 token=1 lease=L1 expires=30000
              ! persist grant batch/jobs@permit-1 token=1 lease=L1 holder="a" ttl=30000 req=- permits=3
            @1 acquire batch/jobs holder=a permits=3
              => granted batch/jobs@permit-2 token=2 lease=L2 expires=30001
              ! persist grant batch/jobs@permit-2 token=2 lease=L2 holder="a" ttl=30000 req=- permits=3
            @2 acquire batch/jobs holder=a permits=3
              => error: tenant batch holds its maximum of 2 leases; release unused locks, or raise the tenant's leases_max in the policy
            @3 acquire jobs holder=a permits=3
              => granted jobs@permit-1 token=3 lease=L3 expires=30003
              ! persist grant jobs@permit-1 token=3 lease=L3 holder="a" ttl=30000 req=- permits=3
            @4 usage
              => batch: leases=2 waiters=0 requests=0, other: leases=0 waiters=0 requests=0
        "#]],
    );
}

mod recovery {
    use fencing::{FencingToken, ResourceName};
    use lockd_core::{
        AcquireOutcome, AcquireRequest, Core, Holder, LeaseRecord, Limits, RecoverError, Snapshot,
    };

    fn lease(resource: &str, token: u64, permits: Option<u32>) -> LeaseRecord {
        LeaseRecord {
            resource: ResourceName::new(resource).unwrap(),
            lease_id: crate::harness::lease_id(token),
            token: FencingToken::new(token).unwrap(),
            holder: "x".to_string(),
            ttl_ms: 1000,
            request_id: None,
            reentrant: None,
            permits,
            rw: None,
        }
    }

    fn recover(leases: Vec<LeaseRecord>) -> Result<Core, RecoverError> {
        let snapshot = Snapshot {
            last_token: FencingToken::new(10),
            leases,
            requests: vec![],
        };
        Core::recover(
            Limits::default(),
            Box::new(|| crate::harness::lease_id(99)),
            snapshot,
            0,
        )
    }

    fn permit(semaphore: &str, permits: u32) -> AcquireRequest {
        let limits = Limits::default();
        AcquireRequest {
            resource: ResourceName::new(semaphore).unwrap(),
            request_id: None,
            holder: Holder::new("y", &limits).unwrap(),
            ttl_ms: 0,
            wait_ms: 0,
            owner: None,
            permits,
            rw: None,
        }
    }

    /// A lease on a permit's name stored before semaphores existed (a lock then) takes that
    /// permit: the semaphore counts it while it lasts, and is busy (not broken) when it leaves
    /// none free.
    #[test]
    fn a_lock_on_a_permits_name_from_before_takes_that_permit() {
        let mut core = recover(vec![lease("jobs@permit-1", 1, None)]).unwrap();
        let mut fx = Vec::new();
        let full = core.acquire(10, permit("jobs", 1), &mut fx).unwrap();
        assert!(
            matches!(&full, AcquireOutcome::Busy(b) if b.token.get() == 1),
            "{full:?}"
        );
        let jobs = ResourceName::new("jobs").unwrap();
        let d = core.describe(10, &jobs, &mut fx);
        assert_eq!(d.permits.map(|p| (p.permits, p.held)), Some((1, 1)));
        let old = ResourceName::new("jobs@permit-1").unwrap();
        core.release(10, &old, crate::harness::lease_id(1), &mut fx);
        assert_eq!(
            core.describe(10, &jobs, &mut fx).permits,
            None,
            "unused again"
        );
        match core.acquire(10, permit("jobs", 2), &mut fx).unwrap() {
            AcquireOutcome::Granted(g) => assert_eq!(g.resource.as_str(), "jobs@permit-1"),
            other => panic!("the free permit: {other:?}"),
        }
    }

    #[test]
    fn stored_permits_that_cannot_be_are_refused() {
        for (leases, needle) in [
            (
                vec![lease("jobs@permit-3", 1, Some(2))],
                "not the name of one of 2 permits",
            ),
            (
                vec![lease("jobs", 1, Some(2))],
                "not the name of one of 2 permits",
            ),
            (
                vec![
                    lease("jobs@permit-1", 1, Some(2)),
                    lease("jobs@permit-2", 2, Some(3)),
                ],
                "another permit says",
            ),
            (
                vec![lease("jobs@permit-1", 1, Some(2)), lease("jobs", 2, None)],
                "held as an exclusive lock and as a semaphore",
            ),
            (
                vec![lease("jobs@permit-1", 1, Some(1001))],
                "permits is 1001",
            ),
            (
                vec![lease(&format!("{}@permit-1", "s".repeat(247)), 1, Some(10))],
                "too long",
            ),
        ] {
            let err = recover(leases).err().expect(needle);
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
    }
}

#[test]
fn a_listed_permit_shows_its_semaphores_waiters() {
    use fencing::ResourceName;
    use lockd_core::{AcquireRequest, Core, Holder, Limits};
    let limits = Limits::default();
    let mut core = Core::new(limits.clone(), Box::new(|| crate::harness::lease_id(1)));
    let mut fx = Vec::new();
    for (n, wait_ms) in [(1, 0), (2, 1000), (3, 1000)] {
        let req = AcquireRequest {
            resource: ResourceName::new("jobs").unwrap(),
            request_id: None,
            holder: Holder::new(&format!("h{n}"), &limits).unwrap(),
            ttl_ms: 0,
            wait_ms,
            owner: None,
            permits: 1,
            rw: None,
        };
        core.acquire(0, req, &mut fx).unwrap();
    }
    let page = core.list(0, 0, 10, 100, |_| true, &mut fx);
    let listed: Vec<(&str, usize)> = page
        .locks
        .iter()
        .map(|l| (l.resource.as_str(), l.waiters))
        .collect();
    assert_eq!(listed, [("jobs@permit-1", 2)]);
}
