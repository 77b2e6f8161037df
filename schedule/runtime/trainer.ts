/**
 * The data-parallel runtime: executes a plan on N devices, every iteration.
 *
 * Each device's compute lane (its Worker) runs forward and the backward groups in plan order and
 * announces each group's gradients as they become final. The communication lane (this thread)
 * walks the plan's `reduce`, `update` and `broadcast` steps in order, each starting as soon as what
 * it needs is ready — so under `overlap` the FC gradients are shipped, averaged and applied while
 * the devices are still computing conv gradients.
 *
 * Lossless by construction (see shared/notes/lossless-data-parallel.md):
 * - gradients are averaged in device order, `(g0 + g1 + … + g(N−1)) · (1/N)` in float32, whatever
 *   order they arrived in, under every schedule;
 * - updates are per group and elementwise, so applying `fc` before `conv` changes no bit;
 * - the devices run the same kernels on the same values whichever schedule is used, because the
 *   segmented backward is the same backward;
 * - dropout is keyed by (seed, iteration, layer, global sample index), so shards draw the masks the
 *   whole batch would;
 * - replicas start from device 0's parameters and receive them (master mode) or apply identical
 *   updates to identical inputs (allreduce mode).
 *
 * Where the values live depends on the devices:
 * - CPU devices (Workers) share host memory with this thread: the communication lane averages the
 *   devices' gradient buffers here and runs the optimizer on the CPU backend over zero-copy tensors
 *   of device 0's parameters (every device's in allreduce mode); a broadcast is a memory copy.
 * - When every device offers a `ResidentReplica` (`device.ts`; WebGPU devices), nothing is averaged or
 *   updated here. The optimizers are created over the devices' own parameter tensors, so SGD and
 *   Adam run as the backend's fused kernels on the GPU; `reduce` moves each peer's gradients of the
 *   group to the averaging device through the staging path and averages them there, in device order,
 *   with the same float32 arithmetic; `broadcast` stages device 0's new parameters of the group to
 *   every peer. Parameters and optimizer state never pass through this thread during a step; they
 *   reach the host only when asked for ({@link DataParallelTrainer.syncParameters}, `verifyReplicas`).
 *   The rollback snapshot is a copy on the device too.
 *
 * @module
 */

import {
  fromStorage,
  type Optimizer,
  type OptimizerState,
  type ParameterEntry,
  TandemError,
  type Tensor,
  tensor,
  ValueError,
} from "../../engine/mod.ts";
import { CpuDevice } from "../devices/cpu_device.ts";
import { type Deferred, deferred } from "./deferred.ts";
import { type ComputeResult, type Device, DeviceError } from "../devices/device.ts";
import { type Interval, measure, overlapLength } from "./intervals.ts";
import { averageInDeviceOrder, hostParameterEntries } from "./host_parameters.ts";
import { groupRange, layoutOf, type ParameterLayout } from "../devices/layout.ts";
import { type LinkSpec, transfer, type TransferTiming, waitUntil } from "./link.ts";
import { buildModel, type ModelSpec } from "../devices/model_spec.ts";
import { dependenciesOf, type Plan, type ReductionMode } from "../plan/plan.ts";
import type { ComputeSpan } from "../devices/protocol.ts";
import type { TraceRecorder } from "./trace.ts";

/** One recorded span of work on a lane, in `performance.now()` milliseconds. */
export interface LaneEvent {
  /** Device index. */
  device: number;
  /** Which lane of that device. */
  lane: "compute" | "comm";
  /** What ran, e.g. `reduce fc`. */
  name: string;
  /** Training iteration. */
  step: number;
  /** Start, `performance.now()` ms. */
  start: number;
  /** End, `performance.now()` ms. */
  end: number;
}

/**
 * What every data-parallel trainer is given, in one process ({@link DataParallelOptions}) or one
 * per MPI rank (`MpiTrainerOptions`): the model, the schedule, the optimizer and the run settings.
 */
export interface ReplicaTrainingOptions {
  /** The model every device builds. */
  model: ModelSpec;
  /** `master` (gather to device 0, update there, broadcast; default) or `allreduce`. */
  mode?: ReductionMode;
  /** The schedule to run (validated beforehand). */
  plan: Plan;
  /** Creates the optimizer for a set of parameters (called once per updating device). */
  optimizer: (parameters: ParameterEntry[]) => Optimizer;
  /** Run seed for dropout (default 0). */
  seed?: number;
  /** A device (or rank) that does not answer within this many seconds fails the step (default 120). */
  timeoutSeconds?: number;
  /** After every step, check that all replicas hold bit-identical parameters (default false). */
  verifyReplicas?: boolean;
  /** Receives every lane event. */
  onEvent?: (event: LaneEvent) => void;
  /** Records every lane event for a Chrome trace (`trace.writeChromeTrace(path)`). */
  trace?: TraceRecorder;
  /**
   * Starts device `index` holding a replica of `model` laid out as `layout` (default: a CPU
   * Worker). Other device kinds (WebGPU, another process) plug in here; the trainers only use the
   * {@link Device} contract.
   */
  startDevice?: (
    index: number,
    model: ModelSpec,
    layout: ParameterLayout,
    timeoutSeconds: number,
  ) => Promise<Device>;
}

/** Options of {@link DataParallelTrainer.create}: devices in this process. */
export interface DataParallelOptions extends ReplicaTrainingOptions {
  /** Number of devices (default 2). */
  devices?: number;
  /** Emulated link between devices; none means shared memory at full speed. */
  link?: LinkSpec;
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
  /** Milliseconds the communication lane was busy. */
  commMs: number;
  /** Milliseconds of communication that overlapped with some device's compute. */
  hiddenCommMs: number;
  /** `hiddenCommMs / commMs`: the fraction of communication hidden behind compute (0 without any). */
  hiddenFraction: number;
}

/**
 * Data-parallel training on N device handles under a schedule.
 *
 * @example
 * ```ts
 * import { DataParallelTrainer } from "./trainer.ts";
 * // const trainer = await DataParallelTrainer.create({ model, plan: overlap(["fc", "conv"]), optimizer: (p) => new SGD(p, { lr: 0.01 }) });
 * // const result = await trainer.step(batch);
 * // await trainer.close();
 * ```
 */
export class DataParallelTrainer {
  readonly #devices: Device[];
  readonly #layout: ParameterLayout;
  readonly #plan: Plan;
  readonly #mode: ReductionMode;
  readonly #optimizers: Optimizer[];
  readonly #reduced: Float32Array[];
  readonly #options: DataParallelOptions;
  /** Receive buffers on the master for each device's gradients (index 0 unused). */
  readonly #received: Float32Array[];
  /** Every device keeps its replica resident (on a GPU): see the module notes. */
  readonly #resident: boolean;
  /** Whether the devices' host `parameters` mirrors hold the resident parameters (resident mode). */
  #mirrorsCurrent = true;
  /** A resident broadcast started by `broadcastParameters`, which the next step waits for. */
  #pendingBroadcast: Promise<void> | undefined;
  #failed: Error | undefined;
  #closed = false;

  private constructor(
    devices: Device[],
    layout: ParameterLayout,
    optimizers: Optimizer[],
    reduced: Float32Array[],
    options: DataParallelOptions,
    resident: boolean,
  ) {
    this.#devices = devices;
    this.#layout = layout;
    this.#plan = options.plan;
    this.#mode = options.mode ?? "master";
    this.#optimizers = optimizers;
    this.#reduced = reduced;
    this.#options = options;
    this.#resident = resident;
    // Resident devices receive gradients in their own memory; no host buffer is needed.
    this.#received = devices.map((d) =>
      d.index === 0 || resident ? new Float32Array(0) : new Float32Array(layout.total)
    );
  }

  /**
   * Builds the model here (for its layout and device 0's initial parameters), starts the devices,
   * and copies device 0's parameters to every replica.
   */
  static async create(options: DataParallelOptions): Promise<DataParallelTrainer> {
    const count = options.devices ?? 2;
    if (!Number.isInteger(count) || count < 1) {
      throw new ValueError("DataParallelTrainer", `devices must be a positive integer, got ${count}`);
    }
    const mode = options.mode ?? "master";
    if (mode !== "master" && mode !== "allreduce") {
      throw new ValueError("DataParallelTrainer", `mode must be "master" or "allreduce", got "${mode}"`);
    }
    const reference = await buildModel(options.model);
    const entries = reference.namedParameters();
    const layout = layoutOf(entries);
    const unknown = options.plan.groups.filter((g) => !layout.groups.some((r) => r.name === g));
    const missing = layout.groups.filter((r) => !options.plan.groups.includes(r.name)).map((r) => r.name);
    if (unknown.length || missing.length) {
      throw new ValueError(
        "DataParallelTrainer",
        `schedule "${options.plan.name}" names groups [${options.plan.groups}] but the model has [${
          layout.groups.map((g) => g.name)
        }]`,
      );
    }
    const initial = new Float32Array(layout.total);
    for (const slot of layout.slots) {
      initial.set(entries.find((e) => e.name === slot.name)!.tensor.dataSync() as Float32Array, slot.offset);
    }
    reference.dispose();
    const timeoutSeconds = options.timeoutSeconds ?? 120;
    const devices: Device[] = [];
    try {
      for (let d = 0; d < count; d++) {
        devices.push(
          options.startDevice
            ? await options.startDevice(d, options.model, layout, timeoutSeconds)
            : await CpuDevice.start(d, options.model, layout, { timeoutSeconds }),
        );
      }
    } catch (error) {
      await Promise.all(devices.map((d) => d.close()));
      throw error;
    }
    for (const device of devices) device.parameters.set(initial);
    if (devices.every((device) => device.resident)) {
      try {
        return DataParallelTrainer.#createResident(devices, layout, options);
      } catch (error) {
        await Promise.all(devices.map((d) => d.close()));
        throw error;
      }
    }
    // The update side works on the devices' shared memory directly through zero-copy tensors.
    const updating = mode === "master" ? [devices[0]] : devices;
    const reduced = updating.map(() => new Float32Array(layout.total));
    const optimizers = updating.map((device, i) =>
      options.optimizer(hostParameterEntries(layout, device.parameters, reduced[i]))
    );
    return new DataParallelTrainer(devices, layout, optimizers, reduced, options, false);
  }

  /**
   * Activates every device's resident replica (the initial parameters are in their `parameters`) and
   * creates the optimizers over the updating devices' own parameter tensors.
   */
  static #createResident(
    devices: Device[],
    layout: ParameterLayout,
    options: DataParallelOptions,
  ): DataParallelTrainer {
    const mode = options.mode ?? "master";
    const count = devices.length;
    for (const device of devices) {
      device.resident!.activate({
        devices: count,
        sendsGradients: count > 1 && (mode === "allreduce" || device.index > 0),
        updates: mode === "allreduce" || device.index === 0,
      });
    }
    const updating = mode === "master" ? [devices[0]] : devices;
    const optimizers = updating.map((device) => options.optimizer([...device.resident!.parameterEntries]));
    return new DataParallelTrainer(devices, layout, optimizers, [], options, true);
  }

  /**
   * Completed iterations: the master optimizer's count, so a state loaded from a checkpoint moves
   * training (and the dropout masks keyed by it) to where it left off.
   */
  get iteration(): number {
    return this.#optimizers[0].iteration;
  }

  /**
   * Device 0's parameters as named entries (the optimizer's view): what to checkpoint, and where to
   * load one. With CPU devices the tensors are over device 0's shared memory; with resident devices
   * (WebGPU) they are device 0's own tensors on its backend, which `saveCheckpoint` reads and
   * `loadCheckpoint` writes as any tensor. Call {@link DataParallelTrainer.broadcastParameters} after
   * writing them.
   */
  get parameterEntries(): readonly ParameterEntry[] {
    return this.#optimizers[0].parameters;
  }

  /**
   * Copies device 0's parameters to every other device, and in allreduce mode device 0's optimizer
   * state to the other optimizers, so all replicas agree again (after loading a checkpoint).
   *
   * With CPU devices the copy is done when this returns. With resident devices (WebGPU) it goes
   * through the staging path and completes with the returned promise; the next step waits for it
   * anyway, so callers that do not await it still train on the broadcast parameters.
   *
   * @example
   * ```ts
   * import { loadCheckpoint } from "../../mod.ts";
   * import type { DataParallelTrainer } from "./trainer.ts";
   * async function resume(trainer: DataParallelTrainer, path: string) {
   *   await loadCheckpoint(path, { parameters: trainer.parameterEntries, optimizer: trainer.optimizer });
   *   await trainer.broadcastParameters();
   * }
   * ```
   */
  broadcastParameters(): Promise<void> {
    if (this.#resident) {
      this.#mirrorsCurrent = false;
      const previous = this.#pendingBroadcast ?? Promise.resolve();
      const broadcast = previous.then(() => this.#broadcastResident());
      // Handled here so a caller that does not await it cannot crash the process; step rethrows.
      broadcast.catch(() => {});
      this.#pendingBroadcast = broadcast;
      return broadcast;
    }
    const master = this.#devices[0].parameters;
    for (const device of this.#devices.slice(1)) device.parameters.set(master);
    if (this.#optimizers.length > 1) {
      const state = this.#optimizers[0].state();
      for (const optimizer of this.#optimizers.slice(1)) optimizer.loadState(state);
    }
    return Promise.resolve();
  }

  /** Resident broadcast: parameters group by group, then (allreduce) the optimizer state. */
  async #broadcastResident(): Promise<void> {
    const [master, ...peers] = this.#devices;
    for (const range of this.#layout.groups) {
      await master.resident!.stageParameters(range.name, (values) => {
        for (const peer of peers) peer.resident!.receiveParameters(range.name, values);
      });
    }
    if (this.#optimizers.length === 1) return;
    // The state tensors live on device 0; each peer's optimizer needs its own on its own backend.
    const state = this.#optimizers[0].state();
    const values = new Map<string, Record<string, Float32Array>>();
    for (const [name, slots] of state.perParameter) {
      const host: Record<string, Float32Array> = {};
      for (const [key, t] of Object.entries(slots)) host[key] = (await t.data()) as Float32Array;
      values.set(name, host);
    }
    for (const optimizer of this.#optimizers.slice(1)) {
      const perParameter = new Map<string, Record<string, Tensor>>();
      for (const p of optimizer.parameters) {
        const backend = p.tensor.backend;
        perParameter.set(
          p.name,
          Object.fromEntries(
            Object.entries(values.get(p.name)!).map((
              [key, v],
            ) => [key, fromStorage(backend, backend.upload(v), p.tensor.shape)]),
          ),
        );
      }
      try {
        optimizer.loadState({ ...state, perParameter });
      } finally {
        for (const slots of perParameter.values()) for (const t of Object.values(slots)) t.dispose();
      }
    }
  }

  /** Waits for a resident broadcast started by `broadcastParameters`, rethrowing its failure. */
  async #settleBroadcast(): Promise<void> {
    const pending = this.#pendingBroadcast;
    this.#pendingBroadcast = undefined;
    await pending;
  }

  /**
   * Brings every device's parameters into its host `parameters` mirror, where
   * {@link DataParallelTrainer.masterParameters} and {@link DataParallelTrainer.divergentReplicas}
   * read them. Needed only with resident devices (WebGPU), whose parameters live on the GPUs; with
   * CPU devices the mirrors are the parameters and this does nothing. Not to be called while a step
   * runs.
   *
   * @example
   * ```ts
   * import type { DataParallelTrainer } from "./trainer.ts";
   * async function finalParameters(trainer: DataParallelTrainer): Promise<Float32Array> {
   *   await trainer.syncParameters();
   *   return trainer.masterParameters();
   * }
   * ```
   */
  async syncParameters(): Promise<void> {
    if (!this.#resident || this.#mirrorsCurrent) return;
    await this.#settleBroadcast();
    await settleAll(this.#devices.map(async (device) => {
      for (const range of this.#layout.groups) {
        await device.resident!.stageParameters(
          range.name,
          (values) => device.parameters.set(values, range.offset),
        );
      }
    }));
    this.#mirrorsCurrent = true;
  }

  /** Throws unless the host mirrors hold the parameters (resident mode needs a sync first). */
  #requireMirrors(what: string): void {
    if (this.#mirrorsCurrent) return;
    throw new TandemError(
      `DataParallelTrainer.${what}: the parameters live on the ${this.#devices[0].kind} devices and have ` +
        `changed since they were last copied to the host; await trainer.syncParameters() first`,
    );
  }

  /** The parameter layout shared by all devices. */
  get layout(): ParameterLayout {
    return this.#layout;
  }

  /** The devices, master first. */
  get devices(): readonly Device[] {
    return this.#devices;
  }

  /** The master's optimizer (device 0's). */
  get optimizer(): Optimizer {
    return this.#optimizers[0];
  }

  /**
   * Device 0's parameters as a flat copy (layout order). With resident devices (WebGPU), call
   * {@link DataParallelTrainer.syncParameters} after the last step first; a stale copy is refused.
   */
  masterParameters(): Float32Array {
    this.#requireMirrors("masterParameters");
    return this.#devices[0].parameters.slice();
  }

  /**
   * Indices of devices whose parameters differ from device 0's in any bit. With resident devices
   * (WebGPU), call {@link DataParallelTrainer.syncParameters} first; a stale comparison is refused.
   */
  divergentReplicas(): number[] {
    this.#requireMirrors("divergentReplicas");
    const master = new Uint32Array(
      this.#devices[0].parameters.buffer,
      this.#devices[0].parameters.byteOffset,
      this.#layout.total,
    );
    const out: number[] = [];
    for (const device of this.#devices.slice(1)) {
      const replica = new Uint32Array(
        device.parameters.buffer,
        device.parameters.byteOffset,
        this.#layout.total,
      );
      for (let i = 0; i < master.length; i++) {
        if (master[i] !== replica[i]) {
          out.push(device.index);
          break;
        }
      }
    }
    return out;
  }

  /**
   * Runs one iteration of the plan on a global batch: splits it into contiguous equal shards in
   * device order, runs every lane, and returns the metrics. On failure the step rejects with the
   * failing device named, and device 0's parameters and optimizer state are as before the step.
   */
  async step(
    batch: HostBatch,
    faults: { device: number; group: string }[] = [],
  ): Promise<DataParallelStepResult> {
    if (this.#closed) throw new TandemError("DataParallelTrainer: closed");
    if (this.#failed) {
      throw new TandemError(`DataParallelTrainer: a device failed earlier: ${this.#failed.message}`);
    }
    const n = this.#devices.length;
    const [batchSize, ...sample] = batch.shape;
    if (batchSize % n !== 0) {
      throw new ValueError(
        "DataParallelTrainer",
        `a batch of ${batchSize} does not split evenly over ${n} devices`,
      );
    }
    const shardSize = batchSize / n, sampleSize = sample.reduce((a, b) => a * b, 1);
    if (this.#resident) {
      await this.#settleBroadcast();
      this.#mirrorsCurrent = false;
    }
    const iteration = this.iteration;
    const started = performance.now();
    const snapshot = this.#resident ? undefined : this.#snapshot();
    const residentSnapshot = this.#resident ? this.#snapshotResident() : undefined;
    const commSpans: Interval[] = [];
    const computeSpans: Interval[] = [];
    const record = (device: number, lane: "compute" | "comm", name: string, start: number, end: number) => {
      (lane === "comm" ? commSpans : computeSpans).push({ start, end });
      const event = { device, lane, name, step: iteration, start, end };
      this.#options.onEvent?.(event);
      this.#options.trace?.record(event);
    };

    // Per device and group, a promise that resolves when that group's gradients are final.
    const ready = this.#devices.map(() => new Map<string, Deferred<void>>());
    for (const perDevice of ready) for (const g of this.#plan.groups) perDevice.set(g, deferred<void>());
    const backwardGroups = this.#plan.steps.filter((s) => s.kind === "backward").map((s) => s.group!);
    const computes: Promise<ComputeResult>[] = this.#devices.map((device, d) =>
      device.compute(
        {
          iteration,
          images: batch.images.subarray(d * shardSize * sampleSize, (d + 1) * shardSize * sampleSize),
          labels: batch.labels.subarray(d * shardSize, (d + 1) * shardSize),
          shape: [shardSize, ...sample],
          sampleOffset: d * shardSize,
          seed: this.#options.seed ?? 0,
          backwardGroups,
          failInGroup: faults.find((f) => f.device === d)?.group,
        },
        (group) => ready[d].get(group)!.resolve(),
      )
    );
    // A failing device fails every wait on it, so the communication lane cannot hang.
    const failure = Promise.race(computes.map((c) => c.then(() => new Promise<never>(() => {})))) as Promise<
      never
    >;
    computes.forEach((c, d) =>
      c.catch((error) => {
        for (const r of ready[d].values()) r.reject(error);
      })
    );
    failure.catch(() => {});

    try {
      for (let i = 0; i < this.#plan.steps.length; i++) {
        const planStep = this.#plan.steps[i];
        if (planStep.lane !== "comm") continue;
        for (const dep of dependenciesOf(this.#plan, i)) {
          const needed = this.#plan.steps[dep];
          if (needed.kind === "backward") await Promise.all(ready.map((r) => r.get(needed.group!)!.promise));
        }
        const start = performance.now();
        await this.#runCommStep(planStep.kind, planStep.group!, record);
        if (planStep.kind !== "broadcast" || this.#mode === "master") {
          record(0, "comm", `${planStep.kind} ${planStep.group}`, start, performance.now());
        }
      }
      const results = await Promise.all(computes);
      for (const optimizer of this.#optimizers) optimizer.finishIteration();
      results.forEach((r, d) => r.spans.forEach((s) => record(d, "compute", s.name, s.start, s.end)));
      if (this.#options.verifyReplicas) {
        // Resident parameters must come to the host to be compared: a debugging aid, not free.
        await this.syncParameters();
        const divergent = this.divergentReplicas();
        if (divergent.length) {
          throw new TandemError(`replicas ${divergent} differ from device 0 after iteration ${iteration}`);
        }
      }
      const hidden = overlapLength(commSpans, computeSpans);
      const commMs = measure(commSpans);
      return {
        iteration,
        loss: results.reduce((s, r) => s + r.loss, 0) / n,
        correct: results.reduce((s, r) => s + r.correct, 0),
        count: results.reduce((s, r) => s + r.count, 0),
        seconds: (performance.now() - started) / 1000,
        commMs,
        hiddenCommMs: hidden,
        hiddenFraction: commMs > 0 ? hidden / commMs : 0,
      };
    } catch (error) {
      await Promise.allSettled(computes);
      if (snapshot) this.#restore(snapshot);
      const cause = error instanceof DeviceError ? error : await firstDeviceError(computes) ?? error;
      if (cause instanceof DeviceError) this.#failed = cause;
      if (residentSnapshot) {
        try {
          this.#restoreResident(residentSnapshot);
        } catch (rollbackError) {
          // An updating device itself is broken (e.g. its GPU was lost); say so with the cause.
          if (cause instanceof Error) {
            cause.message += `; rolling back the updating devices failed too: ${
              (rollbackError as Error).message
            }`;
          }
        }
      }
      throw cause;
    } finally {
      residentSnapshot?.dispose();
    }
  }

  async #runCommStep(
    kind: string,
    group: string,
    record: (device: number, lane: "compute" | "comm", name: string, start: number, end: number) => void,
  ): Promise<void> {
    if (this.#resident) return await this.#runResidentCommStep(kind, group, record);
    const range = groupRange(this.#layout, group);
    const slice = (buffer: Float32Array) => buffer.subarray(range.offset, range.offset + range.size);
    const link = this.#options.link;
    const n = this.#devices.length;
    switch (kind) {
      case "reduce": {
        if (this.#mode === "master") {
          // Each device has its own link to the master; transfers run side by side.
          await Promise.all(
            this.#devices.slice(1).map(async (device) => {
              const t = await transfer(slice(device.gradients), slice(this.#received[device.index]), link);
              record(device.index, "comm", `send ${group} gradients`, t.start, t.end);
            }),
          );
          averageInDeviceOrder(
            [
              slice(this.#devices[0].gradients),
              ...this.#devices.slice(1).map((d) => slice(this.#received[d.index])),
            ],
            slice(this.#reduced[0]),
          );
        } else {
          // Averaged here at once; on an emulated link the step then lasts as long as a ring all-reduce.
          const start = performance.now();
          const average = slice(this.#reduced[0]);
          averageInDeviceOrder(this.#devices.map((d) => slice(d.gradients)), average);
          for (const reduced of this.#reduced.slice(1)) slice(reduced).set(average);
          await emulateRingAllreduce(start, average.byteLength, n, link);
        }
        return;
      }
      case "update":
        for (const optimizer of this.#optimizers) optimizer.step(group);
        return;
      case "broadcast":
        if (this.#mode !== "master") return;
        await Promise.all(
          this.#devices.slice(1).map(async (device) => {
            const t = await transfer(slice(this.#devices[0].parameters), slice(device.parameters), link);
            record(device.index, "comm", `receive ${group} parameters`, t.start, t.end);
          }),
        );
        return;
      default:
        throw new TandemError(`runtime: "${kind}" is not a communication step`);
    }
  }

  /** {@link DataParallelTrainer.#runCommStep} with every device's replica resident. */
  async #runResidentCommStep(
    kind: string,
    group: string,
    record: (device: number, lane: "compute" | "comm", name: string, start: number, end: number) => void,
  ): Promise<void> {
    const bytes = groupRange(this.#layout, group).size * 4;
    const link = this.#options.link;
    const [master, ...peers] = this.#devices.map((d) => d.resident!);
    const n = this.#devices.length;
    switch (kind) {
      case "reduce": {
        if (this.#mode === "master") {
          // Each device has its own link to the master; transfers run side by side.
          await settleAll(
            peers.map(async (peer, i) => {
              const device = i + 1;
              const t = await timedTransfer(
                bytes,
                link,
                () => peer.stageGradients(group, (values) => master.receiveGradients(device, group, values)),
              );
              record(device, "comm", `send ${group} gradients`, t.start, t.end);
            }),
          );
          master.averageGradients(group);
        } else {
          // Every device receives every other one's gradients and averages them itself, in device
          // order, so all replicas compute the same bits; timed as a ring all-reduce, as above.
          const start = performance.now();
          const replicas = [master, ...peers];
          if (n > 1) {
            await settleAll(
              replicas.map((sender, from) =>
                sender.stageGradients(group, (values) => {
                  for (const [to, receiver] of replicas.entries()) {
                    if (to !== from) receiver.receiveGradients(from, group, values);
                  }
                })
              ),
            );
          }
          for (const replica of replicas) replica.averageGradients(group);
          await emulateRingAllreduce(start, bytes, n, link);
        }
        return;
      }
      case "update":
        // The optimizers' tensors are the devices' own: the update kernels run on each device.
        for (const optimizer of this.#optimizers) optimizer.step(group);
        return;
      case "broadcast": {
        if (this.#mode !== "master") return;
        const start = performance.now();
        // One staged copy off the master serves every peer; each peer's own link is timed apart.
        await master.stageParameters(group, (values) => {
          for (const peer of peers) peer.receiveParameters(group, values);
        });
        await Promise.all(
          peers.map(async (_, i) => {
            if (link) {
              await waitUntil(start + (link.latencySeconds + bytes / link.bandwidthBytesPerSecond) * 1000);
            }
            record(i + 1, "comm", `receive ${group} parameters`, start, performance.now());
          }),
        );
        return;
      }
      default:
        throw new TandemError(`runtime: "${kind}" is not a communication step`);
    }
  }

  /**
   * Resident counterpart of {@link DataParallelTrainer.#snapshot}: copies of every updating device's
   * parameters and optimizer state made on that device, where they stay.
   */
  #snapshotResident(): ResidentSnapshot {
    const copies: Tensor[] = [];
    const copy = (t: Tensor): Tensor => {
      const clone = fromStorage(t.backend, t.backend.allocate(t.size, t.dtype), t.shape);
      clone.assign(t);
      copies.push(clone);
      return clone;
    };
    return {
      parameters: this.#optimizers.map((o) => o.parameters.map((p) => copy(p.tensor))),
      optimizers: this.#optimizers.map((o) => {
        const state = o.state();
        const perParameter = new Map<string, Record<string, Tensor>>();
        for (const [name, slots] of state.perParameter) {
          perParameter.set(name, Object.fromEntries(Object.entries(slots).map(([k, t]) => [k, copy(t)])));
        }
        return { ...state, perParameter };
      }),
      dispose: () => {
        for (const t of copies) t.dispose();
      },
    };
  }

  #restoreResident(snapshot: ResidentSnapshot): void {
    this.#optimizers.forEach((optimizer, i) => {
      optimizer.parameters.forEach((p, j) => p.tensor.assign(snapshot.parameters[i][j]));
      optimizer.loadState(snapshot.optimizers[i]);
    });
  }

  /** Copies of what a failed step must put back: every updating device's parameters and state. */
  #snapshot(): Snapshot {
    const updating = this.#mode === "master" ? [this.#devices[0]] : this.#devices;
    return {
      parameters: updating.map((d) => d.parameters.slice()),
      optimizers: this.#optimizers.map((o) => {
        const state = o.state();
        const slots = new Map<string, Record<string, Float32Array>>();
        for (const [name, perSlot] of state.perParameter) {
          slots.set(
            name,
            Object.fromEntries(
              Object.entries(perSlot).map(([k, t]) => [k, (t.dataSync() as Float32Array).slice()]),
            ),
          );
        }
        return { ...state, perParameter: undefined, slots };
      }),
    };
  }

  #restore(snapshot: Snapshot): void {
    const updating = this.#mode === "master" ? [this.#devices[0]] : this.#devices;
    updating.forEach((d, i) => d.parameters.set(snapshot.parameters[i]));
    this.#optimizers.forEach((optimizer, i) => {
      const saved = snapshot.optimizers[i];
      const perParameter = new Map<string, Record<string, Tensor>>();
      const shapes = new Map(this.#layout.slots.map((s) => [s.name, s.shape]));
      for (const [name, slots] of saved.slots) {
        perParameter.set(
          name,
          Object.fromEntries(
            Object.entries(slots).map(([k, v]) => [k, tensor(v, { shape: shapes.get(name)! })]),
          ),
        );
      }
      optimizer.loadState({ ...saved, perParameter });
      for (const slots of perParameter.values()) for (const t of Object.values(slots)) t.dispose();
    });
  }

  /** Stops every device. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    // A broadcast still staging must not find its devices gone; its failure no longer matters.
    await this.#pendingBroadcast?.catch(() => {});
    await Promise.all(this.#devices.map((d) => d.close()));
  }
}

interface Snapshot {
  parameters: Float32Array[];
  optimizers: (Omit<OptimizerState, "perParameter"> & {
    perParameter: undefined;
    slots: Map<string, Record<string, Float32Array>>;
  })[];
}

/** Resident rollback copies, on the devices they were taken from. */
interface ResidentSnapshot {
  /** Per optimizer, its parameters' copies in order. */
  parameters: Tensor[][];
  /** Per optimizer, its state with copied tensors. */
  optimizers: OptimizerState[];
  /** Frees every copy. */
  dispose(): void;
}

/**
 * Runs `move` (a staged transfer of `bytes`) and, with an emulated link, resolves no earlier than
 * the link would have taken, like {@link transfer} does for host memory.
 */
async function timedTransfer(
  bytes: number,
  link: LinkSpec | undefined,
  move: () => Promise<void>,
): Promise<TransferTiming> {
  const start = performance.now();
  await move();
  if (link) await waitUntil(start + (link.latencySeconds + bytes / link.bandwidthBytesPerSecond) * 1000);
  return { start, end: performance.now() };
}

/** Waits for every promise, then throws the first failure, so nothing is still running on error. */
async function settleAll(promises: readonly Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(promises)).find((r) => r.status === "rejected");
  if (failed) throw (failed as PromiseRejectedResult).reason;
}

/**
 * Waits until a ring all-reduce of `bytes` over `devices` devices started at `start` would have
 * finished on `link`: 2(N−1)/N of the bytes cross each link, in 2(N−1) latency-bound steps. No link
 * (shared memory) or one device: no wait.
 */
async function emulateRingAllreduce(
  start: number,
  bytes: number,
  devices: number,
  link: LinkSpec | undefined,
): Promise<void> {
  if (!link || devices < 2) return;
  const seconds = (2 * (devices - 1) / devices) * bytes / link.bandwidthBytesPerSecond +
    2 * (devices - 1) * link.latencySeconds;
  await waitUntil(start + seconds * 1000);
}

async function firstDeviceError(computes: Promise<ComputeResult>[]): Promise<DeviceError | undefined> {
  const settled = await Promise.allSettled(computes);
  for (const s of settled) if (s.status === "rejected" && s.reason instanceof DeviceError) return s.reason;
  return undefined;
}

export type { ComputeSpan };
