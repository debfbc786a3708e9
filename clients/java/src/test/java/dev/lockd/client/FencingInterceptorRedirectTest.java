package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import okhttp3.OkHttpClient;
import okhttp3.Request;
import okhttp3.Response;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The fencing headers go only to the origin of the call's own request, never along a redirect elsewhere. */
class FencingInterceptorRedirectTest {
    private HttpServer origin;
    private HttpServer elsewhere;
    /** "server path" -> the Fencing-Token it received ("" when none). */
    private final Map<String, String> seen = new ConcurrentHashMap<>();

    private static final Fenceable LOCK = new Fenceable() {
        @Override
        public String resource() {
            return "orders/1";
        }

        @Override
        public String fenceToken() {
            return "7.k1.0123";
        }
    };

    private static void answer(HttpExchange ex, int status, String location) throws IOException {
        if (location != null) {
            ex.getResponseHeaders().set("Location", location);
        }
        byte[] body = "ok".getBytes(StandardCharsets.UTF_8);
        ex.sendResponseHeaders(status, body.length);
        ex.getResponseBody().write(body);
        ex.close();
    }

    private void record(String server, HttpExchange ex) {
        String token = ex.getRequestHeaders().getFirst(Fencing.TOKEN_HEADER);
        String resource = ex.getRequestHeaders().getFirst(Fencing.RESOURCE_HEADER);
        seen.put(server + " " + ex.getRequestURI().getPath(),
                (token == null ? "" : token) + (resource == null ? "" : "|" + resource));
    }

    @BeforeEach
    void start() throws IOException {
        elsewhere = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        elsewhere.createContext("/", ex -> {
            record("elsewhere", ex);
            answer(ex, 200, null);
        });
        elsewhere.start();
        String other = "http://127.0.0.1:" + elsewhere.getAddress().getPort();
        origin = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        origin.createContext("/", ex -> {
            record("origin", ex);
            switch (ex.getRequestURI().getPath()) {
                case "/cross" -> answer(ex, 307, other + "/stolen");
                case "/same" -> answer(ex, 307, "/target");
                default -> answer(ex, 200, null);
            }
        });
        origin.start();
    }

    @AfterEach
    void stop() {
        origin.stop(0);
        elsewhere.stop(0);
    }

    private String url(String path) {
        return "http://127.0.0.1:" + origin.getAddress().getPort() + path;
    }

    private static OkHttpClient network() {
        return new OkHttpClient.Builder().addNetworkInterceptor(new FencingInterceptor(LOCK)).build();
    }

    @Test
    void aRedirectToAnotherOriginDoesNotCarryTheToken() throws IOException {
        OkHttpClient ok = network();
        try (Response r = ok.newCall(new Request.Builder().url(url("/cross")).build()).execute()) {
            assertEquals(200, r.code());
        }
        assertEquals("7.k1.0123|orders/1", seen.get("origin /cross"), "the origin gets the headers");
        assertEquals("", seen.get("elsewhere /stolen"), "the other origin got the fencing headers");
    }

    @Test
    void aRedirectWithinTheOriginKeepsTheToken() throws IOException {
        OkHttpClient ok = network();
        try (Response r = ok.newCall(new Request.Builder().url(url("/same")).build()).execute()) {
            assertEquals(200, r.code());
        }
        assertEquals("7.k1.0123|orders/1", seen.get("origin /same"));
        assertEquals("7.k1.0123|orders/1", seen.get("origin /target"));
    }

    @Test
    void asAnApplicationInterceptorItRefusesAndSendsNothing() {
        OkHttpClient ok = new OkHttpClient.Builder().addInterceptor(new FencingInterceptor(LOCK)).build();
        IllegalStateException e = assertThrows(IllegalStateException.class,
                () -> ok.newCall(new Request.Builder().url(url("/cross")).build()).execute().close());
        assertTrue(e.getMessage().contains("addNetworkInterceptor"), e.getMessage());
        assertNull(seen.get("elsewhere /stolen"), "the other origin was called");
    }
}
