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
 * @module
 */

import {
  fromStorage,
  getBackend,
  type Optimizer,
  type OptimizerState,
  type ParameterEntry,
  TandemError,
  type Tensor,
  tensor,
  ValueError,
} from "../engine/mod.ts";
import { CpuDevice } from "./cpu_device.ts";
import { type ComputeResult, type Device, DeviceError } from "./device.ts";
import { type Interval, measure, overlapLength } from "./intervals.ts";
import { groupRange, layoutOf, type ParameterLayout } from "./layout.ts";
import { type LinkSpec, transfer, waitUntil } from "./link.ts";
import { buildModel, type ModelSpec } from "./model_spec.ts";
import { dependenciesOf, type Plan, type ReductionMode } from "./plan.ts";
import type { ComputeSpan } from "./protocol.ts";
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

/** Options of {@link DataParallelTrainer.create}. */
export interface DataParallelOptions {
  /** The model every device builds. */
  model: ModelSpec;
  /** Number of devices (default 2). */
  devices?: number;
  /** `master` (gather to device 0, update there, broadcast; default) or `allreduce`. */
  mode?: ReductionMode;
  /** The schedule to run (validated beforehand). */
  plan: Plan;
  /** Creates the optimizer for a set of parameters (called once per updating device). */
  optimizer: (parameters: ParameterEntry[]) => Optimizer;
  /** Emulated link between devices; none means shared memory at full speed. */
  link?: LinkSpec;
  /** Run seed for dropout (default 0). */
  seed?: number;
  /** A device that does not answer within this many seconds fails the step (default 120). */
  timeoutSeconds?: number;
  /** After every step, check that all replicas hold bit-identical parameters (default false). */
  verifyReplicas?: boolean;
  /** Receives every lane event. */
  onEvent?: (event: LaneEvent) => void;
  /** Records every lane event for a Chrome trace (`trace.writeChromeTrace(path)`). */
  trace?: TraceRecorder;
  /**
   * Starts device `index` holding a replica of `model` laid out as `layout` (default: a CPU
   * Worker). Other device kinds (WebGPU, another process) plug in here; the runtime only uses the
   * {@link Device} contract.
   */
  startDevice?: (
    index: number,
    model: ModelSpec,
    layout: ParameterLayout,
    timeoutSeconds: number,
  ) => Promise<Device>;
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
 * import { DataParallelTrainer } from "./runtime.ts";
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
  #failed: Error | undefined;
  #closed = false;

  private constructor(
    devices: Device[],
    layout: ParameterLayout,
    optimizers: Optimizer[],
    reduced: Float32Array[],
    options: DataParallelOptions,
  ) {
    this.#devices = devices;
    this.#layout = layout;
    this.#plan = options.plan;
    this.#mode = options.mode ?? "master";
    this.#optimizers = optimizers;
    this.#reduced = reduced;
    this.#options = options;
    this.#received = devices.map((d) => d.index === 0 ? new Float32Array(0) : new Float32Array(layout.total));
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
    // The update side works on the devices' shared memory directly through zero-copy tensors.
    const backend = getBackend();
    if (!backend.wrap) {
      throw new TandemError(`DataParallelTrainer: backend "${backend.name}" cannot wrap host memory`);
    }
    const updating = mode === "master" ? [devices[0]] : devices;
    const reduced = updating.map(() => new Float32Array(layout.total));
    const optimizers = updating.map((device, i) => {
      const parameters: ParameterEntry[] = layout.slots.map((slot) => {
        const view = (buffer: Float32Array) => buffer.subarray(slot.offset, slot.offset + slot.size);
        const tensor: Tensor = fromStorage(backend, backend.wrap!(view(device.parameters)), slot.shape);
        tensor.requiresGrad = true;
        tensor.grad = fromStorage(backend, backend.wrap!(view(reduced[i])), slot.shape);
        return { name: slot.name, tensor, group: slot.group, lrMult: slot.lrMult, decayMult: slot.decayMult };
      });
      return options.optimizer(parameters);
    });
    return new DataParallelTrainer(devices, layout, optimizers, reduced, options);
  }

  /**
   * Completed iterations: the master optimizer's count, so a state loaded from a checkpoint moves
   * training (and the dropout masks keyed by it) to where it left off.
   */
  get iteration(): number {
    return this.#optimizers[0].iteration;
  }

  /**
   * Device 0's parameters as named entries over its shared memory (the optimizer's view): what to
   * checkpoint, and where to load one. Call {@link DataParallelTrainer.broadcastParameters} after
   * writing them.
   */
  get parameterEntries(): readonly ParameterEntry[] {
    return this.#optimizers[0].parameters;
  }

  /**
   * Copies device 0's parameters to every other device, and in allreduce mode device 0's optimizer
   * state to the other optimizers, so all replicas agree again (after loading a checkpoint).
   */
  broadcastParameters(): void {
    const master = this.#devices[0].parameters;
    for (const device of this.#devices.slice(1)) device.parameters.set(master);
    if (this.#optimizers.length > 1) {
      const state = this.#optimizers[0].state();
      for (const optimizer of this.#optimizers.slice(1)) optimizer.loadState(state);
    }
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

  /** Device 0's parameters as a flat copy (layout order). */
  masterParameters(): Float32Array {
    return this.#devices[0].parameters.slice();
  }

  /** Indices of devices whose parameters differ from device 0's in any bit. */
  divergentReplicas(): number[] {
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
    const iteration = this.iteration;
    const started = performance.now();
    const snapshot = this.#snapshot();
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
      this.#restore(snapshot);
      const cause = error instanceof DeviceError ? error : await firstDeviceError(computes) ?? error;
      if (cause instanceof DeviceError) this.#failed = cause;
      throw cause;
    }
  }

  async #runCommStep(
    kind: string,
    group: string,
    record: (device: number, lane: "compute" | "comm", name: string, start: number, end: number) => void,
  ): Promise<void> {
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
          // Ring all-reduce: 2(N−1)/N of the bytes cross each link, in 2(N−1) latency-bound steps.
          const start = performance.now();
          const average = slice(this.#reduced[0]);
          averageInDeviceOrder(this.#devices.map((d) => slice(d.gradients)), average);
          for (const reduced of this.#reduced.slice(1)) slice(reduced).set(average);
          if (link && n > 1) {
            const seconds = (2 * (n - 1) / n) * average.byteLength / link.bandwidthBytesPerSecond +
              2 * (n - 1) * link.latencySeconds;
            await waitUntil(start + seconds * 1000);
          }
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
    await Promise.all(this.#devices.map((d) => d.close()));
  }
}

/** `out = (g0 + g1 + … + g(N−1)) · (1/N)`, summed in device order in float32. */
export function averageInDeviceOrder(gradients: readonly Float32Array[], out: Float32Array): void {
  out.set(gradients[0]);
  for (let d = 1; d < gradients.length; d++) {
    const g = gradients[d];
    for (let i = 0; i < out.length; i++) out[i] += g[i];
  }
  if (gradients.length > 1) {
    const scale = Math.fround(1 / gradients.length);
    for (let i = 0; i < out.length; i++) out[i] *= scale;
  }
}

interface Snapshot {
  parameters: Float32Array[];
  optimizers: (Omit<OptimizerState, "perParameter"> & {
    perParameter: undefined;
    slots: Map<string, Record<string, Float32Array>>;
  })[];
}

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (error: unknown) => void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void, reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => {});
  return { promise, resolve, reject };
}

async function firstDeviceError(computes: Promise<ComputeResult>[]): Promise<DeviceError | undefined> {
  const settled = await Promise.allSettled(computes);
  for (const s of settled) if (s.status === "rejected" && s.reason instanceof DeviceError) return s.reason;
  return undefined;
}

export type { ComputeSpan };
