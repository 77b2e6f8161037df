/**
 * Caffe's `Scale` layer: a learned per-channel scale, and with `bias_term` a per-channel shift,
 * `y = x · γ_c (+ β_c)` over axis 1 — what follows a `BatchNorm` layer in Caffe's ResNets. Built from
 * `mul`, `add` and `reshape`, so its gradients are the engine's.
 *
 * @module
 */

import { formatShape, ShapeError } from "../errors.ts";
import * as ops from "../ops/mod.ts";
import type { Tensor } from "../tensor.ts";
import type { Filler } from "./init.ts";
import type { Multipliers } from "./layers.ts";
import { type LayerDescription, Module } from "./module.ts";

/** Options of {@link Scale}, Caffe's `scale_param` and `param` blocks. */
export interface ScaleOptions {
  /** Learn a shift too (Caffe `bias_term`, default false). */
  bias?: boolean;
  /** Scale initialiser (Caffe `filler`, default constant 1). */
  filler?: Filler;
  /** Shift initialiser (Caffe `bias_filler`, default constant 0). */
  biasFiller?: Filler;
  /** Scale multipliers (Caffe default lr ×1, decay ×1). */
  multipliers?: Multipliers;
  /** Shift multipliers (Caffe default lr ×1, decay ×1). */
  biasMultipliers?: Multipliers;
  /** Parameter group (default `conv`). */
  group?: string;
}

/**
 * A per-channel scale (and shift) of `channels` channels, parameters `weight` and `bias` as Caffe's
 * blobs 0 and 1.
 *
 * @example
 * ```ts
 * import { Scale } from "./scale.ts";
 * const scale = new Scale(64, { bias: true });
 * ```
 */
export class Scale extends Module {
  /** Layer type. */
  readonly kind = "Scale";
  /** `[channels]` scale γ. */
  readonly weight: Tensor;
  /** `[channels]` shift β, or null without `bias_term`. */
  readonly bias: Tensor | null;

  /** Creates the layer; parameters hold their fillers' values after `initialize(seed)`. */
  constructor(readonly channels: number, options: ScaleOptions = {}) {
    super();
    this.weight = this.addParameter("weight", [channels], {
      filler: options.filler ?? { type: "constant", value: 1 },
      lrMult: options.multipliers?.lrMult ?? 1,
      decayMult: options.multipliers?.decayMult ?? 1,
      group: options.group,
    });
    this.bias = options.bias
      ? this.addParameter("bias", [channels], {
        filler: options.biasFiller ?? { type: "constant", value: 0 },
        lrMult: options.biasMultipliers?.lrMult ?? 1,
        decayMult: options.biasMultipliers?.decayMult ?? 1,
        group: options.group,
      })
      : null;
  }

  /** Scales (and shifts) each channel. */
  forward(x: Tensor): Tensor {
    this.#check(x.shape);
    const kept = x.shape.map((d, i) => (i === 1 ? d : 1));
    const gamma = ops.reshape(this.weight, kept);
    const scaled = ops.mul(x, gamma);
    gamma.dispose();
    if (!this.bias) return scaled;
    const beta = ops.reshape(this.bias, kept);
    const y = ops.add(scaled, beta);
    scaled.dispose();
    beta.dispose();
    return y;
  }

  #check(shape: readonly number[]): void {
    if (shape.length < 2 || shape[1] !== this.channels) {
      throw new ShapeError(
        `Scale ${this.path}`.trim(),
        `input ${formatShape(shape)} does not have ${this.channels} channels on axis 1`,
      );
    }
  }

  /** Output shape (the input's) and FLOPs per sample. */
  describe(inputShape: readonly number[]): LayerDescription {
    this.#check(inputShape);
    const elements = inputShape.slice(1).reduce((a, b) => a * b, 1);
    return { outputShape: [...inputShape], flops: (this.bias ? 2 : 1) * elements };
  }
}
