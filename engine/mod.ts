/**
 * The whole engine in one import: tensors and their creation, autograd, memory scopes, the `ops`
 * namespace, layers, optimizers, checkpoints, data, the model zoo, Caffe import and the training
 * loops, independent of any concrete backend. The narrower entries (`./nn`, `./optim`, `./io`,
 * `./data`, `./models`, `./caffe`) export the same symbols area by area; this one adds what has no
 * area of its own: autograd passes, seeded random values, non-finite checks and replica steps.
 *
 * @example
 * ```ts
 * import "../mod.ts"; // registers the CPU backend
 * import { findNonFinite, ops, tensor, uniformValues, valueAndGrad } from "./mod.ts";
 *
 * const x = tensor(Array.from(uniformValues(4, { seed: 1 })));
 * const { value, grads } = valueAndGrad((t) => ops.sum(ops.mul(t, t)))(x);
 * console.log(await value.item(), await findNonFinite([{ name: "dx", tensor: grads[0] }])); // …, undefined
 * ```
 *
 * @module
 */

export { Tensor } from "./tensor.ts";
export {
  type CreationOptions,
  full,
  type NestedArray,
  ones,
  randn,
  type RandomOptions,
  scalar,
  tensor,
  type TensorOptions,
  uniform,
  zeros,
} from "./creation.ts";
export { manualSeed, normalValues, type RandomKey, uniformValues } from "./random.ts";
export {
  type BackwardFn,
  type BackwardOptions,
  BackwardPass,
  backwardPass,
  valueAndGrad,
} from "./autograd.ts";
export {
  getBackend,
  memory,
  type MemoryInfo,
  noGrad,
  registerBackend,
  type ScopedResource,
  setBackend,
  tidy,
} from "./context.ts";
export { DisposedError, NonFiniteError, ShapeError, TandemError, ValueError } from "./errors.ts";
export { findNonFinite, firstNonFinite, type NonFiniteValue } from "./finite.ts";
export * as ops from "./ops/mod.ts";
export {
  countCorrect,
  evaluate,
  type EvaluationResult,
  fit,
  type FitOptions,
  type FitResult,
  type LabelledBatch,
  type StepInfo,
  type StepMetrics,
  trainStep,
  type TrainStepOptions,
} from "./train/trainer.ts";
export {
  averageGradients,
  replicaStep,
  type ReplicaStepOptions,
  trainingLoss,
} from "./train/replica_step.ts";
export * from "./nn/mod.ts";
export * from "./optim/mod.ts";
export * from "./io/mod.ts";
export * from "./data/mod.ts";
export * from "./models/mod.ts";
export * from "./caffe/mod.ts";
