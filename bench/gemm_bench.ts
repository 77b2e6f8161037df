/**
 * CPU GEMM benchmarks: square products in every transpose layout and the three products of a
 * 9216→4096 fully connected layer at batch 64 (forward, input gradient, weight gradient), with the
 * pure-TypeScript kernel (`backends/cpu/gemm.ts`) and the generated WebAssembly SIMD kernels the
 * CPU backend runs by default (one thread, and every core).
 *
 * `deno bench` reports time per call; when this file is the main module it first prints a
 * GFLOP/s table (best of a few timed calls per case, after one warm-up call).
 *
 * @module
 */

import { CpuBackend } from "../backends/cpu/backend.ts";
import { gemm, type GemmArgs } from "../backends/cpu/gemm.ts";
import { FC_SHAPES, gemmFlops, type GemmShape, squareShape } from "./gemm_shapes.ts";
import { tandemGemmSeconds } from "./kernel_timing.ts";

const cores = Math.max(2, navigator.hardwareConcurrency);
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

/** Best-of timing: one warm-up, then at least 2 calls and about 0.3 s per case. */
function measureGflops(s: GemmShape): number {
  const args = makeArgs(s);
  gemm(args);
  let best = Infinity;
  let total = 0;
  for (let r = 0; r < 2 || total < 300; r++) {
    const t0 = performance.now();
    gemm(args);
    const dt = performance.now() - t0;
    best = Math.min(best, dt);
    total += dt;
  }
  return gemmFlops(s) / (best * 1e6);
}

if (Deno.mainModule === import.meta.url) {
  const rows = SHAPES.map((s) => {
    const reps = gemmFlops(s) > 1e9 ? 2 : 5;
    return {
      case: s.name,
      "GFLOP/call": Number((gemmFlops(s) / 1e9).toFixed(3)),
      "TypeScript": Number(measureGflops(s).toFixed(2)),
      "wasm 1 thread": Number((gemmFlops(s) / tandemGemmSeconds(wasmOne, s, reps) / 1e9).toFixed(1)),
      [`wasm ${cores} threads`]: Number(
        (gemmFlops(s) / tandemGemmSeconds(wasmAll, s, reps) / 1e9).toFixed(1),
      ),
    };
  });
  console.log("CPU GEMM GFLOP/s (best of several calls):");
  console.table(rows);
  wasmOne.dispose();
  wasmAll.dispose();
}

for (const s of SHAPES) {
  const args = makeArgs(s);
  const big = gemmFlops(s) > 1e9;
  const group = s.name.startsWith("FC") ? "fc" : s.m === 512 ? "512" : "square";
  // The FC products are ~4.8 GFLOP each: a few calls are enough to time them.
  const options = big ? { n: 3, warmup: 1 } : {};
  Deno.bench({ name: `TypeScript ${s.name}`, group, ...options, fn: () => gemm(args) });
  for (const backend of [wasmOne, wasmAll]) {
    const a = backend.upload(args.a),
      b = backend.upload(args.b),
      out = backend.allocate(s.m * s.n, "float32");
    const spec = {
      batch: 1,
      m: s.m,
      n: s.n,
      k: s.k,
      transA: s.transA,
      transB: s.transB,
      aBatchStride: 0,
      bBatchStride: 0,
    };
    Deno.bench({
      name: `wasm ${backend.threads} thread${backend.threads > 1 ? "s" : ""} ${s.name}`,
      group,
      ...options,
      fn: () => backend.matmul(a, b, out, spec),
    });
  }
}
