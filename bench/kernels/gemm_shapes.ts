/**
 * The GEMM shapes the benchmarks measure, defined once: square products and the three products of
 * a 9216→4096 fully connected layer at batch 64 (Y = X·Wᵀ, dX = dY·W, dW = dYᵀ·X); their flop
 * count, and GFLOP/s as a share of the machine's measured WebAssembly peak
 * (`backends/cpu/wasm/peak.ts`).
 *
 * @module
 */

import type { MatmulSpec } from "../../backends/backend.ts";
import type { WasmPeak } from "../../backends/cpu/wasm/peak.ts";

/** One product C (m×n) = op(A)·op(B) with inner dimension k. */
export interface GemmShape {
  /** Label for tables. */
  name: string;
  m: number;
  n: number;
  k: number;
  transA: boolean;
  transB: boolean;
}

/** n³ products without transposes. */
export function squareShape(n: number, transA = false, transB = false): GemmShape {
  const tag = `${transA ? "T" : "N"}${transB ? "T" : "N"}`;
  return { name: `${n}³ ${tag}`, m: n, n, k: n, transA, transB };
}

/** The FC layer's forward, input-gradient and weight-gradient products. */
export const FC_SHAPES: readonly GemmShape[] = [
  { name: "FC forward X·Wᵀ (64×4096×9216, NT)", m: 64, n: 4096, k: 9216, transA: false, transB: true },
  { name: "FC input grad dY·W (64×9216×4096, NN)", m: 64, n: 9216, k: 4096, transA: false, transB: false },
  { name: "FC weight grad dYᵀ·X (4096×9216×64, TN)", m: 4096, n: 9216, k: 64, transA: true, transB: false },
];

/**
 * The backend contract's spec of one product of `shape` (no batch strides).
 *
 * @example
 * ```ts
 * import { gemmSpec, squareShape } from "./gemm_shapes.ts";
 * gemmSpec(squareShape(4)); // { batch: 1, m: 4, n: 4, k: 4, transA: false, transB: false, … }
 * ```
 */
export function gemmSpec(shape: GemmShape): MatmulSpec {
  const { m, n, k, transA, transB } = shape;
  return { batch: 1, m, n, k, transA, transB, aBatchStride: 0, bBatchStride: 0 };
}

/** Floating-point operations of one product (a multiply-add counts 2). */
export function gemmFlops(s: GemmShape): number {
  return 2 * s.m * s.n * s.k;
}

/**
 * GFLOP/s of one product of `shape` taking `seconds`.
 *
 * @example
 * ```ts
 * import { gemmGflops, squareShape } from "./gemm_shapes.ts";
 * gemmGflops(squareShape(1000), 0.1); // 20
 * ```
 */
export function gemmGflops(shape: GemmShape, seconds: number): number {
  return gemmFlops(shape) / seconds / 1e9;
}

/**
 * The peak a run on `threads` threads is measured against: the one-thread peak for 1, the
 * all-cores peak from the probe's thread count up, else `threads` × the one-thread peak (at most
 * the all-cores figure).
 *
 * @example
 * ```ts
 * import { peakFor } from "./gemm_shapes.ts";
 * const peak = { perCore: 70, allCores: 138, threads: 2, fma: true, shape: { chains: 12, unroll: 4, fma: true } };
 * peakFor(peak, 1); // 70
 * peakFor(peak, 2); // 138
 * ```
 */
export function peakFor(peak: WasmPeak, threads: number): number {
  if (threads <= 1) return peak.perCore;
  if (threads >= peak.threads) return peak.allCores;
  return Math.min(peak.allCores, threads * peak.perCore);
}

/**
 * `gflops` as a percentage of `peak`, for tables: whole percent from 10 %, one decimal below,
 * "—" when either is unknown.
 *
 * @example
 * ```ts
 * import { percentOfPeak } from "./gemm_shapes.ts";
 * percentOfPeak(64.2, 68.5); // "94%"
 * percentOfPeak(1.08, 68.5); // "1.6%"
 * ```
 */
export function percentOfPeak(gflops: number, peak: number | undefined): string {
  if (peak === undefined || !(peak > 0) || !Number.isFinite(gflops)) return "—";
  const p = (100 * gflops) / peak;
  return `${p >= 9.95 ? p.toFixed(0) : p.toFixed(1)}%`;
}
