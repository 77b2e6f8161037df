/**
 * Where a device's slice of a hybrid head lives (see `sharded_head.ts`): the parameters a stage's
 * forward reads and where its final gradients go. Two homes, one interface ({@link SliceStore}):
 *
 * - {@link hostSlices}: the device's flat host buffers. Every forward uploads the slice from
 *   `parameters`, every backward reads its gradient back into `gradients`, and the runtime updates
 *   it there with a host optimizer (CPU Workers; devices on the host path).
 * - {@link DeviceSlices}: tensors on the device's own backend, one per slice slot, with their
 *   gradients on `.grad`: a GPU-resident replica's head. The slice optimizer is created over them,
 *   so its updates run as the backend's kernels and nothing of the head crosses to the host in a step.
 *   Separate tensors, not views of the whole layer's rows: a device backend need not address part of
 *   a storage (WebGPU binds at 256-byte offsets, which a row boundary seldom is).
 *
 * @module
 */

import type { Backend } from "../../backends/backend.ts";
import { noGrad, ops, type ParameterEntry, TandemError, type Tensor } from "../../engine/mod.ts";
import { fromStorage } from "../../engine/creation.ts";
import type { ParameterSlot } from "./parameter_layout.ts";

/** The parameters and gradients of a device's head slice, slot by slot (slice slots of the layout). */
export interface SliceStore {
  /**
   * A new leaf tensor (`requiresGrad`) on `backend` holding `slot`'s current parameters, for one
   * stage's forward; the caller disposes it, which leaves the slice as it is.
   */
  parameter(slot: ParameterSlot, backend: Backend): Tensor;
  /** Takes `slot`'s final gradient of the step (`null`: none arrived, so zeros); does not keep `gradient`. */
  gradient(slot: ParameterSlot, gradient: Tensor | null): Promise<void>;
}

/**
 * The slice in a device's flat host buffers: parameters uploaded from `parameters` at each forward,
 * gradients read back into `gradients` (both indexed by the slots' offsets).
 *
 * @example
 * ```ts
 * import { hostSlices } from "./head_slices.ts";
 * const store = hostSlices(new Float32Array(10), new Float32Array(10));
 * ```
 */
export function hostSlices(parameters: Float32Array, gradients: Float32Array): SliceStore {
  return {
    parameter(slot, backend) {
      const values = parameters.subarray(slot.offset, slot.offset + slot.size);
      const t = fromStorage(backend, backend.upload(values), slot.shape);
      t.requiresGrad = true;
      return t;
    },
    async gradient(slot, gradient) {
      const target = gradients.subarray(slot.offset, slot.offset + slot.size);
      if (!gradient) target.fill(0);
      else await gradient.readInto(target);
    },
  };
}

/**
 * A device's head slice as tensors on its backend (see the module notes), initialised on the device
 * from the rows of the whole layer's tensors it holds.
 *
 * @example
 * ```ts
 * import { DeviceSlices } from "./head_slices.ts";
 * // const slices = new DeviceSlices(sliceSlots(layout, head, d), (name) => replicaTensorOf(name));
 * // new SGD([...slices.entries], { lr: 0.01 }); // updates run on the device
 * ```
 */
export class DeviceSlices implements SliceStore {
  /** The slice's parameters, in `slots` order, each `.grad` the slice's gradient of the last step. */
  readonly entries: readonly ParameterEntry[];
  readonly #bySlot: Map<string, ParameterEntry>;

  /**
   * Allocates each of `slots` (a device's slice slots, see `sliceSlots`) on the backend of
   * `whole(name)`, the device's tensor of the whole parameter, and copies its rows there on the
   * device; each `.grad` starts at zeros.
   */
  constructor(
    slots: readonly ParameterSlot[],
    whole: (name: string) => { tensor: Tensor; slot: ParameterSlot },
  ) {
    this.entries = slots.map((slot) => {
      const { tensor: full, slot: fullSlot } = whole(slot.name);
      const backend = full.backend;
      const tensor = fromStorage(backend, backend.allocate(slot.size, "float32"), slot.shape);
      backend.copyStrided(
        full.storage,
        { offset: slot.offset - fullSlot.offset, strides: [1] },
        tensor.storage,
        { offset: 0, strides: [1] },
        [slot.size],
      );
      tensor.requiresGrad = true;
      tensor.grad = fromStorage(backend, backend.allocate(slot.size, "float32"), slot.shape);
      return { name: slot.name, tensor, group: slot.group, lrMult: slot.lrMult, decayMult: slot.decayMult };
    });
    this.#bySlot = new Map(this.entries.map((e) => [e.name, e]));
  }

  /**
   * A second handle on the slice's storage: the forward's gradient lands on the handle's `.grad`,
   * apart from the optimizer's, and the optimizer's updates are what the next forward reads.
   */
  parameter(slot: ParameterSlot): Tensor {
    const own = this.#entry(slot).tensor;
    const handle = noGrad(() => ops.reshape(own, own.shape));
    handle.requiresGrad = true;
    return handle;
  }

  gradient(slot: ParameterSlot, gradient: Tensor | null): Promise<void> {
    const target = this.#entry(slot).tensor.grad!;
    if (gradient) target.assign(gradient);
    else target.backend.fill(target.storage, 0);
    return Promise.resolve();
  }

  /** Frees the slice's tensors and gradients. */
  dispose(): void {
    for (const { tensor } of this.entries) tensor.dispose();
  }

  #entry(slot: ParameterSlot): ParameterEntry {
    const entry = this.#bySlot.get(slot.name);
    if (!entry) throw new TandemError(`head slice: no slot "${slot.name}" on this device`);
    return entry;
  }
}
