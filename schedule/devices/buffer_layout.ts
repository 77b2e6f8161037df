/**
 * Where a replica's buffers (BatchNorm's running statistics, see `Module.addBuffer`) live in a
 * device's flat host array. Buffers are not parameters: they have no gradient, are never averaged or
 * exchanged, and each data-parallel replica keeps its own (as Caffe's solvers and PyTorch DDP
 * without buffer broadcast do); the runtime reads device 0's for the model it evaluates and
 * checkpoints, restores them when a step is undone, and copies device 0's to every replica when a
 * checkpoint is loaded.
 *
 * How each device kind keeps them in its host array (`Device.buffers`): a CPU Worker shares it with
 * its worker, which loads it into the replica before each step and writes it back after; a
 * WebGPU device (`backend_device.ts`) writes it onto its GPU before each forward and stages the
 * forward's new statistics back into it after (a few hundred floats, one copy each way); an MPI
 * rank's device is one of those, and the MPI exchange broadcasts rank 0's array where one process
 * copies device 0's (at the start and after a checkpoint is loaded).
 *
 * @module
 */

import { type BufferEntry, getBackend, TandemError } from "../../engine/mod.ts";
import { fromStorage } from "../../engine/creation.ts";
import type { Device } from "./device.ts";

/** One buffer's place in the flat array. */
export interface BufferSlot {
  /** Dotted name, e.g. `bn1.mean`. */
  readonly name: string;
  /** Shape. */
  readonly shape: readonly number[];
  /** First element. */
  readonly offset: number;
  /** Number of elements. */
  readonly size: number;
}

/** Every buffer of a model, in registration order. */
export interface BufferLayout {
  /** The buffers. */
  readonly slots: readonly BufferSlot[];
  /** Total number of elements (0: the model has no buffers). */
  readonly total: number;
}

/**
 * Lays out `entries` (a model's `namedBuffers()`) one after another.
 *
 * @example
 * ```ts
 * import { bufferLayoutOf } from "./buffer_layout.ts";
 * // bufferLayoutOf(network.namedBuffers()).slots[0] → { name: "bn_conv1.mean", shape: [16], offset: 0, size: 16 }
 * ```
 */
export function bufferLayoutOf(entries: readonly BufferEntry[]): BufferLayout {
  let offset = 0;
  const slots = entries.map((e) => {
    const slot = { name: e.name, shape: [...e.tensor.shape], offset, size: e.tensor.size };
    offset += e.tensor.size;
    return slot;
  });
  return { slots, total: offset };
}

/** Copies `entries` (in layout order) into `flat`, or back with `into: "tensors"`. */
export function copyBuffers(
  layout: BufferLayout,
  entries: readonly BufferEntry[],
  flat: Float32Array,
  into: "flat" | "tensors",
): void {
  const backend = getBackend();
  layout.slots.forEach((slot, i) => {
    const entry = entries[i];
    if (!entry || entry.name !== slot.name || entry.tensor.size !== slot.size) {
      throw new TandemError(`buffer "${slot.name}" does not match the replica's buffers`);
    }
    const view = flat.subarray(slot.offset, slot.offset + slot.size);
    if (into === "flat") view.set(entry.tensor.dataSync() as Float32Array);
    else {
      const source = fromStorage(backend, backend.upload(view), slot.shape);
      entry.tensor.assign(source);
      source.dispose();
    }
  });
}

/**
 * Named buffer entries over a flat host array laid out by `layout` (zero-copy tensors of the
 * current backend): device 0's statistics, for saving and loading checkpoints in place.
 *
 * @example
 * ```ts
 * import { bufferLayoutOf, hostBufferEntries } from "./buffer_layout.ts";
 * // const entries = hostBufferEntries(layout, device0.buffers!);
 * ```
 */
export function hostBufferEntries(layout: BufferLayout, flat: Float32Array): BufferEntry[] {
  const backend = getBackend();
  if (!backend.wrap) throw new TandemError(`backend "${backend.name}" cannot wrap host memory`);
  return layout.slots.map((slot) => ({
    name: slot.name,
    tensor: fromStorage(
      backend,
      backend.wrap!(flat.subarray(slot.offset, slot.offset + slot.size)),
      slot.shape,
    ),
  }));
}

/**
 * Gives every device of `devices` the model's initial buffers (`initial`, in `layout` order), after
 * checking that each keeps a host array of them (`Device.buffers`): from here on each replica keeps
 * its own. Nothing to do for a model without buffers. Every way a run starts its devices (in this
 * process, or one per MPI rank) goes through here, so a device kind that cannot keep them is
 * refused in one place, naming it.
 *
 * @example
 * ```ts
 * import { loadInitialBuffers } from "./buffer_layout.ts";
 * // loadInitialBuffers(devices, reference.buffers, reference.initialBuffers);
 * ```
 */
export function loadInitialBuffers(
  devices: readonly Device[],
  layout: BufferLayout | undefined,
  initial: Float32Array | undefined,
): void {
  if (!layout || layout.total === 0) return;
  const lacking = devices.find((d) => d.buffers?.length !== layout.total);
  if (lacking) {
    throw new TandemError(
      `DataParallelTrainer: the model has ${layout.slots.length} buffers (BatchNorm statistics, ` +
        `${layout.total} values) and device ${lacking.index} (${lacking.kind}) keeps no host array of them ` +
        `(Device.buffers), so it cannot carry them; train it on CPU Worker or WebGPU devices`,
    );
  }
  for (const device of devices) device.buffers!.set(initial ?? new Float32Array(layout.total));
}
