/**
 * LRN on the kernel threads (the generated kernels are in `generate/lrn_kernels.ts`): the task's
 * fields, its two float64 constants carried as int32 words, each thread's scratch for the running
 * sums, and one thread's share, whole images, so no result depends on the thread count.
 *
 * @module
 */

import type { KernelExports } from "./generate/module.ts";

/**
 * Integer fields of an LRN task (`TaskKind.lrnForward` / `lrnBackward`), in order; four int32
 * words follow them: the float64 constants `k` and `coef` (forward) or `cross` and 0 (backward),
 * low word first. Forward writes `out` at `y`; `dy` and `dx` are 0 there.
 *
 * @example
 * ```ts
 * import { LRN_FIELDS } from "./lrn.ts";
 * console.log(LRN_FIELDS[0]); // "images"
 * ```
 */
export const LRN_FIELDS = [
  "images",
  "channels",
  "plane",
  "half",
  "x",
  "y",
  "scale",
  "dy",
  "dx",
  "scratch",
  "scratchStride",
] as const;

/** An LRN pass over `images` images of `channels` planes of `plane` floats (byte addresses). */
export interface LrnTask {
  images: number;
  channels: number;
  plane: number;
  half: number;
  x: number;
  y: number;
  scale: number;
  dy: number;
  dx: number;
  scratch: number;
  scratchStride: number;
  /** Two float64 constants as int32 words (see {@link lrnConstants}). */
  hyper: readonly number[];
}

const wordView = new Int32Array(2), doubleView = new Float64Array(wordView.buffer);

/**
 * Two float64 values as four int32 words, low word first (how they cross in a task).
 *
 * @example
 * ```ts
 * import { lrnConstants } from "./lrn.ts";
 * console.log(lrnConstants(1, 0)); // [0, 1072693248, 0, 0]
 * ```
 */
export function lrnConstants(a: number, b: number): number[] {
  doubleView[0] = a;
  const [a0, a1] = wordView;
  doubleView[0] = b;
  return [a0, a1, wordView[0], wordView[1]];
}

function wordsDouble(low: number, high: number): number {
  wordView[0] = low;
  wordView[1] = high;
  return doubleView[0];
}

/**
 * Scratch bytes per thread, whole cache lines: one image's running sums (forward), and after them
 * a ring of size + 1 planes of terms (backward).
 *
 * @example
 * ```ts
 * import { lrnScratchBytes } from "./lrn.ts";
 * console.log(lrnScratchBytes(55 * 55, 5, false)); // 24256
 * ```
 */
export function lrnScratchBytes(plane: number, size: number, backward: boolean): number {
  return Math.ceil((8 * plane * (backward ? size + 2 : 1)) / 64) * 64;
}

/**
 * Runs images [n0, n1) of the LRN task encoded in `args` on thread `t` (its scratch).
 *
 * @example
 * ```ts
 * import { runLrnImages } from "./lrn.ts";
 * // runLrnImages(kernels, false, args, 0, images, 0); // a whole forward task on thread 0
 * ```
 */
export function runLrnImages(
  x: KernelExports,
  backward: boolean,
  args: Int32Array,
  n0: number,
  n1: number,
  t: number,
): void {
  const [, channels, plane, half, xAt, yAt, scaleAt, dyAt, dxAt, scratch, scratchStride] = args;
  const words = LRN_FIELDS.length;
  const first = wordsDouble(args[words], args[words + 1]);
  const second = wordsDouble(args[words + 2], args[words + 3]);
  const at = 4 * n0 * channels * plane, acc = scratch + t * scratchStride;
  if (backward) {
    x.lrn_backward(
      xAt + at,
      yAt + at,
      scaleAt + at,
      dyAt + at,
      dxAt + at,
      acc,
      n1 - n0,
      channels,
      plane,
      half,
      first,
    );
  } else {
    x.lrn_forward(xAt + at, yAt + at, scaleAt + at, acc, n1 - n0, channels, plane, half, first, second);
  }
}

/** Where the pixel loops read and write: the byte offset `o` past each array, and the sums. */
