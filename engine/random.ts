/**
 * Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
 *
 * Counter layout: words 0–1 = block index (position / values per block), word 2 = stream, word 3 = step;
 * key = the seed's low and high 32 bits.
 *
 * Each value is a pure function of (seed, stream, position): no hidden state, so the same numbers
 * come out on every backend and platform, in any order, on any device of a data-parallel run, and
 * after resuming from a checkpoint. Streams separate independent uses (a layer's init, a dropout
 * mask at a given step) without coordinating offsets.
 *
 * @module
 */

import { ValueError } from "./errors.ts";

const M0 = 0xd2511f53;
const M1 = 0xcd9e8d57;
const W0 = 0x9e3779b9;
const W1 = 0xbb67ae85;

/** High 32 bits of the 64-bit product of two uint32, exact in float64 arithmetic. */
function mulHigh(a: number, b: number): number {
  const aLo = a & 0xffff, aHi = a >>> 16, bLo = b & 0xffff, bHi = b >>> 16;
  const loLo = aLo * bLo, hiLo = aHi * bLo, loHi = aLo * bHi, hiHi = aHi * bHi;
  const cross = (loLo >>> 16) + (hiLo & 0xffff) + loHi;
  return (hiHi + (hiLo >>> 16) + Math.floor(cross / 65536)) >>> 0;
}

/** Where a random sequence comes from: a seed and an independent stream number. */
export interface RandomKey {
  /** Non-negative integer below 2^53. */
  seed: number;
  /** Independent sub-sequence (e.g. a layer); non-negative integer below 2^32. Default 0. */
  stream?: number;
  /** A further independent index (e.g. the training step); non-negative integer below 2^32. Default 0. */
  step?: number;
}

/**
 * The generator's words for `key`, validated: the seed's low and high 32 bits, the stream and the
 * step (what a backend that draws the numbers itself is given).
 *
 * @example
 * ```ts
 * import { philoxWords } from "./random.ts";
 * philoxWords({ seed: 2 ** 32 + 5, stream: 3 }); // [5, 1, 3, 0]
 * ```
 */
export function philoxWords(key: RandomKey): [number, number, number, number] {
  return checkKey(key);
}

function checkKey(key: RandomKey): [number, number, number, number] {
  const stream = key.stream ?? 0;
  const step = key.step ?? 0;
  if (!Number.isInteger(step) || step < 0 || step >= 2 ** 32) {
    throw new ValueError("random", `step must be an integer in [0, 2^32), got ${step}`);
  }
  if (!Number.isSafeInteger(key.seed) || key.seed < 0) {
    throw new ValueError("random", `seed must be a non-negative safe integer, got ${key.seed}`);
  }
  if (!Number.isInteger(stream) || stream < 0 || stream >= 2 ** 32) {
    throw new ValueError("random", `stream must be an integer in [0, 2^32), got ${stream}`);
  }
  return [key.seed >>> 0, Math.floor(key.seed / 2 ** 32) >>> 0, stream, step];
}

/**
 * Philox4x32-10 of a full 128-bit counter and 64-bit key, as specified by Random123 (exposed for
 * known-answer tests and for backends that generate numbers on the device).
 *
 * @example
 * ```ts
 * import { philox4x32 } from "./random.ts";
 * console.log(philox4x32([0, 0, 0, 0], [0, 0])); // Uint32Array [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
 * ```
 */
export function philox4x32(
  counter: readonly [number, number, number, number],
  key: readonly [number, number],
  out: Uint32Array = new Uint32Array(4),
): Uint32Array {
  philox(
    key[0] >>> 0,
    key[1] >>> 0,
    counter[0] >>> 0,
    counter[1] >>> 0,
    counter[2] >>> 0,
    counter[3] >>> 0,
    out,
  );
  return out;
}

function philox(
  k0: number,
  k1: number,
  c0: number,
  c1: number,
  c2: number,
  c3: number,
  out: Uint32Array,
): void {
  for (let round = 0; round < 10; round++) {
    const hi0 = mulHigh(M0, c0), lo0 = Math.imul(M0, c0) >>> 0;
    const hi1 = mulHigh(M1, c2), lo1 = Math.imul(M1, c2) >>> 0;
    const n0 = (hi1 ^ c1 ^ k0) >>> 0, n2 = (hi0 ^ c3 ^ k1) >>> 0;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 = (k0 + W0) >>> 0;
    k1 = (k1 + W1) >>> 0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/**
 * `count` uniform values in [0, 1) for positions `offset … offset+count−1` of the sequence `key`.
 * Each value has 24 random bits, so it is exact in float32.
 *
 * @example
 * ```ts
 * import { uniformValues } from "./random.ts";
 * const u = uniformValues(4, { seed: 1 });
 * ```
 */
export function uniformValues(count: number, key: RandomKey, offset = 0, low = 0, high = 1): Float32Array {
  const [k0, k1, stream, step] = checkKey(key);
  const out = new Float32Array(count);
  const words = new Uint32Array(4);
  const span = high - low;
  // One Philox block per 4 positions: block b holds positions 4b … 4b+3.
  for (let i = 0; i < count;) {
    const position = offset + i, b = Math.floor(position / 4);
    philox(k0, k1, b >>> 0, Math.floor(b / 2 ** 32) >>> 0, stream, step, words);
    for (let w = position - 4 * b; w < 4 && i < count; w++, i++) {
      out[i] = low + span * ((words[w] >>> 8) * 2 ** -24);
    }
  }
  return out;
}

/**
 * `count` standard-normal values (scaled by `std`, shifted by `mean`) for positions
 * `offset … offset+count−1`, by Box–Muller on the words of one Philox block per pair.
 *
 * @example
 * ```ts
 * import { normalValues } from "./random.ts";
 * const z = normalValues(4, { seed: 1 }, 0, 0, 0.01);
 * ```
 */
export function normalValues(count: number, key: RandomKey, offset = 0, mean = 0, std = 1): Float32Array {
  const [k0, k1, stream, step] = checkKey(key);
  const out = new Float32Array(count);
  const words = new Uint32Array(4);
  let block = -1;
  let radius = 0, angle = 0;
  for (let i = 0; i < count; i++) {
    const position = offset + i;
    const b = Math.floor(position / 2);
    if (b !== block) {
      block = b;
      philox(k0, k1, b >>> 0, Math.floor(b / 2 ** 32) >>> 0, stream, step, words);
      // u1 in (0, 1] keeps the logarithm finite.
      const u1 = ((words[0] >>> 8) + 1) * 2 ** -24;
      const u2 = (words[1] >>> 8) * 2 ** -24;
      radius = Math.sqrt(-2 * Math.log(u1));
      angle = 2 * Math.PI * u2;
    }
    const z = (position & 1) === 0 ? radius * Math.cos(angle) : radius * Math.sin(angle);
    out[i] = mean + std * z;
  }
  return out;
}

let globalSeed = 0;
let globalStream = 0;

/**
 * Sets the seed used by random calls that pass no `seed` of their own, and restarts their stream
 * count, so a program's random tensors and dropout masks are reproducible.
 *
 * @example
 * ```ts
 * import { manualSeed } from "./random.ts";
 * manualSeed(7);
 * ```
 */
export function manualSeed(seed: number): void {
  checkKey({ seed });
  globalSeed = seed;
  globalStream = 0;
}

/** The next key of the global sequence: the seed of `manualSeed`, one fresh stream per call. */
export function nextGlobalKey(): RandomKey {
  return { seed: globalSeed, stream: globalStream++ };
}
