/**
 * The direct weight gradient of stride-1 convolutions that Winograd does not take (few input
 * channels, such as cifar10_quick's and the AlexNet-like net's conv1): `conv_filter_dot`
 * (`generate/filter_kernels.ts`) reads dy and zero-padded input planes as they lie, without the
 * GEMM's packing, which cost these layers as much as their multiply-adds.
 *
 * It keeps the weight gradient's contract (`convBackwardFilterRows` in `conv.ts`): a unit is a
 * range of column-matrix rows summed over a fixed chunk of images, each weight-gradient element
 * computed whole by one thread, so results do not depend on the thread count. Within a unit every
 * element sums its four lanes' partial sums (pixels by column mod 4, image after image) at the end.
 *
 * @module
 */

import type { Conv2dGeometry } from "../../geometry.ts";
import { isPointwise } from "../../geometry.ts";
import { channelsUnderRows, columnRows, type ConvOperands, padChannels, rowChannels } from "./conv.ts";
import type { KernelExports } from "./generate/module.ts";
import { winogradSide } from "./winograd/plan.ts";

/**
 * Whether a weight gradient runs directly: stride 1, not pointwise (that one reads the image as
 * its column matrix already), and not taken by Winograd.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { directFilter } from "./filter_direct.ts";
 * directFilter(conv2dGeometry([64, 3, 32, 32], [32, 3, 5, 5], { padding: 2 })); // true (cifar10_quick conv1)
 * directFilter(conv2dGeometry([64, 32, 16, 16], [32, 32, 5, 5], { padding: 2 })); // false: Winograd
 * ```
 */
export function directFilter(g: Conv2dGeometry): boolean {
  return g.strideH === 1 && g.strideW === 1 && !isPointwise(g) && winogradSide(g, "filter") === undefined;
}

/** Whole vectors per output row. */
function rowVectors(g: Conv2dGeometry): number {
  return Math.ceil(g.outWidth / 4);
}

/** Floats per padded input row: the padded width, and room for the last vector of the last tap. */
function planeWidth(g: Conv2dGeometry): number {
  return Math.max(g.inWidth + 2 * g.padW, g.kernelW - 1 + 4 * rowVectors(g));
}

function planeFloats(g: Conv2dGeometry): number {
  return (g.inHeight + 2 * g.padH) * planeWidth(g);
}

/** dy's rows are read in place when whole vectors; otherwise copied out to rows of whole vectors. */
function widenedOutput(g: Conv2dGeometry): boolean {
  return g.outWidth % 4 !== 0;
}

/**
 * Byte offset of each column-matrix row's tap (c, ki, kj) within padded planes of
 * {@link planeWidth}: the table `conv_filter_dot` reads (one int32 per row of every group).
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { directFilterTaps } from "./filter_direct.ts";
 * directFilterTaps(conv2dGeometry([1, 1, 4, 4], [1, 1, 2, 2])); // Int32Array [0, 4, 20, 24]: rows of 5 floats (4 + room for the last vector)
 * ```
 */
export function directFilterTaps(g: Conv2dGeometry): Int32Array {
  const Hp = g.inHeight + 2 * g.padH, Wq = planeWidth(g);
  const out = new Int32Array(columnRows(g));
  for (let c = 0, r = 0; c < g.inChannels; c++) {
    for (let ki = 0; ki < g.kernelH; ki++) {
      for (let kj = 0; kj < g.kernelW; kj++, r++) out[r] = 4 * ((c * Hp + ki) * Wq + kj);
    }
  }
  return out;
}

/**
 * Bytes of scratch one thread needs for units of `rows` column-matrix rows: the accumulators (a
 * vector per output and row), the padded planes of the channels under those rows, and dy's rows
 * widened to whole vectors where they are not.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { directFilterScratchBytes } from "./filter_direct.ts";
 * directFilterScratchBytes(conv2dGeometry([64, 3, 32, 32], [32, 3, 5, 5], { padding: 2 }), 75);
 * ```
 */
export function directFilterScratchBytes(g: Conv2dGeometry, rows: number): number {
  return scratchLayout(g, rows).bytes;
}

/**
 * Where, past a thread's scratch start, a unit of `rows` rows keeps its padded planes and widened dy
 * (the accumulators come first), and the bytes of the whole.
 */
function scratchLayout(g: Conv2dGeometry, rows: number): { planes: number; output: number; bytes: number } {
  const planes = 16 * rows * (g.outChannels / g.groups);
  const output = planes + ((4 * channelsUnderRows(g, rows) * planeFloats(g) + 15) & ~15);
  const widened = widenedOutput(g) ? 16 * g.outChannels * g.outHeight * rowVectors(g) : 0;
  return { planes, output, bytes: output + widened };
}

/**
 * Weight gradient restricted to column-matrix rows [r0, r1), summed over images [n0, n1) into
 * `at.weight` (overwriting those elements), as `convBackwardFilterRows` computes it but without
 * packing; `taps` is the address of {@link directFilterTaps}.
 *
 * @example
 * ```ts
 * import { convBackwardFilterDirect } from "./filter_direct.ts";
 * // convBackwardFilterDirect(kernels, geometry, { image: x, weight: dw, output: dy }, 0, 75, scratch, taps, [0, 8]);
 * ```
 */
export function convBackwardFilterDirect(
  x: KernelExports,
  g: Conv2dGeometry,
  at: ConvOperands,
  r0: number,
  r1: number,
  scratch: number,
  taps: number,
  [n0, n1]: readonly [number, number],
): void {
  if (r1 <= r0 || n1 <= n0) return;
  const cinG = g.inChannels / g.groups, coutG = g.outChannels / g.groups;
  const K = cinG * g.kernelH * g.kernelW, P = g.outHeight * g.outWidth;
  const Hp = g.inHeight + 2 * g.padH, Wq = planeWidth(g), vectors = rowVectors(g);
  const widened = widenedOutput(g);
  const layout = scratchLayout(g, r1 - r0);
  const accumulators = scratch, planes = scratch + layout.planes, output = scratch + layout.output;
  // Only the channels under rows [r0, r1) are padded; `padded` is where channel 0 would start.
  const [c0, c1] = rowChannels(g, r0, r1);
  const padded = planes - 4 * c0 * Hp * Wq;
  const dyRow = widened ? 16 * vectors : 4 * g.outWidth;
  const dyChannel = g.outHeight * dyRow;
  for (let n = n0; n < n1; n++) {
    padChannels(x, g, at.image, n, [c0, c1], planes, Hp, Wq);
    let dy = at.output + 4 * n * g.outChannels * P;
    if (widened) {
      // Whole vectors per row, zero past the row's end: those lanes meet padding on the input side.
      x.conv_pad(dy, output, g.outChannels, g.outHeight, g.outWidth, 0, 0, g.outHeight, 4 * vectors);
      dy = output;
    }
    for (let gi = Math.floor(r0 / K); gi * K < r1; gi++) {
      const start = Math.max(r0, gi * K), end = Math.min(r1, (gi + 1) * K);
      x.conv_filter_dot(
        dy + gi * coutG * dyChannel,
        dyChannel,
        dyRow,
        padded,
        taps + 4 * start,
        4 * Wq,
        coutG,
        end - start,
        g.outHeight,
        vectors,
        accumulators + 16 * (start - r0) * coutG,
        n === n0 ? 1 : 0,
        n === n1 - 1 ? 1 : 0,
        at.weight + 4 * (gi * coutG * K + start - gi * K),
        4 * K,
      );
    }
  }
}
