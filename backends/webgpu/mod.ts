/**
 * The WebGPU backend: storages are GPU buffers and every kernel is a WGSL compute shader, so training
 * stays on the GPU between steps. {@link createWebGpuBackend} returns null where the runtime has no
 * WebGPU adapter.
 *
 * @example
 * ```ts
 * import { createWebGpuBackend } from "./mod.ts";
 * import { registerBackend, setBackend } from "../../mod.ts";
 *
 * const gpu = await createWebGpuBackend();
 * if (gpu) {
 *   registerBackend(gpu);
 *   setBackend("webgpu");
 * }
 * ```
 *
 * @module
 */

export {
  createWebGpuBackend,
  type TransferEvent,
  WebGpuBackend,
  type WebGpuBackendOptions,
  WebGpuStorage,
} from "./backend.ts";
