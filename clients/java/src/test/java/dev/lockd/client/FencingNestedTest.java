package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The JDBC helpers open their own transaction: on a connection whose transaction is already open
 * (the caller's writes, or another helper call on it) they refuse, so their commit never commits
 * someone else's writes under this lock's token. With the test bed's fence-proxy.
 */
class FencingNestedTest {
    private Testbed bed;
    private LockdClient client;
    private final String run = LockdClient.newRequestId().replaceAll("[^A-Za-z0-9]", "");

    @BeforeEach
    void setUp() throws Exception {
        bed = Testbed.shared();
        client = bed.client("java-nested");
    }

    @AfterEach
    void tearDown() {
        client.close();
    }

    private String jdbcUrl() {
        var pg = bed.servers.get("pg");
        return "jdbc:postgresql://" + pg.get("host").asText() + ":" + pg.get("port").asInt() + "/"
                + pg.get("database").asText() + "?user=" + pg.get("user").asText() + "&sslmode=disable";
    }

    private static void upsert(Connection c, String key, String value) throws SQLException {
        try (PreparedStatement st = c.prepareStatement(ScenarioRun.UPSERT)) {
            st.setString(1, key);
            st.setString(2, value);
            st.executeUpdate();
        }
    }

    private String read(String key) throws SQLException {
        try (Connection c = DriverManager.getConnection(jdbcUrl());
                PreparedStatement st = c.prepareStatement("SELECT v FROM conformance WHERE k = ?")) {
            st.setString(1, key);
            try (ResultSet rs = st.executeQuery()) {
                return rs.next() ? rs.getString(1) : null;
            }
        }
    }

    private Lock take(String resource) {
        return client.acquire(resource, AcquireOptions.builder().ttl(Duration.ofSeconds(30))
                .wait(Duration.ofSeconds(30)).build());
    }

    @Test
    void aNestedHelperCannotCommitAStaleOuterWrite() throws Exception {
        String key = run + "-nested";
        Lock old = take("java/" + run + "/nested-row");
        assertTrue(client.release(old.resource(), old.leaseId())); // OLD ends behind its back
        try (Lock newer = take(old.resource()); Lock other = take("java/" + run + "/nested-other");
                Connection conn = DriverManager.getConnection(jdbcUrl())) {
            assertTrue(newer.token() > old.token());
            Fencing.run(conn, newer, c -> upsert(c, key, "newer")); // the newer holder wrote

            assertThrows(RuntimeException.class, () -> Fencing.run(conn, old, outer -> {
                Fencing.run(outer, other, inner -> upsert(inner, key + "-other", "other"));
                upsert(outer, key, "stale");
            }));
            assertEquals("newer", read(key), "the stale outer write was committed");
            assertEquals(null, read(key + "-other"), "the refused inner call wrote");
            assertTrue(conn.getAutoCommit(), "autocommit restored");
        }
    }

    @Test
    void anOpenTransactionOfTheCallerIsRefusedAndNotCommitted() throws Exception {
        String key = run + "-open";
        try (Lock lock = take("java/" + run + "/open-row"); Connection conn = DriverManager.getConnection(jdbcUrl())) {
            conn.setAutoCommit(false);
            upsert(conn, key + "-caller", "caller"); // the caller's own, unfenced, uncommitted write
            InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
                    () -> Fencing.run(conn, lock, c -> upsert(c, key, "fenced")));
            assertTrue(e.getMessage().contains("cannot run inside"), e.getMessage());
            conn.rollback();
            assertEquals(null, read(key + "-caller"), "the helper committed the caller's write");
            assertEquals(null, read(key));
            assertFalse(conn.getAutoCommit(), "the caller's autocommit setting is left alone");
        }
    }

    @Test
    void autocommitOffButIdleWorks() throws Exception {
        String key = run + "-idle";
        try (Lock lock = take("java/" + run + "/idle-row")) {
            try (Connection conn = DriverManager.getConnection(jdbcUrl())) {
                conn.setAutoCommit(false);
                Fencing.run(conn, lock, c -> upsert(c, key, "one"));
                assertEquals("one", read(key));
                Fencing.run(conn, lock, c -> upsert(c, key, "two")); // idle again after the helper's commit
                assertEquals("two", read(key));
                assertFalse(conn.getAutoCommit());
            }
            HikariConfig config = new HikariConfig();
            config.setJdbcUrl(jdbcUrl());
            config.setAutoCommit(false);
            config.setMaximumPoolSize(1);
            try (HikariDataSource pool = new HikariDataSource(config)) {
                FencedDataSource fenced = new FencedDataSource(pool);
                fenced.run(lock, c -> upsert(c, key, "hikari"));
                assertEquals("hikari", read(key));
                fenced.run(lock, c -> upsert(c, key, "hikari-again"));
                assertEquals("hikari-again", read(key));
            }
        }
    }
}
