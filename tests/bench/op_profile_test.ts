/**
 * The per-op profiler of `bench/kernels/op_profile.ts`: calls reach the wrapped backend through the
 * profiler, land in the right categories, and GEMM and convolution flops are counted exactly. No
 * assertion depends on how long anything took.
 *
 * Mutations tried, each of which fails this file: `this.backend = inner` in the `OpProfiler`
 * constructor (the wrapper bypassed: no calls recorded), `withBackend` without `setBackend` (tensors
 * made on the unwrapped backend), `conv2dFlops` without the division by `groups`, `matmulFlops`
 * without the batch factor, and the pooled weight gradient left uncounted (as it first was).
 */

import assert from "node:assert/strict";
import { CpuBackend, getBackend, ops, randn, SGD, tensor, tidy } from "../../mod.ts";
import type { MatmulSpec } from "../../backends/mod.ts";
import { uniformValues } from "../../engine/mod.ts";
import {
  categoryOf,
  conv2dFlops,
  matmulFlops,
  type OpProfile,
  OpProfiler,
  stepBreakdown,
  withBackend,
} from "../../bench/kernels/op_profile.ts";

/** A one-thread CPU backend (WebAssembly kernels where supported) wrapped in a fresh profiler. */
function profiled(name: string): { inner: CpuBackend; profiler: OpProfiler } {
  const inner = new CpuBackend({ name: `${name}-inner`, threads: 1 });
  return { inner, profiler: new OpProfiler(inner, { name }) };
}

Deno.test("op profile: a conv2d forward and backward is 3 convolution calls with exact flops", async () => {
  const { inner, profiler } = profiled("cpu-profiled-conv");
  try {
    // Grouped and strided, so the formula's inC/groups and output size both matter.
    const shape = { batch: 2, inChannels: 4, inHeight: 9, inWidth: 7, outChannels: 6, kernel: 3 };
    await withBackend(profiler.backend, () => {
      assert.equal(getBackend(), profiler.backend, "withBackend makes the wrapped backend current");
      const x = randn([shape.batch, shape.inChannels, shape.inHeight, shape.inWidth], {
        seed: 1,
        requiresGrad: true,
      });
      const w = randn([shape.outChannels, shape.inChannels / 2, shape.kernel, shape.kernel], {
        seed: 2,
        requiresGrad: true,
      });
      assert.equal(x.backend, profiler.backend, "tensors made inside withBackend use the wrapper");
      profiler.reset();
      tidy(() => {
        const y = ops.conv2d(x, w, null, { stride: [2, 1], padding: 1, groups: 2 });
        assert.deepEqual(y.shape, [2, 6, 5, 7]);
        ops.sum(y).backward();
      });
      assert.ok(x.grad && w.grad, "both gradients were computed");
      for (const t of [x, w, x.grad, w.grad]) t.dispose();
    });
    assert.equal(getBackend().name, "cpu", "the previous backend is current again");

    const profile = profiler.snapshot();
    const perPass = conv2dFlops({
      batch: 2,
      inChannels: 4,
      inHeight: 9,
      inWidth: 7,
      outChannels: 6,
      kernelH: 3,
      kernelW: 3,
      strideH: 2,
      strideW: 1,
      padH: 1,
      padW: 1,
      groups: 2,
      outHeight: 5,
      outWidth: 7,
    });
    assert.equal(perPass, 2 * 2 * 6 * 5 * 7 * (4 / 2) * 3 * 3); // 15120
    assert.equal(profile.categories.convolution.calls, 3);
    assert.equal(profile.categories.convolution.flops, 3 * perPass);
    for (const method of ["conv2dForward", "conv2dBackwardInput", "conv2dBackwardFilter"]) {
      assert.equal(profile.methods[method]?.calls, 1, method);
      assert.equal(profile.methods[method].flops, perPass, method);
    }
    assert.equal(profile.categories.gemm.calls, 0, "the engine's conv2d calls no matmul");
    assert.equal(profile.total.flops, 3 * perPass, "only GEMM and convolution count flops");
    assert.ok(profile.categories.elementwise.calls > 0, "the sum and its gradient are elementwise");
    assert.ok(profile.categories.allocation.calls > 0, "outputs were allocated");
  } finally {
    inner.dispose();
  }
});

Deno.test("op profile: a first layer's pooled convolution counts its forward and its weight gradient from the pooled gradient", async () => {
  const { inner, profiler } = profiled("cpu-profiled-pooled");
  try {
    // x needs no gradient: the weight gradient comes straight from the pooled gradient, one call.
    await withBackend(profiler.backend, () => {
      const x = randn([2, 1, 12, 12], { seed: 3 });
      const w = randn([8, 1, 5, 5], { seed: 4, requiresGrad: true });
      profiler.reset();
      tidy(() => {
        const y = ops.conv2d(x, w, null, {
          padding: 2,
          activation: "relu",
          maxPool: { kernel: 3, stride: 2 },
        });
        ops.sum(y).backward();
      });
      assert.ok(w.grad, "the weight gradient was computed");
      for (const t of [x, w, w.grad]) t.dispose();
    });
    const profile = profiler.snapshot();
    const perPass = 2 * 2 * 8 * 12 * 12 * 1 * 5 * 5;
    for (const method of ["conv2dForwardMaxPool", "conv2dBackwardFilterPooled"]) {
      assert.equal(profile.methods[method]?.calls, 1, method);
      assert.equal(profile.methods[method].flops, perPass, method);
    }
    assert.equal(profile.categories.convolution.flops, 2 * perPass);
  } finally {
    inner.dispose();
  }
});

Deno.test("op profile: matmul flops are 2·batch·m·n·k, and each op lands in its category", async () => {
  const { inner, profiler } = profiled("cpu-profiled-ops");
  try {
    await withBackend(profiler.backend, () => {
      const a = randn([3, 5, 7], { seed: 1 }), b = randn([3, 7, 4], { seed: 2 });
      profiler.reset();
      tidy(() => ops.matmul(a, b));
      const afterMatmul = profiler.snapshot();
      assert.equal(afterMatmul.categories.gemm.calls, 1);
      assert.equal(afterMatmul.categories.gemm.flops, 2 * 3 * 5 * 4 * 7);
      for (const t of [a, b]) t.dispose();

      // A small net's step: conv, ReLU, max pooling, LRN, a linear layer, loss, fused SGD, read back.
      const x = randn([2, 3, 8, 8], { seed: 3 });
      const labels = tensor(Int32Array.from(uniformValues(2, { seed: 4 }), (u) => Math.floor(u * 5)), {
        dtype: "int32",
      });
      const cw = randn([4, 3, 3, 3], { seed: 5, std: 0.1, requiresGrad: true });
      const fw = randn([5, 4 * 4 * 4], { seed: 6, std: 0.1, requiresGrad: true });
      const sgd = new SGD([
        { name: "cw", tensor: cw, group: "conv", lrMult: 1, decayMult: 1 },
        { name: "fw", tensor: fw, group: "fc", lrMult: 1, decayMult: 1 },
      ], { lr: 0.01, momentum: 0.9 });
      profiler.reset();
      tidy(() => {
        const h = ops.maxPool2d(ops.relu(ops.conv2d(x, cw, null, { padding: 1 })), { kernel: 2 });
        const n = ops.lrn(h, { size: 3, alpha: 1e-4, beta: 0.75, k: 1 });
        const logits = ops.linear(ops.reshape(n, [2, 64]), fw);
        const loss = ops.mean(ops.softmaxCrossEntropy(logits, labels));
        loss.backward();
        loss.dataSync();
      });
      sgd.step();
      const p = profiler.snapshot();
      assert.equal(p.categories.convolution.calls, 2, "no input gradient: x needs none");
      assert.equal(p.categories.gemm.calls, 3, "linear: forward, input and weight gradients");
      assert.equal(p.categories.gemm.flops, 3 * matmulFlops(spec(2, 5, 64)));
      assert.equal(p.methods.maxPool2dForward?.calls, 1);
      assert.equal(p.methods.maxPool2dBackward?.calls, 1);
      assert.equal(p.categories.lrn.calls, 2);
      assert.equal(p.methods.softmaxCrossEntropy?.calls, 1);
      assert.equal(p.methods.softmaxCrossEntropyBackward?.calls, 1);
      assert.equal(p.categories.optimizer.calls, 2, "one fused SGD update per parameter");
      assert.ok((p.methods.readSync?.calls ?? 0) >= 1, "dataSync reads through the wrapper");
      assert.ok(p.categories.elementwise.calls > 0);
      assert.equal(p.categories.messages.calls, 0, "one CPU device sends no messages");
      assert.equal(p.categories.other.calls, 0);
      const sum = Object.values(p.categories).reduce((s, c) => s + c.calls, 0);
      assert.equal(sum, p.total.calls, "every call is in exactly one category");
      sgd.dispose();
      for (const t of [x, labels, cw, fw]) t.dispose();
    });
  } finally {
    inner.dispose();
  }
});

/** A plain, unbatched product spec of m×n×k. */
function spec(m: number, n: number, k: number): MatmulSpec {
  return { batch: 1, m, n, k, transA: false, transB: false, aBatchStride: 0, bBatchStride: 0 };
}

Deno.test("op profile: the wrapper passes everything else through to the inner backend", () => {
  const { inner, profiler } = profiled("cpu-profiled-pass");
  try {
    const backend = profiler.backend;
    assert.notEqual(backend, inner);
    assert.equal(backend.name, "cpu-profiled-pass");
    assert.equal(typeof backend.sgdUpdate, "function", "optional methods the inner backend has stay");
    assert.equal(backend.stageToHost, undefined, "optional methods it lacks stay absent");
    assert.ok(backend instanceof CpuBackend);
    assert.equal((backend as CpuBackend).threads, 1);
    const s = backend.upload(new Float32Array([1, 2, 3]));
    assert.deepEqual([...backend.readSync!(s)], [1, 2, 3]);
    backend.release(s);
    let p = profiler.snapshot();
    assert.equal(p.categories.copies.calls, 2, "upload and readSync; upload's own allocation not counted");
    assert.equal(p.categories.allocation.calls, 1);
    profiler.reset();
    p = profiler.snapshot();
    assert.equal(p.total.calls, 0);
    assert.deepEqual(p.methods, {});
    assert.equal(categoryOf("conv2dBackwardFilter"), "convolution");
    assert.equal(categoryOf("toString"), "other");
  } finally {
    inner.dispose();
  }
});

Deno.test("op profile: the step breakdown adds up to the step", () => {
  const totals = (ms: number, calls: number, flops = 0) => ({ ms, calls, flops });
  const zero = totals(0, 0);
  const profile: OpProfile = {
    categories: {
      gemm: totals(20, 6, 4e9),
      convolution: totals(40, 9, 6e9),
      pooling: totals(4, 4),
      lrn: zero,
      elementwise: totals(6, 40),
      softmax: zero,
      optimizer: totals(2, 8),
      copies: zero,
      allocation: totals(1, 60),
      messages: zero,
      other: zero,
    },
    methods: {},
    total: totals(73, 127, 10e9),
  };
  const rows = stepBreakdown(profile, 2, 200);
  assert.deepEqual(rows.map((r) => r.category), [
    "convolution",
    "gemm",
    "elementwise",
    "pooling",
    "optimizer",
    "allocation",
    "outside",
  ]);
  const outside = rows.at(-1)!;
  assert.equal(outside.msPerStep, 100 - 36.5);
  assert.ok(Math.abs(rows.reduce((s, r) => s + r.share, 0) - 1) < 1e-12);
  assert.equal(rows[0].msPerStep, 20);
  assert.equal(rows[0].callsPerStep, 4.5);
  assert.equal(rows[0].gflops, 6e9 / 40e6); // 150 GFLOP/s
  assert.equal(rows[2].gflops, undefined);
});
