package dev.lockd.client;

/**
 * What {@link LockdClient#describe} says of a resource. {@code token}, {@code holds} and
 * {@code ttlMs} are 0 when it is not held; {@code permits}/{@code permitsHeld} describe a
 * semaphore in use, {@code readers} a read-write lock in use (-1 otherwise).
 */
public record Description(String resource, boolean held, String holder, long token, int waiters, int holds,
        long ttlMs, int permits, int permitsHeld, int readers) {
}
