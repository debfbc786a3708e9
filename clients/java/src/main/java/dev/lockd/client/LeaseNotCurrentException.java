package dev.lockd.client;

/** The lease is not the resource's current lease (expired, released, or never was). */
public class LeaseNotCurrentException extends LockdException {
    private static final long serialVersionUID = 1L;

    public LeaseNotCurrentException(String message) {
        super(message);
    }

    public LeaseNotCurrentException(String message, Throwable cause) {
        super(message, cause);
    }
}
