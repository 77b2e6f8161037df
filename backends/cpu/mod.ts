/**
 * The CPU backend: typed arrays on the host, with WebAssembly SIMD kernels (multi-threaded for the
 * heavy ones) where the runtime has SIMD128 and plain TypeScript everywhere else. Importing the
 * package root registers one as `"cpu"`; construct another, e.g. the pure-TypeScript reference, to
 * register it beside it.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "./mod.ts";
 * import { registerBackend, setBackend } from "../../mod.ts";
 *
 * registerBackend(new CpuBackend({ name: "cpu-ts", kernels: "ts" }));
 * setBackend("cpu-ts"); // every op now runs the TypeScript reference kernels
 * setBackend("cpu");
 * ```
 *
 * @module
 */

export { CpuBackend, type CpuBackendOptions, CpuStorage } from "./backend.ts";
export type { GemmBlocks } from "./wasm/gemm.ts";
export type { MemoryLoan } from "../backend.ts";
export {
  type BlocksSource,
  type CacheSizes,
  describeMachineBlocks,
  GemmBlocksError,
  type MachineBlocks,
  machineGemmBlocks,
} from "./wasm/blocking.ts";
