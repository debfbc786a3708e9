//! Transcripts of read-write locks: one writer on the lock's name, or readers each on a slot
//! of their own, served from one FIFO queue (so a waiting writer is not overtaken).

use expect_test::expect;

use crate::harness::check;

#[test]
fn readers_share_a_writer_waits_behind_them_and_later_readers_wait_behind_the_writer() {
    check(
        r#"
        @0 acquire doc holder=r1 ttl=1000 mode=read
        @1 acquire doc holder=r2 ttl=1000 mode=read
        # a writer cannot have it while readers hold: busy, or it waits
        @2 acquire doc holder=w1 ttl=1000 mode=write
        @3 acquire doc holder=w1 ttl=1000 mode=write wait=5000
        # a reader that comes after a waiting writer waits behind it (writer preference)
        @4 acquire doc holder=r3 ttl=1000 mode=read
        @5 acquire doc holder=r3 ttl=1000 mode=read wait=5000
        @6 acquire doc holder=r4 ttl=1000 mode=read wait=5000
        @7 acquire doc holder=w2 ttl=1000 mode=write wait=5000
        @8 describe doc
        @8 describe doc@read-2
        @9 release doc@read-1 L1
        # the last reader leaves: the writer gets it, alone
        @10 release doc@read-2 L2
        @11 describe doc
        # the writer leaves: both readers behind it get it together, the next writer waits
        @12 release doc L3
        @13 describe doc
        @14 release doc@read-1 L4
        @15 release doc@read-2 L5
        @16 release doc L6
        # unused again, and forgotten: the name may be an exclusive lock now
        @17 describe doc
        @18 acquire doc holder=x
        "#,
        expect![[r#"
            @0 acquire doc holder=r1 ttl=1000 mode=read
              => granted doc@read-1 token=1 lease=L1 expires=1000
              ! persist grant doc@read-1 token=1 lease=L1 holder="r1" ttl=1000 req=- rw=read
            @1 acquire doc holder=r2 ttl=1000 mode=read
              => granted doc@read-2 token=2 lease=L2 expires=1001
              ! persist grant doc@read-2 token=2 lease=L2 holder="r2" ttl=1000 req=- rw=read
            @2 acquire doc holder=w1 ttl=1000 mode=write
              => busy holder="r1" token=1 expires=1000 waiters=0
            @3 acquire doc holder=w1 ttl=1000 mode=write wait=5000
              => queued w1 position=1
            @4 acquire doc holder=r3 ttl=1000 mode=read
              => busy holder="r1" token=1 expires=1000 waiters=1
            @5 acquire doc holder=r3 ttl=1000 mode=read wait=5000
              => queued w2 position=2
            @6 acquire doc holder=r4 ttl=1000 mode=read wait=5000
              => queued w3 position=3
            @7 acquire doc holder=w2 ttl=1000 mode=write wait=5000
              => queued w4 position=4
            @8 describe doc
              => read-write readers=2 waiters=4
            @8 describe doc@read-2
              => held holder="r2" token=2 expires=1001 ttl=1000 waiters=4
            @9 release doc@read-1 L1
              => released token=1 held=9
              ! persist remove doc@read-1 L1
            @10 release doc@read-2 L2
              => released token=2 held=9
              ! persist remove doc@read-2 L2
              ! persist grant doc token=3 lease=L3 holder="w1" ttl=1000 req=- rw=write
              ! hand-off w1: token=3 lease=L3 expires=1010
            @11 describe doc
              => held holder="w1" token=3 expires=1010 ttl=1000 waiters=3
            @12 release doc L3
              => released token=3 held=2
              ! persist remove doc L3
              ! persist grant doc@read-1 token=4 lease=L4 holder="r3" ttl=1000 req=- rw=read
              ! hand-off w2: doc@read-1 token=4 lease=L4 expires=1012
              ! persist grant doc@read-2 token=5 lease=L5 holder="r4" ttl=1000 req=- rw=read
              ! hand-off w3: doc@read-2 token=5 lease=L5 expires=1012
            @13 describe doc
              => read-write readers=2 waiters=1
            @14 release doc@read-1 L4
              => released token=4 held=2
              ! persist remove doc@read-1 L4
            @15 release doc@read-2 L5
              => released token=5 held=3
              ! persist remove doc@read-2 L5
              ! persist grant doc token=6 lease=L6 holder="w2" ttl=1000 req=- rw=write
              ! hand-off w4: token=6 lease=L6 expires=1015
            @16 release doc L6
              => released token=6 held=1
              ! persist remove doc L6
            @17 describe doc
              => free waiters=0
            @18 acquire doc holder=x
              => granted token=7 lease=L7 expires=30018
              ! persist grant doc token=7 lease=L7 holder="x" ttl=30000 req=-
        "#]],
    );
}

#[test]
fn a_writer_downgrades_to_a_reader_without_letting_a_writer_in_between() {
    check(
        r#"
        @0 acquire doc holder=w ttl=1000 mode=write
        @1 acquire doc holder=w2 ttl=1000 mode=write wait=5000
        @2 acquire doc holder=r ttl=1000 mode=read wait=5000
        # the queued writer came first, so the reader stays behind it: nobody is let in
        @3 acquire doc holder=w ttl=1000 mode=read downgrade=L1 req=down-1
        # a retry gets the same reader's lease; the old write lease is gone
        @4 acquire doc holder=w ttl=1000 mode=read downgrade=L1 req=down-1
        @5 acquire doc holder=w ttl=1000 mode=read downgrade=L1
        @6 renew doc L1
        @7 describe doc
        @8 release doc@read-1 L2
        @9 release doc L3
        # with only readers waiting, the downgrade lets them in with it
        @10 release doc@read-1 L4
        @11 acquire doc holder=w3 ttl=1000 mode=write
        @12 acquire doc holder=r2 ttl=1000 mode=read wait=5000
        @13 acquire doc holder=w3 ttl=1000 mode=read downgrade=L5
        "#,
        expect![[r#"
            @0 acquire doc holder=w ttl=1000 mode=write
              => granted token=1 lease=L1 expires=1000
              ! persist grant doc token=1 lease=L1 holder="w" ttl=1000 req=- rw=write
            @1 acquire doc holder=w2 ttl=1000 mode=write wait=5000
              => queued w1 position=1
            @2 acquire doc holder=r ttl=1000 mode=read wait=5000
              => queued w2 position=2
            @3 acquire doc holder=w ttl=1000 mode=read downgrade=L1 req=down-1
              => granted doc@read-1 token=2 lease=L2 expires=1003
              ! persist remove doc L1
              ! persist grant doc@read-1 token=2 lease=L2 holder="w" ttl=1000 req=down-1 rw=read
            @4 acquire doc holder=w ttl=1000 mode=read downgrade=L1 req=down-1
              => duplicate doc@read-1 token=2 lease=L2 expires=1003 held=true
            @5 acquire doc holder=w ttl=1000 mode=read downgrade=L1
              => error: downgrade_lease_id is not the current write lease of doc (it has no writer now); stop working under it and acquire again
            @6 renew doc L1
              => error: the lease is not the current lease of doc (it expired or was released; it is not held now); stop working under it and acquire again
            @7 describe doc
              => read-write readers=1 waiters=2
            @8 release doc@read-1 L2
              => released token=2 held=5
              ! persist remove doc@read-1 L2
              ! persist grant doc token=3 lease=L3 holder="w2" ttl=1000 req=- rw=write
              ! hand-off w1: token=3 lease=L3 expires=1008
            @9 release doc L3
              => released token=3 held=1
              ! persist remove doc L3
              ! persist grant doc@read-1 token=4 lease=L4 holder="r" ttl=1000 req=- rw=read
              ! hand-off w2: doc@read-1 token=4 lease=L4 expires=1009
            @10 release doc@read-1 L4
              => released token=4 held=1
              ! persist remove doc@read-1 L4
            @11 acquire doc holder=w3 ttl=1000 mode=write
              => granted token=5 lease=L5 expires=1011
              ! persist grant doc token=5 lease=L5 holder="w3" ttl=1000 req=- rw=write
            @12 acquire doc holder=r2 ttl=1000 mode=read wait=5000
              => queued w3 position=1
            @13 acquire doc holder=w3 ttl=1000 mode=read downgrade=L5
              => granted doc@read-1 token=6 lease=L6 expires=1013
              ! persist remove doc L5
              ! persist grant doc@read-1 token=6 lease=L6 holder="w3" ttl=1000 req=- rw=read
              ! persist grant doc@read-2 token=7 lease=L7 holder="r2" ttl=1000 req=- rw=read
              ! hand-off w3: doc@read-2 token=7 lease=L7 expires=1013
        "#]],
    );
}

#[test]
fn a_name_is_one_kind_at_a_time_and_readers_use_their_own_names() {
    check(
        r#"
        @0 acquire doc holder=r ttl=1000 mode=read
        @1 acquire doc holder=x
        @1 acquire doc holder=x permits=2
        @1 acquire-all doc,other holder=x
        @2 acquire plain holder=x ttl=1000
        @2 acquire plain holder=y mode=write
        @2 acquire jobs holder=x permits=2
        @2 acquire jobs holder=y mode=read
        # a reader renews and releases its own slot, not the lock's name
        @3 renew doc L1
        @3 release doc L1
        @4 renew doc@read-1 L1
        # reserved names, and fields that do not go with a mode
        @5 acquire doc@read-1 holder=x
        @5 acquire doc@read-01 holder=x mode=read
        @5 acquire-all a,doc@read-7 holder=x
        @5 acquire doc holder=x mode=read permits=2
        @5 acquire doc holder=x mode=write owner=o
        "#,
        expect![[r#"
            @0 acquire doc holder=r ttl=1000 mode=read
              => granted doc@read-1 token=1 lease=L1 expires=1000
              ! persist grant doc@read-1 token=1 lease=L1 holder="r" ttl=1000 req=- rw=read
            @1 acquire doc holder=x
              => error: doc is held as a read-write lock, and was asked for as an exclusive lock; use one kind per name
            @1 acquire doc holder=x permits=2
              => error: doc is held as a read-write lock, and was asked for as a semaphore of 2 permits; use one kind per name
            @1 acquire-all doc,other holder=x
              => error: doc is held as a read-write lock, and was asked for as an exclusive lock; use one kind per name
            @2 acquire plain holder=x ttl=1000
              => granted token=2 lease=L2 expires=1002
              ! persist grant plain token=2 lease=L2 holder="x" ttl=1000 req=-
            @2 acquire plain holder=y mode=write
              => error: plain is held as an exclusive lock, and was asked for as a read-write lock; use one kind per name
            @2 acquire jobs holder=x permits=2
              => granted jobs@permit-1 token=3 lease=L3 expires=30002
              ! persist grant jobs@permit-1 token=3 lease=L3 holder="x" ttl=30000 req=- permits=2
            @2 acquire jobs holder=y mode=read
              => error: jobs is held as a semaphore of 2 permits, and was asked for as a read-write lock; use one kind per name
            @3 renew doc L1
              => error: the lease is a reader's of the read-write lock doc: a reader renews and releases under its own slot's name, doc@read-1 (the resource its grant names)
            @3 release doc L1
              => not held: the lease of its reader on slot 1
            @4 renew doc@read-1 L1
              => renewed expires=1004 ttl=1000
            @5 acquire doc@read-1 holder=x
              => error: doc@read-1 is the name of a read-write lock's reader (names ending in @read- and digits are reserved): acquire the lock with mode read, then renew and release the reader's lease it grants
            @5 acquire doc@read-01 holder=x mode=read
              => error: doc@read-01 is the name of a read-write lock's reader (names ending in @read- and digits are reserved): acquire the lock with mode read, then renew and release the reader's lease it grants
            @5 acquire-all a,doc@read-7 holder=x
              => error: resources[1]: doc@read-7 is the name of a read-write lock's reader (names ending in @read- and digits are reserved): acquire the lock with mode read, then renew and release the reader's lease it grants
            @5 acquire doc holder=x mode=read permits=2
              => error: mode read asks for a read-write lock: send mode or permits, not both
            @5 acquire doc holder=x mode=write owner=o
              => error: mode write asks for a read-write lock: send mode or owner, not both
        "#]],
    );
}

#[test]
fn expiry_serves_the_queue_and_a_restart_keeps_a_writer_a_writer() {
    check(
        r#"
        @0 acquire doc holder=r1 ttl=1000 mode=read
        @500 acquire doc holder=r2 ttl=1000 mode=read
        @600 acquire doc holder=w ttl=1000 mode=write wait=5000
        # the first reader's lease runs out: the writer still waits for the second
        @1000 tick
        @1500 tick
        @1600 restart
        # after a restart the writer is still the lock's writer, not an exclusive lock
        @1700 acquire doc holder=r3 mode=read
        @1700 acquire doc holder=x
        @1800 crash
        @1900 describe doc
        @1900 acquire doc holder=r3 mode=read wait=5000
        @3600 tick
        @3700 describe doc@read-1
        "#,
        expect![[r#"
            @0 acquire doc holder=r1 ttl=1000 mode=read
              => granted doc@read-1 token=1 lease=L1 expires=1000
              ! persist grant doc@read-1 token=1 lease=L1 holder="r1" ttl=1000 req=- rw=read
            @500 acquire doc holder=r2 ttl=1000 mode=read
              => granted doc@read-2 token=2 lease=L2 expires=1500
              ! persist grant doc@read-2 token=2 lease=L2 holder="r2" ttl=1000 req=- rw=read
            @600 acquire doc holder=w ttl=1000 mode=write wait=5000
              => queued w1 position=1
            @1000 tick
              => next deadline Some(1500)
              ! persist remove doc@read-1 L1
              ! expired doc@read-1 token=1 holder="r1" held=1000
            @1500 tick
              => next deadline Some(2500)
              ! persist remove doc@read-2 L2
              ! expired doc@read-2 token=2 holder="r2" held=1000
              ! persist grant doc token=3 lease=L3 holder="w" ttl=1000 req=- rw=write
              ! hand-off w1: token=3 lease=L3 expires=2500
            @1600 restart
              => recovered leases=1 requests=0 last_token=Some(3)
            @1700 acquire doc holder=r3 mode=read
              => busy holder="w" token=3 expires=2600 waiters=0
            @1700 acquire doc holder=x
              => error: doc is held as a read-write lock, and was asked for as an exclusive lock; use one kind per name
            @1800 crash
              => recovered leases=1 requests=0 last_token=Some(3)
            @1900 describe doc
              => held holder="w" token=3 expires=2800 ttl=1000 waiters=0
            @1900 acquire doc holder=r3 mode=read wait=5000
              => queued w1 position=1
            @3600 tick
              => next deadline Some(33600)
              ! persist remove doc L3
              ! expired doc token=3 holder="w" held=1000
              ! persist grant doc@read-1 token=4 lease=L4 holder="r3" ttl=30000 req=- rw=read
              ! hand-off w1: doc@read-1 token=4 lease=L4 expires=33600
            @3700 describe doc@read-1
              => held holder="r3" token=4 expires=33600 ttl=30000 waiters=0
        "#]],
    );
}

#[test]
fn readers_behind_a_writer_that_leaves_the_queue_get_the_lock_at_once() {
    check(
        r#"
        @0 acquire doc holder=r1 ttl=10000 mode=read
        @1 acquire doc holder=w ttl=1000 mode=write wait=100
        @2 acquire doc holder=r2 ttl=1000 mode=read wait=5000
        @3 acquire doc holder=w2 ttl=1000 mode=write wait=5000
        @4 acquire doc holder=r3 ttl=1000 mode=read wait=5000
        # the writer at the head gives up: the reader behind it joins the readers at once,
        # and stops at the next writer
        @101 tick
        @102 describe doc
        # a cancelled writer at the head lets the readers behind it in too
        @103 cancel w3
        @104 describe doc
        @105 acquire doc holder=r4 ttl=1000 mode=read
        "#,
        expect![[r#"
            @0 acquire doc holder=r1 ttl=10000 mode=read
              => granted doc@read-1 token=1 lease=L1 expires=10000
              ! persist grant doc@read-1 token=1 lease=L1 holder="r1" ttl=10000 req=- rw=read
            @1 acquire doc holder=w ttl=1000 mode=write wait=100
              => queued w1 position=1
            @2 acquire doc holder=r2 ttl=1000 mode=read wait=5000
              => queued w2 position=2
            @3 acquire doc holder=w2 ttl=1000 mode=write wait=5000
              => queued w3 position=3
            @4 acquire doc holder=r3 ttl=1000 mode=read wait=5000
              => queued w4 position=4
            @101 tick
              => next deadline Some(1101)
              ! wait timed out w1: held with token 1
              ! persist grant doc@read-2 token=2 lease=L2 holder="r2" ttl=1000 req=- rw=read
              ! hand-off w2: doc@read-2 token=2 lease=L2 expires=1101
            @102 describe doc
              => read-write readers=2 waiters=2
            @103 cancel w3
              => cancelled=true
              ! persist grant doc@read-3 token=3 lease=L3 holder="r3" ttl=1000 req=- rw=read
              ! hand-off w4: doc@read-3 token=3 lease=L3 expires=1103
            @104 describe doc
              => read-write readers=3 waiters=0
            @105 acquire doc holder=r4 ttl=1000 mode=read
              => granted doc@read-4 token=4 lease=L4 expires=1105
              ! persist grant doc@read-4 token=4 lease=L4 holder="r4" ttl=1000 req=- rw=read
        "#]],
    );
}

#[test]
fn a_waiting_request_id_keeps_its_side() {
    check(
        r#"
        @0 acquire doc holder=w ttl=1000 mode=write
        @1 acquire doc holder=r ttl=1000 mode=read wait=5000 req=q1
        # the same id again, as the same side: the waiter rejoins; as the other: refused
        @2 acquire doc holder=r ttl=1000 mode=read wait=5000 req=q1
        @3 acquire doc holder=r ttl=1000 mode=write wait=5000 req=q1
        @4 release doc L1
        # granted as a reader: a retry as the writer is another request
        @5 acquire doc holder=r ttl=1000 mode=write req=q1
        @6 acquire doc holder=r ttl=1000 mode=read req=q1
        "#,
        expect![[r#"
            @0 acquire doc holder=w ttl=1000 mode=write
              => granted token=1 lease=L1 expires=1000
              ! persist grant doc token=1 lease=L1 holder="w" ttl=1000 req=- rw=write
            @1 acquire doc holder=r ttl=1000 mode=read wait=5000 req=q1
              => queued w1 position=1
            @2 acquire doc holder=r ttl=1000 mode=read wait=5000 req=q1
              => rejoined w1 position=1
            @3 acquire doc holder=r ttl=1000 mode=write wait=5000 req=q1
              => error: request_id "q1" is waiting for doc as a reader; use a new request id to ask as its writer
            @4 release doc L1
              => released token=1 held=4
              ! persist remove doc L1
              ! persist grant doc@read-1 token=2 lease=L2 holder="r" ttl=1000 req=q1 rw=read
              ! hand-off w1: doc@read-1 token=2 lease=L2 expires=1004
            @5 acquire doc holder=r ttl=1000 mode=write req=q1
              => error: request_id "q1" was already used to acquire doc@read-1; use a new request id for doc
            @6 acquire doc holder=r ttl=1000 mode=read req=q1
              => duplicate doc@read-1 token=2 lease=L2 expires=1004 held=true
        "#]],
    );
}

#[test]
fn readers_handed_the_lock_together_stay_within_the_lease_limit_and_wait_for_room() {
    check(
        r#"
        limits leases_max=3
        @0 acquire doc holder=w ttl=1000 mode=write
        @1 acquire other holder=x ttl=5000
        @2 acquire doc holder=r1 ttl=1000 mode=read wait=5000
        @3 acquire doc holder=r2 ttl=1000 mode=read wait=5000
        @4 acquire doc holder=r3 ttl=1000 mode=read wait=5000
        # the writer's lease makes room for one reader; the next takes the last room; the
        # third keeps its place
        @5 release doc L1
        @6 describe doc
        @6 acquire more holder=y
        # a lease of another name ends: the reader waiting for room is served
        @7 release other L2
        @8 describe doc
        "#,
        expect![[r#"
            @0 acquire doc holder=w ttl=1000 mode=write
              => granted token=1 lease=L1 expires=1000
              ! persist grant doc token=1 lease=L1 holder="w" ttl=1000 req=- rw=write
            @1 acquire other holder=x ttl=5000
              => granted token=2 lease=L2 expires=5001
              ! persist grant other token=2 lease=L2 holder="x" ttl=5000 req=-
            @2 acquire doc holder=r1 ttl=1000 mode=read wait=5000
              => queued w1 position=1
            @3 acquire doc holder=r2 ttl=1000 mode=read wait=5000
              => queued w2 position=2
            @4 acquire doc holder=r3 ttl=1000 mode=read wait=5000
              => queued w3 position=3
            @5 release doc L1
              => released token=1 held=5
              ! persist remove doc L1
              ! persist grant doc@read-1 token=3 lease=L3 holder="r1" ttl=1000 req=- rw=read
              ! hand-off w1: doc@read-1 token=3 lease=L3 expires=1005
              ! persist grant doc@read-2 token=4 lease=L4 holder="r2" ttl=1000 req=- rw=read
              ! hand-off w2: doc@read-2 token=4 lease=L4 expires=1005
            @6 describe doc
              => read-write readers=2 waiters=1
            @6 acquire more holder=y
              => error: lockd holds the maximum number of leases (3); release unused locks or raise limits.leases_max
            @7 release other L2
              => released token=2 held=6
              ! persist remove other L2
              ! persist grant doc@read-3 token=5 lease=L5 holder="r3" ttl=1000 req=- rw=read
              ! hand-off w3: doc@read-3 token=5 lease=L5 expires=1007
            @8 describe doc
              => read-write readers=3 waiters=0
        "#]],
    );
}

#[test]
fn a_request_id_answers_only_its_own_kind_of_call() {
    check(
        r#"
        @0 acquire doc holder=w ttl=1000 mode=write
        @1 acquire doc holder=r ttl=1000 mode=read wait=5000 req=q1
        # a downgrade never waits: it cannot take over a waiting reader's request id
        @2 acquire doc holder=w ttl=1000 mode=read downgrade=L1 req=q1
        @3 describe doc
        # an exclusive lock's request id is not a writer's, nor the other way round
        @4 acquire plain holder=x ttl=1000 req=q2
        @5 acquire plain holder=x ttl=1000 mode=write req=q2
        @6 acquire doc holder=w ttl=1000 mode=write req=q3
        @7 release doc L1
        @8 acquire doc2 holder=w ttl=1000 mode=write req=q4
        @9 acquire doc2 holder=w ttl=1000 req=q4
        @9 acquire doc2 holder=w ttl=1000 mode=write req=q4
        "#,
        expect![[r#"
            @0 acquire doc holder=w ttl=1000 mode=write
              => granted token=1 lease=L1 expires=1000
              ! persist grant doc token=1 lease=L1 holder="w" ttl=1000 req=- rw=write
            @1 acquire doc holder=r ttl=1000 mode=read wait=5000 req=q1
              => queued w1 position=1
            @2 acquire doc holder=w ttl=1000 mode=read downgrade=L1 req=q1
              => error: request_id "q1" is waiting for doc as a reader; use a new request id to ask as a downgrade (which never waits)
            @3 describe doc
              => held holder="w" token=1 expires=1000 ttl=1000 waiters=1
            @4 acquire plain holder=x ttl=1000 req=q2
              => granted token=2 lease=L2 expires=1004
              ! persist grant plain token=2 lease=L2 holder="x" ttl=1000 req=q2
            @5 acquire plain holder=x ttl=1000 mode=write req=q2
              => error: request_id "q2" was already used for plain as an exclusive lock; use a new request id to ask for it as a read-write lock's writer
            @6 acquire doc holder=w ttl=1000 mode=write req=q3
              => busy holder="w" token=1 expires=1000 waiters=1
            @7 release doc L1
              => released token=1 held=7
              ! persist remove doc L1
              ! persist grant doc@read-1 token=3 lease=L3 holder="r" ttl=1000 req=q1 rw=read
              ! hand-off w1: doc@read-1 token=3 lease=L3 expires=1007
            @8 acquire doc2 holder=w ttl=1000 mode=write req=q4
              => granted token=4 lease=L4 expires=1008
              ! persist grant doc2 token=4 lease=L4 holder="w" ttl=1000 req=q4 rw=write
            @9 acquire doc2 holder=w ttl=1000 req=q4
              => error: request_id "q4" was already used for doc2 as a read-write lock's writer; use a new request id to ask for it as an exclusive lock
            @9 acquire doc2 holder=w ttl=1000 mode=write req=q4
              => duplicate token=4 lease=L4 expires=1008 held=true
        "#]],
    );
}
