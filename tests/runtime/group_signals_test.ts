/**
 * The "group final" signal words between a CPU device's Worker and the runtime
 * (`schedule/devices/group_signals.ts`). Here the test plays the worker: it sets the words itself,
 * in the orders a runtime can observe them.
 *
 * Each test names the mutation it was seen to catch.
 */

import assert from "node:assert/strict";
import { signalGroup, watchGroups } from "../../schedule/devices/group_signals.ts";

/** Resolves after `ms` milliseconds. */
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Awaits `promise` with a timer running: a pending `Atomics.waitAsync` does not keep Deno's event
 * loop alive (in a device, its worker's messages do), so without one the test would end as
 * "still pending" once this thread's own notify is all that is left.
 */
async function settled<T>(promise: Promise<T>): Promise<T> {
  const alive = setInterval(() => {}, 10);
  try {
    return await promise;
  } finally {
    clearInterval(alive);
  }
}

// Catches one watcher per group (what CpuDevice had: each group's watcher reported its own group
// as soon as it woke). A conv word seen final before the FC one's wake-up has been handled is what
// such a runtime can observe; it then reported conv first, and the gated overlap test failed with
// "held: conv, fc" on a CI run. Here the reports must still come FC first.
Deno.test("watchGroups reports groups in backward order even when a later group's word is seen final first", async () => {
  const signals = new Int32Array(new SharedArrayBuffer(8));
  const slots = [1, 0]; // fc's word is slot 1, conv's slot 0: the order is the groups', not the slots'
  const reports: string[] = [];
  const watching = watchGroups(signals, slots, ["fc", "conv"], 4, () => true, (g) => reports.push(g));
  signalGroup(signals, 0, 4); // conv's word first
  await sleep(20);
  assert.deepEqual(reports, [], "nothing reported while fc is not final");
  signalGroup(signals, 1, 4);
  await settled(watching);
  assert.deepEqual(reports, ["fc", "conv"]);
});

// Catches `value >= iteration` for `value > iteration` (a word still holding the previous
// iteration's mark counted as final): fc would be reported before it was signalled.
Deno.test("watchGroups counts a word final only for this iteration, and reports each group once", async () => {
  const signals = new Int32Array(new SharedArrayBuffer(8));
  signalGroup(signals, 0, 2); // both words as the previous iteration left them
  signalGroup(signals, 1, 2);
  const reports: string[] = [];
  const watching = watchGroups(signals, [0, 1], ["fc", "conv"], 3, () => true, (g) => reports.push(g));
  await sleep(20);
  assert.deepEqual(reports, []);
  signalGroup(signals, 0, 3);
  await sleep(20);
  assert.deepEqual(reports, ["fc"]);
  signalGroup(signals, 1, 3);
  await settled(watching);
  assert.deepEqual(reports, ["fc", "conv"]);
});

// Catches the watcher ignoring `current()` (a failed device's watcher would wait forever on a word
// its worker will never set; this test then times out at 5 s instead of ending by the 100 ms wake).
Deno.test("watchGroups ends without reporting once its iteration is no longer current", async () => {
  const signals = new Int32Array(new SharedArrayBuffer(8));
  let current = true;
  const reports: string[] = [];
  const watching = watchGroups(signals, [0, 1], ["fc", "conv"], 0, () => current, (g) => reports.push(g));
  await sleep(20);
  current = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const ended = await Promise.race([
    watching.then(() => true),
    new Promise<false>((resolve) => timer = setTimeout(() => resolve(false), 5000)),
  ]);
  clearTimeout(timer);
  assert.equal(ended, true, "the watcher ended once its iteration was over");
  assert.deepEqual(reports, []);
});
