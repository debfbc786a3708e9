package dev.lockd.client;

/** The resource was held and no wait was asked for (a try). */
public class BusyException extends NotGrantedException {
    private static final long serialVersionUID = 1L;

    public BusyException(String message, String resource, String holder, long token, int waiters) {
        super(message, resource, holder, token, waiters);
    }
}
