package dev.lockd.client;

/** A limit of lockd or of the caller's tenant (RESOURCE_EXHAUSTED); {@link #code()} says which. */
public class QuotaExceededException extends LockdException {
    private static final long serialVersionUID = 1L;

    private final String code;

    public QuotaExceededException(String message, String code) {
        super(message);
        this.code = code;
    }

    /** lockd's stable error code (the {@code lockd-error} metadata), e.g. {@code queue_full}; null if none. */
    public String code() {
        return code;
    }
}
