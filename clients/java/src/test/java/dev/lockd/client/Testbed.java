package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/**
 * The servers of the conformance suite: clients/testbed (throwaway lockd instances, PostgreSQL
 * and an HTTP service behind fence-proxy). The binary is the system property or environment
 * variable LOCKD_TESTBED, else ../../target/debug/testbed; missing, the tests fail.
 */
final class Testbed implements AutoCloseable {
    final JsonNode servers;
    private final Process process;
    private final BufferedReader out;
    private final Writer in;

    private static Testbed shared;

    /**
     * The test bed of this test run, started on first use and stopped when the JVM exits (its
     * stdin closes, and it stops its servers).
     */
    static synchronized Testbed shared() throws IOException {
        if (shared == null) {
            shared = new Testbed();
            Testbed bed = shared;
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                try {
                    bed.close();
                } catch (Exception ignored) {
                    // exiting anyway
                }
            }));
        }
        return shared;
    }

    /** A client of the test bed's plain lockd, describing itself as {@code holder}. */
    LockdClient client(String holder) {
        return LockdClient.builder().endpoints(servers.get("lockd").get("endpoint").asText()).holder(holder).build();
    }

    /**
     * Polls {@code done} until it holds, failing with {@code what} after {@code seconds}: a bound
     * on a condition lockd has no event for (Describe's counts), not a sleep to synchronise.
     */
    static void poll(String what, long seconds, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        while (!done.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                fail(what);
            }
            Thread.sleep(20);
        }
    }

    Testbed() throws IOException {
        String configured = System.getProperty("LOCKD_TESTBED");
        if (configured == null || configured.isEmpty()) {
            configured = System.getenv("LOCKD_TESTBED");
        }
        Path binary = configured != null && !configured.isEmpty() ? Path.of(configured)
                : Path.of("..", "..", "target", "debug", "testbed").toAbsolutePath().normalize();
        if (!Files.isExecutable(binary)) {
            fail("the testbed binary " + binary + " is missing: build it with `cargo build --workspace --bins` "
                    + "(or set LOCKD_TESTBED)");
        }
        process = new ProcessBuilder(binary.toString()).redirectError(ProcessBuilder.Redirect.INHERIT).start();
        out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
        in = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
        String line = out.readLine();
        if (line == null) {
            int status;
            try {
                status = process.waitFor();
            } catch (InterruptedException e) {
                status = -1;
            }
            fail("the testbed " + binary + " exited before describing its servers (status " + status
                    + "); see its output above");
        }
        servers = new ObjectMapper().readTree(line);
    }

    /** Sends one command; returns the text after "ok". */
    synchronized String command(String line) throws IOException {
        in.write(line + "\n");
        in.flush();
        String answer = out.readLine();
        assertTrue(answer != null && answer.startsWith("ok"), "testbed " + line + ": " + answer);
        return answer.length() > 3 ? answer.substring(3) : "";
    }

    @Override
    public void close() throws Exception {
        in.close();
        if (!process.waitFor(60, TimeUnit.SECONDS)) {
            process.destroy();
        }
    }
}
