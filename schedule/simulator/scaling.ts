/**
 * The AlexNet scaling table: the simulator's step time for the standard schedules on links and device
 * counts we do not have, from one measured profile (`bench/ALEXNET_SCALING.md`).
 *
 * @module
 */

import { overlapPlan, sequentialPlan } from "../plan/builtins.ts";
import type { ReductionMode } from "../plan/plan.ts";
import { groupTimes, type Profile } from "./profile.ts";
import { type Link, STANDARD_LINKS } from "../runtime/exchange/link.ts";
import type { Topology } from "./costs.ts";
import { simulate } from "./simulator.ts";

/**
 * One row of {@link alexnetScalingTable}.
 *
 * @example
 * ```ts
 * import type { ScalingRow } from "./scaling.ts";
 * const label = (r: ScalingRow) => `${r.link} ×${r.devices} ${r.mode}: ${r.overlapSpeedup.toFixed(2)}×`;
 * ```
 */
export interface ScalingRow {
  /** Link name. */
  readonly link: string;
  /** Number of devices. */
  readonly devices: number;
  /** Reduction mode. */
  readonly mode: ReductionMode;
  /** Predicted iteration seconds with the sequential schedule. */
  readonly sequentialSeconds: number;
  /** Predicted iteration seconds with the overlap schedule. */
  readonly overlapSeconds: number;
  /** `sequentialSeconds / overlapSeconds`. */
  readonly overlapSpeedup: number;
  /** Share of communication the overlap schedule hides. */
  readonly hiddenFraction: number;
  /** Images per second with overlap: devices × batch / overlapSeconds. */
  readonly imagesPerSecond: number;
  /** Overlap throughput over N × the best one-device throughput (≤ 1 in this model). */
  readonly scalingEfficiency: number;
}

/**
 * Options of {@link alexnetScalingTable}.
 *
 * @example
 * ```ts
 * import type { ScalingTableOptions } from "./scaling.ts";
 * const options: ScalingTableOptions = { devices: [2, 4, 8], modes: ["allreduce"], topology: "star" };
 * ```
 */
export interface ScalingTableOptions {
  /** Links to price; default {@link STANDARD_LINKS}. */
  readonly links?: readonly Required<Link>[];
  /** Device counts; default 2…8. */
  readonly devices?: readonly number[];
  /** Modes; default both. */
  readonly modes?: readonly ReductionMode[];
  /** Master-mode topology; default `shared` (the master's one slot or NIC carries every transfer). */
  readonly topology?: Topology;
  /** See {@link CostOptions}. */
  readonly memoryBandwidthBytesPerSecond?: number;
  /** See {@link CostOptions}. */
  readonly updateSecondsPerByte?: number;
}

/**
 * The rows and a Markdown rendering of them.
 *
 * @example
 * ```ts
 * import type { ScalingTable } from "./scaling.ts";
 * const print = (t: ScalingTable) => console.log(t.markdown);
 * ```
 */
export interface ScalingTable {
  /** One row per link × mode × device count. */
  readonly rows: readonly ScalingRow[];
  /** A Markdown table of the rows, for reports. */
  readonly markdown: string;
}

/**
 * Predicted sequential vs overlap iteration times for an AlexNet profile (per-device batch, weak
 * scaling) on 2–8 devices over the {@link STANDARD_LINKS}, in both reduction modes. The schedules
 * use the profile's own groups (typically fc then conv).
 *
 * @example
 * ```ts
 * import { alexnetScalingTable } from "./scaling.ts";
 * const profile = {
 *   batchSize: 128,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 0.03, backwardSeconds: 0.06, parameterBytes: 9_336_320 },
 *     { name: "fc", group: "fc", forwardSeconds: 0.003, backwardSeconds: 0.006, parameterBytes: 234_524_576 },
 *   ],
 * };
 * console.log(alexnetScalingTable(profile, { devices: [2, 4] }).markdown);
 * ```
 */
export function alexnetScalingTable(profile: Profile, options: ScalingTableOptions = {}): ScalingTable {
  const groups = groupTimes(profile).map((t) => t.group);
  const plans = { sequential: sequentialPlan(groups), overlap: overlapPlan(groups) };
  const costs = {
    topology: options.topology,
    memoryBandwidthBytesPerSecond: options.memoryBandwidthBytesPerSecond,
    updateSecondsPerByte: options.updateSecondsPerByte,
  };
  const rows: ScalingRow[] = [];
  for (const link of options.links ?? STANDARD_LINKS) {
    for (const mode of options.modes ?? ["master", "allreduce"] as const) {
      // The best one device can do: with overlap its updates hide under the conv backward too.
      const one = { ...costs, link, mode, devices: 1 };
      const single = Math.min(
        simulate(plans.sequential, profile, one).stepSeconds,
        simulate(plans.overlap, profile, one).stepSeconds,
      );
      for (const devices of options.devices ?? [2, 3, 4, 5, 6, 7, 8]) {
        const at = { ...costs, link, mode, devices };
        const seq = simulate(plans.sequential, profile, at);
        const ov = simulate(plans.overlap, profile, at);
        rows.push({
          link: link.label,
          devices,
          mode,
          sequentialSeconds: seq.stepSeconds,
          overlapSeconds: ov.stepSeconds,
          overlapSpeedup: seq.stepSeconds / ov.stepSeconds,
          hiddenFraction: ov.hiddenFraction,
          imagesPerSecond: (devices * profile.batchSize) / ov.stepSeconds,
          scalingEfficiency: single / ov.stepSeconds,
        });
      }
    }
  }
  const ms = (s: number) => (s * 1e3).toFixed(1);
  const header =
    "| link | devices | mode | sequential ms | overlap ms | speed-up | hidden | images/s | efficiency |\n" +
    "|---|---:|---|---:|---:|---:|---:|---:|---:|\n";
  const body = rows.map((r) =>
    `| ${r.link} | ${r.devices} | ${r.mode} | ${ms(r.sequentialSeconds)} | ${ms(r.overlapSeconds)} | ${
      r.overlapSpeedup.toFixed(2)
    }× | ${(100 * r.hiddenFraction).toFixed(0)}% | ${r.imagesPerSecond.toFixed(0)} | ${
      (100 * r.scalingEfficiency).toFixed(0)
    }% |\n`
  ).join("");
  return { rows, markdown: header + body };
}
