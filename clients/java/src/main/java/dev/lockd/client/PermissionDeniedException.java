package dev.lockd.client;

/** The caller may not use this resource (another tenant's). */
public class PermissionDeniedException extends LockdException {
    private static final long serialVersionUID = 1L;

    public PermissionDeniedException(String message) {
        super(message);
    }

    public PermissionDeniedException(String message, Throwable cause) {
        super(message, cause);
    }
}
