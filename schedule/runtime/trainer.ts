/**
 * The data-parallel trainer: N devices under one schedule, in this process or across MPI ranks. It
 * starts the run (the reference model fixes the layout and every replica's initial parameters, see
 * `start.ts`; MPI ranks join in `mpi/exchange.ts`), holds what outlives an iteration (the exchange,
 * a hybrid plan's head, the buffers, the iteration count, a failure that ends the run), and runs each
 * iteration through the plan executor (`executor.ts`), undoing a failed one where the exchange can.
 * Its options, batches and results are in `options.ts`.
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
 * @module
 */

import {
  type BufferEntry,
  type LrPolicy,
  type Optimizer,
  type ParameterEntry,
  TandemError,
} from "../../engine/mod.ts";
import { type BufferLayout, hostBufferEntries } from "../devices/buffer_layout.ts";
import { type ComputeResult, type Device, DeviceError } from "../devices/device.ts";
import type { ParameterLayout } from "../devices/parameter_layout.ts";
import { MpiActivations } from "../mpi/activations.ts";
import { MpiExchange } from "../mpi/exchange.ts";
import type { Plan } from "../plan/plan.ts";
import type { Exchange } from "./exchange/exchange.ts";
import { runIteration } from "./executor.ts";
import { HybridHead, SharedActivations } from "./hybrid.ts";
import {
  checkOptions,
  type DataParallelOptions,
  type DataParallelStepResult,
  type HostBatch,
  splitBatch,
} from "./options.ts";
import { ResidentExchange } from "./exchange/resident_exchange.ts";
import { referenceOf, startInProcess } from "./start.ts";
import { DivergenceError, isNonFiniteLoss } from "./finite.ts";

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
  /** What runs on the exchange now (a step, a broadcast): `close` lets it settle before freeing. */
  readonly #running = new Set<Promise<unknown>>();

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
    const count = checkOptions(options);
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
    this.#checkOpen("optimizer");
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
    this.#checkOpen("parameterEntries");
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
    this.#checkOpen("bufferEntries");
    if (this.#buffers.total === 0) return [];
    this.#bufferEntries ??= hostBufferEntries(this.#buffers, this.#exchange.local[0].buffers!);
    return this.#bufferEntries;
  }

  /**
   * A flat copy of device 0's buffers, in {@link DataParallelTrainer.bufferLayout} order (under MPI,
   * this rank's own, which on rank 0 are the master's).
   */
  masterBuffers(): Float32Array {
    this.#checkOpen("masterBuffers");
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
  broadcastParameters(): Promise<void> {
    return this.#run("broadcastParameters", () => this.#broadcastParameters());
  }

  async #broadcastParameters(): Promise<void> {
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
  syncParameters(): Promise<void> {
    return this.#run("syncParameters", () => this.#syncParameters());
  }

  async #syncParameters(): Promise<void> {
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
    this.#checkOpen("masterParameters");
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
    return this.#run("residuals", () => this.#exchange.gatherResiduals());
  }

  /** Error feedback: device d continues from the master's `residuals[d]` (none: zeros). Collective (MPI). */
  loadResiduals(residuals: readonly Float32Array[] | undefined): Promise<void> {
    return this.#run("loadResiduals", () => this.#exchange.scatterResiduals(residuals));
  }

  /** Devices (ranks) whose parameters differ from the master's in any bit. Collective under MPI. */
  divergentReplicas(): Promise<number[]> {
    // Hybrid: each device keeps only its own slice of the head current; the bodies must agree.
    return this.#run(
      "divergentReplicas",
      () => this.#hybrid ? this.#hybrid.divergentBodies() : this.#exchange.divergentReplicas(),
    );
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
  step(batch: HostBatch): Promise<DataParallelStepResult> {
    return this.#run("step", () => this.#step(batch));
  }

  async #step(batch: HostBatch): Promise<DataParallelStepResult> {
    if (this.#failed) {
      const what = this.#failed instanceof DivergenceError
        ? "training diverged earlier"
        : "a device failed earlier";
      throw new TandemError(`DataParallelTrainer: ${what}: ${this.#failed.message}`);
    }
    const exchange = this.#exchange;
    const microBatches = this.#options.accumulate ?? 1;
    const split = splitBatch(batch.shape, exchange.size, microBatches);
    await exchange.beforeStep();
    // Each replica's statistics as they were, to put back if the step is undone.
    const savedBuffers = this.#buffers.total ? exchange.local.map((d) => d.buffers!.slice()) : undefined;
    const iteration = this.iteration;
    return await runIteration({
      exchange,
      plan: this.#plan,
      options: this.#options,
      hybrid: this.#hybrid,
      iteration,
      timeoutMs: this.#timeoutMs,
      batch,
      split,
      microBatches,
      completed: async () => {
        this.#iteration = iteration + 1;
        if (this.#options.verifyReplicas) {
          // Resident parameters must come to the host to be compared: a debugging aid, not free.
          await this.syncParameters();
          const divergent = await this.divergentReplicas();
          if (divergent.length) {
            throw new TandemError(`replicas ${divergent} differ from device 0 after iteration ${iteration}`);
          }
        }
      },
      fail: (error, computes) => this.#fail(error, computes, iteration, savedBuffers),
    });
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

  /**
   * Stops the devices (MPI stays up: call `transport.finalize()` when the process is done), lets a
   * step still running settle (it rejects, undone), and frees the memory the trainer held: the
   * replicas' parameters and gradients and the optimizers' state. Its parameter entries, optimizer
   * and buffers must not be used afterwards; the trainer's methods that would reach them throw.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#exchange.close();
    // A failing step still undoes its updates in the master's memory; free it only after.
    await Promise.allSettled(this.#running);
    this.#hybrid?.free();
    this.#exchange.free();
  }

  /** Runs `work` as `op` on an open trainer, known to `close` until it settles. */
  #run<T>(op: string, work: () => Promise<T>): Promise<T> {
    try {
      this.#checkOpen(op);
    } catch (error) {
      return Promise.reject(error);
    }
    const running = work();
    this.#running.add(running);
    const forget = () => this.#running.delete(running);
    running.then(forget, forget);
    return running;
  }

  #checkOpen(op: string): void {
    if (this.#closed) throw new TandemError(`DataParallelTrainer.${op}: the trainer is closed`);
  }
}

async function firstDeviceError(computes: Promise<ComputeResult>[]): Promise<DeviceError | undefined> {
  const settled = await Promise.allSettled(computes);
  for (const s of settled) if (s.status === "rejected" && s.reason instanceof DeviceError) return s.reason;
  return undefined;
}
