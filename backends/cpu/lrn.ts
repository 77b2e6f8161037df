/**
 * Caffe across-channel local response normalisation on the CPU backend.
 *
 * scale_c = k + (alpha/size)·Σ_{c' ∈ [c − ⌊size/2⌋, c + ⌊size/2⌋] ∩ [0, C)} x_{c'}²,  y = x·scale^(−beta)
 *
 * Both passes slide the channel window plane by plane: one running sum per pixel is updated by
 * adding the entering plane and subtracting the leaving one, so the cost is O(C) per pixel
 * whatever the size, and the inner loops stream over contiguous planes.
 *
 * @module
 */

import { checkLrn, type LrnParams } from "../geometry.ts";

/**
 * Running sums kept in float64: they are updated by subtraction, and in float32 the cancellation
 * error would drift along the channel axis.
 */
let accScratch = new Float64Array(0);

function accumulator(size: number): Float64Array {
  if (accScratch.length < size) accScratch = new Float64Array(size);
  accScratch.fill(0, 0, size);
  return accScratch;
}

function checkLength(name: string, a: ArrayLike<number>, expected: number): void {
  if (a.length !== expected) {
    throw new Error(`lrn: ${name} has ${a.length} elements, shape expects ${expected}`);
  }
}

/** s^(−beta); beta = 0.75 (every AlexNet/CaffeNet LRN) avoids Math.pow via two square roots. */
function negPow(s: number, beta: number): number {
  if (beta === 0.75) {
    const r = Math.sqrt(s);
    return 1 / (r * Math.sqrt(r));
  }
  return Math.pow(s, -beta);
}

/**
 * LRN forward: writes `out` and, for the backward pass, `scale` (both overwritten, same size as x).
 *
 * @example
 * ```ts
 * const shape = [2, 96, 13, 13], n = 2 * 96 * 13 * 13;
 * const x = new Float32Array(n).map(Math.random), out = new Float32Array(n), scale = new Float32Array(n);
 * lrnForward(x, out, scale, shape, { size: 5, alpha: 1e-4, beta: 0.75, k: 1 });
 * ```
 */
export function lrnForward(
  x: Float32Array,
  out: Float32Array,
  scale: Float32Array,
  shape: readonly number[],
  p: LrnParams,
): void {
  checkLrn(shape, p);
  const [N, C, H, W] = shape;
  const plane = H * W, total = N * C * plane;
  checkLength("x", x, total);
  checkLength("out", out, total);
  checkLength("scale", scale, total);
  const half = (p.size - 1) / 2, coef = p.alpha / p.size, { k, beta } = p;
  for (let n = 0; n < N; n++) {
    const img = n * C * plane;
    const acc = accumulator(plane);
    for (let c = 0; c < half && c < C; c++) {
      const src = img + c * plane;
      for (let i = 0; i < plane; i++) acc[i] += x[src + i] * x[src + i];
    }
    for (let c = 0; c < C; c++) {
      const enter = c + half, leave = c - half - 1;
      if (enter < C) {
        const src = img + enter * plane;
        for (let i = 0; i < plane; i++) acc[i] += x[src + i] * x[src + i];
      }
      if (leave >= 0) {
        const src = img + leave * plane;
        for (let i = 0; i < plane; i++) acc[i] -= x[src + i] * x[src + i];
      }
      const dst = img + c * plane;
      for (let i = 0; i < plane; i++) {
        // Clamp: subtraction may leave a tiny negative residue where the true sum is 0.
        const s = k + coef * Math.max(acc[i], 0);
        scale[dst + i] = s;
        out[dst + i] = x[dst + i] * negPow(s, beta);
      }
    }
  }
}

/**
 * LRN backward (Caffe's formula), overwriting `dx`:
 * dx_c = dy_c·scale_c^(−beta) − (2·alpha·beta/size)·x_c·Σ_{c' in window(c)} dy_{c'}·y_{c'}/scale_{c'}.
 * The window is symmetric (odd size), so window(c) also lists the channels whose scale uses x_c.
 *
 * @example
 * ```ts
 * const shape = [1, 8, 4, 4], n = 8 * 4 * 4, p = { size: 5, alpha: 1e-4, beta: 0.75, k: 1 };
 * const x = new Float32Array(n).map(Math.random), y = new Float32Array(n), scale = new Float32Array(n);
 * lrnForward(x, y, scale, shape, p);
 * const dy = new Float32Array(n).fill(1), dx = new Float32Array(n);
 * lrnBackward(x, y, scale, dy, dx, shape, p);
 * ```
 */
export function lrnBackward(
  x: Float32Array,
  y: Float32Array,
  scale: Float32Array,
  dy: Float32Array,
  dx: Float32Array,
  shape: readonly number[],
  p: LrnParams,
): void {
  checkLrn(shape, p);
  const [N, C, H, W] = shape;
  const plane = H * W, total = N * C * plane;
  for (const [name, a] of [["x", x], ["y", y], ["scale", scale], ["dy", dy], ["dx", dx]] as const) {
    checkLength(name, a, total);
  }
  const half = (p.size - 1) / 2, { beta } = p;
  const cross = (2 * p.alpha * beta) / p.size;
  for (let n = 0; n < N; n++) {
    const img = n * C * plane;
    const acc = accumulator(plane);
    for (let c = 0; c < half && c < C; c++) {
      const src = img + c * plane;
      for (let i = 0; i < plane; i++) acc[i] += (dy[src + i] * y[src + i]) / scale[src + i];
    }
    for (let c = 0; c < C; c++) {
      const enter = c + half, leave = c - half - 1;
      if (enter < C) {
        const src = img + enter * plane;
        for (let i = 0; i < plane; i++) acc[i] += (dy[src + i] * y[src + i]) / scale[src + i];
      }
      if (leave >= 0) {
        const src = img + leave * plane;
        for (let i = 0; i < plane; i++) acc[i] -= (dy[src + i] * y[src + i]) / scale[src + i];
      }
      const dst = img + c * plane;
      for (let i = 0; i < plane; i++) {
        const j = dst + i;
        dx[j] = dy[j] * negPow(scale[j], beta) - cross * x[j] * acc[i];
      }
    }
  }
}
