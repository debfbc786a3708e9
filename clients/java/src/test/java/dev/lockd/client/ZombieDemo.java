package dev.lockd.client;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;

/**
 * The zombie demo in Java: a holder whose process is paused for real (SIGSTOP) past its lease
 * wakes up and writes; fence-proxy refuses the write because a newer holder has written.
 *
 * <pre>mvn -q test -Dtest=ZombieDemoTest     (from clients/java; or: ./x sdk-demo java)</pre>
 *
 * It starts the servers itself (clients/testbed: lockd signing tokens, PostgreSQL behind
 * fence-proxy), so build them first: cargo build --workspace --bins. The zombie is a second
 * JVM running {@code main} with {@code --zombie}.
 */
public final class ZombieDemo {
    static final String RESOURCE = "inventory/sku-1";
    static final String KEY = "sku-1";
    static final String UPSERT = "INSERT INTO conformance VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v";

    private ZombieDemo() {}

    /** JDBC's URL for the test bed's libpq-style DSN, postgresql://user@host:port/db. */
    static String jdbc(String dsn) {
        String rest = dsn.substring("postgresql://".length());
        String user = rest.substring(0, rest.indexOf('@'));
        return "jdbc:postgresql://" + rest.substring(rest.indexOf('@') + 1) + "?user=" + user;
    }

    static void write(String dsn, Lock lock, String value) throws SQLException {
        try (Connection c = DriverManager.getConnection(jdbc(dsn))) {
            Fencing.run(c, lock, conn -> {
                try (PreparedStatement st = conn.prepareStatement(UPSERT)) {
                    st.setString(1, KEY);
                    st.setString(2, value);
                    st.executeUpdate();
                }
            });
        }
    }

    /** The zombie's JVM: takes the lock, writes, says so, and is paused by the demo. */
    static int zombie(String endpoint, String dsn) throws Exception {
        try (LockdClient client = LockdClient.builder().endpoints(endpoint).holder("zombie").build()) {
            Lock lock = client.acquire(RESOURCE, AcquireOptions.builder().ttl(Duration.ofSeconds(2)).build());
            System.out.printf("zombie: holds %s with token %d; writes, then is paused (SIGSTOP)%n", RESOURCE, lock.token());
            write(dsn, lock, "zombie (token " + lock.token() + ")");
            System.out.println("PAUSE ME");
            System.out.flush();
            // stdin closes once the demo has resumed this JVM: then it writes, late.
            while (System.in.read() != -1) {
                // nothing to read
            }
            System.out.printf("zombie: woke up; lost=%s; writes anyway with token %d%n", lock.isLost(), lock.token());
            try {
                write(dsn, lock, "zombie, late (token " + lock.token() + ")");
            } catch (StaleTokenException e) {
                System.out.println("zombie: refused: " + e.getMessage());
                return 0;
            }
            System.out.println("zombie: THE STALE WRITE WAS ACCEPTED");
            return 1;
        }
    }

    static void signal(long pid, String sig) throws Exception {
        int code = new ProcessBuilder("kill", "-" + sig, Long.toString(pid)).inheritIO().start().waitFor();
        if (code != 0) {
            throw new IllegalStateException("kill -" + sig + " " + pid + " exited " + code);
        }
    }

    /** The demo: 0 when fencing held. */
    static int demo() throws Exception {
        try (Testbed bed = new Testbed()) {
            String endpoint = bed.servers.get("lockd").get("endpoint").asText();
            String dsn = bed.servers.get("pg").get("dsn").asText();
            String java = ProcessHandle.current().info().command().orElse("java");
            Process child = new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"),
                    ZombieDemo.class.getName(), "--zombie", endpoint, dsn)
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            BufferedReader said = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8));
            for (String line = said.readLine(); ; line = said.readLine()) {
                if (line == null) {
                    System.out.println("the zombie exited before it was paused");
                    return 1;
                }
                if (line.equals("PAUSE ME")) {
                    break;
                }
                System.out.println(line);
            }
            signal(child.pid(), "STOP"); // a GC pause, swap, a debugger: the JVM stops
            try (LockdClient client = LockdClient.builder().endpoints(endpoint).holder("newer").build();
                 Lock lock = client.acquire(RESOURCE, AcquireOptions.builder()
                         .ttl(Duration.ofSeconds(30)).wait(Duration.ofSeconds(30)).build())) {
                System.out.printf("newer:  granted %s with token %d once the zombie's lease ran out; writes%n",
                        RESOURCE, lock.token());
                write(dsn, lock, "newer (token " + lock.token() + ")");
                signal(child.pid(), "CONT");
                child.getOutputStream().close();
                for (String line = said.readLine(); line != null; line = said.readLine()) {
                    System.out.println(line);
                }
                int code = child.waitFor();
                String value;
                try (Connection c = DriverManager.getConnection(jdbc(dsn));
                     PreparedStatement st = c.prepareStatement("SELECT v FROM conformance WHERE k = ?")) {
                    st.setString(1, KEY);
                    try (ResultSet rs = st.executeQuery()) {
                        rs.next();
                        value = rs.getString(1);
                    }
                }
                System.out.println("the row holds: \"" + value + "\"");
                boolean held = code == 0 && value.startsWith("newer");
                System.out.println(held ? "fencing held: the zombie's write was refused" : "FENCING FAILED");
                return held ? 0 : 1;
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 3 && args[0].equals("--zombie")) {
            System.exit(zombie(args[1], args[2]));
        }
        System.exit(demo());
    }
}
