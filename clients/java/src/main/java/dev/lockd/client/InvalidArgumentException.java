package dev.lockd.client;

/** The request or a setting is invalid as written (checked here, or refused by lockd). */
public class InvalidArgumentException extends LockdException {
    private static final long serialVersionUID = 1L;

    public InvalidArgumentException(String message) {
        super(message);
    }

    public InvalidArgumentException(String message, Throwable cause) {
        super(message, cause);
    }
}
