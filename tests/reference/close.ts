/** Comparison of float32 results with a float64 reference, relative to the reference's scale. */

import assert from "node:assert/strict";

/**
 * Asserts that the largest |actual − expected| is at most `tolerance` times the largest |expected|
 * (a NaN in `actual` fails), naming `what` and both figures.
 *
 * @example
 * ```ts
 * import { assertRelativelyClose } from "./close.ts";
 * assertRelativelyClose(new Float32Array([1, 2]), new Float64Array([1, 2 + 1e-7]), 1e-6, "values");
 * ```
 */
export function assertRelativelyClose(
  actual: Float32Array,
  expected: Float64Array,
  tolerance: number,
  what: string,
): void {
  assert.equal(actual.length, expected.length, `${what}: length`);
  let diff = 0, scale = 0;
  for (let i = 0; i < expected.length; i++) {
    const d = Math.abs(actual[i] - expected[i]);
    if (!(d <= diff)) diff = d; // NaN fails
    scale = Math.max(scale, Math.abs(expected[i]));
  }
  assert.ok(
    diff / scale <= tolerance,
    `${what}: max diff ${diff} over max |float64| ${scale} = ${diff / scale}`,
  );
}
