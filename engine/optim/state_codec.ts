/**
 * An optimizer state as one flat float32 array plus a plain-data header: the form in which a state
 * crosses from one replica to another (to a peer GPU, to another MPI rank) when replicas that each
 * update must continue from the same state. Written once, used by every data-parallel exchange.
 *
 * @module
 */

import type { ParameterEntry } from "../nn/parameter.ts";
import { Tensor } from "../tensor.ts";
import type { HyperBase, OptimizerState } from "./optimizer.ts";

/** Where one state slot sits in the flat values. */
export interface PackedSlot {
  /** Parameter name. */
  name: string;
  /** Slot name, e.g. `history`, `m`, `v`. */
  slot: string;
  /** The slot's shape. */
  shape: number[];
  /** First element in the flat values. */
  offset: number;
  /** Elements. */
  size: number;
}

/** The plain-data part of a packed state (JSON-serialisable). */
export interface PackedStateHeader {
  /** Finished iterations. */
  iteration: number;
  /** Hyper-parameters. */
  hyper: HyperBase;
  /** Update count per parameter. */
  updates: Record<string, number>;
  /** Every slot, in the state's order. */
  slots: PackedSlot[];
  /** Length of the flat values. */
  total: number;
}

/**
 * Packs `state` (from `optimizer.state()`) into a header and one flat array made by `allocate`
 * (default: a plain `Float32Array`; MPI passes shared memory). Reads device tensors asynchronously.
 *
 * @example
 * ```ts
 * import { packOptimizerState } from "./state_codec.ts";
 * // const { header, values } = await packOptimizerState(optimizer.state());
 * ```
 */
export async function packOptimizerState(
  state: OptimizerState,
  allocate: (length: number) => Float32Array = (length) => new Float32Array(length),
): Promise<{ header: PackedStateHeader; values: Float32Array }> {
  const slots: PackedSlot[] = [];
  let total = 0;
  for (const [name, perSlot] of state.perParameter) {
    for (const [slot, t] of Object.entries(perSlot)) {
      slots.push({ name, slot, shape: [...t.shape], offset: total, size: t.size });
      total += t.size;
    }
  }
  const values = allocate(total);
  for (const s of slots) {
    values.set((await state.perParameter.get(s.name)![s.slot].data()) as Float32Array, s.offset);
  }
  const header = { iteration: state.iteration, hyper: state.hyper, updates: state.updates, slots, total };
  return { header, values };
}

/**
 * The state a header and flat values describe, its tensors uploaded to the backend of the
 * parameter they belong to (by name in `parameters`), ready for `optimizer.loadState`. The caller
 * frees the tensors afterwards with {@link disposeOptimizerState}.
 *
 * @example
 * ```ts
 * import { disposeOptimizerState, unpackOptimizerState } from "./state_codec.ts";
 * // const state = unpackOptimizerState(header, values, optimizer.parameters);
 * // try { optimizer.loadState(state); } finally { disposeOptimizerState(state); }
 * ```
 */
export function unpackOptimizerState(
  header: PackedStateHeader,
  values: Float32Array,
  parameters: readonly ParameterEntry[],
): OptimizerState {
  const backends = new Map(parameters.map((p) => [p.name, p.tensor.backend]));
  const perParameter = new Map<string, Record<string, Tensor>>();
  for (const s of header.slots) {
    const backend = backends.get(s.name);
    const record = perParameter.get(s.name) ?? {};
    // A slot of an unknown parameter is left out; loadState then names what is missing.
    if (!backend) continue;
    const storage = backend.upload(values.subarray(s.offset, s.offset + s.size));
    record[s.slot] = new Tensor(backend, storage, s.shape);
    perParameter.set(s.name, record);
  }
  return { iteration: header.iteration, hyper: header.hyper, updates: header.updates, perParameter };
}

/**
 * Frees the tensors of a state made by {@link unpackOptimizerState}.
 *
 * @example
 * ```ts
 * import { disposeOptimizerState } from "./state_codec.ts";
 * // disposeOptimizerState(state);
 * ```
 */
export function disposeOptimizerState(state: OptimizerState): void {
  for (const record of state.perParameter.values()) for (const t of Object.values(record)) t.dispose();
}
