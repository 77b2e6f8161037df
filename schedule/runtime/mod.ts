/**
 * The data-parallel runtime: {@link DataParallelTrainer}, whose one plan executor runs any validated
 * plan over shared memory (CPU Workers), GPU-resident replicas, or one process per device under
 * Open MPI, and what it reports and needs: measured traces and overlap figures, the divergence
 * check, gradient wire formats and their residuals, emulated links, and how many devices fit.
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { overlapPlan } from "../mod.ts";
 * import { SGD } from "../../engine/mod.ts";
 * import { DataParallelTrainer, TraceRecorder } from "./mod.ts";
 *
 * const trace = new TraceRecorder();
 * const trainer = await DataParallelTrainer.create({
 *   model: { kind: "builtin", name: "lenet" },
 *   devices: 2,
 *   plan: overlapPlan(["fc", "conv"]),
 *   optimizer: (parameters) => new SGD(parameters, { lr: 0.01 }),
 *   trace,
 * });
 * const batch = { images: new Float32Array(8 * 784), labels: new Int32Array(8), shape: [8, 1, 28, 28] };
 * console.log((await trainer.step(batch)).loss);
 * await trainer.close();
 * ```
 *
 * @module
 */

export { DataParallelTrainer } from "./trainer.ts";
export {
  type DataParallelOptions,
  type DataParallelStepResult,
  type HostBatch,
  type LaneEvent,
} from "./options.ts";
export {
  type ChromeTrace,
  type ChromeTraceEvent,
  type OverlapFigures,
  TraceRecorder,
  type TraceSpan,
} from "./trace.ts";
export { type LaneSpan, medianFigures, spanKind, type StepFigures, stepFigures } from "./figures.ts";
export { type DivergedQuantity, DivergenceError } from "./finite.ts";
export {
  type CompressedWireFormat,
  parseWire,
  WIRE_FORMATS,
  wireBytesPerElement,
  type WireFormat,
  type WireOptions,
} from "./exchange/wire.ts";
export { residualsOf, residualTensors, resumeResiduals } from "./exchange/residuals.ts";
export { type Link, parseLink, STANDARD_LINKS } from "./exchange/link.ts";
export { type DeviceCapacity, deviceCapacity, type MachineSize, machineSize } from "./start.ts";
