/**
 * 2-D convolution on the CPU backend, lowered to GEMM through im2col / col2im.
 *
 * Tensors are contiguous row-major float32: x [N, C, H, W], weights [outC, C/groups, kH, kW],
 * output [N, outC, OH, OW]. No bias here (the layer adds it separately). Every entry point
 * overwrites its output.
 *
 * Per image and group g, with K = (C/groups)·kH·kW and P = OH·OW:
 *  - forward:          Y_g [outC/g × P] = W_g [outC/g × K] · col_g [K × P]
 *  - backward-input:   col_g = W_gᵀ · dY_g, then col2im scatters col back onto dX
 *  - backward-filter:  dW_g += dY_g · col_gᵀ, summed over the batch
 *
 * The column matrix of a whole image is built at once: its rows are ordered (c, ki, kj), so the
 * rows of group g are one contiguous block and each group's GEMM needs only an offset.
 *
 * @module
 */

import { type Conv2dGeometry, isPointwise } from "../geometry.ts";
import type { Activation } from "../backend.ts";
import { unaryKernel } from "./elementwise.ts";
import { gemm } from "./gemm.ts";

/**
 * One column buffer reused across calls: im2col of a large layer is megabytes, and allocating it
 * per call (or per image) would churn the GC in the training loop. Kernels are synchronous, so
 * sharing is safe.
 */
let colScratch = new Float32Array(0);

function scratch(size: number): Float32Array {
  if (colScratch.length < size) colScratch = new Float32Array(size);
  return colScratch;
}

function checkLength(name: string, a: ArrayLike<number>, expected: number): void {
  if (a.length !== expected) {
    throw new Error(`conv2d: ${name} has ${a.length} elements, geometry expects ${expected}`);
  }
}

/**
 * Output columns [lo, hi) whose input column ow·sW − pW + kj lies inside the image; computed once
 * per kernel column so the copy loops carry no bounds test.
 */
function validRange(kj: number, g: Conv2dGeometry): [number, number] {
  const lo = Math.max(0, Math.ceil((g.padW - kj) / g.strideW));
  const hi = Math.min(g.outWidth, Math.floor((g.inWidth - 1 + g.padW - kj) / g.strideW) + 1);
  return [lo, Math.max(lo, hi)];
}

/** Unfolds image `x[xOff ..]` into `col` [C·kH·kW × OH·OW], zero where the window hits padding. */
function im2col(x: Float32Array, xOff: number, col: Float32Array, g: Conv2dGeometry): void {
  const { inChannels, inHeight: H, inWidth: W, kernelH, kernelW, strideH, strideW, padH, padW } = g;
  const OH = g.outHeight, OW = g.outWidth;
  let dst = 0;
  for (let c = 0; c < inChannels; c++) {
    const plane = xOff + c * H * W;
    for (let ki = 0; ki < kernelH; ki++) {
      for (let kj = 0; kj < kernelW; kj++) {
        const [lo, hi] = validRange(kj, g);
        const colShift = kj - padW;
        for (let oh = 0; oh < OH; oh++) {
          const ih = oh * strideH - padH + ki;
          if (ih < 0 || ih >= H) {
            col.fill(0, dst, dst + OW);
            dst += OW;
            continue;
          }
          const src = plane + ih * W + colShift;
          let ow = 0;
          for (; ow < lo; ow++) col[dst + ow] = 0;
          if (strideW === 1) {
            for (; ow < hi; ow++) col[dst + ow] = x[src + ow];
          } else {
            for (; ow < hi; ow++) col[dst + ow] = x[src + ow * strideW];
          }
          for (; ow < OW; ow++) col[dst + ow] = 0;
          dst += OW;
        }
      }
    }
  }
}

/** Adjoint of im2col: adds every column entry onto the input pixel it was read from. */
function col2imAdd(col: Float32Array, dx: Float32Array, dxOff: number, g: Conv2dGeometry): void {
  const { inChannels, inHeight: H, inWidth: W, kernelH, kernelW, strideH, strideW, padH, padW } = g;
  const OH = g.outHeight, OW = g.outWidth;
  let srcRow = 0;
  for (let c = 0; c < inChannels; c++) {
    const plane = dxOff + c * H * W;
    for (let ki = 0; ki < kernelH; ki++) {
      for (let kj = 0; kj < kernelW; kj++) {
        const [lo, hi] = validRange(kj, g);
        const colShift = kj - padW;
        for (let oh = 0; oh < OH; oh++, srcRow += OW) {
          const ih = oh * strideH - padH + ki;
          if (ih < 0 || ih >= H) continue;
          const dst = plane + ih * W + colShift;
          if (strideW === 1) {
            for (let ow = lo; ow < hi; ow++) dx[dst + ow] += col[srcRow + ow];
          } else {
            for (let ow = lo; ow < hi; ow++) dx[dst + ow * strideW] += col[srcRow + ow];
          }
        }
      }
    }
  }
}

/**
 * Convolution forward: `out` [N, outC, OH, OW] = x ⋆ w [+ bias], overwriting `out`; with
 * `activation` `"relu"` then `x > 0 ? x : 0` (the `relu` unary's bits), per image while it is in cache.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../geometry.ts";
 * const g = conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], { padding: 1 });
 * const x = new Float32Array(1 * 3 * 8 * 8).fill(1), w = new Float32Array(4 * 3 * 3 * 3).fill(1);
 * const out = new Float32Array(g.batch * g.outChannels * g.outHeight * g.outWidth);
 * conv2dForward(x, w, out, g); // out[9] (an interior pixel) === 27
 * ```
 */
export function conv2dForward(
  x: Float32Array,
  w: Float32Array,
  out: Float32Array,
  g: Conv2dGeometry,
  bias?: Float32Array,
  activation?: Activation,
): void {
  const { batch, inChannels, outChannels, groups } = g;
  const inPlane = g.inHeight * g.inWidth, P = g.outHeight * g.outWidth;
  const cinG = inChannels / groups, coutG = outChannels / groups;
  const K = cinG * g.kernelH * g.kernelW;
  checkLength("x", x, batch * inChannels * inPlane);
  checkLength("w", w, outChannels * K);
  checkLength("out", out, batch * outChannels * P);
  const pointwise = isPointwise(g);
  const col = pointwise ? x : scratch(inChannels * g.kernelH * g.kernelW * P);
  for (let n = 0; n < batch; n++) {
    const xOff = n * inChannels * inPlane;
    if (!pointwise) im2col(x, xOff, col, g);
    const colBase = pointwise ? xOff : 0;
    for (let gi = 0; gi < groups; gi++) {
      gemm({
        m: coutG,
        n: P,
        k: K,
        a: w,
        aOffset: gi * coutG * K,
        transA: false,
        b: col,
        bOffset: colBase + gi * K * P,
        transB: false,
        c: out,
        cOffset: (n * outChannels + gi * coutG) * P,
        accumulate: false,
      });
    }
    if (bias) addBias(out, n * outChannels * P, bias, P);
    if (activation === "relu") {
      const image = out.subarray(n * outChannels * P, (n + 1) * outChannels * P);
      unaryKernel("relu", image, image);
    }
  }
}

/** `out[c, p] += bias[c]` over one image's `bias.length` planes of `P` pixels (float32 rounding). */
function addBias(out: Float32Array, offset: number, bias: Float32Array, P: number): void {
  for (let c = 0; c < bias.length; c++) {
    const b = bias[c];
    for (let i = offset + c * P, end = i + P; i < end; i++) out[i] += b;
  }
}

/**
 * Convolution backward with respect to the input: `dx` = ∂L/∂x given `dy` = ∂L/∂out, overwriting `dx`.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../geometry.ts";
 * const g = conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], { padding: 1 });
 * const w = new Float32Array(4 * 3 * 3 * 3).fill(1), dy = new Float32Array(4 * 8 * 8).fill(1);
 * const dx = new Float32Array(3 * 8 * 8);
 * conv2dBackwardInput(dy, w, dx, g);
 * ```
 */
export function conv2dBackwardInput(
  dy: Float32Array,
  w: Float32Array,
  dx: Float32Array,
  g: Conv2dGeometry,
): void {
  const { batch, inChannels, outChannels, groups } = g;
  const inPlane = g.inHeight * g.inWidth, P = g.outHeight * g.outWidth;
  const cinG = inChannels / groups, coutG = outChannels / groups;
  const K = cinG * g.kernelH * g.kernelW;
  checkLength("dy", dy, batch * outChannels * P);
  checkLength("w", w, outChannels * K);
  checkLength("dx", dx, batch * inChannels * inPlane);
  const pointwise = isPointwise(g);
  // Pointwise: the column matrix is dx itself, and each group's GEMM writes its own channel block.
  const col = pointwise ? dx : scratch(inChannels * g.kernelH * g.kernelW * P);
  if (!pointwise) dx.fill(0);
  for (let n = 0; n < batch; n++) {
    const xOff = n * inChannels * inPlane;
    const colBase = pointwise ? xOff : 0;
    for (let gi = 0; gi < groups; gi++) {
      gemm({
        m: K,
        n: P,
        k: coutG,
        a: w,
        aOffset: gi * coutG * K,
        transA: true,
        b: dy,
        bOffset: (n * outChannels + gi * coutG) * P,
        transB: false,
        c: col,
        cOffset: colBase + gi * K * P,
        accumulate: false,
      });
    }
    if (!pointwise) col2imAdd(col, dx, xOff, g);
  }
}

/**
 * Convolution backward with respect to the weights: `dw` = ∂L/∂w summed over the batch, overwriting `dw`.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../geometry.ts";
 * const g = conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], { padding: 1 });
 * const x = new Float32Array(3 * 8 * 8).fill(1), dy = new Float32Array(4 * 8 * 8).fill(1);
 * const dw = new Float32Array(4 * 3 * 3 * 3);
 * conv2dBackwardFilter(x, dy, dw, g);
 * ```
 */
export function conv2dBackwardFilter(
  x: Float32Array,
  dy: Float32Array,
  dw: Float32Array,
  g: Conv2dGeometry,
): void {
  const { batch, inChannels, outChannels, groups } = g;
  const inPlane = g.inHeight * g.inWidth, P = g.outHeight * g.outWidth;
  const cinG = inChannels / groups, coutG = outChannels / groups;
  const K = cinG * g.kernelH * g.kernelW;
  checkLength("x", x, batch * inChannels * inPlane);
  checkLength("dy", dy, batch * outChannels * P);
  checkLength("dw", dw, outChannels * K);
  const pointwise = isPointwise(g);
  const col = pointwise ? x : scratch(inChannels * g.kernelH * g.kernelW * P);
  for (let n = 0; n < batch; n++) {
    const xOff = n * inChannels * inPlane;
    if (!pointwise) im2col(x, xOff, col, g);
    const colBase = pointwise ? xOff : 0;
    for (let gi = 0; gi < groups; gi++) {
      gemm({
        m: coutG,
        n: K,
        k: P,
        a: dy,
        aOffset: (n * outChannels + gi * coutG) * P,
        transA: false,
        b: col,
        bOffset: colBase + gi * K * P,
        transB: true,
        c: dw,
        cOffset: gi * coutG * K,
        // The first image overwrites, so dw needs no separate clearing.
        accumulate: n > 0,
      });
    }
  }
}
