/**
 * The cost model: per-layer profiles (measured on this machine or written by hand), a simulator that
 * predicts one iteration's timeline for a plan over a link, AlexNet-style scaling tables, and
 * {@link autoSchedule}, which judges a network's conv/FC split and picks the plan to run.
 *
 * @example
 * ```ts
 * import { overlapPlan, sequentialPlan } from "../mod.ts";
 * import { simulate } from "./mod.ts";
 *
 * const profile = {
 *   batchSize: 32,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 0.05, backwardSeconds: 0.1, parameterBytes: 1e6 },
 *     { name: "fc", group: "fc", forwardSeconds: 0.005, backwardSeconds: 0.01, parameterBytes: 1e8 },
 *   ],
 * };
 * const options = { link: { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 }, devices: 2, mode: "master" } as const;
 * const before = simulate(sequentialPlan(["fc", "conv"]), profile, options).stepSeconds;
 * const after = simulate(overlapPlan(["fc", "conv"]), profile, options).stepSeconds;
 * console.log(`overlap saves ${((1 - after / before) * 100).toFixed(0)}%`);
 * ```
 *
 * @module
 */

export {
  accumulatedProfile,
  calibrateProfile,
  checkProfile,
  type GroupTime,
  groupTimes,
  type LayerProfile,
  type Profile,
  type ProfileTargets,
  regroupProfile,
} from "./profile.ts";
export {
  type ActivationTransfer,
  type CostOptions,
  DEFAULT_MEMORY_BANDWIDTH,
  type HybridTraffic,
  hybridTraffic,
  type Link,
  type Topology,
} from "./costs.ts";
export {
  type GroupCommunication,
  type LaneEntry,
  simulate,
  type SimulateOptions,
  type Simulation,
} from "./simulator.ts";
export {
  alexnetScalingTable,
  type ScalingRow,
  type ScalingTable,
  type ScalingTableOptions,
} from "./scaling.ts";
export {
  type AlexnetThresholds,
  type BucketSplit,
  DEFAULT_LINK,
  DEFAULT_THRESHOLDS,
  type HybridCandidate,
  judgeNetwork,
  type JudgeOptions,
  type NetworkJudgement,
  type NetworkSplit,
} from "./judge.ts";
export { type AutoOptions, type AutoPlan, autoSchedule, hybridCandidate } from "./auto.ts";
export { type MeasureOptions, measureProfile } from "./measure.ts";
export { STANDARD_LINKS } from "../runtime/exchange/link.ts";
