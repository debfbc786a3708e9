package dev.lockd.client;

/** The TLS connection to lockd failed (a certificate refused on either side, bad TLS files). Not retried: nothing will change by itself. */
public class TlsException extends LockdException {
    private static final long serialVersionUID = 1L;

    public TlsException(String message) {
        super(message);
    }

    public TlsException(String message, Throwable cause) {
        super(message, cause);
    }
}
