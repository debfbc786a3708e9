package dev.lockd.client;

/** lockd has a policy and the call carried no identity it knows (no bearer token, no client certificate it trusts). */
public class UnauthenticatedException extends PermissionDeniedException {
    private static final long serialVersionUID = 1L;

    public UnauthenticatedException(String message) {
        super(message);
    }

    public UnauthenticatedException(String message, Throwable cause) {
        super(message, cause);
    }
}
