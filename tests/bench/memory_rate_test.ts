/**
 * `memoryReadRate` (bench/kernels/kernel_timing.ts), the report's memory probe: it turns the time of
 * its sums into GB/s of the bytes it read, and frees what it uploaded. A stand-in backend whose sum
 * takes a known time checks both. Mutations seen failing: the rate counting floats instead of bytes
 * (4× too low); the array not released (one storage left).
 */

import assert from "node:assert/strict";
import type { CpuBackend } from "../../backends/cpu/backend.ts";
import { MEMORY_PROBE_BYTES, memoryReadRate } from "../../bench/kernels/kernel_timing.ts";

Deno.test("memoryReadRate: GB/s of the bytes summed, every storage released", () => {
  const live = new Set<object>();
  const sumMs = 4;
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
      for (const end = performance.now() + sumMs; performance.now() < end;) { /* the sum's time */ }
    },
  };
  const { best, median } = memoryReadRate(stand as unknown as CpuBackend, 3);
  const ceiling = MEMORY_PROBE_BYTES / (sumMs / 1000) / 1e9; // no call is quicker than sumMs
  assert.ok(
    best <= ceiling * 1.001 && best > ceiling * 0.5,
    `best ${best} GB/s, expected just under ${ceiling}`,
  );
  assert.ok(median <= best && median > ceiling * 0.3, `median ${median} GB/s`);
  assert.equal(live.size, 0, "the probe left storage allocated");
});
