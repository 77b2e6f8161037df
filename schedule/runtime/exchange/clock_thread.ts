/**
 * The clock thread of an emulated link (`waitUntil` in `link.ts`): for each `{ id, at }` it
 * receives it sleeps in `Atomics.wait` until `at` (milliseconds since the epoch, as
 * `performance.timeOrigin + performance.now()`), then posts `id` back. The kernel's timer wakes it
 * within a fraction of a millisecond, where the runtime's timers fire about 2 ms late. Requests
 * are served in the order they arrive: those an emulated step makes together end together.
 *
 * @module
 */

import { parentPort } from "node:worker_threads";

if (!parentPort) throw new Error("clock_thread.ts runs as a node:worker_threads Worker of link.ts");
const port = parentPort;
const sleeper = new Int32Array(new SharedArrayBuffer(4));
const now = () => performance.timeOrigin + performance.now();
port.on("message", ({ id, at }: { id: number; at: number }) => {
  // Again while early: a timed wait may return a hair before its time (its timeout is rounded).
  for (let ms = at - now(); ms > 0; ms = at - now()) Atomics.wait(sleeper, 0, 0, ms);
  port.postMessage(id);
});
