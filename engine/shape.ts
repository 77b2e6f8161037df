/**
 * Shape arithmetic shared by the ops: sizes, row-major strides, NumPy broadcasting and axis
 * normalisation, each validating with errors that name the op.
 *
 * @module
 */

import { formatShape, ShapeError } from "./errors.ts";

/** Number of elements of a shape. */
export function sizeOf(shape: readonly number[]): number {
  let size = 1;
  for (const d of shape) size *= d;
  return size;
}

/** Row-major strides of a dense array of this shape. */
export function denseStrides(shape: readonly number[]): number[] {
  const strides = new Array<number>(shape.length);
  let stride = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

/** The NumPy broadcast of two shapes, or a `ShapeError` naming `op`. */
export function broadcastShapes(op: string, a: readonly number[], b: readonly number[]): number[] {
  const rank = Math.max(a.length, b.length);
  const out = new Array<number>(rank);
  for (let i = 0; i < rank; i++) {
    const da = a[a.length - rank + i] ?? 1;
    const db = b[b.length - rank + i] ?? 1;
    if (da !== db && da !== 1 && db !== 1) {
      throw new ShapeError(
        op,
        `shapes ${formatShape(a)} and ${
          formatShape(b)
        } do not broadcast: axis ${i} of the result has ${da} vs ${db}` +
          ` (each pair of trailing dimensions must be equal or 1)`,
      );
    }
    out[i] = da === 1 ? db : da;
  }
  return out;
}

/** Strides that read a dense array of `shape` as if broadcast to `outShape` (0 on broadcast axes). */
export function broadcastStrides(shape: readonly number[], outShape: readonly number[]): number[] {
  const own = denseStrides(shape);
  const offset = outShape.length - shape.length;
  return outShape.map((_, i) => {
    const d = i - offset;
    return d < 0 || shape[d] === 1 ? 0 : own[d];
  });
}

/** Axes of `outShape` along which `shape` was broadcast (to sum a gradient back to `shape`). */
export function broadcastAxes(shape: readonly number[], outShape: readonly number[]): number[] {
  const offset = outShape.length - shape.length;
  const axes: number[] = [];
  for (let i = 0; i < outShape.length; i++) {
    const d = i - offset;
    if ((d < 0 || shape[d] === 1) && outShape[i] !== 1) axes.push(i);
  }
  return axes;
}

/** Normalises possibly negative axes against `rank`; all axes when `axes` is undefined. */
export function normalizeAxes(
  op: string,
  axes: number | readonly number[] | undefined,
  rank: number,
): number[] {
  if (axes === undefined) return [...Array(rank).keys()];
  const list = typeof axes === "number" ? [axes] : [...axes];
  const seen = new Set<number>();
  for (const axis of list) {
    if (!Number.isInteger(axis) || axis < -rank || axis >= rank) {
      throw new ShapeError(op, `axis ${axis} is out of range for a tensor of rank ${rank}`);
    }
    const normal = axis < 0 ? axis + rank : axis;
    if (seen.has(normal)) throw new ShapeError(op, `axis ${axis} is repeated`);
    seen.add(normal);
  }
  return [...seen].sort((a, b) => a - b);
}

/** Checks every dimension is a non-negative integer. */
export function checkShape(op: string, shape: readonly number[]): void {
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 0) {
      throw new ShapeError(
        op,
        `invalid shape ${formatShape(shape)}: dimensions must be non-negative integers`,
      );
    }
  }
}

/** True when two shapes are equal. */
export function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}
