/**
 * Kernel calls that produce tensors without recording gradients: the vocabulary that differentiable
 * ops and their gradient functions are written in. Broadcasting and axis handling live here once.
 *
 * @module
 */

import type { BinaryOp, ReduceOp, StridedView, UnaryOp } from "../../backends/backend.ts";
import { formatShape, ShapeError } from "../errors.ts";
import {
  broadcastAxes,
  broadcastShapes,
  broadcastStrides,
  denseStrides,
  normalizeAxes,
  sizeOf,
} from "../shape.ts";
import { allocateTensor, outputTensor, type Tensor, viewTensor } from "../tensor.ts";

/** A dense view of a whole tensor. */
export const DENSE: StridedView = Object.freeze({ offset: 0, strides: [1] });

/** Checks operands live on one backend and hold float32. */
export function checkOperands(op: string, ...tensors: Tensor[]): void {
  const backend = tensors[0].backend;
  for (const t of tensors) {
    if (t.backend !== backend) {
      throw new ShapeError(op, `operands live on different backends (${backend.name} and ${t.backend.name})`);
    }
    if (t.dtype !== "float32") {
      throw new ShapeError(op, `expected float32 operands, got ${t.dtype} ${formatShape(t.shape)}`);
    }
    void t.storage; // throws DisposedError for a disposed operand
  }
}

/** `op(x)` elementwise. */
export function unaryRaw(op: UnaryOp, x: Tensor): Tensor {
  const out = outputTensor(x.backend, x.shape);
  x.backend.unary(op, x.storage, out.storage);
  return out;
}

/** `op(a, b)` elementwise with NumPy broadcasting. */
export function binaryRaw(op: BinaryOp, a: Tensor, b: Tensor, opName: string = op): Tensor {
  const shape = broadcastShapes(opName, a.shape, b.shape);
  const out = outputTensor(a.backend, shape);
  const flat = shape.length === 0 ? [1] : shape;
  const aStrides = shape.length === 0 ? [0] : broadcastStrides(a.shape, shape);
  const bStrides = shape.length === 0 ? [0] : broadcastStrides(b.shape, shape);
  a.backend.binary(
    op,
    a.storage,
    { offset: 0, strides: aStrides },
    b.storage,
    { offset: 0, strides: bStrides },
    out.storage,
    flat,
  );
  return out;
}

/** Same data, new shape (no copy). */
export function reshapeRaw(x: Tensor, shape: readonly number[]): Tensor {
  return viewTensor(x, shape);
}

/** A dense copy of `x` with its axes reordered: result axis i is input axis `perm[i]`. */
export function permuteRaw(x: Tensor, perm: readonly number[]): Tensor {
  const strides = denseStrides(x.shape);
  const shape = perm.map((p) => x.shape[p]);
  const out = outputTensor(x.backend, shape, x.dtype);
  if (out.size > 0) {
    x.backend.copyStrided(
      x.storage,
      { offset: 0, strides: perm.map((p) => strides[p]) },
      out.storage,
      { offset: 0, strides: denseStrides(shape) },
      shape,
    );
  }
  return out;
}

/**
 * Reduces `x` over `axes` with `op`, each contiguous run of axes as an `[outer, size, inner]`
 * view of the storage (see the note inside on scattered axes).
 */
export function reduceRaw(
  op: ReduceOp,
  x: Tensor,
  axes: number | readonly number[] | undefined,
  keepDims: boolean,
  opName: string,
): Tensor {
  const rank = x.rank;
  const reduced = normalizeAxes(opName, axes, rank);
  const keptShape = x.shape.map((d, i) => (reduced.includes(i) ? 1 : d));
  const outShape = keepDims ? keptShape : x.shape.filter((_, i) => !reduced.includes(i));
  if (reduced.length > 0 && reduced.some((a) => x.shape[a] === 0)) {
    if (op === "max") {
      throw new ShapeError(opName, `cannot take the max over an empty axis of ${formatShape(x.shape)}`);
    }
  }
  // Reduced axes that are not one contiguous run (a bias gradient sums N, H and W of NCHW) are
  // reduced run by run, the last run first, each a contiguous `[outer, size, inner]` pass: no
  // transposed copy of the input is ever made.
  const runs: [number, number][] = [];
  for (const axis of reduced) {
    const last = runs[runs.length - 1];
    if (last && last[1] === axis) last[1] = axis + 1;
    else runs.push([axis, axis + 1]);
  }
  if (runs.length === 0) runs.push([rank, rank]);
  let source = x;
  let shape = [...x.shape];
  for (let r = runs.length - 1; r >= 0; r--) {
    const [lo, hi] = runs[r];
    const outer = sizeOf(shape.slice(0, lo));
    const size = sizeOf(shape.slice(lo, hi));
    const inner = sizeOf(shape.slice(hi));
    shape = shape.map((d, i) => (i >= lo && i < hi ? 1 : d));
    const out = outputTensor(x.backend, r === 0 ? outShape : shape);
    x.backend.reduce(op, source.storage, out.storage, outer, size, inner);
    if (source !== x) source.dispose();
    source = out;
  }
  return source;
}

/** Sums a broadcast gradient back down to `shape` (the inverse of broadcasting). */
export function sumToShape(gradient: Tensor, shape: readonly number[]): Tensor {
  if (gradient.shape.length === shape.length && gradient.shape.every((d, i) => d === shape[i])) {
    return gradient;
  }
  const summed = reduceRaw("sum", gradient, broadcastAxes(shape, gradient.shape), true, "sumToShape");
  const result = reshapeRaw(summed, shape);
  summed.dispose();
  return result;
}

/** A new tensor filled with `value`, on `like`'s backend. */
export function fullRaw(like: Tensor, shape: readonly number[], value: number): Tensor {
  const out = allocateTensor(like.backend, shape);
  if (value !== 0) like.backend.fill(out.storage, value);
  return out;
}
