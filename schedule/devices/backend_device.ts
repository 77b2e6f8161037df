/**
 * A backend device: one replica on a backend of its own (a WebGPU `GPUDevice`, say), driven from the
 * main thread. A device backend queues kernels and runs them asynchronously, so two such devices
 * compute side by side while the thread that queued them waits on both.
 *
 * The caller supplies the backend through a factory, so this layer depends on the backend contract
 * alone and never on a concrete backend. What the device does beyond plain training it asks of the
 * contract's optional capabilities.
 *
 * When the backend can `write`, `stageToHost`, `averageInOrder` and `synchronize` (WebGPU can), the
 * device offers a {@link ResidentReplica}, which the runtime activates when every device of a run
 * offers one: parameters, gradients and optimizer state stay on the devices for the whole run. A step
 * then moves, per group, only what the data-parallel algorithm needs between devices: a peer's
 * gradients to the device that averages them, and in `master` mode device 0's new parameters to the
 * peers. Each move stages the group's storages to host memory the source backend lends (recorded as
 * soon as the group's backward is queued, so later kernels cannot hold it back) and writes them on
 * the destination. Averaging in device order and the SGD/Adam updates run as the backend's kernels on
 * the device that owns the parameters; nothing goes through the host's optimizer. Under a hybrid plan
 * the body is that replica, and the device's slice of the head lives on it too (`residentSlice`,
 * `head_slices.ts`); only the head's activations cross the host.
 *
 * A model's buffers (BatchNorm statistics) live on the device's backend as the replica's own
 * tensors, which its forward updates there; the runtime sees them in the host array `buffers`
 * (shared memory, so an MPI broadcast may write it), which the device writes onto the backend
 * before each forward and fills from it once the step's compute has finished (staged off the device
 * in one copy where the backend can stage). The host array is the truth between steps: the runtime
 * reads device 0's, restores it when a step is undone and overwrites it when a checkpoint is loaded,
 * on either path.
 *
 * Otherwise (a backend without those capabilities, or a run mixed with CPU Workers) the device takes
 * the host path: group gradients are read back into `gradients` as soon as they are final, and
 * parameters are written from `parameters` before every forward, where the runtime averages and
 * updates them.
 *
 * It stays one file although long: one class is both the runtime's {@link Device} and, once
 * activated, its {@link ResidentReplica}, and both roles read and write the same private replica
 * (its tensors, staged copies and buffers); a second class would need all of that made public.
 *
 * @module
 */

import type { Backend, StagedValues, Storage } from "../../backends/backend.ts";
import {
  type BufferEntry,
  getBackend,
  type Network,
  noGrad,
  ops,
  type ParameterEntry,
  registerBackend,
  replicaStep,
  setBackend,
  Tensor,
} from "../../engine/mod.ts";
import { fromStorage } from "../../engine/creation.ts";
import {
  type ComputeCommand,
  type ComputeResult,
  type Device,
  DeviceError,
  type ResidentReplica,
  type ResidentRole,
  type ShardedReplica,
} from "./device.ts";
import { type HeadPhase, type HeadPhaseResult, type HeadSetup, HeadShard } from "./sharded_head.ts";
import { type HeadLayout, sliceSlots } from "./head_layout.ts";
import { DeviceSlices, hostSlices } from "./head_slices.ts";
import { groupRange, type ParameterLayout, type ParameterSlot } from "./parameter_layout.ts";
import { buildModel, type ModelSpec } from "./model_spec.ts";
import type { ComputeSpan } from "./protocol.ts";
import { bufferLayoutOf } from "./buffer_layout.ts";

/** A backend with every capability the resident replica needs. */
type ResidentBackend =
  & Backend
  & Required<Pick<Backend, "write" | "stageToHost" | "averageInOrder" | "synchronize">>;

function canHoldResident(backend: Backend): backend is ResidentBackend {
  return !!(backend.write && backend.stageToHost && backend.averageInOrder && backend.synchronize);
}

interface Slot {
  /** The replica's own parameter. */
  entry: ParameterEntry;
  /** Its place in the runtime's layout. */
  layout: ParameterSlot;
}

/** What a device holds on its backend once its resident replica is active. */
interface ResidentState {
  role: ResidentRole;
  /** The device's backend, which has every resident capability. */
  backend: ResidentBackend;
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
 * Starts devices each on a backend of their own, made by the caller's factory.
 *
 * @example
 * ```ts
 * import { createWebGpuBackend, DataParallelTrainer, overlapPlan, SGD } from "../../mod.ts";
 * import { BackendDevice } from "./mod.ts";
 * // const trainer = await DataParallelTrainer.create({
 * //   model, plan: overlapPlan(["fc", "conv"]), optimizer: (p) => new SGD(p, { lr: 0.01 }),
 * //   startDevice: (index, model, layout) =>
 * //     BackendDevice.start(index, model, layout, (i) => createWebGpuBackend({ name: `webgpu:${i}` })),
 * // });
 * ```
 */
export class BackendDevice<B extends Backend = Backend> implements Device, ResidentReplica {
  /** Device kind: the backend's name up to any `:`, e.g. `webgpu` for `webgpu:1`. */
  readonly kind: string;
  /**
   * Host copy of the parameters: written by the runtime between iterations, or, once the resident
   * replica is active, filled when the runtime syncs parameters to the host.
   */
  readonly parameters: Float32Array;
  /** Host copy of the gradients, filled group by group (not used once the resident replica is active). */
  readonly gradients: Float32Array;
  /** This device, when its backend can keep the replica resident; `undefined` otherwise. */
  readonly resident: ResidentReplica | undefined;
  /**
   * The replica's buffers (BatchNorm statistics) as a host array in `bufferLayoutOf` order, in
   * shared memory; `undefined` for a model without any. See the module notes.
   */
  readonly buffers: Float32Array | undefined;
  /** The replica's own buffer tensors, in the order of {@link BackendDevice.buffers}. */
  #bufferEntries: BufferEntry[];
  #backend: B;
  /** The backend again, when it has the resident capabilities. */
  #residentBackend: ResidentBackend | undefined;
  #model: Network;
  #slots: Slot[];
  #layout: ParameterLayout;
  #state: ResidentState | undefined;
  #busy = false;
  /** The model-parallel head shard of a hybrid schedule, once set up. */
  #head: HeadShard | undefined;
  /** A resident replica's slice of the head, on the device (see `residentSlice`). */
  #slices: DeviceSlices | undefined;

  private constructor(
    readonly index: number,
    backend: B,
    model: Network,
    slots: Slot[],
    layout: ParameterLayout,
  ) {
    this.kind = backend.name.split(":")[0];
    this.#backend = backend;
    this.#residentBackend = canHoldResident(backend) ? backend : undefined;
    this.resident = this.#residentBackend ? this : undefined;
    this.#model = model;
    this.#slots = slots;
    this.#layout = layout;
    this.parameters = new Float32Array(layout.total);
    this.gradients = new Float32Array(layout.total);
    this.#bufferEntries = model.namedBuffers();
    const buffers = bufferLayoutOf(this.#bufferEntries);
    this.buffers = buffers.total > 0 ? new Float32Array(new SharedArrayBuffer(4 * buffers.total)) : undefined;
  }

  /**
   * Makes the device's backend with `createBackend(index)`, builds the replica on it and checks it
   * against the runtime's layout. The backend is registered under its name, so give each device's
   * backend a name of its own (e.g. `webgpu:${index}`). `createBackend` resolving to nothing (no
   * adapter, say) fails the start.
   */
  static async start<B extends Backend>(
    index: number,
    model: ModelSpec,
    layout: ParameterLayout,
    createBackend: (index: number) => Promise<B | undefined | null>,
  ): Promise<BackendDevice<B>> {
    let backend: B | undefined | null;
    try {
      backend = await createBackend(index);
    } catch (error) {
      throw new DeviceError(index, `failed to create the backend: ${(error as Error).message}`);
    }
    if (!backend) throw new DeviceError(index, "no backend is available (no adapter?)");
    try {
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
          throw new DeviceError(
            index,
            `replica parameter "${slot.name}" does not match the runtime's layout`,
          );
        }
        return { entry, layout: slot };
      });
      return new BackendDevice(index, backend, network, slots, layout);
    } catch (error) {
      // The device will never be closed: free its backend here.
      backend.dispose?.();
      throw error;
    }
  }

  /** The backend the replica runs on. */
  get backend(): B {
    return this.#backend;
  }

  /**
   * Runs hybrid schedules. On the host path the body's parameters are written from `parameters`
   * before each forward, the head's slices read from it, and gradients read back into `gradients`.
   * A resident replica keeps the body as for data-parallel plans (its gradients staged to peers as
   * `compute` stages them) and its head slice on the device (`residentSlice`).
   */
  readonly sharded: ShardedReplica = {
    setupHead: (layout: ParameterLayout, setup: HeadSetup) => {
      if (this.#state && !this.#slices) {
        return Promise.reject(
          new DeviceError(this.index, "a resident replica runs a hybrid head only once given its slice"),
        );
      }
      this.#head?.reset();
      const sharded = new Set(setup.head.sharded);
      const body = this.#slots.map((s) => s.entry).filter((e) => !sharded.has(e.group));
      this.#head = new HeadShard(this.#model, layout, setup, body);
      return Promise.resolve();
    },
    runHead: (_iteration: number, phase: HeadPhase, onGradients?: (group: string) => void) =>
      this.#exclusive(() => this.#runHead(phase, onGradients)),
    residentSlice: (layout: ParameterLayout, head: HeadLayout) => {
      this.#active("residentSlice");
      if (this.#slices) throw new DeviceError(this.index, "the head slice is already resident");
      const byName = new Map(this.#slots.map((s) => [s.layout.name, s]));
      this.#slices = this.#guard(() =>
        new DeviceSlices(sliceSlots(layout, head, this.index), (name) => {
          const { entry, layout: slot } = byName.get(name)!;
          return { tensor: entry.tensor, slot };
        })
      );
      return this.#slices.entries;
    },
  };

  async #runHead(phase: HeadPhase, onGradients?: (group: string) => void): Promise<HeadPhaseResult> {
    const head = this.#head;
    if (!head) throw new DeviceError(this.index, "a hybrid phase arrived before the head was set up");
    const state = this.#state;
    if (state?.staged.size && phase.kind === "forward-body" && !phase.microBatch) {
      await this.#dropStaged(state);
    }
    // Host path: later micro-batches of a step run on the same parameters. Resident: the body's
    // tensors are the ones its optimizer updates and the broadcast writes.
    if (!state && phase.kind === "forward-body" && !phase.microBatch) {
      const body = new Set(head.bodyEntries);
      for (const { entry, layout } of this.#slots) {
        if (!body.has(entry)) continue;
        this.#overwrite(
          entry.tensor.storage,
          this.parameters.subarray(layout.offset, layout.offset + layout.size),
        );
      }
    }
    const slices = this.#slices ?? hostSlices(this.parameters, this.gradients);
    try {
      return await head.run(phase, slices, async (group, members) => {
        await this.#takeGradients(group, members);
        onGradients?.(group);
      });
    } catch (error) {
      head.reset();
      throw error;
    }
  }

  /** Runs `work` as the device's only iteration in flight; failures name the device. */
  async #exclusive<T>(work: () => Promise<T>): Promise<T> {
    if (this.#busy) throw new DeviceError(this.index, "an iteration is already running");
    this.#busy = true;
    try {
      return await work();
    } catch (error) {
      throw this.#deviceError(error);
    } finally {
      this.#busy = false;
    }
  }

  compute(command: ComputeCommand, onGradients: (group: string) => void): Promise<ComputeResult> {
    return this.#exclusive(() => this.#compute(command, onGradients));
  }

  async #compute(command: ComputeCommand, onGradients: (group: string) => void): Promise<ComputeResult> {
    const backend = this.#backend;
    const state = this.#state;
    if (state?.staged.size) await this.#dropStaged(state);
    const spans: ComputeSpan[] = [];
    let start = performance.now();
    if (!state) {
      // Host path: the runtime updated `parameters`; write them before the forward reads them.
      for (const { entry, layout } of this.#slots) {
        this.#overwrite(
          entry.tensor.storage,
          this.parameters.subarray(layout.offset, layout.offset + layout.size),
        );
      }
    }
    // The statistics as the runtime left them (this device's own, or restored, or loaded).
    this.#writeBuffers();
    const images = fromStorage(backend, backend.upload(command.images), command.shape);
    const labels = new Tensor(backend, backend.upload(command.labels), [command.labels.length], {
      hostInts: command.labels,
    });
    try {
      const metrics = await replicaStep(
        this.#model,
        this.#slots.map((slot) => slot.entry),
        images,
        labels,
        command.labels,
        {
          context: { seed: command.seed, step: command.iteration, sampleOffset: command.sampleOffset },
          groups: command.backwardGroups,
          microBatches: command.microBatches,
          onForward: () => {
            spans.push({ name: "forward", start, end: performance.now() });
            start = performance.now();
          },
          onGroup: async (group, members) => {
            await this.#takeGradients(group, members);
            spans.push({ name: `backward ${group}`, group, start, end: performance.now() });
            onGradients(group);
            start = performance.now();
          },
        },
      );
      // What the forward made of them, for the runtime to keep (or undo) between steps.
      await this.#readBuffers();
      return { ...metrics, spans };
    } finally {
      images.dispose();
      labels.dispose();
      // A step that failed part-way leaves gradients the next one must not accumulate into.
      for (const { entry } of this.#slots) {
        entry.tensor.grad?.dispose();
        entry.tensor.grad = null;
      }
    }
  }

  /**
   * Takes `group`'s final gradients off its `members` (the replica's own entries): resident, into
   * the slots peers and the average read, staging them off the device at once where peers receive
   * them, and returning when the device has finished the group; else into the host `gradients`.
   */
  async #takeGradients(group: string, members: readonly ParameterEntry[]): Promise<void> {
    const state = this.#state;
    const own: Tensor[] = [];
    for (const entry of members) {
      const i = this.#slots.findIndex((s) => s.entry === entry);
      const { layout } = this.#slots[i];
      const grad = entry.tensor.grad;
      if (state) {
        if (grad) state.own[i].assign(grad);
        else state.backend.fill(state.own[i].storage, 0);
        own.push(state.own[i]);
      } else if (grad) {
        await grad.readInto(this.gradients.subarray(layout.offset, layout.offset + layout.size));
      } else {
        this.gradients.fill(0, layout.offset, layout.offset + layout.size);
      }
      grad?.dispose();
      entry.tensor.grad = null;
    }
    if (!state) return;
    // Start the copy off the device now, ahead of the rest of the backward.
    if (state.role.sendsGradients) state.staged.set(group, this.#stage(state, own));
    // The span ends, and the runtime hears of the group, when the device has finished it.
    await state.backend.synchronize();
  }

  // ---------------------------------------------------------------------------------------------
  // The resident replica (see ResidentReplica in device.ts)

  activate(role: ResidentRole): void {
    if (this.#state) throw new DeviceError(this.index, "the resident replica is already active");
    const backend = this.#residentBackend;
    if (!backend) {
      throw new DeviceError(this.index, `backend "${this.#backend.name}" cannot keep the replica resident`);
    }
    this.#guard(() => {
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
      this.#state = { role, backend, own: perSlot(), averaged, received, entries, staged: new Map() };
    });
  }

  get parameterEntries(): readonly ParameterEntry[] {
    return this.#active("parameterEntries").entries;
  }

  async stageGradients(group: string, use: (values: Float32Array) => void | Promise<void>): Promise<void> {
    const state = this.#active("stageGradients");
    // Copies started during compute are taken as they are; otherwise the copy starts now.
    const pending = state.staged.get(group) ??
      this.#guard(() => this.#stage(state, this.#members(group).map((i) => state.own[i])));
    state.staged.delete(group);
    await this.#lend(pending, use);
  }

  receiveGradients(from: number, group: string, values: Float32Array): void {
    const state = this.#active("receiveGradients");
    const target = state.received.get(from);
    if (!target) {
      throw new DeviceError(this.index, `receives no gradients from device ${from} in this role`);
    }
    this.#guard(() => this.#scatter(state, group, values, (i) => target[i]));
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
        state.backend.averageInOrder(inOrder.map((t) => t.storage), state.averaged[i].storage);
      }
    });
  }

  async stageParameters(group: string, use: (values: Float32Array) => void | Promise<void>): Promise<void> {
    const state = this.#active("stageParameters");
    const pending = this.#guard(() =>
      this.#stage(state, this.#members(group).map((i) => this.#slots[i].entry.tensor))
    );
    await this.#lend(pending, use);
  }

  receiveParameters(group: string, values: Float32Array): void {
    const state = this.#active("receiveParameters");
    this.#guard(() => this.#scatter(state, group, values, (i) => this.#slots[i].entry.tensor));
  }

  /** Frees the replica's storages and, where the backend can, what it holds (WebGPU: the `GPUDevice`). */
  close(): Promise<void> {
    this.#slices?.dispose();
    this.#model.dispose();
    this.#backend.dispose?.();
    return Promise.resolve();
  }

  // ---------------------------------------------------------------------------------------------
  // Internals

  /** Slot indices of `group`, in layout order. */
  #members(group: string): number[] {
    groupRange(this.#layout, group); // names the known groups if `group` is not one
    return this.#slots.flatMap((s, i) => (s.layout.group === group ? [i] : []));
  }

  /**
   * Overwrites `storage` with `values` in place (tensors keep their handle): `write` where the
   * backend has it, else a copy from a temporary upload.
   */
  #overwrite(storage: Storage, values: Float32Array): void {
    const backend = this.#backend;
    if (backend.write) {
      backend.write(storage, values);
      return;
    }
    const source = backend.upload(values);
    try {
      const dense = { offset: 0, strides: [1] };
      backend.copyStrided(source, dense, storage, dense, [values.length]);
    } finally {
      backend.release(source);
    }
  }

  /** Writes the host `buffers` onto the replica's buffer tensors (nothing without buffers). */
  #writeBuffers(): void {
    const flat = this.buffers;
    if (!flat) return;
    let offset = 0;
    for (const { tensor } of this.#bufferEntries) {
      this.#overwrite(tensor.storage, flat.subarray(offset, offset + tensor.size));
      offset += tensor.size;
    }
  }

  /**
   * Fills the host `buffers` from the replica's buffer tensors: one staged copy of them all where the
   * backend stages (WebGPU), else a read of each.
   */
  async #readBuffers(): Promise<void> {
    const flat = this.buffers;
    if (!flat) return;
    const tensors = this.#bufferEntries.map((e) => e.tensor);
    const backend = this.#residentBackend;
    if (backend) {
      const staged = await backend.stageToHost(tensors.map((t) => t.storage));
      try {
        flat.set(staged.values.subarray(0, flat.length));
      } finally {
        staged.release();
      }
      return;
    }
    let offset = 0;
    for (const tensor of tensors) {
      await tensor.readInto(flat.subarray(offset, offset + tensor.size));
      offset += tensor.size;
    }
  }

  /** Starts copying `tensors` back to back off the device. */
  #stage(state: ResidentState, tensors: readonly Tensor[]): Promise<StagedValues> {
    const pending = state.backend.stageToHost(tensors.map((t) => t.storage));
    pending.catch(() => {}); // awaited by whoever takes it; a step that failed first drops it
    return pending;
  }

  /** Lends staged values to `use`, then hands the staging memory back. */
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
  #scatter(
    state: ResidentState,
    group: string,
    values: Float32Array,
    target: (slot: number) => Tensor,
  ): void {
    const range = groupRange(this.#layout, group);
    if (values.length !== range.size) {
      throw new Error(`group "${group}" holds ${range.size} values, got ${values.length}`);
    }
    for (const i of this.#members(group)) {
      const { offset, size } = this.#slots[i].layout;
      state.backend.write(
        target(i).storage,
        values.subarray(offset - range.offset, offset - range.offset + size),
      );
    }
  }

  /** Releases gradient copies a failed step left untaken, so their staging memory is reusable. */
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
