/** Bit-for-bit comparison of float32 results, for tests that promise the same bits. */

import assert from "node:assert/strict";

/**
 * Asserts that `actual` and `expected` hold the same float32 bit patterns (so +0 ≠ −0 and NaN
 * payloads count), naming `what` and the first differing element.
 *
 * @example
 * ```ts
 * import { assertSameBits } from "./bits.ts";
 * assertSameBits(new Float32Array([1, 2]), new Float32Array([1, 2]), "values");
 * ```
 */
export function assertSameBits(actual: Float32Array, expected: Float32Array, what: string): void {
  const a = new Uint32Array(actual.buffer, actual.byteOffset, actual.length);
  const e = new Uint32Array(expected.buffer, expected.byteOffset, expected.length);
  const i = a.findIndex((v, j) => v !== e[j]);
  assert.ok(a.length === e.length && i < 0, `${what}: element ${i} is ${actual[i]}, expected ${expected[i]}`);
}
