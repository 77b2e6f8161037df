/**
 * The host's half of the non-finite scan (the kernel is `first_non_finite` in
 * `generate/elementwise_kernels.ts`, its thread split the elementwise one in `tasks.ts`): each
 * thread leaves the first bad index of its contiguous share, or −1, in its own int32 slot, and the
 * answer is the smallest index found.
 *
 * @module
 */

/**
 * The smallest non-negative index among `slots`, or −1 when every slot is −1. Shares are in index
 * order, so this is also the first thread's hit, but taking the minimum does not rely on it.
 *
 * @example
 * ```ts
 * import { firstFound } from "./finite.ts";
 * console.log(firstFound(new Int32Array([-1, 70, 40]))); // 40
 * console.log(firstFound(new Int32Array([-1, -1]))); // -1
 * ```
 */
export function firstFound(slots: Int32Array): number {
  let first = -1;
  for (const index of slots) {
    if (index >= 0 && (first < 0 || index < first)) first = index;
  }
  return first;
}
