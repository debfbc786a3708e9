package dev.lockd.client;

/**
 * fence-proxy (or PostgreSQL's fence check) refused a write. {@link #code()} is the SQLSTATE
 * ({@code FN00x}) or the HTTP problem type's last part (e.g. {@code forged-token}); {@link
 * #status()} the HTTP status (0 for PostgreSQL).
 */
public class FenceRefusedException extends LockdException {
    private static final long serialVersionUID = 1L;

    private final String code;
    private final int status;
    private final String resource;
    private final String token;
    private final Long highest;

    public FenceRefusedException(String message, String code, int status, String resource, String token,
            Long highest, Throwable cause) {
        super(message, cause);
        this.code = code;
        this.status = status;
        this.resource = resource;
        this.token = token;
        this.highest = highest;
    }

    public String code() {
        return code;
    }

    public int status() {
        return status;
    }

    /** The resource fence-proxy named, when it did. */
    public String resource() {
        return resource;
    }

    /** The token fence-proxy named, when it did. */
    public String token() {
        return token;
    }

    /** The highest token accepted for the resource, when fence-proxy said (HTTP 409). */
    public Long highest() {
        return highest;
    }
}
