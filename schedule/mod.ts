/**
 * Schedules for data-parallel training: a text form and a typed builder that both compile to a
 * {@link Plan}, static validation, the built-in schedules, a plain-text explanation, a cost model
 * that predicts iteration timelines, the AlexNet-like test with automatic schedule choice, a trace
 * recorder for measured timelines, and the trainer whose one plan executor runs them over shared
 * memory (CPU Workers), GPU-resident replicas, or one process per device under Open MPI
 * (`DataParallelTrainer`).
 *
 * @example
 * ```ts
 * import { explain, parseSchedule, validatePlan } from "./mod.ts";
 * const plan = parseSchedule(`
 *   schedule overlap
 *   forward
 *   backward fc; reduce fc; update fc   # FC gradients travel while conv backward runs
 *   backward conv; reduce conv; update conv
 *   broadcast all
 * `, { groups: ["fc", "conv"] });
 * validatePlan(plan, { mode: "master" });
 * console.log(explain(plan, { devices: 2, mode: "master" }));
 * ```
 *
 * @module
 */

export {
  dependenciesOf,
  isSharded,
  type Lane,
  laneOf,
  type Plan,
  type PlanSource,
  type PlanStep,
  type ReductionMode,
  type StepKind,
  stepLabel,
} from "./plan/plan.ts";
export { ScheduleError, type ScheduleErrorLocation } from "./plan/errors.ts";
export {
  formatPlan,
  loadSchedule,
  type ParseOptions,
  parseSchedule,
  schedule,
  type ScheduleTag,
} from "./plan/dsl.ts";
export { type GroupTarget, ScheduleBuilder, scheduleBuilder } from "./plan/builder.ts";
export {
  checkPlan,
  type PlanReport,
  type ShardingProblem,
  shardingProblem,
  type ValidateOptions,
  validatePlan,
} from "./plan/validate.ts";
export {
  bucketedPlan,
  type BuiltinName,
  builtinSchedule,
  hybridPlan,
  overlapPlan,
  sequentialPlan,
} from "./plan/builtins.ts";
export { explain, type ExplainOptions } from "./plan/explain.ts";
export {
  accumulatedProfile,
  calibrateProfile,
  checkProfile,
  type GroupTotal,
  groupTotals,
  type LayerProfile,
  type Profile,
  type ProfileTargets,
  regroupProfile,
} from "./simulator/profile.ts";
export {
  activationCollectiveSeconds,
  type ActivationTransfer,
  commStepSeconds,
  type CostOptions,
  DEFAULT_MEMORY_BANDWIDTH,
  type GroupCommunication,
  type HybridTraffic,
  hybridTraffic,
  type LaneEntry,
  type Link,
  simulate,
  type SimulateOptions,
  type Simulation,
  type Topology,
} from "./simulator/simulator.ts";
export {
  alexnetScalingTable,
  type NamedLink,
  type ScalingRow,
  type ScalingTable,
  type ScalingTableOptions,
  STANDARD_LINKS,
} from "./simulator/scaling.ts";
export {
  type AlexnetThresholds,
  type AutoOptions,
  type AutoPlan,
  autoSchedule,
  DEFAULT_LINK,
  DEFAULT_THRESHOLDS,
  type HybridCandidate,
  hybridCandidate,
  judgeNetwork,
  type JudgeOptions,
  type NetworkJudgement,
  type NetworkSplit,
} from "./simulator/auto.ts";
export {
  type ChromeTrace,
  type ChromeTraceEvent,
  type OverlapFigures,
  TraceRecorder,
  type TraceSpan,
} from "./runtime/trace.ts";
export { averageInDeviceOrder, hostParameterEntries } from "./runtime/host_parameters.ts";
export {
  type DataParallelOptions,
  type DataParallelStepResult,
  DataParallelTrainer,
  type HostBatch,
  type LaneEvent,
} from "./runtime/trainer.ts";
export { checkUpdatedGroup, type DivergedQuantity, DivergenceError } from "./runtime/finite.ts";
export { type LaneSpan, medianFigures, spanKind, type StepFigures, stepFigures } from "./runtime/figures.ts";
export {
  type ComputeCommand,
  type ComputeResult,
  type Device,
  DeviceError,
  type ResidentReplica,
  type ResidentRole,
} from "./devices/device.ts";
export { CpuDevice } from "./devices/cpu_device.ts";
export { BackendDevice } from "./devices/backend_device.ts";
export {
  emulateRingAllreduce,
  LINK_GRAMMAR,
  type LinkSpec,
  parseLink,
  timedMove,
  transfer,
  type TransferTiming,
  waitUntil,
} from "./runtime/link.ts";
export {
  bf16Bits,
  checkWireOptions,
  type CompressedWireFormat,
  compressGradients,
  decodeGradients,
  fp16Bits,
  GradientWire,
  parseWire,
  quantizeGradients,
  WIRE_FORMATS,
  wireBytesPerElement,
  type WireFormat,
  type WireOptions,
} from "./runtime/wire.ts";
export {
  DEVICE_COST,
  type DeviceCapacity,
  deviceCapacity,
  type MachineSize,
  machineSize,
} from "./runtime/start.ts";
export { RESIDUAL_PREFIX, residualsOf, residualTensors, resumeResiduals } from "./runtime/residuals.ts";
export { buildModel, type ModelSpec } from "./devices/model_spec.ts";
export {
  type BufferLayout,
  bufferLayoutOf,
  type BufferSlot,
  copyBuffers,
  hostBufferEntries,
} from "./devices/buffer_layout.ts";
export {
  backwardGroupOrder,
  type GroupRange,
  groupRange,
  layoutOf,
  type ParameterLayout,
  type ParameterSlot,
} from "./devices/parameter_layout.ts";
export { type MeasureOptions, measureProfile } from "./simulator/measure.ts";
export type { ComputeSpan } from "./devices/protocol.ts";
export {
  MPI_FUNCTIONS,
  MPI_LIBRARY_CANDIDATES,
  MpiError,
  type MpiHandles,
  MpiLibrary,
  type MpiSymbols,
} from "./mpi/library.ts";
export {
  detectMpiLaunch,
  inspectMpiLaunch,
  type MpiBuffer,
  type MpiDetection,
  type MpiLaunch,
  MpiRequest,
  MpiTransport,
  type MpiTransportOptions,
  TransportError,
  type WaitOptions,
} from "./mpi/transport.ts";
