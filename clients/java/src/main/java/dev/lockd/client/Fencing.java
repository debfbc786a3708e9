package dev.lockd.client;

import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.Collections;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.Map;
import java.util.Set;
import javax.sql.DataSource;

/**
 * Fencing in one line: a lock's token on every write, and a refused write as {@link
 * StaleTokenException} (or {@link FenceRefusedException}).
 *
 * <p>JDBC through fence-proxy: the token is declared for one transaction with {@code
 * set_config(..., true)}, so a pooled connection never carries it to its next user:
 *
 * <pre>{@code
 * Fencing.inTransaction(dataSource, lock, conn -> {
 *     try (var st = conn.prepareStatement("UPDATE stock SET n = n - 1 WHERE sku = ?")) {
 *         st.setString(1, "a");
 *         return st.executeUpdate();
 *     }
 * });
 * }</pre>
 *
 * <p>HTTP through fence-proxy with {@code java.net.http}: {@code Fencing.check(http.send(
 * Fencing.request(HttpRequest.newBuilder(uri), lock).PUT(body).build(), ofString()))}; with OkHttp:
 * {@link FencingInterceptor} (a network interceptor).
 *
 * <p>The helpers do not refuse a lock that is already lost: fence-proxy decides, and a lost lock
 * whose token is still the highest may still write. Check {@link Lock#checkNotLost()} yourself
 * where you want to stop early.
 */
public final class Fencing {
    /** The statement that declares a lock's resource and token for the current transaction only. */
    public static final String DECLARE =
            "SELECT set_config('fencing.resource', ?, true), set_config('fencing.token', ?, true)";
    /** SQLSTATEs of a stale token: FN001 (below the highest accepted), FN003 (ended for a newer one). */
    public static final Set<String> STALE_SQLSTATES = Set.of("FN001", "FN003");
    /** The header naming the resource, for fence-proxy's HTTP mode. */
    public static final String RESOURCE_HEADER = "Fencing-Resource";
    /** The header carrying the token, for fence-proxy's HTTP mode. */
    public static final String TOKEN_HEADER = "Fencing-Token";

    private static final Set<String> REFUSALS = Set.of("stale-token", "forged-token", "unsigned-token",
            "malformed-token", "malformed-resource", "fencing-required");

    private Fencing() {
    }

    /** A unit of work on a connection; it may throw SQLException. */
    @FunctionalInterface
    public interface SqlWork<T> {
        T apply(Connection connection) throws SQLException;
    }

    /** A unit of work on a connection that returns nothing. */
    @FunctionalInterface
    public interface SqlAction {
        void accept(Connection connection) throws SQLException;
    }

    // -- JDBC -----------------------------------------------------------------------------

    /**
     * Runs {@code work} in a transaction of {@code connection} in which {@code lock}'s resource and
     * token are declared: autocommit off, the declaration, the work, commit (rollback on any
     * error), autocommit as it was. A fence refusal is thrown as {@link StaleTokenException}
     * (SQLSTATE FN001, FN003) or {@link FenceRefusedException} (another FN00x); other SQL errors
     * as they are.
     *
     * <p>It refuses ({@link InvalidArgumentException}) a connection whose transaction is already
     * open (autocommit off and statements run: with pgjdbc, the driver's transaction state) and a
     * connection another helper call is running on (a nested call): its commit would commit the
     * caller's earlier writes under this lock's token. A connection with autocommit off but no
     * statement run since the last commit or rollback (HikariCP's {@code autoCommit=false}) is fine.
     */
    public static <T> T inTransaction(Connection connection, Fenceable lock, SqlWork<T> work) throws SQLException {
        Object key = connectionKey(connection);
        if (!RUNNING.add(key)) {
            throw new InvalidArgumentException(NESTED + " (a fencing helper is already running on this connection)");
        }
        try {
            boolean autoCommit = connection.getAutoCommit();
            if (!autoCommit && transactionOpen(connection)) {
                throw new InvalidArgumentException(NESTED
                        + " (the connection's transaction is open: commit or roll back first)");
            }
            return fencedTransaction(connection, autoCommit, lock, work);
        } finally {
            RUNNING.remove(key);
        }
    }

    private static <T> T fencedTransaction(Connection connection, boolean autoCommit, Fenceable lock, SqlWork<T> work)
            throws SQLException {
        try {
            if (autoCommit) {
                connection.setAutoCommit(false);
            }
            T result;
            try {
                try (PreparedStatement st = connection.prepareStatement(DECLARE)) {
                    st.setString(1, lock.resource());
                    st.setString(2, lock.fenceToken());
                    st.execute();
                }
                result = work.apply(connection);
                connection.commit();
            } catch (Throwable t) {
                try {
                    connection.rollback();
                } catch (SQLException rollbackFailed) {
                    t.addSuppressed(rollbackFailed);
                }
                throw t;
            }
            return result;
        } catch (SQLException e) {
            FenceRefusedException refused = refusal(e);
            if (refused != null) {
                throw refused;
            }
            throw e;
        } finally {
            if (autoCommit && !connection.isClosed()) {
                connection.setAutoCommit(true);
            }
        }
    }

    private static final String NESTED =
            "the fencing helper opens its own transaction and cannot run inside one";

    /** The connections a helper is running on (their driver's connection when it can be unwrapped). */
    private static final Set<Object> RUNNING = Collections.synchronizedSet(Collections.newSetFromMap(new IdentityHashMap<>()));

    /** The driver's own connection behind a pool's proxy (pgjdbc), so two proxies of one are one key. */
    private static Object connectionKey(Connection connection) {
        try {
            Object pg = PgState.unwrap(connection);
            return pg != null ? pg : connection;
        } catch (LinkageError e) {
            return connection;
        }
    }

    private static boolean transactionOpen(Connection connection) {
        try {
            return PgState.transactionOpen(connection);
        } catch (LinkageError e) {
            return false;
        }
    }

    /**
     * pgjdbc's view of the transaction (the driver is optional: without it, or with another
     * driver, nothing is known and only re-entry is refused).
     */
    private static final class PgState {
        static Object unwrap(Connection connection) {
            try {
                if (connection.isWrapperFor(org.postgresql.core.BaseConnection.class)) {
                    return connection.unwrap(org.postgresql.core.BaseConnection.class);
                }
            } catch (LinkageError | SQLException e) {
                // no pgjdbc, or a driver that cannot tell
            }
            return null;
        }

        static boolean transactionOpen(Connection connection) {
            try {
                Object pg = unwrap(connection);
                return pg != null && ((org.postgresql.core.BaseConnection) pg).getTransactionState()
                        != org.postgresql.core.TransactionState.IDLE;
            } catch (LinkageError e) {
                return false;
            }
        }
    }

    /** {@link #inTransaction(Connection, Fenceable, SqlWork)} without a result. */
    public static void run(Connection connection, Fenceable lock, SqlAction work) throws SQLException {
        inTransaction(connection, lock, (SqlWork<Void>) c -> {
            work.accept(c);
            return null;
        });
    }

    /**
     * {@link #inTransaction(Connection, Fenceable, SqlWork)} on a connection taken from {@code
     * dataSource} (a HikariCP pool, say) and given back at the end.
     */
    public static <T> T inTransaction(DataSource dataSource, Fenceable lock, SqlWork<T> work) throws SQLException {
        try (Connection c = dataSource.getConnection()) {
            return inTransaction(c, lock, work);
        } catch (SQLException e) {
            FenceRefusedException refused = refusal(e);
            if (refused != null) {
                throw refused;
            }
            throw e;
        }
    }

    /** {@link #inTransaction(DataSource, Fenceable, SqlWork)} without a result. */
    public static void run(DataSource dataSource, Fenceable lock, SqlAction work) throws SQLException {
        inTransaction(dataSource, lock, (SqlWork<Void>) c -> {
            work.accept(c);
            return null;
        });
    }

    /** The fence's refusal carried by an SQLException (or one it chains to or wraps), or null. */
    public static FenceRefusedException refusal(SQLException e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            for (SQLException s = t instanceof SQLException x ? x : null; s != null; s = s.getNextException()) {
                String state = s.getSQLState();
                if (state != null && state.startsWith("FN")) {
                    String text = String.valueOf(s.getMessage()).strip().lines().findFirst().orElse("");
                    String message = "fence-proxy refused the write (" + state + "): " + text;
                    return STALE_SQLSTATES.contains(state)
                            ? new StaleTokenException(message, state, 0, null, null, null, e)
                            : new FenceRefusedException(message, state, 0, null, null, null, e);
                }
                if (s == s.getNextException()) {
                    break;
                }
            }
        }
        return null;
    }

    // -- HTTP -----------------------------------------------------------------------------

    /** The two headers fence-proxy reads. */
    public static Map<String, String> headers(Fenceable lock) {
        return Map.of(RESOURCE_HEADER, lock.resource(), TOKEN_HEADER, lock.fenceToken());
    }

    /** Adds {@code Fencing-Resource} and {@code Fencing-Token} to a java.net.http request. */
    public static HttpRequest.Builder request(HttpRequest.Builder builder, Fenceable lock) {
        return builder.setHeader(RESOURCE_HEADER, lock.resource()).setHeader(TOKEN_HEADER, lock.fenceToken());
    }

    /**
     * Throws {@link StaleTokenException} for fence-proxy's 409, {@link FenceRefusedException} for
     * its other refusals of the token (403 forged or unsigned, 428, 400 malformed); returns the
     * response otherwise. The body is read when it is a String or a byte[].
     */
    public static <T> HttpResponse<T> check(HttpResponse<T> response) {
        String type = response.headers().firstValue("content-type").orElse("");
        Object body = response.body();
        byte[] bytes = body instanceof byte[] b ? b
                : body instanceof String s ? s.getBytes(StandardCharsets.UTF_8) : new byte[0];
        checkResponse(response.statusCode(), type, bytes);
        return response;
    }

    /** The check of {@link #check(HttpResponse)}, for any HTTP client. */
    public static void checkResponse(int status, String contentType, byte[] body) {
        if (contentType == null || !contentType.contains("problem+json")) {
            return;
        }
        Map<String, Object> problem;
        try {
            problem = MiniJson.object(new String(body == null ? new byte[0] : body, StandardCharsets.UTF_8));
        } catch (IllegalArgumentException e) {
            problem = new HashMap<>();
        }
        String kind = String.valueOf(problem.getOrDefault("type", ""));
        if (kind.isEmpty() && status == 409) {
            kind = "urn:fencing:problem:stale-token"; // a body we could not read
        }
        if (!kind.startsWith("urn:fencing:problem:")) {
            return;
        }
        String name = kind.substring(kind.lastIndexOf(':') + 1);
        if (!REFUSALS.contains(name)) {
            return;
        }
        String message = "fence-proxy refused the request (" + status + " " + name + "): "
                + problem.getOrDefault("detail", "");
        String resource = problem.get("resource") instanceof String r ? r : null;
        Object t = problem.get("token");
        String token = t == null ? null : String.valueOf(t);
        Long highest = problem.get("highest") instanceof Number n ? n.longValue() : null;
        if (status == 409) {
            throw new StaleTokenException(message, name, status, resource, token, highest, null);
        }
        throw new FenceRefusedException(message, name, status, resource, token, highest, null);
    }
}
