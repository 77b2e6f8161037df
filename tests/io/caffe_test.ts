/**
 * Caffe import: the prototxt parser (values, nesting, positions, errors) and the net importer,
 * checked against the real bvlc_alexnet and cifar10_quick files and the matching model factories.
 */

import assert from "node:assert/strict";
import "../../mod.ts";
import {
  CaffeImportError,
  importCaffeNet,
  loadCaffeNet,
  parsePrototxt,
  PrototxtError,
  PrototxtMessage,
  type PrototxtScalar,
} from "../../engine/caffe/mod.ts";
import { alexnet, cifarQuick } from "../../engine/models/mod.ts";
import { AvgPool2d, Conv2d, Dropout, Linear, LRN, MaxPool2d } from "../../engine/nn/layers.ts";
import type { Module } from "../../engine/nn/module.ts";
import type { Network } from "../../engine/nn/network.ts";
import { TandemError } from "../../engine/errors.ts";

import { slowTest } from "../fixtures/slow.ts";

const caffeDir = new URL("../../examples/caffe/", import.meta.url);
const alexnetUrl = new URL("bvlc_alexnet_train_val.prototxt", caffeDir);
const cifarUrl = new URL("cifar10_quick_train_test.prototxt", caffeDir);
const alexnetText = Deno.readTextFileSync(alexnetUrl);
const cifarText = Deno.readTextFileSync(cifarUrl);

/** 1-based line and column of the `occurrence`-th match of `needle` in `text`. */
function positionOf(text: string, needle: string, occurrence = 1): { line: number; column: number } {
  let index = -1;
  for (let i = 0; i < occurrence; i++) {
    index = text.indexOf(needle, index + 1);
    assert.ok(index >= 0, `"${needle}" occurs ${occurrence} times`);
  }
  const before = text.slice(0, index).split("\n");
  return { line: before.length, column: before[before.length - 1].length + 1 };
}

/** Replaces the `occurrence`-th `needle` of `text`. */
function replaceNth(text: string, needle: string, replacement: string, occurrence = 1): string {
  let index = -1;
  for (let i = 0; i < occurrence; i++) index = text.indexOf(needle, index + 1);
  assert.ok(index >= 0);
  return text.slice(0, index) + replacement + text.slice(index + needle.length);
}

function throwsAt<E extends PrototxtError>(
  fn: () => unknown,
  kind: new (...args: never[]) => E,
  at: { line: number; column: number },
  pattern: RegExp,
): E {
  let caught: unknown;
  try {
    fn();
  } catch (error) {
    caught = error;
  }
  assert.ok(caught instanceof kind, `expected ${kind.name}, got ${caught}`);
  const error = caught as E;
  assert.equal(`${error.line}:${error.column}`, `${at.line}:${at.column}`, error.message);
  assert.match(error.message, pattern);
  assert.ok(error.message.startsWith(`${error.fileName}:${at.line}:${at.column}: `), error.message);
  return error;
}

function scalar(message: PrototxtMessage, name: string, index = 0): PrototxtScalar {
  const value = message.all(name)[index]?.value;
  assert.ok(value && !(value instanceof PrototxtMessage), `${name} is a scalar`);
  return value;
}

function child(message: PrototxtMessage, name: string, index = 0): PrototxtMessage {
  const value = message.all(name)[index]?.value;
  assert.ok(value instanceof PrototxtMessage, `${name} is a message`);
  return value;
}

// -----------------------------------------------------------------------------------------------
// Parser

Deno.test("prototxt: scalars, nesting, repeated fields and positions", () => {
  const text = [
    `name: "a \\"quoted\\" \\x41\\101\\n" # comment`,
    `alpha: 1e-4 beta: -0.75 gamma: .5 big: 0x1F octal: 017 f: 2.5f neg: -3`,
    `flag: true off: False pool: MAX`,
    `layer { top: "x" top: 'y' }`,
    `layer: { inner < k: 1 >; list: [1, 2, 3], empty: [] }`,
    `joined: "ab" 'cd'`,
  ].join("\n");
  const root = parsePrototxt(text, "t.prototxt");
  assert.deepEqual(scalar(root, "name"), { kind: "string", value: 'a "quoted" AA\n' });
  assert.equal((scalar(root, "alpha") as { value: number }).value, 1e-4);
  assert.equal((scalar(root, "beta") as { value: number }).value, -0.75);
  assert.equal((scalar(root, "gamma") as { value: number }).value, 0.5);
  assert.equal((scalar(root, "big") as { value: number }).value, 31);
  assert.equal((scalar(root, "octal") as { value: number }).value, 15);
  assert.equal((scalar(root, "f") as { value: number }).value, 2.5);
  assert.equal((scalar(root, "neg") as { value: number }).value, -3);
  assert.deepEqual(scalar(root, "flag"), { kind: "bool", value: true });
  assert.deepEqual(scalar(root, "off"), { kind: "bool", value: false });
  assert.deepEqual(scalar(root, "pool"), { kind: "identifier", value: "MAX" });
  assert.deepEqual(scalar(root, "joined"), { kind: "string", value: "abcd" });
  assert.equal(root.all("layer").length, 2);
  const first = child(root, "layer");
  assert.deepEqual(first.all("top").map((f) => (f.value as PrototxtScalar).value), ["x", "y"]);
  const second = child(root, "layer", 1);
  assert.deepEqual(scalar(child(second, "inner"), "k"), { kind: "number", value: 1, text: "1" });
  assert.deepEqual(second.all("list").map((f) => (f.value as PrototxtScalar).value), [1, 2, 3]);
  assert.equal(second.all("empty").length, 0);
  assert.deepEqual(root.names().slice(0, 3), ["name", "alpha", "beta"]);
  // Positions of field names and values, 1-based.
  const beta = root.first("beta")!;
  assert.deepEqual([beta.line, beta.column, beta.valueLine, beta.valueColumn], [2, 13, 2, 19]);
  assert.deepEqual([root.first("layer")!.line, root.first("layer")!.column], [4, 1]);
  assert.deepEqual([first.line, first.column], [4, 7]);
});

Deno.test("prototxt: malformed text reports file, line, column and what was expected", () => {
  throwsAt(
    () => parsePrototxt('a: 1\nname: "net', "bad.prototxt"),
    PrototxtError,
    { line: 2, column: 7 },
    /unterminated string/,
  );
  throwsAt(() => parsePrototxt('name: "x\ny"'), PrototxtError, { line: 1, column: 7 }, /unterminated string/);
  const missing = throwsAt(
    () => parsePrototxt('layer {\n  name: "a"\n', "m.prototxt"),
    PrototxtError,
    { line: 3, column: 1 },
    /expected "}" to close the message opened at line 1, column 7, found the end of the file/,
  );
  assert.equal(missing.fileName, "m.prototxt");
  throwsAt(
    () => parsePrototxt("layer {\n  alpha: 1.2.3\n}"),
    PrototxtError,
    { line: 2, column: 10 },
    /bad number "1\.2\.3"/,
  );
  throwsAt(() => parsePrototxt("x: 12abc"), PrototxtError, { line: 1, column: 4 }, /bad number "12abc"/);
  throwsAt(() => parsePrototxt("x: 1e-"), PrototxtError, { line: 1, column: 4 }, /bad number "1e-"/);
  throwsAt(
    () => parsePrototxt("a: 1 }"),
    PrototxtError,
    { line: 1, column: 6 },
    /expected a field name, found "}"/,
  );
  throwsAt(
    () => parsePrototxt("a 1"),
    PrototxtError,
    { line: 1, column: 3 },
    /expected ":" or "\{" after field name "a"/,
  );
  throwsAt(() => parsePrototxt("a: }"), PrototxtError, { line: 1, column: 4 }, /expected a value/);
  throwsAt(() => parsePrototxt("a: [1 2]"), PrototxtError, { line: 1, column: 7 }, /expected "," or "]"/);
  throwsAt(() => parsePrototxt('a: "\\q"'), PrototxtError, { line: 1, column: 5 }, /bad escape/);
  assert.ok(new PrototxtError("f", 1, 1, "x") instanceof TandemError);
});

Deno.test("prototxt: parses both real Caffe files", () => {
  const net = parsePrototxt(alexnetText, "alexnet");
  assert.deepEqual(scalar(net, "name"), { kind: "string", value: "AlexNet" });
  const layers = net.all("layer");
  assert.equal(layers.length, 26);
  const conv1 = layers[2].value as PrototxtMessage;
  assert.deepEqual(scalar(conv1, "name"), { kind: "string", value: "conv1" });
  assert.equal(
    (scalar(child(child(conv1, "convolution_param"), "weight_filler"), "std") as { value: number }).value,
    0.01,
  );
  assert.equal(conv1.all("param").length, 2);
  const norm1 = layers[4].value as PrototxtMessage;
  assert.equal((scalar(child(norm1, "lrn_param"), "alpha") as { value: number }).value, 1e-4);
  assert.deepEqual([layers[4].line, layers[4].column], [positionOf(alexnetText, "layer {", 5).line, 1]);
  const cifar = parsePrototxt(cifarText);
  assert.equal(cifar.all("layer").length, 15);
  const pool2 = cifar.all("layer").map((f) => f.value as PrototxtMessage).find((l) =>
    (scalar(l, "name") as { value: string }).value === "pool2"
  )!;
  assert.deepEqual(scalar(child(pool2, "pooling_param"), "pool"), { kind: "identifier", value: "AVE" });
});

// -----------------------------------------------------------------------------------------------
// Importer

function signature(m: Module): unknown {
  if (m instanceof Conv2d) {
    return {
      in: m.inChannels,
      out: m.outChannels,
      weight: m.weight.shape,
      bias: m.bias?.shape ?? null,
      options: m.options,
    };
  }
  if (m instanceof Linear) return { in: m.inFeatures, out: m.outFeatures, bias: m.bias?.shape ?? null };
  if (m instanceof MaxPool2d || m instanceof AvgPool2d) {
    const o = m.options;
    return { kernel: o.kernel, stride: o.stride, padding: o.padding ?? 0 };
  }
  if (m instanceof LRN) return m.params;
  if (m instanceof Dropout) return { p: m.p };
  return {};
}

/** Layer-by-layer equality: names, kinds, options, shapes, parameter metadata and values. */
async function assertSameNetwork(imported: Network, built: Network): Promise<void> {
  assert.deepEqual(imported.inputShape, built.inputShape);
  assert.equal(imported.classes, built.classes);
  const a = imported.layers(), b = built.layers();
  assert.deepEqual(a.map(([n, m]) => `${n}:${m.kind}`), b.map(([n, m]) => `${n}:${m.kind}`));
  let shape = [2, ...built.inputShape];
  for (let i = 0; i < a.length; i++) {
    assert.deepEqual(signature(a[i][1]), signature(b[i][1]), a[i][0]);
    const da = a[i][1].describe(shape), db = b[i][1].describe(shape);
    assert.deepEqual(da, db, a[i][0]);
    shape = da.outputShape;
  }
  assert.equal(imported.parameterCount(), built.parameterCount());
  assert.equal(imported.parameterCount("conv"), built.parameterCount("conv"));
  assert.equal(imported.parameterCount("fc"), built.parameterCount("fc"));
  const pa = imported.namedParameters(), pb = built.namedParameters();
  const meta = (p: (typeof pa)[number]) => ({
    name: p.name,
    shape: p.tensor.shape,
    group: p.group,
    lr: p.lrMult,
    decay: p.decayMult,
  });
  assert.deepEqual(pa.map(meta), pb.map(meta));
  for (let i = 0; i < pa.length; i++) {
    const [va, vb] = await Promise.all([pa[i].tensor.data(), pb[i].tensor.data()]);
    assert.equal(va.length, vb.length);
    let same = true;
    for (let j = 0; j < va.length && same; j++) same = Object.is(va[j], vb[j]);
    assert.ok(same, `${pa[i].name}: bit-identical values`);
  }
}

// Slow (two 61 M-parameter initialisations): runs with the slow tests. The default set parses the
// same bvlc_alexnet file, imports cifar10_quick bit for bit against its factory, and checks
// alexnet()'s parameter counts and shapes (models_test.ts).
Deno.test("caffe: imported bvlc_alexnet equals alexnet() layer by layer, bit for bit", slowTest, async () => {
  const result = await loadCaffeNet(alexnetUrl, { seed: 3 });
  assert.equal(result.network.name, "AlexNet");
  assert.equal(result.loss, "SoftmaxWithLoss");
  assert.equal(result.network.parameterCount(), 60_965_224);
  assert.equal(result.network.parameterCount("conv"), 2_334_080);
  assert.equal(result.network.parameterCount("fc"), 58_631_144);
  const built = alexnet({ seed: 3 });
  await assertSameNetwork(result.network, built);
  assert.ok(result.notes.some((n) => /^data \(Data\): data layer/.test(n)), result.notes.join("\n"));
  assert.ok(result.notes.some((n) => /\[3, 227, 227\] from transform_param.crop_size 227/.test(n)));
  assert.ok(result.notes.some((n) => /^accuracy \(Accuracy\): left out in phase TRAIN/.test(n)));
  result.network.dispose();
  built.dispose();
});

Deno.test("caffe: imported cifar10_quick equals cifarQuick(); its Data layer needs inputShape", async () => {
  const result = importCaffeNet(cifarText, {
    phase: "TEST",
    seed: 4,
    inputShape: [3, 32, 32],
    fileName: "cifar.prototxt",
  });
  assert.equal(result.network.name, "CIFAR10_quick");
  assert.equal(result.loss, "SoftmaxWithLoss");
  await assertSameNetwork(result.network, cifarQuick({ seed: 4 }));
  assert.ok(
    result.notes.some((n) => /^cifar \(Data\): data layer, not part of the network/.test(n)),
    result.notes.join("\n"),
  );
  assert.ok(result.notes.some((n) => /^accuracy \(Accuracy\): not part of the network/.test(n)));
  assert.ok(result.notes.some((n) => /^cifar \(Data\): left out in phase TEST/.test(n)));
  // No crop_size: the shape lives in the LMDB, so the importer asks rather than guesses.
  const error = throwsAt(
    () => importCaffeNet(cifarText, { fileName: "cifar.prototxt" }),
    CaffeImportError,
    positionOf(cifarText, "layer {"),
    /cannot tell the input shape of blob "data".*pass the inputShape option/,
  );
  assert.equal(error.layer, "cifar");
});

Deno.test("caffe: unknown layer types name the layer, the type and its line:column", () => {
  const text = replaceNth(alexnetText, 'type: "ReLU"', 'type: "PReLU"', 2);
  const at = positionOf(text, "layer {", 8); // relu2 is the 8th layer
  const error = throwsAt(
    () => importCaffeNet(text, { fileName: "alexnet.prototxt" }),
    CaffeImportError,
    at,
    /layer "relu2" has unsupported type "PReLU" \(supported: .*Convolution/,
  );
  assert.equal(error.layer, "relu2");
  assert.equal(error.fileName, "alexnet.prototxt");
});

Deno.test("caffe: bad values point at the value", () => {
  const negative = replaceNth(alexnetText, "num_output: 384", "num_output: -384");
  throwsAt(
    () => importCaffeNet(negative),
    CaffeImportError,
    positionOf(negative, "-384"),
    /num_output" must be an integer ≥ 1, got -384/,
  );
  const stochastic = replaceNth(cifarText, "pool: AVE", "pool: STOCHASTIC");
  throwsAt(
    () => importCaffeNet(stochastic, { inputShape: [3, 32, 32] }),
    CaffeImportError,
    positionOf(stochastic, "STOCHASTIC"),
    /STOCHASTIC pooling is not supported/,
  );
  const typo = replaceNth(cifarText, "kernel_size: 5", "kernal_size: 5");
  throwsAt(
    () => importCaffeNet(typo, { inputShape: [3, 32, 32] }),
    CaffeImportError,
    positionOf(typo, "kernal_size"),
    /layer "conv1" convolution_param: unknown field "kernal_size"/,
  );
  const badFiller = replaceNth(alexnetText, 'type: "gaussian"', 'type: "bilinear"');
  throwsAt(
    () => importCaffeNet(badFiller),
    CaffeImportError,
    positionOf(badFiller, '"bilinear"'),
    /filler type "bilinear" is not supported/,
  );
  const wrongKind = replaceNth(alexnetText, "dropout_ratio: 0.5", 'dropout_ratio: "half"');
  throwsAt(
    () => importCaffeNet(wrongKind),
    CaffeImportError,
    positionOf(wrongKind, '"half"'),
    /must be a number, got string "half"/,
  );
  const bigRatio = replaceNth(alexnetText, "dropout_ratio: 0.5", "dropout_ratio: 1.5");
  throwsAt(
    () => importCaffeNet(bigRatio),
    CaffeImportError,
    positionOf(bigRatio, "dropout_ratio: 1.5"),
    /dropout_ratio must be in \[0, 1\)/,
  );
  const grouped = replaceNth(cifarText, "num_output: 32", "num_output: 32\n    group: 3");
  throwsAt(
    () => importCaffeNet(grouped, { inputShape: [3, 32, 32] }),
    CaffeImportError,
    positionOf(grouped, "group: 3"),
    /group 3 must divide the input channels \(3\) and num_output \(32\)/,
  );
});

const INPUT = 'name: "t"\ninput: "data"\ninput_shape { dim: 2 dim: 1 dim: 6 dim: 6 }\n';
const ip = (name: string, bottom: string, top: string, extra = "") =>
  `layer { name: "${name}" type: "InnerProduct" bottom: "${bottom}" top: "${top}" ${extra}inner_product_param { num_output: 4 } }\n`;

Deno.test("caffe: a branching net imports as a graph; a bottom nothing produces is refused at its layer", () => {
  // Branching nets are graphs now (tests/io/caffe_dag_test.ts); a chain stays a chain.
  const branching = INPUT + ip("ip1", "data", "ip1") + ip("ip2", "data", "ip2");
  const { network } = importCaffeNet(branching);
  assert.ok(network.graph, "a branching net has a graph");
  network.dispose();
  const chain = importCaffeNet(INPUT + ip("ip1", "data", "ip1") + ip("ip2", "ip1", "ip2")).network;
  assert.equal(chain.graph, undefined);
  chain.dispose();
  const dangling = INPUT + ip("ip1", "data", "ip1") + ip("ip2", "nowhere", "ip2");
  throwsAt(
    () => importCaffeNet(dangling),
    CaffeImportError,
    positionOf(dangling, "layer {", 2),
    /reads blob "nowhere", which no earlier layer produces/,
  );
});

Deno.test("caffe: multipliers, fillers, Input layers, phases and renamed layers", async () => {
  const text = `
name: "small"
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 9 dim: 7 } } }
layer { name: "conv/a" type: "Convolution" bottom: "data" top: "c"
  param { lr_mult: 0 decay_mult: 0 }
  convolution_param { num_output: 4 kernel_h: 3 kernel_w: 1 stride: 2 pad_w: 1 pad_h: 0 bias_term: false
    weight_filler { type: "constant" value: 0.5 } } }
layer { name: "pool" type: "Pooling" bottom: "c" top: "p" pooling_param { pool: AVE global_pooling: true } }
layer { name: "drop" type: "Dropout" bottom: "p" top: "p" include { phase: TRAIN } dropout_param { dropout_ratio: 0.25 } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" variance_norm: AVERAGE } bias_filler { type: "constant" value: -1 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
`;
  const train = importCaffeNet(text);
  const net = train.network;
  assert.equal(train.loss, undefined);
  assert.deepEqual(net.inputShape, [2, 9, 7]);
  assert.equal(net.classes, 3);
  assert.deepEqual(net.layers().map(([n, m]) => `${n}:${m.kind}`), [
    "conv_a:Conv2d",
    "pool:AvgPool2d",
    "drop:Dropout",
    "ip:Linear",
  ]);
  const conv = net.layers()[0][1] as Conv2d;
  assert.deepEqual(conv.options, { stride: 2, padding: [0, 1], groups: 1 });
  assert.deepEqual(conv.weight.shape, [4, 2, 3, 1]);
  assert.equal(conv.bias, null);
  assert.deepEqual((net.layers()[1][1] as AvgPool2d).options, { kernel: [4, 5], stride: 1 });
  assert.equal((net.layers()[2][1] as Dropout).p, 0.25);
  const params = Object.fromEntries(net.namedParameters().map((p) => [p.name, p]));
  assert.deepEqual([params["conv_a.weight"].lrMult, params["conv_a.weight"].decayMult], [0, 0]);
  // No param blocks: Caffe's defaults lr_mult 1, decay_mult 1 for both blobs.
  assert.deepEqual([params["ip.bias"].lrMult, params["ip.bias"].decayMult], [1, 1]);
  assert.ok(((await params["conv_a.weight"].tensor.data()) as Float32Array).every((v) => v === 0.5));
  assert.ok(((await params["ip.bias"].tensor.data()) as Float32Array).every((v) => v === -1));
  // xavier AVERAGE: fan = (fan_in 4 + fan_out 3) / 2 for a [3, 4] weight.
  const bound = Math.sqrt(3 / 3.5);
  assert.ok(((await params["ip.weight"].tensor.data()) as Float32Array).every((v) => Math.abs(v) <= bound));
  assert.ok(train.notes.some((n) => /^conv\/a \(Convolution\): named "conv_a"/.test(n)));
  assert.ok(train.notes.some((n) => /^prob \(Softmax\): left out/.test(n)));
  assert.ok(train.notes.some((n) => /^in \(Input\)/.test(n)));
  const test = importCaffeNet(text, { phase: "TEST" });
  assert.deepEqual(test.network.layers().map(([n]) => n), ["conv_a", "pool", "ip"]);
  assert.ok(test.notes.some((n) => /^drop \(Dropout\): left out in phase TEST/.test(n)));
  // The option overrides the file's shape, with a note.
  const resized = importCaffeNet(text, { inputShape: [2, 5, 5] });
  assert.deepEqual(resized.network.inputShape, [2, 5, 5]);
  assert.ok(resized.notes.some((n) => /overrides \[2, 9, 7\]/.test(n)));
});

Deno.test("caffe: legacy inputs, V1 files, shape mismatches and a missing file", async () => {
  const legacy = 'input: "data"\ninput_dim: 1 input_dim: 3 input_dim: 4 input_dim: 4\n' +
    ip("fc", "data", "fc");
  const net = importCaffeNet(legacy).network;
  assert.deepEqual(net.inputShape, [3, 4, 4]);
  assert.equal((net.layers()[0][1] as Linear).inFeatures, 48);
  const v1 = 'name: "old"\nlayers {\n  name: "conv1"\n  type: CONVOLUTION\n}\n';
  throwsAt(
    () => importCaffeNet(v1),
    CaffeImportError,
    { line: 2, column: 1 },
    /V1 "layers" definitions are not supported/,
  );
  const tooBig = INPUT +
    'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 9 } }';
  throwsAt(
    () => importCaffeNet(tooBig),
    CaffeImportError,
    positionOf(tooBig, "layer {"),
    /layer "c" \(Convolution\) does not fit its input \[1, 6, 6\]/,
  );
  const twice = INPUT +
    'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 num_output: 3 kernel_size: 1 } }';
  throwsAt(
    () => importCaffeNet(twice),
    CaffeImportError,
    positionOf(twice, "num_output: 3"),
    /"num_output" is not repeated but is given twice/,
  );
  await assert.rejects(() => loadCaffeNet(new URL("missing.prototxt", caffeDir)), Deno.errors.NotFound);
  // A parse error from loadCaffeNet names the file it read.
  const path = await Deno.makeTempFile({ suffix: ".prototxt" });
  try {
    await Deno.writeTextFile(path, "layer {\n");
    await assert.rejects(
      () => loadCaffeNet(path),
      (e: unknown) => e instanceof PrototxtError && e.message.startsWith(`${path}:2:1:`),
    );
  } finally {
    await Deno.remove(path);
  }
});
