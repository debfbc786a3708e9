package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

/**
 * Pooled connections leak no token: with HikariCP (a pool of one) and with a plain JDBC
 * connection, a fenced transaction and one that fails, then the next user of that same server
 * connection (same pg_backend_pid()) reads the fencing settings: both empty.
 */
final class PoolChecks {
    static final String SETTINGS = "SELECT coalesce(current_setting('fencing.resource', true), ''), "
            + "coalesce(current_setting('fencing.token', true), ''), pg_backend_pid()";

    static final class Boom extends RuntimeException {
        private static final long serialVersionUID = 1L;
    }

    private PoolChecks() {
    }

    private static void upsert(Connection c, String key, String value) throws SQLException {
        try (PreparedStatement st = c.prepareStatement(ScenarioRun.UPSERT)) {
            st.setString(1, key);
            st.setString(2, value);
            st.executeUpdate();
        }
    }

    private static int pid(Connection c) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
            rs.next();
            return rs.getInt(1);
        }
    }

    private static void clean(Connection c, int pid, String who) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(SETTINGS)) {
            rs.next();
            assertEquals("", rs.getString(1), who + ": the next user sees fencing.resource");
            assertEquals("", rs.getString(2), who + ": the next user sees fencing.token");
            assertEquals(pid, rs.getInt(3), who + ": not the same server connection");
        }
    }

    static void check(String jdbcUrl, Lock lock, String key) throws Exception {
        // HikariCP, a pool of one connection, through FencedDataSource.
        HikariConfig config = new HikariConfig();
        config.setJdbcUrl(jdbcUrl);
        config.setMaximumPoolSize(1);
        config.setMinimumIdle(1);
        try (HikariDataSource pool = new HikariDataSource(config)) {
            FencedDataSource fenced = new FencedDataSource(pool);
            int pid = fenced.inTransaction(lock, c -> {
                upsert(c, key, "hikari");
                return pid(c);
            });
            try (Connection c = pool.getConnection()) {
                clean(c, pid, "HikariCP");
            }
            assertThrows(Boom.class, () -> fenced.run(lock, c -> {
                upsert(c, key, "hikari-failed");
                throw new Boom();
            }));
            try (Connection c = pool.getConnection()) {
                clean(c, pid, "HikariCP after a rollback");
            }
            // One that fails at the server: the connection is still clean for the next user.
            assertThrows(SQLException.class, () -> Fencing.run(pool, lock, c -> {
                try (Statement st = c.createStatement()) {
                    st.execute("SELECT no_such_column FROM conformance");
                }
            }));
            try (Connection c = pool.getConnection()) {
                clean(c, pid, "HikariCP after a failed statement");
            }
        }

        // A plain JDBC connection, used again after each transaction.
        try (Connection conn = DriverManager.getConnection(jdbcUrl)) {
            int pid = Fencing.inTransaction(conn, lock, c -> {
                upsert(c, key, "jdbc");
                return pid(c);
            });
            assertEquals(true, conn.getAutoCommit(), "autocommit restored");
            clean(conn, pid, "JDBC");
            assertThrows(Boom.class, () -> Fencing.run(conn, lock, c -> {
                upsert(c, key, "jdbc-failed");
                throw new Boom();
            }));
            assertEquals(true, conn.getAutoCommit(), "autocommit restored after a rollback");
            clean(conn, pid, "JDBC after a rollback");
        }
    }
}
