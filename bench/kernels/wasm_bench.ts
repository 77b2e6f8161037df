/**
 * The generated WebAssembly SIMD kernels beside TensorFlow.js's WebAssembly backend (XNNPACK,
 * SIMD, one thread) in the same run: GEMM 512³ and the three products of a 9216→4096 fully
 * connected layer at batch 64 (forward X·Wᵀ, input gradient dY·W, weight gradient dYᵀ·X) on one
 * thread and on every core, and the cifar10_quick batch-64 training step.
 *
 * Both modes first measure and print the machine's 128-bit WebAssembly peak
 * (`backends/cpu/wasm/peak.ts`). `deno bench -A bench/kernels/wasm_bench.ts` times each case, then (when
 * the process unloads) prints each GEMM case's GFLOP/s, best and median of its calls, as a
 * percentage of the peak for its thread count. `deno run -A bench/kernels/wasm_bench.ts` prints a GFLOP/s
 * table (best and median of 5 calls after a warm-up, and as % of peak) with what the runtime
 * supports (relaxed SIMD or plain SIMD128). `--quick` skips tfjs-wasm's slow transposed products
 * and the training steps.
 *
 * @module
 */

import { CpuBackend } from "../../backends/cpu/backend.ts";
import { describeWasmFeatures } from "../../backends/cpu/wasm/features.ts";
import { registerBackend } from "../../mod.ts";
import {
  FC_SHAPES,
  gemmFlops,
  gemmGflops,
  type GemmShape,
  peakFor,
  percentOfPeak,
  squareShape,
} from "./gemm_shapes.ts";
import {
  benchPeak,
  type CallTimes,
  cifarQuickStepSeconds,
  GemmBenchLog,
  tandemGemmSeconds,
  tfGemmSeconds,
  TIMED_CALLS,
} from "./kernel_timing.ts";
import { cifarQuickStep, tf, useBackend } from "../peers/tfjs.ts";

const cores = Math.max(2, navigator.hardwareConcurrency);
const { peak, line: peakLine } = await benchPeak();
console.log(`wasm_bench: ${peakLine}`);
const one = new CpuBackend({ name: "cpu-1-thread", threads: 1 });
const all = new CpuBackend({ name: `cpu-${cores}-threads`, threads: cores });
const ready = await all.startThreads();
registerBackend(one);
registerBackend(all);
await useBackend("wasm");
const tfjsSimd = tf.env().getBool("WASM_HAS_SIMD_SUPPORT");

const SHAPES: GemmShape[] = [squareShape(512), ...FC_SHAPES];
const runtime = `${describeWasmFeatures()}; Tandem multiply-add: ${
  one.fusedMultiplyAdd ? "fused (relaxed SIMD)" : "f32x4.mul + f32x4.add (SIMD128)"
}; ${ready} threads ready of ${cores}; tfjs-wasm SIMD ${tfjsSimd ? "on" : "off"}, 1 thread`;

if (import.meta.main) {
  const quick = Deno.args.includes("--quick");
  console.log(`runtime: ${runtime}`);
  /** GFLOP/s of the median call. */
  const median = (s: GemmShape, t: CallTimes) => gemmGflops(s, t.median);
  /** "best / median (best / median % of the peak of `threads` threads)". */
  const cell = (s: GemmShape, t: CallTimes, threads: number) => {
    const b = gemmGflops(s, t.best), m = gemmGflops(s, t.median);
    const p = peak ? peakFor(peak, threads) : undefined;
    return `${b.toFixed(1)} / ${m.toFixed(1)} (${percentOfPeak(b, p)} / ${percentOfPeak(m, p)})`;
  };
  const square = median(SHAPES[0], tandemGemmSeconds(one, SHAPES[0]));
  const rows = SHAPES.map((s) => {
    const single = tandemGemmSeconds(one, s);
    const threaded = tandemGemmSeconds(all, s);
    // tfjs-wasm's transposed FC products run at ~1 GFLOP/s here (5 s a call): --quick skips them.
    const slow = s.transA || s.transB;
    const tfjs = quick && slow ? undefined : tfGemmSeconds(s);
    return {
      product: `${s.name}`,
      "1 thread": cell(s, single, 1),
      [`${cores} threads`]: cell(s, threaded, cores),
      speedup: Number((median(s, threaded) / median(s, single)).toFixed(2)),
      "tfjs-wasm": tfjs ? cell(s, tfjs, 1) : "skipped (--quick)",
      "1 thread / tfjs": tfjs ? Number((median(s, single) / median(s, tfjs)).toFixed(1)) : NaN,
      "1 thread / 512³": Number((median(s, single) / square).toFixed(2)),
    };
  });
  console.log(
    `GEMM GFLOP/s, best / median of ${TIMED_CALLS} calls after a warm-up, and as % of the peak (1 thread ` +
      `of the 1-thread peak, ${cores} threads of the ${cores}-thread peak); ratios of medians:`,
  );
  console.table(rows);
  if (!quick) {
    const best = (xs: number[]) => Math.min(...xs) * 1000;
    const tandemOne = best(await cifarQuickStepSeconds(one.name, 64, 5));
    const tandemAll = best(await cifarQuickStepSeconds(all.name, 64, 5));
    const net = cifarQuickStep(64, { rewriteConvGrads: true });
    net.step();
    const tfjsSteps: number[] = [];
    for (let i = 0; i < 5; i++) {
      const t0 = performance.now();
      net.step();
      tfjsSteps.push(performance.now() - t0);
    }
    net.dispose();
    const tfjs = Math.min(...tfjsSteps);
    console.log("cifar10_quick training step, batch 64 (best of 5 after a warm-up):");
    console.table({
      [`Tandem, 1 thread`]: {
        ms: Number(tandemOne.toFixed(1)),
        "tfjs / Tandem": Number((tfjs / tandemOne).toFixed(2)),
      },
      [`Tandem, ${cores} threads`]: {
        ms: Number(tandemAll.toFixed(1)),
        "tfjs / Tandem": Number((tfjs / tandemAll).toFixed(2)),
      },
      "tfjs-wasm (conv gradients as forward convs)": { ms: Number(tfjs.toFixed(1)), "tfjs / Tandem": 1 },
    });
  }
  one.dispose();
  all.dispose();
} else {
  const log = new GemmBenchLog(peak);
  for (const s of SHAPES) {
    const group = s.name;
    const big = gemmFlops(s) > 1e9;
    const options = big ? { n: 3, warmup: 1 } : {};
    for (const backend of [one, all]) {
      const { m, n, k, transA, transB } = s;
      const a = backend.upload(new Float32Array(m * k).fill(0.5)),
        b = backend.upload(new Float32Array(k * n).fill(0.25));
      const out = backend.allocate(m * n, "float32");
      const spec = { batch: 1, m, n, k, transA, transB, aBatchStride: 0, bBatchStride: 0 };
      const name = `Tandem wasm, ${backend.threads} thread${backend.threads > 1 ? "s" : ""}: ${s.name}`;
      Deno.bench({
        name,
        group,
        baseline: backend === one,
        ...options,
        fn: log.wrap(name, s, backend.threads, () => backend.matmul(a, b, out, spec)),
      });
    }
    const slow = s.transA || s.transB;
    const a = tf.tensor2d(new Float32Array(s.m * s.k).fill(0.5), s.transA ? [s.k, s.m] : [s.m, s.k]);
    const b = tf.tensor2d(new Float32Array(s.k * s.n).fill(0.25), s.transB ? [s.n, s.k] : [s.k, s.n]);
    Deno.bench({
      name: `tfjs-wasm: ${s.name}`,
      group,
      ...(slow ? { n: 1, warmup: 0 } : options),
      fn: log.wrap(`tfjs-wasm: ${s.name}`, s, 1, () => tf.matMul(a, b, s.transA, s.transB).dispose()),
    });
  }
  console.log(`wasm_bench runtime: ${runtime}`);
  log.printOnUnload(
    `GEMM GFLOP/s of the calls deno bench ran above (first call left out where there were more), as % ` +
      `of the peak: ${peakLine}`,
  );
}
