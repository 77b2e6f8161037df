/**
 * Named, grouped parameters: what optimizers, checkpoints and the data-parallel schedule see of a
 * model.
 *
 * @module
 */

import type { Tensor } from "../tensor.ts";

/**
 * One trainable tensor with its place in the model.
 *
 * @example
 * ```ts
 * import type { ParameterEntry } from "./parameter.ts";
 * function describe(p: ParameterEntry) {
 *   return `${p.name} [${p.tensor.shape}] group=${p.group} lr×${p.lrMult} decay×${p.decayMult}`;
 * }
 * ```
 */
export interface ParameterEntry {
  /** Stable dotted name, e.g. `conv2.weight`; the key in checkpoints. */
  readonly name: string;
  /** The values; optimizers update it in place with `assign`. */
  readonly tensor: Tensor;
  /**
   * Parameter group (`conv` or `fc` by default): the schedule runtime reduces and updates by group,
   * and `optimizer.step(group)` updates one group.
   */
  readonly group: string;
  /** Multiplier of the learning rate (Caffe's `lr_mult`; biases default to 2). */
  readonly lrMult: number;
  /** Multiplier of the weight decay (Caffe's `decay_mult`; biases default to 0). */
  readonly decayMult: number;
}

/**
 * One buffer of a model: state a module updates itself in its forward pass (BatchNorm's running
 * mean, variance and moving-average factor), without gradient or optimizer. Data-parallel replicas
 * each keep their own; the evaluated and checkpointed model carries device 0's.
 *
 * @example
 * ```ts
 * import type { BufferEntry } from "./parameter.ts";
 * const describe = (b: BufferEntry) => `${b.name} [${b.tensor.shape}]`;
 * ```
 */
export interface BufferEntry {
  /** Stable dotted name, e.g. `bn1.mean`; the key in checkpoints. */
  readonly name: string;
  /** The values; the module updates them in place with `assign`. */
  readonly tensor: Tensor;
}
