package dev.lockd.client;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.Objects;
import java.util.zip.GZIPInputStream;
import okhttp3.HttpUrl;
import okhttp3.Interceptor;
import okhttp3.Request;
import okhttp3.Response;

/**
 * OkHttp's interceptor for fence-proxy (OkHttp is an optional dependency: bring your own),
 * installed as a <b>network</b> interceptor: {@code
 * client.newBuilder().addNetworkInterceptor(new FencingInterceptor(lock)).build()}. It adds {@code
 * Fencing-Resource} and {@code Fencing-Token} to each request sent to the origin (scheme, host,
 * port) of the call's own request, and to no other: a redirect to another origin does not carry
 * the token (a write capability). It throws {@link StaleTokenException} for fence-proxy's 409
 * stale-token answer, {@link FenceRefusedException} for its other refusals of the token (403
 * forged or unsigned), closing the response. Thrown from {@code Call.execute()}; with {@code
 * enqueue}, OkHttp hands it to the callback's thread.
 *
 * <p>Added with {@code addInterceptor} (an application interceptor) it throws {@link
 * IllegalStateException} and sends nothing: OkHttp follows redirects below the application
 * interceptors and would carry the headers to wherever a redirect points.
 */
public final class FencingInterceptor implements Interceptor {
    private static final long PROBLEM_MAX = 64 * 1024;

    private final Fenceable lock;

    public FencingInterceptor(Fenceable lock) {
        this.lock = Objects.requireNonNull(lock, "lock");
    }

    static boolean sameOrigin(HttpUrl a, HttpUrl b) {
        return a.scheme().equals(b.scheme()) && a.host().equalsIgnoreCase(b.host()) && a.port() == b.port();
    }

    @Override
    public Response intercept(Chain chain) throws IOException {
        if (chain.connection() == null) {
            throw new IllegalStateException("FencingInterceptor is a network interceptor: add it with "
                    + "OkHttpClient.Builder.addNetworkInterceptor (as an application interceptor, OkHttp would "
                    + "carry the fencing token across redirects to other origins)");
        }
        Request request = chain.request();
        boolean fenced = sameOrigin(request.url(), chain.call().request().url());
        Request.Builder b = request.newBuilder();
        if (fenced) {
            b.header(Fencing.RESOURCE_HEADER, lock.resource()).header(Fencing.TOKEN_HEADER, lock.fenceToken());
        } else {
            b.removeHeader(Fencing.RESOURCE_HEADER).removeHeader(Fencing.TOKEN_HEADER);
        }
        Response response = chain.proceed(b.build());
        String type = response.header("Content-Type", "");
        if (fenced && type != null && type.contains("problem+json")) {
            byte[] body = response.peekBody(PROBLEM_MAX).bytes();
            if ("gzip".equalsIgnoreCase(response.header("Content-Encoding", ""))) {
                body = gunzip(body); // a network interceptor sees the body as sent
            }
            try {
                Fencing.checkResponse(response.code(), type, body);
            } catch (FenceRefusedException e) {
                response.close();
                throw e;
            }
        }
        return response;
    }

    private static byte[] gunzip(byte[] body) {
        try (InputStream in = new GZIPInputStream(new ByteArrayInputStream(body))) {
            return in.readNBytes((int) PROBLEM_MAX);
        } catch (IOException e) {
            return new byte[0]; // unreadable: a 409 is still taken as stale
        }
    }
}
