/**
 * Row-wise softmax, log-softmax and softmax cross-entropy for the CPU backend. Each row is shifted
 * by its maximum before exponentiating, and sums run in float64, so large logits neither overflow
 * nor lose the small classes.
 *
 * @module
 */

import type { RowSpec } from "../backend.ts";

/** Max of `x[start .. start+cols)` and log Σ exp(x − max), in float64. */
function rowLogSumExp(x: Float32Array, start: number, cols: number): [max: number, logSum: number] {
  let max = -Infinity;
  for (let c = 0; c < cols; c++) if (x[start + c] > max) max = x[start + c];
  let sum = 0;
  for (let c = 0; c < cols; c++) sum += Math.exp(x[start + c] - max);
  return [max, Math.log(sum)];
}

/** `out = softmax(x)` per row. */
export function softmaxKernel(x: Float32Array, out: Float32Array, { rows, cols }: RowSpec): void {
  for (let r = 0; r < rows; r++) {
    const start = r * cols;
    const [max, logSum] = rowLogSumExp(x, start, cols);
    for (let c = 0; c < cols; c++) out[start + c] = Math.exp(x[start + c] - max - logSum);
  }
}

/** `out = log softmax(x)` per row. */
export function logSoftmaxKernel(x: Float32Array, out: Float32Array, { rows, cols }: RowSpec): void {
  for (let r = 0; r < rows; r++) {
    const start = r * cols;
    const [max, logSum] = rowLogSumExp(x, start, cols);
    for (let c = 0; c < cols; c++) out[start + c] = x[start + c] - max - logSum;
  }
}

/** Per-row `−log softmax(logits)[label]`, and the softmax for backward. */
export function softmaxCrossEntropyKernel(
  logits: Float32Array,
  labels: Int32Array,
  losses: Float32Array,
  probs: Float32Array,
  { rows, cols }: RowSpec,
): void {
  for (let r = 0; r < rows; r++) {
    const start = r * cols;
    const [max, logSum] = rowLogSumExp(logits, start, cols);
    for (let c = 0; c < cols; c++) probs[start + c] = Math.exp(logits[start + c] - max - logSum);
    losses[r] = -(logits[start + labels[r]] - max - logSum);
  }
}

/** `dLogits = (probs − onehot(label)) · dLoss[row]`. */
export function softmaxCrossEntropyBackwardKernel(
  probs: Float32Array,
  labels: Int32Array,
  dLoss: Float32Array,
  dLogits: Float32Array,
  { rows, cols }: RowSpec,
): void {
  for (let r = 0; r < rows; r++) {
    const start = r * cols;
    const g = dLoss[r];
    for (let c = 0; c < cols; c++) dLogits[start + c] = probs[start + c] * g;
    dLogits[start + labels[r]] -= g;
  }
}
