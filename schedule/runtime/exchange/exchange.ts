/**
 * The exchange: how the devices of a data-parallel run share gradients and parameters. The plan
 * executor (`executor.ts`) walks every plan the same way on every transport; only the moves differ,
 * and they live behind this interface, with three implementations:
 *
 * - `SharedMemoryExchange` — CPU Workers in this process: gradients and parameters are host buffers
 *   both sides map; averaging and the optimizer run here, a broadcast is a copy (optionally timed as
 *   an emulated link).
 * - `ResidentExchange` — devices that keep their replica in their own memory (WebGPU): averaging
 *   and the optimizer run on the devices, group copies travel through staging buffers.
 * - `MpiExchange` (`../../mpi/exchange.ts`) — one device per MPI rank: non-blocking collectives.
 *
 * Every exchange averages in device order, `(g0 + … + gN−1) · fround(1/N)`, so every transport and
 * schedule gives the same bits. With a 16-bit wire format (`wire.ts`, opt-in, lossy) every device's
 * gradients are rounded before they travel, the master's own too, and the same holds for the
 * rounded values; parameters always travel in float32.
 *
 * @module
 */

import type { Optimizer, ParameterEntry } from "../../../engine/mod.ts";
import type { ComputeResult, Device } from "../../devices/device.ts";
import { freeSharedFloats, type ParameterLayout } from "../../devices/parameter_layout.ts";
import type { BufferLayout } from "../../devices/buffer_layout.ts";
import type { ReductionMode } from "../../plan/plan.ts";
import type { Link } from "./link.ts";
import type { TraceRecorder } from "../trace.ts";
import type { GradientWire } from "./wire.ts";

/** What every replica starts from: the model's layout and device 0's initial parameters. */
export interface ReplicaReference {
  /** The parameter layout every device shares. */
  layout: ParameterLayout;
  /** Device 0's initial parameters, flat in layout order. */
  initial: Float32Array;
  /** The model's name (MPI ranks compare it). */
  modelName: string;
  /** The model's buffers (BatchNorm statistics; `total` 0 without any), see `buffer_layout.ts`. */
  buffers?: BufferLayout;
  /** Their initial values, flat in `buffers` order. */
  initialBuffers?: Float32Array;
}

/** What an exchange action (`reduce`, `broadcast`) may use from the training step that runs it. */
export interface ExchangeContext {
  /** Training iteration of the step. */
  readonly iteration: number;
  /** `performance.now()` by which a collective must have completed (else it fails, naming itself). */
  readonly deadline: number;
  /** `performance.now()` when the step began, from which `deadline` counts (named in the failure). */
  readonly started?: number;
  /** Whether a device of this process is still computing (a waiting collective then yields the CPU). */
  computing(): boolean;
  /**
   * Records a transfer inside an action on `device`'s communication lane, e.g. `send fc gradients`, with
   * the bytes it moved where known (halved by a 16-bit wire format, see `wire.ts`).
   */
  record(device: number, name: string, start: number, end: number, bytes?: number): void;
}

/** When the parts of a pipelined exchange ran, `[start, end]` in `performance.now()` ms. */
export interface PipelineSpans {
  /** From posting the first chunk to averaging the last. */
  reduce: [number, number];
  /** From the first chunk's update to the last one's, where updates ran. */
  update?: [number, number];
  /** From the first chunk sent back to the last one received, where parameters were sent. */
  broadcast?: [number, number];
}

/** Loss and hits of the whole global batch. */
export interface CombinedResult {
  /** Mean loss over the global batch (shard means averaged in device order). */
  loss: number;
  /** Correct top-1 predictions over the global batch. */
  correct: number;
  /** Samples in the global batch. */
  count: number;
}

/** See the module notes. */
export interface Exchange {
  /** How the devices are joined, for messages: `shared memory`, `GPU-resident`, `MPI`. */
  readonly name: string;
  /** The devices this process drives, in device order (all of them, or this rank's one under MPI). */
  readonly local: readonly Device[];
  /** Devices in the run. */
  readonly size: number;
  /** This process's rank (0 when every device is in this process). */
  readonly rank: number;
  /** Optimizers of the replicas this process updates; the master's first where it is one of them. */
  readonly optimizers: readonly Optimizer[];
  /** This process's view of the parameters when it has no optimizer (an MPI rank in master mode). */
  readonly parameterEntries: readonly ParameterEntry[];
  /**
   * A failed step is undone (the optimizers' undoable updates). MPI does not: the other ranks are
   * then stuck in collectives, and only a new job can continue.
   */
  readonly rollsBack: boolean;
  /**
   * Its reduce and broadcast actions can fail (a peer GPU lost), so an update followed by one must be
   * undoable even after every device has finished; copies between host buffers cannot fail.
   */
  readonly transfersCanFail: boolean;
  /** Settles what the previous call left running (a resident broadcast); called before every step. */
  beforeStep(): Promise<void>;
  /** Moves `group`'s gradients and averages them in device order where the updates read them. */
  reduce(group: string, context: ExchangeContext): Promise<void>;
  /** Sends the master's new parameters of `group` to the peers; false where nothing is sent. */
  broadcast(group: string, context: ExchangeContext): Promise<boolean>;
  /**
   * Optional: a plan's adjacent `reduce g`, `update g` (and `broadcast g`) run as one pipeline over
   * chunks of the group — each chunk averaged, updated through `update(range)` and sent back as soon
   * as it arrives, while later chunks are still on the wire (MPI). Returns when each part ran.
   */
  pipeline?(
    group: string,
    options: { update?: (range: { start: number; end: number }) => void; broadcast: boolean },
    context: ExchangeContext,
  ): Promise<PipelineSpans>;
  /** The global batch's figures from this process's devices' results (all ranks' under MPI). */
  combine(results: readonly ComputeResult[], context: ExchangeContext): Promise<CombinedResult>;
  /**
   * Copies the master's parameters (and, where peers update, optimizer state) to every replica;
   * resolves to the master's `iteration`, which every replica continues from.
   */
  broadcastParameters(iteration: number): Promise<number>;
  /** Brings device-resident parameters into the devices' host mirrors. */
  syncParameters(): Promise<void>;
  /** The master's parameters (this rank's, which equal them), flat in layout order. */
  masterParameters(): Float32Array;
  /** Devices whose parameters differ from the master's in any bit. */
  divergentReplicas(): Promise<number[]>;
  /** Adds every other process's spans to this one's trace (MPI); nothing to do in one process. */
  gatherTrace(trace: TraceRecorder | undefined): Promise<void>;
  /**
   * The gradients' compression where not fp32 (`wire.ts`), holding this process's devices'
   * error-feedback residuals; the trainer commits it after every completed step.
   */
  readonly wire: GradientWire | undefined;
  /**
   * With error feedback: every device's residual over the whole layout, in device order, on the
   * master (copies); `undefined` elsewhere and without error feedback. Collective under MPI.
   */
  gatherResiduals(): Promise<Float32Array[] | undefined>;
  /**
   * With error feedback: device d's residual becomes the master's `residuals[d]`, or zeros where the
   * master passes none (only its argument counts). Collective under MPI.
   */
  scatterResiduals(residuals: readonly Float32Array[] | undefined): Promise<void>;
  /** Stops the devices. */
  close(): Promise<void>;
  /**
   * After {@link close}, once no step runs: frees the host optimizers' state and the memory shared
   * with the devices now (kernel memory is outside the JavaScript heap, so the garbage collector
   * would not hurry; a second trainer would find no room). Nothing of the exchange is used afterwards.
   */
  free(): void;
}

/**
 * What {@link Exchange.free} does where the exchange updates on the host: disposes `optimizers`,
 * frees each device's shared buffers and the exchange's own `arrays` (from `sharedFloats`).
 */
export function freeHostExchange(
  optimizers: readonly Optimizer[],
  devices: readonly Device[],
  arrays: readonly (Float32Array | undefined)[],
): void {
  for (const optimizer of optimizers) optimizer.dispose();
  for (const device of devices) device.free?.();
  for (const array of arrays) if (array) freeSharedFloats(array);
}

/** Awaits every promise, then throws the first failure, so nothing is still running on error. */
export async function settleAll(promises: readonly Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(promises)).find((r) => r.status === "rejected");
  if (failed) throw (failed as PromiseRejectedResult).reason;
}

/** Shard figures added in device order, as one device would report the global batch. */
export function combineInDeviceOrder(results: readonly ComputeResult[]): CombinedResult {
  let loss = 0, correct = 0, count = 0;
  for (const r of results) {
    loss += r.loss;
    correct += r.correct;
    count += r.count;
  }
  return { loss: loss / results.length, correct, count };
}

/** Indices of `replicas` whose bits differ from `replicas[0]`'s, within `ranges` (default: all). */
export function divergentFrom(
  replicas: readonly { index: number; parameters: Float32Array }[],
  ranges: readonly { offset: number; size: number }[] = [{ offset: 0, size: replicas[0].parameters.length }],
): number[] {
  const bits = (a: Float32Array) => new Uint32Array(a.buffer, a.byteOffset, a.length);
  const master = bits(replicas[0].parameters);
  const out: number[] = [];
  for (const replica of replicas.slice(1)) {
    const other = bits(replica.parameters);
    const differs = ranges.some(({ offset, size }) => {
      for (let i = offset; i < offset + size; i++) if (master[i] !== other[i]) return true;
      return false;
    });
    if (differs) out.push(replica.index);
  }
  return out;
}

/**
 * What the exchanges of devices in this one process share: every device is local, rank 0, a failed
 * step is undone, and the shards' figures combine in device order.
 */
export abstract class InProcessExchange {
  /** See {@link Exchange.rank}. */
  readonly rank = 0;
  /** See {@link Exchange.rollsBack}. */
  readonly rollsBack = true;
  /** See {@link Exchange.local}. */
  readonly local: readonly Device[];
  /** See {@link Exchange.optimizers}. */
  abstract readonly optimizers: readonly Optimizer[];
  /** The layout every device shares. */
  protected readonly layout: ParameterLayout;
  /** How gradients are combined. */
  protected readonly mode: ReductionMode;
  /** The emulated link between devices, if any. */
  protected readonly link: Link | undefined;

  /** Joins `devices`, master first. */
  constructor(devices: readonly Device[], layout: ParameterLayout, mode: ReductionMode, link?: Link) {
    this.local = devices;
    this.layout = layout;
    this.mode = mode;
    this.link = link;
  }

  /** See {@link Exchange.size}. */
  get size(): number {
    return this.local.length;
  }

  /** The devices that update: the master alone, or every device in allreduce mode. */
  protected get updating(): readonly Device[] {
    return this.mode === "master" ? [this.local[0]] : this.local;
  }

  /** See {@link Exchange.parameterEntries}: the master optimizer's. */
  get parameterEntries(): readonly ParameterEntry[] {
    return this.optimizers[0].parameters;
  }

  /** See {@link Exchange.combine}. */
  combine(results: readonly ComputeResult[]): Promise<CombinedResult> {
    return Promise.resolve(combineInDeviceOrder(results));
  }

  /** Nothing to gather: the trace already has every device's spans. */
  gatherTrace(): Promise<void> {
    return Promise.resolve();
  }

  /** See {@link Exchange.wire}. */
  abstract readonly wire: GradientWire | undefined;

  /** See {@link Exchange.gatherResiduals}: every device is here. */
  gatherResiduals(): Promise<Float32Array[] | undefined> {
    const wire = this.wire;
    if (!wire?.errorFeedback) return Promise.resolve(undefined);
    return Promise.resolve(this.local.map((d) => wire.residual(d.index).slice()));
  }

  /** See {@link Exchange.scatterResiduals}. */
  scatterResiduals(residuals: readonly Float32Array[] | undefined): Promise<void> {
    const wire = this.wire;
    if (wire?.errorFeedback) { for (const d of this.local) wire.loadResidual(d.index, residuals?.[d.index]); }
    return Promise.resolve();
  }
}
