/**
 * Convolution over the generated kernels, lowered to GEMM per image and group exactly like the
 * TypeScript path (`../conv.ts`): im2col, one product per group, col2im for the input gradient.
 * Operands live in kernel memory (byte addresses); every function here handles one thread's share
 * of the work and is called the same way on the main thread and on pool threads.
 *
 * Shares never change what a thread computes for an element, so results do not depend on the
 * thread count: forward and input gradient split the batch (each image is computed whole by one
 * thread); the weight gradient sums fixed chunks of the batch (each in image order, by one thread,
 * into a partial of its own) and adds the partials in chunk order ({@link FILTER_CHUNKS}).
 *
 * @module
 */

import type { Conv2dGeometry } from "../../geometry.ts";
import { isPointwise } from "../../geometry.ts";
import { gemmBlocked, type GemmBlocks, gemmScratchBytes, packedABytes, packWholeA } from "./gemm.ts";
import type { KernelExports } from "./generate/module.ts";
import {
  finishImage,
  imageOutputAt,
  imageOutputBytes,
  NO_POOLING,
  type PoolEpilogue,
} from "./pool_epilogue.ts";

/**
 * Copies input channels [c0, c1) of image `n` into zero-bordered planes of `height` × `width` floats
 * at `dst` (the layer's padding above and to the left, the rest of each plane zero): what the direct
 * kernels read their windows from.
 */
export function padChannels(
  x: KernelExports,
  g: Conv2dGeometry,
  image: number,
  n: number,
  [c0, c1]: readonly [number, number],
  dst: number,
  height: number,
  width: number,
): void {
  const plane = g.inHeight * g.inWidth;
  x.conv_pad(
    image + 4 * (n * g.inChannels + c0) * plane,
    dst,
    c1 - c0,
    g.inHeight,
    g.inWidth,
    g.padH,
    g.padW,
    height,
    width,
  );
}

/**
 * Rows of one image's column matrix: one per (input channel, kernel row, kernel column).
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { columnRows } from "./conv.ts";
 * columnRows(conv2dGeometry([1, 3, 8, 8], [4, 3, 5, 5])); // 75
 * ```
 */
export function columnRows(g: Conv2dGeometry): number {
  return g.inChannels * g.kernelH * g.kernelW;
}

/**
 * Most input channels any `rows` consecutive column-matrix rows lie under (⌈rows / area⌉ + 1, at
 * most all): how many padded planes a weight-gradient unit of that many rows needs.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { channelsUnderRows } from "./conv.ts";
 * channelsUnderRows(conv2dGeometry([1, 8, 8, 8], [4, 8, 3, 3]), 10); // 3
 * ```
 */
export function channelsUnderRows(g: Conv2dGeometry, rows: number): number {
  return Math.min(g.inChannels, Math.ceil(rows / (g.kernelH * g.kernelW)) + 1);
}

/**
 * The input channels [c0, c1) under column-matrix rows [r0, r1): those a unit of the weight
 * gradient pads.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { rowChannels } from "./conv.ts";
 * rowChannels(conv2dGeometry([1, 8, 8, 8], [4, 8, 3, 3]), 8, 19); // [0, 3]
 * ```
 */
export function rowChannels(g: Conv2dGeometry, r0: number, r1: number): [number, number] {
  const area = g.kernelH * g.kernelW;
  return [Math.floor(r0 / area), Math.floor((r1 - 1) / area) + 1];
}

/**
 * Bytes of scratch one thread needs for a convolution pass in `blocks`: GEMM panels plus either
 * `rows` rows of the column matrix (input gradient, through col2im) or, with `paddedImage`
 * (forward, weight gradient), a zero-padded copy of the image's channels under those rows.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { DEFAULT_GEMM_BLOCKS } from "./gemm.ts";
 * import { convScratchBytes } from "./conv.ts";
 * convScratchBytes(conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], { padding: 1 }), 27, true, DEFAULT_GEMM_BLOCKS);
 * ```
 */
export function convScratchBytes(
  g: Conv2dGeometry,
  rows: number,
  paddedImage: boolean,
  blocks: GemmBlocks,
): number {
  return weightsOffset(g, rows, paddedImage, blocks) +
    (rows === columnRows(g) ? packedWeightsBytes(g, blocks) : 0);
}

/**
 * Where, past a thread's scratch start, the weights packed once per call lie (forward and input
 * gradient): after the GEMM panels and the padded image or column rows.
 */
function weightsOffset(g: Conv2dGeometry, rows: number, paddedImage: boolean, blocks: GemmBlocks): number {
  const padded = channelsUnderRows(g, rows) * (g.inHeight + 2 * g.padH) * (g.inWidth + 2 * g.padW) * 4;
  const columns = isPointwise(g)
    ? 0
    : paddedImage
    ? padded
    : ((rows * g.outHeight * g.outWidth * 4 + 63) & ~63) + paddedGradientBytes(g);
  return gemmScratchBytes(blocks) + ((columns + 63) & ~63);
}

/**
 * Floats per row of the padded planes a stride-1 input gradient sums its column matrix onto: the
 * padded width and a margin, so each of an output row's runs is whole vectors.
 */
function paddedGradientWidth(g: Conv2dGeometry): number {
  return g.kernelW - 1 + 4 * Math.ceil(g.outWidth / 4);
}

/** Bytes of those padded planes (0 where the input gradient sums onto dx itself: stride above 1). */
function paddedGradientBytes(g: Conv2dGeometry): number {
  if (g.strideH !== 1 || g.strideW !== 1 || isPointwise(g)) return 0;
  return 4 * g.inChannels * (g.inHeight + 2 * g.padH) * paddedGradientWidth(g) + 64;
}

/** Bytes of every group's weights packed as a GEMM's A, as W (forward) or Wᵀ (input gradient). */
function packedWeightsBytes(g: Conv2dGeometry, blocks: GemmBlocks): number {
  const K = columnRows(g) / g.groups, coutG = g.outChannels / g.groups;
  return g.groups * Math.max(packedABytes(coutG, K, blocks), packedABytes(K, coutG, blocks));
}

/**
 * Where each output pixel's window starts in a padded input plane (`(H + 2·padH) × (W + 2·padW)`):
 * the table {@link convForwardImages} packs columns from, one int32 per output pixel.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { windowOffsets } from "./conv.ts";
 * windowOffsets(conv2dGeometry([1, 1, 4, 4], [1, 1, 3, 3])); // Int32Array [0, 1, 6, 7]
 * ```
 */
export function windowOffsets(g: Conv2dGeometry): Int32Array {
  const paddedWidth = g.inWidth + 2 * g.padW;
  const out = new Int32Array(g.outHeight * g.outWidth);
  for (let oh = 0, j = 0; oh < g.outHeight; oh++) {
    for (let ow = 0; ow < g.outWidth; ow++, j++) out[j] = oh * g.strideH * paddedWidth + ow * g.strideW;
  }
  return out;
}

/**
 * Byte offset within a padded image (`C × (H + 2·padH) × (W + 2·padW)`) of each column-matrix row's
 * tap (c, ki, kj): the row table the forward pass packs columns with.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { rowOffsets } from "./conv.ts";
 * rowOffsets(conv2dGeometry([1, 2, 2, 2], [1, 2, 1, 2])); // Int32Array [0, 4, 16, 20]
 * ```
 */
export function rowOffsets(g: Conv2dGeometry): Int32Array {
  const Hp = g.inHeight + 2 * g.padH, Wp = g.inWidth + 2 * g.padW;
  const out = new Int32Array(columnRows(g));
  for (let c = 0, r = 0; c < g.inChannels; c++) {
    for (let ki = 0; ki < g.kernelH; ki++) {
      for (let kj = 0; kj < g.kernelW; kj++, r++) out[r] = 4 * ((c * Hp + ki) * Wp + kj);
    }
  }
  return out;
}

/**
 * The int32 tables the implicit-im2col packers read, one after the other: {@link windowOffsets}
 * (one per output pixel), then {@link rowOffsets} (one per column-matrix row).
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { packingTables } from "./conv.ts";
 * packingTables(conv2dGeometry([1, 1, 4, 4], [1, 1, 3, 3])).length; // 4 pixels + 9 rows
 * ```
 */
export function packingTables(g: Conv2dGeometry): Int32Array {
  const windows = windowOffsets(g), rows = rowOffsets(g);
  const out = new Int32Array(windows.length + rows.length);
  out.set(windows);
  out.set(rows, windows.length);
  return out;
}

/** Addresses of a convolution's operands in kernel memory. */
export interface ConvOperands {
  /** x (forward, weight gradient) or dx (input gradient). */
  image: number;
  /** Weights (forward, input gradient) or their gradient. */
  weight: number;
  /** y (forward) or dy (both gradients). */
  output: number;
  /** Forward: the `[outChannels]` bias each output channel adds, or 0 for none. */
  bias?: number;
  /** Forward: ReLU after the bias. */
  relu?: boolean;
}

/**
 * The next unit of work a thread takes (an image, or a weight-gradient chunk or row block): successive
 * calls by all the threads of one job return 0, 1, 2, … once each, then values past the last unit.
 * Whichever thread asks first takes the next unit, so a thread that runs slower (a busy core, a
 * late wake-up) takes fewer; which thread computes a unit never changes its bits.
 */
export type Claim = () => number;

/**
 * A {@link Claim} of units [u0, u1) for one thread alone: a static share.
 *
 * @example
 * ```ts
 * import { rangeClaim } from "./conv.ts";
 * const next = rangeClaim(2, 4);
 * [next(), next(), next() > 4]; // [2, 3, true]
 * ```
 */
export function rangeClaim(u0: number, u1: number): Claim {
  let next = u0;
  return () => (next < u1 ? next++ : Number.MAX_SAFE_INTEGER);
}

/**
 * The geometry arguments `conv_im2col` and `conv_col2im_add` take after their row range:
 * H, W, OH, OW, kh, kw, sH, sW, pH, pW.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { im2colArgs } from "./conv.ts";
 * im2colArgs(conv2dGeometry([1, 1, 4, 4], [1, 1, 3, 3])); // [4, 4, 2, 2, 3, 3, 1, 1, 0, 0]
 * ```
 */
export function im2colArgs(g: Conv2dGeometry): number[] {
  return [
    g.inHeight,
    g.inWidth,
    g.outHeight,
    g.outWidth,
    g.kernelH,
    g.kernelW,
    g.strideH,
    g.strideW,
    g.padH,
    g.padW,
  ];
}

/**
 * Forward pass of the images `next` hands out: y = w ⋆ x, overwriting their outputs. Each image is
 * copied once into a zero-padded plane set, and the GEMM packs its B panels straight from there
 * (implicit im2col, `offsets` the {@link packingTables} at that byte address): the column matrix
 * is never written. Pointwise convolutions read the image itself as the column matrix.
 *
 * @example
 * ```ts
 * import { convForwardImages } from "./conv.ts";
 * // convForwardImages(kernels, geometry, { image, weight, output }, rangeClaim(0, geometry.batch), scratch, offsets, blocks);
 * ```
 */
export function convForwardImages(
  x: KernelExports,
  g: Conv2dGeometry,
  at: ConvOperands,
  next: Claim,
  scratch: number,
  offsets: number,
  blocks: GemmBlocks,
  pool: PoolEpilogue = NO_POOLING,
): void {
  const P = g.outHeight * g.outWidth, plane = g.inHeight * g.inWidth;
  const cinG = g.inChannels / g.groups, coutG = g.outChannels / g.groups;
  const K = cinG * g.kernelH * g.kernelW;
  const pointwise = isPointwise(g);
  const padded = scratch + gemmScratchBytes(blocks);
  const Hp = g.inHeight + 2 * g.padH, Wp = g.inWidth + 2 * g.padW;
  const imageBytes = imageOutputBytes(g.outChannels, g.outHeight, g.outWidth);
  const problem = (n: number, gi: number) => ({
    m: coutG,
    n: P,
    k: K,
    a: at.weight + 4 * gi * coutG * K,
    lda: K,
    transA: false,
    b: at.image + 4 * (n * g.inChannels * plane + gi * K * P),
    ldb: P,
    transB: false,
    c: imageOutputAt(pool, scratch, at.output, n, imageBytes) + 4 * gi * coutG * P,
    ldc: P,
    accumulate: false,
  });
  // Every image multiplies by the same weights: packed once per group (by a thread that takes an
  // image), not once per image.
  const weights = scratch + weightsOffset(g, columnRows(g), true, blocks),
    slot = packedABytes(coutG, K, blocks);
  for (let n = next(), first = true; n < g.batch; n = next(), first = false) {
    if (first) {
      for (let gi = 0; gi < g.groups; gi++) packWholeA(x, problem(n, gi), weights + gi * slot, blocks);
    }
    if (!pointwise) padChannels(x, g, at.image, n, [0, g.inChannels], padded, Hp, Wp);
    for (let gi = 0; gi < g.groups; gi++) {
      const packColumns = pointwise
        ? undefined
        : (pc: number, kc: number, jc: number, nc: number, dst: number) => {
          x.conv_pack_columns(padded, dst, gi * K + pc, kc, jc, nc, offsets, offsets + 4 * P);
        };
      gemmBlocked(x, problem(n, gi), scratch, blocks, packColumns, weights + gi * slot);
    }
    // The bias, the ReLU and any pooling in the epilogue, while this image's output is in cache.
    const y = imageOutputAt(pool, scratch, at.output, n, imageBytes);
    finishImage(x, pool, n, y, at.bias ?? 0, at.relu ?? false, g.outChannels, g.outHeight, g.outWidth);
  }
}

/**
 * Input gradient of the images `next` hands out: dx = wᵀ ⋆ dy through col2im, overwriting their dx.
 *
 * @example
 * ```ts
 * import { convBackwardInputImages } from "./conv.ts";
 * // convBackwardInputImages(kernels, geometry, { image: dx, weight, output: dy }, rangeClaim(0, geometry.batch), scratch, blocks);
 * ```
 */
export function convBackwardInputImages(
  x: KernelExports,
  g: Conv2dGeometry,
  at: ConvOperands,
  next: Claim,
  scratch: number,
  blocks: GemmBlocks,
): void {
  const P = g.outHeight * g.outWidth, plane = g.inHeight * g.inWidth;
  const cinG = g.inChannels / g.groups, coutG = g.outChannels / g.groups;
  const K = cinG * g.kernelH * g.kernelW;
  const pointwise = isPointwise(g);
  const col = scratch + gemmScratchBytes(blocks);
  // Stride 1: the padded planes after the column matrix (see paddedGradientBytes).
  const Hp = g.inHeight + 2 * g.padH, Wq = paddedGradientWidth(g);
  const dxPadded = paddedGradientBytes(g) > 0 ? col + ((4 * columnRows(g) * P + 63) & ~63) : 0;
  const problem = (n: number, gi: number, columns: number) => ({
    m: K,
    n: P,
    k: coutG,
    a: at.weight + 4 * gi * coutG * K,
    lda: K,
    transA: true,
    b: at.output + 4 * (n * g.outChannels + gi * coutG) * P,
    ldb: P,
    transB: false,
    c: columns + 4 * gi * K * P,
    ldc: P,
    accumulate: false,
  });
  // Every image multiplies by the same transposed weights: packed once per group.
  const weights = scratch + weightsOffset(g, columnRows(g), false, blocks),
    slot = packedABytes(K, coutG, blocks);
  for (let n = next(), first = true; n < g.batch; n = next(), first = false) {
    if (first) {
      for (let gi = 0; gi < g.groups; gi++) packWholeA(x, problem(n, gi, col), weights + gi * slot, blocks);
    }
    const image = at.image + 4 * n * g.inChannels * plane;
    // Pointwise: the column matrix is dx itself, each group's product writes its own channels.
    const columns = pointwise ? image : col;
    for (let gi = 0; gi < g.groups; gi++) {
      gemmBlocked(x, problem(n, gi, columns), scratch, blocks, undefined, weights + gi * slot);
    }
    if (dxPadded) {
      // Whole-vector runs onto padded planes, then their middle out: the same sums in the same order.
      x.fill_zero(dxPadded, 4 * g.inChannels * Hp * Wq);
      const rowBytes = 4 * Wq;
      x.conv_col2im_padded(
        dxPadded,
        col,
        columnRows(g),
        g.outHeight,
        g.outWidth,
        g.kernelH,
        g.kernelW,
        Hp * rowBytes,
        rowBytes,
      );
      x.conv_unpad(dxPadded, image, g.inChannels, g.inHeight, g.inWidth, g.padH, g.padW, Hp, Wq);
    } else if (!pointwise) {
      x.fill_zero(image, 4 * g.inChannels * plane);
      x.conv_col2im_add(image, col, 0, columnRows(g), ...im2colArgs(g));
    }
  }
}

/**
 * Most image chunks a weight gradient is split into ({@link filterChunks}). Each chunk sums its
 * images' products into a partial gradient of its own, and {@link addFilterChunks} adds the
 * partials in chunk order, so threads can take whole chunks (every row of the column matrix) and
 * pad, pack and multiply each image once; splitting the rows instead made every row block pad
 * the images and pack dy again, and 2 threads ran cifar10_quick's weight gradients only 1.2–1.4×
 * as fast as one. The chunks depend on the batch alone, never on the thread count, so neither
 * do the bits.
 */
export const FILTER_CHUNKS = 8;

/**
 * Image chunks of a weight gradient: {@link FILTER_CHUNKS}, or one per image for smaller batches.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { filterChunks } from "./conv.ts";
 * filterChunks(conv2dGeometry([64, 3, 8, 8], [4, 3, 3, 3])); // 8
 * ```
 */
export function filterChunks(g: Conv2dGeometry): number {
  return Math.max(1, Math.min(FILTER_CHUNKS, g.batch));
}

/**
 * Images [n0, n1) of chunk `chunk` of a weight gradient: the batch cut as evenly as it goes.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { filterChunkImages } from "./conv.ts";
 * filterChunkImages(conv2dGeometry([20, 3, 8, 8], [4, 3, 3, 3]), 1); // [2, 5]
 * ```
 */
export function filterChunkImages(g: Conv2dGeometry, chunk: number): [number, number] {
  return imagePart(g.batch, filterChunks(g), chunk);
}

/**
 * Images [n0, n1) of part `part` when `images` are cut into `parts` as evenly as they go: the
 * im2col weight gradient's chunks ({@link filterChunkImages}) and the Winograd one's parts.
 *
 * @example
 * ```ts
 * import { imagePart } from "./conv.ts";
 * imagePart(20, 8, 1); // [2, 5]
 * ```
 */
export function imagePart(images: number, parts: number, part: number): [number, number] {
  return [Math.floor((part * images) / parts), Math.floor(((part + 1) * images) / parts)];
}

/**
 * Bytes of the partial gradients of chunks 1, 2, … (chunk 0 sums into the weight gradient itself).
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { filterPartialsBytes } from "./conv.ts";
 * filterPartialsBytes(conv2dGeometry([2, 3, 8, 8], [4, 3, 3, 3])); // one partial of 108 floats
 * ```
 */
export function filterPartialsBytes(g: Conv2dGeometry): number {
  return 4 * (filterChunks(g) - 1) * weightFloats(g);
}

/** Where chunk `chunk`'s partial weight gradient lies: the gradient itself for chunk 0. */
export function filterChunkTarget(
  g: Conv2dGeometry,
  weight: number,
  partials: number,
  chunk: number,
): number {
  return chunk === 0 ? weight : partials + 4 * (chunk - 1) * weightFloats(g);
}

/**
 * Adds the partials of chunks 1, 2, … into the weight gradient at `weight`, in chunk order (each
 * addition rounded to float32): the last step of a weight gradient, once every chunk is done.
 *
 * @example
 * ```ts
 * import { addFilterChunks } from "./conv.ts";
 * // addFilterChunks(kernels, geometry, dw, partials);
 * ```
 */
export function addFilterChunks(x: KernelExports, g: Conv2dGeometry, weight: number, partials: number): void {
  for (let chunk = 1; chunk < filterChunks(g); chunk++) {
    x.add_scale(weight, filterChunkTarget(g, weight, partials, chunk), weight, weightFloats(g), 1);
  }
}

function weightFloats(g: Conv2dGeometry): number {
  return g.outChannels * columnRows(g) / g.groups;
}

/**
 * Weight gradient restricted to column-matrix rows [r0, r1) (weight-gradient columns of the
 * groups those rows belong to), summed over images [n0, n1) in image order into `at.weight`;
 * overwrites them. Each image's channels under those rows are copied once into zero-padded planes,
 * and the GEMM packs its B panels (rows × pixels) straight from there; pointwise convolutions read
 * the image.
 *
 * @example
 * ```ts
 * import { columnRows, convBackwardFilterRows } from "./conv.ts";
 * // convBackwardFilterRows(kernels, geometry, { image: x, weight: dw, output: dy }, 0, columnRows(geometry), scratch, offsets, blocks);
 * ```
 */
export function convBackwardFilterRows(
  x: KernelExports,
  g: Conv2dGeometry,
  at: ConvOperands,
  r0: number,
  r1: number,
  scratch: number,
  offsets: number,
  blocks: GemmBlocks,
  [n0, n1]: readonly [number, number] = [0, g.batch],
): void {
  if (r1 <= r0 || n1 <= n0) return;
  const gemmScratch = gemmScratchBytes(blocks);
  const P = g.outHeight * g.outWidth, plane = g.inHeight * g.inWidth;
  const cinG = g.inChannels / g.groups, coutG = g.outChannels / g.groups;
  const area = g.kernelH * g.kernelW, K = cinG * area;
  const pointwise = isPointwise(g);
  const Hp = g.inHeight + 2 * g.padH, Wp = g.inWidth + 2 * g.padW;
  // Only the channels under rows [r0, r1) are padded; `padded` is where channel 0 would start.
  const [c0, c1] = rowChannels(g, r0, r1);
  const padded = scratch + gemmScratch - 4 * c0 * Hp * Wp;
  for (let n = n0; n < n1; n++) {
    const image = at.image + 4 * n * g.inChannels * plane;
    if (!pointwise) padChannels(x, g, at.image, n, [c0, c1], scratch + gemmScratch, Hp, Wp);
    for (let gi = Math.floor(r0 / K); gi * K < r1; gi++) {
      const start = Math.max(r0, gi * K), end = Math.min(r1, (gi + 1) * K);
      const problem = {
        m: coutG,
        n: end - start,
        k: P,
        a: at.output + 4 * (n * g.outChannels + gi * coutG) * P,
        lda: P,
        transA: false,
        // Pointwise: column-matrix row r is input channel r, P floats.
        b: image + 4 * start * P,
        ldb: P,
        transB: true,
        c: at.weight + 4 * (gi * coutG * K + start - gi * K),
        ldc: K,
        // The first image overwrites, so dw needs no clearing.
        accumulate: n > n0,
      };
      if (pointwise) {
        gemmBlocked(x, problem, scratch, blocks);
        continue;
      }
      gemmBlocked(x, problem, scratch, blocks, (pc, kc, jc, nc, dst) => {
        x.conv_pack_rows(padded, dst, start + jc, nc, pc, kc, offsets, g.kernelH, g.kernelW, Hp * Wp, Wp);
      });
    }
  }
}
