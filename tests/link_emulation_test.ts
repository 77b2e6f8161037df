/**
 * The emulated link's clock: `waitUntil` ends a wait on the clock thread (the kernel's timer), not
 * on a `setTimeout` that fires about 2 ms late, and never before its deadline.
 */

import assert from "node:assert/strict";
import { waitUntil } from "../schedule/runtime/link.ts";

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

// Mutation seen failing: the clock thread serving the second of two concurrent waits a full wait
// later (its deadline taken from the message's arrival) ends it 2 ms after its deadline, not before.
Deno.test("concurrent emulated waits each end at their own deadline", async () => {
  await clockReady();
  const start = performance.now();
  const deadlines = [start + 2, start + 2, start + 3];
  const ends = await Promise.all(deadlines.map(async (deadline) => {
    await waitUntil(deadline);
    return performance.now();
  }));
  ends.forEach((end, i) => assert.ok(end >= deadlines[i], `wait ${i} ended early`));
  // Served in turn, they end together rather than one after another: the last one well before a
  // second 2 ms wait could have followed the first.
  assert.ok(
    ends[1] < start + 3.9,
    `the second wait ended ${(ends[1] - start).toFixed(3)} ms after the start`,
  );
});

Deno.test("a deadline already past returns at once", async () => {
  assert.equal(await waitUntil(performance.now() - 1), "none");
});
