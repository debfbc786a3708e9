package dev.lockd.client;

/** The caller cancelled the wait (the thread was interrupted, or the future of {@link LockdClient#acquireAsync} was cancelled); nothing is held. When thrown for an interrupt, the thread's interrupt flag is set again. */
public class CancelledException extends LockdException {
    private static final long serialVersionUID = 1L;

    public CancelledException(String message) {
        super(message);
    }

    public CancelledException(String message, Throwable cause) {
        super(message, cause);
    }
}
