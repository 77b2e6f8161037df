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

/**
 * `out = (inputs[0] + … + inputs[N−1]) · fround(1/N)`: summed in index order, one float32 rounding
 * per operation, no scaling for one input (the device-order average of data-parallel gradients).
 */
export function averageKernel(inputs: readonly Float32Array[], out: Float32Array): void {
  const n = inputs.length, length = out.length;
  if (n === 1) {
    out.set(inputs[0]);
    return;
  }
  const scale = Math.fround(1 / n);
  if (n === 2) {
    // The common case, without the inner loop over inputs.
    const [a, b] = inputs;
    for (let i = 0; i < length; i++) out[i] = Math.fround(a[i] + b[i]) * scale;
    return;
  }
  for (let i = 0; i < length; i++) {
    let sum = inputs[0][i];
    for (let d = 1; d < n; d++) sum = Math.fround(sum + inputs[d][i]);
    out[i] = sum * scale;
  }
}

/** `out[i] = op(x[i])`. The common ops run as their own loops, so V8 inlines the arithmetic. */
export function unaryKernel(op: UnaryOp, x: Float32Array, out: Float32Array): void {
  const n = x.length;
  switch (op) {
    case "relu":
      for (let i = 0; i < n; i++) {
        const v = x[i];
        out[i] = v > 0 ? v : 0;
      }
      return;
    case "neg":
      for (let i = 0; i < n; i++) out[i] = -x[i];
      return;
    case "exp":
      for (let i = 0; i < n; i++) out[i] = Math.exp(x[i]);
      return;
    default: {
      const f = unaryFunctions[op];
      for (let i = 0; i < n; i++) out[i] = f(x[i]);
    }
  }
}

/**
 * Merges adjacent axes that every view walks as one (stride of the outer = stride × size of the
 * inner, which includes broadcast axes with stride 0 on both) and drops size-1 axes, so a bias
 * broadcast over [N, C, H, W] becomes [N, C, H·W] with a long inner run.
 */
function collapseAxes(
  shape: readonly number[],
  views: readonly StridedView[],
): { shape: number[]; strides: number[][] } {
  const outShape: number[] = [];
  const strides: number[][] = views.map(() => []);
  for (let d = 0; d < shape.length; d++) {
    if (shape[d] === 1) continue;
    const last = outShape.length - 1;
    const mergeable = last >= 0 &&
      views.every((v, i) => strides[i][last] === v.strides[d] * shape[d]);
    if (mergeable) {
      outShape[last] *= shape[d];
      views.forEach((v, i) => (strides[i][last] = v.strides[d]));
    } else {
      outShape.push(shape[d]);
      views.forEach((v, i) => strides[i].push(v.strides[d]));
    }
  }
  return { shape: outShape, strides };
}

/** `out[o + j] = op(a[ai + j], b[bi + j])` for j < n. */
function binaryDenseRun(
  op: BinaryOp,
  a: Float32Array,
  ai: number,
  b: Float32Array,
  bi: number,
  out: Float32Array,
  o: number,
  n: number,
): void {
  switch (op) {
    case "add":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] + b[bi + j];
      return;
    case "sub":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] - b[bi + j];
      return;
    case "mul":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] * b[bi + j];
      return;
    case "div":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] / b[bi + j];
      return;
    case "reluGrad":
      for (let j = 0; j < n; j++) out[o + j] = b[bi + j] > 0 ? a[ai + j] : 0;
      return;
    default: {
      const f = binaryFunctions[op];
      for (let j = 0; j < n; j++) out[o + j] = f(a[ai + j], b[bi + j]);
    }
  }
}

/** `out[o + j] = op(a[ai + j], bv)` for j < n: b broadcast along the run. */
function binaryDenseScalarRun(
  op: BinaryOp,
  a: Float32Array,
  ai: number,
  bv: number,
  out: Float32Array,
  o: number,
  n: number,
): void {
  switch (op) {
    case "add":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] + bv;
      return;
    case "sub":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] - bv;
      return;
    case "mul":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] * bv;
      return;
    case "div":
      for (let j = 0; j < n; j++) out[o + j] = a[ai + j] / bv;
      return;
    default: {
      const f = binaryFunctions[op];
      for (let j = 0; j < n; j++) out[o + j] = f(a[ai + j], bv);
    }
  }
}

/** `out[o + j] = op(av, b[bi + j])` for j < n: a broadcast along the run. */
function binaryScalarDenseRun(
  op: BinaryOp,
  av: number,
  b: Float32Array,
  bi: number,
  out: Float32Array,
  o: number,
  n: number,
): void {
  switch (op) {
    case "add":
      for (let j = 0; j < n; j++) out[o + j] = av + b[bi + j];
      return;
    case "sub":
      for (let j = 0; j < n; j++) out[o + j] = av - b[bi + j];
      return;
    case "mul":
      for (let j = 0; j < n; j++) out[o + j] = av * b[bi + j];
      return;
    default: {
      const f = binaryFunctions[op];
      for (let j = 0; j < n; j++) out[o + j] = f(av, b[bi + j]);
    }
  }
}

/**
 * `out[i] = op(a[aView(i)], b[bView(i)])` over the index space `shape`; `out` is dense.
 *
 * Axes are collapsed first, then the innermost axis runs as a tight loop specialised for dense or
 * broadcast operands (the common ops written out, so nothing is called per element) while the
 * outer axes advance as an odometer.
 */
export function binaryKernel(
  op: BinaryOp,
  a: Float32Array,
  aView: StridedView,
  b: Float32Array,
  bView: StridedView,
  out: Float32Array,
  shape: readonly number[],
): void {
  const total = out.length;
  if (total === 0) return;
  const { shape: dims, strides: [aStrides, bStrides] } = collapseAxes(shape, [aView, bView]);
  const rank = dims.length;
  const inner = rank === 0 ? 1 : dims[rank - 1];
  const aInner = rank === 0 ? 0 : aStrides[rank - 1];
  const bInner = rank === 0 ? 0 : bStrides[rank - 1];
  const f = binaryFunctions[op];
  const index = new Array<number>(rank).fill(0);
  let ai = aView.offset, bi = bView.offset;
  for (let o = 0; o < total; o += inner) {
    if (aInner === 1 && bInner === 1) binaryDenseRun(op, a, ai, b, bi, out, o, inner);
    else if (aInner === 1 && bInner === 0) binaryDenseScalarRun(op, a, ai, b[bi], out, o, inner);
    else if (aInner === 0 && bInner === 1) binaryScalarDenseRun(op, a[ai], b, bi, out, o, inner);
    else {
      for (let j = 0, ap = ai, bp = bi; j < inner; j++, ap += aInner, bp += bInner) {
        out[o + j] = f(a[ap], b[bp]);
      }
    }
    for (let d = rank - 2; d >= 0; d--) {
      index[d]++;
      ai += aStrides[d];
      bi += bStrides[d];
      if (index[d] < dims[d]) break;
      ai -= aStrides[d] * dims[d];
      bi -= bStrides[d] * dims[d];
      index[d] = 0;
    }
  }
}

/** Runs shorter than this are copied by a loop: `subarray` + `set` cost more than they save. */
const SHORT_RUN = 64;

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
  const { shape: dims, strides: [sStrides, dStrides] } = collapseAxes(shape, [srcView, dstView]);
  const rank = dims.length;
  const inner = rank === 0 ? 1 : dims[rank - 1];
  const sInner = rank === 0 ? 0 : sStrides[rank - 1];
  const dInner = rank === 0 ? 0 : dStrides[rank - 1];
  const index = new Array<number>(rank).fill(0);
  let si = srcView.offset, di = dstView.offset;
  for (let o = 0; o < n; o += inner) {
    if (sInner === 1 && dInner === 1) {
      if (inner >= SHORT_RUN) dst.set(src.subarray(si, si + inner), di);
      else for (let j = 0; j < inner; j++) dst[di + j] = src[si + j];
    } else {
      for (let j = 0, sp = si, dp = di; j < inner; j++, sp += sInner, dp += dInner) dst[dp] = src[sp];
    }
    for (let d = rank - 2; d >= 0; d--) {
      index[d]++;
      si += sStrides[d];
      di += dStrides[d];
      if (index[d] < dims[d]) break;
      si -= sStrides[d] * dims[d];
      di -= dStrides[d] * dims[d];
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

/**
 * Index of the first NaN or ±∞ in `x`, or −1. `v − v` is 0 for every finite float and NaN
 * otherwise, one subtraction and compare per element with an early exit at the first bad value.
 *
 * @example
 * ```ts
 * import { firstNonFiniteIndex } from "./elementwise.ts";
 * console.log(firstNonFiniteIndex(new Float32Array([1, Infinity, NaN]))); // 1
 * ```
 */
export function firstNonFiniteIndex(x: Float32Array): number {
  for (let i = 0; i < x.length; i++) {
    const v = x[i];
    if (v - v !== 0) return i;
  }
  return -1;
}
