/**
 * Finite checks: where the first NaN or ±∞ of a tensor, or of a list of named tensors, sits. A
 * diverging run is caught by these before its parameters are saved or spread further.
 *
 * @module
 */

import type { Tensor } from "./tensor.ts";

/**
 * Index of the first NaN or ±∞ element of a float32 tensor, or −1 when all are finite: the
 * backend's `firstNonFinite` reduction where it has one (4 bytes come back from a GPU), else a scan
 * of the values read back.
 *
 * @example
 * ```ts
 * import "../mod.ts"; // registers the CPU backend
 * import { firstNonFinite, tensor } from "./mod.ts";
 * console.log(await firstNonFinite(tensor([1, NaN]))); // 1
 * ```
 */
export async function firstNonFinite(t: Tensor): Promise<number> {
  if (t.dtype !== "float32") return -1;
  if (t.backend.firstNonFinite) return await t.backend.firstNonFinite(t.storage);
  const values = await t.data();
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v - v !== 0) return i;
  }
  return -1;
}

/** A non-finite element found by {@link findNonFinite}. */
export interface NonFiniteValue {
  /** The tensor's name. */
  name: string;
  /** Flat index of its first bad element. */
  index: number;
  /** That element: `NaN`, `Infinity` or `-Infinity`. */
  value: number;
}

/**
 * The first of `tensors`, in order, holding a NaN or ±∞, with its first bad element; `undefined`
 * when all are finite.
 *
 * @example
 * ```ts
 * import "../mod.ts"; // registers the CPU backend
 * import { findNonFinite, tensor } from "./mod.ts";
 * const bad = await findNonFinite([{ name: "w", tensor: tensor([0, Infinity]) }]);
 * console.log(bad); // { name: "w", index: 1, value: Infinity }
 * ```
 */
export async function findNonFinite(
  tensors: Iterable<{ name: string; tensor: Tensor }>,
): Promise<NonFiniteValue | undefined> {
  for (const { name, tensor } of tensors) {
    const index = await firstNonFinite(tensor);
    if (index >= 0) {
      // Only the failing tensor is read whole, and only once.
      const values = await tensor.data();
      return { name, index, value: values[index] };
    }
  }
  return undefined;
}
