/** The zombie demo (examples/zombie.ts) runs, and fencing holds in it. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { demo } from "../examples/zombie";

test("the zombie demo: the paused zombie's late write is refused", async () => {
  assert.equal(await demo(), 0, "the demo's output is above");
});
