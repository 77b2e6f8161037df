/**
 * Stochastic gradient descent with momentum and L2 weight decay, exactly as Caffe's `SGDSolver`.
 *
 * Per parameter, with `rate = lr(iteration) · lrMult` and `decay = weightDecay · decayMult`:
 *
 * ```text
 * diff    = grad + decay · w            (Caffe's Regularize, skipped when decay = 0)
 * history = momentum · history + rate · diff
 * w       = w − history
 * ```
 *
 * Difference from PyTorch's `torch.optim.SGD`: Caffe keeps the learning rate inside the momentum
 * history, PyTorch outside it (`buf = momentum · buf + diff; w −= lr · buf`, and `buf = diff` on the
 * first step). With a constant rate the two give the same trajectory (up to float rounding); when the
 * rate drops, Caffe's history still carries velocity accumulated at the old rate and decays it over
 * about `1 / (1 − momentum)` iterations, while PyTorch rescales the whole velocity at once. Tandem
 * follows Caffe so that AlexNet-style solver settings reproduce Caffe's training.
 *
 * @module
 */

import { add, mul, sub } from "../ops/elementwise.ts";
import type { ParameterEntry } from "../nn/parameter.ts";
import type { Tensor } from "../tensor.ts";
import type { SgdStep } from "../../backends/backend.ts";
import { checkRange, type HyperBase, Optimizer, toLrPolicy, type UpdateContext } from "./optimizer.ts";
import type { LrPolicy } from "./lr_policy.ts";

/** Options of {@link SGD}. */
export interface SgdOptions {
  /** Learning rate: a number (fixed) or a policy. Caffe's `base_lr` + `lr_policy`. */
  lr: number | LrPolicy;
  /** Momentum in [0, 1); default 0. */
  momentum?: number;
  /** L2 weight decay ≥ 0, scaled per parameter by `decayMult`; default 0. */
  weightDecay?: number;
}

/** SGD's hyper-parameters as stored in its state and checkpoints. */
export interface SgdHyper extends HyperBase {
  /** Always `"sgd"`. */
  readonly kind: "sgd";
  /** The learning-rate policy. */
  readonly lr: LrPolicy;
  /** Momentum in [0, 1). */
  readonly momentum: number;
  /** L2 weight decay. */
  readonly weightDecay: number;
}

/**
 * Caffe's SGD: momentum history that includes the learning rate, L2 weight decay, per-parameter
 * `lrMult`/`decayMult`. One state slot per parameter: `history`.
 *
 * @example
 * ```ts
 * import { SGD } from "./sgd.ts";
 * import { randn } from "../creation.ts";
 * const w = randn([4, 3], { seed: 1, requiresGrad: true });
 * const optimizer = new SGD(
 *   [{ name: "fc.weight", tensor: w, group: "fc", lrMult: 1, decayMult: 1 }],
 *   { lr: { policy: "step", baseLr: 0.01, gamma: 0.1, stepSize: 1000 }, momentum: 0.9, weightDecay: 5e-4 },
 * );
 * // after backward: optimizer.step(); optimizer.zeroGrad();
 * ```
 */
export class SGD extends Optimizer<SgdHyper> {
  /** An SGD optimizer over `parameters`; throws `ValueError` for bad hyper-parameters. */
  constructor(parameters: readonly ParameterEntry[], options: SgdOptions) {
    super(parameters, {
      kind: "sgd",
      lr: options?.lr as LrPolicy,
      momentum: options?.momentum ?? 0,
      weightDecay: options?.weightDecay ?? 0,
    }, ["history"]);
  }

  /** Validates and normalises SGD's hyper-parameters. */
  protected checkHyper(hyper: SgdHyper): SgdHyper {
    return {
      kind: "sgd",
      lr: toLrPolicy(hyper.lr),
      momentum: checkRange("SGD", "momentum", hyper.momentum, 0, 1),
      weightDecay: checkRange("SGD", "weightDecay", hyper.weightDecay, 0, Infinity),
    };
  }

  /** Caffe's `ComputeUpdateValue` + `Update` for one parameter. */
  protected update(
    param: Tensor,
    grad: Tensor,
    slots: Readonly<Record<string, Tensor>>,
    c: UpdateContext,
  ): boolean | void {
    const fused = param.backend.sgdUpdate;
    if (fused) {
      // Same arithmetic in one pass (the backend rounds exactly like the ops below).
      return fused.call(param.backend, param.storage, grad.storage, slots.history.storage, this.#step(c));
    }
    const diff = c.decay !== 0 ? add(grad, mul(param, c.decay)) : grad;
    const history = add(mul(slots.history, this.settings.momentum), mul(diff, c.rate));
    slots.history.assign(history);
    param.assign(sub(param, history));
  }

  /**
   * The fused update also writes the undo's copies of the parameter and its momentum, in its one
   * pass (on the FC group of the AlexNet-like net, copying first took longer than the update).
   */
  protected override updateSaving(
    param: Tensor,
    grad: Tensor,
    slots: Readonly<Record<string, Tensor>>,
    c: UpdateContext,
    saved: readonly Tensor[],
  ): boolean | void {
    const fused = param.backend.sgdUpdate;
    if (!fused) return super.updateSaving(param, grad, slots, c, saved);
    return fused.call(param.backend, param.storage, grad.storage, slots.history.storage, this.#step(c), {
      param: saved[0].storage,
      history: saved[1].storage,
    });
  }

  #step(c: UpdateContext): SgdStep {
    return { rate: c.rate, momentum: this.settings.momentum, decay: c.decay };
  }
}
