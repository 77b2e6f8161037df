/**
 * The engine: tensors, autograd, memory scopes and ops, independent of any concrete backend.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "./mod.ts";
 * ```
 *
 * @module
 */

export { Tensor } from "./tensor.ts";
export {
  type CreationOptions,
  fromStorage,
  full,
  type NestedArray,
  ones,
  randn,
  type RandomOptions,
  scalar,
  tensor,
  type TensorOptions,
  uniform,
  zeros,
} from "./creation.ts";
export { manualSeed, normalValues, philox4x32, type RandomKey, uniformValues } from "./random.ts";
export {
  type BackwardFn,
  type BackwardOptions,
  BackwardPass,
  backwardPass,
  GradNode,
  valueAndGrad,
} from "./autograd.ts";
export {
  getBackend,
  memory,
  type MemoryInfo,
  noGrad,
  registerBackend,
  type ScopedResource,
  setBackend,
  tidy,
} from "./context.ts";
export {
  DisposedError,
  editDistance,
  NonFiniteError,
  ShapeError,
  TandemError,
  ValueError,
} from "./errors.ts";
export * as ops from "./ops/mod.ts";
export { findNonFinite, firstNonFinite, type NonFiniteValue } from "./finite.ts";
export {
  Adam,
  type AdamHyper,
  type AdamOptions,
  checkLrPolicy,
  disposeOptimizerState,
  type HyperBase,
  learningRate,
  type LrPolicy,
  Optimizer,
  type OptimizerState,
  type OptimizerStateInfo,
  type PackedSlot,
  type PackedStateHeader,
  packOptimizerState,
  SGD,
  type SgdHyper,
  type SgdOptions,
  type StepOptions,
  unpackOptimizerState,
  type UpdateContext,
} from "./optim/mod.ts";
export {
  CHECKPOINT_FORMAT,
  type CheckpointContents,
  decodeSafetensors,
  encodeSafetensors,
  type HostTensor,
  hostTensorToTensor,
  loadCheckpoint,
  type LoadCheckpointOptions,
  type LoadedCheckpoint,
  loadSafetensors,
  MAX_HEADER_BYTES,
  MAX_HEADER_DEPTH,
  MAX_METADATA_JSON_DEPTH,
  type SafetensorsArray,
  type SafetensorsDType,
  type SafetensorsFile,
  saveCheckpoint,
  saveSafetensors,
  type TensorCollection,
  type TensorSource,
} from "./io/safetensors.ts";
export { checkOutputPath, type OutputTarget, resolveOutputPath, writeFileAtomic } from "./io/atomic.ts";
export { CheckpointError, OutputPathError, SafetensorsError } from "./io/errors.ts";
export { type Filler, fillerValues, streamOf, type VarianceNorm } from "./nn/init.ts";
export { type ForwardContext, type LayerDescription, Module, type ParameterOptions } from "./nn/module.ts";
export type { BufferEntry, ParameterEntry } from "./nn/parameter.ts";
export { BatchNorm, type BatchNormOptions } from "./nn/batch_norm.ts";
export { Concat, Eltwise, type EltwiseOperation, JoinModule } from "./nn/join.ts";
export { Scale, type ScaleOptions } from "./nn/scale.ts";
export { WithinChannelLRN } from "./nn/lrn_within_channel.ts";
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
} from "./nn/layers.ts";
export { type LossOptions, Network } from "./nn/network.ts";
export { Graph, type GraphLoss, type GraphNode, type GraphSpec } from "./nn/graph.ts";
export {
  formatSummary,
  type GroupTotals,
  type NetworkSummary,
  summarize,
  type SummaryRow,
} from "./nn/summary.ts";
export * from "./data/mod.ts";
export {
  countCorrect,
  evaluate,
  type EvaluationResult,
  fit,
  type FitOptions,
  type FitResult,
  type LabelledBatch,
  type StepInfo,
  type StepMetrics,
  trainStep,
  type TrainStepOptions,
} from "./train/trainer.ts";
export {
  averageGradients,
  replicaStep,
  type ReplicaStepOptions,
  trainingLoss,
} from "./train/replica_step.ts";
export {
  alexnet,
  alexnetLike,
  type AlexnetLikeOptions,
  type BuiltinModel,
  type BuiltinModelName,
  builtinModels,
  caffenet,
  cifarQuick,
  lenet,
  type ModelOptions,
} from "./models/mod.ts";
export {
  type CaffeBlob,
  type CaffeImport,
  CaffeImportError,
  type CaffeImportOptions,
  type CaffeLayerWeights,
  CaffeModelError,
  caffeModuleName,
  type CaffePhase,
  type CaffeTransform,
  importCaffeNet,
  loadCaffeModel,
  loadCaffeNet,
  loadCaffeWeights,
  type LoadCaffeWeightsOptions,
  MAX_CAFFEMODEL_BYTES,
  MAX_CAFFEMODEL_DEPTH,
  MAX_PROTOTXT_DEPTH,
  parseCaffeModel,
  parsePrototxt,
  PrototxtError,
  type PrototxtField,
  PrototxtMessage,
  type PrototxtScalar,
} from "./caffe/mod.ts";
