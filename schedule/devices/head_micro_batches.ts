/**
 * Gradient accumulation in a hybrid head shard (`accumulate: K` under a hybrid plan): each device
 * runs its shard as K contiguous micro-batches of m samples, and every micro-batch goes through all
 * the phases of `sharded_head.ts` — the body's output rows of micro-batch k of every device are
 * gathered (N·m rows: device e's block e), the head's slices run over them, and the partial input
 * gradients come back to each device's body.
 *
 * The sums follow data-parallel accumulation (`replicaStep`): the body's gradients are added onto
 * `.grad` micro-batch after micro-batch and scaled by `fround(1/K)` after the last backward; each
 * slice's gradient of micro-batch k (already `· fround(1/N)`, as a non-accumulating hybrid step gives
 * it) is added in micro-batch order, on the device's backend, and the sum scaled by `fround(1/K)`.
 * On one device that is data-parallel accumulation's arithmetic exactly; on N > 1 the head's
 * products sum over the gathered rows, so it agrees with data-parallel to rounding, as hybrid does.
 *
 * @module
 */

import { ops, type Tensor, tidy } from "../../engine/mod.ts";

/** Which micro-batch of how many a phase belongs to. */
export interface MicroBatch {
  /** 0-based position of this micro-batch in the step. */
  readonly index: number;
  /** Micro-batches per step (K); 1 without accumulation. */
  readonly count: number;
}

/** No accumulation: one micro-batch, the whole shard. */
export const WHOLE_SHARD: MicroBatch = { index: 0, count: 1 };

/**
 * The global sample of each gathered row of micro-batch `micro`, for `devices` devices with `rows`
 * gathered rows (`m = rows / devices` per device, shards of `m · K`): row r is device ⌊r/m⌋'s sample
 * `k·m + r mod m` of its shard. `undefined` without accumulation, where row r is sample r.
 *
 * @example
 * ```ts
 * import { gatheredSamples } from "./head_micro_batches.ts";
 * console.log(gatheredSamples(4, 2, { index: 1, count: 2 })); // [2, 3, 6, 7]
 * ```
 */
export function gatheredSamples(rows: number, devices: number, micro: MicroBatch): number[] | undefined {
  if (micro.count === 1) return undefined;
  const m = rows / devices, shard = m * micro.count;
  return Array.from({ length: rows }, (_, r) => Math.floor(r / m) * shard + micro.index * m + (r % m));
}

/**
 * A head shard's slice gradients summed over a step's micro-batches, in order, on the device's
 * backend, then scaled by `fround(1/K)`: what a device reports for its slice after the last one.
 *
 * @example
 * ```ts
 * import { SliceGradientSum } from "./head_micro_batches.ts";
 * const sums = new SliceGradientSum();
 * // const total = sums.add("0.0", grad, { index: k, count: K }); // a tensor after the last k only
 * ```
 */
export class SliceGradientSum {
  readonly #sums = new Map<string, Tensor | null>();

  /**
   * Takes `gradient` (this micro-batch's gradient of the slot `key`, or `null` where none arrived)
   * and returns `undefined` before the last micro-batch; after the last, the average the caller now
   * owns (`null` if no micro-batch gave one). Without accumulation `gradient` comes straight back.
   */
  add(key: string, gradient: Tensor | null, micro: MicroBatch): Tensor | null | undefined {
    if (micro.count === 1) return gradient;
    const previous = this.#sums.get(key) ?? null;
    let sum = gradient ?? previous;
    if (previous && gradient) {
      sum = tidy(() => ops.add(previous, gradient));
      previous.dispose();
      gradient.dispose();
    }
    if (micro.index < micro.count - 1) {
      this.#sums.set(key, sum);
      return undefined;
    }
    this.#sums.delete(key);
    if (!sum) return null;
    const scaled = tidy(() => ops.mul(sum, Math.fround(1 / micro.count)));
    sum.dispose();
    return scaled;
  }

  /** Frees the sums of an unfinished step (after a failure). */
  clear(): void {
    for (const sum of this.#sums.values()) sum?.dispose();
    this.#sums.clear();
  }
}
