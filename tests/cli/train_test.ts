import assert from "node:assert/strict";
import {
  Conv2d,
  DataLoader,
  Dropout,
  evaluate,
  fit,
  Linear,
  loadCheckpoint,
  MaxPool2d,
  memory,
  Network,
  ReLU,
  saveCheckpoint,
  SGD,
  splitDataset,
  syntheticDataset,
} from "../../mod.ts";

function makeNet(seed: number) {
  return new Network("tiny-cnn", [1, 26, 26], 4, {
    conv1: new Conv2d(1, 8, 3, { padding: 1, weightFiller: { type: "msra" } }),
    relu1: new ReLU(),
    pool1: new MaxPool2d({ kernel: 3, stride: 2 }),
    conv2: new Conv2d(8, 8, 3, { padding: 1, groups: 2, weightFiller: { type: "msra" } }),
    relu2: new ReLU(),
    pool2: new MaxPool2d({ kernel: 3, stride: 2 }),
    fc1: new Linear(8 * 6 * 6, 64),
    relu3: new ReLU(),
    drop: new Dropout(0.3),
    fc2: new Linear(64, 4),
  }).initialize(seed);
}

const data = splitDataset(
  syntheticDataset({ count: 600, classes: 4, channels: 1, height: 28, width: 28, seed: 11 }),
  { testCount: 200, seed: 1 },
);
const loaderOptions = { batchSize: 20, seed: 5, cropSize: 26, scale: 1 / 255 };

function paramBits(net: Network): Uint32Array[] {
  return net.namedParameters().map((p) =>
    new Uint32Array((p.tensor.dataSync() as Float32Array).slice().buffer)
  );
}

Deno.test("fit learns the synthetic task and evaluate measures it", async () => {
  const net = makeNet(1);
  const optimizer = new SGD(net.namedParameters(), { lr: 0.05, momentum: 0.9, weightDecay: 1e-4 });
  const train = new DataLoader(data.train, loaderOptions);
  const test = new DataLoader(data.test, { batchSize: 50, mode: "eval", cropSize: 26, scale: 1 / 255 });
  const before = await evaluate(net, test);
  const live = memory().tensors;
  const result = await fit(net, optimizer, train, { epochs: 8, seed: 3, test });
  assert.equal(memory().tensors, live, "fit leaked tensors");
  assert.equal(result.iteration, 8 * train.numBatches);
  assert.equal(result.history.length, 8 * train.numBatches);
  const firstLoss = result.history[0].loss, lastLoss = result.history.at(-1)!.loss;
  assert.ok(lastLoss < firstLoss * 0.5, `loss ${firstLoss} → ${lastLoss}`);
  assert.ok(before.accuracy < 0.5, `untrained accuracy ${before.accuracy}`);
  assert.ok(result.test!.accuracy >= 0.9, `test accuracy ${result.test!.accuracy}`);
  assert.equal(result.test!.count, 200);
});

Deno.test("resuming from a checkpoint continues bit for bit", async () => {
  // Mirroring too: the resumed run must replay the same crops, mirrors, shuffles and masks.
  const train = new DataLoader(data.train, { ...loaderOptions, mirror: true });
  const total = 2 * train.numBatches + 7; // crosses an epoch boundary after the resume point
  const interruptAt = train.numBatches + 3;

  const straight = makeNet(2);
  const straightOptimizer = new SGD(straight.namedParameters(), {
    lr: 0.02,
    momentum: 0.9,
    weightDecay: 5e-4,
  });
  await fit(straight, straightOptimizer, train, { steps: total, seed: 9 });

  const first = makeNet(2);
  const firstOptimizer = new SGD(first.namedParameters(), { lr: 0.02, momentum: 0.9, weightDecay: 5e-4 });
  await fit(first, firstOptimizer, train, { steps: interruptAt, seed: 9 });
  const dir = await Deno.makeTempDir();
  const path = `${dir}/tiny.safetensors`;
  await saveCheckpoint(path, {
    parameters: first.namedParameters(),
    optimizer: firstOptimizer,
    step: firstOptimizer.iteration,
    modelName: first.name,
  });

  // A fresh process would build the model from another seed and then load: nothing carries over.
  const resumed = makeNet(77);
  const resumedOptimizer = new SGD(resumed.namedParameters(), { lr: 0.02, momentum: 0.9, weightDecay: 5e-4 });
  const loaded = await loadCheckpoint(path, {
    parameters: resumed.namedParameters(),
    optimizer: resumedOptimizer,
    modelName: "tiny-cnn",
  });
  assert.equal(loaded.step, interruptAt);
  assert.equal(resumedOptimizer.iteration, interruptAt);
  await fit(resumed, resumedOptimizer, train, { steps: total, seed: 9 });

  const a = paramBits(straight), b = paramBits(resumed);
  a.forEach((bits, i) =>
    assert.deepEqual(b[i], bits, `parameter ${straight.namedParameters()[i].name} differs`)
  );
  await Deno.remove(dir, { recursive: true });
});
