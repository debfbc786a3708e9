/** The conformance suite (clients/conformance/scenarios.json), against clients/testbed. */
import { after, before, test } from "node:test";
import { SCENARIOS, Run } from "./scenarios";
import { Testbed } from "./testbed";

let bed: Testbed | undefined;

before(async () => {
  bed = await Testbed.start();
});

after(async () => {
  await bed?.close();
});

for (const scenario of SCENARIOS) {
  test(scenario.name, async () => {
    if (!bed) throw new Error("the testbed did not start");
    await new Run(bed, scenario).run();
  });
}
