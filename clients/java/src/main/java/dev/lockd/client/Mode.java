package dev.lockd.client;

/** What an acquire asks for: an exclusive lock (or a semaphore's permit), or a side of a read-write lock. */
public enum Mode {
    /** An exclusive lock, or a semaphore's permit ({@link AcquireOptions.Builder#permits}). */
    EXCLUSIVE,
    /** A reader's lease of a read-write lock, on the reader's own slot {@code RESOURCE@read-K}. */
    READ,
    /** The writer's lease of a read-write lock, alone. */
    WRITE
}
