/**
 * The layers of AlexNet-family networks, each a thin `Module` over an op, with Caffe's defaults:
 * weights learn at the base rate with weight decay, biases at twice the rate without decay.
 *
 * @module
 */

import type { Pair } from "../../backends/geometry.ts";
import { conv2dGeometry, pool2dGeometry } from "../../backends/geometry.ts";
import { ShapeError } from "../errors.ts";
import * as ops from "../ops/mod.ts";
import type { Tensor } from "../tensor.ts";
import type { Filler } from "./init.ts";
import { type ForwardContext, type LayerDescription, Module, type ParameterOptions } from "./module.ts";
import { streamOf } from "./init.ts";
import { formatShape } from "../errors.ts";

/** Learning-rate and decay multipliers of one parameter. */
export interface Multipliers {
  /** Learning-rate multiplier (Caffe `lr_mult`). */
  lrMult?: number;
  /** Weight-decay multiplier (Caffe `decay_mult`). */
  decayMult?: number;
}

/** Options shared by layers with a weight and a bias. */
export interface WeightedLayerOptions {
  /** Add a bias (default true). */
  bias?: boolean;
  /** Weight initialiser (default xavier, Caffe's usual choice). */
  weightFiller?: Filler;
  /** Bias initialiser (default constant 0). */
  biasFiller?: Filler;
  /** Weight multipliers (default lr ×1, decay ×1). */
  weightMultipliers?: Multipliers;
  /** Bias multipliers (default lr ×2, decay ×0, as in Caffe's reference nets). */
  biasMultipliers?: Multipliers;
  /** Parameter group (default `conv` for convolutions, `fc` for linear layers). */
  group?: string;
}

function parameterOptions(
  filler: Filler | undefined,
  multipliers: Multipliers | undefined,
  defaults: Required<Multipliers>,
  fallback: Filler,
  group: string | undefined,
): ParameterOptions {
  return {
    filler: filler ?? fallback,
    lrMult: multipliers?.lrMult ?? defaults.lrMult,
    decayMult: multipliers?.decayMult ?? defaults.decayMult,
    group,
  };
}

const WEIGHT_DEFAULTS = { lrMult: 1, decayMult: 1 };
const BIAS_DEFAULTS = { lrMult: 2, decayMult: 0 };

/** Description of a shape-preserving layer costing `flopsPerElement` per element of a sample. */
function elementwise(inputShape: readonly number[], flopsPerElement: number): LayerDescription {
  return {
    outputShape: [...inputShape],
    flops: flopsPerElement * inputShape.slice(1).reduce((a, b) => a * b, 1),
  };
}

function pairOf(value: Pair): [number, number] {
  return typeof value === "number" ? [value, value] : [value[0], value[1]];
}

/** Options of {@link Conv2d}. */
export interface Conv2dLayerOptions extends WeightedLayerOptions {
  /** Step between windows (default 1 for convolutions, the kernel for pooling). */
  stride?: Pair;
  /** Zero padding on each side (default 0). */
  padding?: Pair;
  /** Channel groups (default 1; AlexNet conv2/4/5 use 2). */
  groups?: number;
}

/**
 * 2-D convolution layer (Caffe `Convolution`, PyTorch `nn.Conv2d`).
 *
 * @example
 * ```ts
 * import { Conv2d } from "./layers.ts";
 * const conv2 = new Conv2d(96, 256, 5, { padding: 2, groups: 2, weightFiller: { type: "gaussian", std: 0.01 } });
 * ```
 */
export class Conv2d extends Module {
  /** Layer type. */
  readonly kind = "Conv2d";
  /** Default parameter group of this layer type. */
  override readonly defaultGroup = "conv";
  /** `[outChannels, inChannels/groups, kh, kw]`. */
  readonly weight: Tensor;
  /** `[outChannels]`, or null without bias. */
  readonly bias: Tensor | null;
  /** Stride, padding and groups as given. */
  readonly options: { stride: Pair; padding: Pair; groups: number };

  /** Creates the layer; parameters stay zero until `initialize(seed)`. */
  constructor(
    readonly inChannels: number,
    readonly outChannels: number,
    kernel: Pair,
    options: Conv2dLayerOptions = {},
  ) {
    super();
    const groups = options.groups ?? 1;
    const [kh, kw] = pairOf(kernel);
    if (!Number.isInteger(groups) || groups < 1 || inChannels % groups || outChannels % groups) {
      throw new ShapeError(
        "Conv2d",
        `groups ${groups} must divide inChannels ${inChannels} and outChannels ${outChannels}`,
      );
    }
    this.options = { stride: options.stride ?? 1, padding: options.padding ?? 0, groups };
    this.weight = this.addParameter(
      "weight",
      [outChannels, inChannels / groups, kh, kw],
      parameterOptions(
        options.weightFiller,
        options.weightMultipliers,
        WEIGHT_DEFAULTS,
        { type: "xavier" },
        options.group,
      ),
    );
    this.bias = options.bias === false ? null : this.addParameter(
      "bias",
      [outChannels],
      parameterOptions(options.biasFiller, options.biasMultipliers, BIAS_DEFAULTS, {
        type: "constant",
        value: 0,
      }, options.group),
    );
  }

  /** Applies the layer to a batch. */
  forward(x: Tensor): Tensor {
    return ops.conv2d(x, this.weight, this.bias, this.options);
  }

  /**
   * The layer and what follows it in one op ({@link ops.Conv2dFusion}: a ReLU in the convolution's
   * epilogue, then max pooling), with the bits of the separate layers: what {@link fusedRun} runs.
   */
  forwardFused(x: Tensor, fusion: ops.Conv2dFusion): Tensor {
    return ops.conv2d(x, this.weight, this.bias, { ...this.options, ...fusion });
  }

  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    const g = conv2dGeometry(inputShape, this.weight.shape, this.options);
    const outputs = g.outChannels * g.outHeight * g.outWidth;
    const macs = outputs * (g.inChannels / g.groups) * g.kernelH * g.kernelW;
    return {
      outputShape: [g.batch, g.outChannels, g.outHeight, g.outWidth],
      flops: 2 * macs + (this.bias ? outputs : 0),
    };
  }
}

/**
 * Fully-connected layer `x·Wᵀ + b` (Caffe `InnerProduct`, PyTorch `nn.Linear`); inputs of rank > 2
 * are flattened after the batch axis, as Caffe does.
 *
 * @example
 * ```ts
 * import { Linear } from "./layers.ts";
 * const fc6 = new Linear(9216, 4096, { weightFiller: { type: "gaussian", std: 0.005 } });
 * ```
 */
export class Linear extends Module {
  /** Layer type. */
  readonly kind = "Linear";
  /** Default parameter group of this layer type. */
  override readonly defaultGroup = "fc";
  /** `[outFeatures, inFeatures]`. */
  readonly weight: Tensor;
  /** `[outFeatures]`, or null without bias. */
  readonly bias: Tensor | null;

  /** Creates the layer; parameters stay zero until `initialize(seed)`. */
  constructor(readonly inFeatures: number, readonly outFeatures: number, options: WeightedLayerOptions = {}) {
    super();
    this.weight = this.addParameter(
      "weight",
      [outFeatures, inFeatures],
      parameterOptions(
        options.weightFiller,
        options.weightMultipliers,
        WEIGHT_DEFAULTS,
        { type: "xavier" },
        options.group,
      ),
    );
    this.bias = options.bias === false ? null : this.addParameter(
      "bias",
      [outFeatures],
      parameterOptions(options.biasFiller, options.biasMultipliers, BIAS_DEFAULTS, {
        type: "constant",
        value: 0,
      }, options.group),
    );
  }

  /** Applies the layer to a batch. */
  forward(x: Tensor): Tensor {
    return this.forwardFused(x, {});
  }

  /**
   * The layer and a ReLU after it in one op (the ReLU in the product's epilogue), with the bits
   * of the two layers: what {@link fusedRun} runs.
   */
  forwardFused(x: Tensor, options: ops.LinearOptions): Tensor {
    if (x.rank === 2) return ops.linear(x, this.weight, this.bias, options);
    const flat = ops.flatten(x, 1);
    const out = ops.linear(flat, this.weight, this.bias, options);
    flat.dispose();
    return out;
  }

  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    const features = inputShape.slice(1).reduce((a, b) => a * b, 1);
    if (features !== this.inFeatures) {
      throw new ShapeError(
        `Linear ${this.path || ""}`.trim(),
        `input ${formatShape(inputShape)} has ${features} features per sample, expected ${this.inFeatures}`,
      );
    }
    return {
      outputShape: [inputShape[0], this.outFeatures],
      flops: 2 * this.inFeatures * this.outFeatures + (this.bias ? this.outFeatures : 0),
    };
  }
}

/** Options of the pooling layers. */
export interface PoolLayerOptions {
  /** Window size. */
  kernel: Pair;
  /** Step between windows (default 1 for convolutions, the kernel for pooling). */
  stride?: Pair;
  /** Zero padding on each side (default 0). */
  padding?: Pair;
}

/** Shared shape and cost description of the pooling layers. */
export abstract class Pool2dLayer extends Module {
  /** A pooling layer with the given window. */
  constructor(readonly options: PoolLayerOptions) {
    super();
  }
  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    const g = pool2dGeometry(inputShape, this.options, this.kind);
    const outputs = g.channels * g.outHeight * g.outWidth;
    return {
      outputShape: [g.batch, g.channels, g.outHeight, g.outWidth],
      flops: outputs * g.kernelH * g.kernelW,
    };
  }
}

/**
 * Max pooling (Caffe `Pooling` MAX, with Caffe's rounded-up output size).
 *
 * @example
 * ```ts
 * import { MaxPool2d } from "./layers.ts";
 * const pool1 = new MaxPool2d({ kernel: 3, stride: 2 });
 * ```
 */
export class MaxPool2d extends Pool2dLayer {
  /** Layer type. */
  readonly kind = "MaxPool2d";
  /** Applies the layer to a batch. */
  forward(x: Tensor): Tensor {
    return ops.maxPool2d(x, this.options);
  }
}

/**
 * Average pooling (Caffe `Pooling` AVE: rounded-up output size, divisor counts padding).
 *
 * @example
 * ```ts
 * import { AvgPool2d } from "./layers.ts";
 * const pool2 = new AvgPool2d({ kernel: 3, stride: 2 });
 * ```
 */
export class AvgPool2d extends Pool2dLayer {
  /** Layer type. */
  readonly kind = "AvgPool2d";
  /** Applies the layer to a batch. */
  forward(x: Tensor): Tensor {
    return ops.avgPool2d(x, this.options);
  }
}

/**
 * Local response normalisation across channels (Caffe `LRN`).
 *
 * @example
 * ```ts
 * import { LRN } from "./layers.ts";
 * const norm1 = new LRN({ size: 5, alpha: 1e-4, beta: 0.75 });
 * ```
 */
export class LRN extends Module {
  /** Layer type. */
  readonly kind = "LRN";
  /** Window size, alpha, beta and k (Caffe defaults 5, 1, 0.75, 1 where omitted). */
  readonly params: { size: number; alpha: number; beta: number; k: number };
  /** An LRN layer; omitted parameters take Caffe's defaults. */
  constructor(params: { size?: number; alpha?: number; beta?: number; k?: number } = {}) {
    super();
    this.params = {
      size: params.size ?? 5,
      alpha: params.alpha ?? 1,
      beta: params.beta ?? 0.75,
      k: params.k ?? 1,
    };
  }
  /** Applies the layer to a batch. */
  forward(x: Tensor): Tensor {
    return ops.lrn(x, this.params);
  }
  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    // Running window sum of squares, scale, power and product per element.
    return elementwise(inputShape, 6);
  }
}

/**
 * Rectified linear unit.
 *
 * @example
 * ```ts
 * import { ReLU } from "./layers.ts";
 * const relu1 = new ReLU();
 * ```
 */
export class ReLU extends Module {
  /** Layer type. */
  readonly kind = "ReLU";
  /** Applies the layer to a batch. */
  forward(x: Tensor): Tensor {
    return ops.relu(x);
  }
  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    return elementwise(inputShape, 1);
  }
}

/**
 * Inverted dropout, active in training mode only. Masks are keyed by (run seed, step, this
 * layer's dotted path, global sample index), so data-parallel shards draw exactly the masks the
 * whole batch would on one device.
 *
 * @example
 * ```ts
 * import { Dropout } from "./layers.ts";
 * const drop6 = new Dropout(0.5);
 * ```
 */
export class Dropout extends Module {
  /** Layer type. */
  readonly kind = "Dropout";
  /** A dropout layer zeroing each element with probability `p`. */
  constructor(readonly p = 0.5) {
    super();
  }
  /** Applies the layer to a batch. */
  forward(x: Tensor, context: ForwardContext = {}): Tensor {
    const perSample = x.rank > 0 ? x.size / x.shape[0] : 1;
    return ops.dropout(x, {
      p: this.p,
      training: this.training,
      seed: context.seed ?? 0,
      stream: streamOf(this.path),
      step: context.step ?? 0,
      offset: (context.sampleOffset ?? 0) * perSample,
    });
  }
  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    return elementwise(inputShape, 1);
  }
}

/**
 * Flattens every axis from `startAxis` on (default 1: keep the batch axis).
 *
 * @example
 * ```ts
 * import { Flatten } from "./layers.ts";
 * const flatten = new Flatten();
 * ```
 */
export class Flatten extends Module {
  /** Layer type. */
  readonly kind = "Flatten";
  /** A layer flattening every axis from `startAxis` on. */
  constructor(readonly startAxis = 1) {
    super();
  }
  /** Applies the layer to a batch. */
  forward(x: Tensor): Tensor {
    return ops.flatten(x, this.startAxis);
  }
  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    const start = this.startAxis < 0 ? this.startAxis + inputShape.length : this.startAxis;
    const merged = inputShape.slice(start).reduce((a, b) => a * b, 1);
    return { outputShape: [...inputShape.slice(0, start), merged], flops: 0 };
  }
}

/**
 * Layers for a {@link Sequential}: an object of named layers, `[name, layer]` pairs or a `Map` (which
 * keep any order, numeric-looking names included), or a plain array (named `0`, `1`, …).
 */
export type SequentialLayers =
  | Record<string, Module>
  | ReadonlyMap<string, Module>
  | readonly (readonly [string, Module])[]
  | readonly Module[];

function namedLayers(layers: SequentialLayers): (readonly [string, Module])[] {
  if (layers instanceof Map) return [...layers];
  if (Array.isArray(layers)) {
    return (layers as readonly (Module | readonly [string, Module])[]).map((item, i) =>
      item instanceof Module ? [String(i), item] as const : item
    );
  }
  return Object.entries(layers as Record<string, Module>);
}

/** Layers that run as one op ({@link fusedRun}). */
export interface FusedRun {
  /** How many layers the op stands for, the first included (2 or 3). */
  readonly length: number;
  /** Applies the op to a batch. */
  forward(x: Tensor): Tensor;
}

/**
 * The layers at the start of `layers` that run as one op, with the bits of running them one by
 * one, or undefined when the first runs alone: a Conv2d or a Linear followed by a ReLU (the ReLU in
 * the layer's epilogue), and a Conv2d, a ReLU and a MaxPool2d (the pooling in the same op, the
 * unpooled output dropped once pooled, the ReLU's mask applied to the pooled gradient), or a
 * Conv2d, a MaxPool2d and a ReLU (the same op: ReLU and max commute). Exact
 * classes only, since a subclass may change what a layer computes. `Sequential`, Caffe-style graphs
 * and the hybrid's sharded head all ask here.
 *
 * @example
 * ```ts
 * import { Conv2d, fusedRun, Linear, MaxPool2d, ReLU } from "./layers.ts";
 * fusedRun([new Conv2d(3, 8, 3), new ReLU(), new MaxPool2d({ kernel: 2 })])?.length; // 3
 * fusedRun([new Conv2d(3, 8, 3), new MaxPool2d({ kernel: 2 }), new ReLU()])?.length; // 3
 * fusedRun([new Linear(8, 4), new ReLU()])?.length; // 2
 * fusedRun([new Linear(8, 4)]); // undefined
 * ```
 */
export function fusedRun(layers: readonly (Module | undefined)[]): FusedRun | undefined {
  const [layer, next, after] = layers;
  if (layer?.constructor === Conv2d && next?.constructor === MaxPool2d && after?.constructor === ReLU) {
    // The ReLU after the pooling (cifar10_quick's conv1) runs before it: ReLU and max commute, so
    // the pooled values are the same, and so are the winners wherever the mask passes a gradient.
    const maxPool = (next as MaxPool2d).options;
    return { length: 3, forward: (x) => (layer as Conv2d).forwardFused(x, { activation: "relu", maxPool }) };
  }
  if (next?.constructor !== ReLU) return undefined;
  if (layer?.constructor === Linear) {
    const linear = layer as Linear;
    return { length: 2, forward: (x) => linear.forwardFused(x, { activation: "relu" }) };
  }
  if (layer?.constructor !== Conv2d) return undefined;
  const conv = layer as Conv2d;
  if (after?.constructor === MaxPool2d) {
    const maxPool = (after as MaxPool2d).options;
    return { length: 3, forward: (x) => conv.forwardFused(x, { activation: "relu", maxPool }) };
  }
  return { length: 2, forward: (x) => conv.forwardFused(x, { activation: "relu" }) };
}

/**
 * Applies `layers` to a batch in order, each run that {@link fusedRun} finds as one op: what
 * {@link Sequential.forward} does, for any slice of a network's layers (a hybrid schedule's body).
 * Intermediate outputs are disposed (the graph keeps what backward needs); `x` is not.
 *
 * @example
 * ```ts
 * import { Conv2d, forwardLayers, MaxPool2d, ReLU } from "./layers.ts";
 * import { zeros } from "../creation.ts";
 * const y = forwardLayers([new Conv2d(1, 4, 3), new ReLU(), new MaxPool2d({ kernel: 2 })], zeros([2, 1, 8, 8]));
 * console.log(y.shape); // [2, 4, 3, 3]
 * ```
 */
export function forwardLayers(layers: readonly Module[], x: Tensor, context?: ForwardContext): Tensor {
  let h = x;
  for (let i = 0; i < layers.length; i++) {
    const fused = fusedRun(layers.slice(i, i + 3));
    const next = fused ? fused.forward(h) : layers[i].forward(h, context);
    if (fused) i += fused.length - 1;
    if (h !== x) h.dispose(); // the graph keeps what backward needs
    h = next;
  }
  return h;
}

/**
 * Layers applied in order. Named layers (an object) give dotted parameter names like
 * `conv2.weight`; an array names them `0`, `1`, ….
 *
 * @example
 * ```ts
 * import { Conv2d, Flatten, Linear, ReLU, Sequential } from "./layers.ts";
 * const net = new Sequential({ conv1: new Conv2d(1, 8, 3), relu1: new ReLU(), flat: new Flatten(), fc: new Linear(8 * 26 * 26, 10) });
 * ```
 */
export class Sequential extends Module {
  /** Layer type. */
  readonly kind: string = "Sequential";
  /** Creates the layers' container; names come from the object keys, the pairs, or positions. */
  constructor(layers: SequentialLayers) {
    super();
    for (const [name, layer] of namedLayers(layers)) this.addModule(name, layer);
  }

  /** The layers in order. */
  layers(): [string, Module][] {
    return this.children();
  }

  /**
   * Applies the layers to a batch in order. A {@link Conv2d} or {@link Linear} directly followed by
   * a {@link ReLU}, and a Conv2d, ReLU and {@link MaxPool2d} (in either order after the Conv2d),
   * run as one op ({@link fusedRun}): the
   * same bits, fewer passes over the outputs and fewer intermediate tensors.
   */
  forward(x: Tensor, context?: ForwardContext): Tensor {
    return forwardLayers(this.children().map(([, module]) => module), x, context);
  }

  /** Output shape and per-sample forward FLOPs for an input shape. */
  describe(inputShape: readonly number[]): LayerDescription {
    let shape = [...inputShape];
    let flops = 0;
    for (const [, layer] of this.children()) {
      const d = layer.describe(shape);
      shape = d.outputShape;
      flops += d.flops;
    }
    return { outputShape: shape, flops };
  }
}
