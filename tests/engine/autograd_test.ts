import assert from "node:assert/strict";
import {
  DisposedError,
  memory,
  noGrad,
  ops,
  randn,
  ShapeError,
  type Tensor,
  tensor,
  tidy,
  valueAndGrad,
  zeros,
} from "../../mod.ts";
import { backwardPass } from "../../engine/mod.ts";

/** A small AlexNet-shaped network: conv part then FC part, as the schedule runtime sees it. */
function makeNetwork(seed: number) {
  const conv1 = randn([6, 3, 3, 3], { seed, stream: 1, std: 0.3, requiresGrad: true });
  const bias1 = randn([6], { seed, stream: 2, std: 0.1, requiresGrad: true });
  const conv2 = randn([8, 3, 3, 3], { seed, stream: 3, std: 0.3, requiresGrad: true });
  const fc1 = randn([16, 8 * 3 * 3], { seed, stream: 4, std: 0.2, requiresGrad: true });
  const fcBias1 = zeros([16], { requiresGrad: true });
  const fc2 = randn([5, 16], { seed, stream: 5, std: 0.3, requiresGrad: true });
  const conv = [conv1, bias1, conv2];
  const fc = [fc1, fcBias1, fc2];
  const forward = (x: Tensor, labels: Tensor, step: number) => {
    let h = ops.relu(ops.conv2d(x, conv1, bias1, { padding: 1 }));
    h = ops.lrn(h, { size: 3, alpha: 0.1, beta: 0.75, k: 1 });
    h = ops.maxPool2d(h, { kernel: 3, stride: 2 });
    h = ops.relu(ops.conv2d(h, conv2, null, { padding: 1, groups: 2 }));
    h = ops.maxPool2d(h, { kernel: 3, stride: 2 });
    h = ops.flatten(h, 1);
    h = ops.dropout(ops.relu(ops.linear(h, fc1, fcBias1)), { p: 0.5, seed: 9, stream: step });
    return ops.softmaxCrossEntropy(ops.linear(h, fc2), labels);
  };
  return { conv, fc, all: [...conv, ...fc], forward };
}

function batch(step: number) {
  const x = randn([4, 3, 13, 13], { seed: 100 + step });
  const labels = tensor([step % 5, (step + 1) % 5, (step + 2) % 5, (step + 3) % 5], { dtype: "int32" });
  return { x, labels };
}

function gradBytes(params: Tensor[]): Float32Array[] {
  return params.map((p) => p.grad!.dataSync() as Float32Array);
}

Deno.test("segmented backward (fc, then conv) gives bit-identical gradients to one full backward", () => {
  const whole = makeNetwork(7);
  const split = makeNetwork(7);
  const { x, labels } = batch(0);
  tidy(() => whole.forward(x, labels, 0).backward());

  tidy(() => {
    const loss = split.forward(x, labels, 0);
    const ready: Tensor[] = [];
    const pass = backwardPass(loss, { onGradientReady: (leaf) => ready.push(leaf) });
    pass.runUntil(split.fc);
    // Every FC gradient is final and no conv gradient has been computed yet.
    assert.ok(split.fc.every((p) => p.grad !== null));
    assert.ok(split.conv.every((p) => p.grad === null));
    assert.equal(pass.done, false);
    assert.deepEqual(new Set(ready), new Set(split.fc));
    pass.runToEnd();
    assert.equal(pass.done, true);
  });
  const a = gradBytes(whole.all), b = gradBytes(split.all);
  for (let i = 0; i < a.length; i++) {
    assert.deepEqual(new Uint32Array(b[i].buffer), new Uint32Array(a[i].buffer), `parameter ${i} differs`);
  }
  // The gradients are real: non-zero and of the parameters' shapes.
  for (const p of whole.all) {
    assert.deepEqual(p.grad!.shape, p.shape);
    assert.ok((p.grad!.dataSync() as Float32Array).some((v) => v !== 0));
  }
});

Deno.test("backward accumulates into .grad like PyTorch, and a freed graph cannot be reused", () => {
  const w = tensor([1, 2, 3], { requiresGrad: true });
  const loss = ops.sum(ops.mul(w, w));
  loss.backward({ retainGraph: true });
  loss.backward();
  assert.deepEqual([...w.grad!.dataSync()], [4, 8, 12]);
  assert.throws(() => loss.backward(), DisposedError);
});

Deno.test("backward needs a scalar root or an explicit gradOutput", () => {
  const w = tensor([1, 2], { requiresGrad: true });
  const y = ops.mul(w, 3);
  assert.throws(
    () => y.backward(),
    (e: unknown) => e instanceof ShapeError && /single element/.test(e.message),
  );
  y.backward({ gradOutput: tensor([1, 10]) });
  assert.deepEqual([...w.grad!.dataSync()], [3, 30]);
});

Deno.test("a tensor used twice receives the sum of both gradients", () => {
  const x = tensor([2, -1], { requiresGrad: true });
  // f = Σ (x·x + x) → df/dx = 2x + 1
  ops.sum(ops.add(ops.mul(x, x), x)).backward();
  assert.deepEqual([...x.grad!.dataSync()], [5, -1]);
});

Deno.test("valueAndGrad returns value and gradients without touching .grad", () => {
  const f = valueAndGrad((a: Tensor, b: Tensor) => ops.sum(ops.mul(a, b)));
  const a = tensor([1, 2, 3]), b = tensor([4, 5, 6]);
  const { value, grads } = f(a, b);
  assert.equal(value.dataSync()[0], 32);
  assert.deepEqual([...grads[0].dataSync()], [4, 5, 6]);
  assert.deepEqual([...grads[1].dataSync()], [1, 2, 3]);
  assert.equal(a.grad, null);
  assert.equal(a.requiresGrad, false);
});

Deno.test("noGrad records nothing", () => {
  const w = tensor([1, 2], { requiresGrad: true });
  const y = noGrad(() => ops.mul(w, w));
  assert.equal(y.requiresGrad, false);
  assert.equal(y.node, null);
});

Deno.test("tidy frees intermediates and keeps what it returns; disposed tensors refuse use", () => {
  const before = memory();
  const kept = tidy(() => {
    const a = ops.mul(tensor([1, 2, 3]), 2);
    const b = ops.add(a, 1);
    return { b, list: [ops.exp(b)] };
  });
  assert.equal(memory().tensors, before.tensors + 2);
  assert.deepEqual([...kept.b.dataSync()], [3, 5, 7]);
  kept.b.dispose();
  kept.list[0].dispose();
  assert.deepEqual(memory(), before);
  assert.throws(() => kept.b.dataSync(), DisposedError);
});

Deno.test("a loss returned from tidy can still be differentiated (saved tensors outlive the scope)", () => {
  const before = memory();
  const w = tensor([0.5, -1.5], { requiresGrad: true });
  const loss = tidy(() => ops.sum(ops.exp(ops.mul(w, w))));
  loss.backward();
  const expected = [0.5, -1.5].map((v) => 2 * v * Math.exp(v * v));
  const got = w.grad!.dataSync();
  expected.forEach((e, i) => assert.ok(Math.abs(got[i] - e) < 1e-5 * Math.abs(e)));
  loss.dispose();
  w.dispose();
  assert.deepEqual(memory(), before);
});

Deno.test("200 training steps of a small CNN keep live tensors and bytes flat", () => {
  const net = makeNetwork(3);
  const lr = 0.05;
  const samples: number[][] = [];
  for (let step = 0; step < 200; step++) {
    const { x, labels } = batch(step % 4);
    tidy(() => {
      const loss = net.forward(x, labels, step);
      loss.backward();
      noGrad(() => {
        for (const p of net.all) {
          p.assign(ops.sub(p, ops.mul(p.grad!, lr)));
          p.grad!.dispose();
          p.grad = null;
        }
      });
    });
    x.dispose();
    labels.dispose();
    if (step === 9 || step === 199) {
      const m = memory();
      samples.push([m.tensors, m.bytes]);
    }
  }
  assert.deepEqual(samples[1], samples[0], `live [tensors, bytes] grew from ${samples[0]} to ${samples[1]}`);
});
