/**
 * What `DataParallelTrainer` (`trainer.ts`) takes and gives back: its options and a global batch,
 * each with the checks that refuse a bad one before any device runs, and the lane events and step
 * result it reports. Apart from the trainer, so that what starts a run (`start.ts`,
 * `mpi/exchange.ts`) and the plan executor (`executor.ts`) depend on this contract, not on the
 * trainer class.
 *
 * @module
 */

import { type Optimizer, type ParameterEntry, ValueError } from "../../engine/mod.ts";
import type { Device } from "../devices/device.ts";
import type { ParameterLayout } from "../devices/parameter_layout.ts";
import type { ModelSpec } from "../devices/model_spec.ts";
import type { MpiTransport, MpiTransportOptions } from "../mpi/transport.ts";
import type { DataPlane } from "../mpi/sockets.ts";
import type { Plan, ReductionMode } from "../plan/plan.ts";
import type { LaneSpan, StepFigures } from "./figures.ts";
import type { Link } from "./exchange/link.ts";
import type { TraceRecorder } from "./trace.ts";
import { checkWireOptions, type WireFormat } from "./exchange/wire.ts";

/** One recorded span of work on a lane, in `performance.now()` milliseconds. */
export interface LaneEvent extends LaneSpan {
  /** Device index (the MPI rank under MPI). */
  device: number;
  /** Training iteration. */
  step: number;
  /** Bytes a transfer moved (for gradients: as sent on the wire, 2 per value for fp16/bf16). */
  bytes?: number;
}

/** Options of `DataParallelTrainer.create`. */
export interface DataParallelOptions {
  /** The model every device builds. */
  model: ModelSpec;
  /** `master` (gather to device 0, update there, broadcast; default) or `allreduce`. */
  mode?: ReductionMode;
  /** The schedule to run (validated beforehand). */
  plan: Plan;
  /** Creates the optimizer for a set of parameters (called once per updating replica). */
  optimizer: (parameters: ParameterEntry[]) => Optimizer;
  /** Number of devices in this process (default 2). Under MPI: one per rank, this is ignored. */
  devices?: number;
  /** Emulated link between devices in this process; none means shared memory at full speed. */
  link?: Link;
  /**
   * Run across MPI ranks, one device per rank, rank 0 the master: the transport, or `true` for
   * `MpiTransport.init(transportOptions)`. Every rank must pass the same options.
   */
  transport?: MpiTransport | true;
  /** Options for the transport `transport: true` starts. */
  transportOptions?: MpiTransportOptions;
  /**
   * MPI: how gradients and parameters travel between ranks — `"sockets"` (default): direct TCP
   * connections between every pair of ranks, opened through MPI at the start; `"mpi"`: Open MPI's
   * collectives. Everything else (configurations, losses, traces, checkpoints) goes through MPI.
   * The bits are the same either way.
   */
  dataPlane?: DataPlane;
  /**
   * MPI: gradients and parameters travel in chunks of at most this many bytes, pipelined so that
   * averaging, updating and sending back one chunk overlap the transfer of the next (default 1 MiB;
   * in master mode a group's chunks are a 32nd of it where that is smaller, down to 64 KiB or 1 ms
   * on the link, whichever is larger: `pipelineChunkBytes`).
   */
  chunkBytes?: number;
  /**
   * MPI, master mode: the link's rate in bytes per second per direction with both directions busy,
   * as `measureLink` gives it, which sets the chunks' least size (see {@link chunkBytes}). Ranks
   * that give different ones (or chunk sizes) refuse to start. Default: measured over the data
   * plane when the ranks start (4 MiB each, a few transfers: a quarter of a second over 1 Gbit/s).
   */
  linkBytesPerSecond?: number;
  /** Run seed for dropout (default 0). */
  seed?: number;
  /**
   * Gradient accumulation: each device runs its shard as this many equal micro-batches, adding their
   * gradients, and the step communicates only after the last one (default 1). `devices: 1,
   * accumulate: K` gives the bits of `devices: K`; see `replicaStep` for why not those of one pass.
   * Under a hybrid plan every micro-batch runs the head over the micro-batches gathered from every
   * device, and the slices update after the last (`devices/head_micro_batches.ts`).
   */
  accumulate?: number;
  /**
   * Kernel threads of each CPU device (default: its share of the cores, ⌊cores / devices⌋ in one
   * process, ⌊cores / ranks on the host⌋ under MPI; the cores the process may run on, so a rank
   * that `deno task cluster` pins to its host's cores counts those). Set it where hosts share cores
   * that the launch cannot see, or to leave cores to other work. Results do not depend on it.
   */
  deviceThreads?: number;
  /**
   * Nice value of each CPU device's compute threads (Linux; 0 to 19; default 10,
   * `devices/thread_priority.ts`): below the runtime's thread, so the exchange it runs while the
   * next group's backward computes gets a core the moment it wakes. 0 leaves them level. Results do
   * not depend on it.
   */
  computeNice?: number;
  /** A device (or rank) that does not answer within this many seconds fails the step (default 120). */
  timeoutSeconds?: number;
  /** After every step, check that all replicas hold bit-identical parameters (default false). */
  verifyReplicas?: boolean;
  /**
   * After every update, check the group's new parameters for NaN and ±∞ (one backend reduction,
   * started on the communication lane right after the update, so an update behind compute is
   * checked behind it too, and awaited at the end of the step), and check the loss. A non-finite
   * one fails the step with a `DivergenceError` (`finite.ts`) naming the step and tensor, and the step is
   * rolled back, so every update is then kept undoable (default true; `sequential` pays copies it
   * would otherwise skip, see `bench/ROLLBACK.md`).
   */
  checkFinite?: boolean;
  /** Receives every lane event. */
  onEvent?: (event: LaneEvent) => void;
  /** Records every lane event for a Chrome trace (`trace.writeChromeTrace(path)`). */
  trace?: TraceRecorder;
  /**
   * Starts device `index` holding a replica of `model` laid out as `layout` (default: a CPU
   * Worker). Other device kinds (WebGPU) and test wrappers plug in here; the trainer only uses the
   * {@link Device} contract.
   */
  startDevice?: (
    index: number,
    model: ModelSpec,
    layout: ParameterLayout,
    timeoutSeconds: number,
  ) => Promise<Device>;
  /**
   * How gradients travel (`wire.ts`): `fp32` (default, exact) or `fp16` / `bf16`, which halve the
   * exchanged bytes. Lossy and not bit-identical to fp32, but every device's gradients (the master's
   * too) are rounded alike before the device-order average, so under one format every schedule,
   * reduction and transport gives the same bits. Parameters always travel in fp32. GPU-resident
   * (WebGPU) devices in one process take `fp32` only.
   */
  wire?: WireFormat;
  /**
   * With a 16-bit `wire`: each device keeps the rounding error of what it sent (a residual over the
   * whole layout, across steps) and adds it to its next gradients (default false). Checkpoint them with
   * `DataParallelTrainer.residuals` and restore them with `resumeResiduals` (`residuals.ts`).
   */
  errorFeedback?: boolean;
}

/** A global batch as host arrays. */
export interface HostBatch {
  /** Float32 NCHW pixels of the whole global batch. */
  images: Float32Array;
  /** Int32 labels. */
  labels: Int32Array;
  /** `[batch, C, H, W]`. */
  shape: readonly number[];
}

/** What one data-parallel step did. */
export interface DataParallelStepResult {
  /** Iteration number of this step (0-based). */
  iteration: number;
  /** Mean loss over the global batch. */
  loss: number;
  /** Correct top-1 predictions over the global batch. */
  correct: number;
  /** Samples in the global batch. */
  count: number;
  /** Wall-clock seconds of the step. */
  seconds: number;
  /** Where the step's milliseconds went (see `figures.ts`): this process's lanes. */
  ms: StepFigures;
  /** `ms.hiddenCommunication / ms.communication`, 0 without communication. */
  hiddenFraction: number;
}

/**
 * Checks what `DataParallelTrainer.create` can check before building anything: the reduction
 * mode, `accumulate`, the device count (in this process; MPI counts its ranks), `deviceThreads` and
 * the wire format.
 * Returns the device count.
 *
 * @example
 * ```ts
 * import { checkOptions } from "./options.ts";
 * // checkOptions({ ...options, accumulate: 0 }) throws: accumulate must be a positive integer, got 0
 * ```
 */
export function checkOptions(options: DataParallelOptions): number {
  const mode = options.mode ?? "master";
  if (mode !== "master" && mode !== "allreduce") {
    throw new ValueError("DataParallelTrainer", `mode must be "master" or "allreduce", got "${mode}"`);
  }
  const count = options.devices ?? 2;
  const accumulate = options.accumulate ?? 1;
  if (!Number.isInteger(accumulate) || accumulate < 1) {
    throw new ValueError("DataParallelTrainer", `accumulate must be a positive integer, got ${accumulate}`);
  }
  if (!options.transport && (!Number.isInteger(count) || count < 1)) {
    throw new ValueError("DataParallelTrainer", `devices must be a positive integer, got ${count}`);
  }
  const threads = options.deviceThreads;
  if (threads !== undefined && (!Number.isInteger(threads) || threads < 1)) {
    throw new ValueError("DataParallelTrainer", `deviceThreads must be a positive integer, got ${threads}`);
  }
  const nice = options.computeNice;
  if (nice !== undefined && (!Number.isInteger(nice) || nice < 0 || nice > 19)) {
    throw new ValueError("DataParallelTrainer", `computeNice must be an integer in [0, 19], got ${nice}`);
  }
  const chunk = options.chunkBytes;
  if (chunk !== undefined && (!Number.isInteger(chunk) || chunk < 4)) {
    throw new ValueError(
      "DataParallelTrainer",
      `chunkBytes must be an integer of at least 4 (one float), got ${chunk}`,
    );
  }
  const rate = options.linkBytesPerSecond;
  if (rate !== undefined && !(Number.isFinite(rate) && rate > 0)) {
    throw new ValueError(
      "DataParallelTrainer",
      `linkBytesPerSecond must be a finite number > 0, got ${rate}`,
    );
  }
  checkWireOptions(options);
  return count;
}

/** How a global batch splits: one contiguous shard per device, in device order. */
export interface BatchSplit {
  /** Samples per device. */
  readonly shardSize: number;
  /** Values per sample (C·H·W). */
  readonly sampleSize: number;
  /** The shape of one sample, `[C, H, W]`. */
  readonly sample: readonly number[];
}

/**
 * Splits a batch of `shape` over `devices` devices, each running `microBatches` equal
 * micro-batches; throws where it does not split evenly.
 *
 * @example
 * ```ts
 * import { splitBatch } from "./options.ts";
 * console.log(splitBatch([12, 1, 28, 28], 2, 3).shardSize); // 6
 * ```
 */
export function splitBatch(shape: readonly number[], devices: number, microBatches: number): BatchSplit {
  const [batchSize, ...sample] = shape;
  if (batchSize % devices !== 0) {
    throw new ValueError(
      "DataParallelTrainer",
      `a batch of ${batchSize} does not split evenly over ${devices} devices`,
    );
  }
  const shardSize = batchSize / devices, sampleSize = sample.reduce((a, b) => a * b, 1);
  if (shardSize % microBatches !== 0) {
    throw new ValueError(
      "DataParallelTrainer",
      `a shard of ${shardSize} samples per device does not split into ${microBatches} equal micro-batches`,
    );
  }
  return { shardSize, sampleSize, sample };
}
