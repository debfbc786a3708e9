package dev.lockd.client;

/** lockd could not be reached, or did not answer, within the retry budget. */
public class UnavailableException extends LockdException {
    private static final long serialVersionUID = 1L;

    public UnavailableException(String message) {
        super(message);
    }

    public UnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
