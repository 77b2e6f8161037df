/**
 * Differentiable softmax, log-softmax and the fused softmax cross-entropy loss.
 *
 * @module
 */

import { recordOp } from "../autograd.ts";
import { formatShape, NonFiniteError, ShapeError, ValueError } from "../errors.ts";
import { normalizeAxes } from "../shape.ts";
import { outputTensor, type Tensor } from "../tensor.ts";
import { permute } from "./movement.ts";
import { binaryRaw, checkOperands, fullRaw, reduceRaw, reshapeRaw, unaryRaw } from "./raw.ts";

/** Applies a last-axis row op to any axis by moving that axis last and back. */
function alongAxis(x: Tensor, axis: number, op: string, lastAxisOp: (x: Tensor) => Tensor): Tensor {
  checkOperands(op, x);
  if (x.rank === 0) throw new ShapeError(op, "needs at least one axis, got a scalar");
  const [normal] = normalizeAxes(op, axis, x.rank);
  if (normal === x.rank - 1) return lastAxisOp(x);
  const perm = [...x.shape.keys()];
  perm[normal] = x.rank - 1;
  perm[x.rank - 1] = normal;
  const moved = permute(x, perm);
  const result = lastAxisOp(moved);
  const back = permute(result, perm);
  moved.dispose();
  result.dispose();
  return back;
}

function rowsOf(x: Tensor) {
  const cols = x.shape[x.rank - 1];
  return { rows: cols === 0 ? 0 : x.size / cols, cols };
}

/**
 * Softmax along `axis` (default: the last), shifted by the maximum so large inputs cannot overflow.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const p = ops.softmax(tensor([[1, 2, 3]])); // rows sum to 1
 * ```
 */
export function softmax(x: Tensor, axis = -1): Tensor {
  return alongAxis(x, axis, "softmax", (input) => {
    const out = outputTensor(input.backend, input.shape);
    input.backend.softmax(input.storage, out.storage, rowsOf(input));
    recordOp("softmax", [input], out, [out], (dy) => {
      // dx = y · (dy − Σ dy·y)
      const product = binaryRaw("mul", dy, out);
      const total = reduceRaw("sum", product, -1, true, "softmax");
      const centred = binaryRaw("sub", dy, total);
      const dx = binaryRaw("mul", out, centred);
      for (const t of [product, total, centred]) t.dispose();
      return [dx];
    });
    return out;
  });
}

/**
 * Log-softmax along `axis` (default: the last), computed stably as `x − max − log Σ exp(x − max)`.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const logp = ops.logSoftmax(tensor([[1000, 0]])); // [[0, -1000]], no overflow
 * ```
 */
export function logSoftmax(x: Tensor, axis = -1): Tensor {
  return alongAxis(x, axis, "logSoftmax", (input) => {
    const out = outputTensor(input.backend, input.shape);
    input.backend.logSoftmax(input.storage, out.storage, rowsOf(input));
    recordOp("logSoftmax", [input], out, [out], (dy) => {
      // dx = dy − softmax · Σ dy
      const total = reduceRaw("sum", dy, -1, true, "logSoftmax");
      const probabilities = unaryRaw("exp", out);
      const weighted = binaryRaw("mul", probabilities, total);
      const dx = binaryRaw("sub", dy, weighted);
      for (const t of [total, probabilities, weighted]) t.dispose();
      return [dx];
    });
    return out;
  });
}

/** Options of {@link softmaxCrossEntropy}. */
export interface CrossEntropyOptions {
  /** `"mean"` over the batch (default, as Caffe's SoftmaxWithLoss), `"sum"`, or `"none"` (per sample). */
  reduction?: "mean" | "sum" | "none";
}

/**
 * Softmax cross-entropy of `[batch, classes]` logits against int32 class labels `[batch]`, fused
 * and numerically stable. Labels out of range and non-finite losses are reported, not averaged in.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const logits = tensor([[2, 0, 0], [0, 0, 3]]);
 * const loss = ops.softmaxCrossEntropy(logits, tensor([0, 2], { dtype: "int32" })); // scalar
 * ```
 */
export function softmaxCrossEntropy(
  logits: Tensor,
  labels: Tensor,
  options: CrossEntropyOptions = {},
): Tensor {
  const op = "softmaxCrossEntropy";
  checkOperands(op, logits);
  if (logits.rank !== 2) {
    throw new ShapeError(op, `logits must be [batch, classes], got ${formatShape(logits.shape)}`);
  }
  const [batch, classes] = logits.shape;
  if (labels.dtype !== "int32") {
    throw new ShapeError(
      op,
      `labels must be an int32 tensor, got ${labels.dtype} (create them with { dtype: "int32" })`,
    );
  }
  if (labels.rank !== 1 || labels.shape[0] !== batch) {
    throw new ShapeError(
      op,
      `labels ${formatShape(labels.shape)} do not match logits ${
        formatShape(logits.shape)
      }: expected [${batch}]`,
    );
  }
  const hostLabels = labels.hostInts ?? (labels.backend.readSync?.(labels.storage) as Int32Array | undefined);
  if (hostLabels) {
    const bad = hostLabels.findIndex((l) => l < 0 || l >= classes);
    if (bad >= 0) {
      throw new ValueError(
        op,
        `label ${hostLabels[bad]} at index ${bad} is outside [0, ${classes}) for ${classes} classes`,
      );
    }
  }
  const reduction = options.reduction ?? "mean";
  const losses = outputTensor(logits.backend, [batch]);
  const probs = outputTensor(logits.backend, logits.shape);
  logits.backend.softmaxCrossEntropy(logits.storage, labels.storage, losses.storage, probs.storage, {
    rows: batch,
    cols: classes,
  });
  try {
    checkFinite(losses, logits);
  } catch (error) {
    losses.dispose();
    probs.dispose();
    throw error;
  }
  let out: Tensor;
  if (reduction === "none") {
    out = losses;
  } else {
    out = reduceRaw("sum", losses, undefined, false, op);
    if (reduction === "mean") {
      const scale = fullRaw(losses, [], 1 / batch);
      const mean = binaryRaw("mul", out, scale);
      out.dispose();
      scale.dispose();
      out = mean;
    }
    losses.dispose();
  }
  recordOp(op, [logits], out, [probs, labels], (dy) => {
    const perRow = reduction === "none" ? dy : reshapeRaw(dy, [1]);
    const rowScale = fullRaw(logits, [batch], reduction === "mean" ? 1 / batch : 1);
    const dLoss = binaryRaw("mul", rowScale, perRow);
    const dx = outputTensor(logits.backend, logits.shape);
    logits.backend.softmaxCrossEntropyBackward(probs.storage, labels.storage, dLoss.storage, dx.storage, {
      rows: batch,
      cols: classes,
    });
    for (const t of [rowScale, dLoss]) t.dispose();
    if (perRow !== dy) perRow.dispose();
    return [dx];
  });
  probs.dispose();
  return out;
}

/** On backends with cheap reads, turns a NaN/∞ loss into an error naming the sample. */
function checkFinite(losses: Tensor, logits: Tensor): void {
  const values = losses.backend.readSync?.(losses.storage);
  if (!values) return;
  const bad = values.findIndex((v) => !Number.isFinite(v));
  if (bad >= 0) {
    throw new NonFiniteError(
      "softmaxCrossEntropy",
      `the loss of sample ${bad} is ${values[bad]}: its logits (row ${bad} of ${
        formatShape(logits.shape)
      }) hold NaN or infinity`,
    );
  }
}
