//! Transcripts of the atomic AcquireAll: a set is granted whole, in one atomic op, or not at
//! all; a retry of its request id gets every member's original grant.

use expect_test::expect;

use crate::harness::check;

#[test]
fn a_set_is_granted_whole_or_not_at_all_and_a_retry_gets_every_member() {
    check(
        r#"
        @0 acquire b holder=x ttl=1000
        # b is held: nothing of the set is granted, a stays free
        @10 acquire-all a,b,c holder=y ttl=5000 req=s1
        @20 describe a
        @30 release b L1
        # one token each, in the order asked, in one atomic op
        @40 acquire-all c,a,b holder=y ttl=5000 req=s1
        @50 acquire-all c,a,b holder=y ttl=5000 req=s1
        # the same id for another set is refused, whatever differs
        @60 acquire-all c,a holder=y req=s1
        @70 acquire-all c,a,b,d holder=y req=s1
        @80 acquire-all a,c,b holder=y req=s1
        @90 acquire a holder=z req=s1
        @100 crash
        @110 acquire-all c,a,b holder=y ttl=5000 req=s1
        @120 release a L3
        @130 acquire-all c,a,b holder=y ttl=5000 req=s1
        # each lease is its own: renewed and released alone
        @140 renew b L4
        @150 acquire a holder=z ttl=1000
        "#,
        expect![[r#"
            @0 acquire b holder=x ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant b token=1 lease=L1 holder="x" ttl=1000 req=-
            @10 acquire-all a,b,c holder=y ttl=5000 req=s1
              => busy b holder="x" token=1 expires=1000 waiters=0
            @20 describe a
              => free waiters=0
            @30 release b L1
              => released token=1 held=30
              ! persist remove b L1
            @40 acquire-all c,a,b holder=y ttl=5000 req=s1
              => granted all [c token=2 lease=L2 expires=5040; a token=3 lease=L3 expires=5040; b token=4 lease=L4 expires=5040]
              ! persist atomic [grant c token=2 lease=L2 holder="y" ttl=5000 req=s1; grant a token=3 lease=L3 holder="y" ttl=5000 req=s1 1; grant b token=4 lease=L4 holder="y" ttl=5000 req=s1 2]
            @50 acquire-all c,a,b holder=y ttl=5000 req=s1
              => duplicate [c token=2 lease=L2 expires=5040 held=true; a token=3 lease=L3 expires=5040 held=true; b token=4 lease=L4 expires=5040 held=true]
            @60 acquire-all c,a holder=y req=s1
              => error: request_id "s1" was already used to acquire the set [c, a, b] (AcquireAll); use a new request id
            @70 acquire-all c,a,b,d holder=y req=s1
              => error: request_id "s1" was already used to acquire the set [c, a, b] (AcquireAll); use a new request id
            @80 acquire-all a,c,b holder=y req=s1
              => error: request_id "s1" was already used to acquire the set [c, a, b] (AcquireAll); use a new request id
            @90 acquire a holder=z req=s1
              => error: request_id "s1" was already used to acquire the set [c, a, b] (AcquireAll); use a new request id
            @100 crash
              => recovered leases=3 requests=3 last_token=Some(4)
            @110 acquire-all c,a,b holder=y ttl=5000 req=s1
              => duplicate [c token=2 lease=L2 expires=5100 held=true; a token=3 lease=L3 expires=5100 held=true; b token=4 lease=L4 expires=5100 held=true]
            @120 release a L3
              => released token=3 held=20
              ! persist remove a L3
            @130 acquire-all c,a,b holder=y ttl=5000 req=s1
              => duplicate [c token=2 lease=L2 expires=5100 held=true; a token=3 lease=L3 expires=130 held=false; b token=4 lease=L4 expires=5100 held=true]
            @140 renew b L4
              => renewed expires=5140 ttl=5000
            @150 acquire a holder=z ttl=1000
              => granted token=5 lease=L5 expires=1150
              ! persist grant a token=5 lease=L5 holder="z" ttl=1000 req=-
        "#]],
    );
}

#[test]
fn a_set_that_would_pass_a_limit_is_refused_whole() {
    check(
        r#"
        limits leases_max=5 requests_max=3
        @0 acquire-all a,b,a holder=y
        @1 acquire-all - holder=y
        @2 acquire-all r0,r1,r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15,r16,r17,r18,r19,r20,r21,r22,r23,r24,r25,r26,r27,r28,r29,r30,r31,r32 holder=y
        @3 acquire x holder=x
        @4 acquire-all a,b,c,d,e holder=y
        @5 acquire-all a,b,c holder=y req=s
        @6 acquire-all a,b,c holder=y
        @7 acquire-all p holder=y req=x
        @8 tenant t prefixes=t/ leases=1
        @9 release a L2
        @9 release b L3
        @9 release c L4
        @10 acquire-all t/a,t/b holder=y
        @11 describe t/a
        @12 acquire-all t/a,u holder=y
        "#,
        expect![[r#"
            @0 acquire-all a,b,a holder=y
              => error: the set names a twice; name each resource once
            @1 acquire-all - holder=y
              => error: the set names no resource; name 1 ..= 32
            @2 acquire-all r0,r1,r2,r3,r4,r5,r6,r7,r8,r9,r10,r11,r12,r13,r14,r15,r16,r17,r18,r19,r20,r21,r22,r23,r24,r25,r26,r27,r28,r29,r30,r31,r32 holder=y
              => error: the set names 33 resources, more than the 32 one AcquireAll takes; take larger sets in order (Client::acquire_ordered, lockctl run --lock)
            @3 acquire x holder=x
              => granted token=1 lease=L1 expires=30003
              ! persist grant x token=1 lease=L1 holder="x" ttl=30000 req=-
            @4 acquire-all a,b,c,d,e holder=y
              => error: lockd holds the maximum number of leases (5); release unused locks or raise limits.leases_max
            @5 acquire-all a,b,c holder=y req=s
              => granted all [a token=2 lease=L2 expires=30005; b token=3 lease=L3 expires=30005; c token=4 lease=L4 expires=30005]
              ! persist atomic [grant a token=2 lease=L2 holder="y" ttl=30000 req=s; grant b token=3 lease=L3 holder="y" ttl=30000 req=s 1; grant c token=4 lease=L4 holder="y" ttl=30000 req=s 2]
            @6 acquire-all a,b,c holder=y
              => busy a holder="y" token=2 expires=30005 waiters=0
            @7 acquire-all p holder=y req=x
              => error: lockd remembers the maximum number of request ids (3); retry later, or raise limits.requests_max
            @8 tenant t prefixes=t/ leases=1
              => t: leases=0 waiters=0 requests=0
            @9 release a L2
              => released token=2 held=4
              ! persist remove a L2
            @9 release b L3
              => released token=3 held=4
              ! persist remove b L3
            @9 release c L4
              => released token=4 held=4
              ! persist remove c L4
            @10 acquire-all t/a,t/b holder=y
              => error: tenant t holds its maximum of 1 leases; release unused locks, or raise the tenant's leases_max in the policy
            @11 describe t/a
              => free waiters=0
            @12 acquire-all t/a,u holder=y
              => granted all [t/a token=5 lease=L5 expires=30012; u token=6 lease=L6 expires=30012]
              ! persist atomic [grant t/a token=5 lease=L5 holder="y" ttl=30000 req=-; grant u token=6 lease=L6 holder="y" ttl=30000 req=-]
        "#]],
    );
}

#[test]
fn a_sets_request_ids_are_kept_while_any_member_is_held_and_forgotten_together() {
    check(
        r#"
        limits request_retention_ms=100
        @0 acquire-all a,b holder=y ttl=10000 req=s
        @10 release a L1
        # past the retention: b is held, so neither id is forgotten, a's included
        @200 tick
        @210 acquire-all a,b holder=y ttl=10000 req=s
        # the id names the set: no single Acquire may take it, whichever member it names
        @220 acquire a holder=y req=s
        @230 acquire b holder=y req=s
        @250 release b L2
        @260 acquire-all a,b holder=y ttl=10000 req=s
        # both forgotten at once, a retention after they were last found held
        @300 tick
        @310 acquire-all a,b holder=y ttl=10000 req=s
        @320 crash
        @330 acquire-all a,b holder=y ttl=10000 req=s
        "#,
        expect![[r#"
            @0 acquire-all a,b holder=y ttl=10000 req=s
              => granted all [a token=1 lease=L1 expires=10000; b token=2 lease=L2 expires=10000]
              ! persist atomic [grant a token=1 lease=L1 holder="y" ttl=10000 req=s; grant b token=2 lease=L2 holder="y" ttl=10000 req=s 1]
            @10 release a L1
              => released token=1 held=10
              ! persist remove a L1
            @200 tick
              => next deadline Some(10000)
            @210 acquire-all a,b holder=y ttl=10000 req=s
              => duplicate [a token=1 lease=L1 expires=210 held=false; b token=2 lease=L2 expires=10000 held=true]
            @220 acquire a holder=y req=s
              => error: request_id "s" was already used to acquire the set [a, b] (AcquireAll); use a new request id
            @230 acquire b holder=y req=s
              => error: request_id "s" was already used to acquire the set [a, b] (AcquireAll); use a new request id
            @250 release b L2
              => released token=2 held=250
              ! persist remove b L2
            @260 acquire-all a,b holder=y ttl=10000 req=s
              => duplicate [a token=1 lease=L1 expires=260 held=false; b token=2 lease=L2 expires=260 held=false]
            @300 tick
              => next deadline None
              ! persist forget s
              ! persist forget s 1
            @310 acquire-all a,b holder=y ttl=10000 req=s
              => granted all [a token=3 lease=L3 expires=10310; b token=4 lease=L4 expires=10310]
              ! persist atomic [grant a token=3 lease=L3 holder="y" ttl=10000 req=s; grant b token=4 lease=L4 holder="y" ttl=10000 req=s 1]
            @320 crash
              => recovered leases=2 requests=2 last_token=Some(4)
            @330 acquire-all a,b holder=y ttl=10000 req=s
              => duplicate [a token=3 lease=L3 expires=10320 held=true; b token=4 lease=L4 expires=10320 held=true]
        "#]],
    );
}

/// A crash may keep a prefix of a batch of forgets: a set's first id forgotten, its second
/// not. An Acquire, or another set, under that id is then still a reuse, never a grant that a
/// later retry of the set would stitch to the remembered member.
#[test]
fn a_set_remembered_in_part_after_a_crash_still_owns_its_id() {
    use fencing::{FencingToken, ResourceName};
    use lockd_core::{
        AcquireAllRequest, AcquireError, AcquireRequest, Core, Holder, LeaseRecord, Limits,
        RequestId, Snapshot,
    };
    let limits = Limits::default();
    let member = LeaseRecord {
        resource: ResourceName::new("b").unwrap(),
        lease_id: crate::harness::lease_id(2),
        token: FencingToken::new(2).unwrap(),
        holder: "y".to_string(),
        ttl_ms: 1000,
        request_id: Some("s 1".to_string()),
        reentrant: None,
        permits: None,
        rw: None,
    };
    let snapshot = Snapshot {
        last_token: FencingToken::new(2),
        leases: vec![],
        requests: vec![member],
    };
    let ids = Box::new(|| crate::harness::lease_id(9));
    let mut core = Core::recover(limits.clone(), ids, snapshot, 0).unwrap();
    let id = RequestId::new("s", &limits).unwrap();
    let holder = Holder::new("y", &limits).unwrap();
    let one = AcquireRequest {
        resource: ResourceName::new("a").unwrap(),
        request_id: Some(id.clone()),
        holder: holder.clone(),
        ttl_ms: 0,
        wait_ms: 0,
        owner: None,
        permits: 0,
        rw: None,
    };
    let set = AcquireAllRequest {
        resources: vec![
            ResourceName::new("a").unwrap(),
            ResourceName::new("c").unwrap(),
        ],
        request_id: Some(id),
        holder,
        ttl_ms: 0,
    };
    let mut fx = Vec::new();
    let reused = |e: &AcquireError| matches!(e, AcquireError::SetIdReused { set, .. } if set.len() == 1 && set[0].as_str() == "b");
    let e = core.acquire(10, one, &mut fx).unwrap_err();
    assert!(reused(&e), "{e}");
    let e = core.acquire_all(10, set, &mut fx).unwrap_err();
    assert!(reused(&e), "{e}");
    assert!(fx.is_empty(), "nothing granted: {fx:?}");
}
