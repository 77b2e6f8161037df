/**
 * One phrase naming which CPU kernels a benchmark ran on, for the reports' headers: the default
 * backend picks WebAssembly SIMD where the runtime has it, so a report must say which it got.
 *
 * @module
 */

import type { CpuBackend } from "../../backends/cpu/backend.ts";

/**
 * E.g. "CPU backend with WebAssembly SIMD kernels (relaxed-SIMD FMA)" or "CPU backend with
 * pure-TypeScript kernels".
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../backends/cpu/backend.ts";
 * import { cpuKernelsLabel } from "./backend_label.ts";
 * console.log(cpuKernelsLabel(new CpuBackend({ kernels: "ts" }))); // "CPU backend with pure-TypeScript kernels"
 * ```
 */
export function cpuKernelsLabel(backend: CpuBackend): string {
  if (backend.kernels === "ts") return "CPU backend with pure-TypeScript kernels";
  const multiplyAdd = backend.fusedMultiplyAdd ? "relaxed-SIMD FMA" : "SIMD128 mul + add";
  return `CPU backend with WebAssembly SIMD kernels (${multiplyAdd})`;
}
