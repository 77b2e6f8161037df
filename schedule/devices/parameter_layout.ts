/**
 * Where each parameter lives in a device's flat parameter and gradient buffers. Parameters are laid
 * out group by group, in the order backward finishes the groups, so each group is one contiguous
 * range and travels as one transfer.
 *
 * @module
 */

import type { Backend, MemoryLoan } from "../../backends/backend.ts";
import { getBackend, type ParameterEntry } from "../../engine/mod.ts";

/** The backend whose memory each {@link sharedFloats} array is, to free it there. */
const allocatedBy = new WeakMap<Float32Array, Backend>();
/** The backend that lent each {@link lendBeside} loan. */
const lentBy = new WeakMap<MemoryLoan, Backend>();

/**
 * A zero-filled flat float32 buffer on a `SharedArrayBuffer`, for parameters, gradients and their
 * averages that Workers share: from `backend`'s (default: the current one's) `allocateShared` where
 * it has one (the CPU backend places it in its kernel memory, so the optimizer and the average run
 * on it in place), else a plain `SharedArrayBuffer`. Its owner hands it back with
 * {@link freeSharedFloats} when done.
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { sharedFloats } from "./parameter_layout.ts";
 * const gradients = sharedFloats(1024); // Float32Array over shared memory, all zeros
 * ```
 */
export function sharedFloats(length: number, backend: Backend = getBackend()): Float32Array {
  const array = backend.allocateShared?.(length);
  if (!array) return new Float32Array(new SharedArrayBuffer(4 * length));
  allocatedBy.set(array, backend);
  return array;
}

/**
 * Frees an array from {@link sharedFloats} now, in the backend that allocated it (kernel memory is
 * outside the JavaScript heap: waiting for the garbage collector left a second trainer in the same
 * process without room, its updates on the slow path). Neither the array nor any view of it may be
 * used afterwards. Once per array; later calls, and arrays from elsewhere, do nothing.
 */
export function freeSharedFloats(array: Float32Array): void {
  const backend = allocatedBy.get(array);
  allocatedBy.delete(array);
  backend?.freeShared?.(array);
}

/**
 * A loan of `bytes` of the kernel memory that `arrays` (from {@link sharedFloats}, one backend's)
 * lie in, for a device thread's backend to compute on them in place (see `Backend.lendMemory`);
 * `undefined` where their backend lends none. Taken back with {@link reclaimLoan}.
 */
export function lendBeside(arrays: readonly Float32Array[], bytes: number): MemoryLoan | undefined {
  const backend = allocatedBy.get(arrays[0]);
  if (!backend || arrays.some((a) => allocatedBy.get(a) !== backend)) return undefined;
  const loan = backend.lendMemory?.(bytes, arrays);
  if (loan) lentBy.set(loan, backend);
  return loan;
}

/** Takes back a loan from {@link lendBeside} once its borrower has stopped; once per loan. */
export function reclaimLoan(loan: MemoryLoan): void {
  const backend = lentBy.get(loan);
  lentBy.delete(loan);
  backend?.reclaimMemory?.(loan);
}

/** One parameter's place in the flat buffers. */
export interface ParameterSlot {
  /** Dotted name. */
  readonly name: string;
  /** Shape. */
  readonly shape: readonly number[];
  /** Group. */
  readonly group: string;
  /** First element in the flat buffer. */
  readonly offset: number;
  /** Number of elements. */
  readonly size: number;
  /** Caffe `lr_mult`. */
  readonly lrMult: number;
  /** Caffe `decay_mult`. */
  readonly decayMult: number;
}

/** A contiguous range of the flat buffers holding one group. */
export interface GroupRange {
  /** Group name. */
  readonly name: string;
  /** First element. */
  readonly offset: number;
  /** Number of elements. */
  readonly size: number;
}

/** The whole layout. */
export interface ParameterLayout {
  /** Every parameter, group by group. */
  readonly slots: readonly ParameterSlot[];
  /** Groups in backward order (output side first). */
  readonly groups: readonly GroupRange[];
  /** Total number of elements. */
  readonly total: number;
}

/**
 * Groups in the order backward completes them: the reverse of the order their first parameter is
 * registered (input to output).
 *
 * @example
 * ```ts
 * import { backwardGroupOrder } from "./parameter_layout.ts";
 * // backwardGroupOrder(alexnet().namedParameters()) → ["fc", "conv"]
 * ```
 */
export function backwardGroupOrder(entries: readonly Pick<ParameterEntry, "group">[]): string[] {
  return [...new Set(entries.map((e) => e.group))].reverse();
}

/**
 * Lays out `entries` group by group in backward order, keeping registration order within a group.
 *
 * @example
 * ```ts
 * import { layoutOf } from "./parameter_layout.ts";
 * // const layout = layoutOf(model.namedParameters());
 * // layout.groups[0] → { name: "fc", offset: 0, size: 58631144 }
 * ```
 */
export function layoutOf(entries: readonly ParameterEntry[]): ParameterLayout {
  const slots: ParameterSlot[] = [];
  const groups: GroupRange[] = [];
  let offset = 0;
  for (const group of backwardGroupOrder(entries)) {
    const start = offset;
    for (const entry of entries) {
      if (entry.group !== group) continue;
      const size = entry.tensor.size;
      slots.push({
        name: entry.name,
        shape: [...entry.tensor.shape],
        group,
        offset,
        size,
        lrMult: entry.lrMult,
        decayMult: entry.decayMult,
      });
      offset += size;
    }
    groups.push({ name: group, offset: start, size: offset - start });
  }
  return { slots, groups, total: offset };
}

/** The range of `group` in `layout`, or an error naming the known groups. */
export function groupRange(layout: ParameterLayout, group: string): GroupRange {
  const range = layout.groups.find((g) => g.name === group);
  if (!range) {
    throw new Error(
      `unknown parameter group "${group}"; the model has ${layout.groups.map((g) => g.name).join(", ")}`,
    );
  }
  return range;
}

/**
 * SHA-256 (hex) of every parameter's float32 bytes, parameters in name order: a fingerprint that
 * two runs trained bit-identically share.
 *
 * @example
 * ```ts
 * import { parametersSha256 } from "./parameter_layout.ts";
 * const layout = { total: 2, groups: [], slots: [{ name: "w", shape: [2], group: "fc", offset: 0, size: 2, lrMult: 1, decayMult: 1 }] };
 * console.log(await parametersSha256(layout, new Float32Array([1, 2])));
 * ```
 */
export async function parametersSha256(
  layout: { slots: readonly { name: string; offset: number; size: number }[]; total: number },
  flat: Float32Array,
): Promise<string> {
  const bytes = new Uint8Array(layout.total * 4);
  const out = new Float32Array(bytes.buffer);
  let at = 0;
  for (const slot of [...layout.slots].sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0)) {
    out.set(flat.subarray(slot.offset, slot.offset + slot.size), at);
    at += slot.size;
  }
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}
