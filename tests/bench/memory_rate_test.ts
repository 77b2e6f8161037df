/**
 * `memoryReadRate` (bench/kernels/kernel_timing.ts), the report's memory probe: it turns the time of
 * its sums into GB/s of the bytes it read, and frees what it uploaded. A stand-in backend whose sum
 * advances a stand-in clock by a known time checks both, with no real timing. Mutations seen
 * failing: the rate counting floats instead of bytes (4× too low); the array not released (one
 * storage left).
 */

import assert from "node:assert/strict";
import type { CpuBackend } from "../../backends/cpu/backend.ts";
import { MEMORY_PROBE_BYTES, memoryReadRate } from "../../bench/kernels/kernel_timing.ts";

Deno.test("memoryReadRate: GB/s of the bytes summed, every storage released", () => {
  const live = new Set<object>();
  const sumMs = 4;
  let clock = 0;
  const stand = {
    upload(data: Float32Array) {
      assert.equal(data.byteLength, MEMORY_PROBE_BYTES);
      const s = { data };
      live.add(s);
      return s;
    },
    allocate(length: number) {
      const s = { length };
      live.add(s);
      return s;
    },
    release(s: object) {
      assert.ok(live.delete(s), "released twice or never allocated");
    },
    reduce(op: string, x: object, _out: object, outer: number, size: number, inner: number) {
      assert.deepEqual([op, outer, size * 4, inner], ["sum", 1, MEMORY_PROBE_BYTES, 1]);
      assert.ok(live.has(x));
      clock += sumMs; // the sum's time, on the stand-in clock
    },
  };
  const now = performance.now;
  Object.defineProperty(performance, "now", { value: () => clock, configurable: true, writable: true });
  try {
    const { best, median } = memoryReadRate(stand as unknown as CpuBackend, 3);
    const expected = MEMORY_PROBE_BYTES / (sumMs / 1000) / 1e9;
    assert.ok(Math.abs(best - expected) < 1e-9 * expected, `best ${best} GB/s, expected ${expected}`);
    assert.ok(Math.abs(median - expected) < 1e-9 * expected, `median ${median} GB/s, expected ${expected}`);
  } finally {
    Object.defineProperty(performance, "now", { value: now, configurable: true, writable: true });
  }
  assert.equal(live.size, 0, "the probe left storage allocated");
});
