/**
 * Local response normalisation within each channel (Caffe `LRN` with `norm_region:
 * WITHIN_CHANNEL`, as in cifar10_full): every value is divided by a power of the sum of squares over
 * the `size`×`size` window around it in its own channel, zero-padded at the borders:
 * `y = x · (1 + α/size² · Σ x²)^(−β)`. Caffe builds it from a square, an average pooling (kernel
 * `size`, stride 1, padding `(size − 1)/2`, divisor `size²` everywhere since the window always fits
 * the padded map), a power layer `(1 + α·avg)^(−β)` and a product; so is this one, from engine ops,
 * so its gradient is the engine's. Caffe's `k` plays no part here.
 *
 * @module
 */

import { ShapeError } from "../errors.ts";
import * as ops from "../ops/mod.ts";
import type { Tensor } from "../tensor.ts";
import { type LayerDescription, Module } from "./module.ts";

/**
 * WITHIN_CHANNEL LRN (see the module notes).
 *
 * @example
 * ```ts
 * import { WithinChannelLRN } from "./lrn_within_channel.ts";
 * const norm1 = new WithinChannelLRN({ size: 3, alpha: 5e-5, beta: 0.75 }); // cifar10_full
 * ```
 */
export class WithinChannelLRN extends Module {
  /** Layer type. */
  readonly kind = "WithinChannelLRN";
  /** Window side, alpha and beta (Caffe defaults 5, 1, 0.75 where omitted). */
  readonly params: { size: number; alpha: number; beta: number };

  /** A within-channel LRN; `size` must be odd, as Caffe requires. */
  constructor(params: { size?: number; alpha?: number; beta?: number } = {}) {
    super();
    this.params = { size: params.size ?? 5, alpha: params.alpha ?? 1, beta: params.beta ?? 0.75 };
    const size = this.params.size;
    if (!Number.isInteger(size) || size < 1 || size % 2 === 0) {
      throw new ShapeError("WithinChannelLRN", `size must be a positive odd integer, got ${size}`);
    }
  }

  /** Normalises a batch of NCHW maps. */
  forward(x: Tensor): Tensor {
    if (x.rank !== 4) throw new ShapeError("WithinChannelLRN", `expects NCHW input, got rank ${x.rank}`);
    const { size, alpha, beta } = this.params;
    const squares = ops.mul(x, x);
    const average = ops.avgPool2d(squares, { kernel: size, stride: 1, padding: (size - 1) / 2 });
    const scaled = ops.mul(average, alpha);
    const base = ops.add(scaled, 1);
    const power = ops.pow(base, -beta);
    const y = ops.mul(x, power);
    for (const t of [squares, average, scaled, base, power]) t.dispose();
    return y;
  }

  /** Output shape (the input's) and FLOPs per sample. */
  describe(inputShape: readonly number[]): LayerDescription {
    if (inputShape.length !== 4) {
      throw new ShapeError("WithinChannelLRN", `expects NCHW input, got rank ${inputShape.length}`);
    }
    const elements = inputShape.slice(1).reduce((a, b) => a * b, 1);
    return { outputShape: [...inputShape], flops: (this.params.size ** 2 + 5) * elements };
  }
}
