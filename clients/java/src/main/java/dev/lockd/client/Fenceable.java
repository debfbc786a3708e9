package dev.lockd.client;

/** What the fencing helpers need: a resource and the token to present for it. {@link Lock} is one. */
public interface Fenceable {
    /** The resource the lease is on (for a semaphore or a reader: its permit's or slot's name). */
    String resource();

    /** The token to attach to writes: the signed form when lockd signs, else the number. */
    String fenceToken();
}
