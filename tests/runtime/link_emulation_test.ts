/**
 * The emulated link's clock: `waitUntil` ends a wait on the clock thread (the kernel's timer), not
 * on a `setTimeout` that fires about 2 ms late, and never before its deadline.
 */

import assert from "node:assert/strict";
import { waitUntil } from "../../schedule/runtime/exchange/link.ts";

// Mutation seen failing: `startClock` returning undefined (no clock thread): no wait ends by the
// clock, and `clockReady` fails in both tests.
/**
 * Waits until the clock thread ends a wait (it starts with the first one: under `deno test`
 * without `--no-check` its module is type-checked first, which takes a second or two, and the
 * fallback timer ends the waits meanwhile); fails after 60 s.
 */
async function clockReady(): Promise<void> {
  const until = performance.now() + 60_000;
  while (performance.now() < until) {
    if (await waitUntil(performance.now() + 1) === "clock") return;
  }
  assert.fail("no emulated wait ended by the clock thread in 60 s");
}

Deno.test("an emulated wait ends on the clock thread, never early", async () => {
  await clockReady();
  const endedBy: string[] = [];
  for (let i = 0; i < 9; i++) {
    const deadline = performance.now() + 0.5;
    endedBy.push(await waitUntil(deadline));
    const now = performance.now();
    assert.ok(now >= deadline, `wait ${i} ended ${(deadline - now).toFixed(3)} ms early`);
  }
  // The fallback timer may win a wait or two where the machine is busy (other test files run
  // beside this one); most must be the clock's.
  const byClock = endedBy.filter((by) => by === "clock").length;
  assert.ok(byClock >= 6, `only ${byClock} of 9 waits ended by the clock thread: ${endedBy.join(", ")}`);
});

// Mutation seen failing: the clock thread taking each deadline from when it reads the request
// (sleeping the wait's length from then) serves the second of two concurrent 30 ms waits 30 ms late,
// past the fallback's 20, so the fallback timer ends it and the third: 1 of 3 by the clock. No
// wall-clock bound is asserted: what ended each wait says whether the clock kept each deadline.
Deno.test("concurrent emulated waits each end at their own deadline", async () => {
  await clockReady();
  const start = performance.now();
  const deadlines = [start + 30, start + 30, start + 40];
  const results = await Promise.all(deadlines.map(async (deadline) => {
    const by = await waitUntil(deadline);
    return { by, end: performance.now() };
  }));
  results.forEach(({ end }, i) => assert.ok(end >= deadlines[i], `wait ${i} ended early`));
  // As above, the fallback may win one where the machine is busy.
  const byClock = results.filter(({ by }) => by === "clock").length;
  assert.ok(byClock >= 2, `only ${byClock} of 3 concurrent waits ended by the clock thread`);
});

Deno.test("a deadline already past returns at once", async () => {
  assert.equal(await waitUntil(performance.now() - 1), "none");
});
