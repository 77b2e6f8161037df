/**
 * The weight gradient of a max-pooled convolution straight from the pooled gradient, where the
 * convolution's input needs no gradient (a network's first layer): dw[f, c, i, j] = Σ over images
 * and the pooled outputs o of plane f that count (with a ReLU before the pooling, those whose
 * pooled value is > 0) of dy[o] · x[c, the winner of o's window shifted by (i, j)].
 *
 * Why: the usual way scatters dy to the winners into the convolution's output gradient (zeros
 * elsewhere), writes it (6.4 MB on the AlexNet-like conv1) and reads it back for a weight gradient
 * whose multiply-adds are three quarters zeros (a 3×3 stride-2 pooling keeps about a quarter of
 * the outputs). Here each pooled output multiplies its winner's patch once, read from the image's
 * zero-padded planes in L1.
 *
 * Bits: each filter's sums are computed whole by one thread, image after image, pooled output
 * after pooled output, so they do not depend on the thread count. They are not the scatter's
 * (an element that won two windows adds two products here, one of the two gradients' sum there).
 *
 * @module
 */

import type { Conv2dGeometry, Pool2dGeometry } from "../../geometry.ts";
import { padChannels } from "./conv.ts";
import type { KernelExports } from "./generate/module.ts";
import {
  POOLED_FILTER_ACCUMULATORS,
  POOLED_FILTER_ROWS,
  POOLED_FILTER_VECTORS,
  pooledFilterExport,
  PooledFilterFlags,
} from "./generate/filter_pooled_kernels.ts";

/** Vectors per kernel row the kernels keep (kernelW rounded up to whole vectors). */
function kernelVectors(g: Conv2dGeometry): number {
  return Math.ceil(g.kernelW / 4);
}

/**
 * Why the kernels cannot take this convolution and pooling (a short reason), or `undefined`: the
 * pooling must read the convolution's output, and the filter fit the generated kernels (at most
 * {@link POOLED_FILTER_ROWS} rows of at most 4 · {@link POOLED_FILTER_VECTORS} taps, and
 * {@link POOLED_FILTER_ACCUMULATORS} accumulator vectors).
 *
 * @example
 * ```ts
 * import { conv2dGeometry, pool2dGeometry } from "../../geometry.ts";
 * import { pooledFilterProblem } from "./filter_pooled.ts";
 * const conv1 = conv2dGeometry([64, 1, 28, 28], [32, 1, 5, 5], { padding: 2 });
 * const pool = pool2dGeometry([64, 32, 28, 28], { kernel: 3, stride: 2 }, "maxPool2d");
 * pooledFilterProblem(conv1, pool); // undefined: 5 rows of 2 vectors
 * ```
 */
export function pooledFilterProblem(g: Conv2dGeometry, pool: Pool2dGeometry): string | undefined {
  if (
    pool.batch !== g.batch || pool.channels !== g.outChannels || pool.inHeight !== g.outHeight ||
    pool.inWidth !== g.outWidth
  ) {
    return "the pooling does not read the convolution's output";
  }
  const vectors = kernelVectors(g);
  if (g.kernelH > POOLED_FILTER_ROWS || vectors > POOLED_FILTER_VECTORS) {
    return `a ${g.kernelH}×${g.kernelW} filter is past the kernels' ${POOLED_FILTER_ROWS}×${
      4 * POOLED_FILTER_VECTORS
    }`;
  }
  if (g.kernelH * vectors > POOLED_FILTER_ACCUMULATORS) {
    return `a ${g.kernelH}×${g.kernelW} filter needs ${g.kernelH * vectors} accumulators`;
  }
  return undefined;
}

/** Padded plane: the padded input, and room for the last vector of a window at the last column. */
function paddedWidth(g: Conv2dGeometry): number {
  return Math.max(g.inWidth + 2 * g.padW, (g.outWidth - 1) * g.strideW + 4 * kernelVectors(g));
}

function paddedHeight(g: Conv2dGeometry): number {
  return g.inHeight + 2 * g.padH;
}

/**
 * Byte offset, in a padded input plane, of the patch under each output element's window (indexed
 * as the pooling's winners are: y · outWidth + x): the table the kernels read.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { pooledFilterOffsets } from "./filter_pooled.ts";
 * pooledFilterOffsets(conv2dGeometry([1, 1, 4, 4], [1, 1, 3, 3], { padding: 1 })); // 16 offsets, rows 32 bytes apart
 * ```
 */
export function pooledFilterOffsets(g: Conv2dGeometry): Int32Array {
  const offsets = new Int32Array(g.outHeight * g.outWidth), width = paddedWidth(g);
  for (let y = 0; y < g.outHeight; y++) {
    for (let x = 0; x < g.outWidth; x++) {
      offsets[y * g.outWidth + x] = 4 * (y * g.strideH * width + x * g.strideW);
    }
  }
  return offsets;
}

/**
 * Scratch bytes per thread: the padded planes of every input channel (a thread's filters may span
 * every group) and one accumulator tile per (filter, channel) of its share, at most all of them.
 */
export function pooledFilterScratchBytes(g: Conv2dGeometry): number {
  const planes = 4 * g.inChannels * paddedHeight(g) * paddedWidth(g);
  const tiles = 16 * g.outChannels * (g.inChannels / g.groups) * g.kernelH * kernelVectors(g);
  return ((planes + 63) & ~63) + tiles;
}

/** Where the operands lie (byte addresses) and whether the ReLU's mask and plane sums apply. */
export interface PooledFilterOperands {
  image: number;
  dy: number;
  argmax: number;
  reluOf: number;
  masked: boolean;
  weight: number;
  planeSums: number;
  summed: boolean;
  offsets: number;
}

/** The task threads receive: the convolution, its pooled plane size, the operands and scratch. */
export interface PooledFilterTask extends Conv2dGeometry, PooledFilterOperands {
  /** Pooled outputs per plane. */
  pooledOutputs: number;
  scratch: number;
  scratchStride: number;
}

/**
 * Filters [f0, f1) of the weight gradient (and, with plane sums, their planes' sums for every
 * image) from pooled planes of `outputs` gradients, using `scratch`
 * ({@link pooledFilterScratchBytes} bytes).
 */
export function convBackwardFilterPooled(
  x: KernelExports,
  g: Conv2dGeometry,
  outputs: number,
  at: PooledFilterOperands,
  f0: number,
  f1: number,
  scratch: number,
): void {
  if (f1 <= f0) return;
  const cinG = g.inChannels / g.groups, coutG = g.outChannels / g.groups;
  const Hp = paddedHeight(g), Wp = paddedWidth(g), vectors = kernelVectors(g);
  const taps = g.kernelH * g.kernelW;
  const kernel = x[pooledFilterExport(g.kernelH, vectors)];
  // Only the channels of the groups of filters [f0, f1) are padded; `padded` is where channel 0 would be.
  const c0 = Math.floor(f0 / coutG) * cinG, c1 = (Math.floor((f1 - 1) / coutG) + 1) * cinG;
  const planeBytes = 4 * Hp * Wp;
  const padded = scratch - c0 * planeBytes;
  const tiles = scratch + ((planeBytes * (c1 - c0) + 63) & ~63), tileBytes = 16 * g.kernelH * vectors;
  for (let n = 0; n < g.batch; n++) {
    padChannels(x, g, at.image, n, [c0, c1], scratch, Hp, Wp);
    const flags = (n > 0 ? PooledFilterFlags.resume : 0) | (at.masked ? PooledFilterFlags.masked : 0) |
      (n === g.batch - 1 ? PooledFilterFlags.store : 0);
    for (let f = f0; f < f1; f++) {
      const plane = 4 * (n * g.outChannels + f) * outputs;
      const first = Math.floor(f / coutG) * cinG;
      for (let c = 0; c < cinG; c++) {
        kernel(
          at.dy + plane,
          at.argmax + plane,
          // Unmasked, the kernel reads no pooled value: dy stands in as a valid address.
          (at.masked ? at.reluOf : at.dy) + plane,
          outputs,
          at.offsets,
          padded + (first + c) * planeBytes,
          4 * Wp,
          tiles + ((f - f0) * cinG + c) * tileBytes,
          flags | (at.summed && c === 0 ? PooledFilterFlags.sum : 0),
          at.planeSums + 4 * (n * g.outChannels + f),
          at.weight + 4 * (f * cinG + c) * taps,
          g.kernelW,
        );
      }
    }
  }
}
