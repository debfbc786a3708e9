package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** What the conformance suite does not say: the Java idioms (interrupts, listeners, try-with-resources). */
class ClientBehaviourTest {
    private Testbed bed;
    private LockdClient a;
    private LockdClient b;
    private final String run = LockdClient.newRequestId().replaceAll("[^A-Za-z0-9]", "");

    @BeforeEach
    void setUp() throws Exception {
        bed = Testbed.shared();
        a = bed.client("java-test-a");
        b = bed.client("java-test-b");
    }

    @AfterEach
    void tearDown() {
        a.close();
        b.close();
    }

    private static AcquireOptions ttl(long ms) {
        return AcquireOptions.builder().ttl(Duration.ofMillis(ms)).build();
    }

    private static void waitForWaiters(LockdClient c, String resource, int n) throws InterruptedException {
        Testbed.poll(resource + ": never " + n + " waiters", 60, () -> c.describe(resource).waiters() == n);
    }

    @Test
    void anInterruptCancelsABlockingWaitAndLockdForgetsTheWaiter() throws Exception {
        String r = "java/" + run + "/interrupt";
        try (Lock held = a.acquire(r, ttl(30000))) {
            AtomicReference<Throwable> error = new AtomicReference<>();
            AtomicReference<Boolean> flag = new AtomicReference<>();
            Thread t = new Thread(() -> {
                try {
                    b.acquire(r, AcquireOptions.builder().wait(Duration.ofSeconds(120)).build());
                } catch (Throwable e) {
                    error.set(e);
                    flag.set(Thread.currentThread().isInterrupted());
                }
            });
            t.start();
            waitForWaiters(a, r, 1);
            t.interrupt();
            t.join(30_000);
            assertFalse(t.isAlive());
            assertTrue(error.get() instanceof CancelledException, String.valueOf(error.get()));
            assertEquals(Boolean.TRUE, flag.get(), "the interrupt flag is set again");
            waitForWaiters(a, r, 0);
            assertTrue(held.token() > 0);
        }
        // try-with-resources released it; the cancelled acquire's clean-up may take it for a
        // moment to release it (docs: cancelling), so: free within a bound, not at once.
        Testbed.poll("still held after try-with-resources released it", 10, () -> !a.describe(r).held());
    }

    @Test
    void aLossIsSignalledEveryWay() throws Exception {
        String r = "java/" + run + "/lost";
        Lock lock = a.acquire(r, ttl(1000));
        CompletableFuture<LostReason> heard = new CompletableFuture<>();
        lock.addLostListener(heard::complete);
        assertFalse(lock.isLost());
        lock.checkNotLost();
        assertTrue(a.release(lock.resource(), lock.leaseId()), "ended behind its back");
        assertEquals(LostReason.NOT_CURRENT, heard.get(30, TimeUnit.SECONDS));
        assertEquals(LostReason.NOT_CURRENT, lock.onLost().get(1, TimeUnit.SECONDS));
        assertTrue(lock.isLost());
        assertEquals(LostReason.NOT_CURRENT, lock.lostReason());
        assertThrows(LockLostException.class, lock::checkNotLost);
        AtomicReference<LostReason> late = new AtomicReference<>();
        lock.addLostListener(late::set);
        assertEquals(LostReason.NOT_CURRENT, late.get(), "a listener added after the loss runs at once");
        assertFalse(lock.release(), "not current");
        assertFalse(lock.release(), "idempotent");
    }

    @Test
    void renewalsKeepAShortLeaseAlive() throws Exception {
        String r = "java/" + run + "/renewed";
        try (Lock lock = a.acquire(r, ttl(1200))) {
            long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(4000);
            while (System.nanoTime() < until) { // more than three TTLs, polling lockd
                Description d = b.describe(r);
                assertTrue(d.held() && d.token() == lock.token(), d.toString());
                assertFalse(lock.isLost(), () -> lock.lostReason() + " " + lock);
                Thread.sleep(100);
            }
            assertTrue(lock.remaining().toMillis() > 0);
        }
    }

    @Test
    void detachHandsTheLeaseOver() {
        String r = "java/" + run + "/detach";
        Lock lock = a.acquire(r, ttl(30000));
        String id = lock.detach();
        assertFalse(lock.release(), "a detached lock is not released by the lock");
        assertTrue(b.describe(r).held());
        assertTrue(b.release(lock.resource(), id));
        assertFalse(b.describe(r).held());
    }

    @Test
    void reenterAddsAHold() {
        String r = "java/" + run + "/reenter";
        Lock outer = a.acquire(r, AcquireOptions.builder().ttl(Duration.ofSeconds(30)).owner(run).build());
        Lock inner = outer.reenter();
        assertEquals(outer.token(), inner.token());
        assertEquals(2, inner.holds());
        assertTrue(inner.release());
        assertTrue(b.describe(r).held());
        assertTrue(outer.release());
        assertFalse(b.describe(r).held());
        assertThrows(InvalidArgumentException.class, () -> a.acquire(r + "x", ttl(30000)).reenter());
    }

    @Test
    void orderedLocksReleaseWhatTheyTookOnFailure() {
        String x = "java/" + run + "/ord-x";
        String y = "java/" + run + "/ord-y";
        try (Lock held = b.acquire(y, ttl(30000))) {
            BusyException e = assertThrows(BusyException.class, () -> a.acquireOrdered(ttl(30000), y, x));
            assertEquals(y, e.resource());
            assertEquals(held.token(), e.token().orElseThrow());
            assertFalse(a.describe(x).held(), "x was taken first, then released");
        }
        try (LockSet set = a.acquireOrdered(ttl(30000), y, x)) {
            assertEquals(x, set.get(0).resource());
            assertEquals(y, set.get(1).resource());
        }
        assertFalse(a.describe(x).held());
    }

    @Test
    void aDeadFirstEndpointIsSkippedByDescribeAndRelease() {
        String dead = bed.servers.get("dead").get("endpoint").asText();
        String lockd = bed.servers.get("lockd").get("endpoint").asText();
        String r = "java/" + run + "/failover";
        try (LockdClient c = LockdClient.builder().endpoints(dead, lockd).build()) {
            assertFalse(c.describe(r).held());
        }
        Lock lock = a.acquire(r, ttl(30000));
        try (LockdClient c = LockdClient.builder().endpoints(dead, lockd).build()) {
            assertTrue(c.release(r, lock.leaseId()), "a release never sent goes to the next endpoint");
        }
        lock.detach();
    }
}
