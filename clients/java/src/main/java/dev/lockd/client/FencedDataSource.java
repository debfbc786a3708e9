package dev.lockd.client;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.Objects;
import javax.sql.DataSource;

/**
 * A {@link DataSource} (any: a HikariCP pool, PGSimpleDataSource) whose fenced transactions are
 * one call: {@code fenced.inTransaction(lock, conn -> ...)}. Each declares the lock's resource and
 * token for its own transaction only, so the pooled connection carries nothing to its next user.
 * See {@link Fencing#inTransaction(Connection, Fenceable, Fencing.SqlWork)}.
 */
public final class FencedDataSource {
    private final DataSource dataSource;

    public FencedDataSource(DataSource dataSource) {
        this.dataSource = Objects.requireNonNull(dataSource, "dataSource");
    }

    /** The data source it wraps, for unfenced work. */
    public DataSource dataSource() {
        return dataSource;
    }

    /** Runs {@code work} in a fenced transaction on a connection of the pool. */
    public <T> T inTransaction(Fenceable lock, Fencing.SqlWork<T> work) throws SQLException {
        return Fencing.inTransaction(dataSource, lock, work);
    }

    /** {@link #inTransaction(Fenceable, Fencing.SqlWork)} without a result. */
    public void run(Fenceable lock, Fencing.SqlAction work) throws SQLException {
        Fencing.run(dataSource, lock, work);
    }
}
