import assert from "node:assert/strict";
import {
  Conv2d,
  Dropout,
  Flatten,
  formatSummary,
  Linear,
  LRN,
  MaxPool2d,
  memory,
  Network,
  ops,
  randn,
  ReLU,
  Sequential,
  ShapeError,
  summarize,
  tidy,
} from "../../mod.ts";

function smallNet() {
  return new Network("small", [1, 12, 12], 4, {
    conv1: new Conv2d(1, 6, 3, { padding: 1, weightFiller: { type: "gaussian", std: 0.1 } }),
    relu1: new ReLU(),
    pool1: new MaxPool2d({ kernel: 3, stride: 2 }),
    norm1: new LRN({ size: 3, alpha: 1e-3 }),
    conv2: new Conv2d(6, 8, 3, { padding: 1, groups: 2 }),
    relu2: new ReLU(),
    flatten: new Flatten(),
    fc1: new Linear(8 * 6 * 6, 32),
    drop1: new Dropout(0.5),
    fc2: new Linear(32, 4),
  }).initialize(3);
}

Deno.test("modules: dotted names, Caffe multipliers and default conv/fc groups", () => {
  const net = smallNet();
  const named = net.namedParameters();
  assert.deepEqual(named.map((p) => p.name), [
    "conv1.weight",
    "conv1.bias",
    "conv2.weight",
    "conv2.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
  ]);
  assert.deepEqual(named.map((p) => p.group), ["conv", "conv", "conv", "conv", "fc", "fc", "fc", "fc"]);
  assert.deepEqual(named.map((p) => [p.lrMult, p.decayMult]).slice(0, 2), [[1, 1], [2, 0]]);
  assert.deepEqual(named[2].tensor.shape, [8, 3, 3, 3]); // groups = 2 halves the input channels
  assert.equal(net.parameterCount(), 6 * 9 + 6 + 8 * 27 + 8 + 288 * 32 + 32 + 32 * 4 + 4);
  assert.deepEqual(net.parameterGroups(), ["conv", "fc"]);
  assert.equal(net.parameters("fc").length, 4);
});

Deno.test("modules: setGroup overrides a subtree; nested Sequential names nest", () => {
  const head = new Sequential({ fc: new Linear(4, 2) });
  const net = new Sequential({ body: new Sequential([new Conv2d(1, 2, 1)]), head });
  head.setGroup("head");
  assert.deepEqual(
    net.namedParameters().map((p) => `${p.name}:${p.group}`),
    ["body.0.weight:conv", "body.0.bias:conv", "head.fc.weight:head", "head.fc.bias:head"],
  );
  assert.throws(() => new Sequential({ again: head.children()[0][1] }), /already belongs/);
});

Deno.test("modules: initialisation is keyed by seed and name, not construction order", () => {
  const a = smallNet(), b = smallNet();
  for (const [pa, pb] of a.namedParameters().map((p, i) => [p, b.namedParameters()[i]])) {
    assert.deepEqual(pa.tensor.dataSync(), pb.tensor.dataSync(), pa.name);
  }
  const c = smallNet().initialize(4);
  assert.notDeepEqual(c.namedParameters()[0].tensor.dataSync(), a.namedParameters()[0].tensor.dataSync());
  // Biases use their constant filler; weights their own.
  assert.ok(a.namedParameters()[1].tensor.dataSync().every((v) => v === 0));
  const w = a.namedParameters()[0].tensor.dataSync() as Float32Array;
  const std = Math.sqrt(w.reduce((s, v) => s + v * v, 0) / w.length);
  assert.ok(std > 0.05 && std < 0.15, `conv1 std ${std}`);
});

Deno.test("modules: dropout depends on train/eval mode and on the forward context", () => {
  const net = smallNet();
  const x = randn([2, 1, 12, 12], { seed: 1 });
  const run = (context: { step?: number; sampleOffset?: number }) =>
    tidy(() => net.forward(x, context).dataSync());
  assert.deepEqual(run({ step: 1 }), run({ step: 1 }));
  assert.notDeepEqual(run({ step: 1 }), run({ step: 2 }));
  net.eval();
  assert.deepEqual(run({ step: 1 }), run({ step: 2 }));
  net.train();
  // A sample at global position 1 gets the same mask whether it comes second in a batch of 2 or
  // alone in a shard that starts at offset 1 (as on device 1 of 2).
  const whole = tidy(() => net.forward(x, { step: 5 }).dataSync());
  const shard = tidy(() =>
    net.forward(ops.slice(x, [1, 0, 0, 0], [1, 1, 12, 12]), { step: 5, sampleOffset: 1 }).dataSync()
  );
  const wrongOffset = tidy(() =>
    net.forward(ops.slice(x, [1, 0, 0, 0], [1, 1, 12, 12]), { step: 5 }).dataSync()
  );
  shard.forEach((v, i) =>
    assert.ok(Math.abs(v - whole[4 + i]) < 1e-6, `logit ${i}: ${v} vs ${whole[4 + i]}`)
  );
  assert.notDeepEqual([...wrongOffset], [...shard]);
});

Deno.test("modules: forward in tidy leaks nothing", () => {
  const net = smallNet();
  const x = randn([3, 1, 12, 12], { seed: 2 });
  const before = memory();
  for (let i = 0; i < 5; i++) tidy(() => void net.forward(x, { step: i }));
  assert.deepEqual(memory(), before);
});

Deno.test("summary: shapes, parameters, FLOPs and the conv/FC split", () => {
  const summary = summarize(smallNet(), [1, 12, 12]);
  const byName = Object.fromEntries(summary.rows.map((r) => [r.name, r]));
  assert.deepEqual(byName.pool1.outputShape, [1, 6, 6, 6]); // Caffe rounding: ceil((12-3)/2)+1 = 6
  assert.equal(byName.conv1.flops, 2 * 6 * 12 * 12 * 9 + 6 * 12 * 12);
  assert.equal(byName.fc1.flops, 2 * 288 * 32 + 32);
  assert.equal(byName.pool1.group, "conv"); // parameter-free layers join the preceding group
  assert.equal(byName.drop1.group, "fc");
  assert.equal(summary.groups.conv.parameters + summary.groups.fc.parameters, summary.parameters);
  assert.equal(summary.parameters, smallNet().parameterCount());
  const text = formatSummary(summary);
  assert.match(text, /conv1\s+Conv2d\s+\[6×12×12\]\s+60/);
  assert.match(text, /fc: 9,380 parameters \(97.1%\)/);
  assert.throws(() => summarize(smallNet(), [1, 10, 10]), ShapeError);
});
