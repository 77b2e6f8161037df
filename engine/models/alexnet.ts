/**
 * AlexNet as Caffe ships it (`models/bvlc_alexnet`) and its CaffeNet variant
 * (`models/bvlc_reference_caffenet`): layer names, groups, fillers and multipliers exactly as in
 * the prototxt files, so an imported Caffe net and the factory build the same parameters.
 *
 * @module
 */

import type { Filler } from "../nn/init.ts";
import { Conv2d, Dropout, Linear, LRN, MaxPool2d, ReLU } from "../nn/layers.ts";
import type { Module } from "../nn/module.ts";
import { Network } from "../nn/network.ts";
import { classesOf, type ModelOptions } from "./options.ts";

const gaussian = (std: number): Filler => ({ type: "gaussian", std });
const constant = (value: number): Filler => ({ type: "constant", value });

/** Per-layer bias values: the only fillers in which AlexNet and CaffeNet differ. */
interface BiasValues {
  conv2: number;
  conv4: number;
  conv5: number;
  fc6: number;
  fc7: number;
}

function layersOf(classes: number, bias: BiasValues, poolBeforeNorm: boolean): Record<string, Module> {
  const convWeights = gaussian(0.01);
  const lrn = () => new LRN({ size: 5, alpha: 1e-4, beta: 0.75 });
  const pool = () => new MaxPool2d({ kernel: 3, stride: 2 });
  // CaffeNet swaps pooling and normalisation in the first two blocks; both orders keep the same shapes.
  const block = (n: number): Record<string, Module> =>
    poolBeforeNorm
      ? { [`pool${n}`]: pool(), [`norm${n}`]: lrn() }
      : { [`norm${n}`]: lrn(), [`pool${n}`]: pool() };
  return {
    conv1: new Conv2d(3, 96, 11, { stride: 4, weightFiller: convWeights, biasFiller: constant(0) }),
    relu1: new ReLU(),
    ...block(1),
    conv2: new Conv2d(96, 256, 5, {
      padding: 2,
      groups: 2,
      weightFiller: convWeights,
      biasFiller: constant(bias.conv2),
    }),
    relu2: new ReLU(),
    ...block(2),
    conv3: new Conv2d(256, 384, 3, { padding: 1, weightFiller: convWeights, biasFiller: constant(0) }),
    relu3: new ReLU(),
    conv4: new Conv2d(384, 384, 3, {
      padding: 1,
      groups: 2,
      weightFiller: convWeights,
      biasFiller: constant(bias.conv4),
    }),
    relu4: new ReLU(),
    conv5: new Conv2d(384, 256, 3, {
      padding: 1,
      groups: 2,
      weightFiller: convWeights,
      biasFiller: constant(bias.conv5),
    }),
    relu5: new ReLU(),
    pool5: pool(),
    // Linear flattens its 256×6×6 input itself, as Caffe's InnerProduct does, so no Flatten layer.
    fc6: new Linear(256 * 6 * 6, 4096, { weightFiller: gaussian(0.005), biasFiller: constant(bias.fc6) }),
    relu6: new ReLU(),
    drop6: new Dropout(0.5),
    fc7: new Linear(4096, 4096, { weightFiller: gaussian(0.005), biasFiller: constant(bias.fc7) }),
    relu7: new ReLU(),
    drop7: new Dropout(0.5),
    fc8: new Linear(4096, classes, { weightFiller: gaussian(0.01), biasFiller: constant(0) }),
  };
}

/**
 * AlexNet as Caffe's `bvlc_alexnet` (train_val.prototxt): 227×227×3 input, conv1 96 11×11/4,
 * ReLU → LRN (5, 1e-4, 0.75) → 3×3/2 max pooling in blocks 1–2, groups of 2 in conv2/4/5,
 * fc6/fc7 4096 with dropout 0.5, fc8 `classes` (1000). Weights gaussian (σ 0.01 conv and fc8,
 * 0.005 fc6/fc7), biases 0 or 0.1 as in the file; weights lr×1 decay×1, biases lr×2 decay×0.
 * 60,965,224 parameters: conv 2,334,080, FC 58,631,144.
 *
 * @example
 * ```ts
 * import { alexnet } from "./alexnet.ts";
 * const net = alexnet({ seed: 1 });
 * console.log(net.parameterCount()); // 60965224
 * ```
 */
export function alexnet(options: ModelOptions = {}): Network {
  const classes = classesOf(options, 1000, "alexnet");
  const bias = { conv2: 0.1, conv4: 0.1, conv5: 0.1, fc6: 0.1, fc7: 0.1 };
  return new Network("alexnet", [3, 227, 227], classes, layersOf(classes, bias, false)).initialize(
    options.seed ?? 0,
  );
}

/**
 * CaffeNet (`bvlc_reference_caffenet`): AlexNet with pooling before normalisation in blocks 1 and 2
 * and biases of 1 in conv2/4/5 and fc6/fc7 (the values of BVLC's published train_val.prototxt).
 * Same shapes and parameter count as {@link alexnet}.
 *
 * @example
 * ```ts
 * import { caffenet } from "./alexnet.ts";
 * const net = caffenet({ classes: 100 });
 * ```
 */
export function caffenet(options: ModelOptions = {}): Network {
  const classes = classesOf(options, 1000, "caffenet");
  const bias = { conv2: 1, conv4: 1, conv5: 1, fc6: 1, fc7: 1 };
  return new Network("caffenet", [3, 227, 227], classes, layersOf(classes, bias, true)).initialize(
    options.seed ?? 0,
  );
}
