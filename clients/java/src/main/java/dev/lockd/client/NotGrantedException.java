package dev.lockd.client;

import java.util.OptionalLong;

/** The lock was not granted: {@link BusyException} or {@link WaitTimedOutException}. Says who held it. */
public abstract class NotGrantedException extends LockdException {
    private static final long serialVersionUID = 1L;

    private final String resource;
    private final String holder;
    private final long token;
    private final int waiters;

    protected NotGrantedException(String message, String resource, String holder, long token, int waiters) {
        super(message);
        this.resource = resource;
        this.holder = holder;
        this.token = token;
        this.waiters = waiters;
    }

    /** The resource asked for (for a set: its first held member). */
    public String resource() {
        return resource;
    }

    /** The current holder, as it described itself ("" if unknown). */
    public String holder() {
        return holder;
    }

    /** The current holder's token, if any. */
    public OptionalLong token() {
        return token == 0 ? OptionalLong.empty() : OptionalLong.of(token);
    }

    /** How many wait in the resource's queue. */
    public int waiters() {
        return waiters;
    }
}
