/**
 * The CPU side of a gradient exchange as the simulator prices it (`CostOptions`), measured on one
 * backend: `bench:schedule` and `bench:cluster` both set the simulator beside measured steps and
 * take these two rates from here, so that both price the same work the same way.
 *
 * @module
 */

import type { CpuBackend } from "../mod.ts";
import type { Storage } from "../backends/backend.ts";

/** What {@link measureExchangeRates} found. */
export interface ExchangeRates {
  /** Seconds per parameter byte of one SGD step with momentum and weight decay (`sgdUpdate`). */
  updateSecondsPerByte: number;
  /**
   * Bytes of one input summed per second by the device-order average of two inputs
   * (`averageInOrder`): the simulator's `memoryBandwidthBytesPerSecond`, which prices a sum of N
   * inputs of b bytes at (N − 1)·b over it.
   */
  sumBytesPerSecond: number;
  /**
   * Seconds per parameter byte that an undoable update (`Optimizer.step` with `undoable`) takes
   * beyond a plain one: its fused pass also writes the parameter and its momentum into buffers kept
   * aside. The simulator's `undo.secondsPerByte`.
   */
  undoSecondsPerByte: number;
  /**
   * Seconds per parameter byte of a finite check's scan (`firstNonFinite`): what follows an update
   * that does not check in its own pass (Adam's; SGD's on the CPU does, inside `updateSecondsPerByte`).
   */
  checkSecondsPerByte: number;
}

/**
 * The median of 7 timed calls of `backend`'s fused SGD update, of its device-order average, of the
 * update that also saves the parameter and its momentum for the undo, and of the finite check, on
 * 16 MiB buffers in kernel memory (where a device's gradients and the exchange's buffers live).
 *
 * @example
 * ```ts
 * import { getBackend, type CpuBackend } from "../mod.ts";
 * import { measureExchangeRates } from "./exchange_rates.ts";
 * const { sumBytesPerSecond } = measureExchangeRates(getBackend() as CpuBackend);
 * console.log(`${(sumBytesPerSecond / 1e9).toFixed(1)} GB/s per input`);
 * ```
 */
export function measureExchangeRates(backend: CpuBackend): ExchangeRates {
  const n = 4 << 20;
  // In kernel memory, freed at the end: the schedule bench measures on the backend it then trains on.
  const arrays = Array.from({ length: 6 }, () => backend.allocateShared(n));
  try {
    return measureOn(backend, arrays.map((a) => backend.wrap(a)), n);
  } finally {
    for (const a of arrays) backend.freeShared(a);
  }
}

/** {@link measureExchangeRates} on six buffers of `n` floats. */
function measureOn(backend: CpuBackend, buffers: Storage[], n: number): ExchangeRates {
  const bytes = 4 * n;
  const [p, g, h, out, copyP, copyH] = buffers;
  const median = (run: () => void) => {
    const times: number[] = [];
    for (let i = 0; i < 7; i++) {
      const t0 = performance.now();
      run();
      times.push((performance.now() - t0) / 1000);
    }
    return times.sort((a, b) => a - b)[3];
  };
  const step = { rate: 0.01, momentum: 0.9, decay: 5e-4 };
  const update = median(() => backend.sgdUpdate(p, g, h, step));
  const sum = median(() => backend.averageInOrder([g, h], out));
  const saving = median(() => backend.sgdUpdate(p, g, h, step, { param: copyP, history: copyH }));
  const check = median(() => backend.firstNonFinite(p));
  return {
    updateSecondsPerByte: update / bytes,
    sumBytesPerSecond: bytes / sum,
    undoSecondsPerByte: Math.max(0, saving - update) / bytes,
    checkSecondsPerByte: check / bytes,
  };
}
