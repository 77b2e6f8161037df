/**
 * The GEMM tuner's decision (`bench/kernels/tune_choice.ts`): a candidate replaces the untuned blocks only
 * when it clears the margin (3%, or twice the score the untuned blocks show against themselves)
 * both in the search and when measured again.
 *
 * Mutations tried, each made this test fail: filing the leader without its confirmation
 * (`clears(leader)` alone); a margin that ignores the noise (`MARGIN` alone); the score as an
 * arithmetic mean (the 1.21× / 1× case scores 1.105, not 1.1); the margin from the largest product's
 * deviation instead of the score's (the 1.01× / 0.95× noise gives 0.103, not 0.041).
 */

import assert from "node:assert/strict";
import { chooseBlocks, MARGIN, measured, noiseMargin } from "../../bench/kernels/tune_choice.ts";

const untuned = { mc: 192, nc: 4096 }, other = { mc: 288, nc: 2048 };

Deno.test("tuner: the score is the geometric mean of the speedups", () => {
  assert.ok(Math.abs(measured(other, [1.21, 1]).score - 1.1) < 1e-12);
  assert.equal(measured(other, [1, 1, 1]).score, 1);
});

Deno.test("tuner: the margin is 3% or twice the score's self-deviation, whichever is larger", () => {
  assert.equal(noiseMargin(measured(untuned, [1.001, 0.999])), MARGIN);
  // √(1.01 · 0.95) = 0.9795…: twice its log, 0.0414, where the worst product alone would say 0.103.
  assert.ok(Math.abs(noiseMargin(measured(untuned, [1.01, 0.95])) - Math.log(1 / (1.01 * 0.95))) < 1e-12);
  // One noisy product among steady ones (the Xeon's control run) no longer sets a 10% margin.
  const xeon = noiseMargin(measured(untuned, [1.02, 1.006, 1.005, 1.007, 1.049]));
  assert.ok(xeon > MARGIN && xeon < 0.035, `margin ${xeon}`);
});

Deno.test("tuner: a candidate is filed only when it clears the margin twice", () => {
  const margin = noiseMargin(measured(untuned, [1.02])); // 2·ln 1.02 ≈ 0.0396
  const fast = measured(other, [1.08, 1.06]), lucky = measured(other, [1.02, 1.03]);
  assert.deepEqual(chooseBlocks(untuned, fast, fast, margin), other, "fast in the search and again");
  assert.deepEqual(chooseBlocks(untuned, fast, lucky, margin), untuned, "not confirmed");
  assert.deepEqual(chooseBlocks(untuned, lucky, fast, margin), untuned, "short of the margin in the search");
  // 1.035× clears the bare 3% but not this noise's 4%.
  const small = measured(other, [1.035]);
  assert.deepEqual(chooseBlocks(untuned, small, small, MARGIN), other);
  assert.deepEqual(chooseBlocks(untuned, small, small, margin), untuned);
});
