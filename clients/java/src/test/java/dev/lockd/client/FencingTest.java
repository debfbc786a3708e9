package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Proxy;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** fence-proxy's refusals as typed errors, without servers (the conformance suite runs them for real). */
class FencingTest {
    private static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void a409StaleTokenProblemIsAStaleToken() {
        StaleTokenException e = assertThrows(StaleTokenException.class, () -> Fencing.checkResponse(409,
                "application/problem+json", b("{\"type\":\"urn:fencing:problem:stale-token\",\"title\":\"Stale\","
                        + "\"status\":409,\"detail\":\"token 3 is below 5\",\"resource\":\"r/1\",\"token\":\"3.k.m\","
                        + "\"highest\":5}")));
        assertEquals("stale-token", e.code());
        assertEquals(409, e.status());
        assertEquals("r/1", e.resource());
        assertEquals("3.k.m", e.token());
        assertEquals(5L, e.highest());
    }

    @Test
    void a403ForgedTokenIsAFenceRefusalNotStale() {
        FenceRefusedException e = assertThrows(FenceRefusedException.class, () -> Fencing.checkResponse(403,
                "application/problem+json", b("{\"type\": \"urn:fencing:problem:forged-token\", \"detail\": \"\\u0041\"}")));
        assertFalse(e instanceof StaleTokenException);
        assertEquals("forged-token", e.code());
    }

    @Test
    void otherAnswersPass() {
        assertDoesNotThrow(() -> Fencing.checkResponse(200, "application/json", b("{}")));
        assertDoesNotThrow(() -> Fencing.checkResponse(409, "application/json", b("{\"type\":\"x\"}")));
        assertDoesNotThrow(() -> Fencing.checkResponse(502, "application/problem+json",
                b("{\"type\":\"urn:fencing:problem:upstream-unreachable\"}")));
        assertDoesNotThrow(() -> Fencing.checkResponse(409, "application/problem+json",
                b("{\"type\":\"https://example.com/conflict\"}")));
    }

    @Test
    void sqlStatesAreTranslated() {
        assertTrue(Fencing.refusal(new SQLException("stale", "FN001")) instanceof StaleTokenException);
        assertTrue(Fencing.refusal(new SQLException("ended", "FN003")) instanceof StaleTokenException);
        FenceRefusedException forged = Fencing.refusal(new SQLException("forged", "FN004"));
        assertFalse(forged instanceof StaleTokenException);
        assertEquals("FN004", forged.code());
        SQLException chained = new SQLException("batch", "25P02");
        chained.setNextException(new SQLException("stale", "FN001"));
        assertTrue(Fencing.refusal(chained) instanceof StaleTokenException);
        assertNull(Fencing.refusal(new SQLException("other", "23505")));
        assertNull(Fencing.refusal(new SQLException("none")));
    }

    /** A connection of a driver the helpers know nothing of (not pgjdbc), recording the calls made on it. */
    private static Connection fakeConnection(List<String> calls) {
        PreparedStatement st = (PreparedStatement) Proxy.newProxyInstance(FencingTest.class.getClassLoader(),
                new Class<?>[] {PreparedStatement.class}, (p, m, args) -> {
                    calls.add("statement." + m.getName());
                    return m.getReturnType() == boolean.class ? false : null;
                });
        boolean[] autoCommit = {true};
        return (Connection) Proxy.newProxyInstance(FencingTest.class.getClassLoader(),
                new Class<?>[] {Connection.class}, (p, m, args) -> {
                    calls.add(m.getName());
                    return switch (m.getName()) {
                        case "prepareStatement" -> st;
                        case "getAutoCommit" -> autoCommit[0];
                        case "setAutoCommit" -> {
                            autoCommit[0] = (Boolean) args[0];
                            yield null;
                        }
                        case "isClosed", "isWrapperFor" -> false;
                        case "hashCode" -> System.identityHashCode(p);
                        case "equals" -> p == args[0];
                        default -> null;
                    };
                });
    }

    @Test
    void aHelperNestedInAnotherOnTheSameConnectionIsRefused() {
        List<String> calls = new ArrayList<>();
        Connection conn = fakeConnection(calls);
        Fenceable outerLock = new Fenceable() {
            public String resource() {
                return "r/outer";
            }

            public String fenceToken() {
                return "3";
            }
        };
        Fenceable innerLock = new Fenceable() {
            public String resource() {
                return "r/inner";
            }

            public String fenceToken() {
                return "9";
            }
        };
        InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
                () -> Fencing.run(conn, outerLock, outer -> Fencing.run(outer, innerLock, inner -> {
                })));
        assertTrue(e.getMessage().contains("cannot run inside"), e.getMessage());
        assertFalse(calls.contains("commit"), "a commit was made: " + calls);
        assertTrue(calls.contains("rollback"), "the outer transaction was not rolled back: " + calls);
        // Afterwards the connection takes a helper again.
        calls.clear();
        assertDoesNotThrow(() -> Fencing.run(conn, innerLock, c -> {
        }));
        assertTrue(calls.contains("commit"), String.valueOf(calls));
    }
}
