/**
 * Timing helpers shared by `bench/kernels/wasm_bench.ts`, `bench/kernels/gemm_bench.ts` and
 * `bench/report.ts`: GEMM on a Tandem CPU backend (operands uploaded once, as a model's tensors are), GEMM on the current
 * TensorFlow.js backend, and the cifar10_quick batch-64 training step on a registered Tandem
 * backend. The GEMM helpers return the best and the median of {@link TIMED_CALLS} warm calls.
 *
 * @module
 */

import type { CpuBackend } from "../../backends/cpu/backend.ts";
import { describeWasmPeak, measureWasmPeak, type WasmPeak } from "../../backends/cpu/wasm/peak.ts";
import { cifarQuick, randn, setBackend, SGD, tensor, trainStep } from "../../mod.ts";
import { uniformValues } from "../../engine/mod.ts";
import { gemmGflops, type GemmShape, gemmSpec, peakFor } from "./gemm_shapes.ts";
import { tf, timeTf } from "../peers/tfjs.ts";

/**
 * Seeded uniform [-1, 1) data, so runs are comparable.
 *
 * @example
 * ```ts
 * import { filled } from "./kernel_timing.ts";
 * filled(3, 1); // the same three values every run
 * ```
 */
export function filled(length: number, seed: number): Float32Array {
  const out = new Float32Array(length);
  let x = seed >>> 0;
  for (let i = 0; i < length; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out[i] = x / 2147483648 - 1;
  }
  return out;
}

/** Warm calls every GEMM row times (after at least one warm-up call). */
export const TIMED_CALLS = 5;

/** Seconds of repeated timed calls: the fastest, the median and each one in order. */
export interface CallTimes {
  /** Fastest call, seconds. */
  best: number;
  /** Median call (the upper one for even counts), seconds. */
  median: number;
  /** Every timed call, seconds, in the order run. */
  seconds: number[];
  /** Untimed calls run first. */
  warmup: number;
}

/**
 * Best and median of `seconds` (the upper median for an even count).
 *
 * @example
 * ```ts
 * import { callTimes } from "./kernel_timing.ts";
 * callTimes([0.3, 0.1, 0.2], 1); // { best: 0.1, median: 0.2, seconds: [0.3, 0.1, 0.2], warmup: 1 }
 * ```
 */
export function callTimes(seconds: number[], warmup: number): CallTimes {
  if (seconds.length === 0) throw new RangeError("callTimes: no timed calls");
  const sorted = [...seconds].sort((a, b) => a - b);
  return { best: sorted[0], median: sorted[Math.floor(sorted.length / 2)], seconds, warmup };
}

/**
 * `call` run `calls` times, each timed on its own, as {@link CallTimes} (`warmup`: the untimed
 * calls the caller ran before).
 *
 * @example
 * ```ts
 * import { timeCalls } from "./kernel_timing.ts";
 * const { best } = timeCalls(() => Math.sqrt(2), 3, 0);
 * ```
 */
export function timeCalls(call: () => void, calls: number, warmup: number): CallTimes {
  const seconds: number[] = [];
  for (let r = 0; r < calls; r++) {
    const t0 = performance.now();
    call();
    seconds.push((performance.now() - t0) / 1000);
  }
  return callTimes(seconds, warmup);
}

/**
 * Times `calls` (default {@link TIMED_CALLS}) products of `shape` on `backend` after warming up
 * (at least one call and 0.2 s: each thread's WebAssembly runs in V8's baseline tier until it has
 * run enough to be optimised, in the background).
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../backends/cpu/backend.ts";
 * import { squareShape } from "./gemm_shapes.ts";
 * import { tandemGemmSeconds } from "./kernel_timing.ts";
 * const { best, median } = tandemGemmSeconds(new CpuBackend({ threads: 1 }), squareShape(128));
 * ```
 */
export function tandemGemmSeconds(backend: CpuBackend, shape: GemmShape, calls = TIMED_CALLS): CallTimes {
  return withWarmGemm(backend, shape, (product, warmup) => timeCalls(product, calls, warmup));
}

/** A product of seeded operands held in a backend's memory, warm, until released. */
export interface WarmGemm {
  product: () => void;
  /** Calls it took to warm up. */
  warmup: number;
  release: () => void;
}

/**
 * Uploads seeded operands of `shape` to `backend` and runs the product until warm (at least one call
 * and 0.2 s, see {@link tandemGemmSeconds}); the caller times `product` and calls `release`.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../backends/cpu/backend.ts";
 * import { squareShape } from "./gemm_shapes.ts";
 * import { warmGemm } from "./kernel_timing.ts";
 * const gemm = warmGemm(new CpuBackend({ threads: 1 }), squareShape(64));
 * gemm.product();
 * gemm.release();
 * ```
 */
export function warmGemm(backend: CpuBackend, shape: GemmShape): WarmGemm {
  const { m, n, k } = shape;
  const a = backend.upload(filled(m * k, 1)), b = backend.upload(filled(k * n, 2));
  const out = backend.allocate(m * n, "float32");
  const spec = gemmSpec(shape);
  const product = () => backend.matmul(a, b, out, spec);
  const release = () => {
    for (const s of [a, b, out]) backend.release(s);
  };
  try {
    const warmUntil = performance.now() + 200;
    let warmup = 0;
    do {
      product();
      warmup++;
    } while (performance.now() < warmUntil);
    return { product, warmup, release };
  } catch (error) {
    release();
    throw error;
  }
}

/** Hands `time` a warm product of `shape` on `backend` ({@link warmGemm}) and releases its operands. */
function withWarmGemm<T>(
  backend: CpuBackend,
  shape: GemmShape,
  time: (product: () => void, warmup: number) => T,
): T {
  const gemm = warmGemm(backend, shape);
  try {
    return time(gemm.product, gemm.warmup);
  } finally {
    gemm.release();
  }
}

/** How much faster one backend runs a product than another, from calls taken in turn. */
export interface PairedSpeedup {
  /** Median over the pairs of (the other's call) / (this one's call). */
  median: number;
  /** The lowest and highest ratio of one pair. */
  low: number;
  high: number;
  /** Pairs timed (after both backends warmed up). */
  pairs: number;
}

/**
 * Speedup of `fast` over `base` on each of `shapes` from `rounds` pairs of calls per shape, one on each
 * backend back to back (which goes first alternating), after all are warm, each timed call right after
 * an untimed one on its own backend (its threads awake, its operands in cache). A round takes one pair
 * of every shape in turn, so each shape's pairs are spread over the whole measurement rather than
 * bunched into the second or so its own calls take: this virtual machine's rate on 2 threads moves
 * between stretches seconds long (84–104 GFLOP/s on a 512³ product in one run's 0.5 s windows, 57–104 in
 * another), and the pairs of a small product taken back to back all fell in one of them (a 512³ median of
 * 1.12× from 21 consecutive pairs, 0.87–1.85×, in a run whose medians of separate calls gave 2.0×). The
 * drift falls on both calls of a pair, where two separate runs of calls each carry their own stretch
 * into the ratio.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../backends/cpu/backend.ts";
 * import { squareShape } from "./gemm_shapes.ts";
 * import { pairedSpeedups } from "./kernel_timing.ts";
 * const two = new CpuBackend({ threads: 2 }), one = new CpuBackend({ threads: 1 });
 * const [{ median }] = pairedSpeedups(two, one, [squareShape(128)]);
 * ```
 */
export function pairedSpeedups(
  fast: CpuBackend,
  base: CpuBackend,
  shapes: readonly GemmShape[],
  rounds = 9,
): PairedSpeedup[] {
  const held: WarmGemm[] = [];
  try {
    const products = shapes.map((shape) => {
      const f = warmGemm(fast, shape);
      held.push(f);
      const b = warmGemm(base, shape);
      held.push(b);
      return { fast: f.product, base: b.product };
    });
    // Each timed call follows an untimed one on the same backend, as in a run of calls: without
    // it the 2-thread call found its pool thread asleep after the other backend's call (a futex
    // wake-up inside the timed span) and 256³ scaled 1.60× where back-to-back calls gave 1.80×.
    const time = (product: () => void) => {
      product();
      const t0 = performance.now();
      product();
      return performance.now() - t0;
    };
    const ratios: number[][] = shapes.map(() => []);
    for (let r = 0; r < rounds; r++) {
      products.forEach(({ fast, base }, i) => {
        let f: number, b: number;
        if (r % 2 === 0) {
          f = time(fast);
          b = time(base);
        } else {
          b = time(base);
          f = time(fast);
        }
        ratios[i].push(b / f);
      });
    }
    return ratios.map((list) => {
      list.sort((x, y) => x - y);
      return { median: list[Math.floor(rounds / 2)], low: list[0], high: list[rounds - 1], pairs: rounds };
    });
  } finally {
    for (const gemm of held) gemm.release();
  }
}

/** A GEMM's rate in consecutive windows of one process: how much this machine drifts. */
export interface GemmDrift {
  /** GFLOP/s of each window, in the order run. */
  windows: number[];
  /** Seconds per window. */
  windowSeconds: number;
}

/**
 * Runs products of `shape` on `backend` back to back for `seconds` (after warming up) and returns
 * their rate per window of `windowSeconds`: the same code on the same operands, so any spread is
 * the machine's (other tenants, frequency), which a peak probe that never touches memory can miss.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../backends/cpu/backend.ts";
 * import { squareShape } from "./gemm_shapes.ts";
 * import { gemmDrift } from "./kernel_timing.ts";
 * const { windows } = gemmDrift(new CpuBackend({ threads: 1 }), squareShape(128), 0.2, 0.05);
 * ```
 */
export function gemmDrift(
  backend: CpuBackend,
  shape: GemmShape,
  seconds: number,
  windowSeconds: number,
): GemmDrift {
  return withWarmGemm(backend, shape, (product) => {
    const windows: number[] = [];
    for (const end = performance.now() + seconds * 1000; performance.now() < end;) {
      const t0 = performance.now();
      let calls = 0;
      do {
        product();
        calls++;
      } while (performance.now() - t0 < windowSeconds * 1000);
      windows.push(gemmGflops(shape, (performance.now() - t0) / 1000 / calls));
    }
    return { windows, windowSeconds };
  });
}

/** Bytes {@link memoryReadRate} reads per call: the 9216→4096 FC layer's weights, far past any cache. */
export const MEMORY_PROBE_BYTES = 4 * 9216 * 4096;

/** GB/s of {@link memoryReadRate}: its fastest and its median call. */
export interface MemoryRate {
  best: number;
  median: number;
}

/**
 * How fast one thread of `backend` reads memory: a {@link MEMORY_PROBE_BYTES} array summed by its
 * `reduce` (one row, so one thread), best and median of `calls` warm calls, in GB/s. Why: this
 * virtual machine's memory slows by a sixth for stretches of an hour while its compute-bound GEMM
 * holds (6.1–6.6 against 7.7 GB/s on 2026-12-06, the training steps 20–30% slower for Tandem and
 * PyTorch alike), and a report whose steps moved should say whether the machine's memory did.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../backends/cpu/backend.ts";
 * import { memoryReadRate } from "./kernel_timing.ts";
 * const { best } = memoryReadRate(new CpuBackend({ threads: 1 }), 1);
 * console.log(best > 0); // true
 * ```
 */
export function memoryReadRate(backend: CpuBackend, calls = TIMED_CALLS): MemoryRate {
  const n = MEMORY_PROBE_BYTES / 4;
  const x = backend.upload(filled(n, 3)), out = backend.allocate(1, "float32");
  try {
    const sum = () => backend.reduce("sum", x, out, 1, n, 1);
    sum();
    const t = timeCalls(sum, calls, 1);
    return { best: MEMORY_PROBE_BYTES / t.best / 1e9, median: MEMORY_PROBE_BYTES / t.median / 1e9 };
  } finally {
    backend.release(x);
    backend.release(out);
  }
}

/**
 * Times `calls` (default {@link TIMED_CALLS}) `tf.matMul` calls of `shape` on the current
 * TensorFlow.js backend, each read back (so it has finished), after one warm-up call when
 * `warmup` (default true; tfjs-cpu's large products are timed once, cold).
 *
 * @example
 * ```ts
 * import { squareShape } from "./gemm_shapes.ts";
 * import { tfGemmSeconds } from "./kernel_timing.ts";
 * // await useBackend("wasm"); const { best, median } = tfGemmSeconds(squareShape(512));
 * ```
 */
export function tfGemmSeconds(shape: GemmShape, calls = TIMED_CALLS, warmup = true): CallTimes {
  const a = tf.tensor2d(filled(shape.m * shape.k, 1), shape.transA ? [shape.k, shape.m] : [shape.m, shape.k]);
  const b = tf.tensor2d(filled(shape.k * shape.n, 2), shape.transB ? [shape.n, shape.k] : [shape.k, shape.n]);
  const call = () => timeTf(() => tf.matMul(a, b, shape.transA, shape.transB));
  if (warmup) call();
  const seconds: number[] = [];
  for (let r = 0; r < calls; r++) seconds.push(call());
  a.dispose();
  b.dispose();
  return callTimes(seconds, warmup ? 1 : 0);
}

/**
 * The machine's measured WebAssembly peak (`backends/cpu/wasm/peak.ts`, cached per process) and a
 * line saying it, or why it is missing, for the benchmarks' output.
 *
 * @example
 * ```ts
 * import { benchPeak } from "./kernel_timing.ts";
 * const { peak, line } = await benchPeak();
 * console.log(line);
 * ```
 */
export async function benchPeak(): Promise<{ peak: WasmPeak | undefined; line: string }> {
  try {
    const peak = await measureWasmPeak();
    return { peak, line: describeWasmPeak(peak) };
  } catch (error) {
    return { peak: undefined, line: `WebAssembly peak not measured: ${(error as Error).message}` };
  }
}

/**
 * GEMM cases run by `Deno.bench`, timed call by call so that, when the process unloads, a table
 * gives each case's GFLOP/s (best and median, the first call left out as a warm-up) and their
 * percentages of the measured peak for its thread count: `deno bench` itself reports only times.
 *
 * @example
 * ```ts
 * import { squareShape } from "./gemm_shapes.ts";
 * import { benchPeak, GemmBenchLog } from "./kernel_timing.ts";
 * const log = new GemmBenchLog((await benchPeak()).peak);
 * Deno.bench({ name: "512³", fn: log.wrap("512³", squareShape(512), 1, () => {}) });
 * log.printOnUnload("GEMM GFLOP/s");
 * ```
 */
export class GemmBenchLog {
  readonly #cases = new Map<string, { shape: GemmShape; threads: number; seconds: number[] }>();

  /** A log whose percentages are of `peak` (none when it is undefined). */
  constructor(readonly peak: WasmPeak | undefined) {}

  /** `fn`, timed into the log under `name` (a product of `shape` on `threads` threads). */
  wrap(name: string, shape: GemmShape, threads: number, fn: () => void): () => void {
    const entry = { shape, threads, seconds: [] as number[] };
    this.#cases.set(name, entry);
    return () => {
      const t0 = performance.now();
      fn();
      entry.seconds.push((performance.now() - t0) / 1000);
    };
  }

  /** One row per case that ran: calls, GFLOP/s best and median, each as % of peak. */
  rows(): Record<string, Record<string, number | string>> {
    const rows: Record<string, Record<string, number | string>> = {};
    for (const [name, { shape, threads, seconds }] of this.#cases) {
      if (seconds.length === 0) continue;
      const t = callTimes(seconds.length > 1 ? seconds.slice(1) : seconds, seconds.length > 1 ? 1 : 0);
      const best = gemmGflops(shape, t.best), median = gemmGflops(shape, t.median);
      const peak = this.peak ? peakFor(this.peak, threads) : undefined;
      const percent = (gflops: number) => peak ? Number(((100 * gflops) / peak).toFixed(1)) : "—";
      rows[name] = {
        calls: t.seconds.length,
        "GFLOP/s best": Number(best.toFixed(1)),
        "% of peak": percent(best),
        "GFLOP/s median": Number(median.toFixed(1)),
        "% of peak (median)": percent(median),
      };
    }
    return rows;
  }

  /** Prints `title` and {@link GemmBenchLog.rows} when the process unloads, if any case ran. */
  printOnUnload(title: string): void {
    globalThis.addEventListener("unload", () => {
      const rows = this.rows();
      if (Object.keys(rows).length === 0) return;
      console.log(title);
      console.table(rows);
    });
  }
}

/**
 * Times `steps` cifar10_quick training steps at `batch` (SGD momentum 0.9, weight decay 5e-4) on
 * the registered backend `backendName`, after `warmup` untimed steps (default 3: a new model's
 * second and third steps still ran 1.3–2× its later ones here, its buffers and V8's code not yet
 * settled); returns each step's seconds.
 *
 * @example
 * ```ts
 * import { cifarQuickStepSeconds } from "./kernel_timing.ts";
 * // const seconds = await cifarQuickStepSeconds("cpu", 64, 5);
 * ```
 */
export async function cifarQuickStepSeconds(
  backendName: string,
  batch: number,
  steps: number,
  warmup = 3,
): Promise<number[]> {
  setBackend(backendName);
  try {
    const model = cifarQuick();
    const images = randn([batch, ...model.inputShape], { seed: 1 });
    const labels = tensor(
      Int32Array.from(uniformValues(batch, { seed: 2 }), (u) => Math.floor(u * model.classes)),
      { dtype: "int32" },
    );
    const optimizer = new SGD(model.namedParameters(), { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 });
    const step = async () => {
      const t0 = performance.now();
      await trainStep(model, optimizer, { images, labels });
      return (performance.now() - t0) / 1000;
    };
    for (let i = 0; i < warmup; i++) await step();
    const seconds: number[] = [];
    for (let i = 0; i < steps; i++) seconds.push(await step());
    for (const p of model.namedParameters()) p.tensor.dispose();
    images.dispose();
    labels.dispose();
    return seconds;
  } finally {
    setBackend("cpu");
  }
}
