/**
 * The default model of the CLI: AlexNet's shape — ReLU, overlapping 3×3/2 max pooling, grouped
 * convolution, two wide dropout FC layers — scaled down to 28×28 grey images so it trains on a
 * 2-core CPU in minutes, while keeping AlexNet's split: most FLOPs in the convolutions, most
 * parameters in the FC layers. That split is what makes overlapping the FC gradient exchange with
 * the conv backward pay off in data-parallel training.
 *
 * @module
 */

import { ValueError } from "../errors.ts";
import type { Filler } from "../nn/init.ts";
import { Conv2d, Dropout, Linear, MaxPool2d, ReLU } from "../nn/layers.ts";
import type { Module } from "../nn/module.ts";
import { Network } from "../nn/network.ts";
import { classesOf, type ModelOptions } from "./options.ts";

/**
 * Options of {@link alexnetLike}.
 *
 * @example
 * ```ts
 * import type { AlexnetLikeOptions } from "./alexnet_like.ts";
 * const cifar: AlexnetLikeOptions = { inputShape: [3, 32, 32], classes: 10 };
 * ```
 */
export interface AlexnetLikeOptions extends ModelOptions {
  /** Per-sample input `[channels, height, width]` (default `[1, 28, 28]`, MNIST-like). */
  inputShape?: readonly [number, number, number];
  /** Width of fc6 and fc7 (default 768). */
  hidden?: number;
}

/**
 * A small AlexNet for 28×28 grey images (10 classes by default):
 *
 * conv1 32 5×5 pad 2 → relu1 → pool1 3×3/2 (→14×14) → conv2 64 3×3 pad 1, groups 2 → relu2 →
 * pool2 3×3/2 (→7×7) → conv3 64 3×3 pad 1 → relu3 → pool3 3×3/2 (→3×3) → fc6 768 → relu6 →
 * drop6 0.5 → fc7 768 → relu7 → drop7 0.5 → fc8 `classes`.
 *
 * At 28×28: 1,088,458 parameters (FC 95.7%) and 10.7 MFLOP per sample forward (conv 80.6%).
 * Xavier weights (Caffe's MNIST choice; AlexNet's σ 0.01/0.005 gaussians start too slowly for a
 * few-epoch run) except fc8, which keeps AlexNet's gaussian σ 0.01; zero biases. LRN is left out: it
 * costs time and gains nothing on digits. Trained with SGD (momentum 0.9, lr 0.01 halved each
 * epoch, weight decay 5e-4, batch 32) on 7,996 of the 10,000 digits in the `mnist` package, it
 * reaches 97.6–97.9% on the other 2,004 after 3 epochs (≈ 3.3 min on the 2-core CPU backend).
 *
 * @example
 * ```ts
 * import { alexnetLike } from "./alexnet_like.ts";
 * const net = alexnetLike({ seed: 3 });
 * console.log(net.inputShape, net.classes); // [1, 28, 28] 10
 * ```
 */
export function alexnetLike(options: AlexnetLikeOptions = {}): Network {
  const classes = classesOf(options, 10, "alexnetLike");
  const [channels, height, width] = options.inputShape ?? [1, 28, 28];
  const hidden = options.hidden ?? 768;
  for (
    const [what, n] of [["inputShape", channels], ["inputShape", height], ["inputShape", width], [
      "hidden",
      hidden,
    ]] as const
  ) {
    if (!Number.isInteger(n) || n < 1) {
      throw new ValueError("alexnetLike", `${what} must hold positive integers, got ${n}`);
    }
  }
  const xavier: Filler = { type: "xavier" };
  const zero: Filler = { type: "constant", value: 0 };
  const fillers = { weightFiller: xavier, biasFiller: zero };
  const features: Record<string, Module> = {
    conv1: new Conv2d(channels, 32, 5, { padding: 2, ...fillers }),
    relu1: new ReLU(),
    pool1: new MaxPool2d({ kernel: 3, stride: 2 }),
    conv2: new Conv2d(32, 64, 3, { padding: 1, groups: 2, ...fillers }),
    relu2: new ReLU(),
    pool2: new MaxPool2d({ kernel: 3, stride: 2 }),
    conv3: new Conv2d(64, 64, 3, { padding: 1, ...fillers }),
    relu3: new ReLU(),
    pool3: new MaxPool2d({ kernel: 3, stride: 2 }),
  };
  // fc6's width follows from the input size, so other image sizes work without edits.
  let shape: readonly number[] = [1, channels, height, width];
  for (const layer of Object.values(features)) shape = layer.describe(shape).outputShape;
  const flat = shape.slice(1).reduce((a, b) => a * b, 1);
  return new Network("alexnet-like", [channels, height, width], classes, {
    ...features,
    fc6: new Linear(flat, hidden, fillers),
    relu6: new ReLU(),
    drop6: new Dropout(0.5),
    fc7: new Linear(hidden, hidden, fillers),
    relu7: new ReLU(),
    drop7: new Dropout(0.5),
    // AlexNet's fc8 filler: small logits start every class near 1/classes.
    fc8: new Linear(hidden, classes, { weightFiller: { type: "gaussian", std: 0.01 }, biasFiller: zero }),
  }).initialize(options.seed ?? 0);
}
