/**
 * Adam (Kingma & Ba, 2015) with L2 weight decay, computed as PyTorch's `torch.optim.Adam`
 * (`amsgrad=False`, `maximize=False`).
 *
 * Per parameter, with `rate = lr(iteration) · lrMult`, `decay = weightDecay · decayMult` and `t` the
 * parameter's own update count (1 on its first update):
 *
 * ```text
 * g = grad + decay · w                         (L2 as in Caffe and PyTorch's Adam, not AdamW)
 * m = β1 · m + (1 − β1) · g
 * v = β2 · v + (1 − β2) · g²
 * w = w − rate / (1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
 * ```
 *
 * Caffe's `AdamSolver` differs only in where ε sits: `w −= rate · √(1 − β2^t) / (1 − β1^t) · m / (√v + ε)`
 * (ε is not bias-corrected), and it takes `t` from the global iteration. Tandem takes PyTorch's form and a
 * per-parameter `t`, so a parameter skipped for lack of a gradient keeps its bias correction in step
 * with its own moments.
 *
 * @module
 */

import { add, div, mul, sqrt, sub } from "../ops/elementwise.ts";
import type { ParameterEntry } from "../nn/parameter.ts";
import type { Tensor } from "../tensor.ts";
import { checkRange, type HyperBase, Optimizer, toLrPolicy, type UpdateContext } from "./optimizer.ts";
import type { LrPolicy } from "./lr_policy.ts";

/** Options of {@link Adam}. */
export interface AdamOptions {
  /** Learning rate: a number (fixed) or a policy; default 0.001. */
  lr?: number | LrPolicy;
  /** Decay of the first moment, in [0, 1); default 0.9. */
  beta1?: number;
  /** Decay of the second moment, in [0, 1); default 0.999. */
  beta2?: number;
  /** Added to the denominator, ≥ 0; default 1e-8. */
  eps?: number;
  /** L2 weight decay ≥ 0 added to the gradient, scaled by `decayMult`; default 0. */
  weightDecay?: number;
}

/** Adam's hyper-parameters as stored in its state and checkpoints. */
export interface AdamHyper extends HyperBase {
  /** Always `"adam"`. */
  readonly kind: "adam";
  /** The learning-rate policy. */
  readonly lr: LrPolicy;
  /** First-moment decay. */
  readonly beta1: number;
  /** Second-moment decay. */
  readonly beta2: number;
  /** Denominator term. */
  readonly eps: number;
  /** L2 weight decay. */
  readonly weightDecay: number;
}

/**
 * Adam with bias correction per parameter and L2 weight decay. State slots per parameter: `m` (first
 * moment) and `v` (second moment), plus the update count in the state's `updates`.
 *
 * @example
 * ```ts
 * import { Adam } from "./adam.ts";
 * import { randn } from "../creation.ts";
 * const w = randn([4, 3], { seed: 1, requiresGrad: true });
 * const optimizer = new Adam([{ name: "w", tensor: w, group: "fc", lrMult: 1, decayMult: 1 }], { lr: 1e-3 });
 * ```
 */
export class Adam extends Optimizer<AdamHyper> {
  /** An Adam optimizer over `parameters`; throws `ValueError` for bad hyper-parameters. */
  constructor(parameters: readonly ParameterEntry[], options: AdamOptions = {}) {
    super(parameters, {
      kind: "adam",
      lr: options.lr ?? 0.001,
      beta1: options.beta1 ?? 0.9,
      beta2: options.beta2 ?? 0.999,
      eps: options.eps ?? 1e-8,
      weightDecay: options.weightDecay ?? 0,
    } as AdamHyper, ["m", "v"]);
  }

  /** Validates and normalises Adam's hyper-parameters. */
  protected checkHyper(hyper: AdamHyper): AdamHyper {
    return {
      kind: "adam",
      lr: toLrPolicy(hyper.lr),
      beta1: checkRange("Adam", "beta1", hyper.beta1, 0, 1),
      beta2: checkRange("Adam", "beta2", hyper.beta2, 0, 1),
      eps: checkRange("Adam", "eps", hyper.eps, 0, Infinity),
      weightDecay: checkRange("Adam", "weightDecay", hyper.weightDecay, 0, Infinity),
    };
  }

  /** One Adam update, in the operation order of PyTorch's single-tensor implementation. */
  protected update(
    param: Tensor,
    grad: Tensor,
    slots: Readonly<Record<string, Tensor>>,
    c: UpdateContext,
  ): void {
    const { beta1, beta2, eps } = this.settings;
    const fused = param.backend.adamUpdate;
    if (fused) {
      // Same arithmetic in one pass (the backend rounds exactly like the ops below).
      fused.call(param.backend, param.storage, grad.storage, slots.m.storage, slots.v.storage, {
        rate: c.rate,
        beta1,
        beta2,
        eps,
        decay: c.decay,
        correction1: 1 - Math.pow(beta1, c.count),
        correction2: 1 - Math.pow(beta2, c.count),
      });
      return;
    }
    const g = c.decay !== 0 ? add(grad, mul(param, c.decay)) : grad;
    const m = add(mul(slots.m, beta1), mul(g, 1 - beta1));
    const v = add(mul(slots.v, beta2), mul(mul(g, g), 1 - beta2));
    slots.m.assign(m);
    slots.v.assign(v);
    const correction1 = 1 - Math.pow(beta1, c.count);
    const correction2 = 1 - Math.pow(beta2, c.count);
    const denominator = add(div(sqrt(v), Math.sqrt(correction2)), eps);
    param.assign(sub(param, mul(div(m, denominator), c.rate / correction1)));
  }
}
