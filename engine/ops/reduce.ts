/**
 * Differentiable reductions over axes: sum, mean and max.
 *
 * @module
 */

import { recordOp } from "../autograd.ts";
import { normalizeAxes, sizeOf } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import { binaryRaw, checkOperands, fullRaw, reduceRaw, reshapeRaw } from "./raw.ts";

/** Which axes to reduce (all when omitted) and whether to keep them as size-1 dimensions. */
export interface ReduceOptions {
  axes?: number | readonly number[];
  keepDims?: boolean;
}

/** The reduced shape with kept dimensions, so a gradient can broadcast back over the input. */
function keptShape(x: Tensor, axes: number | readonly number[] | undefined, op: string): number[] {
  const reduced = normalizeAxes(op, axes, x.rank);
  return x.shape.map((d, i) => (reduced.includes(i) ? 1 : d));
}

/** `dy` (reduced shape) broadcast back to `x`'s shape, times `scale`. */
function expand(dy: Tensor, kept: readonly number[], like: Tensor, scale: number): Tensor {
  const view = reshapeRaw(dy, kept);
  const factor = fullRaw(like, like.shape, scale);
  const out = binaryRaw("mul", factor, view);
  view.dispose();
  factor.dispose();
  return out;
}

/**
 * Sum over `axes` (all by default).
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const rows = ops.sum(tensor([[1, 2], [3, 4]]), { axes: 1 }); // [3, 7]
 * ```
 */
export function sum(x: Tensor, options: ReduceOptions = {}): Tensor {
  checkOperands("sum", x);
  const kept = keptShape(x, options.axes, "sum");
  const out = reduceRaw("sum", x, options.axes, options.keepDims ?? false, "sum");
  recordOp("sum", [x], out, [], (dy) => [expand(dy, kept, x, 1)]);
  return out;
}

/**
 * Mean over `axes` (all by default).
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const m = ops.mean(tensor([1, 2, 3, 4])); // 2.5
 * ```
 */
export function mean(x: Tensor, options: ReduceOptions = {}): Tensor {
  checkOperands("mean", x);
  const kept = keptShape(x, options.axes, "mean");
  const count = sizeOf(x.shape) / sizeOf(kept);
  const total = reduceRaw("sum", x, options.axes, options.keepDims ?? false, "mean");
  const scale = fullRaw(x, [], 1 / count);
  const out = binaryRaw("mul", total, scale);
  total.dispose();
  scale.dispose();
  recordOp("mean", [x], out, [], (dy) => [expand(dy, kept, x, 1 / count)]);
  return out;
}

/**
 * Maximum over `axes` (all by default). Elements tied for the maximum share its gradient equally
 * (as in TensorFlow).
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const m = ops.max(tensor([[1, 5], [7, 2]]), { axes: 0 }); // [7, 5]
 * ```
 */
export function max(x: Tensor, options: ReduceOptions = {}): Tensor {
  checkOperands("max", x);
  const kept = keptShape(x, options.axes, "max");
  const out = reduceRaw("max", x, options.axes, options.keepDims ?? false, "max");
  recordOp("max", [x], out, [x, out], (dy) => {
    const outView = reshapeRaw(out, kept);
    const mask = binaryRaw("equal", x, outView);
    const ties = reduceRaw("sum", mask, options.axes, true, "max");
    const dyView = reshapeRaw(dy, kept);
    const share = binaryRaw("div", dyView, ties);
    const gradient = binaryRaw("mul", mask, share);
    for (const t of [outView, mask, ties, dyView, share]) t.dispose();
    return [gradient];
  });
  return out;
}
