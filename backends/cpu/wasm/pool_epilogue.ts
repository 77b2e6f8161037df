/**
 * Max pooling as the last step of a forward convolution (`conv2dForwardMaxPool`): the thread that
 * computes an image's output writes it into its own scratch instead of the output tensor, adds the
 * bias and applies the ReLU there, and pools it while it is in cache. The convolution's output
 * never reaches memory: the AlexNet-like net's conv1 wrote 6.4 MB per step that its pooling read
 * back. Both convolution paths (im2col and Winograd) share this file; the pooling kernel is the one
 * `maxPool2dForward` runs, one plane at a time, so values and winners are the same bits.
 *
 * @module
 */

import type { Pool2dGeometry } from "../../geometry.ts";
import type { KernelExports } from "./generate/module.ts";
import { align64 } from "./gemm.ts";

/** The pooling of a forward convolution, its outputs at byte addresses in kernel memory. */
export interface StagedPool {
  geometry: Pool2dGeometry;
  pooled: number;
  argmax: number;
}

/**
 * The task fields of the epilogue (appended to the convolution tasks' own): where the pooled output
 * and its winners go (`pooled` 0: no pooling), the offset of the image's output in each thread's
 * scratch, and the pooling window over the convolution's output planes.
 */
export const POOL_EPILOGUE_FIELDS = [
  "pooled",
  "argmax",
  "imageOutput",
  "poolOutHeight",
  "poolOutWidth",
  "poolKernelH",
  "poolKernelW",
  "poolStrideH",
  "poolStrideW",
  "poolPadH",
  "poolPadW",
] as const;

/** A convolution task's {@link POOL_EPILOGUE_FIELDS}. */
export type PoolEpilogue = Record<(typeof POOL_EPILOGUE_FIELDS)[number], number>;

/** The fields of a task without pooling. */
export const NO_POOLING: PoolEpilogue = Object.fromEntries(
  POOL_EPILOGUE_FIELDS.map((field) => [field, 0]),
) as PoolEpilogue;

/**
 * The fields that pool each image's output by `pool` into `pooled` and `argmax` (byte addresses),
 * the image's output kept at byte `imageOutput` of each thread's scratch.
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../../geometry.ts";
 * import { poolEpilogue } from "./pool_epilogue.ts";
 * const pool = pool2dGeometry([64, 32, 28, 28], { kernel: 3, stride: 2 }, "maxPool2d");
 * console.log(poolEpilogue(pool, 4096, 8192, 1024).poolOutHeight); // 14
 * ```
 */
export function poolEpilogue(
  pool: Pool2dGeometry,
  pooled: number,
  argmax: number,
  imageOutput: number,
): PoolEpilogue {
  return {
    pooled,
    argmax,
    imageOutput,
    poolOutHeight: pool.outHeight,
    poolOutWidth: pool.outWidth,
    poolKernelH: pool.kernelH,
    poolKernelW: pool.kernelW,
    poolStrideH: pool.strideH,
    poolStrideW: pool.strideW,
    poolPadH: pool.padH,
    poolPadW: pool.padW,
  };
}

/**
 * Each thread's scratch bytes, `scratchStride` without pooling, grown by room for one image's
 * output (`imageBytes`) when `pool` is given, and the task's epilogue fields.
 *
 * @example
 * ```ts
 * import { withPoolEpilogue } from "./pool_epilogue.ts";
 * console.log(withPoolEpilogue(1000, 4096).scratchStride); // 1000: no pooling, no room
 * ```
 */
export function withPoolEpilogue(
  scratchStride: number,
  imageBytes: number,
  pool?: StagedPool,
): { scratchStride: number; epilogue: PoolEpilogue } {
  if (!pool) return { scratchStride, epilogue: NO_POOLING };
  const imageOutput = align64(scratchStride);
  return {
    scratchStride: align64(imageOutput + imageBytes),
    epilogue: poolEpilogue(pool.geometry, pool.pooled, pool.argmax, imageOutput),
  };
}

/** Bytes of one image's convolution output: what each thread's scratch holds for the epilogue. */
export function imageOutputBytes(channels: number, height: number, width: number): number {
  return 4 * channels * height * width;
}

/**
 * Byte address image `n`'s convolution output is written to: with pooling, the thread's scratch
 * (`threadScratch`, this thread's block) at `imageOutput`; without, image `n` of the output `y`.
 */
export function imageOutputAt(
  task: PoolEpilogue,
  threadScratch: number,
  y: number,
  n: number,
  imageBytes: number,
): number {
  return task.pooled ? threadScratch + task.imageOutput : y + n * imageBytes;
}

/**
 * The epilogue of image `n`'s convolution output at `y` (`channels` planes of `height` × `width`),
 * while it is in cache: the bias (byte address, 0 for none) and the ReLU in one pass (`channel_bias`;
 * two passes, `add_channels` then `relu`, cost the AlexNet-like conv1 a fifth of its forward), then
 * the pooling, if any ({@link poolImage}). Both convolution paths end each image with it.
 */
export function finishImage(
  x: KernelExports,
  task: PoolEpilogue,
  n: number,
  y: number,
  bias: number,
  relu: boolean,
  channels: number,
  height: number,
  width: number,
): void {
  if (bias) x.channel_bias(y, bias, channels, height * width, relu ? 1 : 0);
  else if (relu) x.relu(y, y, channels * height * width);
  poolImage(x, task, n, y, channels, height, width);
}

/**
 * Pools image `n`'s convolution output at `source` (`channels` planes of `height` × `width`) into
 * image `n` of the pooled output and its winners; nothing without pooling.
 */
function poolImage(
  x: KernelExports,
  task: PoolEpilogue,
  n: number,
  source: number,
  channels: number,
  height: number,
  width: number,
): void {
  if (!task.pooled) return;
  const image = 4 * n * channels * task.poolOutHeight * task.poolOutWidth;
  x.max_pool_forward(
    source,
    task.pooled + image,
    task.argmax + image,
    channels,
    height,
    width,
    task.poolOutHeight,
    task.poolOutWidth,
    task.poolKernelH,
    task.poolKernelW,
    task.poolStrideH,
    task.poolStrideW,
    task.poolPadH,
    task.poolPadW,
  );
}
