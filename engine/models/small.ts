/**
 * Caffe's two small reference nets: `cifar10_quick` and the MNIST LeNet. Their prototxt files give
 * each parameter block only `lr_mult`, so Caffe's default `decay_mult: 1` applies to biases too —
 * reproduced here rather than Tandem's usual bias decay ×0.
 *
 * @module
 */

import type { Filler } from "../nn/init.ts";
import { AvgPool2d, Conv2d, Linear, MaxPool2d, ReLU } from "../nn/layers.ts";
import { Network } from "../nn/network.ts";
import { classesOf, type ModelOptions } from "./options.ts";

const gaussian = (std: number): Filler => ({ type: "gaussian", std });
const zero: Filler = { type: "constant", value: 0 };
const xavier: Filler = { type: "xavier" };
/** `param { lr_mult: 2 }` with decay_mult left at Caffe's default of 1. */
const biasMultipliers = { lrMult: 2, decayMult: 1 };

/**
 * Caffe's `cifar10_quick`: 32×32×3 input; conv 5×5 pad 2 with 32, 32, 64 filters, each followed by
 * 3×3/2 pooling (MAX, then AVE, AVE) and ReLU (after pool1, before pool2/pool3, as in the file);
 * ip1 64, ip2 `classes` (10). Fillers as in the file (conv1 σ 1e-4, conv2/3 σ 0.01, ip σ 0.1).
 * 145,578 parameters: conv 79,328, FC 66,250.
 *
 * @example
 * ```ts
 * import { cifarQuick } from "./small.ts";
 * console.log(cifarQuick().parameterCount()); // 145578
 * ```
 */
export function cifarQuick(options: ModelOptions = {}): Network {
  const classes = classesOf(options, 10, "cifarQuick");
  const conv = (inC: number, outC: number, std: number) =>
    new Conv2d(inC, outC, 5, { padding: 2, weightFiller: gaussian(std), biasFiller: zero, biasMultipliers });
  const fc = (inF: number, outF: number) =>
    new Linear(inF, outF, { weightFiller: gaussian(0.1), biasFiller: zero, biasMultipliers });
  return new Network("cifar-quick", [3, 32, 32], classes, {
    conv1: conv(3, 32, 1e-4),
    pool1: new MaxPool2d({ kernel: 3, stride: 2 }),
    relu1: new ReLU(),
    conv2: conv(32, 32, 0.01),
    relu2: new ReLU(),
    pool2: new AvgPool2d({ kernel: 3, stride: 2 }),
    conv3: conv(32, 64, 0.01),
    relu3: new ReLU(),
    pool3: new AvgPool2d({ kernel: 3, stride: 2 }),
    ip1: fc(64 * 4 * 4, 64),
    ip2: fc(64, classes),
  }).initialize(options.seed ?? 0);
}

/**
 * Caffe's MNIST LeNet (`examples/mnist/lenet_train_test.prototxt`): 28×28×1 input, conv1 20 5×5,
 * 2×2/2 max pooling, conv2 50 5×5, pooling, ip1 500, ReLU, ip2 `classes` (10); xavier weights,
 * zero biases. 431,080 parameters.
 *
 * @example
 * ```ts
 * import { lenet } from "./small.ts";
 * console.log(lenet().parameterCount()); // 431080
 * ```
 */
export function lenet(options: ModelOptions = {}): Network {
  const classes = classesOf(options, 10, "lenet");
  const common = { weightFiller: xavier, biasFiller: zero, biasMultipliers };
  return new Network("lenet", [1, 28, 28], classes, {
    conv1: new Conv2d(1, 20, 5, common),
    pool1: new MaxPool2d({ kernel: 2, stride: 2 }),
    conv2: new Conv2d(20, 50, 5, common),
    pool2: new MaxPool2d({ kernel: 2, stride: 2 }),
    ip1: new Linear(50 * 4 * 4, 500, common),
    relu1: new ReLU(),
    ip2: new Linear(500, classes, common),
  }).initialize(options.seed ?? 0);
}
