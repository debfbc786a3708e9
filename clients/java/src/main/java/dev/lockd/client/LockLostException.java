package dev.lockd.client;

/** Work was attempted under a lock that is known to be lost ({@link Lock#checkNotLost()}). */
public class LockLostException extends LockdException {
    private static final long serialVersionUID = 1L;

    public LockLostException(String message) {
        super(message);
    }

    public LockLostException(String message, Throwable cause) {
        super(message, cause);
    }
}
