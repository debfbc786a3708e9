//! Scripted scenarios: calls in, outcomes and effects out. Each transcript was reviewed by hand
//! against DESIGN.md sections 2 and 3; `UPDATE_EXPECT=1` rewrites them after an intended change,
//! and the diff is then the review.

use expect_test::expect;

use crate::harness::check;

#[test]
fn grant_busy_release_and_regrant_with_a_higher_token() {
    check(
        r#"
        @0 acquire inventory:sku-1 holder=a ttl=1000
        @10 acquire inventory:sku-1 holder=b ttl=1000
        @20 describe inventory:sku-1
        @30 release inventory:sku-1 L1
        @40 acquire inventory:sku-1 holder=b ttl=1000
        # tokens are global: another resource gets the next one
        @50 acquire other holder=c
        "#,
        expect![[r#"
            @0 acquire inventory:sku-1 holder=a ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant inventory:sku-1 token=1 lease=L1 holder="a" ttl=1000 req=-
            @10 acquire inventory:sku-1 holder=b ttl=1000
              => busy holder="a" token=1 expires=1000 waiters=0
            @20 describe inventory:sku-1
              => held holder="a" token=1 expires=1000 ttl=1000 waiters=0
            @30 release inventory:sku-1 L1
              => released token=1 held=30
              ! persist remove inventory:sku-1 L1
            @40 acquire inventory:sku-1 holder=b ttl=1000
              => granted token=2 lease=L2 expires=1040
              ! persist grant inventory:sku-1 token=2 lease=L2 holder="b" ttl=1000 req=-
            @50 acquire other holder=c
              => granted token=3 lease=L3 expires=30050
              ! persist grant other token=3 lease=L3 holder="c" ttl=30000 req=-
        "#]],
    );
}

#[test]
fn waiters_are_served_in_fifo_order_on_release() {
    check(
        r#"
        @0 acquire r holder=a ttl=1000
        @1 acquire r holder=b ttl=1000 wait=5000
        @2 acquire r holder=c ttl=1000 wait=5000
        @3 acquire r holder=d ttl=1000 wait=5000
        @4 describe r
        @10 release r L1
        @20 release r L2
        @30 describe r
        "#,
        expect![[r#"
            @0 acquire r holder=a ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=-
            @1 acquire r holder=b ttl=1000 wait=5000
              => queued w1 position=1
            @2 acquire r holder=c ttl=1000 wait=5000
              => queued w2 position=2
            @3 acquire r holder=d ttl=1000 wait=5000
              => queued w3 position=3
            @4 describe r
              => held holder="a" token=1 expires=1000 ttl=1000 waiters=3
            @10 release r L1
              => released token=1 held=10
              ! persist remove r L1
              ! persist grant r token=2 lease=L2 holder="b" ttl=1000 req=-
              ! hand-off w1: token=2 lease=L2 expires=1010
            @20 release r L2
              => released token=2 held=10
              ! persist remove r L2
              ! persist grant r token=3 lease=L3 holder="c" ttl=1000 req=-
              ! hand-off w2: token=3 lease=L3 expires=1020
            @30 describe r
              => held holder="c" token=3 expires=1020 ttl=1000 waiters=1
        "#]],
    );
}

#[test]
fn an_expired_lease_goes_to_the_head_of_the_queue() {
    check(
        r#"
        @0 acquire r holder=a ttl=100
        @50 acquire r holder=b ttl=100 wait=1000
        # a tick at the expiry instant: lease expiry comes before waits ending at the same time
        @100 tick
        @150 describe r
        "#,
        expect![[r#"
            @0 acquire r holder=a ttl=100
              => granted token=1 lease=L1 expires=100
              ! persist grant r token=1 lease=L1 holder="a" ttl=100 req=-
            @50 acquire r holder=b ttl=100 wait=1000
              => queued w1 position=1
            @100 tick
              => next deadline Some(200)
              ! persist remove r L1
              ! expired r token=1 holder="a" held=100
              ! persist grant r token=2 lease=L2 holder="b" ttl=100 req=-
              ! hand-off w1: token=2 lease=L2 expires=200
            @150 describe r
              => held holder="b" token=2 expires=200 ttl=100 waiters=0
        "#]],
    );
}

#[test]
fn deadlines_are_processed_in_time_order_even_when_noticed_late() {
    // The lease expires at 100; waiter b's wait ends at 130; c's at 2000. Nothing happens
    // until 500: b must still get the lock (it was waiting when the lock freed), and c must get
    // it when b's lease expires at 600 (b's grant counts its TTL from 500, when it is made).
    check(
        r#"
        @0 acquire r holder=a ttl=100
        @30 acquire r holder=b ttl=100 wait=100
        @40 acquire r holder=c ttl=100 wait=2000
        @500 tick
        @600 tick
        "#,
        expect![[r#"
            @0 acquire r holder=a ttl=100
              => granted token=1 lease=L1 expires=100
              ! persist grant r token=1 lease=L1 holder="a" ttl=100 req=-
            @30 acquire r holder=b ttl=100 wait=100
              => queued w1 position=1
            @40 acquire r holder=c ttl=100 wait=2000
              => queued w2 position=2
            @500 tick
              => next deadline Some(600)
              ! persist remove r L1
              ! expired r token=1 holder="a" held=100
              ! persist grant r token=2 lease=L2 holder="b" ttl=100 req=-
              ! hand-off w1: token=2 lease=L2 expires=600
            @600 tick
              => next deadline Some(700)
              ! persist remove r L2
              ! expired r token=2 holder="b" held=100
              ! persist grant r token=3 lease=L3 holder="c" ttl=100 req=-
              ! hand-off w2: token=3 lease=L3 expires=700
        "#]],
    );
}

#[test]
fn waits_end_on_timeout_and_on_cancellation() {
    check(
        r#"
        @0 acquire r holder=a ttl=10000
        @0 acquire r holder=b wait=100
        @0 acquire r holder=c wait=5000
        @0 acquire r holder=d wait=5000
        @100 tick
        @200 cancel w2
        @200 cancel w2
        @200 describe r
        @300 release r L1
        "#,
        expect![[r#"
            @0 acquire r holder=a ttl=10000
              => granted token=1 lease=L1 expires=10000
              ! persist grant r token=1 lease=L1 holder="a" ttl=10000 req=-
            @0 acquire r holder=b wait=100
              => queued w1 position=1
            @0 acquire r holder=c wait=5000
              => queued w2 position=2
            @0 acquire r holder=d wait=5000
              => queued w3 position=3
            @100 tick
              => next deadline Some(5000)
              ! wait timed out w1: held with token 1
            @200 cancel w2
              => cancelled=true
            @200 cancel w2
              => cancelled=false
            @200 describe r
              => held holder="a" token=1 expires=10000 ttl=10000 waiters=1
            @300 release r L1
              => released token=1 held=300
              ! persist remove r L1
              ! persist grant r token=2 lease=L2 holder="d" ttl=30000 req=-
              ! hand-off w3: token=2 lease=L2 expires=30300
        "#]],
    );
}

#[test]
fn renew_extends_only_the_current_lease() {
    check(
        r#"
        @0 acquire r holder=a ttl=1000
        @900 renew r L1
        @1800 renew r L1
        # not renewed for a full TTL: gone, and the renewal after it fails
        @2800 renew r L1
        @2800 acquire r holder=b ttl=1000
        # the old holder's lease id neither renews nor releases the new lease
        @2900 renew r L1
        @2900 release r L1
        @2900 describe r
        "#,
        expect![[r#"
            @0 acquire r holder=a ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=-
            @900 renew r L1
              => renewed expires=1900 ttl=1000
            @1800 renew r L1
              => renewed expires=2800 ttl=1000
            @2800 renew r L1
              => error: the lease is not the current lease of r (it expired or was released; it is not held now); stop working under it and acquire again
              ! persist remove r L1
              ! expired r token=1 holder="a" held=2800
            @2800 acquire r holder=b ttl=1000
              => granted token=2 lease=L2 expires=3800
              ! persist grant r token=2 lease=L2 holder="b" ttl=1000 req=-
            @2900 renew r L1
              => error: the lease is not the current lease of r (it expired or was released; it is now held with token 2); stop working under it and acquire again
            @2900 release r L1
              => not held (current token Some(FencingToken(2)))
            @2900 describe r
              => held holder="b" token=2 expires=3800 ttl=1000 waiters=0
        "#]],
    );
}

#[test]
fn release_is_idempotent() {
    check(
        r#"
        @0 acquire r holder=a
        @1 release r L1
        @2 release r L1
        @3 release never-held L1
        "#,
        expect![[r#"
            @0 acquire r holder=a
              => granted token=1 lease=L1 expires=30000
              ! persist grant r token=1 lease=L1 holder="a" ttl=30000 req=-
            @1 release r L1
              => released token=1 held=1
              ! persist remove r L1
            @2 release r L1
              => not held (current token None)
            @3 release never-held L1
              => not held (current token None)
        "#]],
    );
}

#[test]
fn a_retried_request_id_returns_the_original_grant() {
    check(
        r#"
        @0 acquire r holder=a req=req-1 ttl=1000
        @5 acquire r holder=a req=req-1 ttl=1000
        @6 renew r L1
        @7 acquire r holder=a req=req-1 ttl=1000
        # reusing the id for another resource is a client bug
        @8 acquire elsewhere holder=a req=req-1
        @9 release r L1
        # after the release the retry still gets the original (no longer held), never a new lease
        @10 acquire r holder=a req=req-1 ttl=1000
        @11 describe r
        "#,
        expect![[r#"
            @0 acquire r holder=a req=req-1 ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=req-1
            @5 acquire r holder=a req=req-1 ttl=1000
              => duplicate token=1 lease=L1 expires=1000 held=true
            @6 renew r L1
              => renewed expires=1006 ttl=1000
            @7 acquire r holder=a req=req-1 ttl=1000
              => duplicate token=1 lease=L1 expires=1006 held=true
            @8 acquire elsewhere holder=a req=req-1
              => error: request_id "req-1" was already used to acquire r; use a new request id for elsewhere
            @9 release r L1
              => released token=1 held=9
              ! persist remove r L1
            @10 acquire r holder=a req=req-1 ttl=1000
              => duplicate token=1 lease=L1 expires=10 held=false
            @11 describe r
              => free waiters=0
        "#]],
    );
}

#[test]
fn a_retried_waiting_request_keeps_its_place_in_the_queue() {
    check(
        r#"
        @0 acquire r holder=a ttl=1000
        @1 acquire r holder=b req=b-1 wait=100
        @2 acquire r holder=c req=c-1 wait=5000
        # b's retry takes over b's place (first) with the retry's deadline
        @50 acquire r holder=b req=b-1 wait=5000
        @200 tick
        @300 release r L1
        "#,
        expect![[r#"
            @0 acquire r holder=a ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=-
            @1 acquire r holder=b req=b-1 wait=100
              => queued w1 position=1
            @2 acquire r holder=c req=c-1 wait=5000
              => queued w2 position=2
            @50 acquire r holder=b req=b-1 wait=5000
              => rejoined w1 position=1
            @200 tick
              => next deadline Some(1000)
            @300 release r L1
              => released token=1 held=300
              ! persist remove r L1
              ! persist grant r token=2 lease=L2 holder="b" ttl=30000 req=b-1
              ! hand-off w1: token=2 lease=L2 expires=30300
        "#]],
    );
}

#[test]
fn request_ids_are_forgotten_after_retention_unless_still_held() {
    check(
        r#"
        limits request_retention_ms=1000 ttl_max_ms=100000
        @0 acquire short req=s ttl=100
        @0 acquire long req=l ttl=100000
        @1000 tick
        # `s` was forgotten: the same id is a new request now
        @1000 acquire short req=s ttl=100
        # `l` is still held, so it is still remembered
        @1001 acquire long req=l ttl=100000
        "#,
        expect![[r#"
            @0 acquire short req=s ttl=100
              => granted token=1 lease=L1 expires=100
              ! persist grant short token=1 lease=L1 holder="" ttl=100 req=s
            @0 acquire long req=l ttl=100000
              => granted token=2 lease=L2 expires=100000
              ! persist grant long token=2 lease=L2 holder="" ttl=100000 req=l
            @1000 tick
              => next deadline Some(100000)
              ! persist remove short L1
              ! expired short token=1 holder="" held=100
              ! persist forget s
            @1000 acquire short req=s ttl=100
              => granted token=3 lease=L3 expires=1100
              ! persist grant short token=3 lease=L3 holder="" ttl=100 req=s
            @1001 acquire long req=l ttl=100000
              => duplicate token=2 lease=L2 expires=100000 held=true
        "#]],
    );
}

#[test]
fn invalid_arguments_and_full_queues_are_refused() {
    check(
        r#"
        limits waiters_per_resource_max=2 waiters_total_max=3 leases_max=2 wait_max_ms=60000
        @0 acquire r ttl=50
        @0 acquire r ttl=99999999
        @0 acquire r wait=60001
        @0 acquire r holder=a
        @0 acquire r holder=b wait=1000
        @0 acquire r holder=c wait=1000
        @0 acquire r holder=d wait=1000
        @0 acquire s holder=e
        @0 acquire s holder=f wait=1000
        @0 acquire s holder=g wait=1000
        @0 acquire t holder=h
        "#,
        expect![[r#"
            @0 acquire r ttl=50
              => error: ttl_ms 50 is outside the allowed range 100 ..= 3600000 ms (0 means the server default)
            @0 acquire r ttl=99999999
              => error: ttl_ms 99999999 is outside the allowed range 100 ..= 3600000 ms (0 means the server default)
            @0 acquire r wait=60001
              => error: wait_timeout_ms 60001 is above the maximum 60000 ms (0 means try once); wait again after it ends
            @0 acquire r holder=a
              => granted token=1 lease=L1 expires=30000
              ! persist grant r token=1 lease=L1 holder="a" ttl=30000 req=-
            @0 acquire r holder=b wait=1000
              => queued w1 position=1
            @0 acquire r holder=c wait=1000
              => queued w2 position=2
            @0 acquire r holder=d wait=1000
              => error: the wait queue of r is full (2 waiters); retry later with backoff, or try-lock
            @0 acquire s holder=e
              => granted token=2 lease=L2 expires=30000
              ! persist grant s token=2 lease=L2 holder="e" ttl=30000 req=-
            @0 acquire s holder=f wait=1000
              => queued w3 position=1
            @0 acquire s holder=g wait=1000
              => error: lockd holds the maximum number of waiters (3); retry later with backoff
            @0 acquire t holder=h
              => error: lockd holds the maximum number of leases (2); release unused locks or raise limits.leases_max
        "#]],
    );
}

#[test]
fn restart_keeps_leases_with_a_full_ttl_and_tokens_rising() {
    check(
        r#"
        @0 acquire r holder=a req=ra ttl=1000
        @0 acquire s holder=b ttl=1000
        @100 acquire r holder=c wait=5000
        @900 release s L2
        @900 restart
        # the lease of r was granted at 0 but counts its full TTL from the restart at 900
        @900 describe r
        @1899 renew r L1
        @1900 describe s
        @1900 acquire r holder=a req=ra
        @1900 acquire t holder=d
        "#,
        expect![[r#"
            @0 acquire r holder=a req=ra ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=ra
            @0 acquire s holder=b ttl=1000
              => granted token=2 lease=L2 expires=1000
              ! persist grant s token=2 lease=L2 holder="b" ttl=1000 req=-
            @100 acquire r holder=c wait=5000
              => queued w1 position=1
            @900 release s L2
              => released token=2 held=900
              ! persist remove s L2
            @900 restart
              => recovered leases=1 requests=1 last_token=Some(2)
            @900 describe r
              => held holder="a" token=1 expires=1900 ttl=1000 waiters=0
            @1899 renew r L1
              => renewed expires=2899 ttl=1000
            @1900 describe s
              => free waiters=0
            @1900 acquire r holder=a req=ra
              => duplicate token=1 lease=L1 expires=2899 held=true
            @1900 acquire t holder=d
              => granted token=3 lease=L3 expires=31900
              ! persist grant t token=3 lease=L3 holder="d" ttl=30000 req=-
        "#]],
    );
}

#[test]
fn a_crash_can_bring_back_a_lazily_released_lease_but_never_lose_a_grant() {
    check(
        r#"
        @0 acquire r holder=a ttl=1000
        @0 acquire s holder=b ttl=1000
        @10 release s L2
        @20 crash
        # the release of s was not synced: s is held again until its TTL runs out
        @20 describe s
        @1020 tick
        @1020 acquire s holder=c
        "#,
        expect![[r#"
            @0 acquire r holder=a ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=-
            @0 acquire s holder=b ttl=1000
              => granted token=2 lease=L2 expires=1000
              ! persist grant s token=2 lease=L2 holder="b" ttl=1000 req=-
            @10 release s L2
              => released token=2 held=10
              ! persist remove s L2
            @20 crash
              => recovered leases=2 requests=0 last_token=Some(2)
            @20 describe s
              => held holder="b" token=2 expires=1020 ttl=1000 waiters=0
            @1020 tick
              => next deadline None
              ! persist remove r L1
              ! expired r token=1 holder="a" held=1000
              ! persist remove s L2
              ! expired s token=2 holder="b" held=1000
            @1020 acquire s holder=c
              => granted token=3 lease=L3 expires=31020
              ! persist grant s token=3 lease=L3 holder="c" ttl=30000 req=-
        "#]],
    );
}

#[test]
fn tenants_quotas_count_leases_and_waiters_of_their_own_resources_only() {
    check(
        r#"
        tenant pay prefixes=pay/,ledger/ leases=2 waiters=1
        tenant inv prefixes=inv/
        @0 acquire pay/1 holder=a
        @1 acquire ledger/1 holder=a
        # a third lease of pay's resources is refused; inv's and unowned ones are not counted
        @2 acquire pay/2 holder=a
        @3 acquire inv/1 holder=b
        @4 acquire other holder=c
        # one waiter: the second is refused, and a try-lock of a held one is just busy
        @5 acquire pay/1 holder=d wait=1000
        @6 acquire ledger/1 holder=e wait=1000
        @7 acquire ledger/1 holder=e
        usage
        # a hand-off keeps the lease count and ends the waiter
        @8 release pay/1 L1
        usage
        # an expiry frees a lease: pay may take another
        @40000 tick
        usage
        @40001 acquire pay/2 holder=a
        # a timed-out and a cancelled waiter each leave room for another
        @40002 acquire pay/2 holder=b wait=10
        @40003 acquire pay/2 holder=c wait=10
        @40012 tick
        usage
        @40013 acquire pay/2 holder=c wait=1000
        @40014 cancel w3
        usage
        # counts are rebuilt from the state after a restart
        restart
        usage
        "#,
        expect![[r#"
            @0 tenant pay prefixes=pay/,ledger/ leases=2 waiters=1
              => pay: leases=0 waiters=0 requests=0
            @0 tenant inv prefixes=inv/
              => pay: leases=0 waiters=0 requests=0, inv: leases=0 waiters=0 requests=0
            @0 acquire pay/1 holder=a
              => granted token=1 lease=L1 expires=30000
              ! persist grant pay/1 token=1 lease=L1 holder="a" ttl=30000 req=-
            @1 acquire ledger/1 holder=a
              => granted token=2 lease=L2 expires=30001
              ! persist grant ledger/1 token=2 lease=L2 holder="a" ttl=30000 req=-
            @2 acquire pay/2 holder=a
              => error: tenant pay holds its maximum of 2 leases; release unused locks, or raise the tenant's leases_max in the policy
            @3 acquire inv/1 holder=b
              => granted token=3 lease=L3 expires=30003
              ! persist grant inv/1 token=3 lease=L3 holder="b" ttl=30000 req=-
            @4 acquire other holder=c
              => granted token=4 lease=L4 expires=30004
              ! persist grant other token=4 lease=L4 holder="c" ttl=30000 req=-
            @5 acquire pay/1 holder=d wait=1000
              => queued w1 position=1
            @6 acquire ledger/1 holder=e wait=1000
              => error: tenant pay has its maximum of 1 waiters queued; retry later with backoff, or try-lock
            @7 acquire ledger/1 holder=e
              => busy holder="a" token=2 expires=30001 waiters=0
            @7 usage
              => pay: leases=2 waiters=1 requests=0, inv: leases=1 waiters=0 requests=0
            @8 release pay/1 L1
              => released token=1 held=8
              ! persist remove pay/1 L1
              ! persist grant pay/1 token=5 lease=L5 holder="d" ttl=30000 req=-
              ! hand-off w1: token=5 lease=L5 expires=30008
            @8 usage
              => pay: leases=2 waiters=0 requests=0, inv: leases=1 waiters=0 requests=0
            @40000 tick
              => next deadline None
              ! persist remove ledger/1 L2
              ! expired ledger/1 token=2 holder="a" held=30000
              ! persist remove inv/1 L3
              ! expired inv/1 token=3 holder="b" held=30000
              ! persist remove other L4
              ! expired other token=4 holder="c" held=30000
              ! persist remove pay/1 L5
              ! expired pay/1 token=5 holder="d" held=30000
            @40000 usage
              => pay: leases=0 waiters=0 requests=0, inv: leases=0 waiters=0 requests=0
            @40001 acquire pay/2 holder=a
              => granted token=6 lease=L6 expires=70001
              ! persist grant pay/2 token=6 lease=L6 holder="a" ttl=30000 req=-
            @40002 acquire pay/2 holder=b wait=10
              => queued w2 position=1
            @40003 acquire pay/2 holder=c wait=10
              => error: tenant pay has its maximum of 1 waiters queued; retry later with backoff, or try-lock
            @40012 tick
              => next deadline Some(70001)
              ! wait timed out w2: held with token 6
            @40012 usage
              => pay: leases=1 waiters=0 requests=0, inv: leases=0 waiters=0 requests=0
            @40013 acquire pay/2 holder=c wait=1000
              => queued w3 position=1
            @40014 cancel w3
              => cancelled=true
            @40014 usage
              => pay: leases=1 waiters=0 requests=0, inv: leases=0 waiters=0 requests=0
            @40014 restart
              => recovered leases=1 requests=0 last_token=Some(6)
            @40014 usage
              => pay: leases=1 waiters=0 requests=0, inv: leases=0 waiters=0 requests=0
        "#]],
    );
}

#[test]
fn a_tenants_acquire_rate_refuses_calls_beyond_its_bucket_with_the_wait() {
    check(
        r#"
        tenant cron prefixes=cron/ rate=2/2
        @0 acquire cron/a holder=a
        @0 acquire cron/b holder=a
        @0 acquire cron/c holder=a
        # busy try-locks count too: polling is what a rate bounds
        @250 acquire cron/a holder=b
        @499 acquire cron/a holder=b
        @1000 acquire cron/c holder=a
        # a retry of a granted request id is an answer, not a new call
        @1001 acquire other holder=x req=r1
        @1002 acquire cron/d holder=a req=r2
        @1003 acquire cron/d holder=a req=r2
        "#,
        expect![[r#"
            @0 tenant cron prefixes=cron/ rate=2/2
              => cron: leases=0 waiters=0 requests=0
            @0 acquire cron/a holder=a
              => granted token=1 lease=L1 expires=30000
              ! persist grant cron/a token=1 lease=L1 holder="a" ttl=30000 req=-
            @0 acquire cron/b holder=a
              => granted token=2 lease=L2 expires=30000
              ! persist grant cron/b token=2 lease=L2 holder="a" ttl=30000 req=-
            @0 acquire cron/c holder=a
              => error: tenant cron is above its acquire rate of 2 calls a second; retry in 500 ms
            @250 acquire cron/a holder=b
              => error: tenant cron is above its acquire rate of 2 calls a second; retry in 250 ms
            @499 acquire cron/a holder=b
              => error: tenant cron is above its acquire rate of 2 calls a second; retry in 1 ms
            @1000 acquire cron/c holder=a
              => granted token=3 lease=L3 expires=31000
              ! persist grant cron/c token=3 lease=L3 holder="a" ttl=30000 req=-
            @1001 acquire other holder=x req=r1
              => granted token=4 lease=L4 expires=31001
              ! persist grant other token=4 lease=L4 holder="x" ttl=30000 req=r1
            @1002 acquire cron/d holder=a req=r2
              => granted token=5 lease=L5 expires=31002
              ! persist grant cron/d token=5 lease=L5 holder="a" ttl=30000 req=r2
            @1003 acquire cron/d holder=a req=r2
              => duplicate token=5 lease=L5 expires=31002 held=true
        "#]],
    );
}

#[test]
fn a_tenant_without_quotas_gets_a_fair_share_and_its_request_ids_are_bounded_too() {
    check(
        r#"
        limits leases_max=10 waiters_total_max=10 requests_max=4
        # two tenants, no quotas given: each may have 5 leases, 5 waiters and 2 request ids
        tenant a prefixes=a/
        tenant b prefixes=b/ leases=1
        @0 acquire a/1 holder=x req=r1
        @1 release a/1 L1
        @2 acquire a/2 holder=x req=r2
        # a's ids are remembered after release: a third one is refused, not forgotten early
        @3 acquire a/3 holder=x req=r3
        # b is not held back by a, and a without a request id is not either
        @4 acquire b/1 holder=y req=q1
        @5 acquire b/2 holder=y
        @6 acquire a/3 holder=x
        usage
        # once retention ends, a may remember ids again
        @600010 tick
        usage
        @600011 acquire a/4 holder=x req=r4
        usage
        restart
        usage
        "#,
        expect![[r#"
            @0 tenant a prefixes=a/
              => a: leases=0 waiters=0 requests=0
            @0 tenant b prefixes=b/ leases=1
              => a: leases=0 waiters=0 requests=0, b: leases=0 waiters=0 requests=0
            @0 acquire a/1 holder=x req=r1
              => granted token=1 lease=L1 expires=30000
              ! persist grant a/1 token=1 lease=L1 holder="x" ttl=30000 req=r1
            @1 release a/1 L1
              => released token=1 held=1
              ! persist remove a/1 L1
            @2 acquire a/2 holder=x req=r2
              => granted token=2 lease=L2 expires=30002
              ! persist grant a/2 token=2 lease=L2 holder="x" ttl=30000 req=r2
            @3 acquire a/3 holder=x req=r3
              => error: tenant a has its maximum of 2 request ids remembered; retry later, or raise the tenant's requests_max in the policy
            @4 acquire b/1 holder=y req=q1
              => granted token=3 lease=L3 expires=30004
              ! persist grant b/1 token=3 lease=L3 holder="y" ttl=30000 req=q1
            @5 acquire b/2 holder=y
              => error: tenant b holds its maximum of 1 leases; release unused locks, or raise the tenant's leases_max in the policy
            @6 acquire a/3 holder=x
              => granted token=4 lease=L4 expires=30006
              ! persist grant a/3 token=4 lease=L4 holder="x" ttl=30000 req=-
            @6 usage
              => a: leases=2 waiters=0 requests=2, b: leases=1 waiters=0 requests=1
            @600010 tick
              => next deadline None
              ! persist remove a/2 L2
              ! expired a/2 token=2 holder="x" held=30000
              ! persist remove b/1 L3
              ! expired b/1 token=3 holder="y" held=30000
              ! persist remove a/3 L4
              ! expired a/3 token=4 holder="x" held=30000
              ! persist forget r1
              ! persist forget r2
              ! persist forget q1
            @600010 usage
              => a: leases=0 waiters=0 requests=0, b: leases=0 waiters=0 requests=0
            @600011 acquire a/4 holder=x req=r4
              => granted token=5 lease=L5 expires=630011
              ! persist grant a/4 token=5 lease=L5 holder="x" ttl=30000 req=r4
            @600011 usage
              => a: leases=1 waiters=0 requests=1, b: leases=0 waiters=0 requests=0
            @600011 restart
              => recovered leases=1 requests=1 last_token=Some(5)
            @600011 usage
              => a: leases=1 waiters=0 requests=1, b: leases=0 waiters=0 requests=0
        "#]],
    );
}

#[test]
fn a_lease_held_past_hold_warn_after_is_reported_once() {
    check(
        r#"
        limits hold_warn_after_ms=1000
        @0 acquire long holder=a ttl=600
        @10 acquire short holder=b ttl=600
        # short is released before the threshold: never reported
        @500 release short L2
        @550 renew long L1
        # the timer wakes for the threshold (1000) before the expiry (1150)
        @560 tick
        # the report comes once, when the machine reaches the threshold
        @1000 tick
        @1100 renew long L1
        @1650 renew long L1
        @2200 tick
        "#,
        expect![[r#"
            @0 acquire long holder=a ttl=600
              => granted token=1 lease=L1 expires=600
              ! persist grant long token=1 lease=L1 holder="a" ttl=600 req=-
            @10 acquire short holder=b ttl=600
              => granted token=2 lease=L2 expires=610
              ! persist grant short token=2 lease=L2 holder="b" ttl=600 req=-
            @500 release short L2
              => released token=2 held=490
              ! persist remove short L2
            @550 renew long L1
              => renewed expires=1150 ttl=600
            @560 tick
              => next deadline Some(1000)
            @1000 tick
              => next deadline Some(1150)
              ! held long long token=1 holder="a" held=1000
            @1100 renew long L1
              => renewed expires=1700 ttl=600
            @1650 renew long L1
              => renewed expires=2250 ttl=600
            @2200 tick
              => next deadline Some(2250)
        "#]],
    );
}

#[test]
fn a_reentrant_lease_counts_its_holds_and_ends_with_the_last_release() {
    check(
        r#"
        @0 acquire r holder=a owner=o1 ttl=1000
        # the owner again: the same lease and token, one more hold, its TTL from now
        @100 acquire r holder=a owner=o1 ttl=1000 req=in1
        # a retry of that re-entry is not counted twice
        @110 acquire r holder=a owner=o1 ttl=1000 req=in1
        @120 describe r
        # another owner, or none, is busy or waits like anyone else
        @130 acquire r holder=b owner=o2 ttl=1000
        @140 acquire r holder=c ttl=1000 wait=5000
        @200 release r L1
        @210 describe r
        @300 release r L1
        # a release after the last hold changes nothing
        @310 release r L1
        "#,
        expect![[r#"
            @0 acquire r holder=a owner=o1 ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=- owner=o1 holds=1
            @100 acquire r holder=a owner=o1 ttl=1000 req=in1
              => reentered token=1 lease=L1 expires=1100 holds=2
              ! persist reenter r L1 holds=2 req=in1
            @110 acquire r holder=a owner=o1 ttl=1000 req=in1
              => duplicate token=1 lease=L1 expires=1100 held=true
            @120 describe r
              => held holder="a" token=1 expires=1100 ttl=1000 waiters=0 holds=2
            @130 acquire r holder=b owner=o2 ttl=1000
              => busy holder="a" token=1 expires=1100 waiters=0
            @140 acquire r holder=c ttl=1000 wait=5000
              => queued w1 position=1
            @200 release r L1
              => unheld token=1 holds=1
              ! persist unhold r L1 holds=1
            @210 describe r
              => held holder="a" token=1 expires=1100 ttl=1000 waiters=1
            @300 release r L1
              => released token=1 held=300
              ! persist remove r L1
              ! persist grant r token=2 lease=L2 holder="c" ttl=1000 req=-
              ! hand-off w1: token=2 lease=L2 expires=1300
            @310 release r L1
              => not held (current token Some(FencingToken(2)))
        "#]],
    );
}

/// A re-entry's request id is remembered as a grant's is (invariant 6): every retry is a
/// duplicate, an earlier re-entry's as much as the latest's, after a crash, and after the lease
/// has ended (it then says so, rather than granting a new lease); and the id cannot be used
/// again for another resource.
#[test]
fn a_reentrys_request_id_is_remembered_like_a_grants() {
    check(
        r#"
        @0 acquire r holder=a owner=o1 ttl=1000 req=g
        @10 acquire r holder=a owner=o1 ttl=1000 req=in1
        @20 acquire r holder=a owner=o1 ttl=1000 req=in2
        @30 acquire r holder=a owner=o1 ttl=1000 req=in1
        @40 acquire s holder=a ttl=1000 req=in2
        @50 crash
        @60 acquire r holder=a owner=o1 ttl=1000 req=in2
        @2000 tick
        @2010 acquire r holder=a owner=o1 ttl=1000 req=in1
        @2020 acquire r holder=b ttl=1000 req=in2
        "#,
        expect![[r#"
            @0 acquire r holder=a owner=o1 ttl=1000 req=g
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=g owner=o1 holds=1
            @10 acquire r holder=a owner=o1 ttl=1000 req=in1
              => reentered token=1 lease=L1 expires=1010 holds=2
              ! persist reenter r L1 holds=2 req=in1
            @20 acquire r holder=a owner=o1 ttl=1000 req=in2
              => reentered token=1 lease=L1 expires=1020 holds=3
              ! persist reenter r L1 holds=3 req=in2
            @30 acquire r holder=a owner=o1 ttl=1000 req=in1
              => duplicate token=1 lease=L1 expires=1020 held=true
            @40 acquire s holder=a ttl=1000 req=in2
              => error: request_id "in2" was already used to acquire r; use a new request id for s
            @50 crash
              => recovered leases=1 requests=3 last_token=Some(1)
            @60 acquire r holder=a owner=o1 ttl=1000 req=in2
              => duplicate token=1 lease=L1 expires=1050 held=true
            @2000 tick
              => next deadline None
              ! persist remove r L1
              ! expired r token=1 holder="a" held=1000
            @2010 acquire r holder=a owner=o1 ttl=1000 req=in1
              => duplicate token=1 lease=L1 expires=2010 held=false
            @2020 acquire r holder=b ttl=1000 req=in2
              => duplicate token=1 lease=L1 expires=2020 held=false
        "#]],
    );
}

#[test]
fn expiry_ends_every_hold_and_a_crash_keeps_every_answered_reentry() {
    check(
        r#"
        @0 acquire r holder=a owner=o1 ttl=1000
        @10 acquire r holder=a owner=o1 ttl=1000
        @20 acquire r holder=a owner=o1 ttl=1000
        @30 release r L1
        # the re-entries were synced; the release of a hold may be lost
        @40 crash
        @50 describe r
        @60 release r L1
        @70 release r L1
        @80 acquire s holder=a owner=o1 ttl=1000
        @90 acquire s holder=a owner=o1 ttl=1000
        # expiry ends the lease however many holds it had
        @2000 tick
        @2000 describe s
        @2001 acquire s holder=a owner=o1 ttl=1000
        "#,
        expect![[r#"
            @0 acquire r holder=a owner=o1 ttl=1000
              => granted token=1 lease=L1 expires=1000
              ! persist grant r token=1 lease=L1 holder="a" ttl=1000 req=- owner=o1 holds=1
            @10 acquire r holder=a owner=o1 ttl=1000
              => reentered token=1 lease=L1 expires=1010 holds=2
              ! persist reenter r L1 holds=2 req=-
            @20 acquire r holder=a owner=o1 ttl=1000
              => reentered token=1 lease=L1 expires=1020 holds=3
              ! persist reenter r L1 holds=3 req=-
            @30 release r L1
              => unheld token=1 holds=2
              ! persist unhold r L1 holds=2
            @40 crash
              => recovered leases=1 requests=0 last_token=Some(1)
            @50 describe r
              => held holder="a" token=1 expires=1040 ttl=1000 waiters=0 holds=3
            @60 release r L1
              => unheld token=1 holds=2
              ! persist unhold r L1 holds=2
            @70 release r L1
              => unheld token=1 holds=1
              ! persist unhold r L1 holds=1
            @80 acquire s holder=a owner=o1 ttl=1000
              => granted token=2 lease=L2 expires=1080
              ! persist grant s token=2 lease=L2 holder="a" ttl=1000 req=- owner=o1 holds=1
            @90 acquire s holder=a owner=o1 ttl=1000
              => reentered token=2 lease=L2 expires=1090 holds=2
              ! persist reenter s L2 holds=2 req=-
            @2000 tick
              => next deadline None
              ! persist remove r L1
              ! expired r token=1 holder="a" held=1000
              ! persist remove s L2
              ! expired s token=2 holder="a" held=1010
            @2000 describe s
              => free waiters=0
            @2001 acquire s holder=a owner=o1 ttl=1000
              => granted token=3 lease=L3 expires=3001
              ! persist grant s token=3 lease=L3 holder="a" ttl=1000 req=- owner=o1 holds=1
        "#]],
    );
}

/// The hold count is bounded (`limits::HOLDS_MAX`): one more re-entry is a clear
/// INVALID_ARGUMENT, and changes nothing.
#[test]
fn a_reentrant_lease_holds_at_most_holds_max() {
    use lockd_core::{AcquireError, AcquireOutcome, InvalidArgument, Limits, limits::HOLDS_MAX};
    let mut rig = crate::harness::Rig::new(Limits::default());
    let mut fx = Vec::new();
    for n in 1..=HOLDS_MAX {
        match rig.acquire("deep", "a", (None, Some("o")), (60_000, 0, 0), &mut fx) {
            Ok(AcquireOutcome::Granted(g)) if n == 1 => assert_eq!(g.holds, 1),
            Ok(AcquireOutcome::Reentered(grant)) => assert_eq!(grant.holds, n),
            other => panic!("hold {n}: {other:?}"),
        }
    }
    fx.clear();
    let err = rig
        .acquire("deep", "a", (None, Some("o")), (60_000, 0, 0), &mut fx)
        .expect_err("one hold too many");
    assert!(
        matches!(
            err,
            AcquireError::Invalid(InvalidArgument::HoldsExceeded { max: HOLDS_MAX, .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("1000 times"), "{err}");
    assert!(
        fx.iter()
            .all(|e| !matches!(e, lockd_core::Effect::Persist(_))),
        "{fx:?}"
    );
    let d = rig
        .core
        .describe(0, &fencing::ResourceName::new("deep").unwrap(), &mut fx);
    assert_eq!(d.held.unwrap().holds, HOLDS_MAX);
}
