/**
 * Batch normalisation with Caffe's semantics (`BatchNorm` layer, usually followed by a `Scale`
 * layer that learns the per-channel scale and shift).
 *
 * Per channel c, over the batch and every spatial position (m = N·H·W values):
 * - with batch statistics (Caffe's TRAIN default): `μ = mean x`, `σ² = mean (x − μ)²` (biased),
 *   `y = (x − μ) / sqrt(σ² + eps)`; the gradient flows through μ and σ² (engine ops), and the three
 *   buffers are updated as Caffe does: `s ← s·f + 1`, `mean ← μ + f·mean`,
 *   `variance ← m/(m−1)·σ² + f·variance` (the unbiased correction, 1 when m = 1), `f` the
 *   `moving_average_fraction` (default 0.999);
 * - with global statistics (Caffe's TEST default): `μ = mean/s`, `σ² = variance/s` (both 0 while
 *   `s` is 0), the same normalisation, and the gradient is `dy / sqrt(σ² + eps)`.
 *
 * Which one runs: `useGlobalStats` when given (Caffe's `use_global_stats`), else batch statistics in
 * training mode and global ones in evaluation mode, as Caffe's TRAIN and TEST nets default.
 *
 * The statistics are buffers (`mean`, `variance`, `scale_factor`: Caffe's three blobs), not
 * parameters: no gradient, no optimizer, never exchanged between data-parallel replicas.
 *
 * @module
 */

import { noGrad, tidy } from "../context.ts";
import { formatShape, ShapeError } from "../errors.ts";
import * as ops from "../ops/mod.ts";
import { binaryRaw, fullRaw } from "../ops/raw.ts";
import type { Tensor } from "../tensor.ts";
import { type LayerDescription, Module } from "./module.ts";

/** Options of {@link BatchNorm}, Caffe's `batch_norm_param`. */
export interface BatchNormOptions {
  /** Normalise with the stored statistics (default: in evaluation mode only). */
  useGlobalStats?: boolean;
  /** Decay of the running averages (default 0.999). */
  movingAverageFraction?: number;
  /** Added to the variance before the square root (default 1e-5). */
  eps?: number;
}

/**
 * Caffe's `BatchNorm` over `channels` channels (axis 1 of an `[N, C, …]` input); see the module
 * notes.
 *
 * @example
 * ```ts
 * import { BatchNorm } from "./batch_norm.ts";
 * const bn = new BatchNorm(64);               // batch statistics in training, global in eval
 * const frozen = new BatchNorm(64, { useGlobalStats: true });
 * console.log(bn.namedBuffers().map((b) => b.name)); // ["mean", "variance", "scale_factor"]
 * ```
 */
export class BatchNorm extends Module {
  /** Layer type. */
  readonly kind = "BatchNorm";
  /** Running sum of batch means (Caffe blob 0), `[channels]`. */
  readonly mean: Tensor;
  /** Running sum of corrected batch variances (blob 1), `[channels]`. */
  readonly variance: Tensor;
  /** Running normaliser of the two sums (blob 2), `[1]`. */
  readonly scaleFactor: Tensor;
  /** The options with Caffe's defaults filled in (`useGlobalStats` stays undefined when not given). */
  readonly options: { useGlobalStats?: boolean; movingAverageFraction: number; eps: number };

  /** A batch normalisation of `channels` channels, statistics zero until trained or loaded. */
  constructor(readonly channels: number, options: BatchNormOptions = {}) {
    super();
    if (!Number.isInteger(channels) || channels < 1) {
      throw new ShapeError("BatchNorm", `channels must be a positive integer, got ${channels}`);
    }
    this.options = {
      ...(options.useGlobalStats === undefined ? {} : { useGlobalStats: options.useGlobalStats }),
      movingAverageFraction: options.movingAverageFraction ?? 0.999,
      eps: options.eps ?? 1e-5,
    };
    this.mean = this.addBuffer("mean", [channels]);
    this.variance = this.addBuffer("variance", [channels]);
    this.scaleFactor = this.addBuffer("scale_factor", [1]);
  }

  /** Whether this forward normalises with the stored statistics. */
  get usesGlobalStats(): boolean {
    return this.options.useGlobalStats ?? !this.training;
  }

  /** Normalises a batch (and, with batch statistics, updates the running ones). */
  forward(x: Tensor): Tensor {
    this.#check(x.shape);
    const kept = x.shape.map((d, i) => (i === 1 ? d : 1));
    const axes = x.shape.map((_, i) => i).filter((i) => i !== 1);
    const eps = this.options.eps;
    if (this.usesGlobalStats) {
      const [mean, variance] = noGrad(() =>
        tidy(() => {
          const factor = inverseOrZero(this.scaleFactor);
          return [this.mean, this.variance].map((b) => ops.reshape(ops.mul(b, factor), kept));
        })
      );
      const centred = ops.sub(x, mean);
      const std = ops.sqrt(ops.add(variance, eps));
      const y = ops.div(centred, std);
      for (const t of [mean, variance, centred, std]) t.dispose();
      return y;
    }
    const mean = ops.mean(x, { axes, keepDims: true });
    const centred = ops.sub(x, mean);
    const squares = ops.mul(centred, centred);
    const variance = ops.mean(squares, { axes, keepDims: true });
    const shifted = ops.add(variance, eps);
    const std = ops.sqrt(shifted);
    const y = ops.div(centred, std);
    this.#updateStatistics(mean, variance, x.size / this.channels);
    for (const t of [mean, centred, squares, variance, shifted, std]) t.dispose();
    return y;
  }

  /** Caffe's moving averages: `s·f + 1`, `μ + f·mean`, `m/(m−1)·σ² + f·variance`. */
  #updateStatistics(batchMean: Tensor, batchVariance: Tensor, m: number): void {
    const f = this.options.movingAverageFraction;
    const correction = m > 1 ? Math.fround(m / (m - 1)) : 1;
    noGrad(() =>
      tidy(() => {
        const flat = [this.channels];
        const mean = ops.reshape(batchMean, flat), variance = ops.reshape(batchVariance, flat);
        // Every new value is computed before any buffer is overwritten.
        const updates: [Tensor, Tensor][] = [
          [this.scaleFactor, ops.add(ops.mul(this.scaleFactor, f), 1)],
          [this.mean, ops.add(ops.mul(this.mean, f), mean)],
          [this.variance, ops.add(ops.mul(this.variance, f), ops.mul(variance, correction))],
        ];
        for (const [buffer, value] of updates) buffer.assign(value);
      })
    );
  }

  #check(shape: readonly number[]): void {
    if (shape.length < 2 || shape[1] !== this.channels) {
      throw new ShapeError(
        `BatchNorm ${this.path}`.trim(),
        `input ${formatShape(shape)} does not have ${this.channels} channels on axis 1`,
      );
    }
  }

  /** Output shape (the input's) and FLOPs per sample (statistics and normalisation). */
  describe(inputShape: readonly number[]): LayerDescription {
    this.#check(inputShape);
    return { outputShape: [...inputShape], flops: 6 * inputShape.slice(1).reduce((a, b) => a * b, 1) };
  }
}

/**
 * `1/s`, or 0 where `s` is 0 (Caffe: `scale_factor == 0 ? 0 : 1 / scale_factor`), on the backend's
 * kernels, without reading the value back to the host.
 */
function inverseOrZero(s: Tensor): Tensor {
  const zero = fullRaw(s, [], 0), one = fullRaw(s, [], 1);
  const isZero = binaryRaw("equal", s, zero);
  const denominator = binaryRaw("add", s, isZero);
  const numerator = binaryRaw("sub", one, isZero);
  const out = binaryRaw("div", numerator, denominator);
  for (const t of [zero, one, isZero, denominator, numerator]) t.dispose();
  return out;
}
