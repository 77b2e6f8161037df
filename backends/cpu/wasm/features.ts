/**
 * What the running WebAssembly engine supports, found by validating tiny generated modules rather
 * than by asking for a version: SIMD128, relaxed SIMD's fused multiply-add, and shared memories
 * (the threads proposal: one memory seen by several Workers).
 *
 * @module
 */

import { type FunctionWriter, ModuleBuilder, ValType } from "./generate/encoder.ts";

/** The engine's support for the features the generated kernels can use. */
export interface WasmFeatures {
  /** `WebAssembly` exists at all. */
  webAssembly: boolean;
  /** 128-bit SIMD (`v128`, `f32x4.*`). */
  simd128: boolean;
  /** Relaxed SIMD (`f32x4.relaxed_madd`, fused where the hardware has FMA). */
  relaxedSimd: boolean;
  /** Shared memories (`WebAssembly.Memory({ shared: true })` over a `SharedArrayBuffer`). */
  sharedMemory: boolean;
}

function validates(write: (f: FunctionWriter) => void): boolean {
  try {
    const builder = new ModuleBuilder();
    builder.addFunction(undefined, [], [ValType.v128], write);
    return WebAssembly.validate(builder.build());
  } catch {
    return false;
  }
}

function sharedMemoryWorks(): boolean {
  try {
    const memory = new WebAssembly.Memory({ initial: 1, maximum: 1, shared: true });
    return typeof SharedArrayBuffer !== "undefined" && memory.buffer instanceof SharedArrayBuffer;
  } catch {
    return false;
  }
}

let detected: WasmFeatures | undefined;

/**
 * Detects (once, then cached) what the engine supports.
 *
 * @example
 * ```ts
 * import { detectWasmFeatures } from "./features.ts";
 * const { simd128, relaxedSimd } = detectWasmFeatures();
 * console.log(`SIMD128 ${simd128}, relaxed SIMD ${relaxedSimd}`);
 * ```
 */
export function detectWasmFeatures(): WasmFeatures {
  if (detected) return detected;
  const webAssembly = typeof WebAssembly === "object" && typeof WebAssembly.validate === "function";
  const simd128 = webAssembly &&
    validates((f) => {
      f.v128ConstF32([1, 2, 3, 4]).v128ConstF32([5, 6, 7, 8]).f32x4Add();
    });
  const relaxedSimd = simd128 &&
    validates((f) => {
      f.v128ConstF32([1, 2, 3, 4]).v128ConstF32([5, 6, 7, 8]).v128ConstF32([0, 0, 0, 0]).f32x4RelaxedMadd();
    });
  detected = { webAssembly, simd128, relaxedSimd, sharedMemory: webAssembly && sharedMemoryWorks() };
  return detected;
}

/**
 * One line for benchmark output, e.g. `"SIMD128 yes, relaxed SIMD (FMA) yes, shared memory yes"`.
 *
 * @example
 * ```ts
 * import { describeWasmFeatures } from "./features.ts";
 * console.log(describeWasmFeatures());
 * ```
 */
export function describeWasmFeatures(features: WasmFeatures = detectWasmFeatures()): string {
  const yes = (b: boolean) => (b ? "yes" : "no");
  return `SIMD128 ${yes(features.simd128)}, relaxed SIMD (f32x4.relaxed_madd) ${
    yes(features.relaxedSimd)
  }, shared memory ${yes(features.sharedMemory)}`;
}
