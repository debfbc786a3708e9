package dev.lockd.client;

import io.grpc.Status;

/** lockd refused the call for another reason: {@link #status()} is the gRPC status code, {@link #code()} lockd's stable error code. */
public class RejectedException extends LockdException {
    private static final long serialVersionUID = 1L;

    private final Status.Code status;
    private final String code;

    public RejectedException(String message, Status.Code status, String code) {
        super(message);
        this.status = status;
        this.code = code;
    }

    public Status.Code status() {
        return status;
    }

    /** lockd's stable error code (the {@code lockd-error} metadata), null if none. */
    public String code() {
        return code;
    }
}
