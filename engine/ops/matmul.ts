/**
 * Differentiable matrix products: `matmul` (2-D and batched, with operands read transposed in place)
 * and `linear`, the fully-connected layer `x·Wᵀ + b`.
 *
 * @module
 */

import type { Activation } from "../../backends/backend.ts";
import { recordOp } from "../autograd.ts";
import { formatShape, ShapeError, ValueError } from "../errors.ts";
import { broadcastShapes, broadcastStrides, denseStrides, sizeOf } from "../shape.ts";
import { outputTensor, type Tensor } from "../tensor.ts";
import { reshape } from "./movement.ts";
import { binaryRaw, checkOperands, reduceRaw, sumToShape } from "./raw.ts";

/** Read an operand as its transpose (last two axes swapped) without copying it. */
export interface MatmulOptions {
  transposeA?: boolean;
  transposeB?: boolean;
}

/** An operand's batch dims broadcast to `batchShape`, as dense memory and a per-matrix stride. */
function batchOperand(x: Tensor, batchShape: readonly number[]): { source: Tensor; stride: number } {
  const matrix = x.shape.slice(-2);
  const own = x.shape.slice(0, -2);
  const matrixSize = sizeOf(matrix);
  if (sizeOf(own) === sizeOf(batchShape)) return { source: x, stride: matrixSize };
  if (sizeOf(own) === 1) return { source: x, stride: 0 };
  // Partial broadcasting (e.g. [2, 1] against [1, 3]): materialise the broadcast batch.
  const shape = [...batchShape, ...matrix];
  const strides = [...broadcastStrides(own, batchShape).map((s) => s * matrixSize), ...denseStrides(matrix)];
  const out = outputTensor(x.backend, shape);
  x.backend.copyStrided(x.storage, { offset: 0, strides }, out.storage, {
    offset: 0,
    strides: denseStrides(shape),
  }, shape);
  return { source: out, stride: matrixSize };
}

/** Batched product of operands of rank ≥ 2; no autograd. */
function matmulRaw(a: Tensor, b: Tensor, transA: boolean, transB: boolean): Tensor {
  const [ar, ac] = a.shape.slice(-2), [br, bc] = b.shape.slice(-2);
  const m = transA ? ac : ar, k = transA ? ar : ac;
  const kB = transB ? bc : br, n = transB ? br : bc;
  if (k !== kB) {
    throw new ShapeError(
      "matmul",
      `inner dimensions differ: a ${formatShape(a.shape)}${transA ? "ᵀ" : ""} gives k = ${k}, b ${
        formatShape(b.shape)
      }${transB ? "ᵀ" : ""} gives k = ${kB}`,
    );
  }
  const batchShape = broadcastShapes("matmul", a.shape.slice(0, -2), b.shape.slice(0, -2));
  const batch = sizeOf(batchShape);
  const left = batchOperand(a, batchShape), right = batchOperand(b, batchShape);
  const out = outputTensor(a.backend, [...batchShape, m, n]);
  if (out.size > 0) {
    a.backend.matmul(left.source.storage, right.source.storage, out.storage, {
      batch,
      m,
      n,
      k,
      transA,
      transB,
      aBatchStride: left.stride,
      bBatchStride: right.stride,
    });
  }
  if (left.source !== a) left.source.dispose();
  if (right.source !== b) right.source.dispose();
  return out;
}

/**
 * Matrix product with NumPy semantics: 2-D, batched over leading axes (broadcasting), and 1-D
 * operands promoted to a row (left) or column (right) vector. `transposeA/B` read an operand's last
 * two axes swapped without materialising the transpose.
 *
 * @example
 * ```ts
 * import { ops, randn } from "../../mod.ts";
 * const x = randn([64, 9216], { seed: 1 });
 * const w = randn([4096, 9216], { seed: 2 });
 * const y = ops.matmul(x, w, { transposeB: true }); // [64, 4096]
 * ```
 */
export function matmul(a: Tensor, b: Tensor, options: MatmulOptions = {}): Tensor {
  checkOperands("matmul", a, b);
  if (a.rank === 0 || b.rank === 0) {
    throw new ShapeError(
      "matmul",
      `operands must have rank ≥ 1, got ${formatShape(a.shape)} and ${formatShape(b.shape)}`,
    );
  }
  const transA = options.transposeA ?? false, transB = options.transposeB ?? false;
  if (a.rank === 1 || b.rank === 1) return vectorProduct(a, b, transA, transB);
  const out = matmulRaw(a, b, transA, transB);
  recordOp("matmul", [a, b], out, [a, b], (dy) => [
    a.requiresGrad
      ? reduceBatch(transA ? matmulRaw(b, dy, transB, true) : matmulRaw(dy, b, false, !transB), a.shape)
      : null,
    b.requiresGrad
      ? reduceBatch(transB ? matmulRaw(dy, a, true, transA) : matmulRaw(a, dy, !transA, false), b.shape)
      : null,
  ]);
  return out;
}

/** 1-D operands: promote to a row/column matrix, multiply, squeeze the added axis (as NumPy). */
function vectorProduct(a: Tensor, b: Tensor, transA: boolean, transB: boolean): Tensor {
  const a2 = a.rank === 1 ? reshape(a, [1, a.shape[0]]) : a;
  const b2 = b.rank === 1 ? reshape(b, [b.shape[0], 1]) : b;
  const product = matmul(a2, b2, { transposeA: a.rank > 1 && transA, transposeB: b.rank > 1 && transB });
  const rank = product.rank;
  const shape = product.shape.filter((_, i) =>
    !(a.rank === 1 && i === rank - 2) && !(b.rank === 1 && i === rank - 1)
  );
  const out = reshape(product, shape);
  for (const t of [a2, b2, product]) if (t !== a && t !== b) t.dispose();
  return out;
}

/** Sums a batched gradient over the batch axes its operand was broadcast along. */
function reduceBatch(gradient: Tensor, shape: readonly number[]): Tensor {
  const reduced = sumToShape(gradient, shape);
  if (reduced !== gradient) gradient.dispose();
  return reduced;
}

/** Options of {@link linear}. */
export interface LinearOptions {
  /**
   * Applied to the output in the product's epilogue, after the bias (`"relu"`), its gradient mask
   * inside the layer's backward: the bits of `relu(linear(…))`, one pass over the output fewer.
   */
  activation?: Activation;
}

/**
 * A fully-connected layer: `x · weightᵀ + bias` with `x` `[batch, in]`, `weight` `[out, in]` (the
 * Caffe/PyTorch layout) and `bias` `[out]`. The weight is read transposed in place, and the bias
 * (and the activation, when asked) is applied by the product itself, in its epilogue.
 *
 * @example
 * ```ts
 * import { ops, randn, zeros } from "../../mod.ts";
 * const y = ops.linear(randn([8, 100], { seed: 1 }), randn([10, 100], { seed: 2 }), zeros([10])); // [8, 10]
 * const r = ops.linear(randn([8, 100], { seed: 1 }), randn([10, 100], { seed: 2 }), zeros([10]), {
 *   activation: "relu",
 * }); // relu(y), fused
 * ```
 */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor | null, options: LinearOptions = {}): Tensor {
  checkOperands("linear", x, weight, ...(bias ? [bias] : []));
  if (x.rank !== 2 || weight.rank !== 2 || x.shape[1] !== weight.shape[1]) {
    throw new ShapeError(
      "linear",
      `input ${formatShape(x.shape)} and weight ${
        formatShape(weight.shape)
      }: expected [batch, in] and [out, in]`,
    );
  }
  if (bias && (bias.rank !== 1 || bias.shape[0] !== weight.shape[0])) {
    throw new ShapeError(
      "linear",
      `bias ${formatShape(bias.shape)} does not match weight ${formatShape(weight.shape)}: expected [${
        weight.shape[0]
      }]`,
    );
  }
  const relu = options.activation === "relu";
  if (options.activation !== undefined && !relu) {
    throw new ValueError(
      "linear",
      `activation ${JSON.stringify(options.activation)}: expected "relu" or none`,
    );
  }
  const [batch, features] = x.shape, units = weight.shape[0];
  const out = outputTensor(x.backend, [batch, units]);
  if (out.size > 0) {
    const spec = { batch: 1, m: batch, n: units, k: features, transA: false, transB: true };
    const strides = { aBatchStride: 0, bBatchStride: 0 };
    x.backend.matmul(
      x.storage,
      weight.storage,
      out.storage,
      { ...spec, ...strides },
      bias?.storage,
      options.activation,
    );
  }
  const inputs = bias ? [x, weight, bias] : [x, weight];
  recordOp("linear", inputs, out, relu ? [x, weight, out] : [x, weight], (gradient) => {
    // The ReLU's own backward, on the output it kept: what a separate relu node would hand on.
    const dy = relu ? binaryRaw("reluGrad", gradient, out, "linear") : gradient;
    // matmul's and the broadcast add's gradients, as `relu(matmul(x, wᵀ) + b)` records them.
    const dx = x.requiresGrad ? matmulRaw(dy, weight, false, false) : null;
    const dw = weight.requiresGrad ? matmulRaw(dy, x, true, false) : null;
    const db = bias?.requiresGrad ? reduceRaw("sum", dy, [0], false, "linear") : null;
    if (dy !== gradient) dy.dispose();
    return bias ? [dx, dw, db] : [dx, dw];
  });
  return out;
}
