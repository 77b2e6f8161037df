/**
 * Caffe nets whose graph branches and joins: Caffe's own cifar10_full (a chain once WITHIN_CHANNEL
 * LRN is supported) and bvlc_googlenet (Concat, three weighted losses), and a small ResNet with
 * BatchNorm, Scale and Eltwise. Parameter counts are checked against counts computed here from the
 * architectures, not from the import; the wiring (in-place layers, a blob read twice, the weighted
 * losses) against hand computations; bad nets against their one-line refusals.
 */

import assert from "node:assert/strict";
import "../../mod.ts";
import { CaffeImportError, importCaffeNet, loadCaffeNet } from "../../engine/caffe/mod.ts";
import { noGrad, ops, SGD, type Tensor, tensor, tidy, trainingLoss, trainStep } from "../../engine/mod.ts";
import { Graph } from "../../engine/nn/graph.ts";
import { Eltwise } from "../../engine/nn/join.ts";
import { Linear, ReLU } from "../../engine/nn/layers.ts";
import { WithinChannelLRN } from "../../engine/nn/lrn_within_channel.ts";
import type { Network } from "../../engine/nn/network.ts";
import { TandemError } from "../../engine/errors.ts";
import { slowTest } from "../fixtures/slow.ts";
import { rng, values } from "../reference/gradcheck.ts";

const fixtures = new URL("../../examples/caffe/", import.meta.url);
const CIFAR_FULL = new URL("cifar10_full_train_test.prototxt", fixtures);
const GOOGLENET = new URL("bvlc_googlenet_train_val.prototxt", fixtures);
const RESNET = new URL("../../examples/caffe/resnet_tiny_train_test.prototxt", import.meta.url);

const data = (t: Tensor) => Array.from(t.dataSync() as Float32Array);
const bufferCount = (n: Network) => n.namedBuffers().reduce((s, b) => s + b.tensor.size, 0);

// Learnable parameters of the layer kinds, from their shapes.
const conv = (cin: number, cout: number, k: number, bias = true) => cin * cout * k * k + (bias ? cout : 0);
const fc = (inputs: number, outputs: number) => inputs * outputs + outputs;

// -----------------------------------------------------------------------------------------------
// The three nets

Deno.test("caffe dag: cifar10_full imports (WITHIN_CHANNEL LRN) as a chain of 89,578 parameters", async () => {
  // By hand: conv 3→32 5×5, 32→32 5×5, 32→64 5×5, ip 64·4·4→10 (32 → pool 16 → 8 → 4, Caffe's ceil).
  const expected = conv(3, 32, 5) + conv(32, 32, 5) + conv(32, 64, 5) + fc(64 * 4 * 4, 10);
  assert.equal(expected, 89_578);
  for (const phase of ["TRAIN", "TEST"] as const) {
    const { network, transform } = await loadCaffeNet(CIFAR_FULL, {
      inputShape: [3, 32, 32],
      phase,
      seed: 1,
    });
    assert.equal(network.parameterCount(), expected);
    assert.equal(network.graph, undefined, "a chain stays a Sequential network");
    assert.deepEqual(network.layers().map(([name]) => name), [
      "conv1",
      "pool1",
      "relu1",
      "norm1",
      "conv2",
      "relu2",
      "pool2",
      "norm2",
      "conv3",
      "relu3",
      "pool3",
      "ip1",
    ]);
    const norm1 = network.layers()[3][1] as WithinChannelLRN;
    assert.ok(norm1 instanceof WithinChannelLRN);
    assert.deepEqual(norm1.params, { size: 3, alpha: 5e-5, beta: 0.75 });
    assert.deepEqual(network.namedParameters().find((p) => p.name === "ip1.weight")!.decayMult, 250);
    assert.equal(transform?.meanFile, "examples/cifar10/mean.binaryproto");
    tidy(() =>
      assert.deepEqual(network.forward(tensor(values(2 * 3072, rng(1)), { shape: [2, 3, 32, 32] })).shape, [
        2,
        10,
      ])
    );
    network.dispose();
  }
});

Deno.test("caffe dag: the tiny ResNet imports as a graph of 78,042 parameters and 681 BatchNorm statistics", async () => {
  // By hand, from its architecture: conv1 3→16 3×3 (no bias) + Scale(16, bias); block 1: two 3×3
  // 16→16 with Scales; blocks 2 and 3: 3×3 c→2c stride 2, 3×3 2c→2c, 1×1 c→2c projection, each with
  // a Scale; InnerProduct 64→10. Every convolution has a BatchNorm: 2·C + 1 statistics each.
  const scale = (c: number) => 2 * c;
  const block = (cin: number, cout: number, projection: boolean) =>
    conv(cin, cout, 3, false) + scale(cout) + conv(cout, cout, 3, false) + scale(cout) +
    (projection ? conv(cin, cout, 1, false) + scale(cout) : 0);
  const expected = conv(3, 16, 3, false) + scale(16) + block(16, 16, false) + block(16, 32, true) +
    block(32, 64, true) + fc(64, 10);
  assert.equal(expected, 78_042);
  const bnChannels = [16, 16, 16, 32, 32, 32, 64, 64, 64];
  const statistics = bnChannels.reduce((s, c) => s + 2 * c + 1, 0);
  assert.equal(statistics, 681);
  for (const phase of ["TRAIN", "TEST"] as const) {
    const { network, notes } = await loadCaffeNet(RESNET, { phase, seed: 1 });
    assert.equal(network.parameterCount(), expected, phase);
    assert.equal(bufferCount(network), statistics, phase);
    assert.ok(network.graph, "a residual net is a graph");
    assert.deepEqual(network.inputShape, [3, 32, 32]);
    assert.equal(network.classes, 10);
    // In-place layers are ordinary nodes; the BatchNorm statistics are buffers, not parameters.
    assert.deepEqual(network.graph.nodes.slice(0, 3).map((n) => [n.name, n.bottoms, n.top]), [
      ["conv1", ["data"], "conv1"],
      ["bn_conv1", ["conv1"], "conv1@2"],
      ["scale_conv1", ["conv1@2"], "conv1@3"],
    ]);
    assert.deepEqual(network.namedBuffers().slice(0, 3).map((b) => b.name), [
      "bn_conv1.mean",
      "bn_conv1.variance",
      "bn_conv1.scale_factor",
    ]);
    assert.ok(!network.namedParameters().some((p) => p.name.startsWith("bn_")));
    assert.ok(
      notes.some((n) => /bn_conv1 \(BatchNorm\): statistics kept as buffers/.test(n)),
      notes.join("\n"),
    );
    // Identity shortcut of block 1: the block's input is read twice (Caffe's implicit Split).
    const res1 = network.graph.nodes.find((n) => n.name === "res1")!;
    assert.deepEqual(res1.bottoms, ["conv1@4", "res1_branch2b@3"]);
    tidy(() => {
      const x = tensor(values(2 * 3072, rng(2)), { shape: [2, 3, 32, 32] });
      network.eval(); // before any training: global statistics of zero, still finite
      const y = data(network.forward(x));
      assert.equal(y.length, 20);
      assert.ok(y.every(Number.isFinite));
    });
    network.dispose();
  }
});

/**
 * GoogLeNet's learnable parameters from the paper's table (Szegedy et al. 2014, table 1): the stem
 * convolutions, nine inceptions `(cin, #1×1, #3×3 reduce, #3×3, #5×5 reduce, #5×5, pool proj)`, two
 * auxiliary heads (1×1 conv to 128, fc 128·4·4 → 1024, classifier 1024 → 1000) and the classifier.
 */
function googlenetParameters(): number {
  const inception = (cin: number, n1: number, r3: number, n3: number, r5: number, n5: number, pp: number) =>
    conv(cin, n1, 1) + conv(cin, r3, 1) + conv(r3, n3, 3) + conv(cin, r5, 1) + conv(r5, n5, 5) +
    conv(cin, pp, 1);
  const stem = conv(3, 64, 7) + conv(64, 64, 1) + conv(64, 192, 3);
  const table: [number, number, number, number, number, number, number][] = [
    [192, 64, 96, 128, 16, 32, 32], // 3a
    [256, 128, 128, 192, 32, 96, 64], // 3b
    [480, 192, 96, 208, 16, 48, 64], // 4a
    [512, 160, 112, 224, 24, 64, 64], // 4b
    [512, 128, 128, 256, 24, 64, 64], // 4c
    [512, 112, 144, 288, 32, 64, 64], // 4d
    [528, 256, 160, 320, 32, 128, 128], // 4e
    [832, 256, 160, 320, 32, 128, 128], // 5a
    [832, 384, 192, 384, 48, 128, 128], // 5b
  ];
  // Each inception's output is the next one's input: the table is consistent.
  for (let i = 0; i + 1 < table.length; i++) {
    const [, n1, , n3, , n5, pp] = table[i];
    assert.equal(n1 + n3 + n5 + pp, table[i + 1][0], `inception ${i} output`);
  }
  const auxiliary = (cin: number) => conv(cin, 128, 1) + fc(128 * 4 * 4, 1024) + fc(1024, 1000);
  return stem + table.reduce((s, row) => s + inception(...row), 0) + auxiliary(512) + auxiliary(528) +
    fc(1024, 1000);
}

Deno.test({
  name: "caffe dag: bvlc_googlenet imports with its auxiliary classifiers: the paper's parameter count",
  ...slowTest,
  fn: async () => {
    const expected = googlenetParameters();
    assert.equal(expected, 13_378_280);
    const { network, notes } = await loadCaffeNet(GOOGLENET, { seed: 1 });
    try {
      assert.equal(network.parameterCount(), expected);
      assert.equal(bufferCount(network), 0);
      assert.deepEqual(network.inputShape, [3, 224, 224]);
      assert.equal(network.classes, 1000);
      const graph = network.graph!;
      assert.deepEqual(graph.losses.map((l) => [l.name, l.weight]), [
        ["loss1/loss", 0.3],
        ["loss2/loss", 0.3],
        ["loss3/loss3", 1],
      ]);
      assert.equal(graph.output, "loss3/classifier");
      assert.ok(
        notes.some((n) =>
          n.startsWith("training loss: 0.3 × loss1/loss + 0.3 × loss2/loss + 1 × loss3/loss3")
        ),
      );
      // The main classifier alone skips the auxiliary heads.
      const needed = new Set(graph.needed([graph.output]).map((i) => graph.nodes[i].name));
      assert.ok(!needed.has("loss1_fc") && needed.has("inception_5b_output"));
      assert.deepEqual(network.describe([1, 3, 224, 224]).outputShape, [1, 1000]);
    } finally {
      network.dispose();
    }
  },
});

Deno.test({
  name:
    "caffe dag: bvlc_googlenet trains two SGD steps at batch 2: the weighted loss, both heads move as SGD says",
  ...slowTest,
  fn: async () => {
    // Mutation tried: replicaStep taking the main classifier's loss alone (network.forward + one
    // cross-entropy) leaves the auxiliary classifier's bias where it was and fails here.
    const { network } = await loadCaffeNet(GOOGLENET, { seed: 1 });
    const lr = 0.01;
    const optimizer = new SGD(network.namedParameters(), { lr });
    try {
      const images = tensor(values(2 * 3 * 224 * 224, rng(3)), { shape: [2, 3, 224, 224] });
      const labels = tensor([3, 999], { dtype: "int32" });
      const entry = (name: string) => network.namedParameters().find((p) => p.name === name)!;
      const biases = [entry("loss3_classifier.bias"), entry("loss1_classifier.bias")];
      const before = biases.map((b) => data(b.tensor));
      // The gradient at the starting point, with the dropout masks of step 0 (keyed by seed and step).
      network.train();
      const expectedLoss = tidy(() => {
        const { loss } = trainingLoss(network, images, labels, { seed: 0, step: 0, sampleOffset: 0 });
        loss.backward();
        return loss.dataSync()[0];
      });
      const gradients = biases.map((b) => data(b.tensor.grad!));
      optimizer.zeroGrad();
      const losses = [(await trainStep(network, optimizer, { images, labels })).loss];
      assert.ok(Math.abs(losses[0] - expectedLoss) < 1e-5, `${losses[0]} vs ${expectedLoss}`);
      // Caffe's weighted sum at initialisation: about (0.3 + 0.3 + 1) · ln 1000.
      assert.ok(Math.abs(losses[0] - 1.6 * Math.log(1000)) < 1, `first loss ${losses[0]}`);
      // Plain SGD moved both heads: w₁ = w₀ − lr · lr_mult · g₀ (biases have lr_mult 2).
      biases.forEach((b, k) => {
        const after = data(b.tensor);
        assert.ok(gradients[k].some((g) => g !== 0), `${b.name} has a gradient`);
        after.forEach((v, i) => {
          const want = before[k][i] - lr * b.lrMult * gradients[k][i];
          assert.ok(Math.abs(v - want) < 1e-6, `${b.name}[${i}]: ${v} vs ${want}`);
        });
      });
      losses.push((await trainStep(network, optimizer, { images, labels })).loss);
      assert.ok(losses.every(Number.isFinite), `losses ${losses}`);
      images.dispose();
      labels.dispose();
    } finally {
      optimizer.dispose();
      network.dispose();
    }
  },
});

// -----------------------------------------------------------------------------------------------
// Wiring: in place, a blob read twice, weighted losses

const HEADER = 'name: "t"\ninput: "data"\ninput_shape { dim: 2 dim: 3 dim: 1 dim: 1 }\ninput: "label"\n';
const ipLayer = (name: string, bottom: string, top: string, n = 3) =>
  `layer { name: "${name}" type: "InnerProduct" bottom: "${bottom}" top: "${top}" ` +
  `inner_product_param { num_output: ${n} weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }\n`;
const reluLayer = (name: string, blob: string) =>
  `layer { name: "${name}" type: "ReLU" bottom: "${blob}" top: "${blob}" }\n`;
const lossLayer = (name: string, bottom: string, weight?: number) =>
  `layer { name: "${name}" type: "SoftmaxWithLoss" bottom: "${bottom}" bottom: "label" top: "${name}" ${
    weight === undefined ? "" : `loss_weight: ${weight} `
  }}\n`;

/** `W x + b` in float64 for rows of `x`. */
function affine(x: number[][], w: number[], b: number[]): number[][] {
  const outputs = b.length, inputs = w.length / outputs;
  return x.map((row) => b.map((bias, o) => bias + row.reduce((s, v, i) => s + v * w[o * inputs + i], 0)));
}

for (const explicit of [false, true]) {
  Deno.test(
    `caffe dag: an in-place ReLU is seen by every later reader; a blob read twice (${
      explicit ? "an explicit Split layer" : "Caffe's implicit Split"
    }) sums its gradients`,
    () => {
      // Mutations tried, each failing here: BlobTable.read returning the value before an in-place write
      // (the readers see the pre-ReLU values); autograd's accumulate keeping only the last reader's
      // gradient instead of adding (the Split gradient halves).
      // Caffe's explicit Split layer: its tops are the bottom's value, read once each.
      const split = explicit ? 'layer { name: "split" type: "Split" bottom: "a" top: "a1" top: "a2" }\n' : "";
      const text = HEADER + ipLayer("ip1", "data", "a") + reluLayer("relu", "a") + split +
        ipLayer("ip2", explicit ? "a1" : "a", "b") + ipLayer("ip3", explicit ? "a2" : "a", "c") +
        'layer { name: "sum" type: "Eltwise" bottom: "b" bottom: "c" top: "s" }\n' + lossLayer("loss", "s");
      const { network } = importCaffeNet(text, { seed: 3 });
      const p = Object.fromEntries(network.namedParameters().map((e) => [e.name, data(e.tensor)]));
      const x = values(6, rng(4), { avoid: 0.05 });
      const rows = [Array.from(x.slice(0, 3)), Array.from(x.slice(3))];
      const h = affine(rows, p["ip1.weight"], p["ip1.bias"]).map((r) => r.map((v) => Math.max(v, 0)));
      const want = affine(h, p["ip2.weight"], p["ip2.bias"]).map((r, i) =>
        r.map((v, j) => v + affine(h, p["ip3.weight"], p["ip3.bias"])[i][j])
      );
      const R = values(6, rng(5));
      tidy(() => {
        const y = network.forward(tensor(x, { shape: [2, 3, 1, 1] }));
        data(y).forEach((v, i) =>
          assert.ok(Math.abs(v - want.flat()[i]) < 1e-5, `y[${i}] ${v} vs ${want.flat()[i]}`)
        );
        ops.sum(ops.mul(y, tensor(R, { shape: [2, 3] }))).backward();
      });
      // d/dh of Σ R·(W2 h + W3 h) = (W2 + W3)ᵀ R: both readers' gradients, through the ReLU to ip1.bias.
      const w2 = p["ip2.weight"], w3 = p["ip3.weight"];
      const pre = affine(rows, p["ip1.weight"], p["ip1.bias"]);
      const dBias = [0, 0, 0];
      for (let n = 0; n < 2; n++) {
        for (let i = 0; i < 3; i++) {
          if (pre[n][i] <= 0) continue;
          for (let o = 0; o < 3; o++) dBias[i] += R[n * 3 + o] * (w2[o * 3 + i] + w3[o * 3 + i]);
        }
      }
      const grad = data(network.namedParameters().find((e) => e.name === "ip1.bias")!.tensor.grad!);
      dBias.forEach((g, i) => assert.ok(Math.abs(grad[i] - g) < 1e-5, `d ip1.bias[${i}] ${grad[i]} vs ${g}`));
      network.dispose();
    },
  );
}

Deno.test("caffe dag: the training loss is Σ loss_weight · loss; the main classifier is the heaviest, last on ties", () => {
  // Mutations tried, each failing here: the weights ignored (plain sum); the main classifier taken
  // as the first of equal weights; evaluation (heads "main") adding the auxiliary loss.
  const heads = (wa: number, wb: number) =>
    HEADER + ipLayer("ip1", "data", "h", 4) + reluLayer("relu", "h") + ipLayer("ipa", "h", "a", 5) +
    ipLayer("ipb", "h", "b", 5) + lossLayer("lossa", "a", wa) + lossLayer("lossb", "b", wb);
  const labels = tensor([1, 4], { dtype: "int32" });
  const images = tensor(values(6, rng(6)), { shape: [2, 3, 1, 1] });
  const check = (wa: number, wb: number, main: "a" | "b") => {
    const { network } = importCaffeNet(heads(wa, wb), { seed: 5 });
    assert.equal(network.graph!.output, main);
    tidy(() => {
      const [a, b] = noGrad(() => network.graph!.run(images, ["a", "b"]));
      const ce = (t: Tensor) => ops.softmaxCrossEntropy(t, labels).dataSync()[0];
      const { loss, logits } = network.lossAndLogits(images, labels);
      const want = Math.fround(Math.fround(wa * ce(a)) + Math.fround(wb * ce(b)));
      assert.ok(Math.abs(loss.dataSync()[0] - want) < 1e-6, `loss ${loss.dataSync()[0]} vs ${want}`);
      assert.deepEqual(data(logits), data(main === "a" ? a : b));
      const evaluation = network.lossAndLogits(images, labels, { heads: "main", reduction: "sum" });
      const mainCe = ops.softmaxCrossEntropy(main === "a" ? a : b, labels, { reduction: "sum" });
      assert.equal(evaluation.loss.dataSync()[0], mainCe.dataSync()[0]);
      // The gradient of an auxiliary classifier is its weight times its own loss's gradient.
      loss.backward();
      const g = network.namedParameters().find((e) => e.name === "ipa.bias")!.tensor;
      const weighted = data(g.grad!);
      g.grad!.dispose();
      g.grad = null;
      ops.softmaxCrossEntropy(network.graph!.run(images, ["a"])[0], labels).backward();
      data(g.grad!).forEach((v, i) => assert.ok(Math.abs(wa * v - weighted[i]) < 1e-6, `ipa.bias[${i}]`));
    });
    for (const e of network.namedParameters()) {
      e.tensor.grad?.dispose();
      e.tensor.grad = null;
    }
    network.dispose();
  };
  check(0.3, 1, "b");
  check(1, 1, "b");
  check(2, 1, "a");
  labels.dispose();
  images.dispose();
});

// -----------------------------------------------------------------------------------------------
// Refusals: one clear line naming the layer and its position

function refuses(text: string, layer: string, pattern: RegExp): CaffeImportError {
  let caught: unknown;
  try {
    importCaffeNet(text, { fileName: "net.prototxt" });
  } catch (error) {
    caught = error;
  }
  assert.ok(caught instanceof CaffeImportError, `expected CaffeImportError, got ${caught}`);
  assert.equal(caught.layer, layer, caught.message);
  assert.match(caught.message, pattern);
  assert.match(caught.message, /^net\.prototxt:\d+:\d+: /);
  assert.ok(!caught.message.includes("\n"), "one line");
  return caught;
}

Deno.test("caffe dag: bad graphs are refused before any work with the layer, its bottoms and shapes", () => {
  const base = 'name: "t"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n';
  const convLayer = (name: string, bottom: string, top: string, n: number, stride = 1) =>
    `layer { name: "${name}" type: "Convolution" bottom: "${bottom}" top: "${top}" ` +
    `convolution_param { num_output: ${n} kernel_size: 1 stride: ${stride} } }\n`;
  const two = base + convLayer("a", "data", "a", 4) + convLayer("b", "data", "b", 2, 2);
  refuses(
    two + 'layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }\n',
    "cat",
    /layer "cat" \(Concat\): bottoms "a" \[4, 8, 8\], "b" \[2, 4, 4\] differ outside axis 1, so they cannot be concatenated/,
  );
  refuses(
    two + 'layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }\n',
    "sum",
    /layer "sum" \(Eltwise SUM\): bottoms "a" \[4, 8, 8\], "b" \[2, 4, 4\] differ in shape/,
  );
  const e = refuses(
    two +
      'layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "a" top: "s" eltwise_param { operation: SUBTRACT } }\n',
    "sum",
    /eltwise_param: "operation" must be one of PROD, SUM, MAX, got SUBTRACT/,
  );
  assert.equal(e.line, 6);
  refuses(
    two +
      'layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "a" top: "s" eltwise_param { coeff: 1 } }\n',
    "sum",
    /1 coeff value\(s\) for 2 bottoms; give one per bottom/,
  );
  refuses(
    two +
      'layer { name: "m" type: "Eltwise" bottom: "a" bottom: "a" top: "s" eltwise_param { operation: MAX coeff: 1 coeff: 2 } }\n',
    "m",
    /coeff applies to SUM only, not MAX/,
  );
  refuses(
    base + convLayer("a", "data", "a", 4) + convLayer("b", "nowhere", "b", 2),
    "b",
    /layer "b" \(Convolution\) reads blob "nowhere", which no earlier layer produces$/,
  );
  // A cycle: each reads the other's output (in Caffe's file order, the first reads too early).
  refuses(
    base + convLayer("a", "data", "a", 4) +
      'layer { name: "x" type: "Eltwise" bottom: "a" bottom: "y" top: "x" }\n' + convLayer("y", "x", "y", 4),
    "x",
    /reads blob "y", which no earlier layer produces; layer "y" \(line 6\) writes it later: a cycle, or layers out of order/,
  );
  refuses(
    base + convLayer("a", "data", "a", 4) +
      'layer { name: "bn" type: "BatchNorm" bottom: "a" top: "a" param { lr_mult: 1 } }\n',
    "bn",
    /its statistics are not learned; a param block must say lr_mult: 0/,
  );
  refuses(
    two + 'layer { name: "sc" type: "Scale" bottom: "a" bottom: "b" top: "a" }\n',
    "sc",
    /layer "sc" \(Scale\) has 2 bottoms; only a learned scale \(one bottom\) is supported/,
  );
  refuses(
    base + 'input: "other"\ninput_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n' + convLayer("a", "data", "a", 4) +
      convLayer("b", "other", "b", 4) +
      'layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }\n',
    "b",
    /reads a second input blob "other" \(the first is "data", read by layer "a"\); Tandem networks take one input/,
  );
  refuses(
    base + convLayer("a", "data", "a", 4) +
      'layer { name: "sc" type: "Scale" bottom: "a" top: "a" scale_param { axis: 2 } }\n',
    "sc",
    /only axis 1 \(channels\) is supported/,
  );
});

Deno.test("caffe dag: Graph refuses wiring that cannot run, naming the node", () => {
  const node = (name: string, bottoms: string[], top: string, module = new ReLU()) => ({
    name,
    module,
    bottoms,
    top,
  });
  assert.throws(
    () => new Graph({ input: "x", nodes: [node("a", ["b"], "a"), node("b", ["a"], "b")] }),
    (e: Error) =>
      e instanceof TandemError &&
      /node "a" reads blob "b", which no earlier node writes \(node "b" writes it later: a cycle, or nodes out of order\)/
        .test(e.message),
  );
  assert.throws(
    () => new Graph({ input: "x", nodes: [node("a", ["x", "x"], "a", new Linear(2, 2) as unknown as ReLU)] }),
    /node "a" \(Linear\) reads 2 blobs but takes one input/,
  );
  assert.throws(
    () => new Graph({ input: "x", nodes: [node("a", ["x"], "x")] }),
    /writes blob "x", which is already written/,
  );
  const ok = new Graph({
    input: "x",
    nodes: [node("a", ["x"], "a"), { name: "s", module: new Eltwise(), bottoms: ["a", "x"], top: "s" }],
  });
  assert.equal(ok.output, "s");
  assert.deepEqual(ok.needed(["a"]), [0]);
});
