/**
 * Tandem: a data-parallel deep-learning framework for Deno, written from scratch in TypeScript.
 *
 * The root holds what a model is trained with: tensors, `ops`, layers, optimizers, checkpoints,
 * data, the training loops, the model zoo, Caffe import, data-parallel schedules and their trainer,
 * the errors worth catching, and the two backends. Everything else has a subpath of its own:
 * `./engine`, `./nn`, `./optim`, `./io`, `./data`, `./models`, `./caffe`, `./schedule`, `./runtime`,
 * `./simulator`, `./devices`, `./mpi`, `./webgpu`, `./backends/cpu` and `./backends/backend`.
 *
 * Importing this module registers the CPU backend and makes it current.
 *
 * @example
 * ```ts
 * import { ops, randn, tensor, tidy } from "./mod.ts";
 *
 * const w = randn([3, 4], { seed: 1, std: 0.1, requiresGrad: true });
 * const x = randn([8, 4], { seed: 2 });
 * const labels = tensor([0, 1, 2, 0, 1, 2, 0, 1], { dtype: "int32" });
 * tidy(() => {
 *   const loss = ops.softmaxCrossEntropy(ops.linear(x, w), labels);
 *   loss.backward(); // w.grad now holds dLoss/dw
 * });
 * ```
 *
 * @module
 */

import { CpuBackend } from "./backends/cpu/mod.ts";
import { registerBackend } from "./engine/mod.ts";

// Tensors, autograd, memory scopes and backends.
export {
  DisposedError,
  full,
  getBackend,
  manualSeed,
  memory,
  noGrad,
  NonFiniteError,
  ones,
  ops,
  randn,
  registerBackend,
  scalar,
  setBackend,
  ShapeError,
  TandemError,
  Tensor,
  tensor,
  tidy,
  uniform,
  valueAndGrad,
  ValueError,
  zeros,
} from "./engine/mod.ts";
export { CpuBackend };
export { createWebGpuBackend } from "./backends/webgpu/mod.ts";

// Layers and networks.
export {
  AvgPool2d,
  Conv2d,
  Dropout,
  Flatten,
  formatSummary,
  Linear,
  LRN,
  MaxPool2d,
  Module,
  Network,
  ReLU,
  Sequential,
  summarize,
} from "./engine/nn/mod.ts";

// Optimizers and checkpoints.
export { Adam, type LrPolicy, Optimizer, SGD } from "./engine/optim/mod.ts";
export { CheckpointError, loadCheckpoint, saveCheckpoint } from "./engine/io/mod.ts";

// Data, training loops, models and Caffe import.
export {
  DataError,
  DataLoader,
  type ImageDataset,
  loadFashionMnistSplit,
  loadMnistDigitsSplit,
  readCifar10Files,
  splitDataset,
  syntheticDataset,
} from "./engine/data/mod.ts";
export { evaluate, fit, trainStep } from "./engine/mod.ts";
export { alexnet, alexnetLike, caffenet, cifarQuick, lenet } from "./engine/models/mod.ts";
export { CaffeImportError, loadCaffeNet, loadCaffeWeights } from "./engine/caffe/mod.ts";

// Data-parallel training: schedules, the trainer and its traces.
export {
  bucketedPlan,
  builtinPlan,
  explain,
  hybridPlan,
  overlapPlan,
  parseSchedule,
  type Plan,
  schedule,
  ScheduleError,
  sequentialPlan,
  validatePlan,
} from "./schedule/mod.ts";
export { autoSchedule } from "./schedule/simulator/mod.ts";
export { DataParallelTrainer, DivergenceError, TraceRecorder } from "./schedule/runtime/mod.ts";
export { DeviceError } from "./schedule/devices/mod.ts";

registerBackend(new CpuBackend());
