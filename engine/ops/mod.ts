/**
 * Every differentiable op, gathered as the `ops` namespace of the public API.
 *
 * @example
 * ```ts
 * import { ops, randn } from "../../mod.ts";
 * const y = ops.relu(ops.linear(randn([2, 4], { seed: 1 }), randn([3, 4], { seed: 2 })));
 * ```
 *
 * @module
 */

export {
  add,
  div,
  exp,
  log,
  maximum,
  mul,
  neg,
  pow,
  relu,
  sqrt,
  sub,
  type TensorLike,
} from "./elementwise.ts";
export { max, mean, type ReduceOptions, sum } from "./reduce.ts";
export { concat, flatten, permute, reshape, slice, transpose } from "./movement.ts";
export { linear, type LinearOptions, matmul, type MatmulOptions } from "./matmul.ts";
export {
  avgPool2d,
  conv2d,
  type Conv2dFusion,
  type Conv2dOptions,
  lrn,
  type LrnParams,
  maxPool2d,
  type Pool2dOptions,
} from "./cnn.ts";
export { type CrossEntropyOptions, logSoftmax, softmax, softmaxCrossEntropy } from "./softmax.ts";
export { dropout, type DropoutOptions } from "./dropout.ts";
