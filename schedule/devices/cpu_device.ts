/**
 * A CPU device: a Worker holding one replica, sharing parameters and gradients with the runtime
 * through `SharedArrayBuffer`s.
 *
 * @module
 */

import { type ComputeCommand, type ComputeResult, type Device, DeviceError } from "./device.ts";
import type { ParameterLayout } from "./layout.ts";
import type { ModelSpec } from "./model_spec.ts";
import type { ComputeSpan, InitMessage, StepMessage, WorkerReply } from "./protocol.ts";

/**
 * Main → worker: how many threads the replica's CPU kernels may use (its share of the cores).
 *
 * @example
 * ```ts
 * import type { ThreadsMessage } from "./cpu_device.ts";
 * const message: ThreadsMessage = { type: "threads", threads: 2 };
 * ```
 */
export interface ThreadsMessage {
  type: "threads";
  threads: number;
}

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
 * Starts CPU devices on Workers.
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
  readonly #signals: Int32Array;
  readonly #groups: string[];
  #worker: Worker;
  #pending: Pending | undefined;
  #failure: DeviceError | undefined;
  #timeoutMs: number;
  /** Kernel threads asked for at start (else a share of the cores), and the count last sent. */
  #threadsOption: number | undefined;
  #threadsSent = 0;

  private constructor(readonly index: number, layout: ParameterLayout, timeoutSeconds: number) {
    this.parameters = new Float32Array(new SharedArrayBuffer(layout.total * 4));
    this.gradients = new Float32Array(new SharedArrayBuffer(layout.total * 4));
    this.#groups = layout.groups.map((g) => g.name);
    this.#signals = new Int32Array(new SharedArrayBuffer(4 * this.#groups.length));
    this.#timeoutMs = timeoutSeconds * 1000;
    this.#worker = new Worker(new URL("./cpu_worker.ts", import.meta.url), { type: "module" });
    this.#worker.onerror = (event) => {
      event.preventDefault();
      this.#fail(new DeviceError(this.index, `worker crashed: ${event.message}`));
    };
    this.#worker.onmessageerror = () =>
      this.#fail(new DeviceError(this.index, "worker sent an unreadable message"));
  }

  /**
   * Spawns the worker and builds the replica; resolves when it is ready. `threads` fixes the
   * replica's kernel threads; by default each device takes ⌊cores / live devices⌋ (at least 1),
   * counted when it computes its first iteration, so devices do not fight over cores.
   */
  static async start(
    index: number,
    model: ModelSpec,
    layout: ParameterLayout,
    options: { timeoutSeconds: number; threads?: number },
  ): Promise<CpuDevice> {
    const device = new CpuDevice(index, layout, options.timeoutSeconds);
    device.#threadsOption = options.threads;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new DeviceError(index, `did not start within ${options.timeoutSeconds} s`)),
        device.#timeoutMs,
      );
      device.#worker.onmessage = (event: MessageEvent<WorkerReply>) => {
        clearTimeout(timer);
        if (event.data.type === "ready") resolve();
        else if (event.data.type === "error") {
          reject(new DeviceError(index, `failed to build the replica: ${event.data.message}`));
        }
        device.#worker.onmessage = (e: MessageEvent<WorkerReply>) => device.#receive(e.data);
      };
      const init: InitMessage = {
        type: "init",
        device: index,
        model,
        parameters: device.parameters.buffer as SharedArrayBuffer,
        gradients: device.gradients.buffer as SharedArrayBuffer,
        signals: device.#signals.buffer as SharedArrayBuffer,
        groups: device.#groups,
        slots: layout.slots.map(({ name, group, offset, size }) => ({ name, group, offset, size })),
      };
      device.#worker.postMessage(init);
    }).catch((error) => {
      device.#worker.terminate();
      throw error;
    });
    CpuDevice.#live.add(device);
    return device;
  }

  compute(
    command: ComputeCommand,
    onGradients: (group: string) => void,
  ): Promise<ComputeResult> {
    if (this.#failure) return Promise.reject(this.#failure);
    if (this.#pending) return Promise.reject(new DeviceError(this.index, "an iteration is already running"));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#fail(
          new DeviceError(
            this.index,
            `no answer within ${this.#timeoutMs / 1000} s (iteration ${command.iteration})`,
          ),
        );
      }, this.#timeoutMs);
      this.#pending = {
        iteration: command.iteration,
        groups: command.backwardGroups,
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
        this.#worker.postMessage(share);
        this.#threadsSent = threads;
      }
      const message: StepMessage = { type: "step", ...command };
      this.#worker.postMessage(message);
      for (const group of command.backwardGroups) this.#watch(group, command.iteration);
    });
  }

  /** Tells the runtime, once per iteration, that a group's gradients are final. */
  #report(pending: Pending, group: string): void {
    if (pending.reported.has(group)) return;
    pending.reported.add(group);
    pending.onGradients(group);
  }

  /** Calls `onGradients(group)` once the worker signals that group final for `iteration`. */
  async #watch(group: string, iteration: number): Promise<void> {
    const slot = this.#groups.indexOf(group);
    for (;;) {
      const pending = this.#pending;
      if (!pending || pending.iteration !== iteration) return; // failed or finished without it
      const value = Atomics.load(this.#signals, slot);
      if (value > iteration) {
        this.#report(pending, group);
        return;
      }
      // Wake at least every 100 ms, so a failed device's watchers end.
      const wait = Atomics.waitAsync(this.#signals, slot, value, 100);
      if (wait.async) await wait.value;
    }
  }

  #receive(reply: WorkerReply): void {
    const pending = this.#pending;
    if (reply.type === "error") {
      this.#fail(new DeviceError(this.index, reply.message));
      return;
    }
    if (!pending || !("iteration" in reply) || reply.iteration !== pending.iteration) return;
    const toLocal = (span: ComputeSpan): ComputeSpan => ({
      ...span,
      start: span.start - performance.timeOrigin,
      end: span.end - performance.timeOrigin,
    });
    if (reply.type === "done") {
      // Every group is final once the iteration is done, even if a watcher has not woken yet.
      for (const group of pending.groups) this.#report(pending, group);
      clearTimeout(pending.timer);
      this.#pending = undefined;
      pending.resolve({
        loss: reply.loss,
        correct: reply.correct,
        count: reply.count,
        spans: reply.spans.map(toLocal),
      });
    }
  }

  /** Marks the device failed for good: the pending iteration rejects and the worker is stopped. */
  #fail(error: DeviceError): void {
    this.#failure ??= error;
    CpuDevice.#live.delete(this);
    const pending = this.#pending;
    this.#pending = undefined;
    this.#worker.terminate();
    if (pending) {
      clearTimeout(pending.timer);
      pending.reject(error);
    }
  }

  /** Test hook: kills the worker as a crash would. */
  kill(): void {
    this.#fail(new DeviceError(this.index, "worker terminated"));
  }

  close(): Promise<void> {
    CpuDevice.#live.delete(this);
    if (this.#pending) clearTimeout(this.#pending.timer);
    this.#pending = undefined;
    this.#worker.terminate();
    return Promise.resolve();
  }
}
