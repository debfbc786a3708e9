package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

/** The zombie demo runs, and fencing holds in it (its output is printed above the result). */
class ZombieDemoTest {
    @Test
    void theZombiesLateWriteIsRefused() throws Exception {
        assertEquals(0, ZombieDemo.demo(), "the zombie demo failed; its output is above");
    }
}
