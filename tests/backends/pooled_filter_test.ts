/**
 * A max-pooled convolution's weight gradient straight from the pooled gradient
 * (`conv2dBackwardFilterPooled`, CPU WebAssembly kernels): against a float64 reference of the
 * weight gradient of the scattered gradient, with and without the ReLU's mask, on grouped,
 * strided and rectangular filters; the same bits on 1 to 3 threads; declined (nothing written)
 * where the kernels cannot take the shapes; and used by a first layer's backward (its input needs
 * no gradient) in place of the scatter, not by a layer whose input gradient needs the scatter.
 *
 * Mutations tried, each made a test here fail: the kernel ignoring the mask (`masked` read as 0);
 * the offsets table ignoring the stride (`x · strideW` → `x`); each filter's channels read from
 * the first group's planes (`first + c` → `c`); each thread taking the images in an order of its
 * own (starting at image f0 mod batch: the sums' order then depends on the thread count); plane
 * sums written for no filter (flag dropped); the shape checks removed (an 11×11 filter then
 * reaches the kernels, which have no such shape, where it must be declined); `conv2d`'s backward
 * ignoring the capability; and using it although x needs a gradient.
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import { type Conv2dGeometry, conv2dGeometry, pool2dGeometry } from "../../backends/geometry.ts";
import type { Backend, Pool2dGeometry, Storage } from "../../backends/backend.ts";
import { ops, setBackend, type Tensor, tensor, valueAndGrad } from "../../mod.ts";
import { registerLogged } from "./logged_backend.ts";
import { mulberry32 } from "../reference/random.ts";
import { assertSameBits } from "../reference/bits.ts";
import { assertRelativelyClose } from "../reference/close.ts";
import { conv2dGradients } from "../reference/float64.ts";

const random = mulberry32(0x51f7);
function values(n: number): Float32Array {
  return Float32Array.from({ length: n }, () => random() * 2 - 1);
}

async function read(backend: Backend, s: Storage): Promise<Float32Array> {
  return await backend.read(s) as Float32Array;
}

/** Largest difference over the largest |float64| value at most `TOL` (float32 sums of up to 5,000 products). */
const TOL = 1e-5;

interface Case {
  name: string;
  x: number[];
  w: number[];
  options: { stride?: number | [number, number]; padding?: number | [number, number]; groups?: number };
  pool: { kernel: number; stride: number };
}

const CASES: Case[] = [
  // The AlexNet-like conv1: one channel, 5×5 (two vectors per kernel row), 28×28 pooled 3×3 stride 2.
  {
    name: "1→32, 5×5",
    x: [8, 1, 28, 28],
    w: [32, 1, 5, 5],
    options: { padding: 2 },
    pool: { kernel: 3, stride: 2 },
  },
  // Two groups of 3 channels, 3×3 (one vector), odd sizes.
  {
    name: "grouped 6→8, 3×3",
    x: [4, 6, 13, 11],
    w: [8, 3, 3, 3],
    options: { padding: 1, groups: 2 },
    pool: { kernel: 3, stride: 2 },
  },
  // Stride 2, a 5×7 filter, padding 2 × 3, non-overlapping 2×2 pooling.
  {
    name: "stride 2, 5×7",
    x: [3, 3, 17, 19],
    w: [5, 3, 5, 7],
    options: { padding: [2, 3], stride: 2 },
    pool: { kernel: 2, stride: 2 },
  },
];

/** One case's operands as host arrays: a ReLU convolution's output pooled, its winners, a gradient. */
interface Operands {
  g: Conv2dGeometry;
  pool: Pool2dGeometry;
  x: Float32Array;
  pooled: Float32Array;
  argmax: Int32Array;
  dy: Float32Array;
}

async function operands(backend: Backend, c: Case): Promise<Operands> {
  const g = conv2dGeometry(c.x, c.w, c.options);
  const pool = pool2dGeometry([g.batch, g.outChannels, g.outHeight, g.outWidth], c.pool, "test");
  const xs = values(c.x.reduce((p, q) => p * q));
  const x = backend.upload(xs), w = backend.upload(values(c.w.reduce((p, q) => p * q)));
  const y = backend.allocate(g.batch * g.outChannels * g.outHeight * g.outWidth, "float32");
  backend.conv2dForward(x, w, y, g, undefined, "relu");
  const outputs = pool.batch * pool.channels * pool.outHeight * pool.outWidth;
  const pooled = backend.allocate(outputs, "float32"), argmax = backend.allocate(outputs, "int32");
  backend.maxPool2dForward(y, pooled, argmax, pool);
  return {
    g,
    pool,
    x: xs,
    pooled: await read(backend, pooled),
    argmax: await backend.read(argmax) as Int32Array,
    dy: values(outputs),
  };
}

/** The weight gradient and plane sums on `backend` (masked by the pooled values where `masked`). */
async function pooledFilter(backend: Backend, o: Operands, masked: boolean, sums = true) {
  const { g, pool } = o;
  const dw = backend.allocate(g.outChannels * (g.inChannels / g.groups) * g.kernelH * g.kernelW, "float32");
  const planeSums = sums ? backend.allocate(g.batch * g.outChannels, "float32") : undefined;
  const done = backend.conv2dBackwardFilterPooled!(
    backend.upload(o.x),
    backend.upload(o.dy),
    backend.upload(o.argmax),
    dw,
    g,
    pool,
    { reluOf: masked ? backend.upload(o.pooled) : undefined, planeSums },
  );
  return { done, dw: await read(backend, dw), sums: planeSums && await read(backend, planeSums) };
}

/**
 * The float64 weight gradient of the scattered gradient (each pooled gradient, where counted,
 * added to its winner; `conv2dGradients` of the reference), and each plane's counted gradients summed.
 */
function reference(o: Operands, masked: boolean): { dw: Float64Array; sums: Float64Array } {
  const { g, pool } = o;
  const plane = g.outHeight * g.outWidth, outputs = pool.outHeight * pool.outWidth;
  const scattered = new Float64Array(g.batch * g.outChannels * plane);
  const sums = new Float64Array(g.batch * g.outChannels);
  for (let p = 0; p < sums.length; p++) {
    for (let i = p * outputs; i < (p + 1) * outputs; i++) {
      if (masked && !(o.pooled[i] > 0)) continue;
      scattered[p * plane + o.argmax[i]] += o.dy[i];
      sums[p] += o.dy[i];
    }
  }
  const cinG = g.inChannels / g.groups;
  const { dw } = conv2dGradients(
    { data: Float64Array.from(o.x), shape: [g.batch, g.inChannels, g.inHeight, g.inWidth] },
    {
      data: new Float64Array(g.outChannels * cinG * g.kernelH * g.kernelW),
      shape: [g.outChannels, cinG, g.kernelH, g.kernelW],
    },
    { data: scattered, shape: [g.batch, g.outChannels, g.outHeight, g.outWidth] },
    { stride: [g.strideH, g.strideW], padding: [g.padH, g.padW], groups: g.groups },
  );
  return { dw: dw.data, sums };
}

Deno.test("pooled weight gradient: matches the float64 weight gradient of the scattered gradient, masked or not", async () => {
  const backend = new CpuBackend({ name: "cpu-pooled-filter", threads: 2 });
  await backend.startThreads();
  try {
    for (const c of CASES) {
      const o = await operands(backend, c);
      for (const masked of [true, false]) {
        const what = `${c.name}, ${masked ? "masked" : "unmasked"}`;
        const got = await pooledFilter(backend, o, masked);
        assert.ok(got.done, what);
        const ref = reference(o, masked);
        assertRelativelyClose(got.dw, ref.dw, TOL, `${what}: dw`);
        assertRelativelyClose(got.sums!, ref.sums, TOL, `${what}: plane sums`);
        // Without plane sums: the same weight gradient.
        assertSameBits(
          (await pooledFilter(backend, o, masked, false)).dw,
          got.dw,
          `${what}: dw without sums`,
        );
      }
    }
  } finally {
    backend.dispose();
  }
});

Deno.test("pooled weight gradient: the same bits on 1, 2 and 3 threads", async () => {
  // 32 filters: 32, 16 + 16 and 10 + 11 + 11 per thread.
  const setup = new CpuBackend({ name: "cpu-pooled-filter-setup", threads: 1 });
  const o = await operands(setup, { ...CASES[0], x: [16, 1, 28, 28] });
  setup.dispose();
  let first: { dw: Float32Array; sums?: Float32Array } | undefined;
  for (const threads of [1, 2, 3]) {
    const backend = new CpuBackend({ name: `cpu-pooled-filter-${threads}`, threads });
    assert.equal(await backend.startThreads(), threads);
    try {
      const got = await pooledFilter(backend, o, true);
      assert.ok(got.done);
      first ??= got;
      assertSameBits(got.dw, first.dw, `${threads} threads: dw`);
      assertSameBits(got.sums!, first.sums!, `${threads} threads: plane sums`);
    } finally {
      backend.dispose();
    }
  }
});

Deno.test("pooled weight gradient: declined, with nothing written, where the kernels cannot take the shapes", async () => {
  const wasm = new CpuBackend({ name: "cpu-pooled-filter-declines", threads: 1 });
  const oracle = new CpuBackend({ name: "cpu-pooled-filter-ts", kernels: "ts" });
  try {
    // An 11×11 filter (AlexNet's conv1): 33 accumulators, past the kernels' 12.
    const big: Case = {
      name: "11×11",
      x: [1, 3, 31, 31],
      w: [4, 3, 11, 11],
      options: { stride: 4 },
      pool: { kernel: 3, stride: 2 },
    };
    for (const [backend, c] of [[wasm, big], [oracle, CASES[1]]] as const) {
      const o = await operands(backend, c);
      const { g, pool } = o;
      const dw = backend.upload(
        new Float32Array(g.outChannels * (g.inChannels / g.groups) * g.kernelH * g.kernelW).fill(7),
      );
      const sums = backend.upload(new Float32Array(g.batch * g.outChannels).fill(7));
      const done = backend.conv2dBackwardFilterPooled(
        backend.upload(o.x),
        backend.upload(o.dy),
        backend.upload(o.argmax),
        dw,
        g,
        pool,
        { reluOf: backend.upload(o.pooled), planeSums: sums },
      );
      assert.equal(done, false, c.name);
      assert.ok(
        [...await read(backend, dw), ...await read(backend, sums)].every((v) => v === 7),
        `${c.name}: nothing written`,
      );
    }
  } finally {
    wasm.dispose();
    oracle.dispose();
  }
});

/** Loss `Σ y²` of a ReLU convolution pooled 3×3 stride 2, and the gradients of the tensors that need one. */
async function firstLayerGrads(x: Tensor, w: Tensor, b: Tensor, withX: boolean): Promise<Float32Array[]> {
  const loss = (xx: Tensor, ww: Tensor, bb: Tensor) => {
    const y = ops.conv2d(xx, ww, bb, { padding: 2, activation: "relu", maxPool: { kernel: 3, stride: 2 } });
    return ops.sum(ops.mul(y, y));
  };
  const { value, grads } = withX
    ? valueAndGrad(loss)(x, w, b)
    : valueAndGrad((ww: Tensor, bb: Tensor) => loss(x, ww, bb))(w, b);
  return [await value.data(), ...await Promise.all(grads.map((t) => t.data()))] as Float32Array[];
}

Deno.test("pooled weight gradient: a first layer's backward takes it instead of the scatter; a layer whose input needs a gradient does not", async () => {
  const backend = new CpuBackend({ name: "cpu-pooled-filter-engine", threads: 2 });
  await backend.startThreads();
  const calls: string[] = [];
  const log = (method: string) =>
    ["conv2dBackwardFilterPooled", "conv2dBackwardFilter", "maxPool2dBackward", "maxPool2dBackwardFused"]
        .includes(method)
      ? method
      : undefined;
  registerLogged(backend, "cpu-pooled-filter-on", calls, log);
  registerLogged(backend, "cpu-pooled-filter-off", calls, log, "conv2dBackwardFilterPooled");
  try {
    const shapes = { x: [6, 1, 16, 16], w: [12, 1, 5, 5], b: [12] };
    const data = Object.fromEntries(
      Object.entries(shapes).map(([k, s]) => [k, values(s.reduce((p, q) => p * q))]),
    );
    const run = async (name: string, withX: boolean) => {
      setBackend(name);
      calls.length = 0;
      const [x, w, b] = (["x", "w", "b"] as const).map((k) => tensor(data[k], { shape: shapes[k] }));
      return { grads: await firstLayerGrads(x, w, b, withX), calls: [...calls] };
    };
    const on = await run("cpu-pooled-filter-on", false);
    assert.deepEqual(on.calls, ["conv2dBackwardFilterPooled"]);
    const off = await run("cpu-pooled-filter-off", false);
    assert.deepEqual(off.calls, ["maxPool2dBackwardFused", "conv2dBackwardFilter"]);
    // The loss is the same computation; dw and db sum the same products in another order.
    assertSameBits(on.grads[0], off.grads[0], "loss");
    ["dw", "db"].forEach((what, i) =>
      assertRelativelyClose(on.grads[i + 1], Float64Array.from(off.grads[i + 1]), TOL, what)
    );
    const withX = await run("cpu-pooled-filter-on", true);
    assert.deepEqual(withX.calls, ["maxPool2dBackwardFused", "conv2dBackwardFilter"]);
  } finally {
    setBackend("cpu");
    backend.dispose();
  }
});
