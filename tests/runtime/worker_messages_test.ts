/**
 * Messages to a CPU device's Worker carry shared memory as `SharedArrayBuffer`s, never as typed
 * arrays over it: Deno's `node:worker_threads` `postMessage` walks a typed array element by element
 * even when it is shared (bvlc_alexnet's 2 × 244 MB of parameters and gradients held each device's
 * start for 20–47 s), while a `SharedArrayBuffer` arrives at once whatever its size.
 *
 * Each test names the one-line mutation it was seen to catch.
 */

import assert from "node:assert/strict";
import { Worker } from "node:worker_threads";
import { SGD } from "../../mod.ts";
import { packViews, unpackViews } from "../../schedule/devices/protocol.ts";
import { sequentialPlan } from "../../schedule/plan/builtins.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import { tinyBatch as batch, tinyGroups as groups, tinyModel as model } from "../fixtures/data_parallel.ts";

/** Paths to every typed array over shared memory inside `value` (plain objects and arrays walked). */
function sharedViews(value: unknown, path = "message"): string[] {
  if (typeof value !== "object" || value === null) return [];
  if (ArrayBuffer.isView(value)) return value.buffer instanceof SharedArrayBuffer ? [path] : [];
  if (Array.isArray(value)) return value.flatMap((item, i) => sharedViews(item, `${path}[${i}]`));
  return Object.entries(value).flatMap(([key, item]) => sharedViews(item, `${path}.${key}`));
}

// Catches: `packViews` returning the message as it is (the first assertion), and `unpackViews`
// making the view at byte 0 instead of `byteOffset` (the writes no longer meet).
Deno.test("packViews sends shared views as their buffers, and unpackViews makes them again over the same memory", () => {
  const memory = new SharedArrayBuffer(1024);
  const parameters = new Float32Array(memory, 64, 8);
  const signals = new Int32Array(memory, 512, 4);
  const local = new Float32Array([1, 2, 3]);
  const message = {
    type: "init",
    parameters,
    nested: { list: [signals, { deeper: new Uint8Array(memory, 1000, 3) }] },
    local,
    names: ["fc", "conv"],
    count: 3,
  };
  const packed = packViews(message);
  assert.deepEqual(
    sharedViews(packed),
    [],
    "a typed array over shared memory is still in the packed message",
  );
  const copy = unpackViews<typeof message>(structuredClone(packed));
  assert.ok(copy.parameters instanceof Float32Array && copy.nested.list[0] instanceof Int32Array);
  assert.equal(copy.parameters.length, 8);
  assert.equal(copy.parameters.byteOffset, 64);
  copy.parameters[2] = 42.5;
  assert.equal(parameters[2], 42.5, "the unpacked view is not over the sender's memory");
  signals[3] = 7;
  assert.equal((copy.nested.list[0] as Int32Array)[3], 7);
  (copy.nested.list[1] as { deeper: Uint8Array }).deeper[0] = 9;
  assert.equal(new Uint8Array(memory)[1000], 9);
  // Ordinary memory is copied as before, and the rest of the message is unchanged.
  assert.deepEqual(Array.from(copy.local), [1, 2, 3]);
  assert.deepEqual(copy.names, ["fc", "conv"]);
  assert.equal(copy.count, 3);
});

// Catches: `CpuDevice.#post` posting `message` instead of `packViews(message)` (the init message's
// parameters and gradients, and the input message's images, then travel as views).
Deno.test("a CPU device posts no typed array over shared memory to its worker, and still trains", async () => {
  const post = Worker.prototype.postMessage;
  const offending: string[] = [];
  let posted = 0;
  Worker.prototype.postMessage = function (this: Worker, message: unknown, ...rest: unknown[]) {
    posted++;
    const type = (message as { type?: string })?.type ?? "?";
    offending.push(...sharedViews(message).map((path) => `${type}: ${path}`));
    return (post as (...args: unknown[]) => void).call(this, message, ...rest);
  } as typeof post;
  try {
    const trainer = await DataParallelTrainer.create({
      model,
      devices: 2,
      plan: sequentialPlan(groups),
      optimizer: (p) => new SGD(p, { lr: 0.01 }),
      timeoutSeconds: 30,
    });
    try {
      const before = Float32Array.from(trainer.devices[1].parameters);
      await trainer.step(batch(0));
      await trainer.step(batch(1));
      // The replicas read their parameters from the shared memory the runtime wrote.
      const after = trainer.devices[1].parameters;
      assert.ok(after.some((x, i) => x !== before[i]), "device 1's parameters did not move");
    } finally {
      await trainer.close();
    }
  } finally {
    Worker.prototype.postMessage = post;
  }
  assert.ok(posted >= 2 * 3, `only ${posted} messages were posted (init, input and steps per device)`);
  assert.deepEqual(offending, []);
});
