package dev.lockd.client;

import java.time.Duration;
import java.util.Objects;

/**
 * How to acquire: {@code AcquireOptions.builder().ttl(Duration.ofSeconds(30)).wait(Duration.ofSeconds(10)).build()}.
 * Defaults: lockd's default TTL, no wait (a try), a fresh request id, not reentrant, an exclusive lock.
 */
public final class AcquireOptions {
    /** A try with lockd's default TTL. */
    public static final AcquireOptions DEFAULT = builder().build();

    private final Duration ttl;
    private final Duration wait;
    private final String requestId;
    private final String owner;
    private final int permits;
    private final Mode mode;
    private final String holder;

    private AcquireOptions(Builder b) {
        this.ttl = b.ttl;
        this.wait = b.wait;
        this.requestId = b.requestId;
        this.owner = b.owner;
        this.permits = b.permits;
        this.mode = b.mode;
        this.holder = b.holder;
    }

    public static Builder builder() {
        return new Builder();
    }

    /** A builder starting from these options. */
    public Builder toBuilder() {
        Builder b = new Builder();
        b.ttl = ttl;
        b.wait = wait;
        b.requestId = requestId;
        b.owner = owner;
        b.permits = permits;
        b.mode = mode;
        b.holder = holder;
        return b;
    }

    /** The lease's length; null = lockd's default. */
    public Duration ttl() {
        return ttl;
    }

    public Duration waitTime() {
        return wait;
    }

    public String requestId() {
        return requestId;
    }

    public String owner() {
        return owner;
    }

    public int permits() {
        return permits;
    }

    public Mode mode() {
        return mode;
    }

    public String holder() {
        return holder;
    }

    void check(String resource) {
        Settings.checkResource(resource);
        if (ttl != null && (ttl.isNegative() || ttl.isZero())) {
            throw new InvalidArgumentException("ttl must be positive, not " + ttl);
        }
        if (wait.isNegative()) {
            throw new InvalidArgumentException("wait must be zero or positive, not " + wait);
        }
        if (permits < 0 || permits > 1000) {
            throw new InvalidArgumentException("permits must be 0 (a lock) or 1..1000, not " + permits);
        }
        if (owner != null && (permits != 0 || mode != Mode.EXCLUSIVE)) {
            throw new InvalidArgumentException(
                    "owner (reentrancy) is for exclusive locks, not semaphores or read-write locks");
        }
        if (permits != 0 && mode != Mode.EXCLUSIVE) {
            throw new InvalidArgumentException("permits and mode do not go together");
        }
    }

    /** Builds {@link AcquireOptions}. */
    public static final class Builder {
        private Duration ttl;
        private Duration wait = Duration.ZERO;
        private String requestId;
        private String owner;
        private int permits;
        private Mode mode = Mode.EXCLUSIVE;
        private String holder;

        private Builder() {
        }

        /** The lease's length (null: lockd's default, 30 s unless configured). */
        public Builder ttl(Duration ttl) {
            this.ttl = ttl;
            return this;
        }

        /** How long to wait in the resource's FIFO queue; zero (the default) tries once. */
        public Builder wait(Duration wait) {
            this.wait = Objects.requireNonNull(wait, "wait");
            return this;
        }

        /**
         * Names this acquire: a retry with the same id gets the original grant back. Default: a
         * fresh random id, kept across the SDK's own retries.
         */
        public Builder requestId(String requestId) {
            this.requestId = requestId;
            return this;
        }

        /** Makes the lock reentrant for this owner: an acquire naming the current lease's owner gets it back with one more hold. */
        public Builder owner(String owner) {
            this.owner = owner;
            return this;
        }

        /** 0 = a lock; N = one of the N permits of the semaphore (every client must ask with the same N). */
        public Builder permits(int permits) {
            this.permits = permits;
            return this;
        }

        /** {@link Mode#READ} / {@link Mode#WRITE} for a read-write lock. */
        public Builder mode(Mode mode) {
            this.mode = Objects.requireNonNull(mode, "mode");
            return this;
        }

        /** How the holder describes itself for this lock (default: the client's holder). */
        public Builder holder(String holder) {
            this.holder = holder;
            return this;
        }

        public AcquireOptions build() {
            return new AcquireOptions(this);
        }
    }
}
