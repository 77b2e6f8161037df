/**
 * A WebGPU device: one replica on its own `GPUDevice`, driven from the main thread. Kernels are
 * queued on the GPU and run asynchronously, so two WebGPU devices compute side by side while the
 * thread that queued them waits on read-backs.
 *
 * Transfers to and from the runtime go through host memory: a group's gradients are copied to a
 * reused mappable staging buffer and mapped (the backend's `read`) as soon as that group's backward
 * is queued, and parameters are written back with `writeBuffer` before the next forward — the
 * staging path the runtime's averaging and updates (on the host, in device order) work on.
 *
 * @module
 */

import { createWebGpuBackend, type WebGpuBackend } from "../backends/webgpu/backend.ts";
import {
  backwardPass,
  countCorrect,
  fromStorage,
  getBackend,
  type Network,
  ops,
  type ParameterEntry,
  registerBackend,
  setBackend,
  Tensor,
  tidy,
} from "../engine/mod.ts";
import { type ComputeCommand, type ComputeResult, type Device, DeviceError } from "./device.ts";
import type { ParameterLayout } from "./layout.ts";
import { buildModel, type ModelSpec } from "./model_spec.ts";
import type { ComputeSpan } from "./protocol.ts";

interface Slot {
  entry: ParameterEntry;
  offset: number;
  size: number;
}

/**
 * Starts WebGPU devices, each on a `GPUDevice` of its own.
 *
 * @example
 * ```ts
 * import { DataParallelTrainer, overlap, SGD } from "../mod.ts";
 * import { WebGpuDevice } from "./webgpu_device.ts";
 * // const trainer = await DataParallelTrainer.create({
 * //   model, plan: overlap(["fc", "conv"]), optimizer: (p) => new SGD(p, { lr: 0.01 }),
 * //   startDevice: (index, model, layout) => WebGpuDevice.start(index, model, layout),
 * // });
 * ```
 */
export class WebGpuDevice implements Device {
  /** Device kind. */
  readonly kind = "webgpu";
  /** Host copy of the parameters the runtime writes between iterations. */
  readonly parameters: Float32Array;
  /** Host copy of the gradients, filled group by group. */
  readonly gradients: Float32Array;
  #backend: WebGpuBackend;
  #model: Network;
  #slots: Slot[];
  #busy = false;

  private constructor(
    readonly index: number,
    backend: WebGpuBackend,
    model: Network,
    slots: Slot[],
    total: number,
  ) {
    this.#backend = backend;
    this.#model = model;
    this.#slots = slots;
    this.parameters = new Float32Array(total);
    this.gradients = new Float32Array(total);
  }

  /** Requests a `GPUDevice`, builds the replica on it and checks it against the runtime's layout. */
  static async start(index: number, model: ModelSpec, layout: ParameterLayout): Promise<WebGpuDevice> {
    const backend = await createWebGpuBackend({ name: `webgpu:${index}` });
    if (!backend) throw new DeviceError(index, "no WebGPU adapter is available");
    registerBackend(backend);
    const previous = getBackend().name;
    let network: Network;
    // Layers create their parameters on the current backend.
    setBackend(backend.name);
    try {
      network = await buildModel(model);
    } catch (error) {
      throw new DeviceError(index, `failed to build the replica: ${(error as Error).message}`);
    } finally {
      setBackend(previous);
    }
    const byName = new Map(network.namedParameters().map((p) => [p.name, p]));
    const slots = layout.slots.map((slot) => {
      const entry = byName.get(slot.name);
      if (!entry || entry.tensor.size !== slot.size) {
        throw new DeviceError(index, `replica parameter "${slot.name}" does not match the runtime's layout`);
      }
      return { entry, offset: slot.offset, size: slot.size };
    });
    return new WebGpuDevice(index, backend, network, slots, layout.total);
  }

  async compute(command: ComputeCommand, onGradients: (group: string) => void): Promise<ComputeResult> {
    if (this.#busy) throw new DeviceError(this.index, "an iteration is already running");
    this.#busy = true;
    try {
      return await this.#compute(command, onGradients);
    } catch (error) {
      throw error instanceof DeviceError ? error : new DeviceError(this.index, (error as Error).message);
    } finally {
      this.#busy = false;
    }
  }

  async #compute(command: ComputeCommand, onGradients: (group: string) => void): Promise<ComputeResult> {
    const backend = this.#backend;
    const spans: ComputeSpan[] = [];
    let start = performance.now();
    for (const { entry, offset, size } of this.#slots) {
      const source = fromStorage(
        backend,
        backend.upload(this.parameters.subarray(offset, offset + size)),
        entry.tensor.shape,
      );
      entry.tensor.assign(source);
      source.dispose();
    }
    const images = fromStorage(backend, backend.upload(command.images), command.shape);
    const labels = new Tensor(backend, backend.upload(command.labels), [command.labels.length], {
      hostInts: command.labels,
    });
    const { loss, logits } = tidy(() => {
      const logits = this.#model.forward(images, {
        seed: command.seed,
        step: command.iteration,
        sampleOffset: command.sampleOffset,
      });
      return { loss: ops.softmaxCrossEntropy(logits, labels), logits };
    });
    spans.push({ name: "forward", start, end: performance.now() });
    const pass = backwardPass(loss);
    try {
      for (const group of command.backwardGroups) {
        start = performance.now();
        const members = this.#slots.filter((s) => s.entry.group === group);
        tidy(() => pass.runUntil(members.map((m) => m.entry.tensor)));
        if (command.failInGroup === group) throw new Error(`injected failure in backward ${group}`);
        for (const { entry, offset, size } of members) {
          const grad = entry.tensor.grad;
          if (grad) {
            this.gradients.set((await grad.data()) as Float32Array, offset);
            grad.dispose();
            entry.tensor.grad = null;
          } else {
            this.gradients.fill(0, offset, offset + size);
          }
        }
        spans.push({ name: `backward ${group}`, group, start, end: performance.now() });
        onGradients(group);
      }
      tidy(() => pass.runToEnd());
      const [lossValue, logitValues] = await Promise.all([loss.item(), logits.data()]);
      return {
        loss: lossValue,
        correct: countCorrect(logitValues as Float32Array, command.labels, logits.shape[1]),
        count: command.labels.length,
        spans,
      };
    } finally {
      for (const t of [loss, logits, images, labels]) t.dispose();
      for (const { entry } of this.#slots) {
        entry.tensor.grad?.dispose();
        entry.tensor.grad = null;
      }
    }
  }

  /** Frees the replica's buffers and the `GPUDevice`. */
  close(): Promise<void> {
    this.#model.dispose();
    this.#backend.device.destroy();
    return Promise.resolve();
  }
}
