/**
 * Convolution throughput on the CPU backend: forward, backward-input and backward-filter at the
 * cifar10_quick layer shapes (batch 64) and AlexNet's grouped conv2 (batch 4), with the generated
 * WebAssembly SIMD kernels on one thread and on every core (operands in kernel memory, as the
 * backend allocates them) and with the pure-TypeScript kernels.
 *
 * Run with `deno bench -A bench/kernels/conv_bench.ts`. Besides Deno's timing table, a GFLOP/s summary
 * (2·N·OH·OW·outC·(inC/groups)·kH·kW per pass, best iteration) is printed when the run ends.
 *
 * @module
 */

import { CpuBackend } from "../../backends/cpu/backend.ts";
import { conv2dBackwardFilter, conv2dBackwardInput, conv2dForward } from "../../backends/cpu/conv.ts";
import { type Conv2dGeometry, conv2dGeometry } from "../../backends/geometry.ts";
import type { Storage } from "../../backends/backend.ts";

const cores = Math.max(2, navigator.hardwareConcurrency);
const wasmBackends = [new CpuBackend({ threads: 1 }), new CpuBackend({ threads: cores })];
await wasmBackends[1].startThreads();

interface Layer {
  name: string;
  x: [number, number, number, number];
  w: [number, number, number, number];
  padding: number;
  groups: number;
}

const layers: Layer[] = [
  {
    name: "cifar10_quick conv1 3→32 5×5 32×32 N=64",
    x: [64, 3, 32, 32],
    w: [32, 3, 5, 5],
    padding: 2,
    groups: 1,
  },
  {
    name: "cifar10_quick conv2 32→32 5×5 16×16 N=64",
    x: [64, 32, 16, 16],
    w: [32, 32, 5, 5],
    padding: 2,
    groups: 1,
  },
  {
    name: "cifar10_quick conv3 32→64 5×5 8×8 N=64",
    x: [64, 32, 8, 8],
    w: [64, 32, 5, 5],
    padding: 2,
    groups: 1,
  },
  {
    name: "AlexNet conv2 96→256 5×5 g2 27×27 N=4",
    x: [4, 96, 27, 27],
    w: [256, 48, 5, 5],
    padding: 2,
    groups: 2,
  },
];

/** Deterministic fill; the values only need to be finite and non-denormal. */
function filled(n: number, seed: number): Float32Array {
  const a = new Float32Array(n);
  let s = seed;
  for (let i = 0; i < n; i++) {
    s = (s * 1103515245 + 12345) >>> 0;
    a[i] = s / 2 ** 31 - 1;
  }
  return a;
}

function flops(g: Conv2dGeometry): number {
  return 2 * g.batch * g.outHeight * g.outWidth * g.outChannels * (g.inChannels / g.groups) * g.kernelH *
    g.kernelW;
}

const best = new Map<string, { ms: number; flop: number }>();

function timed(key: string, flop: number, fn: () => void): () => void {
  return () => {
    const t0 = performance.now();
    fn();
    const ms = performance.now() - t0;
    const prev = best.get(key);
    if (!prev || ms < prev.ms) best.set(key, { ms, flop });
  };
}

for (const layer of layers) {
  const g = conv2dGeometry(layer.x, layer.w, { stride: 1, padding: layer.padding, groups: layer.groups });
  const x = filled(layer.x.reduce((a, b) => a * b), 1);
  const w = filled(layer.w.reduce((a, b) => a * b), 2);
  const ySize = g.batch * g.outChannels * g.outHeight * g.outWidth;
  const y = new Float32Array(ySize), dy = filled(ySize, 3);
  const dx = new Float32Array(x.length), dw = new Float32Array(w.length);
  const flop = flops(g);
  // Passes take tens to hundreds of milliseconds; a few iterations give a stable best time.
  const common = { group: layer.name, n: 5, warmup: 1 };
  const passes: [string, () => void][] = [
    ["forward        ", () => conv2dForward(x, w, y, g)],
    ["backward-input ", () => conv2dBackwardInput(dy, w, dx, g)],
    ["backward-filter", () => conv2dBackwardFilter(x, dy, dw, g)],
  ];
  for (const backend of wasmBackends) {
    const up = (a: Float32Array) => backend.upload(a);
    const [bx, bw, bdy] = [up(x), up(w), up(dy)];
    const out = (n: number): Storage => backend.allocate(n, "float32");
    const [by, bdx, bdw] = [out(ySize), out(x.length), out(w.length)];
    const label = `wasm ${backend.threads} thread${backend.threads > 1 ? "s" : ""}`;
    passes.push(
      [`forward         ${label}`, () => backend.conv2dForward(bx, bw, by, g)],
      [`backward-input  ${label}`, () => backend.conv2dBackwardInput(bdy, bw, bdx, g)],
      [`backward-filter ${label}`, () => backend.conv2dBackwardFilter(bx, bdy, bdw, g)],
    );
  }
  passes.forEach(([pass, fn], i) => {
    const key = `${pass} ${layer.name}`;
    Deno.bench({ ...common, name: key, baseline: i === 0, fn: timed(key, flop, fn) });
  });
}

globalThis.addEventListener("unload", () => {
  for (const backend of wasmBackends) backend.dispose();
  console.log("\nGFLOP/s (best iteration):");
  for (const [key, { ms, flop }] of best) {
    console.log(
      `  ${key}  ${(flop / 1e9).toFixed(3)} GFLOP  ${ms.toFixed(1)} ms  ${
        (flop / ms / 1e6).toFixed(2)
      } GFLOP/s`,
    );
  }
});
