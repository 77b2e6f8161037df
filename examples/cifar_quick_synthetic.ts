/**
 * Trains Caffe's cifar10_quick on a synthetic 10-class 32×32 colour set with learnable class
 * structure, on one CPU device, and reports held-out accuracy.
 *
 * Run: `npx deno run -A examples/cifar_quick_synthetic.ts [epochs] [lr]` (5 epochs ≈ 2 minutes on 2 cores).
 *
 * @module
 */

import { cifarQuick, DataLoader, fit, SGD, splitDataset, syntheticDataset } from "../mod.ts";
import { channelMean } from "../engine/data/mod.ts";

const epochs = Number(Deno.args[0] ?? 5);
const data = syntheticDataset({ count: 3000, classes: 10, channels: 3, height: 32, width: 32, seed: 7 });
const { train, test } = splitDataset(data, { testCount: 1000, seed: 1 });
// Caffe's cifar10 transform: per-channel mean subtracted (from the training images), no scaling.
const meanValue = channelMean(train);
const lr = Number(Deno.args[1] ?? 0.01);
const trainLoader = new DataLoader(train, { batchSize: 64, seed: 1, meanValue, scale: 1 / 64 });
const testLoader = new DataLoader(test, { batchSize: 100, mode: "eval", meanValue, scale: 1 / 64 });
const model = cifarQuick({ seed: 0 });
// Caffe's cifar10_quick_solver (momentum 0.9, weight decay 0.004) with a larger rate, since this
// runs a few hundred iterations instead of 4,000.
const optimizer = new SGD(model.namedParameters(), { lr, momentum: 0.9, weightDecay: 0.004 });

const started = performance.now();
const result = await fit(model, optimizer, trainLoader, {
  epochs,
  seed: 1,
  test: testLoader,
  onStep: (info) => {
    if (info.iteration % 10 === 0) {
      console.log(`epoch ${info.epoch + 1}  step ${info.iteration}  loss ${info.loss.toFixed(4)}`);
    }
  },
});
const seconds = (performance.now() - started) / 1000;
console.log(
  `cifar10_quick on ${train.count} synthetic images, ${epochs} epochs in ${seconds.toFixed(0)} s ` +
    `(${(result.history.length * 64 / seconds).toFixed(0)} images/s): held-out accuracy ${
      (result.test!.accuracy * 100).toFixed(2)
    }% on ${result.test!.count} images`,
);
