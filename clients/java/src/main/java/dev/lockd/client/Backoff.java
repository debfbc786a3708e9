package dev.lockd.client;

import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;

/** Retry delays: 50 ms doubling to 1 s, each drawn from the upper half of its base. Not thread-safe. */
final class Backoff {
    static final long MIN = TimeUnit.MILLISECONDS.toNanos(50);
    static final long MAX = TimeUnit.SECONDS.toNanos(1);

    private long base = MIN;

    long nextDelayNanos() {
        long b = base;
        base = Math.min(b * 2, MAX);
        return b / 2 + ThreadLocalRandom.current().nextLong(b / 2 + 1);
    }

    void reset() {
        base = MIN;
    }

    /** {@code nanos} ±10%. */
    static long jittered(long nanos) {
        return (long) (nanos * ThreadLocalRandom.current().nextDouble(0.9, 1.1));
    }
}
