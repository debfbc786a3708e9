package dev.lockd.client;

/**
 * The write's token is older than one already accepted for its resource (SQLSTATE FN001; FN003
 * when PostgreSQL ended the session's transaction for a newer token; HTTP 409): a newer holder
 * exists, so stop working under this lock.
 */
public class StaleTokenException extends FenceRefusedException {
    private static final long serialVersionUID = 1L;

    public StaleTokenException(String message, String code, int status, String resource, String token,
            Long highest, Throwable cause) {
        super(message, code, status, resource, token, highest, cause);
    }
}
