/**
 * The WebAssembly fast paths of the CPU training step beside their TypeScript kernels: the fused
 * SGD and Adam updates, max pooling forward (every border case of the four-window vector path)
 * and max pooling backward, average pooling forward and backward, bit for bit, on 1 and 2
 * threads, in both module variants (relaxed SIMD where the runtime has it, plain SIMD128), and
 * through `CpuBackend`, which must take them exactly when its arrays live in kernel memory.
 *
 * Each test names the deliberate bugs ("mutations") it was seen to catch.
 *
 * @module
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../../backends/cpu/backend.ts";
import { adamUpdateKernel, sgdUpdateKernel } from "../../../backends/cpu/optimizers.ts";
import {
  avgPool2dBackward,
  avgPool2dForward,
  maxPool2dBackward,
  maxPool2dForward,
} from "../../../backends/cpu/pool.ts";
import { WasmKernels } from "../../../backends/cpu/wasm/kernels.ts";
import { type Pool2dGeometry, pool2dGeometry, type Pool2dOptions } from "../../../backends/geometry.ts";
import type { AdamStep, SgdStep } from "../../../backends/backend.ts";
import { mulberry32 } from "../../reference/random.ts";

const rand = mulberry32(0xfa57);

function randomArray(length: number, scale = 1): Float32Array {
  const out = new Float32Array(length);
  for (let i = 0; i < length; i++) out[i] = (rand() * 2 - 1) * scale;
  return out;
}

/** Same bits everywhere (`nanEqual`: any two NaNs count as equal, since NaN payloads are not portable). */
function assertSameBits(
  actual: Float32Array | Int32Array,
  expected: Float32Array | Int32Array,
  what: string,
  nanEqual = false,
): void {
  assert.equal(actual.length, expected.length, `${what}: length`);
  const a = new Int32Array(actual.buffer, actual.byteOffset, actual.length);
  const e = new Int32Array(expected.buffer, expected.byteOffset, expected.length);
  for (let i = 0; i < a.length; i++) {
    if (a[i] === e[i]) continue;
    if (nanEqual && Number.isNaN(actual[i]) && Number.isNaN(expected[i])) continue;
    assert.fail(
      `${what}: element ${i} is ${actual[i]} (0x${(a[i] >>> 0).toString(16)}), expected ${expected[i]} (0x${
        (e[i] >>> 0).toString(16)
      })`,
    );
  }
}

/** One-thread kernels of both module variants, and a 2-thread set (started by the first test). */
const relaxed = WasmKernels.create({ threads: 1 })!;
const plain = WasmKernels.create({ threads: 1, fma: false })!;
const twoThreads = WasmKernels.create({ threads: 2 })!;
const KERNELS: [string, WasmKernels][] = [["relaxed", relaxed], ["plain", plain], ["2 threads", twoThreads]];

/** A copy of `values` inside `kernels`' memory (the updates run only on resident arrays). */
function resident(kernels: WasmKernels, values: Float32Array): Float32Array {
  const array = kernels.allocateArray(values.length, "float32")!;
  array.set(values);
  return array;
}

function free(kernels: WasmKernels, ...arrays: Float32Array[]): void {
  for (const a of arrays) kernels.freeArray(a);
}

/**
 * Odd lengths around the 4- and 8-float steps, and one long enough for two threads to split (an
 * update takes a second thread from 1 Mi floats on).
 */
const LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 33, 1001, 4099, 1_048_583];

/**
 * Parameters of both signs, gradients with −0 entries (where a decay term of exactly zero would
 * turn −0 into +0 if it were not skipped), a few infinities and NaNs.
 */
function updateOperands(n: number): { param: Float32Array; grad: Float32Array } {
  const param = randomArray(n), grad = randomArray(n, 0.1);
  for (let i = 0; i < n; i += 5) grad[i] = -0;
  if (n > 40) {
    grad[11] = Infinity;
    grad[23] = NaN;
    param[37] = -Infinity;
  }
  return { param, grad };
}

Deno.test("wasm fast paths: the kernel threads start", async () => {
  assert.equal(await twoThreads.startThreads(), 2);
});

// Mutations tried, each made this test fail: h·momentum + diff·rate as one f32x4.relaxed_madd;
// the decay term applied even when decay is 0; the decay term skipped always; the last thread's
// share starting 16 floats late; the 8-float loop updating only its first 4 floats.
Deno.test("wasm SGD update: the TypeScript kernel's bits, decay 0, ±0 and non-zero, any length, 1 and 2 threads", () => {
  const steps: SgdStep[] = [
    { rate: 0.02, momentum: 0.9, decay: 5e-4 },
    { rate: 0.02, momentum: 0.9, decay: 0 },
    { rate: 0.013, momentum: 0, decay: -0 },
    { rate: 1e-3, momentum: 0.99, decay: 1e-46 }, // rounds to 0 in float32: skipped like 0
  ];
  for (const [name, kernels] of KERNELS) {
    for (const n of LENGTHS) {
      if (n > 5000 && name !== "2 threads") continue;
      for (const step of steps) {
        const { param, grad } = updateOperands(n);
        const history = randomArray(n, 0.01);
        const p = resident(kernels, param), g = resident(kernels, grad), h = resident(kernels, history);
        const expected = sgdUpdateKernel(param, grad, history, step);
        const finite = kernels.sgdUpdate(p, g, h, step);
        assert.notEqual(finite, undefined, "resident operands take the wasm path");
        assert.equal(finite, expected, `n=${n}: whether every new parameter is finite`);
        const what = `${name} SGD n=${n} ${JSON.stringify(step)}`;
        assertSameBits(p, param, `${what} param`, true);
        assertSameBits(h, history, `${what} history`, true);
        assertSameBits(g, grad, `${what} grad unchanged`);
        free(kernels, p, g, h);
      }
    }
  }
});

// The saving variant writes the undo's copies in the update's own pass (`Optimizer.updateSaving`).
// Mutations tried, each made this test fail: the kernel storing the new w (after the update) as the
// saved parameter; its saved-momentum pointer left out of those the loop advances; the task
// running the plain kernel whatever its saved addresses (nothing saved); the TypeScript kernel
// saving the momentum after updating it.
Deno.test("wasm SGD update that saves what it overwrites: the plain update's bits, the old values saved, any length, 1 and 2 threads", () => {
  const step: SgdStep = { rate: 0.02, momentum: 0.9, decay: 5e-4 };
  for (const [name, kernels] of KERNELS) {
    for (const n of LENGTHS) {
      if (n > 5000 && name !== "2 threads") continue;
      const { param, grad } = updateOperands(n);
      const history = randomArray(n, 0.01);
      const oldParam = param.slice(), oldHistory = history.slice();
      const p = resident(kernels, param), g = resident(kernels, grad), h = resident(kernels, history);
      // Stale values where the copies go, as the optimizer's spares from an earlier step hold.
      const sp = resident(kernels, randomArray(n)), sh = resident(kernels, randomArray(n));
      const oracle = { param: randomArray(n), history: randomArray(n) };
      const expected = sgdUpdateKernel(param, grad, history, step, oracle);
      const finite = kernels.sgdUpdate(p, g, h, step, { param: sp, history: sh });
      assert.notEqual(finite, undefined, "resident operands take the wasm path");
      assert.equal(finite, expected, `n=${n}: whether every new parameter is finite`);
      const what = `${name} saving SGD n=${n}`;
      assertSameBits(p, param, `${what} param`, true);
      assertSameBits(h, history, `${what} history`, true);
      for (const [saved, label] of [[sp, "wasm"], [oracle.param, "TypeScript"]] as const) {
        assertSameBits(saved, oldParam, `${what} ${label} saved param`, true);
      }
      for (const [saved, label] of [[sh, "wasm"], [oracle.history, "TypeScript"]] as const) {
        assertSameBits(saved, oldHistory, `${what} ${label} saved history`, true);
      }
      free(kernels, p, g, h, sp, sh);
    }
  }
});

// The finite check in the update's own pass (the runtime then skips its scan of the group). Mutations
// tried, each made this test fail: the flag ORing the old w instead of the new; only thread 0's flag
// read; the TypeScript kernel testing w before the update.
Deno.test("wasm SGD update: says whether every new parameter is finite, wherever the bad one lies, on 1 and 2 threads", () => {
  const step: SgdStep = { rate: 1, momentum: 0, decay: 0 };
  for (const [name, kernels] of KERNELS) {
    for (const n of [1, 7, 17, 33, 1001, 1_048_583]) {
      if (n > 5000 && name !== "2 threads") continue;
      // Finite everywhere, then one overflow (w − h = 3e38 + 3e38) at the start, the middle (the
      // second thread's share) and the last element; then a parameter already infinite whose
      // update leaves it so.
      const cases: [string, number | undefined, number][] = [
        ["all finite", undefined, 0],
        ["overflow first", 0, -3e38],
        ["overflow middle", Math.floor(n * 0.75), -3e38],
        ["overflow last", n - 1, -3e38],
      ];
      for (const [what, at, grad] of cases) {
        const param = randomArray(n), g = randomArray(n, 0.1), history = new Float32Array(n);
        if (at !== undefined) {
          param[at] = 3e38;
          g[at] = grad;
        }
        const p = resident(kernels, param), gg = resident(kernels, g), h = resident(kernels, history);
        const expected = sgdUpdateKernel(param, g, history, step);
        assert.equal(expected, at === undefined, `${what}: the TypeScript kernel`);
        assert.equal(kernels.sgdUpdate(p, gg, h, step), expected, `${name} n=${n} ${what}`);
        free(kernels, p, gg, h);
      }
    }
  }
});

// Mutations tried, each made this test fail: (mi·step) / denominator instead of (mi / denominator)
// · step; √vi / root2 computed as √(vi / root2 / root2); the decay term applied when decay is 0;
// β2 passed in place of 1 − β2; the last thread's share starting 16 floats late.
Deno.test("wasm Adam update: the TypeScript kernel's bits, with and without decay, any length, 1 and 2 threads", () => {
  const steps: AdamStep[] = [
    { rate: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, decay: 0, correction1: 0.1, correction2: 0.001 },
    {
      rate: 3e-3,
      beta1: 0.8,
      beta2: 0.99,
      eps: 1e-6,
      decay: 1e-2,
      correction1: 1 - 0.8 ** 7,
      correction2: 1 - 0.99 ** 7,
    },
  ];
  for (const [name, kernels] of KERNELS) {
    for (const n of LENGTHS) {
      if (n > 5000 && name !== "2 threads") continue;
      for (const step of steps) {
        const { param, grad } = updateOperands(n);
        const m = randomArray(n, 0.1), v = randomArray(n, 0.01).map(Math.abs);
        const p = resident(kernels, param), g = resident(kernels, grad);
        const mm = resident(kernels, m), vv = resident(kernels, v);
        adamUpdateKernel(param, grad, m, v, step);
        assert.ok(kernels.adamUpdate(p, g, mm, vv, step), "resident operands take the wasm path");
        const what = `${name} Adam n=${n} decay ${step.decay}`;
        assertSameBits(p, param, `${what} param`, true);
        assertSameBits(mm, m, `${what} m`, true);
        assertSameBits(vv, v, `${what} v`, true);
        free(kernels, p, g, mm, vv);
      }
    }
  }
});

// Mutation tried, which made this test fail: WasmKernels accepting operands of unequal lengths.
Deno.test("wasm updates: arrays outside kernel memory, or of unequal lengths, are refused untouched", () => {
  const step = { rate: 0.1, momentum: 0.9, decay: 0 };
  const inside = resident(relaxed, randomArray(8)), outside = new Float32Array(new SharedArrayBuffer(32));
  const before = inside.slice();
  assert.equal(relaxed.sgdUpdate(inside, outside, inside, step), undefined);
  assert.equal(relaxed.sgdUpdate(inside, resident(relaxed, randomArray(9)), inside, step), undefined);
  assertSameBits(inside, before, "refused update left param alone");
});

// ---------------------------------------------------------------------------------------------
// Max pooling

const POOL_CASES: [number[], Pool2dOptions][] = [
  // The AlexNet-like layers (batch 2): clipped last row and column (28, 14), four windows a row in
  // three (7 → 3), and ones whose windows all fit.
  [[2, 32, 28, 28], { kernel: 3, stride: 2 }],
  [[2, 64, 14, 14], { kernel: 3, stride: 2 }],
  [[2, 64, 7, 7], { kernel: 3, stride: 2 }],
  [[2, 3, 33, 33], { kernel: 3, stride: 2 }],
  [[1, 6, 55, 55], { kernel: 3, stride: 2 }],
  // Every row width from one window to a few groups plus a tail, clipped or not.
  ...[3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 16, 17, 19, 21].map((w): [number[], Pool2dOptions] => [[2, 3, 5, w], {
    kernel: 3,
    stride: 2,
  }]),
  ...[2, 3, 5, 7, 9, 15].map((w): [number[], Pool2dOptions] => [[1, 3, 4, w], { kernel: 2, stride: 2 }]),
  // Padding (the scalar left border, clipped top rows), other kernel widths on the generic vector
  // path (4, 5, 8), a width the vector path leaves alone (9), other strides and heights, which
  // take the row-by-row path instead of the strips.
  [[2, 3, 11, 13], { kernel: 3, stride: 2, padding: 1 }],
  [[2, 3, 10, 11], { kernel: 3, stride: 2, padding: 2 }],
  [[1, 2, 13, 8], { kernel: 3, stride: 2, padding: [2, 1] }],
  // One output row; two, the second clipped (the strips' carried row ends early).
  [[2, 3, 3, 9], { kernel: 3, stride: 2 }],
  [[2, 3, 4, 9], { kernel: 3, stride: 2 }],
  [[1, 4, 12, 17], { kernel: [3, 4], stride: 2, padding: [1, 1] }],
  [[2, 3, 9, 9], { kernel: 5, stride: 2 }],
  [[2, 3, 9, 19], { kernel: [2, 8], stride: 2, padding: [1, 3] }],
  [[1, 2, 12, 30], { kernel: [3, 8], stride: 2 }],
  [[1, 2, 10, 30], { kernel: [2, 9], stride: 2 }],
  [[2, 3, 11, 13], { kernel: [2, 3], stride: [1, 2] }],
  [[3, 5, 12, 17], { kernel: 3, stride: 1 }],
  [[2, 3, 12, 17], { kernel: 3, stride: [2, 3] }],
  [[2, 3, 12, 17], { kernel: 3, stride: [1, 2] }],
  [[2, 3, 13, 17], { kernel: 3, stride: [3, 2] }],
];

/**
 * Few distinct values, so windows tie often (the first maximum must win); NaNs (also as a window's
 * first tap), signed zeros and infinities; one plane all −∞, one all NaN, one of ±0 only.
 */
function poolInput(shape: readonly number[]): Float32Array {
  const [n, c, h, w] = shape, plane = h * w;
  const x = randomArray(n * c * plane).map((v) => Math.round(v * 4) / 4);
  for (let i = 3; i < x.length; i += 41) x[i] = NaN;
  for (let i = 7; i < x.length; i += 29) x[i] = rand() < 0.5 ? -0 : 0;
  x[0] = NaN;
  x[x.length - 1] = Infinity;
  x[x.length - 2] = -Infinity;
  if (n * c >= 3) {
    x.fill(-Infinity, 0, plane);
    x.fill(NaN, plane, 2 * plane);
    for (let i = 2 * plane; i < 3 * plane; i++) x[i] = i % 3 === 0 ? -0 : 0;
  }
  return x;
}

const GUARD = 0x7fc0bad0;

/** The 16 words after a resident array (its block's slack in kernel memory), set to {@link GUARD}. */
function guard(array: Float32Array | Int32Array): Int32Array {
  return new Int32Array(array.buffer, array.byteOffset + array.byteLength, 16).fill(GUARD);
}

function poolSizes(g: Pool2dGeometry): { n: number; outputs: number } {
  const planes = g.batch * g.channels;
  return { n: planes * g.inHeight * g.inWidth, outputs: planes * g.outHeight * g.outWidth };
}

// Mutations tried, each made this test fail: the last maximum kept instead of the first
// (f32x4.lt for le); NaN not taken (no best == best term); no masks on clipped windows; a row's
// last group not moved back (it stored past the row: the guard words caught it); a short row
// storing lane 0 only; tap 2 of width 3 taken from the wrong lanes; the generic width's mask one
// column short, and one column long; strips for any row stride; the strips' first window
// starting from a stale carried row; the strips leaving out a window's last row.
Deno.test("wasm max pooling forward: the TypeScript kernel's values and argmax exactly, every border case", () => {
  for (const [shape, options] of POOL_CASES) {
    const g = pool2dGeometry(shape, options);
    const { outputs } = poolSizes(g);
    const x = poolInput(shape);
    const want = new Float32Array(outputs), wantIndex = new Int32Array(outputs);
    maxPool2dForward(x, want, wantIndex, g);
    for (const [name, kernels] of KERNELS) {
      // Outputs in kernel memory, so a store past their end shows in the guard words after them.
      const got = kernels.allocateArray(outputs, "float32")!,
        gotIndex = kernels.allocateArray(outputs, "int32")!;
      got.fill(7);
      gotIndex.fill(-7);
      const guards = [guard(got), guard(gotIndex)];
      assert.ok(kernels.maxPool2dForward(x, got, gotIndex, g));
      const what = `${name} max pool ${JSON.stringify(shape)} ${JSON.stringify(options)}`;
      assertSameBits(got, want, what);
      assertSameBits(gotIndex, wantIndex, `${what} argmax`);
      for (const after of guards) assert.ok(after.every((v) => v === GUARD), `${what}: wrote past the end`);
      kernels.freeArray(got);
      kernels.freeArray(gotIndex);
    }
  }
});

Deno.test("wasm max pooling forward: full-size AlexNet-like layers on resident arrays, 2 threads", () => {
  for (const shape of [[64, 32, 28, 28], [64, 64, 14, 14], [64, 64, 7, 7]]) {
    const g = pool2dGeometry(shape, { kernel: 3, stride: 2 });
    const { outputs } = poolSizes(g);
    const x = poolInput(shape);
    const want = new Float32Array(outputs), wantIndex = new Int32Array(outputs);
    maxPool2dForward(x, want, wantIndex, g);
    const xIn = resident(twoThreads, x), got = twoThreads.allocateArray(outputs, "float32")!;
    const gotIndex = twoThreads.allocateArray(outputs, "int32")!;
    const guards = [guard(got), guard(gotIndex)];
    assert.ok(twoThreads.maxPool2dForward(xIn, got, gotIndex, g));
    assertSameBits(got, want, `max pool ${shape}`);
    assertSameBits(gotIndex, wantIndex, `max pool ${shape} argmax`);
    for (const after of guards) {
      assert.ok(after.every((v) => v === GUARD), `max pool ${shape}: wrote past the end`);
    }
    twoThreads.freeArray(xIn);
    twoThreads.freeArray(got);
    twoThreads.freeArray(gotIndex);
  }
});

// Mutations tried, each made this test fail: outputs of a plane scattered in reverse order (sums
// of shared winners round differently); dx not zero-filled first; the second thread's planes
// starting one plane late.
Deno.test("wasm max pooling backward: the TypeScript kernel's bits, overlapping windows summed in order", () => {
  const cases: [number[], Pool2dOptions][] = [
    ...POOL_CASES,
    [[64, 32, 28, 28], { kernel: 3, stride: 2 }],
    [[64, 64, 7, 7], { kernel: 3, stride: 2 }],
  ];
  for (const [shape, options] of cases) {
    const g = pool2dGeometry(shape, options);
    const { n, outputs } = poolSizes(g);
    // Distinct inputs spread the winners; some windows share one (stride < kernel).
    const x = randomArray(n).map((v) => Math.round(v * 8) / 8);
    const y = new Float32Array(outputs), argmax = new Int32Array(outputs);
    maxPool2dForward(x, y, argmax, g);
    // Magnitudes far apart, so the order of a sum shows in its bits.
    const dy = randomArray(outputs).map((v, i) => v * (i % 3 === 0 ? 1e4 : i % 3 === 1 ? 1 : 1e-4));
    const want = new Float32Array(n);
    maxPool2dBackward(dy, argmax, want, g);
    for (const [name, kernels] of KERNELS) {
      const got = new Float32Array(n).fill(NaN);
      assert.ok(kernels.maxPool2dBackward(dy, argmax, got, g));
      assertSameBits(
        got,
        want,
        `${name} max pool backward ${JSON.stringify(shape)} ${JSON.stringify(options)}`,
      );
    }
  }
});

// ---------------------------------------------------------------------------------------------
// Average pooling

/** Kernel 2 and 3, strides 1 and 2, padding 0 and 1, over odd and even sizes. */
const AVG_POOL_CASES: [number[], Pool2dOptions][] = [
  ...[[5, 5], [7, 9], [9, 13], [16, 16], [13, 17], [8, 11], [4, 19]].flatMap(([h, w]) =>
    [2, 3].flatMap((kernel) =>
      [1, 2].flatMap((stride) =>
        [0, 1].map((padding): [number[], Pool2dOptions] => [[2, 3, h, w], { kernel, stride, padding }])
      )
    )
  ),
  // Every row width from one window to a few groups plus a tail, the left edge in the padding or
  // not (stride 2: the four-window forward groups and four-column backward groups).
  ...[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 17, 21].flatMap((w) =>
    [0, 1].filter((padding) => w + 2 * padding >= 3).map((padding): [number[], Pool2dOptions] => [
      [1, 3, 6, w],
      { kernel: 3, stride: 2, padding },
    ])
  ),
  // The cifar10_quick layers at batch 2 (ceil mode clips the last row and column).
  [[2, 32, 16, 16], { kernel: 3, stride: 2 }],
  [[2, 64, 8, 8], { kernel: 3, stride: 2 }],
  // Other kernel widths (the generic stride-2 vector paths), unequal sides, padding 2, stride 3.
  ...POOL_CASES,
];

/**
 * Magnitudes far apart, and one value in eight ±2⁶⁰: a float64 sum rounds once more to float32,
 * which hides the order of its adds unless they cancel, as when a window holds 2⁶⁰ and −2⁶⁰
 * (the small values added between them are lost, those after them kept). NaNs, ±0 and
 * infinities sprinkled in; with three planes or more, one all −0 (an average of −0s is +0: the
 * sum starts at +0), one of infinities of both signs, one of values whose float64 sums round
 * differently from float32 ones.
 */
function avgPoolInput(shape: readonly number[]): Float32Array {
  const planes = shape[0] * shape[1], plane = shape.length === 4 ? shape[2] * shape[3] : shape[2];
  const scales = [1e4, 1, 1e-4, 3e-8, 0.5];
  const x = randomArray(planes * plane).map((v, i) =>
    rand() < 0.125 ? (rand() < 0.5 ? 2 ** 60 : -(2 ** 60)) : v * scales[i % 5]
  );
  for (let i = 3; i < x.length; i += 97) x[i] = NaN;
  for (let i = 7; i < x.length; i += 29) x[i] = rand() < 0.5 ? -0 : 0;
  for (let i = 11; i < x.length; i += 89) x[i] = rand() < 0.5 ? Infinity : -Infinity;
  if (planes >= 3) {
    x.fill(-0, 0, plane);
    for (let i = plane; i < 2 * plane; i++) x[i] = rand() < 0.7 ? (rand() < 0.5 ? Infinity : -Infinity) : 1;
    for (let i = 2 * plane; i < 3 * plane; i++) x[i] = 1 + (i % 7) * 2 ** -23 + (i % 3) * 2 ** -30;
  }
  return x;
}

// Mutations tried, each made this test fail. Forward: the divisor's width never clipped at the
// border (the divisor table built with kW); sums in float32; the quotient as sum · (1 / divisor);
// sums starting at −0 (the −0 plane); taps 1 and 2 of a row swapped on the vector path (seen only
// through the 2⁶⁰ cancellations); a lane-0 window's columns summed right to left; no masks on
// clipped windows; the generic width's mask one column short; a short row storing lane 0 only;
// lane-0 windows dividing by the next window's divisor. Backward: the share rounded to float32
// before it is added; a dx row's two covering output rows taken in reverse order; the even pair's
// two rounds swapped; the odd pair taking round 0 (width 3); the generic width's odd pair not
// cleared in round 0; stride 2's covering rows ending one row late; the lane-0 tap test k ≤ kW;
// dx starting from its old contents instead of +0.
Deno.test("wasm average pooling: the TypeScript kernels' bits forward and backward, every border case", () => {
  for (const [shape, options] of AVG_POOL_CASES) {
    const g = pool2dGeometry(shape, options);
    const { n, outputs } = poolSizes(g);
    const x = avgPoolInput(shape), dy = avgPoolInput([g.batch, g.channels, g.outHeight, g.outWidth]);
    const want = new Float32Array(outputs), wantDx = new Float32Array(n);
    avgPool2dForward(x, want, g);
    avgPool2dBackward(dy, wantDx, g);
    for (const [name, kernels] of KERNELS) {
      const what = `${name} avg pool ${JSON.stringify(shape)} ${JSON.stringify(options)}`;
      // Outputs in kernel memory, so a store past their end shows in the guard words after them.
      const got = kernels.allocateArray(outputs, "float32")!, gotDx = kernels.allocateArray(n, "float32")!;
      got.fill(7);
      gotDx.fill(NaN);
      const guards = [guard(got), guard(gotDx)];
      assert.ok(kernels.avgPool2dForward(x, got, g));
      assertSameBits(got, want, what, true);
      assert.ok(kernels.avgPool2dBackward(dy, gotDx, g));
      assertSameBits(gotDx, wantDx, `${what} backward`, true);
      for (const after of guards) assert.ok(after.every((v) => v === GUARD), `${what}: wrote past the end`);
      kernels.freeArray(got);
      kernels.freeArray(gotDx);
    }
  }
});

// Mutations tried, each made this test fail: the second thread's planes starting one plane late
// (forward and backward); both threads sharing one share table (scratchStride 0); and of those
// above, the unclipped divisor, float32 sums, the reciprocal, sums from −0, taps 1 and 2 swapped,
// no masks, the share in float32, the covering rows reversed, the even pair's rounds swapped, the
// odd pair taking round 0 and the covering rows ending late.
Deno.test("wasm average pooling: full-size cifar10_quick layers on resident arrays, 1 and 2 threads", () => {
  for (const shape of [[64, 32, 16, 16], [64, 64, 8, 8]]) {
    const g = pool2dGeometry(shape, { kernel: 3, stride: 2 });
    const { n, outputs } = poolSizes(g);
    const x = avgPoolInput(shape), dy = avgPoolInput([g.batch, g.channels, g.outHeight, g.outWidth]);
    const want = new Float32Array(outputs), wantDx = new Float32Array(n);
    avgPool2dForward(x, want, g);
    avgPool2dBackward(dy, wantDx, g);
    for (const [name, kernels] of [["1 thread", plain], ["2 threads", twoThreads]] as const) {
      const xIn = resident(kernels, x), dyIn = resident(kernels, dy);
      const got = kernels.allocateArray(outputs, "float32")!, gotDx = kernels.allocateArray(n, "float32")!;
      const guards = [guard(got), guard(gotDx)];
      assert.ok(kernels.avgPool2dForward(xIn, got, g));
      assert.ok(kernels.avgPool2dBackward(dyIn, gotDx, g));
      assertSameBits(got, want, `${name} avg pool ${shape}`, true);
      assertSameBits(gotDx, wantDx, `${name} avg pool ${shape} backward`, true);
      for (const after of guards) {
        assert.ok(after.every((v) => v === GUARD), `${name} avg pool ${shape}: wrote past the end`);
      }
      free(kernels, xIn, dyIn, got, gotDx);
    }
  }
});

// Mutations tried, each made this test fail: CpuBackend.avgPool2dForward, and then
// avgPool2dBackward, never calling the kernels (the call counts); the second thread's planes
// starting one plane late; one share table for both threads.
Deno.test("CpuBackend: average pooling takes WebAssembly on resident storages, the TypeScript oracle's bits on 1 and 2 threads", async () => {
  const oracle = new CpuBackend({ kernels: "ts" });
  for (const threads of [1, 2]) {
    const cpu = new CpuBackend({ threads });
    await cpu.startThreads();
    const wasm = (cpu as unknown as { wasm: WasmKernels }).wasm;
    assert.ok(wasm, "this runtime has the WebAssembly kernels");
    const taken = { avgPool2dForward: 0, avgPool2dBackward: 0 };
    for (const name of ["avgPool2dForward", "avgPool2dBackward"] as const) {
      const original = wasm[name].bind(wasm) as (...args: unknown[]) => boolean;
      (wasm as unknown as Record<string, unknown>)[name] = (...args: unknown[]) => {
        const done = original(...args);
        if (done) taken[name]++;
        return done;
      };
    }
    try {
      const cases: [number[], Pool2dOptions][] = [
        [[64, 32, 16, 16], { kernel: 3, stride: 2 }],
        [[64, 64, 8, 8], { kernel: 3, stride: 2 }],
        [[2, 3, 9, 11], { kernel: 2, stride: 1, padding: 1 }],
      ];
      for (const [shape, options] of cases) {
        const g = pool2dGeometry(shape, options);
        const { n, outputs } = poolSizes(g);
        const xs = avgPoolInput(shape), dys = avgPoolInput([g.batch, g.channels, g.outHeight, g.outWidth]);
        const results = [cpu, oracle].map((b) => {
          const x = b.upload(xs), y = b.allocateUninitialized(outputs, "float32");
          const dy = b.upload(dys), dx = b.allocateUninitialized(n, "float32");
          b.avgPool2dForward(x, y, g);
          b.avgPool2dBackward(dy, dx, g);
          const out = [b.readSync(y), b.readSync(dx)] as Float32Array[];
          for (const s of [x, y, dy, dx]) b.release(s);
          return out;
        });
        const what = `${threads} threads ${JSON.stringify(shape)}`;
        assertSameBits(results[0][0], results[1][0], `backend avg pool ${what}`, true);
        assertSameBits(results[0][1], results[1][1], `backend avg pool backward ${what}`, true);
      }
      assert.deepEqual(taken, { avgPool2dForward: 3, avgPool2dBackward: 3 }, "wasm average pooling taken");
    } finally {
      cpu.dispose();
    }
  }
});

// ---------------------------------------------------------------------------------------------
// Through the backend

// Mutations tried, each made this test fail: CpuBackend.sgdUpdate never calling the kernels (the
// call count); the SGD update with a relaxed multiply-add; the Adam update with β2 for 1 − β2;
// the pooling backward scattering in reverse order; `wrap` not adopting views of `allocateShared`
// memory (the "shared" counts).
Deno.test("CpuBackend: updates and pooling backward take WebAssembly on resident storages, on views of allocateShared memory and on backend views of them, TypeScript on other wrapped memory", () => {
  const cpu = new CpuBackend({ threads: 1 });
  const oracle = new CpuBackend({ kernels: "ts" });
  const wasm = (cpu as unknown as { wasm: WasmKernels }).wasm;
  assert.ok(wasm, "this runtime has the WebAssembly kernels");
  const taken = { sgd: 0, adam: 0, poolBackward: 0 };
  const spy = <K extends "sgdUpdate" | "adamUpdate" | "maxPool2dBackward">(
    name: K,
    counter: keyof typeof taken,
  ) => {
    const original = wasm[name].bind(wasm) as (...args: unknown[]) => boolean;
    (wasm as unknown as Record<string, unknown>)[name] = (...args: unknown[]) => {
      const done = original(...args);
      if (done) taken[counter]++;
      return done;
    };
  };
  spy("sgdUpdate", "sgd");
  spy("adamUpdate", "adam");
  spy("maxPool2dBackward", "poolBackward");
  try {
    const n = 1031;
    const values = [
      randomArray(n),
      randomArray(n, 0.1),
      randomArray(n, 0.01),
      randomArray(n, 0.01).map(Math.abs),
    ];
    const sgd: SgdStep = { rate: 0.05, momentum: 0.9, decay: 1e-3 };
    const adam: AdamStep = {
      rate: 1e-3,
      beta1: 0.9,
      beta2: 0.999,
      eps: 1e-8,
      decay: 0,
      correction1: 0.19,
      correction2: 0.002,
    };
    const keep: Float32Array[] = [];
    for (const where of ["resident", "wrapped", "shared", "range"] as const) {
      const store = (b: CpuBackend, v: Float32Array) => {
        if (b !== cpu || where === "resident") return b.upload(v);
        if (where === "wrapped") return b.wrap(copyShared(v));
        if (where === "range") {
          // `backend.view` of kernel memory, as an optimizer stepping part of a group makes (the
          // MPI exchange's chunks). Mutation seen caught: `view` not adopting its part, which sent
          // every chunk's update to the TypeScript kernel at a third of the speed ("range: wasm
          // SGD taken" 0).
          const whole = b.allocateShared(v.length + 5);
          keep.push(whole);
          whole.subarray(3, 3 + v.length).set(v);
          return b.view(b.wrap(whole), 3, v.length);
        }
        // A view into the middle of kernel memory, as a device's parameter slice is. The whole
        // array is kept: its memory is freed once it is garbage, views or not.
        const whole = b.allocateShared(v.length + 5);
        keep.push(whole);
        const view = whole.subarray(3, 3 + v.length);
        view.set(v);
        return b.wrap(view);
      };
      const [p, g, h] = values.slice(0, 3).map((v) => store(cpu, v));
      const [op, og, oh] = values.slice(0, 3).map((v) => store(oracle, v));
      const before = taken.sgd;
      cpu.sgdUpdate(p, g, h, sgd);
      oracle.sgdUpdate(op, og, oh, sgd);
      assert.equal(taken.sgd - before, where === "wrapped" ? 0 : 1, `${where}: wasm SGD taken`);
      assertSameBits(
        cpu.readSync(p) as Float32Array,
        oracle.readSync(op) as Float32Array,
        `${where} SGD`,
        true,
      );
      assertSameBits(
        cpu.readSync(h) as Float32Array,
        oracle.readSync(oh) as Float32Array,
        `${where} SGD h`,
        true,
      );
      const [ap, ag, am, av] = values.map((v) => store(cpu, v));
      const [oap, oag, oam, oav] = values.map((v) => store(oracle, v));
      const adamBefore = taken.adam;
      cpu.adamUpdate(ap, ag, am, av, adam);
      oracle.adamUpdate(oap, oag, oam, oav, adam);
      assert.equal(taken.adam - adamBefore, where === "wrapped" ? 0 : 1, `${where}: wasm Adam taken`);
      assertSameBits(
        cpu.readSync(ap) as Float32Array,
        oracle.readSync(oap) as Float32Array,
        `${where} Adam`,
        true,
      );
    }
    const g = pool2dGeometry([2, 4, 9, 9], { kernel: 3, stride: 2 });
    const { n: inputs, outputs } = poolSizes(g);
    const x = cpu.upload(randomArray(inputs)), y = cpu.allocate(outputs, "float32");
    const argmax = cpu.allocate(outputs, "int32"), dy = cpu.upload(randomArray(outputs));
    const dx = cpu.allocate(inputs, "float32");
    cpu.maxPool2dForward(x, y, argmax, g);
    cpu.maxPool2dBackward(dy, argmax, dx, g);
    assert.equal(taken.poolBackward, 1, "wasm pooling backward taken");
    const want = new Float32Array(inputs);
    maxPool2dBackward(cpu.readSync(dy) as Float32Array, cpu.readSync(argmax) as Int32Array, want, g);
    assertSameBits(cpu.readSync(dx) as Float32Array, want, "backend pooling backward");
  } finally {
    cpu.dispose();
  }
});

/** `values` in a SharedArrayBuffer, as a device's parameters are. */
function copyShared(values: Float32Array): Float32Array {
  const out = new Float32Array(new SharedArrayBuffer(4 * values.length));
  out.set(values);
  return out;
}

Deno.test("wasm fast paths: the kernel threads stop", () => {
  for (const [, kernels] of KERNELS) kernels.dispose();
});
