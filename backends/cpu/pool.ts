/**
 * 2-D max and average pooling on the CPU backend with Caffe semantics.
 *
 * Tensors are contiguous row-major float32 NCHW; `g` comes from `pool2dGeometry`, whose Caffe
 * rounding guarantees every window overlaps the input. Every entry point overwrites its output.
 *
 * @module
 */

import type { Pool2dGeometry } from "../geometry.ts";

function checkLength(op: string, name: string, a: ArrayLike<number>, expected: number): void {
  if (a.length !== expected) {
    throw new Error(`${op}: ${name} has ${a.length} elements, geometry expects ${expected}`);
  }
}

/**
 * Max pooling forward. `argmax[i]` receives the winner's index within its own input plane
 * (h·W + w, as Caffe's mask), so it fits Int32 whatever the batch size; windows are clipped to
 * the input, so padding never wins. A NaN in a window wins (and stays), so NaNs propagate.
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../geometry.ts";
 * const g = pool2dGeometry([1, 96, 55, 55], { kernel: 3, stride: 2 });
 * const x = new Float32Array(96 * 55 * 55).map(Math.random);
 * const n = g.batch * g.channels * g.outHeight * g.outWidth; // 96·27·27
 * const out = new Float32Array(n), argmax = new Int32Array(n);
 * maxPool2dForward(x, out, argmax, g);
 * ```
 */
export function maxPool2dForward(
  x: Float32Array,
  out: Float32Array,
  argmax: Int32Array,
  g: Pool2dGeometry,
): void {
  const { inHeight: H, inWidth: W, outHeight: OH, outWidth: OW } = g;
  const planes = g.batch * g.channels;
  checkLength("maxPool2d", "x", x, planes * H * W);
  checkLength("maxPool2d", "out", out, planes * OH * OW);
  checkLength("maxPool2d", "argmax", argmax, planes * OH * OW);
  // Window column ranges depend only on ow: computed once, not per plane and row.
  const colStart = new Int32Array(OW), colEnd = new Int32Array(OW);
  for (let ow = 0; ow < OW; ow++) {
    const w0 = ow * g.strideW - g.padW;
    colStart[ow] = Math.max(w0, 0);
    colEnd[ow] = Math.min(w0 + g.kernelW, W);
  }
  const plane = H * W;
  let o = 0;
  for (let p = 0; p < planes; p++) {
    const base = p * plane;
    for (let oh = 0; oh < OH; oh++) {
      const h0 = oh * g.strideH - g.padH;
      const hs = h0 > 0 ? h0 : 0, he = h0 + g.kernelH < H ? h0 + g.kernelH : H;
      for (let ow = 0; ow < OW; ow++, o++) {
        const ws = colStart[ow], we = colEnd[ow];
        let bestIdx = hs * W + ws;
        let best = x[base + bestIdx];
        for (let h = hs; h < he; h++) {
          const row = h * W;
          for (let w = ws; w < we; w++) {
            const v = x[base + row + w];
            // `v > best`, except that a NaN is taken and then kept, so NaNs propagate.
            if (v > best || (v !== v && best === best)) {
              best = v;
              bestIdx = row + w;
            }
          }
        }
        out[o] = best;
        argmax[o] = bestIdx;
      }
    }
  }
}

/**
 * Max pooling backward: routes each `dy` to its window's winner, summing where overlapping
 * windows share one; overwrites `dx` (`cleared`: the caller already zeroed it, e.g. with a memset).
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../geometry.ts";
 * const g = pool2dGeometry([1, 1, 4, 4], { kernel: 2, stride: 2 });
 * const x = new Float32Array(16).map((_, i) => i), y = new Float32Array(4), argmax = new Int32Array(4);
 * maxPool2dForward(x, y, argmax, g);
 * const dx = new Float32Array(16);
 * maxPool2dBackward(new Float32Array(4).fill(1), argmax, dx, g); // dx is 1 at 5, 7, 13, 15
 * ```
 */
export function maxPool2dBackward(
  dy: Float32Array,
  argmax: Int32Array,
  dx: Float32Array,
  g: Pool2dGeometry,
  cleared = false,
): void {
  const plane = g.inHeight * g.inWidth, outPlane = g.outHeight * g.outWidth;
  const planes = g.batch * g.channels;
  checkLength("maxPool2d", "dy", dy, planes * outPlane);
  checkLength("maxPool2d", "argmax", argmax, planes * outPlane);
  checkLength("maxPool2d", "dx", dx, planes * plane);
  if (!cleared) dx.fill(0);
  let o = 0;
  for (let p = 0; p < planes; p++) {
    const base = p * plane;
    for (let i = 0; i < outPlane; i++, o++) dx[base + argmax[o]] += dy[o];
  }
}

/**
 * Average pooling forward with Caffe's divisor: the window clipped to the padded extent
 * [−pad, in + pad) sets the divisor, while only its in-bounds part is summed (padding counts as zeros).
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../geometry.ts";
 * const g = pool2dGeometry([1, 32, 16, 16], { kernel: 3, stride: 2, padding: 1 }); // 9×9 out (ceil)
 * const x = new Float32Array(32 * 16 * 16).fill(1), out = new Float32Array(32 * 9 * 9);
 * avgPool2dForward(x, out, g); // out[0] === 4 / 9: the corner window is 2×2 real pixels of 3×3
 * ```
 */
export function avgPool2dForward(x: Float32Array, out: Float32Array, g: Pool2dGeometry): void {
  const { inHeight: H, inWidth: W, outHeight: OH, outWidth: OW } = g;
  const planes = g.batch * g.channels;
  checkLength("avgPool2d", "x", x, planes * H * W);
  checkLength("avgPool2d", "out", out, planes * OH * OW);
  let o = 0;
  for (let p = 0; p < planes; p++) {
    const base = p * H * W;
    for (let oh = 0; oh < OH; oh++) {
      const h0 = oh * g.strideH - g.padH;
      const h1 = Math.min(h0 + g.kernelH, H + g.padH);
      const hs = Math.max(h0, 0), he = Math.min(h1, H);
      for (let ow = 0; ow < OW; ow++, o++) {
        const w0 = ow * g.strideW - g.padW;
        const w1 = Math.min(w0 + g.kernelW, W + g.padW);
        const ws = Math.max(w0, 0), we = Math.min(w1, W);
        let sum = 0;
        for (let h = hs; h < he; h++) {
          for (let w = ws; w < we; w++) sum += x[base + h * W + w];
        }
        out[o] = sum / ((h1 - h0) * (w1 - w0));
      }
    }
  }
}

/**
 * Average pooling backward: spreads each `dy / divisor` over its window's in-bounds part;
 * overwrites `dx` (`cleared`: the caller already zeroed it).
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../geometry.ts";
 * const g = pool2dGeometry([1, 1, 4, 4], { kernel: 2, stride: 2 });
 * const dx = new Float32Array(16);
 * avgPool2dBackward(new Float32Array(4).fill(1), dx, g); // every dx is 1/4
 * ```
 */
export function avgPool2dBackward(
  dy: Float32Array,
  dx: Float32Array,
  g: Pool2dGeometry,
  cleared = false,
): void {
  const { inHeight: H, inWidth: W, outHeight: OH, outWidth: OW } = g;
  const planes = g.batch * g.channels;
  checkLength("avgPool2d", "dy", dy, planes * OH * OW);
  checkLength("avgPool2d", "dx", dx, planes * H * W);
  if (!cleared) dx.fill(0);
  let o = 0;
  for (let p = 0; p < planes; p++) {
    const base = p * H * W;
    for (let oh = 0; oh < OH; oh++) {
      const h0 = oh * g.strideH - g.padH;
      const h1 = Math.min(h0 + g.kernelH, H + g.padH);
      const hs = Math.max(h0, 0), he = Math.min(h1, H);
      for (let ow = 0; ow < OW; ow++, o++) {
        const w0 = ow * g.strideW - g.padW;
        const w1 = Math.min(w0 + g.kernelW, W + g.padW);
        const ws = Math.max(w0, 0), we = Math.min(w1, W);
        const share = dy[o] / ((h1 - h0) * (w1 - w0));
        for (let h = hs; h < he; h++) {
          for (let w = ws; w < we; w++) dx[base + h * W + w] += share;
        }
      }
    }
  }
}
