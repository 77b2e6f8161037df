/**
 * The engine: tensors, autograd, memory scopes and ops, independent of any concrete backend.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "./mod.ts";
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
export { manualSeed, normalValues, philox4x32, type RandomKey, uniformValues } from "./random.ts";
export {
  type BackwardFn,
  type BackwardOptions,
  BackwardPass,
  backwardPass,
  GradNode,
  valueAndGrad,
} from "./autograd.ts";
export {
  getBackend,
  type Kept,
  memory,
  type MemoryInfo,
  noGrad,
  registerBackend,
  type ScopedResource,
  setBackend,
  tidy,
} from "./runtime.ts";
export { DisposedError, NonFiniteError, ShapeError, TandemError, ValueError } from "./errors.ts";
export * as ops from "./ops/mod.ts";
