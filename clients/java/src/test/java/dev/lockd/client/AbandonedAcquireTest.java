package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A waiting acquire cancelled just as lockd grants it leaves no lease that nobody holds: the grant
 * is released in the background, so the resource is free long before the lease's TTL.
 */
class AbandonedAcquireTest {
    private static final int ROUNDS = 30;
    private Testbed bed;
    private LockdClient a;
    private LockdClient b;
    private final String run = LockdClient.newRequestId().replaceAll("[^A-Za-z0-9]", "");

    @BeforeEach
    void setUp() throws Exception {
        bed = Testbed.shared();
        a = bed.client("java-abandon-a");
        b = bed.client("java-abandon-b");
    }

    @AfterEach
    void tearDown() {
        a.close();
        b.close();
    }

    @Test
    void aGrantThatRacesTheCancelIsReleased() throws Exception {
        AcquireOptions ttl = AcquireOptions.builder().ttl(Duration.ofSeconds(30)).build();
        AcquireOptions waiting = AcquireOptions.builder().ttl(Duration.ofSeconds(30)).wait(Duration.ofSeconds(60))
                .build();
        List<String> resources = new ArrayList<>();
        for (int i = 0; i < ROUNDS; i++) {
            String r = "java/" + run + "/abandon-" + i;
            resources.add(r);
            Lock held = a.acquire(r, ttl);
            CompletableFuture<Lock> waiter = b.acquireAsync(r, waiting);
            Testbed.poll(r + ": never 1 waiter", 30, () -> a.describe(r).waiters() == 1);
            CountDownLatch go = new CountDownLatch(1);
            Thread releaser = new Thread(() -> {
                try {
                    go.await();
                    held.release();
                } catch (InterruptedException ignored) {
                    // the test ends
                }
            });
            Thread canceller = new Thread(() -> {
                try {
                    go.await();
                    waiter.cancel(true);
                } catch (InterruptedException ignored) {
                    // the test ends
                }
            });
            releaser.start();
            canceller.start();
            go.countDown();
            releaser.join(30_000);
            canceller.join(30_000);
            if (!waiter.isCancelled()) {
                waiter.join().release(); // granted before the cancel: the caller holds it, not the case tested
            }
        }
        List<String> stillHeld = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        for (String r : resources) {
            while (a.describe(r).held() && System.nanoTime() - deadline < 0) {
                Thread.sleep(20); // polling describe() until the resource is free
            }
            if (a.describe(r).held()) {
                stillHeld.add(r + " (" + a.describe(r) + ")");
            }
        }
        assertTrue(stillHeld.isEmpty(), stillHeld.size() + " of " + ROUNDS
                + " resources still held by an abandoned grant: " + stillHeld);
    }
    /**
     * A future cancelled after its acquire was granted gives the grant back though the cancel
     * interrupted the thread that ran the acquire: an interrupted thread's release would fail at
     * once and leave the lease held until its TTL.
     */
    @Test
    void aGrantMadeBeforeTheCancelIsReleasedThoughTheCancelInterrupts() throws Exception {
        String r = "java/" + run + "/granted-then-cancelled";
        CountDownLatch granted = new CountDownLatch(1);
        java.util.concurrent.atomic.AtomicReference<Boolean> undoneInterrupted =
                new java.util.concurrent.atomic.AtomicReference<>();
        CompletableFuture<Lock> f = LockdClient.async(() -> {
            Lock l = b.acquire(r, AcquireOptions.builder().ttl(Duration.ofSeconds(30)).build());
            granted.countDown();
            try {
                new CountDownLatch(1).await(); // until the cancel interrupts this thread
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt(); // as well-behaved code does
            }
            return l;
        }, l -> {
            undoneInterrupted.set(Thread.currentThread().isInterrupted());
            l.release();
        });
        assertTrue(granted.await(30, TimeUnit.SECONDS), "the acquire was never granted");
        assertTrue(f.cancel(true));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (a.describe(r).held() && System.nanoTime() - deadline < 0) {
            Thread.sleep(20); // polling describe() until the resource is free
        }
        Description d = a.describe(r);
        assertTrue(!d.held(), r + " is still held after its future was cancelled: " + d);
        assertEquals(Boolean.FALSE, undoneInterrupted.get(),
                "the grant was given back from a thread the cancel had interrupted, whose calls fail at once");
    }
}
