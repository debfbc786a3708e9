package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Settings are checked before any call, with typed errors. */
class SettingsTest {
    @TempDir
    Path dir;

    private Path file(String name, String text) throws Exception {
        Path p = dir.resolve(name);
        Files.writeString(p, text);
        return p;
    }

    @Test
    void plaintextAndSeveralEndpointsAreAccepted() {
        try (LockdClient c = LockdClient.builder().endpoints("http://a.example:7420", "http://127.0.0.1:7420").build()) {
            assertEquals(2, c.settings.endpoints.size());
            assertEquals("a.example:7420", c.settings.endpoints.get(0).target());
            assertFalse(c.settings.tls);
        }
        try (LockdClient c = LockdClient.builder().endpoints("http://[::1]:7420").build()) {
            assertEquals("[::1]:7420", c.settings.endpoints.get(0).target());
            assertTrue(c.settings.endpoints.get(0).loopback());
        }
        try (LockdClient c = LockdClient.builder().endpoints("https://lockd.example").build()) {
            assertEquals(443, c.settings.endpoints.get(0).port());
            assertTrue(c.settings.tls);
        }
    }

    @Test
    void badUrlsAreRefused() {
        for (String url : new String[] {"", "lockd:7420", "ftp://a:1", "http://", "http://a:7420/path",
                "http://a:7420?x=1", "http://user@a:7420", "http://a:notaport", "127.0.0.1:7420"}) {
            assertThrows(EndpointException.class, () -> LockdClient.builder().endpoints(url).build(), url);
        }
        assertThrows(EndpointException.class, () -> LockdClient.builder().endpoints(new String[0]).build()
                .close(), "no endpoint");
    }

    @Test
    void mixedSchemesAreRefused() {
        EndpointException e = assertThrows(EndpointException.class,
                () -> LockdClient.builder().endpoints("http://a:1", "https://b:2").build());
        assertTrue(e.getMessage().contains("mix"), e.getMessage());
    }

    @Test
    void aBearerTokenIsNotSentOverPlaintextToAnotherHost() throws Exception {
        Path token = file("token", "s3cret\n");
        assertThrows(EndpointException.class,
                () -> LockdClient.builder().endpoints("http://lockd.example:7420").bearerTokenFile(token).build());
        assertThrows(EndpointException.class,
                () -> LockdClient.builder().endpoints("http://127.0.0.1:1", "http://10.0.0.1:1").bearerToken("x").build());
        // loopback over plaintext, or TLS anywhere: accepted
        LockdClient.builder().endpoints("http://127.0.0.1:7420", "http://localhost:7421").bearerTokenFile(token)
                .build().close();
        LockdClient.builder().endpoints("https://lockd.example:7420").bearerToken("s3cret").build().close();
    }

    @Test
    void badTokensAreRefused() throws Exception {
        assertThrows(InvalidArgumentException.class,
                () -> LockdClient.builder().endpoints("http://127.0.0.1:1").bearerToken("two words").build());
        assertThrows(InvalidArgumentException.class,
                () -> LockdClient.builder().endpoints("http://127.0.0.1:1").bearerToken("  ").build());
        assertThrows(InvalidArgumentException.class, () -> LockdClient.builder().endpoints("http://127.0.0.1:1")
                .bearerToken("a").bearerTokenFile(file("t", "b")).build());
        assertThrows(InvalidArgumentException.class, () -> LockdClient.builder().endpoints("http://127.0.0.1:1")
                .bearerTokenFile(dir.resolve("missing")).build());
    }

    @Test
    void tlsFilesNeedHttps() throws Exception {
        Path ca = file("ca.pem", "x");
        EndpointException e = assertThrows(EndpointException.class,
                () -> LockdClient.builder().endpoints("http://a:1").caFile(ca).build());
        assertTrue(e.getMessage().contains("https://"), e.getMessage());
        assertThrows(EndpointException.class,
                () -> LockdClient.builder().endpoints("http://a:1").clientCert(ca, ca).build());
    }

    @Test
    void aCertificateNeedsItsKey() throws Exception {
        Path cert = file("cert.pem", "x");
        assertThrows(InvalidArgumentException.class,
                () -> LockdClient.builder().endpoints("https://a:1").clientCert(cert, null).build());
        assertThrows(InvalidArgumentException.class,
                () -> LockdClient.builder().endpoints("https://a:1").clientCert(null, cert).build());
    }

    @Test
    void unreadableOrBadTlsFilesAreRefused() throws Exception {
        assertThrows(InvalidArgumentException.class,
                () -> LockdClient.builder().endpoints("https://a:1").caFile(dir.resolve("missing.pem")).build());
        Path junk = file("junk.pem", "not a certificate");
        assertThrows(InvalidArgumentException.class,
                () -> LockdClient.builder().endpoints("https://a:1").caFile(junk).build());
    }

    @Test
    void acquireOptionsAreChecked() {
        try (LockdClient c = LockdClient.builder().endpoints("http://127.0.0.1:1").build()) {
            assertThrows(InvalidArgumentException.class, () -> c.acquire("has space"));
            assertThrows(InvalidArgumentException.class, () -> c.acquire(""));
            assertThrows(InvalidArgumentException.class, () -> c.acquire("x".repeat(257)));
            assertThrows(InvalidArgumentException.class,
                    () -> c.acquire("r", AcquireOptions.builder().ttl(Duration.ZERO).build()));
            assertThrows(InvalidArgumentException.class,
                    () -> c.acquire("r", AcquireOptions.builder().wait(Duration.ofSeconds(-1)).build()));
            assertThrows(InvalidArgumentException.class,
                    () -> c.acquire("r", AcquireOptions.builder().permits(1001).build()));
            assertThrows(InvalidArgumentException.class,
                    () -> c.acquire("r", AcquireOptions.builder().owner("o").permits(2).build()));
            assertThrows(InvalidArgumentException.class,
                    () -> c.acquire("r", AcquireOptions.builder().owner("o").mode(Mode.READ).build()));
            assertThrows(InvalidArgumentException.class,
                    () -> c.acquire("r", AcquireOptions.builder().permits(2).mode(Mode.WRITE).build()));
            assertThrows(InvalidArgumentException.class,
                    () -> c.acquireAll(AcquireOptions.DEFAULT, "a", "a"));
            assertThrows(InvalidArgumentException.class, () -> c.acquireOrdered(AcquireOptions.DEFAULT));
        }
    }

    @Test
    void requestIdsAreFreshAndUrlSafe() {
        String a = LockdClient.newRequestId();
        assertTrue(a.matches("[A-Za-z0-9_-]{22}"), a);
        assertFalse(a.equals(LockdClient.newRequestId()));
    }

    @Test
    void theSafetyMarginIsATenthOfTheTtlAtLeast10ms() {
        assertEquals(Duration.ofSeconds(3).toNanos(), Lock.safetyMargin(Duration.ofSeconds(30).toNanos()));
        assertEquals(Duration.ofMillis(10).toNanos(), Lock.safetyMargin(Duration.ofMillis(50).toNanos()));
    }
}
