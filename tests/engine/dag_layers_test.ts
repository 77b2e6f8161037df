/**
 * The layers Caffe's DAG nets add — Concat, Eltwise (SUM with coefficients, PROD, MAX), BatchNorm,
 * Scale, WITHIN_CHANNEL LRN — and the one new op, `maximum`: forwards against float64 references
 * written here from Caffe's definitions, gradients against central differences, and the Caffe
 * details (BatchNorm's TRAIN and TEST statistics, the m/(m−1) correction, Eltwise MAX's routing).
 *
 * Mutations tried, each failing here (named at the test that catches it): see the comments.
 */

import assert from "node:assert/strict";
import "../../mod.ts";
import { memory, ops, type Tensor, tensor, tidy, valueAndGrad } from "../../engine/mod.ts";
import { BatchNorm } from "../../engine/nn/batch_norm.ts";
import { Concat, Eltwise } from "../../engine/nn/join.ts";
import { WithinChannelLRN } from "../../engine/nn/lrn_within_channel.ts";
import { Scale } from "../../engine/nn/scale.ts";
import { distinct, f64, gradCheck, prod, r64, type RefTensor, rng, values } from "../reference/gradcheck.ts";

const data = (t: Tensor) => Array.from(t.dataSync() as Float32Array);

// -----------------------------------------------------------------------------------------------
// Float64 references, from Caffe's layer definitions

/** Per-channel statistics over every axis but 1: mean and biased variance, and m. */
function channelStats(x: RefTensor): { mean: number[]; variance: number[]; m: number } {
  const [n, c] = x.shape;
  const inner = prod(x.shape.slice(2));
  const m = n * inner;
  const mean = new Array(c).fill(0), variance = new Array(c).fill(0);
  for (let i = 0; i < n; i++) {
    for (let ch = 0; ch < c; ch++) {
      for (let j = 0; j < inner; j++) mean[ch] += x.data[(i * c + ch) * inner + j] / m;
    }
  }
  for (let i = 0; i < n; i++) {
    for (let ch = 0; ch < c; ch++) {
      for (let j = 0; j < inner; j++) variance[ch] += (x.data[(i * c + ch) * inner + j] - mean[ch]) ** 2 / m;
    }
  }
  return { mean, variance, m };
}

/** `(x − μ_c) / sqrt(σ²_c + eps)` with the given per-channel statistics. */
function normalize(x: RefTensor, mean: number[], variance: number[], eps: number): RefTensor {
  const c = x.shape[1], inner = prod(x.shape.slice(2));
  return {
    data: x.data.map((v, i) => {
      const ch = Math.floor(i / inner) % c;
      return (v - mean[ch]) / Math.sqrt(variance[ch] + eps);
    }),
    shape: [...x.shape],
  };
}

/** Caffe WITHIN_CHANNEL LRN: x · (1 + α/n² · Σ_{n×n window, zero padded} x²)^(−β). */
function lrnWithin(x: RefTensor, size: number, alpha: number, beta: number): RefTensor {
  const [N, C, H, W] = x.shape;
  const half = (size - 1) / 2;
  const at = (n: number, c: number, h: number, w: number) => ((n * C + c) * H + h) * W + w;
  const y = new Float64Array(x.data.length);
  for (let n = 0; n < N; n++) {
    for (let c = 0; c < C; c++) {
      for (let h = 0; h < H; h++) {
        for (let w = 0; w < W; w++) {
          let sum = 0;
          for (let dh = -half; dh <= half; dh++) {
            for (let dw = -half; dw <= half; dw++) {
              const hh = h + dh, ww = w + dw;
              if (hh >= 0 && hh < H && ww >= 0 && ww < W) sum += x.data[at(n, c, hh, ww)] ** 2;
            }
          }
          y[at(n, c, h, w)] = x.data[at(n, c, h, w)] * (1 + (alpha / (size * size)) * sum) ** -beta;
        }
      }
    }
  }
  return { data: y, shape: [...x.shape] };
}

// -----------------------------------------------------------------------------------------------
// maximum and Eltwise

Deno.test("maximum: forward, gradients, and Caffe's routing of a tie to the first operand", () => {
  // Mutation tried: routing by `greater(a, b)` (the tie to b) fails the tie assertions below.
  const n = 12;
  gradCheck({
    name: "maximum",
    inputs: [{ values: distinct(n, rng(1)), shape: [3, 4] }, {
      values: distinct(n, rng(2), 0.0113),
      shape: [3, 4],
    }],
    op: (a, b) => ops.maximum(a, b),
    reference: (a, b) => f64.zip(a, b, Math.max),
  });
  gradCheck({
    name: "maximum (broadcast)",
    inputs: [{ values: distinct(n, rng(3)), shape: [3, 4] }, {
      values: distinct(4, rng(4), 0.0137),
      shape: [4],
    }],
    op: (a, b) => ops.maximum(a, b),
    reference: (a, b) => f64.zip(a, b, Math.max),
  });
  tidy(() => {
    const a = tensor([1, 2, 5, -1], { requiresGrad: true }),
      b = tensor([1, 3, 5, -2], { requiresGrad: true });
    const { value, grads } = valueAndGrad((x: Tensor, y: Tensor) => ops.sum(ops.maximum(x, y)))(a, b);
    assert.equal(value.dataSync()[0], 1 + 3 + 5 - 1);
    assert.deepEqual(data(grads[0]), [1, 0, 1, 1]);
    assert.deepEqual(data(grads[1]), [0, 1, 0, 0]);
  });
});

Deno.test("Eltwise: SUM with coefficients, PROD and MAX against float64, MAX ties to the first bottom", () => {
  // Mutations tried: SUM ignoring the coefficients; MAX folded from the last bottom (a three-way tie
  // then routes to the third); each fails here.
  const shape = [2, 3, 2];
  const three = [1, 2, 3].map((seed) => ({ values: values(12, rng(seed), { avoid: 0.05 }), shape }));
  gradCheck({
    name: "Eltwise SUM 0.5, -2, 1",
    inputs: three,
    op: (a, b, c) => new Eltwise("SUM", [0.5, -2, 1]).forwardAll([a, b, c]),
    reference: (a, b, c) => f64.zip(f64.zip(a, b, (u, v) => 0.5 * u - 2 * v), c, (u, v) => u + v),
  });
  gradCheck({
    name: "Eltwise PROD",
    inputs: three,
    op: (a, b, c) => new Eltwise("PROD").forwardAll([a, b, c]),
    reference: (a, b, c) => f64.zip(f64.zip(a, b, (u, v) => u * v), c, (u, v) => u * v),
  });
  gradCheck({
    name: "Eltwise MAX",
    inputs: [1, 2, 3].map((seed) => ({ values: distinct(12, rng(seed), 0.01 + seed / 1000), shape })),
    op: (a, b, c) => new Eltwise("MAX").forwardAll([a, b, c]),
    reference: (a, b, c) => f64.zip(f64.zip(a, b, Math.max), c, Math.max),
  });
  tidy(() => {
    // One three-way tie, one two-way tie of the last two, and a clear winner.
    const xs = [[4, 1, 0], [4, 2, 7], [4, 2, 1]].map((v) => tensor(v, { requiresGrad: true }));
    const f = valueAndGrad((a: Tensor, b: Tensor, c: Tensor) =>
      ops.sum(ops.mul(new Eltwise("MAX").forwardAll([a, b, c]), tensor([1, 10, 100])))
    );
    const { value, grads } = f(xs[0], xs[1], xs[2]);
    assert.equal(value.dataSync()[0], 4 + 20 + 700);
    assert.deepEqual(grads.map(data), [[1, 0, 0], [0, 10, 100], [0, 0, 0]]);
    // A plain SUM of two is the add op, bit for bit.
    const [a, b] = [values(6, rng(9)), values(6, rng(10))].map((v) => tensor(v));
    assert.deepEqual(data(new Eltwise("SUM").forwardAll([a, b])), data(ops.add(a, b)));
  });
  assert.throws(() => new Eltwise("MAX", [1, 2]), /coefficients apply to SUM only/);
  assert.throws(
    () => tidy(() => new Eltwise("SUM", [1]).forwardAll([tensor([1]), tensor([2])])),
    /1 coefficients for 2 inputs/,
  );
  assert.throws(() => new Eltwise().describeAll([[1, 2], [1, 3]]), /differ \(SUM needs equal shapes\)/);
});

Deno.test("Concat: channels joined, gradients split back; shapes that disagree are named", () => {
  gradCheck({
    name: "Concat axis 1",
    inputs: [
      { values: values(2 * 1 * 2 * 2, rng(1)), shape: [2, 1, 2, 2] },
      { values: values(2 * 3 * 2 * 2, rng(2)), shape: [2, 3, 2, 2] },
    ],
    op: (a, b) => new Concat(1).forwardAll([a, b]),
    reference: (a, b) => f64.concat([a, b], 1),
  });
  assert.deepEqual(new Concat().describeAll([[1, 64, 28, 28], [1, 32, 28, 28]]).outputShape, [1, 96, 28, 28]);
  assert.throws(
    () => new Concat().describeAll([[1, 64, 28, 28], [1, 32, 14, 14]]),
    /input shapes \[1, 64, 28, 28\], \[1, 32, 14, 14\] differ outside axis 1/,
  );
});

// -----------------------------------------------------------------------------------------------
// BatchNorm

Deno.test("BatchNorm: batch statistics (TRAIN) against float64, gradient through mean and variance", () => {
  // Mutation tried: normalising with the unbiased variance (÷ m−1) fails the forward here (and the
  // running statistics below).
  const shape = [3, 2, 2, 2];
  const bn = new BatchNorm(2);
  gradCheck({
    name: "BatchNorm train",
    inputs: [{ values: values(prod(shape), rng(5)), shape }],
    op: (x) => bn.forward(x),
    reference: (x) => {
      const { mean, variance } = channelStats(x);
      return normalize(x, mean, variance, 1e-5);
    },
    tol: 2e-4,
  });
  // Rank 2 (after an InnerProduct): statistics over the batch only.
  const flat = new BatchNorm(3);
  gradCheck({
    name: "BatchNorm train [N, C]",
    inputs: [{ values: values(12, rng(6)), shape: [4, 3] }],
    op: (x) => flat.forward(x),
    reference: (x) => {
      const { mean, variance } = channelStats(x);
      return normalize(x, mean, variance, 1e-5);
    },
    tol: 2e-4,
  });
  bn.dispose();
  flat.dispose();
});

Deno.test("BatchNorm: Caffe's running statistics (s·f + 1, μ + f·mean, m/(m−1)·σ² + f·var) and TEST use", () => {
  // Mutations tried, each failing here: the variance accumulated without the m/(m−1) correction;
  // global statistics not divided by the scale factor; a scale factor of 0 dividing (NaN) instead of
  // giving 0; use_global_stats following the mode when given explicitly.
  const shape = [2, 3, 2, 1]; // m = 4 per channel
  const first = values(prod(shape), rng(11)), second = values(prod(shape), rng(12));
  const bn = new BatchNorm(3, { movingAverageFraction: 0.9, eps: 1e-3 });
  const before = memory().tensors;
  tidy(() => {
    // Evaluation before any training: s = 0 gives mean 0 and variance 0, so y = x / sqrt(eps).
    bn.eval();
    const y0 = data(bn.forward(tensor(first, { shape })));
    first.forEach((v, i) => assert.ok(Math.abs(y0[i] - v / Math.sqrt(1e-3)) < 1e-4, `y0[${i}]`));
    bn.train();
    bn.forward(tensor(first, { shape }));
    bn.forward(tensor(second, { shape }));
  });
  assert.equal(memory().tensors, before, "BatchNorm leaked tensors");
  const a = channelStats(r64(first, shape)), b = channelStats(r64(second, shape));
  const corr = 4 / 3, f = 0.9;
  const s = 1 * f + 1;
  const mean = a.mean.map((m, c) => b.mean[c] + f * m);
  const variance = a.variance.map((v, c) => corr * b.variance[c] + f * corr * v);
  const close = (got: number[], want: number[], what: string) =>
    want.forEach((w, i) =>
      assert.ok(Math.abs(got[i] - w) < 1e-5 * Math.max(1, Math.abs(w)), `${what}[${i}]: ${got[i]} vs ${w}`)
    );
  close(data(bn.scaleFactor), [s], "scale_factor");
  close(data(bn.mean), mean, "mean");
  close(data(bn.variance), variance, "variance");
  assert.deepEqual(bn.namedBuffers().map((e) => e.name), ["mean", "variance", "scale_factor"]);
  assert.equal(bn.namedParameters().length, 0);

  // TEST: normalised with mean/s and variance/s, and the gradient is dy / sqrt(σ² + eps).
  bn.eval();
  const third = values(prod(shape), rng(13));
  gradCheck({
    name: "BatchNorm global stats",
    inputs: [{ values: third, shape }],
    op: (x) => bn.forward(x),
    reference: (x) => normalize(x, mean.map((m) => m / s), variance.map((v) => v / s), 1e-3),
  });
  // Global statistics leave the buffers alone.
  close(data(bn.scaleFactor), [s], "scale_factor after eval");
  // An explicit use_global_stats: false normalises with the batch's statistics even in eval mode
  // (and, as in Caffe, accumulates them).
  const explicit = new BatchNorm(3, { useGlobalStats: false });
  explicit.eval();
  tidy(() => {
    const y = data(explicit.forward(tensor(third, { shape })));
    const c = channelStats(r64(third, shape));
    close(y, Array.from(normalize(r64(third, shape), c.mean, c.variance, 1e-5).data), "batch stats in eval");
  });
  close(data(explicit.scaleFactor), [1], "explicit scale_factor");
  // use_global_stats: true in training: the stored statistics, nothing accumulated.
  const frozen = new BatchNorm(3, { useGlobalStats: true });
  tidy(() => frozen.forward(tensor(third, { shape })));
  close(data(frozen.scaleFactor), [0], "frozen scale_factor");
  for (const m of [bn, explicit, frozen]) m.dispose();
  assert.throws(
    () => tidy(() => new BatchNorm(4).forward(tensor(third, { shape }))),
    /does not have 4 channels/,
  );
});

// -----------------------------------------------------------------------------------------------
// Scale and WITHIN_CHANNEL LRN

Deno.test("Scale: per-channel scale and shift against float64, gradients of input, scale and bias", () => {
  // Mutation tried: the scale broadcast over the last axis instead of axis 1 fails the forward.
  const shape = [2, 3, 2, 2];
  const x = values(prod(shape), rng(21)), gamma = values(3, rng(22)), beta = values(3, rng(23));
  const scale = new Scale(3, { bias: true });
  scale.weight.assign(tensor(gamma));
  scale.bias!.assign(tensor(beta));
  const reference = (xr: RefTensor, g: RefTensor, b: RefTensor): RefTensor => {
    const inner = prod(shape.slice(2));
    return {
      data: xr.data.map((v, i) => {
        const c = Math.floor(i / inner) % 3;
        return v * g.data[c] + b.data[c];
      }),
      shape: [...shape],
    };
  };
  // The parameters' gradients come from the module's own tensors; the input's from gradCheck.
  gradCheck({
    name: "Scale (input)",
    inputs: [{ values: x, shape }],
    op: (t) => scale.forward(t),
    reference: (t) => reference(t, r64(gamma, [3]), r64(beta, [3])),
  });
  const R = values(prod(shape), rng(24));
  const grads = tidy(() => {
    const { grads } = valueAndGrad((g: Tensor, b: Tensor) => {
      void g, b; // the module's own parameters, passed so valueAndGrad differentiates them
      return ops.sum(ops.mul(scale.forward(tensor(x, { shape })), tensor(R, { shape })));
    })(scale.weight, scale.bias!);
    return grads.map(data);
  });
  const inner = prod(shape.slice(2));
  const dGamma = [0, 0, 0], dBeta = [0, 0, 0];
  x.forEach((v, i) => {
    const c = Math.floor(i / inner) % 3;
    dGamma[c] += v * R[i];
    dBeta[c] += R[i];
  });
  dGamma.forEach((g, c) => assert.ok(Math.abs(grads[0][c] - g) < 1e-5, `dγ[${c}]`));
  dBeta.forEach((g, c) => assert.ok(Math.abs(grads[1][c] - g) < 1e-5, `dβ[${c}]`));
  assert.deepEqual(scale.namedParameters().map((p) => [p.name, p.lrMult, p.decayMult]), [
    ["weight", 1, 1],
    ["bias", 1, 1],
  ]);
  scale.dispose();
  // Default filler: γ = 1.
  const plain = new Scale(2).initialize(0);
  assert.deepEqual(data(plain.weight), [1, 1]);
  plain.dispose();
});

Deno.test("WITHIN_CHANNEL LRN: x·(1 + α/n²·Σ x²)^(−β) over the zero-padded window, and its gradient", () => {
  // Mutations tried, each failing here: α/n instead of α/n² (the across-channel scaling); a shift of
  // 2 in place of Caffe's 1; the pooling without padding (a smaller output).
  for (const [size, alpha, beta] of [[3, 0.5, 0.75], [5, 2, 0.6]]) {
    const shape = [2, 2, 5, 4];
    gradCheck({
      name: `WithinChannelLRN ${size}`,
      inputs: [{ values: values(prod(shape), rng(size)), shape }],
      op: (x) => new WithinChannelLRN({ size, alpha, beta }).forward(x),
      reference: (x) => lrnWithin(x, size, alpha, beta),
    });
  }
  assert.throws(() => new WithinChannelLRN({ size: 4 }), /size must be a positive odd integer/);
});
