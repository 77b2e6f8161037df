/**
 * Optimizers (Caffe's SGD, Adam), learning-rate policies and the optimizer base class.
 *
 * @example
 * ```ts
 * import { learningRate, SGD } from "./mod.ts";
 * console.log(learningRate({ policy: "inv", baseLr: 0.01, gamma: 1e-4, power: 0.75 }, 100));
 * void SGD;
 * ```
 *
 * @module
 */

export { Adam, type AdamHyper, type AdamOptions } from "./adam.ts";
export {
  type HyperBase,
  Optimizer,
  type OptimizerState,
  type OptimizerStateInfo,
  type StepOptions,
  type UpdateContext,
} from "./optimizer.ts";
export { checkLrPolicy, learningRate, type LrPolicy } from "./lr_policy.ts";
export {
  disposeOptimizerState,
  type PackedSlot,
  type PackedStateHeader,
  packOptimizerState,
  unpackOptimizerState,
} from "./state_codec.ts";
export { SGD, type SgdHyper, type SgdOptions } from "./sgd.ts";
