package dev.lockd.client;

/** An endpoint is not a usable URL, or a setting does not go with it (a bearer token over plaintext to another host, TLS files with http://, mixed schemes). */
public class EndpointException extends InvalidArgumentException {
    private static final long serialVersionUID = 1L;

    public EndpointException(String message) {
        super(message);
    }

    public EndpointException(String message, Throwable cause) {
        super(message, cause);
    }
}
