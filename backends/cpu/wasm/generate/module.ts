/**
 * Assembles the CPU backend's kernel module (GEMM, convolution helpers, max and average pooling,
 * the elementwise, optimizer and LRN kernels, the non-finite scan, dropout masks, the Winograd
 * transforms, the direct weight gradient) for the features the engine has,
 * and instantiates it over a memory that can grow and, where the engine allows, be shared with pool
 * threads.
 *
 * @module
 */

import { ModuleBuilder } from "./encoder.ts";
import { CONV_EXPORTS, emitConvKernels } from "./conv_kernels.ts";
import { emitElementwiseKernels, emitFiniteKernel } from "./elementwise_kernels.ts";
import { emitLrnKernels } from "./lrn_kernels.ts";
import { emitGemmKernels } from "./gemm_kernels.ts";
import { emitPooledFilterKernels } from "./filter_pooled_kernels.ts";
import { emitMaxPoolKernels } from "./max_pool_kernels.ts";
import { emitAvgPoolKernels } from "./avg_pool_kernels.ts";
import { emitOptimizerKernels } from "./optimizer_kernels.ts";
import { emitRandomKernels } from "./random_kernels.ts";
import { emitWinogradKernels } from "./winograd_kernels.ts";
import { emitFilterKernels } from "./filter_kernels.ts";
import { GEMM_TILE, type GemmExports } from "../gemm.ts";

/**
 * Largest memory the kernels use: 2 GiB (32768 pages of 64 KiB). Calls needing more fall back to TypeScript.
 *
 * @example
 * ```ts
 * import { MAX_MEMORY_PAGES } from "./module.ts";
 * console.log(MAX_MEMORY_PAGES * 65536); // 2147483648
 * ```
 */
export const MAX_MEMORY_PAGES = 32768;

/** Which code to generate. */
export interface KernelModuleOptions {
  /**
   * Use relaxed SIMD (only where detected): fused multiply-add in GEMM, and lane select, exact on
   * comparison masks, in max pooling.
   */
  fma: boolean;
  /** Import a shared memory (threads) rather than a plain one. */
  shared: boolean;
}

/** Every function the kernel module exports. */
export interface KernelExports extends GemmExports {
  /** See `WINOGRAD_EXPORTS`: `(src, lanes, count, srcStep, dst, dstStep, inStride, outStride, wrapEvery, srcWrap, dstWrap)`. */
  [transform: `winograd_${string}`]: (...args: number[]) => void;
  /** See `pooledFilterExport` in `filter_pooled_kernels.ts`: one per kernel shape. */
  [pooledFilter: `conv_filter_pooled_${string}`]: (...args: number[]) => void;
  /** See `CONV_EXPORTS.im2col`. */
  conv_im2col(...args: number[]): void;
  /** See `CONV_EXPORTS.col2imAdd`. */
  conv_col2im_add(...args: number[]): void;
  /** See `CONV_EXPORTS.col2imPadded`. */
  conv_col2im_padded(...args: number[]): void;
  /** See `CONV_EXPORTS.unpad`. */
  conv_unpad(...args: number[]): void;
  /** See `CONV_EXPORTS.fillZero`. */
  fill_zero(address: number, bytes: number): void;
  /** See `CONV_EXPORTS.pad`. */
  conv_pad(...args: number[]): void;
  /** See `CONV_EXPORTS.packColumns`. */
  conv_pack_columns(...args: number[]): void;
  /** See `CONV_EXPORTS.packRows`. */
  conv_pack_rows(...args: number[]): void;
  /** See `FILTER_EXPORTS.dot`. */
  conv_filter_dot(...args: number[]): void;
  /** See `MAX_POOL_EXPORTS.maxForward`. */
  max_pool_forward(...args: number[]): void;
  /** See `MAX_POOL_EXPORTS.maxBackward`. */
  max_pool_backward(
    dy: number,
    argmax: number,
    dx: number,
    planes: number,
    inPlane: number,
    outPlane: number,
    reluOf: number,
    masked: number,
  ): void;
  /** See `AVG_POOL_EXPORTS.avgForward`. */
  avg_pool_forward(x: number, out: number, divisors: number, ...geometry: number[]): void;
  /** See `AVG_POOL_EXPORTS.avgBackward`. */
  avg_pool_backward(
    dy: number,
    dx: number,
    divisors: number,
    shares: number,
    shareRow: number,
    ...geometry: number[]
  ): void;
  /** See `OPTIMIZER_EXPORTS.sgdUpdate`. */
  sgd_update(...args: number[]): void;
  /** See `OPTIMIZER_EXPORTS.sgdUpdateSaving`. */
  sgd_update_saving(...args: number[]): void;
  /** See `OPTIMIZER_EXPORTS.adamUpdate`. */
  adam_update(...args: number[]): void;
  /** See `ELEMENTWISE_EXPORTS.relu`. */
  relu(x: number, out: number, n: number): void;
  /** See `LRN_EXPORTS.forward` (k and coef are float64). */
  lrn_forward(
    x: number,
    out: number,
    scale: number,
    acc: number,
    images: number,
    channels: number,
    plane: number,
    half: number,
    k: number,
    coef: number,
  ): void;
  /** See `LRN_EXPORTS.backward` (cross is float64). */
  lrn_backward(
    x: number,
    y: number,
    scale: number,
    dy: number,
    dx: number,
    acc: number,
    images: number,
    channels: number,
    plane: number,
    half: number,
    cross: number,
  ): void;
  /** See `ELEMENTWISE_EXPORTS.reluGrad`. */
  relu_grad(dy: number, y: number, out: number, n: number): void;
  /** See `ELEMENTWISE_EXPORTS.addChannels`. */
  add_channels(x: number, bias: number, out: number, outer: number, channels: number, inner: number): void;
  /** See `ELEMENTWISE_EXPORTS.biasRows`. */
  bias_rows(c: number, bias: number, rows: number, columns: number, rowBytes: number, relu: number): void;
  /** See `ELEMENTWISE_EXPORTS.channelBias`. */
  channel_bias(y: number, bias: number, channels: number, inner: number, relu: number): void;
  /** See `ELEMENTWISE_EXPORTS.sumRows`. */
  sum_rows(x: number, out: number, rows: number, size: number): void;
  /** See `ELEMENTWISE_EXPORTS.addScale`. */
  add_scale(a: number, b: number, out: number, n: number, scale: number): void;
  /** See `ELEMENTWISE_EXPORTS.mul`. */
  mul(a: number, b: number, out: number, n: number): void;
  /** See `ELEMENTWISE_EXPORTS.firstNonFinite`. */
  first_non_finite(x: number, n: number, first: number, slot: number): void;
  /** See `RANDOM_EXPORTS.dropoutMask` (keep is float32). */
  dropout_mask(
    out: number,
    count: number,
    blockLo: number,
    blockHi: number,
    skip: number,
    k0: number,
    k1: number,
    stream: number,
    step: number,
    threshold: number,
    keep: number,
    scratch: number,
  ): void;
}

/**
 * The kernel module's bytes.
 *
 * @example
 * ```ts
 * import { kernelModuleBytes } from "./module.ts";
 * console.log(WebAssembly.validate(kernelModuleBytes({ fma: false, shared: false }))); // true
 * ```
 */
export function kernelModuleBytes(options: KernelModuleOptions): Uint8Array<ArrayBuffer> {
  const builder = new ModuleBuilder().importMemory({
    module: "env",
    name: "memory",
    initialPages: 1,
    maximumPages: MAX_MEMORY_PAGES,
    shared: options.shared,
  });
  emitGemmKernels(builder, { mr: GEMM_TILE.mr, nr: GEMM_TILE.nr, unroll: 4, fma: options.fma });
  emitConvKernels(builder);
  emitMaxPoolKernels(builder, { relaxed: options.fma });
  emitAvgPoolKernels(builder);
  emitOptimizerKernels(builder);
  emitElementwiseKernels(builder);
  emitLrnKernels(builder);
  // Last, so the functions above keep their indices (and the module its bytes up to here).
  emitFiniteKernel(builder);
  emitRandomKernels(builder);
  emitWinogradKernels(builder);
  emitFilterKernels(builder, { fma: options.fma });
  emitPooledFilterKernels(builder, { fma: options.fma });
  return builder.build();
}

/**
 * Instantiates compiled kernels over `memory` (synchronously: the module is small) and returns
 * the exports, typed.
 *
 * @example
 * ```ts
 * import { instantiateKernels, kernelModuleBytes, MAX_MEMORY_PAGES } from "./module.ts";
 * const module = new WebAssembly.Module(kernelModuleBytes({ fma: false, shared: false }));
 * const memory = new WebAssembly.Memory({ initial: 16, maximum: MAX_MEMORY_PAGES });
 * const kernels = instantiateKernels(module, memory);
 * kernels.fill_zero(0, 64);
 * ```
 */
export function instantiateKernels(module: WebAssembly.Module, memory: WebAssembly.Memory): KernelExports {
  const instance = new WebAssembly.Instance(module, { env: { memory } });
  const exports = instance.exports as unknown as KernelExports;
  if (typeof exports[CONV_EXPORTS.fillZero] !== "function") {
    throw new Error("kernel module lacks its exports");
  }
  return exports;
}
