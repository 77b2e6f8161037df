/**
 * The simulator's link rate at a transfer's size, from rates calibrated on probes of several sizes.
 * Why: a link is not one rate. Over 10 Gbit/s between 2 namespaces of one 2-core machine, the
 * calibrated two-way rate was 2.67 Gbit/s (master) on the 4.2 MB probe and 6.45 on the 66.5 MB one
 * (per-chunk costs weigh more on small exchanges); pricing the AlexNet-like net's 4.2 MB FC group at
 * the largest probe's rate under-predicted its `sequential` allreduce step by 23% (4% at the rate of
 * its own size), its `bucketed` rows by 10 and 13% (2%).
 *
 * @module
 */

/** A rate calibrated on one probe: its FC bytes and the link's bytes per second there. */
export interface SizedRate {
  bytes: number;
  bytesPerSecond: number;
}

/**
 * The rate at `bytes`: the calibrated rates interpolated in log bytes and log rate between the two
 * probes around it, the nearest probe's outside them.
 *
 * @example
 * ```ts
 * import { rateAtSize } from "./sized_link.ts";
 * const probes = [{ bytes: 4e6, bytesPerSecond: 1e8 }, { bytes: 64e6, bytesPerSecond: 4e8 }];
 * rateAtSize(probes, 16e6); // 2e8: halfway in log bytes, halfway in log rate
 * rateAtSize(probes, 1e6); // 1e8: the smallest probe's
 * ```
 */
export function rateAtSize(rates: readonly SizedRate[], bytes: number): number {
  if (rates.length === 0) throw new RangeError("rateAtSize: no calibrated rates");
  const sorted = [...rates].sort((a, b) => a.bytes - b.bytes);
  if (!(bytes > sorted[0].bytes)) return sorted[0].bytesPerSecond;
  for (let i = 1; i < sorted.length; i++) {
    const low = sorted[i - 1], high = sorted[i];
    if (bytes <= high.bytes) {
      const t = Math.log(bytes / low.bytes) / Math.log(high.bytes / low.bytes);
      return Math.exp(Math.log(low.bytesPerSecond) * (1 - t) + Math.log(high.bytesPerSecond) * t);
    }
  }
  return sorted.at(-1)!.bytesPerSecond;
}
