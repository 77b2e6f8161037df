/**
 * CPU kernels (conv, pooling, LRN) against the naive float64 references: forward passes compared
 * directly, backward passes against central differences of the reference forward in float64; the
 * elementwise and strided-copy kernels against a naive index loop.
 */

import assert from "node:assert/strict";
import type { BinaryOp, StridedView } from "../../backends/backend.ts";
import { conv2dBackwardFilter, conv2dBackwardInput, conv2dForward } from "../../backends/cpu/conv.ts";
import { binaryKernel, copyStridedKernel } from "../../backends/cpu/elementwise.ts";
import { lrnBackward, lrnForward } from "../../backends/cpu/lrn.ts";
import {
  avgPool2dBackward,
  avgPool2dForward,
  maxPool2dBackward,
  maxPool2dForward,
} from "../../backends/cpu/pool.ts";
import {
  checkLrn,
  conv2dGeometry,
  type LrnParams,
  type Pair,
  pool2dGeometry,
} from "../../backends/geometry.ts";
import * as ref from "../reference/float64.ts";
import { mulberry32 as rng } from "../reference/random.ts";

// ---------------------------------------------------------------------------------------------
// Helpers

function uniform(n: number, rand: () => number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (2 * rand() - 1) * scale;
  return a;
}

/** Distinct values at least 0.01 apart, shuffled: max pooling has no near-ties for finite differences. */
function distinct(n: number, rand: () => number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (i - n / 2) * 0.01;
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

const prod = (s: readonly number[]) => s.reduce((a, b) => a * b, 1);
const t64 = (data: Float32Array, shape: readonly number[]): ref.RefTensor => ({
  data: Float64Array.from(data),
  shape: [...shape],
});

function dot(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

/** max |actual − expected| / (max |expected| + 1e-6) ≤ tol. */
function assertClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  tol: number,
  what: string,
): void {
  assert.equal(actual.length, expected.length, `${what}: length`);
  let maxDiff = 0, maxRef = 0;
  for (let i = 0; i < expected.length; i++) {
    const d = Math.abs(actual[i] - expected[i]);
    // `!(d <= maxDiff)` also catches NaN in the kernel output.
    if (!(d <= maxDiff)) maxDiff = d;
    maxRef = Math.max(maxRef, Math.abs(expected[i]));
  }
  const rel = maxDiff / (maxRef + 1e-6);
  assert.ok(rel <= tol, `${what}: max diff ${maxDiff} over max |ref| ${maxRef} = ${rel} > ${tol}`);
}

/** Central differences of a scalar function of a float64 vector (perturbs a copy in place). */
function numericGrad(f: (x: Float64Array) => number, x0: ArrayLike<number>, h: number): Float64Array {
  const x = Float64Array.from(x0);
  const g = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const v = x[i];
    x[i] = v + h;
    const fp = f(x);
    x[i] = v - h;
    const fm = f(x);
    x[i] = v;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

const TOL = 1e-5;

// ---------------------------------------------------------------------------------------------
// Geometry

Deno.test("geometry: AlexNet pooling 55→27→13→6 and conv1 227→55", () => {
  const sizes = [55];
  for (let i = 0; i < 3; i++) {
    const s = sizes[sizes.length - 1];
    sizes.push(pool2dGeometry([1, 96, s, s], { kernel: 3, stride: 2 }).outHeight);
  }
  assert.deepEqual(sizes, [55, 27, 13, 6]);
  const c1 = conv2dGeometry([10, 3, 227, 227], [96, 3, 11, 11], { stride: 4, padding: 0, groups: 1 });
  assert.deepEqual([c1.outHeight, c1.outWidth, c1.outChannels], [55, 55, 96]);
  const c2 = conv2dGeometry([10, 96, 27, 27], [256, 48, 5, 5], { stride: 1, padding: 2, groups: 2 });
  assert.deepEqual([c2.outHeight, c2.outWidth, c2.groups], [27, 27, 2]);
});

Deno.test("geometry: Caffe pooling rounding with padding and [h, w] pairs", () => {
  // ceil((6 + 2 − 3)/2) + 1 = 4, and the last window starts at 5 < 6 + 1: kept.
  assert.equal(pool2dGeometry([1, 1, 6, 6], { kernel: 3, stride: 2, padding: 1 }).outHeight, 4);
  // ceil((5 + 2 − 2)/2) + 1 = 4, but the last window would start at 6 − 1 = 5 ≥ 5: dropped.
  assert.equal(pool2dGeometry([1, 1, 5, 5], { kernel: 2, stride: 2, padding: 1 }).outHeight, 3);
  // Without padding the ceil keeps a partial last window: ceil((6 − 3)/2) + 1 = 3.
  assert.equal(pool2dGeometry([1, 1, 6, 6], { kernel: 3, stride: 2 }).outHeight, 3);
  const g = pool2dGeometry([2, 3, 7, 9], { kernel: [3, 2], stride: [2, 1], padding: [1, 0] });
  assert.deepEqual([g.kernelH, g.kernelW, g.strideH, g.strideW, g.padH, g.padW], [3, 2, 2, 1, 1, 0]);
  assert.deepEqual([g.outHeight, g.outWidth], [4, 8]);
  const c = conv2dGeometry([1, 2, 7, 5], [4, 2, 3, 2], { stride: [2, 1], padding: [1, 0], groups: 1 });
  assert.deepEqual([c.outHeight, c.outWidth], [4, 4]);
});

Deno.test("geometry: clear errors on bad shapes and options", () => {
  const o = { stride: 1, padding: 0, groups: 1 };
  assert.throws(
    () => conv2dGeometry([1, 96, 27, 27], [256, 96, 5, 5], { ...o, padding: 2, groups: 2 }),
    /conv2d: channel mismatch.*\[1, 96, 27, 27\].*\[256, 96, 5, 5\].*groups=2/,
  );
  assert.throws(() => conv2dGeometry([1, 3, 8, 8], [4, 2, 3, 3], o), /conv2d: channel mismatch/);
  assert.throws(
    () => conv2dGeometry([1, 4, 8, 8], [5, 2, 3, 3], { ...o, groups: 2 }),
    /conv2d: groups=2 must divide/,
  );
  assert.throws(
    () => conv2dGeometry([1, 3, 4, 4], [4, 3, 7, 7], { ...o, padding: 1 }),
    /conv2d: kernel 7×7 is larger than the padded input 6×6/,
  );
  assert.throws(() => conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], { ...o, stride: 0 }), /conv2d: stride/);
  assert.throws(() => conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], { ...o, padding: -1 }), /conv2d: padding/);
  assert.throws(() => conv2dGeometry([3, 8, 8], [4, 3, 3, 3], o), /conv2d: input must be 4-D.*\[3, 8, 8\]/);
  assert.throws(() => conv2dGeometry([1, 3, 8, 8], [4, 3, 3], o), /conv2d: weight must be 4-D/);
  assert.throws(() => conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], { ...o, groups: 0 }), /conv2d: groups/);
  assert.throws(() => pool2dGeometry([1, 1, 5, 5], { kernel: 3, stride: -2 }), /pool2d: stride/);
  assert.throws(
    () => pool2dGeometry([1, 1, 5, 5], { kernel: 3, stride: 2, padding: 3 }),
    /pool2d: padding \[3, 3\] must be smaller than the kernel/,
  );
  assert.throws(() => pool2dGeometry([1, 1, 2, 2], { kernel: 4, stride: 1 }), /pool2d: kernel 4×4 is larger/);
  assert.throws(() => pool2dGeometry([1, 0, 5, 5], { kernel: 2 }), /pool2d: input dimensions/);
  assert.throws(
    () => checkLrn([1, 4, 2, 2], { size: 4, alpha: 1, beta: 1, k: 1 }),
    /lrn: size must be .* odd/,
  );
  assert.throws(
    () => checkLrn([1, 4, 2, 2], { size: 3, alpha: 1, beta: 1, k: 0 }),
    /lrn: k must be positive/,
  );
  const g = conv2dGeometry([1, 3, 8, 8], [4, 3, 3, 3], o);
  assert.throws(
    () => conv2dForward(new Float32Array(10), new Float32Array(108), new Float32Array(144), g),
    /conv2d: x has 10 elements, geometry expects 192/,
  );
});

// ---------------------------------------------------------------------------------------------
// Convolution

interface ConvCase {
  name: string;
  x: [number, number, number, number];
  w: [number, number, number, number];
  stride: Pair;
  padding: Pair;
  groups: number;
}

const convCases: ConvCase[] = [
  {
    name: "AlexNet conv1 11×11/4 pad 0",
    x: [1, 3, 23, 23],
    w: [4, 3, 11, 11],
    stride: 4,
    padding: 0,
    groups: 1,
  },
  {
    name: "AlexNet conv2 5×5 pad 2 groups 2",
    x: [2, 4, 7, 7],
    w: [6, 2, 5, 5],
    stride: 1,
    padding: 2,
    groups: 2,
  },
  { name: "AlexNet conv3 3×3 pad 1", x: [2, 4, 6, 6], w: [5, 4, 3, 3], stride: 1, padding: 1, groups: 1 },
  {
    name: "AlexNet conv4/5 3×3 pad 1 groups 2",
    x: [2, 6, 5, 5],
    w: [4, 3, 3, 3],
    stride: 1,
    padding: 1,
    groups: 2,
  },
  {
    name: "odd sizes, rectangular kernel/stride/pad",
    x: [2, 3, 7, 5],
    w: [4, 3, 3, 2],
    stride: [2, 1],
    padding: [1, 0],
    groups: 1,
  },
  { name: "stride 2 pad 1, 3×3", x: [2, 3, 8, 9], w: [5, 3, 3, 3], stride: 2, padding: 1, groups: 1 },
  { name: "1×1 pointwise", x: [2, 5, 4, 3], w: [3, 5, 1, 1], stride: 1, padding: 0, groups: 1 },
  { name: "1×1 pointwise groups 2", x: [2, 4, 3, 3], w: [6, 2, 1, 1], stride: 1, padding: 0, groups: 2 },
  {
    name: "1×1 stride 2 pad 1 (not pointwise)",
    x: [2, 3, 5, 4],
    w: [2, 3, 1, 1],
    stride: 2,
    padding: 1,
    groups: 1,
  },
  {
    name: "groups 3, 2×3 kernel, stride 3",
    x: [1, 6, 8, 7],
    w: [3, 2, 2, 3],
    stride: 3,
    padding: 1,
    groups: 3,
  },
  {
    name: "kernel covers the whole padded input",
    x: [2, 2, 3, 3],
    w: [3, 2, 5, 5],
    stride: 1,
    padding: 1,
    groups: 1,
  },
];

convCases.forEach((cc, i) => {
  Deno.test(`conv2d: ${cc.name}`, () => {
    const rand = rng(1000 + i);
    const opts = { stride: cc.stride, padding: cc.padding, groups: cc.groups };
    const g = conv2dGeometry(cc.x, cc.w, opts);
    const yShape = [g.batch, g.outChannels, g.outHeight, g.outWidth];
    const x = uniform(prod(cc.x), rand), w = uniform(prod(cc.w), rand), dy = uniform(prod(yShape), rand);

    const expected = ref.conv2d(t64(x, cc.x), t64(w, cc.w), opts);
    assert.deepEqual(expected.shape, yShape, "geometry agrees with the reference's output size");
    const y = new Float32Array(prod(yShape)).fill(NaN);
    conv2dForward(x, w, y, g);
    assertClose(y, expected.data, TOL, "forward");

    // Conv is linear in x and in w, so central differences with h = 1 are exact up to rounding.
    const dy64 = Float64Array.from(dy);
    const gx = numericGrad(
      (xv) => dot(dy64, ref.conv2d({ data: xv, shape: cc.x }, t64(w, cc.w), opts).data),
      x,
      1,
    );
    const dx = new Float32Array(x.length).fill(NaN);
    conv2dBackwardInput(dy, w, dx, g);
    assertClose(dx, gx, TOL, "backward input");

    const gw = numericGrad(
      (wv) => dot(dy64, ref.conv2d(t64(x, cc.x), { data: wv, shape: cc.w }, opts).data),
      w,
      1,
    );
    const dw = new Float32Array(w.length).fill(NaN);
    conv2dBackwardFilter(x, dy, dw, g);
    assertClose(dw, gw, TOL, "backward filter");
  });
});

Deno.test("conv2d: larger AlexNet conv2-like layer forward against reference (scratch reuse)", () => {
  const rand = rng(7);
  const xs: [number, number, number, number] = [2, 16, 9, 9],
    ws: [number, number, number, number] = [12, 8, 5, 5];
  const opts = { stride: 1, padding: 2, groups: 2 };
  const g = conv2dGeometry(xs, ws, opts);
  const x = uniform(prod(xs), rand), w = uniform(prod(ws), rand);
  const y = new Float32Array(g.batch * g.outChannels * g.outHeight * g.outWidth);
  conv2dForward(x, w, y, g);
  assertClose(y, ref.conv2d(t64(x, xs), t64(w, ws), opts).data, TOL, "forward");
  // Bias in the reference is y + b per channel.
  const b = Float64Array.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
  const yb = ref.conv2d(t64(x, xs), t64(w, ws), opts, b);
  const plane = g.outHeight * g.outWidth;
  assertClose(y.map((v, j) => v + b[Math.floor(j / plane) % 12]), yb.data, TOL, "reference bias");
});

// ---------------------------------------------------------------------------------------------
// Pooling

interface PoolCase {
  name: string;
  x: [number, number, number, number];
  kernel: Pair;
  stride: Pair;
  padding: Pair;
}

const poolCases: PoolCase[] = [
  { name: "overlapping 3×3/2, no padding (AlexNet), 9×9", x: [2, 3, 9, 9], kernel: 3, stride: 2, padding: 0 },
  {
    name: "overlapping 3×3/2, no padding, ceil partial window 6×7",
    x: [1, 2, 6, 7],
    kernel: 3,
    stride: 2,
    padding: 0,
  },
  { name: "overlapping 3×3/2 pad 1, 6×7", x: [2, 2, 6, 7], kernel: 3, stride: 2, padding: 1 },
  {
    name: "2×2/2 pad 1 (Caffe drops the last window), 5×5",
    x: [1, 3, 5, 5],
    kernel: 2,
    stride: 2,
    padding: 1,
  },
  { name: "3×3/1 pad 2, 4×5", x: [1, 2, 4, 5], kernel: 3, stride: 1, padding: 2 },
  {
    name: "rectangular 3×2 / [2,1] pad [1,0], 7×6",
    x: [2, 2, 7, 6],
    kernel: [3, 2],
    stride: [2, 1],
    padding: [1, 0],
  },
];

poolCases.forEach((pc, i) => {
  const opts = { kernel: pc.kernel, stride: pc.stride, padding: pc.padding };

  Deno.test(`maxPool2d: ${pc.name}`, () => {
    const rand = rng(2000 + i);
    const g = pool2dGeometry(pc.x, opts);
    const yShape = [g.batch, g.channels, g.outHeight, g.outWidth];
    const x = distinct(prod(pc.x), rand), dy = uniform(prod(yShape), rand);
    const expected = ref.maxPool2d(t64(x, pc.x), opts);
    assert.deepEqual(expected.shape, yShape);
    const y = new Float32Array(prod(yShape)).fill(NaN), argmax = new Int32Array(y.length).fill(-1);
    maxPool2dForward(x, y, argmax, g);
    assert.deepEqual(Array.from(y), Array.from(expected.data), "max is an exact selection");
    const plane = g.inHeight * g.inWidth, outPlane = g.outHeight * g.outWidth;
    for (let o = 0; o < y.length; o++) {
      assert.equal(x[Math.floor(o / outPlane) * plane + argmax[o]], y[o], "argmax indexes the input plane");
    }
    // Values are ≥ 0.01 apart, so h = 1e-3 never changes a window's winner.
    const dy64 = Float64Array.from(dy);
    const gx = numericGrad((xv) => dot(dy64, ref.maxPool2d({ data: xv, shape: pc.x }, opts).data), x, 1e-3);
    const dx = new Float32Array(x.length).fill(NaN);
    maxPool2dBackward(dy, argmax, dx, g);
    assertClose(dx, gx, TOL, "backward");
  });

  Deno.test(`avgPool2d: ${pc.name}`, () => {
    const rand = rng(3000 + i);
    const g = pool2dGeometry(pc.x, opts);
    const yShape = [g.batch, g.channels, g.outHeight, g.outWidth];
    const x = uniform(prod(pc.x), rand), dy = uniform(prod(yShape), rand);
    const expected = ref.avgPool2d(t64(x, pc.x), opts);
    assert.deepEqual(expected.shape, yShape);
    const y = new Float32Array(prod(yShape)).fill(NaN);
    avgPool2dForward(x, y, g);
    assertClose(y, expected.data, TOL, "forward");
    const dy64 = Float64Array.from(dy);
    const gx = numericGrad((xv) => dot(dy64, ref.avgPool2d({ data: xv, shape: pc.x }, opts).data), x, 1);
    const dx = new Float32Array(x.length).fill(NaN);
    avgPool2dBackward(dy, dx, g);
    assertClose(dx, gx, TOL, "backward");
  });
});

Deno.test("avgPool2d: Caffe divisor counts padding inside [−pad, in + pad) but not beyond", () => {
  // 3×3 of ones, kernel 3 stride 2 pad 1 → 2×2 output; each window covers 2×2 real pixels.
  // Window rows [−1, 2) and [1, 4) clipped to [−1, 4): extent 3 each, so the divisor is 9.
  const g = pool2dGeometry([1, 1, 3, 3], { kernel: 3, stride: 2, padding: 1 });
  const y = new Float32Array(4);
  avgPool2dForward(new Float32Array(9).fill(1), y, g);
  assert.deepEqual(Array.from(y), [4 / 9, 4 / 9, 4 / 9, 4 / 9].map(Math.fround));
  // 4×4 of ones, 3×3/2 pad 1 → 3×3 output (ceil); the last window [3, 6) clips to [3, 5): extent 2.
  const g2 = pool2dGeometry([1, 1, 4, 4], { kernel: 3, stride: 2, padding: 1 });
  const y2 = new Float32Array(9);
  avgPool2dForward(new Float32Array(16).fill(1), y2, g2);
  const f = (a: number, b: number) => Math.fround(a / b);
  // deno-fmt-ignore
  assert.deepEqual(Array.from(y2), [
    f(4, 9), f(6, 9), f(2, 6),
    f(6, 9), f(9, 9), f(3, 6),
    f(2, 6), f(3, 6), f(1, 4),
  ]);
});

Deno.test("maxPool2d: padding never wins over negative inputs; NaN propagates", () => {
  const g = pool2dGeometry([1, 1, 3, 3], { kernel: 3, stride: 2, padding: 1 });
  const x = new Float32Array(9).map((_, i) => -1 - i);
  const y = new Float32Array(4), am = new Int32Array(4);
  maxPool2dForward(x, y, am, g);
  assert.deepEqual(Array.from(y), [-1, -2, -4, -5]);
  assert.deepEqual(Array.from(am), [0, 1, 3, 4]);
  x[4] = NaN;
  maxPool2dForward(x, y, am, g);
  assert.ok(y.every(Number.isNaN));
});

// ---------------------------------------------------------------------------------------------
// LRN

interface LrnCase {
  name: string;
  shape: [number, number, number, number];
  p: LrnParams;
  /** Input amplitude: larger inputs make the cross-channel term of the gradient matter. */
  amp: number;
}

const lrnCases: LrnCase[] = [
  {
    name: "AlexNet size 5 alpha 1e-4 beta 0.75 k 1",
    shape: [2, 7, 3, 4],
    p: { size: 5, alpha: 1e-4, beta: 0.75, k: 1 },
    amp: 3,
  },
  {
    name: "size 5 alpha 0.5 beta 0.75 k 1",
    shape: [2, 7, 3, 4],
    p: { size: 5, alpha: 0.5, beta: 0.75, k: 1 },
    amp: 2,
  },
  {
    name: "size 3 alpha 0.5 beta 0.6 k 2",
    shape: [1, 6, 2, 3],
    p: { size: 3, alpha: 0.5, beta: 0.6, k: 2 },
    amp: 2,
  },
  {
    name: "size 5 wider than C = 3",
    shape: [2, 3, 2, 2],
    p: { size: 5, alpha: 0.8, beta: 0.75, k: 1 },
    amp: 2,
  },
  { name: "size 1", shape: [1, 4, 2, 2], p: { size: 1, alpha: 0.3, beta: 0.5, k: 1.5 }, amp: 2 },
];

lrnCases.forEach((lc, i) => {
  Deno.test(`lrn: ${lc.name}`, () => {
    const rand = rng(4000 + i);
    const n = prod(lc.shape);
    const x = uniform(n, rand, lc.amp), dy = uniform(n, rand);
    const expected = ref.lrn(t64(x, lc.shape), lc.p);
    const y = new Float32Array(n).fill(NaN), scale = new Float32Array(n).fill(NaN);
    lrnForward(x, y, scale, lc.shape, lc.p);
    assertClose(y, expected.data, TOL, "forward");
    for (let j = 0; j < n; j++) {
      assert.ok(
        Math.abs(y[j] - x[j] * scale[j] ** -lc.p.beta) <= 1e-5 * (Math.abs(y[j]) + 1e-6),
        "scale is stored",
      );
    }

    const dy64 = Float64Array.from(dy);
    const gx = numericGrad((xv) => dot(dy64, ref.lrn({ data: xv, shape: lc.shape }, lc.p).data), x, 1e-5);
    const dx = new Float32Array(n).fill(NaN);
    lrnBackward(x, y, scale, dy, dx, lc.shape, lc.p);
    assertClose(dx, gx, 2e-5, "backward");

    if (lc.p.alpha >= 0.3 && lc.p.size > 1) {
      // The test must actually exercise the cross-channel term, not just dy·scale^(−beta).
      const diag = dy.map((d, j) => d * scale[j] ** -lc.p.beta);
      const m = Math.max(...gx.map(Math.abs));
      const off = Math.max(...diag.map((d, j) => Math.abs(d - gx[j])));
      assert.ok(off > 0.05 * m, `cross-channel term too small to test (${off} vs ${m})`);
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Reference self-checks (softmax family, used later by the gradient tests)

Deno.test("reference: softmax / logSoftmax / softmaxCrossEntropy", () => {
  const logits = {
    data: Float64Array.from([0, 0, 0, 0, 1000, 1000, 1000, 1000 - Math.log(2)]),
    shape: [2, 4],
  };
  const s = ref.softmax(logits);
  assert.ok(s.data.every(Number.isFinite), "stable for large logits");
  for (let r = 0; r < 2; r++) {
    assert.ok(Math.abs(s.data.slice(r * 4, r * 4 + 4).reduce((a, b) => a + b) - 1) < 1e-12);
  }
  assert.ok(Math.abs(s.data[0] - 0.25) < 1e-15);
  assert.ok(Math.abs(s.data[4] - 2 / 7) < 1e-12 && Math.abs(s.data[7] - 1 / 7) < 1e-12);
  const ls = ref.logSoftmax(logits);
  ls.data.forEach((v, j) => assert.ok(Math.abs(v - Math.log(s.data[j])) < 1e-12));
  const loss = ref.softmaxCrossEntropy(logits, [2, 3]);
  assert.ok(Math.abs(loss - (Math.log(4) + Math.log(7)) / 2) < 1e-12);
  assert.throws(() => ref.softmaxCrossEntropy(logits, [0, 4]), /out of range/);
});

// ---------------------------------------------------------------------------------------------
// Elementwise and strided copies

/** Element offset of multi-index `index` in a strided view. */
function at(view: StridedView, index: readonly number[]): number {
  return index.reduce((sum, i, d) => sum + i * view.strides[d], view.offset);
}

/** Every multi-index of `shape`, row-major. */
function* indices(shape: readonly number[]): Generator<number[]> {
  const index = shape.map(() => 0);
  const total = shape.reduce((a, b) => a * b, 1);
  for (let n = 0; n < total; n++) {
    yield index.slice();
    for (let d = shape.length - 1; d >= 0; d--) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

/** A random view of `shape` into a buffer: permuted, broadcast (stride 0) or plain axes, an offset. */
function randomView(shape: readonly number[], rand: () => number): { view: StridedView; length: number } {
  const order = shape.map((_, d) => d).sort(() => rand() - 0.5);
  const strides = new Array<number>(shape.length).fill(0);
  let size = 1;
  for (const d of order) {
    if (rand() < 0.25) continue; // broadcast axis
    strides[d] = size;
    size *= shape[d];
  }
  const offset = Math.floor(rand() * 3);
  return { view: { offset, strides }, length: offset + size + 2 };
}

Deno.test("elementwise: binary ops and strided copies over random views match a naive index loop bit for bit", () => {
  const rand = rng(0xe1e7);
  const ops: BinaryOp[] = ["add", "sub", "mul", "div", "max", "reluGrad", "greater"];
  for (let t = 0; t < 300; t++) {
    const rank = Math.floor(rand() * 5);
    const shape = Array.from(
      { length: rank },
      () => 1 + Math.floor(rand() * 4) * (rand() < 0.2 ? 0 : 1) + (rand() < 0.3 ? 17 : 0),
    );
    const a = randomView(shape, rand), b = randomView(shape, rand);
    const aData = uniform(a.length, rand), bData = uniform(b.length, rand);
    const total = shape.reduce((x, y) => x * y, 1);
    const op = ops[t % ops.length];
    const got = new Float32Array(total), want = new Float32Array(total);
    binaryKernel(op, aData, a.view, bData, b.view, got, shape);
    const f: Record<string, (x: number, y: number) => number> = {
      add: (x, y) => x + y,
      sub: (x, y) => x - y,
      mul: (x, y) => x * y,
      div: (x, y) => x / y,
      max: (x, y) => (x >= y ? x : y),
      reluGrad: (dy, y) => (y > 0 ? dy : 0),
      greater: (x, y) => (x > y ? 1 : 0),
    };
    let o = 0;
    for (const index of indices(shape)) want[o++] = f[op](aData[at(a.view, index)], bData[at(b.view, index)]);
    assert.deepEqual(
      got,
      want,
      `${op} shape ${JSON.stringify(shape)} views ${JSON.stringify([a.view, b.view])}`,
    );

    // The same views as a copy source, into a dense destination at an offset.
    const copied = new Float32Array(total + 3).fill(-7), expected = new Float32Array(total + 3).fill(-7);
    copyStridedKernel(aData, a.view, copied, { offset: 3, strides: contiguous(shape) }, shape);
    o = 3;
    for (const index of indices(shape)) expected[o++] = aData[at(a.view, index)];
    assert.deepEqual(copied, expected, `copy shape ${JSON.stringify(shape)} view ${JSON.stringify(a.view)}`);
  }
});

function contiguous(shape: readonly number[]): number[] {
  const strides = new Array<number>(shape.length);
  let size = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    strides[d] = size;
    size *= shape[d];
  }
  return strides;
}

// ---------------------------------------------------------------------------------------------
// Kernel outputs in memory that was never zeroed

// Kernel outputs come from `allocateUninitialized`, which skips the zero-fill: correct only if
// every kernel writes its whole output. Each case runs once into zeroed memory and once into
// memory poisoned with NaN (a freed block, taken back uninitialized), and must give the same
// bits. Mutations tried, each made this test fail: the WebAssembly input gradient without its
// `fill_zero` of dx before col2im; `allocateUninitialized` zero-filling (the poison check).
Deno.test("CPU backend: every kernel writes its whole output, so skipping the zero-fill changes nothing", async () => {
  const { CpuBackend } = await import("../../backends/cpu/backend.ts");
  const rand = rng(77);
  const lrn: LrnParams = { size: 5, alpha: 1e-4, beta: 0.75, k: 1 };
  for (const kernels of ["wasm", "ts"] as const) {
    const backend = new CpuBackend({ name: `dirty-${kernels}`, threads: 1, kernels });
    const f32 = (s: import("../../backends/backend.ts").Storage) => backend.readSync(s) as Float32Array;
    const input = (n: number) => backend.upload(uniform(n, rand));
    const x = [4, 8, 12, 12] as const, n = 4 * 8 * 12 * 12;
    const cg = conv2dGeometry(x, [16, 4, 3, 3], { padding: 1, groups: 2 });
    const pw = conv2dGeometry(x, [16, 8, 1, 1]);
    const pg = pool2dGeometry(x, { kernel: 3, stride: 2 });
    const pooled = 4 * 8 * pg.outHeight * pg.outWidth;
    const [xs, w, w1, y, y1, dyPool] = [
      input(n),
      input(16 * 4 * 9),
      input(16 * 8),
      input(2 * n),
      input(2 * n),
      input(pooled),
    ];
    const argmax = backend.allocate(pooled, "int32");
    backend.maxPool2dForward(xs, backend.allocate(pooled, "float32"), argmax, pg);
    const cases: [string, number, (out: import("../../backends/backend.ts").Storage) => void][] = [
      ["conv forward", 2 * n, (o) => backend.conv2dForward(xs, w, o, cg)],
      ["conv input gradient", n, (o) => backend.conv2dBackwardInput(y, w, o, cg)],
      ["pointwise input gradient", n, (o) => backend.conv2dBackwardInput(y1, w1, o, pw)],
      ["conv weight gradient", 16 * 4 * 9, (o) => backend.conv2dBackwardFilter(xs, y, o, cg)],
      [
        "max pool forward",
        pooled,
        (o) => backend.maxPool2dForward(xs, o, backend.allocate(pooled, "int32"), pg),
      ],
      ["max pool backward", n, (o) => backend.maxPool2dBackward(dyPool, argmax, o, pg)],
      ["avg pool forward", pooled, (o) => backend.avgPool2dForward(xs, o, pg)],
      ["avg pool backward", n, (o) => backend.avgPool2dBackward(dyPool, o, pg)],
      ["relu", n, (o) => backend.unary("relu", xs, o)],
      ["bias add", 2 * n, (o) =>
        backend.binary(
          "add",
          y,
          { offset: 0, strides: [2048, 144, 12, 1] },
          w,
          {
            offset: 0,
            strides: [0, 1, 0, 0],
          },
          o,
          [4, 16, 12, 12],
        )],
      ["row sums", 4 * 8, (o) => backend.reduce("sum", xs, o, 4 * 8, 144, 1)],
      ["matmul", 96 * 48, (o) =>
        backend.matmul(xs, y, o, {
          batch: 1,
          m: 96,
          n: 48,
          k: 48,
          transA: false,
          transB: false,
          aBatchStride: 0,
          bBatchStride: 0,
        })],
      ["softmax", n, (o) => backend.softmax(xs, o, { rows: 32, cols: 144 })],
      ["lrn forward", n, (o) => backend.lrnForward(xs, o, backend.allocate(n, "float32"), x, lrn)],
    ];
    // Large enough that the TypeScript kernels' array pool recycles them.
    const poisonMin = 16384;
    for (const [name, length, run] of cases) {
      const clean = backend.allocate(length, "float32");
      run(clean);
      const want = f32(clean);
      const poison = backend.allocateUninitialized(length, "float32");
      backend.fill(poison, NaN);
      backend.release(poison);
      const dirty = backend.allocateUninitialized(length, "float32");
      if (kernels === "wasm" || length >= poisonMin) {
        assert.ok(
          f32(dirty).some(Number.isNaN),
          `${kernels} ${name}: the poison is visible before the kernel`,
        );
      }
      run(dirty);
      assert.deepEqual(
        new Uint32Array(f32(dirty).buffer),
        new Uint32Array(want.buffer),
        `${kernels} ${name}`,
      );
    }
    backend.dispose();
  }
});
