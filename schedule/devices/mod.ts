/**
 * Devices: the contract a device handle implements for the data-parallel runtime (one full replica,
 * host-visible parameter and gradient buffers, a compute lane that announces each group's gradients
 * as soon as they are final), the two built-in devices (a CPU Worker, and any registered backend
 * such as WebGPU in this thread), model specs that a Worker or rank can rebuild, and the flat
 * parameter layout devices share.
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { buildModel, layoutOf } from "./mod.ts";
 *
 * const model = await buildModel({ kind: "builtin", name: "lenet", options: { seed: 1 } });
 * const layout = layoutOf(model.namedParameters());
 * console.log(layout.total, layout.groups.map((g) => g.name));
 * ```
 *
 * @module
 */

export {
  type ComputeCommand,
  type ComputeResult,
  type Device,
  DeviceError,
  type ResidentReplica,
  type ResidentRole,
  type ShardedReplica,
} from "./device.ts";
export {
  type BufferLayout,
  bufferLayoutOf,
  type BufferSlot,
  copyBuffers,
  hostBufferEntries,
} from "./buffer_layout.ts";
export { CpuDevice } from "./cpu_device.ts";
export { BackendDevice } from "./backend_device.ts";
export { buildModel, layerParameterBytes, type ModelSpec } from "./model_spec.ts";
export {
  backwardGroupOrder,
  type GroupRange,
  groupRange,
  layoutOf,
  type ParameterLayout,
  type ParameterSlot,
  parametersSha256,
} from "./parameter_layout.ts";
export type { ComputeSpan } from "./protocol.ts";
export type { HeadLayout, HeadStage } from "./head_layout.ts";
export type { HeadPhase, HeadPhaseResult, HeadSetup, SumSource } from "./sharded_head.ts";
