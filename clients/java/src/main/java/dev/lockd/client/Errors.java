package dev.lockd.client;

import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.net.ConnectException;
import java.util.EnumSet;
import java.util.Locale;
import java.util.Set;
import javax.net.ssl.SSLException;

/** gRPC statuses to the SDK's typed exceptions. */
final class Errors {
    /** Metadata key of lockd's stable error code (docs/api.md). */
    static final Metadata.Key<String> ERROR_CODE = Metadata.Key.of("lockd-error", Metadata.ASCII_STRING_MARSHALLER);

    /** Status codes after which the same request may be sent again. */
    static final Set<Status.Code> TRANSIENT = EnumSet.of(Status.Code.UNAVAILABLE, Status.Code.DEADLINE_EXCEEDED,
            Status.Code.UNKNOWN, Status.Code.ABORTED, Status.Code.INTERNAL);

    private Errors() {
    }

    static StatusRuntimeException rpc(Throwable t) {
        while (t != null) {
            if (t instanceof StatusRuntimeException s) {
                return s;
            }
            if (t instanceof io.grpc.StatusException s) {
                return new StatusRuntimeException(s.getStatus(), s.getTrailers());
            }
            t = t.getCause();
        }
        return null;
    }

    static String codeOf(StatusRuntimeException e) {
        Metadata trailers = e.getTrailers();
        return trailers == null ? null : trailers.get(ERROR_CODE);
    }

    static boolean isTls(StatusRuntimeException e) {
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
            return false;
        }
        for (Throwable t = e.getStatus().getCause(); t != null; t = t.getCause()) {
            if (t instanceof SSLException) {
                return true;
            }
        }
        String d = String.valueOf(e.getStatus().getDescription()).toLowerCase(Locale.ROOT);
        return d.contains("ssl") || d.contains("handshake") || d.contains("certificate");
    }

    static boolean isTransient(StatusRuntimeException e) {
        return TRANSIENT.contains(e.getStatus().getCode()) && !isTls(e);
    }

    /** The call failed before it was sent: no connection to the endpoint could be made. */
    static boolean neverSent(StatusRuntimeException e) {
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE) {
            return false;
        }
        for (Throwable t = e.getStatus().getCause(); t != null; t = t.getCause()) {
            if (t instanceof ConnectException) {
                return true;
            }
        }
        String d = String.valueOf(e.getStatus().getDescription()).toLowerCase(Locale.ROOT);
        return d.contains("connection refused") || d.contains("failed to connect");
    }

    static LockdException of(StatusRuntimeException e) {
        Status.Code status = e.getStatus().getCode();
        String details = e.getStatus().getDescription() == null ? status.name() : e.getStatus().getDescription();
        String code = codeOf(e);
        LockdException out;
        if (isTls(e)) {
            out = new TlsException("TLS with lockd failed: " + details, e);
        } else if (status == Status.Code.INVALID_ARGUMENT) {
            out = new InvalidArgumentException(details, e);
        } else if (status == Status.Code.FAILED_PRECONDITION && (code == null || code.equals("lease_not_current"))) {
            out = new LeaseNotCurrentException(details, e);
        } else if (status == Status.Code.UNAUTHENTICATED) {
            out = new UnauthenticatedException(details, e);
        } else if (status == Status.Code.PERMISSION_DENIED) {
            out = new PermissionDeniedException(details, e);
        } else if (status == Status.Code.RESOURCE_EXHAUSTED) {
            out = new QuotaExceededException(details, code);
            out.initCause(e);
        } else if (TRANSIENT.contains(status) || status == Status.Code.CANCELLED) {
            out = new UnavailableException("lockd is unreachable (" + status + "): " + details, e);
        } else {
            out = new RejectedException("lockd refused the call (" + status + (code != null ? ", " + code : "")
                    + "): " + details, status, code);
            out.initCause(e);
        }
        return out;
    }
}
