package dev.lockd.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/** The SDK conformance suite (clients/conformance): every scenario of scenarios.json, one dynamic test each. */
class ConformanceTest {
    static final Path SCENARIOS = Path.of("..", "conformance", "scenarios.json");
    private static Testbed bed;

    @BeforeAll
    static void start() throws Exception {
        bed = Testbed.shared();
    }

    @TestFactory
    Stream<DynamicTest> scenarios() throws Exception {
        JsonNode root = new ObjectMapper().readTree(SCENARIOS.toFile());
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode scenario : root.get("scenarios")) {
            tests.add(DynamicTest.dynamicTest(scenario.get("name").asText(),
                    () -> new ScenarioRun(bed, scenario).run()));
        }
        if (tests.size() < 17) {
            throw new AssertionError("only " + tests.size() + " scenarios in " + SCENARIOS);
        }
        return tests.stream();
    }
}
