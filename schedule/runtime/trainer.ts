/**
 * The data-parallel trainer and its plan executor: one step skeleton that runs any validated plan on
 * N devices over any {@link Exchange} — CPU Workers sharing memory, GPU-resident replicas, or one
 * device per MPI rank.
 *
 * Each device's compute lane runs forward and the backward groups in plan order and announces each
 * group's gradients as they become final. The communication lane (this thread) walks the plan's
 * `reduce`, `update` and `broadcast` steps in order, each starting as soon as the backward steps it
 * depends on are done on every device of this process — so under `overlap` the FC gradients are
 * shipped, averaged and applied while the devices are still computing conv gradients.
 *
 * Lossless by construction (invariants of lossless data-parallel training):
 * - gradients are averaged in device order, `(g0 + g1 + … + g(N−1)) · fround(1/N)` in float32, by
 *   every exchange, whatever order they arrive in;
 * - updates are per group and elementwise, so applying `fc` before `conv` changes no bit;
 * - the devices run the same kernels on the same values under every schedule, because the
 *   segmented backward is the same backward (`replicaStep`);
 * - dropout is keyed by (seed, iteration, layer, global sample index), so shards draw the masks the
 *   whole batch would;
 * - replicas start from device 0's parameters and receive them (master mode) or apply identical
 *   updates to identical inputs (allreduce mode).
 *
 * A failed step is undone without copying everything each step: an update that may still be
 * followed by a failure (a device still computing, or a later step that can fail) is `undoable`,
 * which copies that group's parameters and optimizer state just before it overwrites them. An update
 * placed after every backward waits for the devices to finish and, where the exchange's remaining
 * steps cannot fail (shared memory), needs no copy: `sequential` copies nothing, `overlap` copies the
 * FC group while the conv backward runs.
 *
 * @module
 */

import {
  type BufferEntry,
  type LrPolicy,
  type Optimizer,
  type ParameterEntry,
  TandemError,
  ValueError,
} from "../../engine/mod.ts";
import { type BufferLayout, hostBufferEntries } from "../devices/buffer_layout.ts";
import { type ComputeResult, type Device, DeviceError } from "../devices/device.ts";
import type { ParameterLayout } from "../devices/parameter_layout.ts";
import type { ModelSpec } from "../devices/model_spec.ts";
import type { MpiTransport, MpiTransportOptions } from "../mpi/transport.ts";
import { MpiActivations } from "../mpi/activations.ts";
import { MpiExchange } from "../mpi/exchange.ts";
import { dependenciesOf, type Plan, type ReductionMode } from "../plan/plan.ts";
import { type Deferred, deferred } from "./deferred.ts";
import type { Exchange, ExchangeContext } from "./exchange.ts";
import { type LaneSpan, type StepFigures, stepFigures } from "./figures.ts";
import type { Link } from "./link.ts";
import { HybridHead, SharedActivations } from "./hybrid.ts";
import { ResidentExchange } from "./resident_exchange.ts";
import { referenceOf, startInProcess } from "./start.ts";
import type { TraceRecorder } from "./trace.ts";
import { checkWireOptions, type WireFormat } from "./wire.ts";
import { checkUpdatedGroup, DivergenceError, isNonFiniteLoss } from "./finite.ts";

/** One recorded span of work on a lane, in `performance.now()` milliseconds. */
export interface LaneEvent extends LaneSpan {
  /** Device index (the MPI rank under MPI). */
  device: number;
  /** Training iteration. */
  step: number;
  /** Bytes a transfer moved (for gradients: as sent on the wire, 2 per value for fp16/bf16). */
  bytes?: number;
}

/** Options of {@link DataParallelTrainer.create}. */
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
   * MPI: gradients and parameters travel in chunks of at most this many bytes, pipelined so that
   * averaging, updating and sending back one chunk overlap the transfer of the next (default 1 MiB).
   */
  chunkBytes?: number;
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
  /** A device (or rank) that does not answer within this many seconds fails the step (default 120). */
  timeoutSeconds?: number;
  /** After every step, check that all replicas hold bit-identical parameters (default false). */
  verifyReplicas?: boolean;
  /**
   * After every update, check the group's new parameters for NaN and ±∞ (one backend reduction,
   * started on the communication lane right after the update, so an update behind compute is
   * checked behind it too, and awaited at the end of the step), and check the loss. A non-finite
   * one fails the step with a {@link DivergenceError} naming the step and tensor, and the step is
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
   * {@link DataParallelTrainer.residuals} and restore them with `resumeResiduals` (`residuals.ts`).
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
 * Data-parallel training on N device handles under a schedule, in this process or across MPI ranks.
 *
 * @example
 * ```ts
 * import { DataParallelTrainer } from "./trainer.ts";
 * // const trainer = await DataParallelTrainer.create({ model, plan: overlapPlan(["fc", "conv"]), optimizer: (p) => new SGD(p, { lr: 0.01 }) });
 * // const result = await trainer.step(batch);
 * // await trainer.close();
 * ```
 */
export class DataParallelTrainer {
  readonly #exchange: Exchange;
  readonly #layout: ParameterLayout;
  readonly #plan: Plan;
  readonly #options: DataParallelOptions;
  readonly #timeoutMs: number;
  /** The model-parallel head of a hybrid plan (see `hybrid.ts`); absent for data-parallel plans. */
  readonly #hybrid: HybridHead | undefined;
  /** The model's buffers (BatchNorm statistics), one set per device, never exchanged. */
  readonly #buffers: BufferLayout;
  #bufferEntries: BufferEntry[] | undefined;
  /** Completed iterations, for a process without an optimizer (an MPI rank in master mode). */
  #iteration = 0;
  #failed: Error | undefined;
  #closed = false;

  private constructor(
    exchange: Exchange,
    layout: ParameterLayout,
    options: DataParallelOptions,
    hybrid: HybridHead | undefined,
    buffers: BufferLayout,
  ) {
    this.#exchange = exchange;
    this.#buffers = buffers;
    this.#hybrid = hybrid;
    this.#layout = layout;
    this.#plan = options.plan;
    this.#options = options;
    this.#timeoutMs = (options.timeoutSeconds ?? 120) * 1000;
  }

  /**
   * Builds the model here (for its layout and device 0's initial parameters), starts the devices
   * (this rank's one under MPI), and gives every replica device 0's parameters. Collective under MPI.
   */
  static async create(options: DataParallelOptions): Promise<DataParallelTrainer> {
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
    checkWireOptions(options);
    // Under MPI the ranks are counted once the transport is up; the split is checked again then.
    const reference = await referenceOf(options, options.transport ? 1 : count);
    // A model with buffers (BatchNorm statistics) on a hybrid plan was refused there, before any
    // device starts; every device kind keeps its own replica's (`checkBuffersCarried`).
    const buffers = reference.buffers ?? { slots: [], total: 0 };
    const exchange = options.transport
      ? await MpiExchange.create(options, reference)
      : await startInProcess(options, reference, count);
    let hybrid: HybridHead | undefined;
    if (reference.head) {
      try {
        const head = { ...reference.head, devices: exchange.size };
        const route = exchange instanceof MpiExchange
          ? new MpiActivations(exchange.transport, head, options.timeoutSeconds ?? 120)
          : new SharedActivations(exchange.size, head, options.link);
        hybrid = new HybridHead(head, exchange.local, reference.layout, options.optimizer, route, {
          resident: exchange instanceof ResidentExchange,
        });
      } catch (error) {
        await exchange.close();
        throw error;
      }
    }
    return new DataParallelTrainer(exchange, reference.layout, options, hybrid, buffers);
  }

  /** How the devices are joined: `shared memory`, `GPU-resident` or `MPI`. */
  get exchange(): string {
    return this.#exchange.name;
  }

  /** This process's rank (0 when every device is in this process). */
  get rank(): number {
    return this.#exchange.rank;
  }

  /** Devices in the run (ranks under MPI). */
  get size(): number {
    return this.#exchange.size;
  }

  /** The devices this process drives, master first (this rank's one under MPI). */
  get devices(): readonly Device[] {
    return this.#exchange.local;
  }

  /** The parameter layout shared by all devices. */
  get layout(): ParameterLayout {
    return this.#layout;
  }

  /**
   * Completed iterations: the master optimizer's count, so a state loaded from a checkpoint moves
   * training (and the dropout masks keyed by it) to where it left off.
   */
  get iteration(): number {
    return this.#exchange.optimizers[0]?.iteration ?? this.#iteration;
  }

  /**
   * The master's optimizer (device 0's; under MPI this rank's, which in master mode only rank 0
   * has — asking elsewhere throws).
   */
  get optimizer(): Optimizer {
    const optimizer = this.#exchange.optimizers[0];
    if (!optimizer) {
      throw new TandemError(
        `DataParallelTrainer: rank ${this.rank} has no optimizer: in master mode only rank 0 updates`,
      );
    }
    return optimizer;
  }

  /**
   * The master's parameters as named entries (the optimizer's view): what to checkpoint, and where
   * to load one — then call {@link DataParallelTrainer.broadcastParameters}. With CPU devices the
   * tensors are over device 0's shared memory; with resident devices (WebGPU) they are device 0's
   * own tensors, which `saveCheckpoint` reads and `loadCheckpoint` writes as any tensor.
   */
  get parameterEntries(): readonly ParameterEntry[] {
    return this.#exchange.parameterEntries;
  }

  /** Where the model's buffers (BatchNorm statistics) lie in each device's `buffers` (`total` 0: none). */
  get bufferLayout(): BufferLayout {
    return this.#buffers;
  }

  /**
   * Device 0's buffers as named entries over its host array (empty without buffers): the statistics
   * of the model to evaluate and checkpoint, as Caffe's root solver and PyTorch DDP's rank 0 keep
   * them. A checkpoint loaded into them reaches every replica with
   * {@link DataParallelTrainer.broadcastParameters}. Each device keeps its own statistics otherwise.
   */
  get bufferEntries(): readonly BufferEntry[] {
    if (this.#buffers.total === 0) return [];
    this.#bufferEntries ??= hostBufferEntries(this.#buffers, this.#exchange.local[0].buffers!);
    return this.#bufferEntries;
  }

  /**
   * A flat copy of device 0's buffers, in {@link DataParallelTrainer.bufferLayout} order (under MPI,
   * this rank's own, which on rank 0 are the master's).
   */
  masterBuffers(): Float32Array {
    return this.#buffers.total ? this.#exchange.local[0].buffers!.slice() : new Float32Array(0);
  }

  /**
   * Gives every optimizer of this process (the replicas' and a hybrid head's slices) the learning-
   * rate policy `lr` from the next update on: a resumed run's new `--lr` or batch. Under MPI every
   * rank calls it with the same policy.
   */
  setLrPolicy(lr: number | LrPolicy): void {
    for (const optimizer of [...this.#exchange.optimizers, ...this.#hybrid?.optimizers ?? []]) {
      optimizer.setLrPolicy(lr);
    }
  }

  /**
   * Copies the master's parameters to every replica, and, where peers update (allreduce), its
   * optimizer state and iteration: after loading a checkpoint. Collective under MPI. With resident
   * devices the next step waits for it, so callers that do not await it still train on it.
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
  async broadcastParameters(): Promise<void> {
    this.#iteration = await this.#exchange.broadcastParameters(this.iteration);
    // Device 0's buffers (a loaded checkpoint's statistics) become every replica's.
    if (this.#buffers.total > 0) {
      const master = this.#exchange.local[0].buffers!;
      for (const device of this.#exchange.local.slice(1)) device.buffers!.set(master);
    }
    // Hybrid: every device took the whole head's parameters; each slice optimizer takes its state.
    await this.#hybrid?.scatter(this.rank === 0 ? this.#exchange.optimizers[0] : undefined);
  }

  /**
   * Brings every device's parameters into its host `parameters` mirror, where
   * {@link DataParallelTrainer.masterParameters} and {@link DataParallelTrainer.divergentReplicas}
   * read them. Only resident devices (WebGPU) need it; elsewhere it does nothing. Not during a step.
   */
  async syncParameters(): Promise<void> {
    await this.#exchange.syncParameters();
    // Hybrid: the master's copy of the head is whole only once every device's slice is in it.
    const master = this.rank === 0;
    await this.#hybrid?.gather(
      master ? this.#exchange.local[0].parameters : undefined,
      master ? this.#exchange.optimizers[0] : undefined,
    );
  }

  /**
   * The master's parameters as a flat copy in layout order (under MPI, this rank's, which equal
   * them). With resident devices or a hybrid plan (whose devices each keep
   * only their own slice of the head current), call {@link DataParallelTrainer.syncParameters} first.
   */
  masterParameters(): Float32Array {
    return this.#exchange.masterParameters();
  }

  /** Whether each device keeps an error-feedback residual (`errorFeedback` with a 16-bit wire). */
  get errorFeedback(): boolean {
    return this.#exchange.wire?.errorFeedback ?? false;
  }

  /**
   * Error feedback: every device's residual, in device order, on the master, for checkpoints
   * (`residuals.ts`; elsewhere and without, `undefined`). Collective under MPI.
   */
  residuals(): Promise<Float32Array[] | undefined> {
    return this.#exchange.gatherResiduals();
  }

  /** Error feedback: device d continues from the master's `residuals[d]` (none: zeros). Collective (MPI). */
  loadResiduals(residuals: readonly Float32Array[] | undefined): Promise<void> {
    return this.#exchange.scatterResiduals(residuals);
  }

  /** Devices (ranks) whose parameters differ from the master's in any bit. Collective under MPI. */
  divergentReplicas(): Promise<number[]> {
    // Hybrid: each device keeps only its own slice of the head current; the bodies must agree.
    if (this.#hybrid) return this.#hybrid.divergentBodies();
    return this.#exchange.divergentReplicas();
  }

  /**
   * Collective under MPI: rank 0's `trace` receives every rank's spans, on its clock. Nothing to do
   * in one process, where the trace already has every device's.
   */
  async gatherTrace(): Promise<void> {
    await this.#exchange.gatherTrace(this.#options.trace);
  }

  /**
   * Runs one iteration of the plan on a global batch (the same on every MPI rank): splits it into
   * contiguous equal shards in device order, runs every lane, and returns the figures. On failure the
   * step rejects naming the failing device, with the master's parameters and optimizer state as
   * before the step (in one process; under MPI the job cannot go on).
   */
  async step(batch: HostBatch): Promise<DataParallelStepResult> {
    if (this.#closed) throw new TandemError("DataParallelTrainer: closed");
    if (this.#failed) {
      const what = this.#failed instanceof DivergenceError
        ? "training diverged earlier"
        : "a device failed earlier";
      throw new TandemError(`DataParallelTrainer: ${what}: ${this.#failed.message}`);
    }
    const exchange = this.#exchange, plan = this.#plan, n = exchange.size;
    const [batchSize, ...sample] = batch.shape;
    if (batchSize % n !== 0) {
      throw new ValueError(
        "DataParallelTrainer",
        `a batch of ${batchSize} does not split evenly over ${n} devices`,
      );
    }
    const shardSize = batchSize / n, sampleSize = sample.reduce((a, b) => a * b, 1);
    const microBatches = this.#options.accumulate ?? 1;
    if (shardSize % microBatches !== 0) {
      throw new ValueError(
        "DataParallelTrainer",
        `a shard of ${shardSize} samples per device does not split into ${microBatches} equal micro-batches`,
      );
    }
    await exchange.beforeStep();
    // Each replica's statistics as they were, to put back if the step is undone.
    const savedBuffers = this.#buffers.total ? exchange.local.map((d) => d.buffers!.slice()) : undefined;
    const iteration = this.iteration;
    const started = performance.now();
    const spans: LaneSpan[] = [];
    const record = (
      device: number,
      lane: "compute" | "comm",
      name: string,
      start: number,
      end: number,
      bytes?: number,
    ) => {
      spans.push({ lane, name, start, end });
      const event: LaneEvent = {
        device,
        lane,
        name,
        step: iteration,
        start,
        end,
        ...(bytes === undefined ? {} : { bytes }),
      };
      this.#options.onEvent?.(event);
      this.#options.trace?.record(event);
    };

    // Per local device and group, resolved when that group's gradients are final.
    const ready = exchange.local.map(() =>
      new Map<string, Deferred<void>>(plan.groups.map((g) => [g, deferred()]))
    );
    const backwardGroups = plan.steps.filter((s) => s.kind === "backward").map((s) => s.group!);
    let computing = exchange.local.length;
    const hybrid = this.#hybrid;
    const shardedGroups = new Set(plan.sharded ?? []);
    const headComputes = hybrid?.compute({
      iteration,
      seed: this.#options.seed ?? 0,
      images: batch.images,
      labels: batch.labels,
      shape: batch.shape,
      ready,
      record: (device, name, start, end, bytes) => record(device, "comm", name, start, end, bytes),
      bodyGroups: backwardGroups.filter((g) => !shardedGroups.has(g)),
      microBatches,
    });
    const computes: Promise<ComputeResult>[] = exchange.local.map((device, i) => {
      const d = device.index;
      const compute = headComputes ? headComputes[i] : device.compute(
        {
          iteration,
          images: batch.images.subarray(d * shardSize * sampleSize, (d + 1) * shardSize * sampleSize),
          labels: batch.labels.subarray(d * shardSize, (d + 1) * shardSize),
          shape: [shardSize, ...sample],
          sampleOffset: d * shardSize,
          seed: this.#options.seed ?? 0,
          backwardGroups,
          microBatches,
        },
        (group) => ready[i].get(group)!.resolve(),
      );
      // A failing device fails every wait on it, so the communication lane cannot hang.
      compute.then(() => computing--, (error) => {
        computing--;
        for (const r of ready[i].values()) r.reject(error);
      });
      return compute;
    });
    const context: ExchangeContext = {
      iteration,
      deadline: started + this.#timeoutMs,
      computing: () => computing > 0,
      record: (device, name, start, end, bytes) => record(device, "comm", name, start, end, bytes),
    };
    const lastBackward = plan.steps.findLastIndex((s) => s.kind === "backward");
    const checkFinite = this.#options.checkFinite ?? true;
    // Replicas update identically, so the master's optimizer speaks for all of them; a hybrid
    // head's slices differ, so every slice is checked.
    const checked = exchange.optimizers.slice(0, 1);
    // Each check starts right after its update (a CPU scan runs there, behind compute; a GPU
    // reduction is queued there) and is awaited at the end of the step, so it never stalls the
    // communication lane behind a device's queue. Every update is still undoable then.
    const finiteChecks: Promise<void>[] = [];
    const checkLater = (optimizers: readonly Optimizer[], group: string) => {
      const check = checkUpdatedGroup(optimizers, group, iteration);
      check.catch(() => {}); // awaited below; not an unhandled rejection meanwhile
      finiteChecks.push(check);
    };

    try {
      const waitForBackward = async (index: number) => {
        for (const dep of dependenciesOf(plan, index)) {
          const needed = plan.steps[dep];
          if (needed.kind === "backward") await Promise.all(ready.map((r) => r.get(needed.group!)!.promise));
        }
      };
      // Where a failed step is undone, an update after every backward waits for the devices to
      // finish (their gradients are final already, so the wait is short): then no device can fail
      // the step behind it any more. An update copies for the undo only where a failure can still
      // follow: a device still computing, or a later step of an exchange whose steps can fail, or
      // (with finite checks) this update's own check or a later one.
      const late = (index: number) => index > lastBackward;
      const undoable = (index: number) =>
        exchange.rollsBack && (checkFinite || !late(index) ||
          (exchange.transfersCanFail &&
            plan.steps.slice(index + 1).some((s) => s.kind === "reduce" || s.kind === "broadcast")));
      const same = (index: number, kind: string, group: string) =>
        plan.steps[index]?.kind === kind && plan.steps[index]?.group === group;
      for (let i = 0; i < plan.steps.length; i++) {
        const planStep = plan.steps[i];
        if (planStep.lane !== "comm") continue;
        const group = planStep.group!;
        await waitForBackward(i);
        if (planStep.kind === "reduce" && exchange.pipeline && same(i + 1, "update", group)) {
          // reduce g; update g (; broadcast g) as one chunked pipeline: each chunk updated and sent
          // back while the next is still arriving.
          const withBroadcast = same(i + 2, "broadcast", group);
          await waitForBackward(i + 1);
          if (late(i + 1) && exchange.rollsBack) await Promise.all(computes);
          const options = { undoable: undoable(i + 1) };
          const parts = await exchange.pipeline(group, {
            update: (range) => {
              for (const optimizer of exchange.optimizers) optimizer.step(group, { ...options, range });
            },
            broadcast: withBroadcast,
          }, context);
          if (checkFinite && parts.update) checkLater(checked, group);
          record(exchange.rank, "comm", `reduce ${group}`, ...parts.reduce);
          if (parts.update && exchange.optimizers.length) {
            record(exchange.rank, "comm", `update ${group}`, ...parts.update);
          }
          if (parts.broadcast) record(exchange.rank, "comm", `broadcast ${group}`, ...parts.broadcast);
          i += withBroadcast ? 2 : 1;
          continue;
        }
        if (planStep.kind === "update" && late(i) && exchange.rollsBack) await Promise.all(computes);
        const start = performance.now();
        if (planStep.kind === "reduce") {
          await exchange.reduce(group, context);
          record(exchange.rank, "comm", `reduce ${group}`, start, performance.now());
        } else if (planStep.kind === "update" && shardedGroups.has(group)) {
          // Each device's own slice, with its own optimizer state: nothing travels.
          hybrid!.update(group, { undoable: undoable(i) });
          if (checkFinite) checkLater(hybrid!.optimizers, group);
          record(exchange.rank, "comm", `update ${group}`, start, performance.now());
        } else if (planStep.kind === "update") {
          for (const optimizer of exchange.optimizers) optimizer.step(group, { undoable: undoable(i) });
          if (checkFinite) checkLater(checked, group);
          if (exchange.optimizers.length) {
            record(exchange.rank, "comm", `update ${group}`, start, performance.now());
          }
        } else if (planStep.kind === "broadcast") {
          if (await exchange.broadcast(group, context)) {
            record(exchange.rank, "comm", `broadcast ${group}`, start, performance.now());
          }
        } else {
          throw new TandemError(`DataParallelTrainer: "${planStep.kind}" is not a communication step`);
        }
      }
      const results = await Promise.all(computes);
      results.forEach((r, i) =>
        r.spans.forEach((s) => record(exchange.local[i].index, "compute", s.name, s.start, s.end))
      );
      const combined = await exchange.combine(results, context);
      for (const check of finiteChecks) await check; // the first failing group in plan order
      if (checkFinite && !Number.isFinite(combined.loss)) {
        // Backends that read asynchronously (WebGPU) leave the loss check to here.
        throw new DivergenceError(iteration + 1, "loss", undefined, `is ${combined.loss}`);
      }
      for (const optimizer of exchange.optimizers) optimizer.finishIteration();
      hybrid?.finishIteration();
      // Only a completed step's error-feedback residuals carry on (a failed one's are dropped).
      exchange.wire?.commit();
      this.#iteration = iteration + 1;
      if (this.#options.verifyReplicas) {
        // Resident parameters must come to the host to be compared: a debugging aid, not free.
        await this.syncParameters();
        const divergent = await this.divergentReplicas();
        if (divergent.length) {
          throw new TandemError(`replicas ${divergent} differ from device 0 after iteration ${iteration}`);
        }
      }
      const total = performance.now() - started;
      const ms = stepFigures(spans, total);
      return {
        iteration,
        ...combined,
        seconds: total / 1000,
        ms,
        hiddenFraction: ms.communication > 0 ? ms.hiddenCommunication / ms.communication : 0,
      };
    } catch (error) {
      throw await this.#fail(error, computes, iteration, savedBuffers);
    }
  }

  /** Undoes the step's updates where the exchange can, and returns the error that names the cause. */
  async #fail(
    error: unknown,
    computes: Promise<ComputeResult>[],
    iteration: number,
    savedBuffers: Float32Array[] | undefined,
  ): Promise<unknown> {
    await Promise.allSettled(computes);
    // The forward already moved the statistics; an undone step leaves them as they were.
    if (savedBuffers && this.#exchange.rollsBack) {
      this.#exchange.local.forEach((d, i) => d.buffers?.set(savedBuffers[i]));
    }
    let cause = error instanceof DeviceError ? error : await firstDeviceError(computes) ?? error;
    if (isNonFiniteLoss(cause)) {
      // A device's loss check: divergence, not a broken device.
      const detail = (cause as Error).message.replace(/^.*softmaxCrossEntropy: /, "");
      cause = new DivergenceError(iteration + 1, "loss", undefined, `is not finite (${detail})`);
    }
    let undone = this.#exchange.rollsBack;
    if (this.#exchange.rollsBack) {
      for (const optimizer of [...this.#exchange.optimizers, ...this.#hybrid?.optimizers ?? []]) {
        try {
          optimizer.undoIteration();
        } catch (undoError) {
          undone = false;
          // An updating device itself is broken (e.g. its GPU was lost); say so with the cause.
          if (cause instanceof Error) {
            cause.message += `; rolling back the updating devices failed too: ${
              (undoError as Error).message
            }`;
          }
        }
      }
    } else {
      // The ranks are now out of step with each other; only a new job can continue.
      this.#failed = cause as Error;
      if (cause instanceof DeviceError) {
        const reason = cause.message.replace(/^device \d+: /, "");
        cause = new DeviceError(cause.device, `${reason} (MPI rank ${this.rank}, step ${iteration})`);
      }
    }
    if (cause instanceof DeviceError) this.#failed = cause;
    if (cause instanceof DivergenceError) {
      cause.rolledBack = undone;
      // The replicas may hold what the master broadcast before the check; the run must stop (or
      // resume from a checkpoint), not step on.
      this.#failed = cause;
    }
    return cause;
  }

  /** Stops the devices (MPI stays up: call `transport.finalize()` when the process is done). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#exchange.close();
  }
}

async function firstDeviceError(computes: Promise<ComputeResult>[]): Promise<DeviceError | undefined> {
  const settled = await Promise.allSettled(computes);
  for (const s of settled) if (s.status === "rejected" && s.reason instanceof DeviceError) return s.reason;
  return undefined;
}
