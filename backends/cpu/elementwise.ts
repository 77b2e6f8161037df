/**
 * Elementwise, strided-copy and reduction kernels of the CPU backend over plain typed arrays.
 *
 * Strided loops walk an n-d index odometer-style, updating each operand's offset incrementally, so
 * broadcasting and views cost no index arithmetic per element beyond one add; dense inputs take a
 * flat loop.
 *
 * @module
 */

import type { BinaryOp, HostArray, ReduceOp, StridedView, UnaryOp } from "../backend.ts";
import { isDenseView } from "../geometry.ts";

type Unary = (x: number) => number;
type Binary = (a: number, b: number) => number;

const unaryFunctions: Record<UnaryOp, Unary> = {
  neg: (x) => -x,
  exp: Math.exp,
  log: Math.log,
  sqrt: Math.sqrt,
  relu: (x) => (x > 0 ? x : 0),
  abs: Math.abs,
  sign: (x) => (x > 0 ? 1 : x < 0 ? -1 : 0),
};

const binaryFunctions: Record<BinaryOp, Binary> = {
  add: (a, b) => a + b,
  sub: (a, b) => a - b,
  mul: (a, b) => a * b,
  div: (a, b) => a / b,
  pow: Math.pow,
  max: (a, b) => (a >= b ? a : b),
  equal: (a, b) => (a === b ? 1 : 0),
  greater: (a, b) => (a > b ? 1 : 0),
  reluGrad: (dy, y) => (y > 0 ? dy : 0),
};

/** `out[i] = op(x[i])`. */
export function unaryKernel(op: UnaryOp, x: Float32Array, out: Float32Array): void {
  const f = unaryFunctions[op];
  for (let i = 0; i < x.length; i++) out[i] = f(x[i]);
}

function isScalar(view: StridedView): boolean {
  return view.strides.every((s) => s === 0);
}

/** `out[i] = op(a[aView(i)], b[bView(i)])` over the index space `shape`; `out` is dense. */
export function binaryKernel(
  op: BinaryOp,
  a: Float32Array,
  aView: StridedView,
  b: Float32Array,
  bView: StridedView,
  out: Float32Array,
  shape: readonly number[],
): void {
  const f = binaryFunctions[op];
  const n = out.length;
  const aDense = isDenseView(aView, shape);
  const bDense = isDenseView(bView, shape);
  if (aDense && bDense) {
    const ao = aView.offset, bo = bView.offset;
    for (let i = 0; i < n; i++) out[i] = f(a[ao + i], b[bo + i]);
    return;
  }
  if (aDense && isScalar(bView)) {
    const ao = aView.offset, bv = b[bView.offset];
    for (let i = 0; i < n; i++) out[i] = f(a[ao + i], bv);
    return;
  }
  if (isScalar(aView) && bDense) {
    const av = a[aView.offset], bo = bView.offset;
    for (let i = 0; i < n; i++) out[i] = f(av, b[bo + i]);
    return;
  }
  // General case: iterate the innermost axis in a tight loop, advance outer axes as an odometer.
  const rank = shape.length;
  const inner = rank === 0 ? 1 : shape[rank - 1];
  const aInner = rank === 0 ? 0 : aView.strides[rank - 1];
  const bInner = rank === 0 ? 0 : bView.strides[rank - 1];
  const index = new Array<number>(rank).fill(0);
  let ai = aView.offset, bi = bView.offset;
  for (let o = 0; o < n; o += inner) {
    for (let j = 0, ap = ai, bp = bi; j < inner; j++, ap += aInner, bp += bInner) {
      out[o + j] = f(a[ap], b[bp]);
    }
    for (let d = rank - 2; d >= 0; d--) {
      index[d]++;
      ai += aView.strides[d];
      bi += bView.strides[d];
      if (index[d] < shape[d]) break;
      ai -= aView.strides[d] * shape[d];
      bi -= bView.strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

/** `dst[dstView(i)] = src[srcView(i)]` over the index space `shape`. */
export function copyStridedKernel(
  src: HostArray,
  srcView: StridedView,
  dst: HostArray,
  dstView: StridedView,
  shape: readonly number[],
): void {
  let n = 1;
  for (const d of shape) n *= d;
  if (n === 0) return;
  if (isDenseView(srcView, shape) && isDenseView(dstView, shape)) {
    dst.set(src.subarray(srcView.offset, srcView.offset + n), dstView.offset);
    return;
  }
  const rank = shape.length;
  const inner = shape[rank - 1];
  const sInner = srcView.strides[rank - 1];
  const dInner = dstView.strides[rank - 1];
  const index = new Array<number>(rank).fill(0);
  let si = srcView.offset, di = dstView.offset;
  for (let o = 0; o < n; o += inner) {
    if (sInner === 1 && dInner === 1) {
      dst.set(src.subarray(si, si + inner), di);
    } else {
      for (let j = 0, sp = si, dp = di; j < inner; j++, sp += sInner, dp += dInner) dst[dp] = src[sp];
    }
    for (let d = rank - 2; d >= 0; d--) {
      index[d]++;
      si += srcView.strides[d];
      di += dstView.strides[d];
      if (index[d] < shape[d]) break;
      si -= srcView.strides[d] * shape[d];
      di -= dstView.strides[d] * shape[d];
      index[d] = 0;
    }
  }
}

/**
 * Reduces the middle axis of a dense `[outer, size, inner]` array. Sums accumulate in float64 so
 * large reductions (a bias gradient over a whole batch) do not drift.
 */
export function reduceKernel(
  op: ReduceOp,
  x: Float32Array,
  out: Float32Array,
  outer: number,
  size: number,
  inner: number,
): void {
  if (inner === 1) {
    for (let o = 0; o < outer; o++) {
      const base = o * size;
      if (op === "sum") {
        let acc = 0;
        for (let s = 0; s < size; s++) acc += x[base + s];
        out[o] = acc;
      } else {
        let acc = -Infinity;
        for (let s = 0; s < size; s++) {
          const v = x[base + s];
          if (v > acc || v !== v) acc = v;
          if (acc !== acc) break;
        }
        out[o] = acc;
      }
    }
    return;
  }
  const row = new Float64Array(inner);
  for (let o = 0; o < outer; o++) {
    row.fill(op === "sum" ? 0 : -Infinity);
    for (let s = 0; s < size; s++) {
      const base = (o * size + s) * inner;
      if (op === "sum") {
        for (let i = 0; i < inner; i++) row[i] += x[base + i];
      } else {
        for (let i = 0; i < inner; i++) {
          const v = x[base + i];
          if (v > row[i] || v !== v) row[i] = v;
        }
      }
    }
    out.set(row, o * inner);
  }
}
