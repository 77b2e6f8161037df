/**
 * Data-parallel training across processes and hosts: one MPI rank per device, rank 0 the master,
 * the same plans as the in-process runtime and the same parameters, bit for bit.
 *
 * Each rank hosts one device (a CPU Worker by default) that runs the compute lane, while the
 * rank's main thread runs the plan's communication lane with non-blocking collectives polled
 * between yields to the event loop — so under `overlap` the FC gradients cross the network while
 * the conv gradients are still being computed, in every process.
 *
 * Lossless exactly as the in-process runtime (shared/notes/lossless-data-parallel.md): every rank
 * receives the same global batch and takes its shard (`sampleOffset = rank × shard`), so the
 * dropout masks match; gradients are never summed by MPI (whose order is the library's choice for
 * more than 2 ranks) but gathered and averaged in rank order with the runtime's own
 * {@link averageInDeviceOrder}:
 * - `master`: `MPI_Igather` of each group's gradients to rank 0, which averages, updates and
 *   `MPI_Ibcast`s the group's new parameters;
 * - `allreduce`: `MPI_Iallgather` of each group's gradients, then every rank averages in rank order
 *   and applies the identical update to its own replica.
 * A run under mpirun therefore ends with the parameters an in-process run on as many Worker
 * devices ends with, for the same seed.
 *
 * A failed rank fails the job, never hangs it: see `mpi_transport.ts`.
 *
 * @module
 */

import {
  type Optimizer,
  type OptimizerState,
  type ParameterEntry,
  TandemError,
  type Tensor,
  tensor,
  ValueError,
} from "../../engine/mod.ts";
import { CpuDevice } from "../devices/cpu_device.ts";
import { deferred } from "../runtime/deferred.ts";
import { type Device, DeviceError } from "../devices/device.ts";
import { type Interval, measure, overlapLength } from "../runtime/intervals.ts";
import { averageInDeviceOrder, hostParameterEntries } from "../runtime/host_parameters.ts";
import { groupRange, layoutOf, type ParameterLayout } from "../devices/layout.ts";
import { buildModel } from "../devices/model_spec.ts";
import {
  detectMpiLaunch,
  MpiTransport,
  type MpiTransportOptions,
  TransportError,
  type WaitOptions,
} from "./transport.ts";
import { dependenciesOf, type Plan, type ReductionMode, stepLabel } from "../plan/plan.ts";
import type { DataParallelStepResult, HostBatch, ReplicaTrainingOptions } from "../runtime/trainer.ts";
import type { TraceSpan } from "../runtime/trace.ts";

/**
 * Options of {@link MpiTrainer.create}; every rank must pass the same ones. Per rank: `startDevice`
 * starts this rank's device (`index` is the rank), the optimizer is created on rank 0 (every rank in
 * `allreduce` mode), `timeoutSeconds` also bounds every set-up collective before this rank fails
 * with a {@link TransportError}, and `trace` records this rank's lanes —
 * {@link MpiTrainer.gatherTrace} adds every other rank's to rank 0's recorder, on rank 0's clock.
 */
export interface MpiTrainerOptions extends ReplicaTrainingOptions {
  /** The transport (default: `MpiTransport.init(transportOptions)`). */
  transport?: MpiTransport;
  /** Options for the default transport. */
  transportOptions?: MpiTransportOptions;
}

/** Kernel threads for one of `ranksOnHost` ranks sharing this host's cores (at least 1). */
function cpuThreadsPerRank(ranksOnHost: number): number {
  const cores = Math.max(1, navigator.hardwareConcurrency || 1);
  return Math.max(1, Math.floor(cores / ranksOnHost));
}

const sharedFloats = (length: number) => new Float32Array(new SharedArrayBuffer(4 * length));

/**
 * Data-parallel training with one device per MPI rank. Every rank runs the same program: creates
 * the trainer with the same options, passes the same global batches to {@link MpiTrainer.step}, and
 * makes the same collective calls ({@link MpiTrainer.broadcastParameters},
 * {@link MpiTrainer.gatherTrace}, {@link MpiTrainer.divergentReplicas}) in the same order.
 *
 * @example
 * ```ts ignore
 * // mpirun -np 2 deno run -A train.ts
 * import { MpiTrainer, overlap, SGD } from "@tandem/core";
 * const trainer = await MpiTrainer.create({
 *   model: { kind: "builtin", name: "alexnet-like" },
 *   plan: overlap(["fc", "conv"]),
 *   optimizer: (parameters) => new SGD(parameters, { lr: 0.01, momentum: 0.9 }),
 * });
 * try {
 *   const { loss } = await trainer.step(batch); // the same global batch on every rank
 *   if (trainer.rank === 0) console.log(loss);
 *   await trainer.close();
 *   trainer.transport.finalize();
 * } catch (error) {
 *   console.error(`${error}`);
 *   trainer.transport.abort(1); // the other ranks cannot go on without this one
 * }
 * ```
 */
export class MpiTrainer {
  /** The communicator. */
  readonly transport: MpiTransport;
  readonly #device: Device;
  readonly #layout: ParameterLayout;
  readonly #plan: Plan;
  readonly #mode: ReductionMode;
  readonly #entries: ParameterEntry[];
  readonly #optimizer: Optimizer | undefined;
  /** The averaged gradients the optimizer reads, on ranks that update. */
  readonly #reduced: Float32Array | undefined;
  /** Every rank's gradients of one group, in rank order, on ranks that average. */
  readonly #gathered: Float32Array | undefined;
  readonly #options: MpiTrainerOptions;
  readonly #timeoutMs: number;
  /** `performance.now()` just after a barrier all ranks left together: the ranks' common zero. */
  readonly #clockZero: number;
  #iteration = 0;
  #failed: Error | undefined;
  #closed = false;

  private constructor(
    transport: MpiTransport,
    device: Device,
    layout: ParameterLayout,
    entries: ParameterEntry[],
    optimizer: Optimizer | undefined,
    reduced: Float32Array | undefined,
    gathered: Float32Array | undefined,
    clockZero: number,
    options: MpiTrainerOptions,
  ) {
    this.transport = transport;
    this.#device = device;
    this.#layout = layout;
    this.#plan = options.plan;
    this.#mode = options.mode ?? "master";
    this.#entries = entries;
    this.#optimizer = optimizer;
    this.#reduced = reduced;
    this.#gathered = gathered;
    this.#clockZero = clockZero;
    this.#options = options;
    this.#timeoutMs = (options.timeoutSeconds ?? 120) * 1000;
  }

  /**
   * Collective. Starts MPI if needed, checks that every rank runs the same plan, mode and model,
   * starts this rank's device and gives it rank 0's initial parameters.
   */
  static async create(options: MpiTrainerOptions): Promise<MpiTrainer> {
    const mode = options.mode ?? "master";
    if (mode !== "master" && mode !== "allreduce") {
      throw new ValueError("MpiTrainer", `mode must be "master" or "allreduce", got "${mode}"`);
    }
    const transport = options.transport ?? MpiTransport.init(options.transportOptions);
    const { rank, size } = transport;
    const timeoutSeconds = options.timeoutSeconds ?? 120;
    const within = (): WaitOptions => ({ deadline: performance.now() + timeoutSeconds * 1000 });

    const reference = await buildModel(options.model);
    const named = reference.namedParameters();
    const layout = layoutOf(named);
    const initial = new Float32Array(layout.total);
    for (const slot of layout.slots) {
      initial.set(named.find((e) => e.name === slot.name)!.tensor.dataSync() as Float32Array, slot.offset);
    }
    const modelName = reference.name;
    reference.dispose();
    const unknown = options.plan.groups.filter((g) => !layout.groups.some((r) => r.name === g));
    const missing = layout.groups.filter((r) => !options.plan.groups.includes(r.name)).map((r) => r.name);
    if (unknown.length || missing.length) {
      throw new ValueError(
        "MpiTrainer",
        `schedule "${options.plan.name}" names groups [${options.plan.groups}] but the model has [${
          layout.groups.map((g) => g.name)
        }]`,
      );
    }

    // Collectives pair buffers by call order: ranks running different plans or models would
    // exchange the wrong bytes silently, so they are compared before anything moves.
    const configuration = JSON.stringify({
      mode,
      model: modelName,
      plan: options.plan.steps.map(stepLabel),
      slots: layout.slots.map((s) => `${s.name}:${s.group}:${s.size}`),
    });
    const configurations = await transport.allgatherJson(configuration, within(), "compare configurations");
    const differing = configurations.flatMap((c, r) => c === configurations[0] ? [] : [r]);
    if (differing.length) {
      throw new TransportError(
        rank,
        "compare configurations",
        `found that rank${differing.length > 1 ? "s" : ""} ${differing.join(", ")} run${
          differing.length > 1 ? "" : "s"
        } another plan, reduction mode or model than rank 0`,
      );
    }

    let device: Device | undefined, startFailure: string | null = null;
    try {
      device = options.startDevice
        ? await options.startDevice(rank, options.model, layout, timeoutSeconds)
        : await CpuDevice.start(rank, options.model, layout, {
          timeoutSeconds,
          // The ranks on this host share its cores, as Worker devices in one process do.
          threads: cpuThreadsPerRank(detectMpiLaunch()?.localSize ?? 1),
        });
    } catch (error) {
      startFailure = (error as Error)?.message ?? String(error);
    }
    // Every rank learns whether every device started, so all fail together instead of waiting.
    const starts = await transport.allgatherJson(startFailure, within(), "start devices");
    const firstFailed = starts.findIndex((s) => s !== null);
    if (firstFailed >= 0) {
      await device?.close();
      const what = starts.flatMap((s, r) => s === null ? [] : [`rank ${r}: ${s}`]).join("; ");
      throw new DeviceError(firstFailed, `could not start on every rank (${what})`);
    }
    try {
      device!.parameters.set(initial);
      await transport.broadcast(device!.parameters, 0, "broadcast initial parameters").wait(within());
      // Rank 0 averages and updates in master mode; every rank does in allreduce mode.
      const updates = mode === "allreduce" || rank === 0;
      const reduced = updates ? sharedFloats(layout.total) : undefined;
      const largestGroup = Math.max(...layout.groups.map((g) => g.size));
      const gathered = updates ? sharedFloats(size * largestGroup) : undefined;
      const entries = hostParameterEntries(layout, device!.parameters, reduced);
      const optimizer = updates ? options.optimizer(entries) : undefined;
      await transport.barrier("synchronise clocks").wait(within());
      const clockZero = performance.now();
      return new MpiTrainer(
        transport,
        device!,
        layout,
        entries,
        optimizer,
        reduced,
        gathered,
        clockZero,
        options,
      );
    } catch (error) {
      await device!.close();
      throw error;
    }
  }

  /** This process's rank; rank 0 is the master. */
  get rank(): number {
    return this.transport.rank;
  }

  /** Number of ranks, one device each. */
  get size(): number {
    return this.transport.size;
  }

  /** Completed iterations (after a resume: where the checkpoint left off, once broadcast). */
  get iteration(): number {
    return this.#optimizer?.iteration ?? this.#iteration;
  }

  /**
   * This rank's parameters as named entries over its device's memory: on rank 0, what to
   * checkpoint and where to load one (then call {@link MpiTrainer.broadcastParameters}).
   */
  get parameterEntries(): readonly ParameterEntry[] {
    return this.#optimizer?.parameters ?? this.#entries;
  }

  /** The parameter layout shared by all ranks. */
  get layout(): ParameterLayout {
    return this.#layout;
  }

  /** This rank's device. */
  get device(): Device {
    return this.#device;
  }

  /**
   * This rank's optimizer. Rank 0 always has one; in `master` mode the other ranks do not update
   * and have none (asking throws).
   */
  get optimizer(): Optimizer {
    if (!this.#optimizer) {
      throw new TandemError(
        `MpiTrainer: rank ${this.rank} has no optimizer: in master mode only rank 0 updates`,
      );
    }
    return this.#optimizer;
  }

  /**
   * Nothing to do: this rank's device exposes its parameters in host memory, which is what
   * {@link MpiTrainer.masterParameters} reads. Present so code written for `DataParallelTrainer`
   * (whose resident GPU devices need it) runs unchanged.
   */
  syncParameters(): Promise<void> {
    return Promise.resolve();
  }

  /** This rank's parameters as a flat copy (layout order); all ranks agree after every step. */
  masterParameters(): Float32Array {
    return this.#device.parameters.slice();
  }

  /**
   * Collective. Sends rank 0's parameters, iteration and (in `allreduce` mode, where every rank
   * updates) optimizer state to every rank: after loading a checkpoint on rank 0.
   */
  async broadcastParameters(): Promise<void> {
    const wait = { deadline: performance.now() + this.#timeoutMs };
    const transport = this.transport;
    await transport.broadcast(this.#device.parameters, 0, "broadcast parameters").wait(wait);
    if (this.#mode === "master") {
      const iteration = await transport.broadcastJson(this.iteration, 0, wait, "broadcast iteration");
      this.#iteration = iteration;
      return;
    }
    // allreduce: every optimizer must continue from rank 0's state (momentum, counts, iteration).
    const optimizer = this.optimizer;
    const state = this.rank === 0 ? optimizer.state() : undefined;
    const slots: { name: string; slot: string; shape: number[]; offset: number; size: number }[] = [];
    let total = 0;
    for (const [name, perSlot] of state?.perParameter ?? []) {
      for (const [slot, t] of Object.entries(perSlot)) {
        slots.push({ name, slot, shape: [...t.shape], offset: total, size: t.size });
        total += t.size;
      }
    }
    const header = await transport.broadcastJson(
      state ? { iteration: state.iteration, hyper: state.hyper, updates: state.updates, slots, total } : null,
      0,
      wait,
      "broadcast optimizer state",
    );
    const values = sharedFloats(header!.total);
    if (state) {
      for (const s of slots) {
        values.set(state.perParameter.get(s.name)![s.slot].dataSync() as Float32Array, s.offset);
      }
    }
    await transport.broadcast(values, 0, "broadcast optimizer state").wait(wait);
    if (this.rank === 0) return;
    const perParameter = new Map<string, Record<string, Tensor>>();
    for (const s of header!.slots) {
      const record = perParameter.get(s.name) ?? {};
      record[s.slot] = tensor(values.slice(s.offset, s.offset + s.size), { shape: s.shape });
      perParameter.set(s.name, record);
    }
    const loaded: OptimizerState = {
      iteration: header!.iteration,
      hyper: header!.hyper,
      updates: header!.updates,
      perParameter,
    };
    try {
      optimizer.loadState(loaded);
    } finally {
      for (const record of perParameter.values()) for (const t of Object.values(record)) t.dispose();
    }
  }

  /**
   * Collective. Runs one iteration of the plan: every rank passes the same global batch and computes
   * on its contiguous shard (`rank × shard …`). Returns the global figures (loss averaged and
   * accuracy counted over every rank's shard, as the in-process runtime reports them) with this
   * rank's timing. A failure names the rank and step; the job cannot continue after one (other
   * ranks are waiting in collectives), so print it and call `transport.abort`.
   */
  async step(batch: HostBatch): Promise<DataParallelStepResult> {
    if (this.#closed) throw new TandemError("MpiTrainer: closed");
    if (this.#failed) {
      throw new TandemError(`MpiTrainer: rank ${this.rank} failed earlier: ${this.#failed.message}`);
    }
    const n = this.size, rank = this.rank;
    const [batchSize, ...sample] = batch.shape;
    if (batchSize % n !== 0) {
      throw new ValueError("MpiTrainer", `a batch of ${batchSize} does not split evenly over ${n} ranks`);
    }
    const shardSize = batchSize / n, sampleSize = sample.reduce((a, b) => a * b, 1);
    const iteration = this.iteration;
    const started = performance.now();
    const wait: WaitOptions = { deadline: started + this.#timeoutMs, step: iteration };
    const commSpans: Interval[] = [], computeSpans: Interval[] = [];
    const record = (lane: "compute" | "comm", name: string, start: number, end: number) => {
      (lane === "comm" ? commSpans : computeSpans).push({ start, end });
      const event = { device: rank, lane, name, step: iteration, start, end };
      this.#options.onEvent?.(event);
      this.#options.trace?.record(event);
    };

    const ready = new Map(this.#plan.groups.map((g) => [g, deferred<void>()]));
    const backwardGroups = this.#plan.steps.filter((s) => s.kind === "backward").map((s) => s.group!);
    const compute = this.#device.compute(
      {
        iteration,
        images: batch.images.subarray(rank * shardSize * sampleSize, (rank + 1) * shardSize * sampleSize),
        labels: batch.labels.subarray(rank * shardSize, (rank + 1) * shardSize),
        shape: [shardSize, ...sample],
        sampleOffset: rank * shardSize,
        seed: this.#options.seed ?? 0,
        backwardGroups,
      },
      (group) => ready.get(group)!.resolve(),
    );
    compute.catch((error) => {
      for (const r of ready.values()) r.reject(error);
    });
    // While the device computes, waits leave the CPU to it; afterwards they may poll at full speed.
    let computing = true;
    compute.then(() => computing = false, () => computing = false);
    // Named if mpirun stops this rank mid-step (see MpiTransportOptions.reportTermination).
    this.transport.activity = `computing step ${iteration}`;

    try {
      for (let i = 0; i < this.#plan.steps.length; i++) {
        const planStep = this.#plan.steps[i];
        if (planStep.lane !== "comm") continue;
        for (const dep of dependenciesOf(this.#plan, i)) {
          const needed = this.#plan.steps[dep];
          if (needed.kind === "backward") await ready.get(needed.group!)!.promise;
        }
        const start = performance.now();
        const ran = await this.#runCommStep(planStep.kind, planStep.group!, { ...wait, shareCpu: computing });
        if (ran) record("comm", `${planStep.kind} ${planStep.group}`, start, performance.now());
      }
      const result = await compute;
      this.#optimizer?.finishIteration();
      this.#iteration = iteration + 1;
      result.spans.forEach((s) => record("compute", s.name, s.start, s.end));

      // Every rank's loss and counts, combined in rank order as the in-process runtime combines them.
      const mine = new Float64Array(new SharedArrayBuffer(24));
      mine.set([result.loss, result.correct, result.count]);
      const all = new Float64Array(new SharedArrayBuffer(24 * n));
      await this.transport.allgather(mine, all, "share step results").wait(wait);
      let loss = 0, correct = 0, count = 0;
      for (let r = 0; r < n; r++) {
        loss += all[3 * r];
        correct += all[3 * r + 1];
        count += all[3 * r + 2];
      }
      if (this.#options.verifyReplicas) {
        const divergent = await this.divergentReplicas();
        if (divergent.length) {
          throw new TandemError(
            `MPI rank ${rank}: replicas of rank ${
              divergent.join(", ")
            } differ from rank 0 after iteration ${iteration}`,
          );
        }
      }
      const hidden = overlapLength(commSpans, computeSpans);
      const commMs = measure(commSpans);
      return {
        iteration,
        loss: loss / n,
        correct,
        count,
        seconds: (performance.now() - started) / 1000,
        commMs,
        hiddenCommMs: hidden,
        hiddenFraction: commMs > 0 ? hidden / commMs : 0,
      };
    } catch (error) {
      // The ranks are now out of step with each other; only a new job can continue.
      this.#failed = error as Error;
      if (error instanceof DeviceError) {
        const reason = error.message.replace(/^device \d+: /, "");
        throw new DeviceError(error.device, `${reason} (MPI rank ${rank}, step ${iteration})`);
      }
      throw error;
    } finally {
      this.transport.activity = undefined;
    }
  }

  /** Runs one communication step; false when it is a no-op on this rank's mode. */
  async #runCommStep(kind: string, group: string, wait: WaitOptions): Promise<boolean> {
    const range = groupRange(this.#layout, group);
    const slice = (buffer: Float32Array) => buffer.subarray(range.offset, range.offset + range.size);
    const transport = this.transport, n = this.size;
    switch (kind) {
      case "reduce": {
        const gathered = this.#gathered?.subarray(0, n * range.size);
        const gradients = slice(this.#device.gradients);
        if (this.#mode === "master") {
          await transport.gather(gradients, gathered, 0, `reduce ${group}`).wait(wait);
        } else {
          await transport.allgather(gradients, gathered!, `reduce ${group}`).wait(wait);
        }
        if (gathered) {
          const perRank = Array.from(
            { length: n },
            (_, r) => gathered.subarray(r * range.size, (r + 1) * range.size),
          );
          averageInDeviceOrder(perRank, slice(this.#reduced!));
        }
        return true;
      }
      case "update":
        this.#optimizer?.step(group);
        return this.#optimizer !== undefined;
      case "broadcast":
        if (this.#mode !== "master") return false;
        await transport.broadcast(slice(this.#device.parameters), 0, `broadcast ${group}`).wait(wait);
        return true;
      default:
        throw new TandemError(`MpiTrainer: "${kind}" is not a communication step`);
    }
  }

  /**
   * Collective. Ranks whose parameters differ from rank 0's in any bit (compared by SHA-256), the
   * same answer on every rank.
   */
  async divergentReplicas(): Promise<number[]> {
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", this.#device.parameters.slice()));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
    const all = await this.transport.allgatherJson(
      hex,
      { deadline: performance.now() + this.#timeoutMs },
      "compare replicas",
    );
    return all.flatMap((h, r) => h === all[0] ? [] : [r]);
  }

  /**
   * Collective. Sends every rank's recorded spans to rank 0, whose `trace` then holds every rank's
   * lanes (device = rank), on rank 0's clock. The other ranks' recorders keep their own spans.
   */
  async gatherTrace(): Promise<void> {
    const own: TraceSpan[] = (this.#options.trace?.spans ?? []).filter((s) => s.device === this.rank)
      .map((s) => ({ ...s, start: s.start - this.#clockZero, end: s.end - this.#clockZero }));
    const parts = await this.transport.gatherBytes(
      new TextEncoder().encode(JSON.stringify(own)),
      0,
      { deadline: performance.now() + this.#timeoutMs },
      "gather traces",
    );
    if (!parts || !this.#options.trace) return;
    for (const [r, part] of parts.entries()) {
      if (r === this.rank) continue;
      for (const s of JSON.parse(new TextDecoder().decode(part)) as TraceSpan[]) {
        this.#options.trace.record({ ...s, start: s.start + this.#clockZero, end: s.end + this.#clockZero });
      }
    }
  }

  /** Stops this rank's device. MPI stays up: call `transport.finalize()` when the process is done. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#device.close();
  }
}
