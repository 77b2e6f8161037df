/**
 * A CPU device: a Worker holding one replica, sharing parameters and gradients with the runtime
 * through `SharedArrayBuffer`s.
 *
 * The Worker is a `node:worker_threads` one, not a web `Worker`: a web Worker that dies (exits, or
 * throws from a timer) sends no event, so its death would only show as a timeout, while this one
 * emits `error` and `exit` within milliseconds. It is also unreferenced, so a process that forgot to
 * close its devices still ends; a start or a step in flight holds the process through its timer.
 *
 * @module
 */

import type { Worker } from "node:worker_threads";
import {
  type ComputeCommand,
  type ComputeResult,
  type Device,
  DeviceError,
  type ShardedReplica,
} from "./device.ts";
import {
  freeSharedFloats,
  lendBeside,
  type ParameterLayout,
  reclaimLoan,
  sharedFloats,
} from "./parameter_layout.ts";
import type { ModelSpec } from "./model_spec.ts";
import { COMPUTE_NICE } from "./thread_priority.ts";
import type {
  ComputeSpan,
  CpuWorkerData,
  HeadPhaseMessage,
  HeadSetupMessage,
  InitMessage,
  InputMessage,
  StepMessage,
  ThreadsMessage,
  WorkerMessage,
  WorkerReply,
} from "./protocol.ts";
import { packViews, unpackViews } from "./protocol.ts";
import { watchGroups } from "./group_signals.ts";
import type { HeadPhase, HeadPhaseResult, HeadSetup } from "./sharded_head.ts";
import type { MemoryLoan } from "../../backends/backend.ts";

interface Pending {
  iteration: number;
  groups: string[];
  reported: Set<string>;
  onGradients: (group: string) => void;
  resolve: (result: ComputeResult) => void;
  reject: (error: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

/**
 * Kernel memory lent to each device's replica (see `Backend.lendMemory`) for what it allocates
 * itself (gradients, activations): an AlexNet-like replica peaks at 16 MB with 32 images and 54 MB
 * with 256. With it the replica computes on the runtime's copy of its parameters, copying nothing
 * before a step.
 */
const LOAN_BYTES = 256 * 2 ** 20;
/**
 * Parameters (bytes) up to which a device borrows: every device's parameters and gradients, the
 * master's average and optimizer state already share the runtime's memory (2 GiB for all), so a
 * larger model's replica keeps a memory of its own and copies its parameters in before each step.
 */
const LOAN_MAX_PARAMETER_BYTES = 16 * 2 ** 20;

/** A start waiting for the worker's `ready`. */
interface Starting {
  resolve: () => void;
  reject: (error: Error) => void;
}

/**
 * Starts CPU devices on Workers. A worker that fails — throws in a step, crashes, exits, or stops
 * answering — fails the step in flight with a {@link DeviceError} naming the device, and the device
 * stays failed: every later `compute` rejects with that error.
 *
 * @example
 * ```ts
 * import { CpuDevice } from "./cpu_device.ts";
 * // const device = await CpuDevice.start(0, modelSpec, layout, { timeoutSeconds: 60 });
 * ```
 */
export class CpuDevice implements Device {
  /** Devices started in this process and not closed: they share its cores. */
  static readonly #live = new Set<CpuDevice>();
  readonly kind = "cpu-worker";
  readonly parameters: Float32Array;
  readonly gradients: Float32Array;
  /** The replica's buffers (BatchNorm statistics), shared with its worker; absent without any. */
  buffers: Float32Array | undefined;
  readonly #signals: Int32Array;
  readonly #groups: string[];
  readonly #worker: Worker;
  #starting: Starting | undefined;
  #pending: Pending | undefined;
  /** Why the device is unusable (failed, or closed); set once. */
  #failure: DeviceError | undefined;
  /** Closed by its owner: the worker's exit that follows is not a failure. */
  #closed = false;
  /** The last iteration the worker finished, to date a death between iterations. */
  #lastIteration: number | undefined;
  #timeoutMs: number;
  /** Kernel threads asked for at start (else a share of the cores), and the count last sent. */
  #threadsOption: number | undefined;
  #threadsSent = 0;
  /** Kernel threads the replica's backend was last told to run (0 before its first step). */
  get kernelThreads(): number {
    return this.#threadsSent;
  }
  /**
   * The compute thread's nice value as the worker read it once started (Linux; `undefined`
   * elsewhere): what `computeNice` came to.
   */
  computeNice: number | undefined;

  /** Kernel memory lent to the replica's backend, where the runtime lent some (see `LOAN_BYTES`). */
  #loan: MemoryLoan | undefined;
  #copiedBytes = 0;
  /** Where this device's shard of the images travels to the worker (see `#share`). */
  #input: Float32Array = new Float32Array(new SharedArrayBuffer(0));

  private constructor(
    readonly index: number,
    layout: ParameterLayout,
    timeoutSeconds: number,
    WorkerClass: typeof Worker,
    nice: number,
  ) {
    // In the CPU backend's kernel memory where it has room: the runtime's optimizer and average
    // then use them in place.
    this.parameters = sharedFloats(layout.total);
    this.gradients = sharedFloats(layout.total);
    this.#groups = layout.groups.map((g) => g.name);
    this.#signals = new Int32Array(new SharedArrayBuffer(4 * this.#groups.length));
    this.#timeoutMs = timeoutSeconds * 1000;
    if (4 * layout.total <= LOAN_MAX_PARAMETER_BYTES) {
      this.#loan = lendBeside([this.parameters, this.gradients], LOAN_BYTES);
    }
    const workerData: CpuWorkerData = { nice, memory: this.#loan };
    this.#worker = new WorkerClass(new URL("./cpu_worker.ts", import.meta.url), { workerData });
    this.#worker.unref();
    this.#worker.on("message", (reply: unknown) => this.#receive(unpackViews<WorkerReply>(reply)));
    // An uncaught error ends the worker: `error` (with the error) comes first, then `exit`.
    this.#worker.on("error", (error: unknown) => {
      this.#died(`worker crashed ${this.#when()}: ${(error as Error)?.message ?? error}`);
    });
    this.#worker.on("exit", (code: number) => this.#died(`worker exited with code ${code} ${this.#when()}`));
    this.#worker.on("messageerror", () => this.#died("worker sent an unreadable message"));
  }

  /**
   * Spawns the worker and builds the replica; resolves when it is ready. `threads` fixes the
   * replica's kernel threads; by default each device takes ⌊cores / live devices⌋ (at least 1),
   * counted when it computes its first iteration, so devices do not fight over cores. `nice` is
   * its compute threads' nice value (default {@link COMPUTE_NICE}; see `thread_priority.ts`).
   */
  static async start(
    index: number,
    model: ModelSpec,
    layout: ParameterLayout,
    options: { timeoutSeconds: number; threads?: number; nice?: number },
  ): Promise<CpuDevice> {
    // Loaded when a device starts, through a specifier in a variable, so that bundling the library
    // for a browser (which has no `node:worker_threads` and trains in its page) still works.
    const specifier = "node:worker_threads";
    const { Worker } = await import(specifier) as typeof import("node:worker_threads");
    const device = new CpuDevice(index, layout, options.timeoutSeconds, Worker, options.nice ?? COMPUTE_NICE);
    device.#threadsOption = options.threads;
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new DeviceError(index, `did not start within ${options.timeoutSeconds} s`)),
          device.#timeoutMs,
        );
        device.#starting = {
          resolve: () => (clearTimeout(timer), resolve()),
          reject: (error) => (clearTimeout(timer), reject(error)),
        };
        const init: InitMessage = {
          type: "init",
          device: index,
          model,
          parameters: device.parameters,
          gradients: device.gradients,
          signals: device.#signals.buffer as SharedArrayBuffer,
          groups: device.#groups,
          slots: layout.slots.map(({ name, group, offset, size }) => ({ name, group, offset, size })),
        };
        device.#post(init);
      });
    } catch (error) {
      device.#starting = undefined;
      await device.close();
      device.free();
      throw error;
    }
    device.#starting = undefined;
    CpuDevice.#live.add(device);
    return device;
  }

  compute(
    command: ComputeCommand,
    onGradients: (group: string) => void,
  ): Promise<ComputeResult> {
    const { images, ...rest } = command;
    const message: StepMessage = { type: "step", ...rest, imageCount: this.#share(images) };
    return this.#request(message, command.iteration, command.backwardGroups, onGradients);
  }

  /** Runs hybrid schedules: the worker holds a slice of the head (see `sharded_head.ts`). */
  readonly sharded: ShardedReplica = {
    setupHead: async (layout: ParameterLayout, setup: HeadSetup) => {
      const message: HeadSetupMessage = { type: "head-setup", layout, setup };
      await this.#request(message, -1, [], () => {});
    },
    runHead: async (iteration: number, phase: HeadPhase, onGradients?: (group: string) => void) => {
      const message: HeadPhaseMessage = phase.kind === "forward-body"
        ? {
          type: "head",
          iteration,
          phase: { ...phase, images: new Float32Array(0) },
          imageCount: this.#share(phase.images),
        }
        : { type: "head", iteration, phase };
      const groups = phase.kind === "backward-body" ? [...phase.groups] : [];
      const result = await this.#request(message, iteration, groups, onGradients ?? (() => {}));
      const out: HeadPhaseResult = { spans: result.spans };
      if (phase.kind === "backward-stage" && phase.labels) {
        out.loss = result.loss;
        out.correct = result.correct;
      }
      return out;
    },
  };

  /**
   * Copies `images` to the start of this device's shared input buffer (growing it, and telling the
   * worker, when they do not fit) and returns their length. A batch's images are in ordinary memory,
   * which `postMessage` copies element by element, at about 12 ms per MB: AlexNet's 20 MB shard took
   * 0.25–0.5 s to reach the worker, cifar10_quick's 0.4 MB 5–10 ms. The copy here takes a few ms at
   * most, and the shared buffer itself travels once, as a buffer (see `packViews`). The
   * worker copies the images into a tensor first thing, and the next step writes the buffer only
   * after this one has finished, so one buffer serves every step.
   */
  #share(images: Float32Array): number {
    if (this.#input.length < images.length) {
      this.#input = new Float32Array(new SharedArrayBuffer(4 * images.length)) as unknown as Float32Array;
      const message: InputMessage = { type: "input", images: this.#input };
      this.#post(message);
    }
    this.#input.set(images);
    return images.length;
  }

  /** Posts `message` to the worker, its shared typed arrays as buffers (see `packViews`). */
  #post(message: WorkerMessage): void {
    this.#worker.postMessage(packViews(message));
  }

  /** Sends `message` and settles with the worker's `done` for `iteration`, watching `groups`. */
  #request(
    message: StepMessage | HeadSetupMessage | HeadPhaseMessage,
    iteration: number,
    groups: string[],
    onGradients: (group: string) => void,
  ): Promise<ComputeResult> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#pending) return Promise.reject(new DeviceError(this.index, "an iteration is already running"));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#fail(
          new DeviceError(
            this.index,
            `no answer within ${this.#timeoutMs / 1000} s (iteration ${iteration})`,
          ),
        );
      }, this.#timeoutMs);
      this.#pending = {
        iteration,
        groups,
        reported: new Set(),
        onGradients,
        resolve,
        reject,
        timer,
      };
      const cores = Math.max(1, navigator.hardwareConcurrency || 1);
      const threads = this.#threadsOption ??
        Math.max(1, Math.floor(cores / Math.max(1, CpuDevice.#live.size)));
      if (threads !== this.#threadsSent) {
        const share: ThreadsMessage = { type: "threads", threads };
        this.#post(share);
        this.#threadsSent = threads;
      }
      this.#post(message);
      this.#watch(groups, iteration);
    });
  }

  /** Tells the runtime, once per iteration, that a group's gradients are final. */
  #report(pending: Pending, group: string): void {
    if (pending.reported.has(group)) return;
    pending.reported.add(group);
    pending.onGradients(group);
  }

  /**
   * Reports `groups` to the runtime, in order, as the worker signals each final for `iteration`,
   * for the request now pending only (not a later one of the same iteration, such as a hybrid
   * step's next phase).
   */
  #watch(groups: string[], iteration: number): void {
    const pending = this.#pending!;
    const slots = groups.map((group) => this.#groups.indexOf(group));
    const current = () => this.#pending === pending;
    watchGroups(this.#signals, slots, groups, iteration, current, (group) => {
      if (current()) this.#report(pending, group);
    });
  }

  #receive(reply: WorkerReply): void {
    if (reply.type === "ready") {
      this.buffers = reply.buffers;
      this.computeNice = reply.nice;
      this.#starting?.resolve();
      return;
    }
    if (reply.type === "error") {
      if (this.#starting) {
        this.#fail(new DeviceError(this.index, `failed to build the replica: ${reply.message}`));
      } else this.#fail(new DeviceError(this.index, reply.message));
      return;
    }
    const pending = this.#pending;
    if (!pending || reply.iteration !== pending.iteration) return;
    const toLocal = (span: ComputeSpan): ComputeSpan => ({
      ...span,
      start: span.start - performance.timeOrigin,
      end: span.end - performance.timeOrigin,
    });
    // Every group is final once the iteration is done, even if a watcher has not woken yet.
    for (const group of pending.groups) this.#report(pending, group);
    clearTimeout(pending.timer);
    this.#pending = undefined;
    if (pending.iteration >= 0) this.#lastIteration = pending.iteration;
    this.#copiedBytes += reply.copiedBytes;
    pending.resolve({
      loss: reply.loss,
      correct: reply.correct,
      count: reply.count,
      spans: reply.spans.map(toLocal),
    });
  }

  /** When the worker died, for its error message. */
  #when(): string {
    if (this.#pending) return `during iteration ${this.#pending.iteration}`;
    if (this.#starting) return "while building its replica";
    if (this.#lastIteration !== undefined) return `after iteration ${this.#lastIteration}`;
    return "before its first iteration";
  }

  /** The worker ended, or broke its channel, without being closed: a failure unless one is known. */
  #died(message: string): void {
    if (this.#closed || this.#failure) return;
    this.#fail(new DeviceError(this.index, message));
  }

  /**
   * Marks the device failed for good: the pending start or iteration rejects with `error`, later
   * ones with the first failure, and the worker is stopped.
   */
  #fail(error: DeviceError): void {
    this.#failure ??= error;
    CpuDevice.#live.delete(this);
    const pending = this.#pending, starting = this.#starting;
    this.#pending = this.#starting = undefined;
    this.#worker.terminate().catch(() => {});
    if (pending) {
      clearTimeout(pending.timer);
      pending.reject(error);
    }
    starting?.reject(error);
  }

  /**
   * Stops the worker; its exit is not reported as a failure. An iteration still in flight rejects,
   * as does every later `compute`.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    CpuDevice.#live.delete(this);
    const pending = this.#pending;
    this.#pending = undefined;
    this.#failure ??= new DeviceError(
      this.index,
      pending ? `closed during iteration ${pending.iteration}` : "closed",
    );
    if (pending) {
      clearTimeout(pending.timer);
      pending.reject(this.#failure);
    }
    await this.#worker.terminate();
  }

  /**
   * See {@link Device.free}: hands `parameters`, `gradients` and the replica's loan back to the
   * kernel memory (after {@link CpuDevice.close}: the worker no longer runs).
   */
  free(): void {
    if (this.#loan) reclaimLoan(this.#loan);
    this.#loan = undefined;
    freeSharedFloats(this.parameters);
    freeSharedFloats(this.gradients);
  }

  /**
   * Bytes of parameters the replica has copied from {@link CpuDevice.parameters} into memory of its
   * own, in all, as its worker counted them: none where it computes on them in place (a model of at
   * most `LOAN_MAX_PARAMETER_BYTES` on the CPU backend), all of them before every step elsewhere.
   */
  get parameterBytesCopied(): number {
    return this.#copiedBytes;
  }
}
