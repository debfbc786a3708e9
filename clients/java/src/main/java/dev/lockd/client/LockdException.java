package dev.lockd.client;

/** The base of every exception the SDK throws. Unchecked: catch the subclass you can act on. */
public class LockdException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public LockdException(String message) {
        super(message);
    }

    public LockdException(String message, Throwable cause) {
        super(message, cause);
    }
}
