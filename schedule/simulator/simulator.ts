/**
 * A simulator that predicts one training iteration's timeline for a plan, from a measured (or
 * synthetic) per-layer profile and the costs of `costs.ts`, before any device runs it.
 *
 * Timeline (all devices are identical and hold the same share of the batch):
 * - `forward` takes Σ forwardSeconds; `backward g` takes Σ backwardSeconds of g's layers (plus a
 *   hybrid plan's activation collectives, on the compute lane); communication actions take what
 *   `costs.ts` prices them at.
 * - With `pipelineChunkBytes` (how the MPI runtime exchanges), a plan's adjacent `reduce g; update g`
 *   (`; broadcast g`) run as one pipeline ({@link pipelineSeconds}), and the update and broadcast
 *   actions take no time of their own; a `reduce g` that its update does not follow (`sequential`
 *   reduces every group first) is the same pipeline without the update and the way back, as the
 *   runtime runs it: each chunk is summed while the next arrives.
 * - An update adds its finite check and, where `plan/undo.ts` makes it undoable, its copy for the
 *   undo (`checkSecondsPerByte`, `undo` in `costs.ts`).
 * - With `commCpuShare`, compute runs at `1 − commCpuShare` of its speed while a reduce or broadcast
 *   is on the wire; as that moves what waits for the compute, the layout is repeated until it stands
 *   still.
 * - An action starts when every action it depends on (`dependenciesOf`) has finished on every device, and
 *   a collective (reduce, broadcast) occupies the communication lane of every device for its whole
 *   length, as a blocking collective call does.
 *
 * Hidden communication is defined as in the trace recorder: the length of time during which some
 * device communicates while some device computes; `commSeconds` is the length of time during which
 * some device communicates.
 *
 * @module
 */

import { type Interval, measure, overlapLength, union } from "../runtime/intervals.ts";
import { type ActionKind, dependenciesOf, isSharded, type Lane, type Plan } from "../plan/plan.ts";
import { groupTimes, type Profile } from "./profile.ts";
import { validatePlan } from "../plan/validate.ts";
import { undoableUpdates } from "../plan/undo.ts";
import { ValueError } from "../../engine/errors.ts";
import {
  checkCostOptions,
  commActionSeconds,
  type CostOptions,
  type HybridTraffic,
  hybridTraffic,
  pipelineSeconds,
} from "./costs.ts";

/**
 * Options of {@link simulate}.
 *
 * @example
 * ```ts
 * import type { SimulateOptions } from "./simulator.ts";
 * const options: SimulateOptions = { link: { bandwidthBytesPerSecond: 1.2e9, latencySeconds: 5e-5 }, devices: 2, mode: "allreduce" };
 * ```
 */
export type SimulateOptions = CostOptions;
/**
 * One action as it ran on one device's lane.
 *
 * @example
 * ```ts
 * import type { LaneEntry } from "./simulator.ts";
 * const length = (e: LaneEntry) => e.end - e.start;
 * ```
 */
export interface LaneEntry {
  /** Index into `plan.actions`. */
  readonly action: number;
  /** What it did. */
  readonly kind: ActionKind;
  /** The group, `undefined` for forward. */
  readonly group?: string;
  /** Seconds from the iteration's start. */
  readonly start: number;
  /** Seconds from the iteration's start. */
  readonly end: number;
}

/**
 * Predicted communication for one group.
 *
 * @example
 * ```ts
 * import type { GroupCommunication } from "./simulator.ts";
 * const exposed = (g: GroupCommunication) => g.commSeconds - g.hiddenCommSeconds;
 * ```
 */
export interface GroupCommunication {
  /** Length of time during which the group's actions on the communication lane run. */
  readonly commSeconds: number;
  /** The part of it during which some device computes. */
  readonly hiddenCommSeconds: number;
}

/**
 * The predicted timeline of one iteration.
 *
 * @example
 * ```ts
 * import type { Simulation } from "./simulator.ts";
 * const exposedSeconds = (s: Simulation) => s.commSeconds - s.hiddenCommSeconds;
 * ```
 */
export interface Simulation {
  /** The plan's name. */
  readonly plan: string;
  /** Seconds from the start of forward to the end of the last action. */
  readonly stepSeconds: number;
  /** Per device, the actions on each lane in start order. */
  readonly lanes: readonly { readonly compute: readonly LaneEntry[]; readonly comm: readonly LaneEntry[] }[];
  /** Length of time during which some device communicates (or updates, on the comm lane). */
  readonly commSeconds: number;
  /** The part of `commSeconds` during which some device computes. */
  readonly hiddenCommSeconds: number;
  /** `hiddenCommSeconds / commSeconds`, 0 when there is no communication. */
  readonly hiddenFraction: number;
  /** Length of time during which some device computes. */
  readonly computeSeconds: number;
  /** The same communication figures per group. */
  readonly groups: Readonly<Record<string, GroupCommunication>>;
  /**
   * For a hybrid plan, its activation traffic per step (bytes and seconds; the seconds are inside
   * `forward` and the sharded `backward` actions, so in `computeSeconds`, not `commSeconds`); absent
   * for data-parallel plans.
   */
  readonly hybrid?: HybridTraffic;
}
/**
 * Predicts one iteration of `plan` on `options.devices` devices (see the module notes for the
 * timeline, and `costs.ts` for what each action costs). The plan is validated first; its groups must all appear in the profile. A hybrid plan
 * also needs the profile's `outputBytes` (see {@link hybridTraffic}).
 *
 * @example
 * ```ts
 * import { overlapPlan, sequentialPlan } from "../plan/builtins.ts";
 * import { simulate } from "./simulator.ts";
 * const profile = {
 *   batchSize: 32,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 0.05, backwardSeconds: 0.1, parameterBytes: 1e6 },
 *     { name: "fc", group: "fc", forwardSeconds: 0.005, backwardSeconds: 0.01, parameterBytes: 1e8 },
 *   ],
 * };
 * const options = { link: { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 }, devices: 2, mode: "master" } as const;
 * const a = simulate(sequentialPlan(["fc", "conv"]), profile, options);
 * const b = simulate(overlapPlan(["fc", "conv"]), profile, options);
 * console.log(a.stepSeconds > b.stepSeconds, b.hiddenFraction);
 * ```
 */
export function simulate(plan: Plan, profile: Profile, options: SimulateOptions): Simulation {
  const o = checkCostOptions(options, "simulate");
  validatePlan(plan, { mode: o.mode });
  const totals = new Map(groupTimes(profile).map((t) => [t.group, t]));
  const missing = plan.groups.filter((g) => !totals.has(g));
  if (missing.length > 0) {
    throw new ValueError(
      "simulate",
      `plan ${plan.name} has groups ${missing.join(", ")} that the profile lacks; profile groups are ${
        [...totals.keys()].join(", ")
      }`,
    );
  }
  const extra = [...totals.keys()].filter((g) => !plan.groups.includes(g));
  if (extra.length > 0) {
    throw new ValueError("simulate", `profile groups ${extra.join(", ")} are not in plan ${plan.name}`);
  }

  const hybrid = (plan.sharded ?? []).length > 0 ? hybridTraffic(profile, plan.sharded!, o) : undefined;
  /** Seconds of activation collectives inside each compute action, by its label (`forward`, `backward fc`). */
  const collectives = new Map<string, number>();
  for (const t of hybrid?.transfers ?? []) {
    collectives.set(t.action, (collectives.get(t.action) ?? 0) + t.seconds);
  }
  const forwardSeconds = profile.layers.reduce((sum, l) => sum + l.forwardSeconds, 0) +
    (collectives.get("forward") ?? 0);
  const same = (index: number, kind: ActionKind, group: string | undefined) =>
    plan.actions[index]?.kind === kind && plan.actions[index]?.group === group;
  const undoable = undoableUpdates(plan, o.undo.rule);
  /** What an update adds per byte it updates: its finite check, and its copy where undoable. */
  const updateExtra = (index: number) =>
    o.checkSecondsPerByte + (undoable[index] ? o.undo.secondsPerByte : 0);
  /**
   * Lays the plan out once, its compute slowed where `wire` (the transfers of the layout before: a
   * transfer may run beside compute that comes earlier in plan order) is busy.
   */
  const layout = (wire: readonly Interval[]) => {
    const lanes = Array.from(
      { length: o.devices },
      () => ({ compute: [] as LaneEntry[], comm: [] as LaneEntry[] }),
    );
    const done: number[] = [];
    /** Actions that a pipeline before them already covers: they take no time of their own. */
    const fused = new Set<number>();
    plan.actions.forEach((action, index) => {
      const start = Math.max(0, ...dependenciesOf(plan, index).map((j) => done[j]));
      const group = action.group === undefined ? undefined : totals.get(action.group)!;
      // Under the MPI runtime's chunks every reduce is a pipeline; its update (and broadcast) join it
      // where they follow it.
      const pipelined = o.pipelineChunkBytes > 0 && o.devices > 1 && action.kind === "reduce";
      const update = pipelined && same(index + 1, "update", action.group);
      const broadcast = update && same(index + 2, "broadcast", action.group);
      if (update) fused.add(index + 1);
      if (broadcast) fused.add(index + 2);
      const seconds = fused.has(index)
        ? 0
        : pipelined
        ? pipelineSeconds(group!.parameterBytes, { update, broadcast }, o)
        : action.kind === "forward"
        ? forwardSeconds
        : action.kind === "backward"
        ? group!.backwardSeconds + (collectives.get(`backward ${action.group}`) ?? 0)
        : action.kind === "update" && isSharded(plan, action.group)
        ? hybrid!.updateBytes[action.group!] * (o.updateSecondsPerByte + updateExtra(index))
        : action.kind === "update"
        ? group!.parameterBytes * (o.updateSecondsPerByte + updateExtra(index))
        : commActionSeconds(action.kind, group!.parameterBytes, o);
      done[index] = action.lane === "compute"
        ? slowedEnd(start, seconds, wire, o.commCpuShare)
        : start + seconds;
      // In master mode only device 0 updates (a sharded group's slices: every device); everything else
      // runs (or waits in the collective) everywhere.
      const devices = action.kind === "update" && o.mode === "master" && !isSharded(plan, action.group)
        ? 1
        : o.devices;
      const lane: Lane = action.lane;
      for (let d = 0; d < devices; d++) {
        lanes[d][lane].push({
          action: index,
          kind: action.kind,
          group: action.group,
          start,
          end: done[index],
        });
      }
    });
    const transfers = union(lanes[0].comm.filter((e) => e.kind !== "update" && e.end > e.start));
    return { lanes, done, transfers };
  };
  // Slowing compute moves the transfers that wait for it, so the layout is repeated until it stands
  // still (the built-in plans: two or three layouts).
  let { lanes, done, transfers } = layout([]);
  for (let pass = 0; o.commCpuShare > 0 && pass < MAX_LAYOUTS; pass++) {
    const next = layout(transfers);
    const still = next.done.every((t, i) => Math.abs(t - done[i]) <= 1e-12);
    ({ lanes, done, transfers } = next);
    if (still) break;
  }

  const computeIntervals: Interval[] = lanes.flatMap((l) => l.compute);
  const commIntervals: Interval[] = lanes.flatMap((l) => l.comm);
  const commSeconds = measure(commIntervals);
  const hiddenCommSeconds = overlapLength(commIntervals, computeIntervals);
  const groups: Record<string, GroupCommunication> = {};
  for (const g of plan.groups) {
    const mine = lanes.flatMap((l) => l.comm.filter((e) => e.group === g));
    groups[g] = { commSeconds: measure(mine), hiddenCommSeconds: overlapLength(mine, computeIntervals) };
  }
  return {
    plan: plan.name,
    stepSeconds: Math.max(0, ...done),
    lanes,
    commSeconds,
    hiddenCommSeconds,
    hiddenFraction: commSeconds > 0 ? hiddenCommSeconds / commSeconds : 0,
    computeSeconds: measure(computeIntervals),
    groups,
    ...(hybrid === undefined ? {} : { hybrid }),
  };
}

/** Layouts after the first before {@link simulate} gives up waiting for a plan's layout to stand still. */
const MAX_LAYOUTS = 32;

/**
 * When compute of `seconds` (at full speed) that starts at `start` ends, running at `1 − share` of
 * its speed inside `wire` (disjoint, in order) and at full speed outside.
 */
function slowedEnd(start: number, seconds: number, wire: readonly Interval[], share: number): number {
  let t = start, left = seconds;
  for (const { start: a, end: b } of wire) {
    if (b <= t) continue;
    if (a > t) {
      if (left <= a - t) return t + left;
      left -= a - t;
      t = a;
    }
    const room = (b - t) * (1 - share);
    if (left <= room) return t + left / (1 - share);
    left -= room;
    t = b;
  }
  return t + left;
}
