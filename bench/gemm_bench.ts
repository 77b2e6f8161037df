/**
 * CPU GEMM benchmarks: square products in every transpose layout and the three products of a
 * 9216→4096 fully connected layer at batch 64 (forward, input gradient, weight gradient).
 *
 * `deno bench` reports time per call; when this file is the main module it first prints a
 * GFLOP/s table (best of a few timed calls per case, after one warm-up call).
 *
 * @module
 */

import { gemm, type GemmArgs } from "../backends/cpu/gemm.ts";

interface Shape {
  name: string;
  m: number;
  n: number;
  k: number;
  transA: boolean;
  transB: boolean;
}

const SHAPES: Shape[] = [
  { name: "GEMM 256³ NN", m: 256, n: 256, k: 256, transA: false, transB: false },
  { name: "GEMM 512³ NN", m: 512, n: 512, k: 512, transA: false, transB: false },
  { name: "GEMM 512³ TN", m: 512, n: 512, k: 512, transA: true, transB: false },
  { name: "GEMM 512³ NT", m: 512, n: 512, k: 512, transA: false, transB: true },
  { name: "GEMM 512³ TT", m: 512, n: 512, k: 512, transA: true, transB: true },
  { name: "GEMM 1024³ NN", m: 1024, n: 1024, k: 1024, transA: false, transB: false },
  // FC 9216→4096, batch 64: Y = X·Wᵀ, dX = dY·W, dW = dYᵀ·X.
  { name: "FC forward X·Wᵀ (64×4096×9216, NT)", m: 64, n: 4096, k: 9216, transA: false, transB: true },
  { name: "FC input grad dY·W (64×9216×4096, NN)", m: 64, n: 9216, k: 4096, transA: false, transB: false },
  { name: "FC weight grad dYᵀ·X (4096×9216×64, TN)", m: 4096, n: 9216, k: 64, transA: true, transB: false },
];

function flops(s: Shape): number {
  return 2 * s.m * s.n * s.k;
}

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

function makeArgs(s: Shape): GemmArgs {
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
function measureGflops(s: Shape): number {
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
  return flops(s) / (best * 1e6);
}

if (Deno.mainModule === import.meta.url) {
  const rows = SHAPES.map((s) => ({
    case: s.name,
    "GFLOP/call": Number((flops(s) / 1e9).toFixed(3)),
    "GFLOP/s": Number(measureGflops(s).toFixed(2)),
  }));
  console.log("CPU GEMM, single thread (best of several calls):");
  console.table(rows);
}

for (const s of SHAPES) {
  const args = makeArgs(s);
  const big = flops(s) > 1e9;
  Deno.bench({
    name: s.name,
    group: s.name.startsWith("FC") ? "fc" : s.m === 512 ? "512" : "square",
    // The FC products are ~4.8 GFLOP each: a few calls are enough to time them.
    ...(big ? { n: 3, warmup: 1 } : {}),
    fn() {
      gemm(args);
    },
  });
}
