/**
 * Layers and networks: the {@link Module} base class, Caffe's layer set (convolution, inner product,
 * pooling, LRN, ReLU, dropout), {@link Sequential} containers, the {@link Network} that names a
 * model's parameter groups, weight fillers, and per-layer summaries (shapes, parameters, FLOPs).
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { Conv2d, Flatten, formatSummary, Linear, MaxPool2d, Network, ReLU, summarize } from "./mod.ts";
 *
 * const net = new Network("tiny", [1, 28, 28], 10, {
 *   conv1: new Conv2d(1, 8, 5),
 *   relu1: new ReLU(),
 *   pool1: new MaxPool2d({ kernel: 2, stride: 2 }),
 *   flatten: new Flatten(),
 *   fc: new Linear(8 * 12 * 12, 10),
 * });
 * net.initialize(1);
 * console.log(formatSummary(summarize(net, [1, 28, 28])));
 * ```
 *
 * @module
 */

export { type ForwardContext, type LayerDescription, Module, type ParameterOptions } from "./module.ts";
export type { BufferEntry, ParameterEntry } from "./parameter.ts";
export { BatchNorm, type BatchNormOptions } from "./batch_norm.ts";
export { Concat, Eltwise, type EltwiseOperation, JoinModule } from "./join.ts";
export { Scale, type ScaleOptions } from "./scale.ts";
export { WithinChannelLRN } from "./lrn_within_channel.ts";
export {
  AvgPool2d,
  Conv2d,
  type Conv2dLayerOptions,
  Dropout,
  Flatten,
  Linear,
  LRN,
  MaxPool2d,
  type Multipliers,
  Pool2dLayer,
  type PoolLayerOptions,
  ReLU,
  Sequential,
  type SequentialLayers,
  type WeightedLayerOptions,
} from "./layers.ts";
// What the layers' fused forwards take (`forwardFused`), also under `ops`.
export type { Conv2dFusion, LinearOptions, Pool2dOptions } from "../ops/mod.ts";
export { type LossOptions, Network } from "./network.ts";
export { Graph, type GraphLoss, type GraphNode, type GraphSpec } from "./graph.ts";
export { type Filler, fillerValues, type VarianceNorm, withoutFillers } from "./init.ts";
export {
  formatSummary,
  type GroupTotals,
  type NetworkSummary,
  summarize,
  type SummaryRow,
} from "./summary.ts";
