package dev.lockd.client;

import java.io.IOException;
import java.util.Objects;
import okhttp3.Interceptor;
import okhttp3.Request;
import okhttp3.Response;

/**
 * OkHttp's interceptor for fence-proxy (OkHttp is an optional dependency: bring your own):
 * {@code client.newBuilder().addInterceptor(new FencingInterceptor(lock)).build()}. Adds {@code
 * Fencing-Resource} and {@code Fencing-Token} to every request, and throws {@link
 * StaleTokenException} for fence-proxy's 409 stale-token answer, {@link FenceRefusedException} for
 * its other refusals of the token (403 forged or unsigned), closing the response. Thrown from
 * {@code Call.execute()}; with {@code enqueue}, OkHttp hands it to the callback's thread.
 */
public final class FencingInterceptor implements Interceptor {
    private static final long PROBLEM_MAX = 64 * 1024;

    private final Fenceable lock;

    public FencingInterceptor(Fenceable lock) {
        this.lock = Objects.requireNonNull(lock, "lock");
    }

    @Override
    public Response intercept(Chain chain) throws IOException {
        Request request = chain.request().newBuilder()
                .header(Fencing.RESOURCE_HEADER, lock.resource())
                .header(Fencing.TOKEN_HEADER, lock.fenceToken())
                .build();
        Response response = chain.proceed(request);
        String type = response.header("Content-Type", "");
        if (type != null && type.contains("problem+json")) {
            byte[] body = response.peekBody(PROBLEM_MAX).bytes();
            try {
                Fencing.checkResponse(response.code(), type, body);
            } catch (FenceRefusedException e) {
                response.close();
                throw e;
            }
        }
        return response;
    }
}
