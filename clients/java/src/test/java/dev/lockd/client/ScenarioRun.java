package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import okhttp3.MediaType;
import okhttp3.OkHttpClient;
import okhttp3.RequestBody;

/** One run of a scenario of clients/conformance/scenarios.json (README.md there defines the steps). */
final class ScenarioRun {
    static final String UPSERT = "INSERT INTO conformance VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v";

    private final Testbed bed;
    private final JsonNode servers;
    private final JsonNode scenario;
    private final String runId;
    private final Map<String, LockdClient> clients = new HashMap<>();
    private final Map<String, Object> leases = new HashMap<>(); // Lock or LockSet
    private final Map<String, CompletableFuture<Lock>> pending = new HashMap<>();
    private final Map<String, Long> pausedAt = new HashMap<>();

    ScenarioRun(Testbed bed, JsonNode scenario) {
        this.bed = bed;
        this.servers = bed.servers;
        this.scenario = scenario;
        byte[] b = new byte[4];
        new SecureRandom().nextBytes(b);
        this.runId = HexFormat.of().formatHex(b);
    }

    String s(String v) {
        return v.replace("{run}", runId);
    }

    List<String> list(JsonNode n) {
        List<String> out = new ArrayList<>();
        n.forEach(x -> out.add(s(x.asText())));
        return out;
    }

    static String outcomeOf(Throwable e) {
        if (e instanceof CompletionException || e instanceof ExecutionException) {
            e = e.getCause();
        }
        if (e instanceof CancellationException || e instanceof CancelledException) {
            return "cancelled";
        }
        if (e instanceof BusyException) {
            return "busy";
        }
        if (e instanceof WaitTimedOutException) {
            return "timeout";
        }
        if (e instanceof UnauthenticatedException) {
            return "unauthenticated";
        }
        if (e instanceof PermissionDeniedException) {
            return "permission_denied";
        }
        if (e instanceof InvalidArgumentException) {
            return "invalid";
        }
        if (e instanceof UnavailableException) {
            return "unavailable";
        }
        throw new AssertionError("an unexpected error: " + e, e);
    }

    void run() throws Exception {
        try {
            int i = 0;
            for (JsonNode step : scenario.get("steps")) {
                try {
                    step(step);
                } catch (AssertionError e) {
                    throw new AssertionError(scenario.get("name").asText() + ", step " + i + " " + step + ": "
                            + e.getMessage(), e);
                }
                i++;
            }
        } finally {
            for (String server : pausedAt.keySet()) {
                bed.command("resume " + server); // a failed step must not leave a server stopped
            }
            for (CompletableFuture<Lock> f : pending.values()) {
                f.cancel(true);
            }
            for (Object l : leases.values()) {
                try {
                    release(l);
                } catch (LockdException ignored) {
                    // best effort
                }
            }
            clients.values().forEach(LockdClient::close);
        }
    }

    private static boolean release(Object lease) {
        return lease instanceof LockSet set ? set.release() : ((Lock) lease).release();
    }

    private void client(JsonNode step) {
        List<String> names = new ArrayList<>();
        if (step.has("servers")) {
            step.get("servers").forEach(n -> names.add(n.asText()));
        } else {
            names.add(step.get("server").asText());
        }
        List<String> endpoints = new ArrayList<>();
        for (String n : names) {
            endpoints.add(servers.get(n).get("endpoint").asText());
        }
        LockdClient.Builder b = LockdClient.builder().endpoints(endpoints);
        if (names.get(0).equals("secure")) {
            JsonNode secure = servers.get("secure");
            b.caFile(Path.of(secure.get("ca").asText()));
            JsonNode tenant = step.has("tenant") ? secure.get("tenants").get(step.get("tenant").asText()) : null;
            if (tenant != null && tenant.has("token_file")) {
                b.bearerTokenFile(Path.of(tenant.get("token_file").asText()));
            }
            if (tenant != null && tenant.has("cert")) {
                b.clientCert(Path.of(tenant.get("cert").asText()), Path.of(tenant.get("key").asText()));
            }
        }
        clients.put(step.get("name").asText(), b.build());
    }

    private AcquireOptions options(JsonNode step) {
        AcquireOptions.Builder o = AcquireOptions.builder();
        if (step.has("ttl_ms")) {
            o.ttl(Duration.ofMillis(step.get("ttl_ms").asLong()));
        }
        o.wait(Duration.ofMillis(step.path("wait_ms").asLong(0)));
        if (step.has("request_id")) {
            o.requestId(s(step.get("request_id").asText()));
        }
        if (step.has("owner")) {
            o.owner(s(step.get("owner").asText()));
        }
        if (step.has("permits")) {
            o.permits(step.get("permits").asInt());
        }
        if (step.has("mode")) {
            o.mode(step.get("mode").asText().equals("read") ? Mode.READ : Mode.WRITE);
        }
        return o.build();
    }

    private Lock lock(String name) {
        Object l = leases.get(name);
        assertTrue(l instanceof Lock, name + " is not a held lock: " + l);
        return (Lock) l;
    }

    private void checkGrant(JsonNode step, String name, Object result, Throwable error) {
        String expect = step.get("expect").asText();
        String got = error == null ? "granted" : outcomeOf(error);
        assertEquals(expect, got, name + ": " + (error != null ? error : result));
        if (error != null) {
            return;
        }
        leases.put(name, result);
        if (step.has("resources_held")) {
            List<String> held = new ArrayList<>();
            ((LockSet) result).forEach(l -> held.add(l.resource()));
            assertEquals(list(step.get("resources_held")), held, name + ": the leases' resources");
        }
        if (!(result instanceof Lock lock)) {
            return;
        }
        if (step.has("token_above")) {
            Lock other = lock(step.get("token_above").asText());
            assertTrue(lock.token() > other.token(), name + ": token " + lock.token() + " not above " + other.token());
        }
        if (step.has("same_token_as")) {
            assertEquals(lock(step.get("same_token_as").asText()).token(), lock.token(), name + ": token");
        }
        if (step.has("holds")) {
            assertEquals(step.get("holds").asInt(), lock.holds(), name + ": holds");
        }
        if (step.has("resource_starts")) {
            String prefix = s(step.get("resource_starts").asText());
            assertTrue(lock.resource().startsWith(prefix), name + ": resource " + lock.resource());
        }
        if (step.path("signed").asBoolean(false)) {
            assertTrue(lock.signedToken().isPresent(), name + ": no signed token from a lockd that signs");
            assertEquals(lock.signedToken().get(), lock.fenceToken(), name + ": the fence token is not the signed one");
            assertTrue(lock.fenceToken().startsWith(lock.token() + "."), name + ": " + lock.fenceToken());
        }
    }

    private void step(JsonNode step) throws Exception {
        String op = step.get("op").asText();
        switch (op) {
            case "client" -> client(step);
            case "acquire" -> {
                LockdClient c = clients.get(step.get("client").asText());
                Lock lock = null;
                Throwable error = null;
                try {
                    lock = c.acquire(s(step.get("resource").asText()), options(step));
                } catch (LockdException e) {
                    error = e;
                }
                checkGrant(step, step.get("as").asText(), lock, error);
            }
            case "start_acquire" -> {
                LockdClient c = clients.get(step.get("client").asText());
                pending.put(step.get("as").asText(), c.acquireAsync(s(step.get("resource").asText()), options(step)));
            }
            case "await" -> {
                String name = step.get("of").asText();
                CompletableFuture<Lock> f = pending.get(name);
                Lock lock = null;
                Throwable error = null;
                try {
                    lock = f.get(120, TimeUnit.SECONDS);
                } catch (TimeoutException e) {
                    fail(name + " did not finish");
                } catch (CancellationException | ExecutionException e) {
                    error = e;
                }
                checkGrant(step, name, lock, error);
            }
            case "cancel" -> pending.get(step.get("of").asText()).cancel(true);
            case "cut_renewals" -> bed.command(step.get("on").asBoolean() ? "cut-renewals on" : "cut-renewals off");
            case "hold_next_call" -> bed.command("hold-next-call " + step.path("after").asInt(0));
            case "wait_held", "wait_held_answered" -> bed.command(op.replace('_', '-'));
            case "wait_cuts" -> bed.command("wait-cuts " + step.get("at_least").asInt());
            case "wait_free" -> {
                LockdClient c = clients.get(step.get("client").asText());
                String resource = s(step.get("resource").asText());
                Testbed.poll(resource + " stayed held", 10, () -> {
                    Description d = c.describe(resource);
                    return !d.held() && d.permitsHeld() <= 0 && d.readers() <= 0;
                });
            }
            case "wait_waiters" -> {
                LockdClient c = clients.get(step.get("client").asText());
                String resource = s(step.get("resource").asText());
                int want = step.get("waiters").asInt();
                Testbed.poll(resource + ": never " + want + " waiters", 60, () -> c.describe(resource).waiters() == want);
            }
            case "release" -> {
                String name = step.get("lease").asText();
                assertEquals(step.get("expect").asBoolean(), release(leases.get(name)), "release of " + name);
            }
            case "end_behind" -> {
                Lock lock = lock(step.get("lease").asText());
                assertTrue(lock.client().release(lock.resource(), lock.leaseId()), "end_behind: not current");
            }
            case "release_by_id" -> {
                Lock lock = lock(step.get("lease").asText());
                boolean got = clients.get(step.get("client").asText()).release(lock.resource(), lock.leaseId());
                assertEquals(step.get("expect").asBoolean(), got, "release_by_id of " + step.get("lease").asText());
            }
            case "describe" -> {
                Description d = clients.get(step.get("client").asText()).describe(s(step.get("resource").asText()));
                if (step.has("held")) {
                    assertEquals(step.get("held").asBoolean(), d.held(), d.toString());
                }
                if (step.has("held_by")) {
                    assertTrue(d.held() && d.token() == lock(step.get("held_by").asText()).token(), d.toString());
                }
                if (step.has("waiters")) {
                    assertEquals(step.get("waiters").asInt(), d.waiters(), d.toString());
                }
            }
            case "pause" -> {
                pausedAt.put(step.get("server").asText(), System.nanoTime());
                bed.command("pause " + step.get("server").asText());
            }
            case "resume" -> bed.command("resume " + step.get("server").asText());
            case "drop_next_answer" -> bed.command("drop-next-answer " + step.path("after").asInt(0));
            case "await_lost" -> {
                Lock lock = lock(step.get("lease").asText());
                LostReason reason;
                try {
                    reason = lock.onLost().get(60, TimeUnit.SECONDS);
                } catch (TimeoutException e) {
                    throw new AssertionError(step.get("lease").asText() + ": no loss signalled");
                }
                long lostAt = System.nanoTime();
                if (step.path("within_ttl_of_pause").asBoolean(false)) {
                    long paused = pausedAt.values().stream().mapToLong(Long::longValue).max().orElseThrow();
                    long ttl = lock.ttl().toNanos();
                    assertTrue(lostAt - paused < ttl, "the loss came " + (lostAt - paused) / 1_000_000
                            + " ms after the pause, not within the TTL " + ttl / 1_000_000 + " ms");
                    assertEquals(LostReason.DEADLINE_PASSED, reason);
                }
                if (step.path("reason").asText("").equals("not_current")) {
                    assertEquals(LostReason.NOT_CURRENT, reason);
                }
                assertTrue(lock.isLost());
                assertEquals(reason, lock.lostReason());
            }
            case "acquire_all", "acquire_ordered" -> {
                LockdClient c = clients.get(step.get("client").asText());
                AcquireOptions.Builder b = AcquireOptions.builder()
                        .ttl(Duration.ofMillis(step.path("ttl_ms").asLong(30000)))
                        .wait(Duration.ofMillis(step.path("wait_ms").asLong(0)));
                if (step.has("request_id")) {
                    b.requestId(s(step.get("request_id").asText()));
                }
                AcquireOptions o = b.build();
                List<String> resources = list(step.get("resources"));
                LockSet set = null;
                Throwable error = null;
                try {
                    set = op.equals("acquire_all") ? c.acquireAll(resources, o) : c.acquireOrdered(resources, o);
                } catch (LockdException e) {
                    error = e;
                }
                checkGrant(step, step.get("as").asText(), set, error);
            }
            case "pg_write" -> pgWrite(step);
            case "pg_read" -> {
                try (Connection conn = pg();
                        PreparedStatement st = conn.prepareStatement("SELECT v FROM conformance WHERE k = ?")) {
                    st.setString(1, s(step.get("key").asText()));
                    try (ResultSet rs = st.executeQuery()) {
                        assertTrue(rs.next(), "no row");
                        assertEquals(s(step.get("value").asText()), rs.getString(1));
                    }
                }
            }
            case "http_write" -> httpWrite(step);
            case "pg_pool_check" -> PoolChecks.check(jdbcUrl(), lock(step.get("lease").asText()), s(step.get("key").asText()));
            default -> fail("unknown step " + op);
        }
    }

    String jdbcUrl() {
        JsonNode pg = servers.get("pg");
        return "jdbc:postgresql://" + pg.get("host").asText() + ":" + pg.get("port").asInt() + "/"
                + pg.get("database").asText() + "?user=" + pg.get("user").asText() + "&sslmode=disable";
    }

    private Connection pg() throws Exception {
        return DriverManager.getConnection(jdbcUrl());
    }

    private void pgWrite(JsonNode step) throws Exception {
        Lock lock = lock(step.get("lease").asText());
        String got;
        try (Connection conn = pg()) {
            Fencing.run(conn, lock, c -> {
                try (PreparedStatement st = c.prepareStatement(UPSERT)) {
                    st.setString(1, s(step.get("key").asText()));
                    st.setString(2, s(step.get("value").asText()));
                    st.executeUpdate();
                }
            });
            got = "ok";
        } catch (StaleTokenException e) {
            got = "stale";
        }
        assertEquals(step.get("expect").asText(), got, "pg_write with " + step.get("lease").asText());
    }

    private void httpWrite(JsonNode step) throws Exception {
        Lock lock = lock(step.get("lease").asText());
        String url = servers.get("http").get("url").asText() + s(step.get("path").asText());
        String expect = step.get("expect").asText();

        // java.net.http
        String got;
        try {
            HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(30)).build();
            HttpRequest req = Fencing.request(HttpRequest.newBuilder(URI.create(url)), lock)
                    .timeout(Duration.ofSeconds(30))
                    .PUT(HttpRequest.BodyPublishers.ofString("{}"))
                    .build();
            HttpResponse<String> r = Fencing.check(http.send(req, HttpResponse.BodyHandlers.ofString()));
            assertEquals(200, r.statusCode(), r.body());
            got = "ok";
        } catch (StaleTokenException e) {
            got = "stale";
        }
        assertEquals(expect, got, "http_write (java.net.http) with " + step.get("lease").asText());

        // OkHttp
        OkHttpClient ok = new OkHttpClient.Builder().addNetworkInterceptor(new FencingInterceptor(lock))
                .callTimeout(Duration.ofSeconds(30)).build();
        okhttp3.Request req = new okhttp3.Request.Builder().url(url)
                .put(RequestBody.create("{}", MediaType.get("application/json"))).build();
        try (okhttp3.Response r = ok.newCall(req).execute()) {
            assertEquals(200, r.code());
            got = "ok";
        } catch (StaleTokenException e) {
            got = "stale";
        } finally {
            ok.dispatcher().executorService().shutdown();
            ok.connectionPool().evictAll();
        }
        assertEquals(expect, got, "http_write (OkHttp) with " + step.get("lease").asText());
    }
}
