/**
 * Tandem: a data-parallel deep-learning framework for Deno, written from scratch in TypeScript.
 *
 * Importing this module registers the CPU backend and makes it current.
 *
 * @example
 * ```ts
 * import { ops, randn, tensor, tidy } from "./mod.ts";
 *
 * const w = randn([3, 4], { seed: 1, std: 0.1, requiresGrad: true });
 * const x = randn([8, 4], { seed: 2 });
 * const labels = tensor([0, 1, 2, 0, 1, 2, 0, 1], { dtype: "int32" });
 * tidy(() => {
 *   const loss = ops.softmaxCrossEntropy(ops.linear(x, w), labels);
 *   loss.backward(); // w.grad now holds dLoss/dw
 * });
 * ```
 *
 * @module
 */

import { CpuBackend } from "./backends/cpu/backend.ts";
import { registerBackend } from "./engine/context.ts";

export * from "./engine/mod.ts";
export * from "./schedule/mod.ts";
export type {
  AdamStep,
  Backend,
  BinaryOp,
  Conv2dGeometry,
  DType,
  HostArray,
  LrnParams,
  MatmulSpec,
  Pool2dGeometry,
  ReduceOp,
  RowSpec,
  SgdStep,
  StagedValues,
  Storage,
  StridedView,
  UnaryOp,
} from "./backends/backend.ts";
export type { Pair } from "./backends/geometry.ts";
export { CpuBackend };
export {
  createWebGpuBackend,
  type TransferEvent,
  WebGpuBackend,
  type WebGpuBackendOptions,
} from "./backends/webgpu/backend.ts";

registerBackend(new CpuBackend());
