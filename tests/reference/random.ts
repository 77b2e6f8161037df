/** Seeded test inputs, independent of the engine's own generator so the two never mask each other. */

/**
 * mulberry32: a tiny deterministic PRNG so failures reproduce exactly.
 *
 * @example
 * ```ts
 * import { mulberry32 } from "./random.ts";
 * const next = mulberry32(1);
 * console.log(next()); // in [0, 1)
 * ```
 */
export function mulberry32(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
