/**
 * The model zoo: exact parameter counts and conv/FC splits of Caffe's reference nets, AlexNet's
 * 55 → 27 → 13 → 6 shapes, the AlexNet-like default's FLOP/parameter ratios, forward passes,
 * deterministic initialisation and filler statistics.
 */

import assert from "node:assert/strict";
import { noGrad, randn, type Tensor, tidy, ValueError } from "../../mod.ts";
import { withoutFillers } from "../../engine/nn/mod.ts";
import { alexnet, alexnetLike, builtinModels, caffenet, cifarQuick, lenet } from "../../engine/models/mod.ts";
import type { Module } from "../../engine/nn/module.ts";
import type { Network } from "../../engine/nn/network.ts";
import { formatSummary, summarize } from "../../engine/nn/summary.ts";

import { slowTest } from "../fixtures/slow.ts";

// AlexNet takes seconds to initialise (61 M values), so the tests share one instance.
let sharedAlexnet: Network | undefined;
const alexnetOnce = () => (sharedAlexnet ??= alexnet({ seed: 0 }));

function layerNames(net: Network): string[] {
  return net.layers().map(([name]) => name);
}

function param(net: Network, name: string) {
  const entry = net.namedParameters().find((p) => p.name === name);
  assert.ok(entry, `parameter ${name} exists`);
  return entry;
}

async function values(t: Tensor): Promise<Float32Array> {
  return (await t.data()) as Float32Array;
}

function stats(v: Float32Array): { mean: number; std: number; min: number; max: number } {
  let sum = 0, sq = 0, min = Infinity, max = -Infinity;
  for (const x of v) {
    sum += x;
    sq += x * x;
    if (x < min) min = x;
    if (x > max) max = x;
  }
  const mean = sum / v.length;
  return { mean, std: Math.sqrt(sq / v.length - mean * mean), min, max };
}

async function forwardShape(net: Network, batch: number): Promise<number[]> {
  net.eval();
  const x = randn([batch, ...net.inputShape], { seed: 9 });
  const out = tidy(() => noGrad(() => net.forward(x)));
  const data = await values(out);
  assert.ok(data.every(Number.isFinite), "finite outputs");
  const shape = [...out.shape];
  out.dispose();
  x.dispose();
  return shape;
}

const ALEXNET_LAYERS = [
  "conv1",
  "relu1",
  "norm1",
  "pool1",
  "conv2",
  "relu2",
  "norm2",
  "pool2",
  "conv3",
  "relu3",
  "conv4",
  "relu4",
  "conv5",
  "relu5",
  "pool5",
  "fc6",
  "relu6",
  "drop6",
  "fc7",
  "relu7",
  "drop7",
  "fc8",
];

Deno.test("models: alexnet has Caffe's 60,965,224 parameters, 2,334,080 conv and 58,631,144 FC", () => {
  const net = alexnetOnce();
  assert.equal(net.parameterCount(), 60_965_224);
  assert.equal(net.parameterCount("conv"), 2_334_080);
  assert.equal(net.parameterCount("fc"), 58_631_144);
  assert.deepEqual(net.parameterGroups(), ["conv", "fc"]);
  assert.deepEqual(layerNames(net), ALEXNET_LAYERS);
  assert.deepEqual(net.inputShape, [3, 227, 227]);
  assert.equal(net.classes, 1000);
  const s = summarize(net, net.inputShape);
  assert.deepEqual(s.groups.conv.parameters, 2_334_080);
  assert.deepEqual(s.groups.fc.parameters, 58_631_144);
});

Deno.test("models: alexnet shapes 55 → 27 → 13 → 6, groups and Caffe multipliers", () => {
  const net = alexnetOnce();
  const rows = new Map(summarize(net, net.inputShape).rows.map((r) => [r.name, r]));
  const out = (name: string) => rows.get(name)!.outputShape;
  assert.deepEqual(out("conv1"), [1, 96, 55, 55]);
  assert.deepEqual(out("pool1"), [1, 96, 27, 27]);
  assert.deepEqual(out("conv2"), [1, 256, 27, 27]);
  assert.deepEqual(out("pool2"), [1, 256, 13, 13]);
  assert.deepEqual(out("conv5"), [1, 256, 13, 13]);
  assert.deepEqual(out("pool5"), [1, 256, 6, 6]);
  assert.deepEqual(out("fc8"), [1, 1000]);
  const perLayer: Record<string, number> = {
    conv1: 34_944,
    conv2: 307_456,
    conv3: 885_120,
    conv4: 663_936,
    conv5: 442_624,
    fc6: 37_752_832,
    fc7: 16_781_312,
    fc8: 4_097_000,
  };
  for (const [name, count] of Object.entries(perLayer)) assert.equal(rows.get(name)!.parameters, count, name);
  assert.deepEqual(param(net, "conv2.weight").tensor.shape, [256, 48, 5, 5]);
  assert.deepEqual(param(net, "conv4.weight").tensor.shape, [384, 192, 3, 3]);
  for (const p of net.namedParameters()) {
    const bias = p.name.endsWith(".bias");
    assert.equal(p.lrMult, bias ? 2 : 1, p.name);
    assert.equal(p.decayMult, bias ? 0 : 1, p.name);
    assert.equal(p.group, p.name.startsWith("fc") ? "fc" : "conv", p.name);
  }
});

Deno.test("models: alexnet fillers follow bvlc_alexnet (gaussian 0.01/0.005, biases 0 or 0.1)", async () => {
  const net = alexnetOnce();
  const conv1 = stats(await values(param(net, "conv1.weight").tensor));
  assert.ok(Math.abs(conv1.std - 0.01) < 0.0003, `conv1 std ${conv1.std}`);
  assert.ok(Math.abs(conv1.mean) < 0.0003, `conv1 mean ${conv1.mean}`);
  const fc7 = stats(await values(param(net, "fc7.weight").tensor));
  assert.ok(Math.abs(fc7.std - 0.005) < 0.00005, `fc7 std ${fc7.std}`);
  const fc8 = stats(await values(param(net, "fc8.weight").tensor));
  assert.ok(Math.abs(fc8.std - 0.01) < 0.0002, `fc8 std ${fc8.std}`);
  const biases: Record<string, number> = {
    conv1: 0,
    conv2: 0.1,
    conv3: 0,
    conv4: 0.1,
    conv5: 0.1,
    fc6: 0.1,
    fc7: 0.1,
    fc8: 0,
  };
  for (const [layer, value] of Object.entries(biases)) {
    const b = await values(param(net, `${layer}.bias`).tensor);
    assert.ok(b.every((x) => x === Math.fround(value)), `${layer}.bias = ${value}`);
  }
  const lrn = net.layers().find(([n]) => n === "norm1")![1] as Module & { params: unknown };
  assert.deepEqual(lrn.params, { size: 5, alpha: 1e-4, beta: 0.75, k: 1 });
});

Deno.test("models: alexnet forward of one 227×227 image gives [1, 1000]", async () => {
  assert.deepEqual(await forwardShape(alexnetOnce(), 1), [1, 1000]);
});

// Slow (a second 61 M-parameter initialisation): runs with the slow tests. caffenet() is alexnet()'s
// layer builder with the pool and norm swapped; the alexnet tests above run in the default set.
Deno.test("models: caffenet pools before normalising, same parameters as alexnet", slowTest, async () => {
  const net = caffenet({ classes: 10 });
  const names = layerNames(net);
  assert.deepEqual(names.slice(0, 8), [
    "conv1",
    "relu1",
    "pool1",
    "norm1",
    "conv2",
    "relu2",
    "pool2",
    "norm2",
  ]);
  assert.deepEqual(names.slice(8), ALEXNET_LAYERS.slice(8));
  assert.equal(net.parameterCount("conv"), 2_334_080);
  assert.equal(net.parameterCount("fc"), 58_631_144 - 4_097_000 + 40_970);
  assert.equal(net.classes, 10);
  const rows = new Map(summarize(net, net.inputShape).rows.map((r) => [r.name, r]));
  assert.deepEqual(rows.get("norm2")!.outputShape, [1, 256, 13, 13]);
  assert.deepEqual(rows.get("pool5")!.outputShape, [1, 256, 6, 6]);
  assert.ok((await values(param(net, "fc6.bias").tensor)).every((x) => x === 1));
  net.dispose();
});

Deno.test("models: cifarQuick has 145,578 parameters (conv 79,328, FC 66,250) and Caffe's layer order", async () => {
  const net = cifarQuick();
  assert.equal(net.parameterCount(), 145_578);
  assert.equal(net.parameterCount("conv"), 79_328);
  assert.equal(net.parameterCount("fc"), 66_250);
  assert.deepEqual(layerNames(net), [
    "conv1",
    "pool1",
    "relu1",
    "conv2",
    "relu2",
    "pool2",
    "conv3",
    "relu3",
    "pool3",
    "ip1",
    "ip2",
  ]);
  assert.deepEqual(net.layers().map(([, m]) => m.kind).filter((k) => k.endsWith("Pool2d")), [
    "MaxPool2d",
    "AvgPool2d",
    "AvgPool2d",
  ]);
  // cifar10_quick's param blocks set only lr_mult, so Caffe's decay_mult default 1 applies to biases.
  for (const p of net.namedParameters()) {
    assert.equal(p.lrMult, p.name.endsWith(".bias") ? 2 : 1, p.name);
    assert.equal(p.decayMult, 1, p.name);
  }
  const conv1 = stats(await values(param(net, "conv1.weight").tensor));
  assert.ok(Math.abs(conv1.std - 1e-4) < 1e-5, `conv1 std ${conv1.std}`);
  const ip1 = stats(await values(param(net, "ip1.weight").tensor));
  assert.ok(Math.abs(ip1.std - 0.1) < 0.002, `ip1 std ${ip1.std}`);
  assert.deepEqual(await forwardShape(net, 3), [3, 10]);
  net.dispose();
});

Deno.test("models: lenet has 431,080 parameters with xavier fillers", async () => {
  const net = lenet();
  assert.equal(net.parameterCount(), 431_080);
  assert.equal(net.parameterCount("conv"), 25_570);
  assert.equal(net.parameterCount("fc"), 405_510);
  const rows = new Map(summarize(net, net.inputShape).rows.map((r) => [r.name, r]));
  assert.deepEqual(rows.get("pool2")!.outputShape, [1, 50, 4, 4]);
  // Caffe's xavier: uniform in ±√(3 / fan_in), fan_in = 1·5·5 for conv1 and 800 for ip1.
  for (const [name, fanIn] of [["conv1.weight", 25], ["ip1.weight", 800]] as const) {
    const s = stats(await values(param(net, name).tensor));
    const bound = Math.sqrt(3 / fanIn);
    assert.ok(s.max <= bound && s.min >= -bound, `${name} within ±${bound}`);
    assert.ok(s.max > 0.9 * bound && s.min < -0.9 * bound, `${name} spans the range`);
    assert.ok(Math.abs(s.std - bound / Math.sqrt(3)) < 0.03 * bound, `${name} std ${s.std}`);
  }
  net.dispose();
});

Deno.test("models: alexnetLike keeps AlexNet's split (FC ≥ 90% of parameters, conv ≥ 75% of FLOPs)", async () => {
  const net = alexnetLike();
  const s = summarize(net, net.inputShape);
  const fcParams = s.groups.fc.parameters / s.parameters;
  const convFlops = s.groups.conv.flops / s.flops;
  assert.ok(fcParams >= 0.9, `FC parameters ${fcParams}\n${formatSummary(s)}`);
  assert.ok(convFlops >= 0.75, `conv FLOPs ${convFlops}\n${formatSummary(s)}`);
  // Small enough to train on a 2-core CPU in minutes.
  assert.ok(s.flops >= 5e6 && s.flops <= 20e6, `forward FLOPs ${s.flops}`);
  assert.equal(s.parameters, 1_088_458);
  assert.deepEqual(net.inputShape, [1, 28, 28]);
  for (const name of ["conv1", "relu1", "pool1", "fc6", "relu6", "drop6", "fc7", "relu7", "drop7", "fc8"]) {
    assert.ok(layerNames(net).includes(name), name);
  }
  assert.deepEqual(await forwardShape(net, 4), [4, 10]);
  net.dispose();
});

Deno.test("models: alexnetLike adapts to other inputs and class counts", async () => {
  const net = alexnetLike({ inputShape: [3, 32, 32], classes: 7, seed: 2 });
  assert.deepEqual(net.inputShape, [3, 32, 32]);
  assert.deepEqual(await forwardShape(net, 2), [2, 7]);
  net.dispose();
  assert.throws(() => alexnetLike({ classes: 0 }), ValueError);
  assert.throws(() => alexnetLike({ inputShape: [1, 28, 0] }), ValueError);
  assert.throws(() => lenet({ classes: 2.5 }), ValueError);
});

Deno.test("models: the same seed gives bit-identical parameters, another seed different ones", async () => {
  for (const make of [cifarQuick, lenet, alexnetLike]) {
    const a = make({ seed: 5 }), b = make({ seed: 5 }), c = make({ seed: 6 });
    const pa = a.namedParameters(), pb = b.namedParameters(), pc = c.namedParameters();
    assert.deepEqual(pa.map((p) => p.name), pb.map((p) => p.name));
    let anyDifferent = false;
    for (let i = 0; i < pa.length; i++) {
      const [va, vb, vc] = await Promise.all([
        values(pa[i].tensor),
        values(pb[i].tensor),
        values(pc[i].tensor),
      ]);
      assert.deepEqual(va, vb, `${a.name} ${pa[i].name}`);
      if (!pa[i].name.endsWith(".bias") && va.some((x, j) => x !== vc[j])) anyDifferent = true;
    }
    assert.ok(anyDifferent, `${a.name}: seed 6 differs from seed 5`);
    for (const net of [a, b, c]) net.dispose();
  }
});

// Catches: `skippingFillers` always false (the replica's weights are drawn: not all zero), and the
// scope not closed by `finally` (the model built after a throwing build is left at zero).
Deno.test("models: withoutFillers leaves parameters at zero, and closes when its build throws", async () => {
  const replica = withoutFillers(() => alexnetLike({ seed: 5 }));
  for (const p of replica.namedParameters()) {
    assert.ok((await values(p.tensor)).every((x) => x === 0), `${p.name} was filled`);
  }
  replica.dispose();
  assert.throws(() =>
    withoutFillers(() => {
      throw new ValueError("test", "a build that fails");
    }), ValueError);
  const after = alexnetLike({ seed: 5 }), reference = alexnetLike({ seed: 5 });
  const [w] = after.namedParameters(), [r] = reference.namedParameters();
  assert.ok((await values(w.tensor)).some((x) => x !== 0), "a model built after the scope is still at zero");
  assert.deepEqual(await values(w.tensor), await values(r.tensor));
  after.dispose();
  reference.dispose();
});

Deno.test("models: builtinModels registry describes each model", () => {
  assert.deepEqual(Object.keys(builtinModels).sort(), [
    "alexnet",
    "alexnet-like",
    "caffenet",
    "cifar-quick",
    "lenet",
  ]);
  for (const [name, entry] of Object.entries(builtinModels)) {
    assert.ok(entry.description.length > 10, name);
    if (name === "alexnet" || name === "caffenet") {
      assert.deepEqual(entry.inputShape, alexnetOnce().inputShape);
      continue;
    }
    const net = entry.create({ seed: 1 });
    assert.equal(net.name, name);
    assert.deepEqual(net.inputShape, entry.inputShape);
    assert.equal(net.classes, entry.classes);
    net.dispose();
  }
});
