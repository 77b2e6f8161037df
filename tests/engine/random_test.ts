import assert from "node:assert/strict";
import { manualSeed, randn, uniform, ValueError } from "../../mod.ts";
import { normalValues, uniformValues } from "../../engine/mod.ts";
import { philox4x32 } from "../../engine/random.ts";

Deno.test("Philox4x32-10 matches the Random123 known-answer vectors", () => {
  const hex = (w: Uint32Array) => [...w].map((v) => v.toString(16).padStart(8, "0"));
  assert.deepEqual(hex(philox4x32([0, 0, 0, 0], [0, 0])), ["6627e8d5", "e169c58d", "bc57ac4c", "9b00dbd8"]);
  assert.deepEqual(
    hex(philox4x32([0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff], [0xffffffff, 0xffffffff])),
    ["408f276d", "41c83b0e", "a20bc7c6", "6d5451fd"],
  );
  assert.deepEqual(
    hex(philox4x32([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0])),
    ["d16cfe09", "94fdcceb", "5001e420", "24126ea1"],
  );
});

Deno.test("values are keyed by position: any split of a range gives the same numbers", () => {
  const key = { seed: 1234, stream: 7 };
  const whole = uniformValues(103, key);
  const parts = [uniformValues(5, key, 0), uniformValues(61, key, 5), uniformValues(37, key, 66)];
  assert.deepEqual([...parts[0], ...parts[1], ...parts[2]], [...whole]);
  const normals = normalValues(51, key);
  assert.deepEqual([...normalValues(20, key, 3), ...normalValues(28, key, 23)], [...normals.subarray(3)]);
  // Different streams and seeds are different sequences.
  assert.notDeepEqual([...uniformValues(8, { seed: 1234, stream: 8 })], [...whole.subarray(0, 8)]);
  assert.notDeepEqual([...uniformValues(8, { seed: 1235, stream: 7 })], [...whole.subarray(0, 8)]);
});

Deno.test("uniform and normal values have the right range and moments", () => {
  const n = 200_000;
  const u = uniformValues(n, { seed: 5 });
  let mean = 0;
  for (const v of u) {
    assert.ok(v >= 0 && v < 1);
    mean += v / n;
  }
  assert.ok(Math.abs(mean - 0.5) < 0.005, `uniform mean ${mean}`);
  const z = normalValues(n, { seed: 6 }, 0, 2, 3);
  let m = 0, s = 0;
  for (const v of z) m += v / n;
  for (const v of z) s += (v - m) ** 2 / n;
  assert.ok(Math.abs(m - 2) < 0.03, `normal mean ${m}`);
  assert.ok(Math.abs(Math.sqrt(s) - 3) < 0.03, `normal std ${Math.sqrt(s)}`);
});

Deno.test("randn/uniform are reproducible with a seed and with manualSeed", () => {
  assert.deepEqual(randn([3, 4], { seed: 9 }).dataSync(), randn([3, 4], { seed: 9 }).dataSync());
  manualSeed(42);
  const a = [randn([5]).dataSync(), uniform([5]).dataSync()];
  manualSeed(42);
  const b = [randn([5]).dataSync(), uniform([5]).dataSync()];
  assert.deepEqual(a, b);
  assert.notDeepEqual(a[0], randn([5]).dataSync());
  const scaled = uniform([1000], { seed: 1, low: -2, high: 3 }).dataSync();
  assert.ok(scaled.every((v) => v >= -2 && v < 3));
  assert.throws(() => uniform([2], { seed: 1, low: 1, high: 1 }), ValueError);
  assert.throws(() => randn([2], { seed: -1 }), /seed must be a non-negative safe integer/);
});
