package dev.lockd.client;

/** The wait ran out before the lock was handed over. */
public class WaitTimedOutException extends NotGrantedException {
    private static final long serialVersionUID = 1L;

    public WaitTimedOutException(String message, String resource, String holder, long token, int waiters) {
        super(message, resource, holder, token, waiters);
    }
}
