/**
 * The direct weight gradient (`backends/cpu/wasm/filter_direct.ts`) of stride-1 layers Winograd
 * does not take: against the float64 reference, with fused and unfused multiply-adds, and the
 * same bits on 1, 2 and 3 threads.
 *
 * @module
 */

import assert from "node:assert/strict";
import { directFilter } from "../../../backends/cpu/wasm/filter_direct.ts";
import { WasmKernels } from "../../../backends/cpu/wasm/kernels.ts";
import { conv2dGeometry, type Conv2dOptions } from "../../../backends/geometry.ts";
import { conv2dGradients } from "../../reference/float64.ts";
import { mulberry32 } from "../../reference/random.ts";

const rand = mulberry32(20261204);

function randomArray(length: number): Float32Array {
  return Float32Array.from({ length }, () => rand() * 2 - 1);
}

interface Case {
  name: string;
  x: number[];
  w: number[];
  options: Conv2dOptions;
}

// Batches above the 8 image chunks, so chunks sum several images; output counts and row counts
// off the 3×3 tile; output rows of whole vectors (read in place) and not (widened).
const CASES: Case[] = [
  { name: "cifar10_quick conv1, batch 19", x: [19, 3, 32, 32], w: [32, 3, 5, 5], options: { padding: 2 } },
  { name: "AlexNet-like conv1, batch 11", x: [11, 1, 28, 28], w: [32, 1, 5, 5], options: { padding: 2 } },
  { name: "odd width, no padding, 7 outputs", x: [10, 3, 13, 13], w: [7, 3, 3, 3], options: {} },
  {
    name: "2 groups of 3 channels, width 7",
    x: [9, 6, 10, 9],
    w: [10, 3, 5, 5],
    options: { padding: 1, groups: 2 },
  },
  { name: "3×5 kernel, padding [1, 2]", x: [12, 8, 9, 14], w: [5, 8, 3, 5], options: { padding: [1, 2] } },
  { name: "one image, 1×3 kernel", x: [1, 2, 5, 6], w: [4, 2, 1, 3], options: { padding: [0, 1] } },
];

function operands(c: Case) {
  const g = conv2dGeometry(c.x, c.w, c.options);
  const size = (s: number[]) => s.reduce((a, b) => a * b, 1);
  const dyShape = [g.batch, g.outChannels, g.outHeight, g.outWidth];
  return { g, x: randomArray(size(c.x)), w: randomArray(size(c.w)), dy: randomArray(size(dyShape)), dyShape };
}

function weightGradient(kernels: WasmKernels, c: Case, x: Float32Array, dy: Float32Array): Float32Array {
  const g = conv2dGeometry(c.x, c.w, c.options);
  const dw = new Float32Array(c.w.reduce((a, b) => a * b, 1)).fill(NaN);
  assert.ok(kernels.conv2dBackwardFilter(x, dy, dw, g), `${c.name}: ran in kernel memory`);
  return dw;
}

// Mutations tried, each made this test fail: the kernel starting every image's sums from zero
// (ignoring `first`, so a chunk keeps only its last image); a tile past the last output or row not
// clamped to it (the edge tiles read and write past the unit's outputs and rows); the lane sum
// adding lane 2 in place of lane 3; dy's rows of 7, 11 or 14 floats read in place instead of widened (the lanes past the row
// multiply the next row's dy by real input columns).
Deno.test("direct weight gradient: matches the float64 reference, fused and unfused", () => {
  const fused = WasmKernels.create({ threads: 1 }), unfused = WasmKernels.create({ threads: 1, fma: false });
  assert.ok(fused && unfused);
  try {
    for (const c of CASES) {
      const { g, x, w, dy, dyShape } = operands(c);
      assert.ok(directFilter(g), `${c.name}: takes the direct path`);
      const want = conv2dGradients(
        { data: Float64Array.from(x), shape: c.x },
        { data: Float64Array.from(w), shape: c.w },
        { data: Float64Array.from(dy), shape: dyShape },
        c.options,
      ).dw.data;
      for (const [label, kernels] of [["fused", fused], ["unfused", unfused]] as const) {
        const got = weightGradient(kernels, c, x, dy);
        let diff = 0, scale = 0;
        for (let i = 0; i < want.length; i++) {
          const d = Math.abs(got[i] - want[i]);
          if (!(d <= diff)) diff = d;
          scale = Math.max(scale, Math.abs(want[i]));
        }
        assert.ok(
          diff / scale <= 1e-5,
          `${c.name} (${label}): max diff ${diff} over max |reference| ${scale}`,
        );
      }
    }
  } finally {
    fused.dispose();
    unfused.dispose();
  }
});

// Mutation tried: every thread keeping its accumulators in the first thread's scratch made this
// test fail (the reference test, on one thread, still passed).
Deno.test("direct weight gradient: 2 and 3 threads give the 1-thread bits", async () => {
  const single = WasmKernels.create({ threads: 1 })!;
  try {
    for (const threads of [2, 3]) {
      const pool = WasmKernels.create({ threads })!;
      try {
        assert.equal(await pool.startThreads(), threads);
        for (const c of CASES) {
          const { x, dy } = operands(c);
          const want = new Uint32Array(weightGradient(single, c, x, dy).buffer);
          const got = new Uint32Array(weightGradient(pool, c, x, dy).buffer);
          assert.deepEqual(got, want, `${c.name}: ${threads} threads`);
        }
      } finally {
        pool.dispose();
      }
    }
  } finally {
    single.dispose();
  }
});
