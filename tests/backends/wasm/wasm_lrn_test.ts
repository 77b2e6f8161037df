/**
 * The WebAssembly LRN kernels (`backends/cpu/wasm/generate/lrn_kernels.ts`) against the TypeScript
 * ones (`backends/cpu/lrn.ts`), bit for bit: forward (out and scale) and backward (dx) on random
 * data of mixed magnitudes, plane sizes that leave pair and lone-pixel tails, fewer channels than the
 * window, sizes 1, 3, 5 and 7, AlexNet's layers, data whose running sums cancel below zero (the
 * clamp) or whose gradient terms cancel (so float64 roundings show), NaN and infinities (NaN
 * where TypeScript has NaN), and 1 vs 2 kernel threads through `CpuBackend`.
 *
 * Mutations tried, each made these tests fail: subtracting the leaving channel before adding the
 * entering one (forward and backward); dropping the clamp `max(acc, 0)`; skipping the lone-pixel
 * tail; running every thread's share from image 0 (ignoring its first image); computing
 * `cross·(x·acc)` instead of `(cross·x)·acc` in backward; `1 / √(r·r·r)` in place of
 * `1 / (r·√r)`; backward reading the leaving channel's term from the wrong ring slot;
 * accepting any beta. Each lives only in the WebAssembly path, and the backend test
 * fails on the first four too, which shows that the backend runs it.
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../../backends/cpu/backend.ts";
import { lrnBackward, lrnForward } from "../../../backends/cpu/lrn.ts";
import { WasmKernels } from "../../../backends/cpu/wasm/kernels.ts";
import type { LrnParams } from "../../../backends/geometry.ts";
import { mulberry32 } from "../../reference/random.ts";

const rand = mulberry32(0x1e4e);
const beta = 0.75;

/** Values in ±[0.01, 100): squares from 1e-4 to 1e4, so the float64 sums round often. */
function randomArray(length: number): Float32Array {
  const out = new Float32Array(length);
  for (let i = 0; i < length; i++) out[i] = (rand() * 2 - 1) * 10 ** (rand() * 4 - 2);
  return out;
}

/**
 * Per pixel: a large value in channel 0, a small one in channel 1, then zeros (even pixels) or
 * small values (odd pixels). Once the large square has left the window, an even pixel's sum is
 * the rounding residue of (b² + s²) − b² − s², negative for about half of them (the clamp); an
 * odd pixel's sum differs by far more than an ulp depending on whether the small square entering
 * is added before or after the large one leaves (the order of the window's update).
 */
function cancellingArray(shape: readonly number[]): Float32Array {
  const [N, C, H, W] = shape, plane = H * W;
  const out = new Float32Array(N * C * plane);
  for (let n = 0; n < N; n++) {
    for (let i = 0; i < plane; i++) {
      out[n * C * plane + i] = 1e5 + rand() * 9e5;
      for (let c = 1; c < (i % 2 === 0 ? 2 : C); c++) out[(n * C + c) * plane + i] = rand();
    }
  }
  return out;
}

/**
 * One channel, size 1, every x = x0 and alpha = 2k / x0²: the two terms of the gradient,
 * dy·scale^(−0.75) and (cross·x)·acc, agree to float32 rounding, so dx keeps only their last
 * bits, and a float64 rounding changed anywhere in it (the order of a product, the form of
 * scale^(−0.75)) shows in float32. Each case has one scale (3k), so there are many.
 */
const BALANCED: Case[] = Array.from({ length: 24 }, (_, i) => {
  const next = mulberry32(77 + i), x0 = Math.fround(0.5 + 1.5 * next()), k = 0.5 + 2 * next();
  return { shape: [1, 1, 5, 7], p: { size: 1, alpha: (2 * k) / (x0 * x0), beta, k }, x0 };
});

/** Pixels whose float64 running sum (as the TypeScript kernel slides it) goes below zero. */
function negativeSums(x: Float32Array, shape: readonly number[], size: number): number {
  const [N, C, H, W] = shape, plane = H * W, half = (size - 1) / 2;
  let count = 0;
  for (let n = 0; n < N; n++) {
    const acc = new Float64Array(plane), at = (c: number, i: number) => x[(n * C + c) * plane + i];
    for (let c = 0; c < half && c < C; c++) for (let i = 0; i < plane; i++) acc[i] += at(c, i) * at(c, i);
    for (let c = 0; c < C; c++) {
      for (let i = 0; i < plane; i++) {
        if (c + half < C) acc[i] += at(c + half, i) * at(c + half, i);
        if (c - half - 1 >= 0) acc[i] -= at(c - half - 1, i) * at(c - half - 1, i);
        if (acc[i] < 0) count++;
      }
    }
  }
  return count;
}

/**
 * Equal bits, except that any NaN matches any NaN: a NaN's sign and payload are the engine's
 * (V8's `Math.max` makes its own NaN, `f64x2.max` keeps or canonicalises another), not arithmetic.
 */
function assertSameBits(actual: Float32Array, expected: Float32Array, what: string): void {
  const a = new Uint32Array(actual.buffer, actual.byteOffset, actual.length);
  const e = new Uint32Array(expected.buffer, expected.byteOffset, expected.length);
  assert.equal(a.length, e.length, `${what}: length`);
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== e[i] && !(Number.isNaN(actual[i]) && Number.isNaN(expected[i]))) {
      assert.fail(`${what}: element ${i} is ${actual[i]}, expected ${expected[i]} bit for bit`);
    }
  }
}

interface Expected {
  out: Float32Array;
  scale: Float32Array;
  dx: Float32Array;
}

/** The TypeScript kernels' outputs (backward from their own forward). */
function typescriptLrn(x: Float32Array, dy: Float32Array, shape: readonly number[], p: LrnParams): Expected {
  const n = x.length;
  const out = new Float32Array(n), scale = new Float32Array(n), dx = new Float32Array(n);
  lrnForward(x, out, scale, shape, p);
  lrnBackward(x, out, scale, dy, dx, shape, p);
  return { out, scale, dx };
}

interface Case {
  shape: [number, number, number, number];
  p: LrnParams;
  data?: "cancelling" | "specials";
  /** Every x equal to this. */
  x0?: number;
}

const CASES: Case[] = [
  // Plane 15: three 4-pixel steps, a pair and a lone pixel.
  { shape: [2, 7, 5, 3], p: { size: 5, alpha: 0.5, beta, k: 1 } },
  // Fewer channels than the window: no channel ever leaves, some never enter.
  { shape: [1, 2, 3, 3], p: { size: 5, alpha: 0.7, beta, k: 1 } },
  { shape: [2, 3, 2, 3], p: { size: 7, alpha: 0.2, beta, k: 2 } },
  // Plane 1 (lone pixels only) and plane 2 (one pair only).
  { shape: [3, 4, 1, 1], p: { size: 3, alpha: 1, beta, k: 1 } },
  { shape: [2, 6, 1, 2], p: { size: 5, alpha: 0.3, beta, k: 1.5 } },
  // Size 1: every channel enters and leaves by itself.
  { shape: [1, 4, 2, 3], p: { size: 1, alpha: 0.3, beta, k: 1 } },
  { shape: [2, 16, 7, 9], p: { size: 3, alpha: 1e-2, beta, k: 2 } },
  // Sums that cancel below zero: the clamp decides the scale.
  { shape: [2, 8, 9, 13], p: { size: 3, alpha: 3, beta, k: 1 }, data: "cancelling" },
  // NaN, ±∞, ±0, subnormals and the largest floats: NaN where TypeScript has NaN.
  { shape: [2, 6, 3, 5], p: { size: 3, alpha: 0.5, beta, k: 1 }, data: "specials" },
  // dx's two terms cancel: its float32 bits show float64 roundings.
  ...BALANCED,
  // AlexNet's norm1 (k 1) and the k 2 of some nets.
  { shape: [2, 96, 55, 55], p: { size: 5, alpha: 1e-4, beta, k: 1 } },
  { shape: [2, 96, 55, 55], p: { size: 5, alpha: 1e-4, beta, k: 2 } },
  { shape: [1, 256, 27, 27], p: { size: 5, alpha: 1e-4, beta, k: 1 } },
];

function inputs(c: Case): { x: Float32Array; dy: Float32Array } {
  const n = c.shape.reduce((a, b) => a * b, 1);
  const x = c.data === "cancelling"
    ? cancellingArray(c.shape)
    : c.x0 !== undefined
    ? new Float32Array(n).fill(c.x0)
    : randomArray(n);
  if (c.data === "specials") {
    const specials = [NaN, Infinity, -Infinity, -0, 0, 1e-45, -3e38, 3.4e38];
    specials.forEach((v, i) => (x[(i * 37) % n] = v));
  }
  return { x, dy: randomArray(n) };
}

// Mutations caught: enter/leave order swapped; clamp dropped; lone-pixel tail skipped;
// cross·(x·acc); 1/√(r·r·r); the leaving term read from the wrong ring slot.
Deno.test("wasm LRN: forward (out, scale) and backward (dx) give the TypeScript kernels' bits", () => {
  const kernels = WasmKernels.create({ threads: 1 })!;
  try {
    for (const c of CASES) {
      const what = `${JSON.stringify(c.shape)} ${JSON.stringify(c.p)}`;
      const { x, dy } = inputs(c);
      if (c.data === "cancelling") {
        assert.ok(negativeSums(x, c.shape, c.p.size) > 10, `${what}: the data must drive sums below zero`);
      }
      const want = typescriptLrn(x, dy, c.shape, c.p);
      const n = x.length;
      const out = new Float32Array(n).fill(9), scale = new Float32Array(n).fill(9);
      assert.ok(kernels.lrnForward(x, out, scale, c.shape, c.p), `${what}: the WebAssembly forward runs`);
      assertSameBits(out, want.out, `${what} out`);
      assertSameBits(scale, want.scale, `${what} scale`);
      const dx = new Float32Array(n).fill(9);
      assert.ok(kernels.lrnBackward(x, want.out, want.scale, dy, dx, c.shape, c.p), `${what}: backward runs`);
      assertSameBits(dx, want.dx, `${what} dx`);
    }
  } finally {
    kernels.dispose();
  }
});

// Mutation caught: every thread's share started at image 0 (so images past the first thread's
// were never written, and the threads raced on the same outputs).
Deno.test("wasm LRN: CpuBackend with 1 and 2 threads gives the TypeScript kernels' bits", async () => {
  const cases: Case[] = [
    { shape: [2, 96, 55, 55], p: { size: 5, alpha: 1e-4, beta, k: 1 } },
    { shape: [3, 256, 27, 27], p: { size: 5, alpha: 1e-4, beta, k: 2 } },
    { shape: [5, 8, 9, 13], p: { size: 3, alpha: 3, beta, k: 1 }, data: "cancelling" },
  ];
  const backends = [new CpuBackend({ threads: 1 }), new CpuBackend({ threads: 2 })];
  try {
    assert.equal(await backends[1].startThreads(), 2, "two kernel threads");
    for (const c of cases) {
      const what = `${JSON.stringify(c.shape)} ${JSON.stringify(c.p)}`;
      const { x, dy } = inputs(c);
      const want = typescriptLrn(x, dy, c.shape, c.p);
      for (const backend of backends) {
        const n = x.length, label = `${what}, ${backend.threads} thread(s)`;
        const xs = backend.upload(x), dys = backend.upload(dy);
        const out = backend.allocate(n, "float32"), scale = backend.allocate(n, "float32");
        const dx = backend.allocate(n, "float32");
        backend.lrnForward(xs, out, scale, c.shape, c.p);
        assertSameBits(backend.readSync(out) as Float32Array, want.out, `${label} out`);
        assertSameBits(backend.readSync(scale) as Float32Array, want.scale, `${label} scale`);
        backend.lrnBackward(xs, out, scale, dys, dx, c.shape, c.p);
        assertSameBits(backend.readSync(dx) as Float32Array, want.dx, `${label} dx`);
      }
    }
  } finally {
    for (const backend of backends) backend.dispose();
  }
});

// Mutation caught: `WasmKernels` taking any beta (its kernels compute scale^(−0.75) regardless).
Deno.test("wasm LRN: beta ≠ 0.75 and mismatched sizes are left to TypeScript", () => {
  const kernels = WasmKernels.create({ threads: 1 })!;
  const backend = new CpuBackend({ threads: 1 });
  try {
    const shape = [2, 6, 3, 5], p = { size: 5, alpha: 0.5, beta: 0.6, k: 1 };
    const x = randomArray(180), dy = randomArray(180);
    const out = new Float32Array(180), scale = new Float32Array(180), dx = new Float32Array(180);
    assert.equal(kernels.lrnForward(x, out, scale, shape, p), false, "no pow in WebAssembly");
    assert.equal(kernels.lrnBackward(x, out, scale, dy, dx, shape, p), false);
    // The backend falls back and still gives the TypeScript bits.
    const want = typescriptLrn(x, dy, shape, p);
    const outs = backend.allocate(180, "float32"), scales = backend.allocate(180, "float32");
    backend.lrnForward(backend.upload(x), outs, scales, shape, p);
    assertSameBits(backend.readSync(outs) as Float32Array, want.out, "beta 0.6 out");
    // A wrong size is refused by the TypeScript kernel's check, with its message.
    const p75 = { ...p, beta };
    assert.equal(kernels.lrnForward(x, out.subarray(1), scale, shape, p75), false);
    assert.throws(
      () => backend.lrnForward(backend.upload(x), backend.allocate(179, "float32"), scales, shape, p75),
      /lrn: out has 179 elements, shape expects 180/,
    );
    assert.throws(() => kernels.lrnForward(x, out, scale, shape, { ...p75, size: 4 }), /lrn: size must be/);
  } finally {
    kernels.dispose();
    backend.dispose();
  }
});
