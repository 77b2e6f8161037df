/**
 * Differentiable views and layout changes: reshape, flatten, permute/transpose, slice, concat.
 * Reshape shares storage; the others copy through the backend's strided-copy kernel.
 *
 * @module
 */

import { recordOp } from "../autograd.ts";
import { formatShape, ShapeError } from "../errors.ts";
import { denseStrides, normalizeAxes, sizeOf } from "../shape.ts";
import { allocateTensor, type Tensor } from "../tensor.ts";
import { checkOperands, permuteRaw, reshapeRaw } from "./raw.ts";

/**
 * The same values in a new shape (no copy). One dimension may be −1 and is inferred.
 *
 * @example
 * ```ts
 * import { ops, zeros } from "../../mod.ts";
 * const y = ops.reshape(zeros([2, 3, 4]), [6, -1]); // [6, 4]
 * ```
 */
export function reshape(x: Tensor, shape: readonly number[]): Tensor {
  const resolved = resolveShape(x, shape);
  const out = reshapeRaw(x, resolved);
  recordOp("reshape", [x], out, [], (dy) => [reshapeRaw(dy, x.shape)]);
  return out;
}

function resolveShape(x: Tensor, shape: readonly number[]): number[] {
  const inferred = shape.filter((d) => d === -1).length;
  const known = sizeOf(shape.filter((d) => d !== -1));
  const bad = shape.some((d) => !Number.isInteger(d) || d < -1);
  if (
    inferred > 1 || bad || (inferred === 0 && known !== x.size) ||
    (inferred === 1 && (known === 0 || x.size % known))
  ) {
    throw new ShapeError(
      "reshape",
      `cannot reshape ${formatShape(x.shape)} (${x.size} elements) to ${formatShape(shape)}`,
    );
  }
  return shape.map((d) => (d === -1 ? x.size / known : d));
}

/**
 * Merges axes `startAxis … endAxis` into one (PyTorch's `flatten`); all axes by default.
 *
 * @example
 * ```ts
 * import { ops, zeros } from "../../mod.ts";
 * const y = ops.flatten(zeros([8, 256, 6, 6]), 1); // [8, 9216]
 * ```
 */
export function flatten(x: Tensor, startAxis = 0, endAxis = -1): Tensor {
  if (x.rank === 0) return reshape(x, [1]);
  const [start] = normalizeAxes("flatten", startAxis, x.rank);
  const [end] = normalizeAxes("flatten", endAxis, x.rank);
  if (start > end) {
    throw new ShapeError(
      "flatten",
      `startAxis ${startAxis} comes after endAxis ${endAxis} for ${formatShape(x.shape)}`,
    );
  }
  const shape = [
    ...x.shape.slice(0, start),
    sizeOf(x.shape.slice(start, end + 1)),
    ...x.shape.slice(end + 1),
  ];
  return reshape(x, shape);
}

/**
 * Reorders axes: result axis `i` is input axis `perm[i]`.
 *
 * @example
 * ```ts
 * import { ops, zeros } from "../../mod.ts";
 * const nhwc = ops.permute(zeros([2, 3, 4, 5]), [0, 2, 3, 1]); // [2, 4, 5, 3]
 * ```
 */
export function permute(x: Tensor, perm: readonly number[]): Tensor {
  if (perm.length !== x.rank || normalizeAxes("permute", perm, x.rank).length !== x.rank) {
    throw new ShapeError(
      "permute",
      `${formatShape(perm)} is not a permutation of the ${x.rank} axes of ${formatShape(x.shape)}`,
    );
  }
  const normal = perm.map((p) => (p < 0 ? p + x.rank : p));
  const out = permuteRaw(x, normal);
  const inverse = new Array<number>(normal.length);
  normal.forEach((p, i) => (inverse[p] = i));
  recordOp("permute", [x], out, [], (dy) => [permuteRaw(dy, inverse)]);
  return out;
}

/**
 * Transposes a matrix, or reverses the axes of any tensor when `perm` is omitted.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const t = ops.transpose(tensor([[1, 2, 3]])); // [[1], [2], [3]]
 * ```
 */
export function transpose(x: Tensor, perm?: readonly number[]): Tensor {
  return permute(x, perm ?? [...x.shape.keys()].reverse());
}

/**
 * The block starting at `begin` with extent `size` (−1: to the end of that axis), as in TF.js.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.slice(tensor([[1, 2, 3], [4, 5, 6]]), [0, 1], [2, 2]); // [[2, 3], [5, 6]]
 * ```
 */
export function slice(x: Tensor, begin: readonly number[], size?: readonly number[]): Tensor {
  checkOperands("slice", x);
  if (begin.length !== x.rank || (size && size.length !== x.rank)) {
    throw new ShapeError(
      "slice",
      `begin ${formatShape(begin)}${
        size ? ` and size ${formatShape(size)}` : ""
      } must have one entry per axis of ${formatShape(x.shape)}`,
    );
  }
  const extent = x.shape.map((d, i) => (size && size[i] !== -1 ? size[i] : d - begin[i]));
  x.shape.forEach((d, i) => {
    if (!Number.isInteger(begin[i]) || begin[i] < 0 || extent[i] < 0 || begin[i] + extent[i] > d) {
      throw new ShapeError(
        "slice",
        `axis ${i}: begin ${begin[i]} with size ${extent[i]} does not fit in ${formatShape(x.shape)}`,
      );
    }
  });
  const strides = denseStrides(x.shape);
  const offset = begin.reduce((acc, b, i) => acc + b * strides[i], 0);
  const out = allocateTensor(x.backend, extent);
  if (out.size > 0) {
    x.backend.copyStrided(x.storage, { offset, strides }, out.storage, {
      offset: 0,
      strides: denseStrides(extent),
    }, extent);
  }
  recordOp("slice", [x], out, [], (dy) => {
    const dx = allocateTensor(x.backend, x.shape);
    if (dy.size > 0) {
      x.backend.copyStrided(dy.storage, { offset: 0, strides: denseStrides(extent) }, dx.storage, {
        offset,
        strides,
      }, extent);
    }
    return [dx];
  });
  return out;
}

/**
 * Joins tensors along `axis`; all other dimensions must match.
 *
 * @example
 * ```ts
 * import { ops, zeros } from "../../mod.ts";
 * const y = ops.concat([zeros([2, 3]), zeros([2, 5])], 1); // [2, 8]
 * ```
 */
export function concat(tensors: readonly Tensor[], axis = 0): Tensor {
  if (tensors.length === 0) throw new ShapeError("concat", "needs at least one tensor");
  checkOperands("concat", ...tensors);
  const first = tensors[0];
  const [dim] = normalizeAxes("concat", axis, first.rank);
  for (const t of tensors) {
    if (t.rank !== first.rank || t.shape.some((d, i) => i !== dim && d !== first.shape[i])) {
      throw new ShapeError(
        "concat",
        `shapes ${tensors.map((s) => formatShape(s.shape)).join(", ")} differ outside axis ${dim}`,
      );
    }
  }
  const shape = [...first.shape];
  shape[dim] = tensors.reduce((acc, t) => acc + t.shape[dim], 0);
  const out = allocateTensor(first.backend, shape);
  const outStrides = denseStrides(shape);
  const offsets: number[] = [];
  let position = 0;
  for (const t of tensors) {
    offsets.push(position * outStrides[dim]);
    if (t.size > 0) {
      t.backend.copyStrided(t.storage, { offset: 0, strides: denseStrides(t.shape) }, out.storage, {
        offset: position * outStrides[dim],
        strides: outStrides,
      }, t.shape);
    }
    position += t.shape[dim];
  }
  recordOp("concat", tensors, out, [], (dy) =>
    tensors.map((t, i) => {
      if (!t.requiresGrad) return null;
      const part = allocateTensor(t.backend, t.shape);
      if (t.size > 0) {
        t.backend.copyStrided(dy.storage, { offset: offsets[i], strides: outStrides }, part.storage, {
          offset: 0,
          strides: denseStrides(t.shape),
        }, t.shape);
      }
      return part;
    }));
  return out;
}
