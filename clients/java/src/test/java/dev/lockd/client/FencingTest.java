package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.sql.SQLException;
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
}
