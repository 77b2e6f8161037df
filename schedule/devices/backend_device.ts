/**
 * A WebGPU device: one replica on its own `GPUDevice`, driven from the main thread. Kernels are
 * queued on the GPU and run asynchronously, so two WebGPU devices compute side by side while the
 * thread that queued them waits on the GPUs.
 *
 * When every device of a run is a WebGPU device, the runtime activates each one's
 * {@link ResidentReplica}: parameters, gradients and optimizer state stay on the GPUs for the whole
 * run. A step then moves, per group, only what the data-parallel algorithm needs between devices:
 * a peer's gradients to the device that averages them, and in `master` mode device 0's new
 * parameters to the peers. Each such move takes the staging path: the group's storages are copied to
 * a reused mappable staging buffer on the source GPU (recorded as soon as the group's backward is
 * queued, so later kernels cannot hold it back), mapped, and written with `writeBuffer` on the
 * destination. Averaging in device order and the SGD/Adam updates run as WGSL kernels on the GPU that
 * owns the parameters; nothing goes through the host's optimizer.
 *
 * Mixed with devices of another kind (CPU Workers), a WebGPU device falls back to host transfers:
 * group gradients are read back into `gradients` as soon as they are final, and parameters are
 * uploaded from `parameters` before every forward, where the runtime averages and updates them.
 *
 * @module
 */

import { createWebGpuBackend, type StagedValues, type WebGpuBackend } from "../../backends/webgpu/backend.ts";
import {
  backwardPass,
  countCorrect,
  fromStorage,
  getBackend,
  type Network,
  noGrad,
  ops,
  type ParameterEntry,
  registerBackend,
  setBackend,
  Tensor,
  tidy,
} from "../../engine/mod.ts";
import {
  type ComputeCommand,
  type ComputeResult,
  type Device,
  DeviceError,
  type ResidentReplica,
  type ResidentRole,
} from "./device.ts";
import { groupRange, type ParameterLayout, type ParameterSlot } from "./layout.ts";
import { buildModel, type ModelSpec } from "./model_spec.ts";
import type { ComputeSpan } from "./protocol.ts";

interface Slot {
  /** The replica's own parameter. */
  entry: ParameterEntry;
  /** Its place in the runtime's layout. */
  layout: ParameterSlot;
}

/** What a device holds on the GPU once its resident replica is active. */
interface ResidentState {
  role: ResidentRole;
  /** This device's gradients of the last compute, one tensor per slot. */
  own: Tensor[];
  /** The averaged gradients (the optimizer entries' `.grad`), one per slot; empty unless updating. */
  averaged: Tensor[];
  /** Gradients received from each peer, by peer index, one tensor per slot. */
  received: Map<number, Tensor[]>;
  /** The optimizer's view of the parameters. */
  entries: ParameterEntry[];
  /** Gradient copies started during compute, by group, waiting for the runtime to take them. */
  staged: Map<string, Promise<StagedValues>>;
}

/**
 * Starts WebGPU devices, each on a `GPUDevice` of its own.
 *
 * @example
 * ```ts
 * import { DataParallelTrainer, overlap, SGD } from "../../mod.ts";
 * import { WebGpuDevice } from "./webgpu_device.ts";
 * // const trainer = await DataParallelTrainer.create({
 * //   model, plan: overlap(["fc", "conv"]), optimizer: (p) => new SGD(p, { lr: 0.01 }),
 * //   startDevice: (index, model, layout) => WebGpuDevice.start(index, model, layout),
 * // });
 * ```
 */
export class WebGpuDevice implements Device, ResidentReplica {
  /** Device kind. */
  readonly kind = "webgpu";
  /**
   * Host copy of the parameters: written by the runtime between iterations, or, once the resident
   * replica is active, filled when the runtime syncs parameters to the host.
   */
  readonly parameters: Float32Array;
  /** Host copy of the gradients, filled group by group (not used once the resident replica is active). */
  readonly gradients: Float32Array;
  /** This device keeps its replica on the GPU when the runtime asks for it. */
  readonly resident: ResidentReplica = this;
  #backend: WebGpuBackend;
  #model: Network;
  #slots: Slot[];
  #layout: ParameterLayout;
  #state: ResidentState | undefined;
  #busy = false;

  private constructor(
    readonly index: number,
    backend: WebGpuBackend,
    model: Network,
    slots: Slot[],
    layout: ParameterLayout,
  ) {
    this.#backend = backend;
    this.#model = model;
    this.#slots = slots;
    this.#layout = layout;
    this.parameters = new Float32Array(layout.total);
    this.gradients = new Float32Array(layout.total);
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
      return { entry, layout: slot };
    });
    return new WebGpuDevice(index, backend, network, slots, layout);
  }

  /** The backend the replica runs on (one `GPUDevice`). */
  get backend(): WebGpuBackend {
    return this.#backend;
  }

  async compute(command: ComputeCommand, onGradients: (group: string) => void): Promise<ComputeResult> {
    if (this.#busy) throw new DeviceError(this.index, "an iteration is already running");
    this.#busy = true;
    try {
      return await this.#compute(command, onGradients);
    } catch (error) {
      throw this.#deviceError(error);
    } finally {
      this.#busy = false;
    }
  }

  async #compute(command: ComputeCommand, onGradients: (group: string) => void): Promise<ComputeResult> {
    const backend = this.#backend;
    const state = this.#state;
    if (state?.staged.size) await this.#dropStaged(state);
    const spans: ComputeSpan[] = [];
    let start = performance.now();
    if (!state) {
      // Host path: the runtime updated `parameters`; upload them before the forward reads them.
      for (const { entry, layout } of this.#slots) {
        backend.write(
          entry.tensor.storage,
          this.parameters.subarray(layout.offset, layout.offset + layout.size),
        );
      }
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
        const members = this.#slots.map((slot, i) => ({ ...slot, i })).filter((s) => s.entry.group === group);
        tidy(() => pass.runUntil(members.map((m) => m.entry.tensor)));
        if (command.failInGroup === group) throw new Error(`injected failure in backward ${group}`);
        for (const { entry, layout, i } of members) {
          const grad = entry.tensor.grad;
          if (state) {
            // Resident: the gradient stays on the GPU, in the slot peers and the average read.
            if (grad) state.own[i].assign(grad);
            else backend.fill(state.own[i].storage, 0);
          } else if (grad) {
            this.gradients.set((await grad.data()) as Float32Array, layout.offset);
          } else {
            this.gradients.fill(0, layout.offset, layout.offset + layout.size);
          }
          grad?.dispose();
          entry.tensor.grad = null;
        }
        if (state) {
          // Start the copy off the GPU now, ahead of the rest of the backward.
          if (state.role.sendsGradients) {
            state.staged.set(group, this.#stage(members.map((m) => state.own[m.i])));
          }
          // The span ends, and the runtime hears of the group, when the GPU has finished it.
          await backend.synchronize();
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

  // ---------------------------------------------------------------------------------------------
  // The resident replica (see ResidentReplica in device.ts)

  activate(role: ResidentRole): void {
    if (this.#state) throw new DeviceError(this.index, "the resident replica is already active");
    this.#guard(() => {
      const backend = this.#backend;
      const perSlot = () =>
        this.#slots.map(({ entry }) =>
          fromStorage(backend, backend.allocate(entry.tensor.size, "float32"), entry.tensor.shape)
        );
      for (const { entry, layout } of this.#slots) {
        backend.write(
          entry.tensor.storage,
          this.parameters.subarray(layout.offset, layout.offset + layout.size),
        );
      }
      const averaged = role.updates ? perSlot() : [];
      const received = new Map<number, Tensor[]>();
      if (role.updates) {
        for (let peer = 0; peer < role.devices; peer++) {
          if (peer !== this.index) received.set(peer, perSlot());
        }
      }
      const entries = this.#slots.map(({ entry, layout }, i): ParameterEntry => {
        // A second handle on the same storage: the optimizer's updates are what the next forward
        // reads, while its `.grad` (the average) stays apart from the gradient backward accumulates.
        const tensor = noGrad(() => ops.reshape(entry.tensor, entry.tensor.shape));
        tensor.requiresGrad = true;
        tensor.grad = role.updates ? averaged[i] : null;
        return {
          name: layout.name,
          tensor,
          group: layout.group,
          lrMult: layout.lrMult,
          decayMult: layout.decayMult,
        };
      });
      this.#state = { role, own: perSlot(), averaged, received, entries, staged: new Map() };
    });
  }

  get parameterEntries(): readonly ParameterEntry[] {
    return this.#active("parameterEntries").entries;
  }

  async stageGradients(group: string, use: (values: Float32Array) => void | Promise<void>): Promise<void> {
    const state = this.#active("stageGradients");
    // Copies started during compute are taken as they are; otherwise the copy starts now.
    const pending = state.staged.get(group) ??
      this.#guard(() => this.#stage(this.#members(group).map((i) => state.own[i])));
    state.staged.delete(group);
    await this.#lend(pending, use);
  }

  receiveGradients(from: number, group: string, values: Float32Array): void {
    const state = this.#active("receiveGradients");
    const target = state.received.get(from);
    if (!target) {
      throw new DeviceError(this.index, `receives no gradients from device ${from} in this role`);
    }
    this.#guard(() => this.#scatter(group, values, (i) => target[i]));
  }

  averageGradients(group: string): void {
    const state = this.#active("averageGradients");
    if (!state.role.updates) throw new DeviceError(this.index, "averages no gradients in this role");
    this.#guard(() => {
      for (const i of this.#members(group)) {
        const inOrder: Tensor[] = [];
        for (let d = 0; d < state.role.devices; d++) {
          inOrder.push(d === this.index ? state.own[i] : state.received.get(d)![i]);
        }
        this.#backend.averageInOrder(inOrder.map((t) => t.storage), state.averaged[i].storage);
      }
    });
  }

  async stageParameters(group: string, use: (values: Float32Array) => void | Promise<void>): Promise<void> {
    this.#active("stageParameters");
    const pending = this.#guard(() =>
      this.#stage(this.#members(group).map((i) => this.#slots[i].entry.tensor))
    );
    await this.#lend(pending, use);
  }

  receiveParameters(group: string, values: Float32Array): void {
    this.#active("receiveParameters");
    this.#guard(() => this.#scatter(group, values, (i) => this.#slots[i].entry.tensor));
  }

  /** Frees the replica's buffers and the `GPUDevice`. */
  close(): Promise<void> {
    this.#model.dispose();
    this.#backend.device.destroy();
    return Promise.resolve();
  }

  // ---------------------------------------------------------------------------------------------
  // Internals

  /** Slot indices of `group`, in layout order. */
  #members(group: string): number[] {
    groupRange(this.#layout, group); // names the known groups if `group` is not one
    return this.#slots.flatMap((s, i) => (s.layout.group === group ? [i] : []));
  }

  /** Starts copying `tensors` back to back off the GPU. */
  #stage(tensors: readonly Tensor[]): Promise<StagedValues> {
    const pending = this.#backend.stageToHost(tensors.map((t) => t.storage));
    pending.catch(() => {}); // awaited by whoever takes it; a step that failed first drops it
    return pending;
  }

  /** Lends staged values to `use`, then hands the staging buffer back. */
  async #lend(pending: Promise<StagedValues>, use: (values: Float32Array) => void | Promise<void>) {
    let staged: StagedValues;
    try {
      staged = await pending;
    } catch (error) {
      throw this.#deviceError(error);
    }
    try {
      await use(staged.values);
    } finally {
      staged.release();
    }
  }

  /** Writes a group's flat `values` into one tensor per member slot. */
  #scatter(group: string, values: Float32Array, target: (slot: number) => Tensor): void {
    const range = groupRange(this.#layout, group);
    if (values.length !== range.size) {
      throw new Error(`group "${group}" holds ${range.size} values, got ${values.length}`);
    }
    for (const i of this.#members(group)) {
      const { offset, size } = this.#slots[i].layout;
      this.#backend.write(
        target(i).storage,
        values.subarray(offset - range.offset, offset - range.offset + size),
      );
    }
  }

  /** Releases gradient copies a failed step left untaken, so their staging buffers are reusable. */
  async #dropStaged(state: ResidentState): Promise<void> {
    const leftovers = [...state.staged.values()];
    state.staged.clear();
    for (const pending of leftovers) (await pending.catch(() => undefined))?.release();
  }

  #active(what: string): ResidentState {
    if (!this.#state) throw new DeviceError(this.index, `${what}: the resident replica is not active`);
    return this.#state;
  }

  /** Runs `fn`, turning a backend error into a `DeviceError` naming this device. */
  #guard<T>(fn: () => T): T {
    try {
      return fn();
    } catch (error) {
      throw this.#deviceError(error);
    }
  }

  #deviceError(error: unknown): DeviceError {
    return error instanceof DeviceError ? error : new DeviceError(this.index, (error as Error).message);
  }
}
