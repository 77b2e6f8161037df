/**
 * CPU GEMM benchmarks: square products in every transpose layout and the three products of a
 * 9216→4096 fully connected layer at batch 64 (forward, input gradient, weight gradient), with the
 * pure-TypeScript kernel (`backends/cpu/gemm.ts`) and the generated WebAssembly SIMD kernels the
 * CPU backend runs by default (one thread, and every core).
 *
 * Both modes first measure and print the machine's 128-bit WebAssembly peak
 * (`backends/cpu/wasm/peak.ts`). `deno bench` reports time per call, then (when the process
 * unloads) a table of each case's GFLOP/s, best and median of its calls, as a percentage of the
 * peak for its thread count. When this file is the main module it prints such a table instead:
 * best and median of 5 timed calls per case, after warming up.
 *
 * @module
 */

import { CpuBackend } from "../../backends/cpu/backend.ts";
import { gemm, type GemmArgs } from "../../backends/cpu/gemm.ts";
import {
  FC_SHAPES,
  gemmFlops,
  gemmGflops,
  type GemmShape,
  gemmSpec,
  peakFor,
  percentOfPeak,
  squareShape,
} from "./gemm_shapes.ts";
import {
  benchPeak,
  type CallTimes,
  GemmBenchLog,
  tandemGemmSeconds,
  timeCalls,
  TIMED_CALLS,
} from "./kernel_timing.ts";

const cores = Math.max(2, navigator.hardwareConcurrency);
const { peak, line: peakLine } = await benchPeak();
console.log(`gemm_bench: ${peakLine}`);
const wasmOne = new CpuBackend({ threads: 1 });
const wasmAll = new CpuBackend({ threads: cores });
await wasmAll.startThreads();

const SHAPES: GemmShape[] = [
  ...[256, 512].map((n) => squareShape(n)),
  squareShape(512, true, false),
  squareShape(512, false, true),
  squareShape(512, true, true),
  squareShape(1024),
  ...FC_SHAPES,
].map((s) => (s.name.startsWith("FC") ? s : { ...s, name: `GEMM ${s.name}` }));

/** Seeded uniform [-1, 1) data, so runs are comparable. */
function filled(len: number, seed: number): Float32Array {
  const out = new Float32Array(len);
  let s = seed >>> 0;
  for (let i = 0; i < len; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2147483648 - 1;
  }
  return out;
}

function makeArgs(s: GemmShape): GemmArgs {
  return {
    m: s.m,
    n: s.n,
    k: s.k,
    a: filled(s.m * s.k, 1),
    aOffset: 0,
    transA: s.transA,
    b: filled(s.k * s.n, 2),
    bOffset: 0,
    transB: s.transB,
    c: new Float32Array(s.m * s.n),
    cOffset: 0,
    accumulate: false,
  };
}

/** The TypeScript kernel's calls: one warm-up, then {@link TIMED_CALLS} timed. */
function typescriptTimes(s: GemmShape): CallTimes {
  const args = makeArgs(s);
  gemm(args);
  return timeCalls(() => gemm(args), TIMED_CALLS, 1);
}

if (Deno.mainModule === import.meta.url) {
  /** "best / median GFLOP/s (best / median % of the peak of `threads` threads)". */
  const cell = (s: GemmShape, t: CallTimes, threads: number) => {
    const b = gemmGflops(s, t.best), m = gemmGflops(s, t.median);
    const p = peak ? peakFor(peak, threads) : undefined;
    return `${b.toFixed(1)} / ${m.toFixed(1)} (${percentOfPeak(b, p)} / ${percentOfPeak(m, p)})`;
  };
  const rows = SHAPES.map((s) => ({
    case: s.name,
    "GFLOP/call": Number((gemmFlops(s) / 1e9).toFixed(3)),
    "TypeScript": cell(s, typescriptTimes(s), 1),
    "wasm 1 thread": cell(s, tandemGemmSeconds(wasmOne, s), 1),
    [`wasm ${cores} threads`]: cell(s, tandemGemmSeconds(wasmAll, s), cores),
  }));
  console.log(
    `CPU GEMM GFLOP/s, best / median of ${TIMED_CALLS} calls after warming up, and as % of the peak ` +
      `(1 thread of the 1-thread peak, ${cores} threads of the ${cores}-thread peak):`,
  );
  console.table(rows);
  wasmOne.dispose();
  wasmAll.dispose();
}

const log = new GemmBenchLog(peak);

for (const s of SHAPES) {
  const args = makeArgs(s);
  const big = gemmFlops(s) > 1e9;
  const group = s.name.startsWith("FC") ? "fc" : s.m === 512 ? "512" : "square";
  // The FC products are ~4.8 GFLOP each: a few calls are enough to time them.
  const options = big ? { n: 3, warmup: 1 } : {};
  const typescriptName = `TypeScript ${s.name}`;
  Deno.bench({
    name: typescriptName,
    group,
    ...options,
    fn: log.wrap(typescriptName, s, 1, () => gemm(args)),
  });
  for (const backend of [wasmOne, wasmAll]) {
    const a = backend.upload(args.a),
      b = backend.upload(args.b),
      out = backend.allocate(s.m * s.n, "float32");
    const spec = gemmSpec(s);
    const name = `wasm ${backend.threads} thread${backend.threads > 1 ? "s" : ""} ${s.name}`;
    Deno.bench({
      name,
      group,
      ...options,
      fn: log.wrap(name, s, backend.threads, () => backend.matmul(a, b, out, spec)),
    });
  }
}
log.printOnUnload(
  `GEMM GFLOP/s of the calls deno bench ran above (first call left out), as % of the peak: ${peakLine}`,
);
