/**
 * The plan a schedule compiles to: an ordered list of steps, each on a lane, that the runtime
 * executes per training iteration and the simulator prices.
 *
 * Lanes: every device has a compute lane and a communication lane. `forward` and `backward` run on
 * the compute lane; `reduce`, `update` and `broadcast` run on the communication lane, so that the
 * FC update can be applied while the conv gradients are still being computed (a compute lane is one
 * thread here and would otherwise have to finish the conv backward first). Steps on one lane run in
 * plan order; a step also waits for the steps it depends on (see {@link dependenciesOf}).
 *
 * Hybrid plans (`Plan.sharded`, "one weird trick", Krizhevsky 2014): the sharded groups are
 * model-parallel — each of N devices holds 1/N of every layer's output units and their optimizer
 * state — while the other groups stay data-parallel. A sharded group's activations travel inside
 * its compute steps (`forward` all-gathers the body output and each layer's output slices;
 * `backward g` reduce-scatters each layer's input gradient), its gradients never travel, and
 * `update g` updates each device's own slice right after `backward g`.
 *
 * @module
 */

/**
 * What a step does.
 *
 * @example
 * ```ts
 * import { laneOf, type StepKind } from "./plan.ts";
 * const kinds: StepKind[] = ["forward", "backward", "reduce", "update", "broadcast"];
 * console.log(kinds.map(laneOf));
 * ```
 */
export type StepKind = "forward" | "backward" | "reduce" | "update" | "broadcast";

/**
 * Where a step runs.
 *
 * @example
 * ```ts
 * import type { Lane } from "./plan.ts";
 * const lanes: Lane[] = ["compute", "comm"];
 * ```
 */
export type Lane = "compute" | "comm";

/**
 * One step of a plan, with the place in the schedule text it came from (1-based; 0 if built in code).
 *
 * @example
 * ```ts
 * import type { PlanStep } from "./plan.ts";
 * const step: PlanStep = { kind: "reduce", group: "fc", lane: "comm", line: 3, column: 1 };
 * ```
 */
export interface PlanStep {
  /** What it does. */
  readonly kind: StepKind;
  /** The parameter group it acts on (`undefined` for `forward`). */
  readonly group?: string;
  /** The lane it runs on. */
  readonly lane: Lane;
  /** Line in the schedule text. */
  readonly line: number;
  /** Column in the schedule text. */
  readonly column: number;
  /**
   * Extra steps (indices of earlier steps) this one waits for, beyond the lane order and the data
   * ({@link dependenciesOf} adds them). Parsed and built plans use it for program order: a
   * communication step waits for the compute steps written before it (see {@link withProgramOrder}).
   * Absent means no extra waits.
   */
  readonly waitsFor?: readonly number[];
}

/**
 * How gradients are combined: `master` gathers them on device 0, averages in device order, updates
 * there and broadcasts the new parameters; `allreduce` gives every device the average so each updates
 * its own copy (broadcast steps are then no-ops).
 *
 * @example
 * ```ts
 * import type { ReductionMode } from "./plan.ts";
 * const modes: ReductionMode[] = ["master", "allreduce"];
 * ```
 */
export type ReductionMode = "master" | "allreduce";

/**
 * The schedule text a plan was parsed from, so later errors can quote the offending line.
 *
 * @example
 * ```ts
 * import type { PlanSource } from "./plan.ts";
 * const source: PlanSource = { text: "forward; backward all", fileName: "my.sched" };
 * ```
 */
export interface PlanSource {
  /** The whole text. */
  readonly text: string;
  /** The file it came from, if any. */
  readonly fileName?: string;
}

/**
 * A validated, executable schedule.
 *
 * @example
 * ```ts
 * import type { Plan } from "./plan.ts";
 * const plan: Plan = {
 *   name: "forward-only",
 *   groups: ["fc"],
 *   steps: [{ kind: "forward", lane: "compute", line: 0, column: 0 }],
 * };
 * ```
 */
export interface Plan {
  /** Name for messages and traces, e.g. `overlap`. */
  readonly name: string;
  /** Groups in the order backward produces them (output side first). */
  readonly groups: readonly string[];
  /** The steps, in order. */
  readonly steps: readonly PlanStep[];
  /** The text the plan was parsed from; absent for plans built in code. */
  readonly source?: PlanSource;
  /**
   * The model-parallel groups (the `shard` statement), in backward order: always a prefix of
   * `groups` (the output side, e.g. the FC layers), leaving at least one group data-parallel (the
   * body). Each device holds 1/N of every sharded layer's output units and their optimizer state;
   * a sharded group is never reduced or broadcast, and its `update` follows its `backward`.
   * Absent or empty: a pure data-parallel plan.
   */
  readonly sharded?: readonly string[];
}

/**
 * Whether `group` is model-parallel in `plan` (listed in `plan.sharded`).
 *
 * @example
 * ```ts
 * import { isSharded, type Plan } from "./plan.ts";
 * const plan: Plan = { name: "h", groups: ["fc", "conv"], sharded: ["fc"], steps: [] };
 * console.log(isSharded(plan, "fc"), isSharded(plan, "conv")); // true false
 * ```
 */
export function isSharded(plan: Pick<Plan, "sharded">, group: string | undefined): boolean {
  return group !== undefined && (plan.sharded ?? []).includes(group);
}

/**
 * The lane a kind of step runs on.
 *
 * @example
 * ```ts
 * import { laneOf } from "./plan.ts";
 * console.log(laneOf("update")); // comm
 * ```
 */
export function laneOf(kind: StepKind): Lane {
  return kind === "forward" || kind === "backward" ? "compute" : "comm";
}

/**
 * A step as it reads in schedule text, e.g. `reduce fc` or `forward`.
 *
 * @example
 * ```ts
 * import { stepLabel } from "./plan.ts";
 * console.log(stepLabel({ kind: "update", group: "fc" })); // update fc
 * ```
 */
export function stepLabel(step: Pick<PlanStep, "kind" | "group">): string {
  return step.group === undefined ? step.kind : `${step.kind} ${step.group}`;
}

/**
 * Indices of the steps that `plan.steps[index]` waits for: the previous step on its lane, the
 * data it needs — a backward needs the forward, a reduce its group's backward, an update its reduce
 * (the update of a sharded group, which is never reduced, its backward), a broadcast its update —
 * and the step's own `waitsFor`.
 *
 * @example
 * ```ts
 * import { dependenciesOf } from "./plan.ts";
 * // dependenciesOf(plan, 3) → [1, 2]
 * ```
 */
export function dependenciesOf(plan: Plan, index: number): number[] {
  const step = plan.steps[index];
  const deps = new Set<number>();
  for (let i = index - 1; i >= 0; i--) {
    if (plan.steps[i].lane === step.lane) {
      deps.add(i);
      break;
    }
  }
  const needs: StepKind | undefined = {
    forward: undefined,
    backward: "forward",
    reduce: "backward",
    update: isSharded(plan, step.group) ? "backward" : "reduce",
    broadcast: "update",
  }[step.kind] as StepKind | undefined;
  if (needs) {
    for (let i = index - 1; i >= 0; i--) {
      const candidate = plan.steps[i];
      if (candidate.kind === needs && (needs === "forward" || candidate.group === step.group)) {
        deps.add(i);
        break;
      }
    }
  }
  for (const i of step.waitsFor ?? []) deps.add(i);
  return [...deps].sort((a, b) => a - b);
}

/**
 * `steps` with program order made explicit: each communication step also waits for the last compute
 * step written before it, unless it already waits for it through lane order or data. Compute steps
 * never wait for communication written before them (only for their data), which is what lets
 * `update fc; backward conv` run side by side.
 *
 * Without this, `forward; backward all; reduce all; …` would start `reduce fc` as soon as
 * `backward fc` ends, overlapping `backward conv`: the written order would be ignored and the
 * "sequential" baseline would secretly overlap. Parsed and built plans come through here.
 * `sharded` (the plan's `sharded` groups) makes a sharded group's update depend on its backward,
 * as {@link dependenciesOf} does for that plan.
 *
 * @example
 * ```ts
 * import { withProgramOrder } from "./plan.ts";
 * const at = { line: 0, column: 0 };
 * const steps = withProgramOrder([
 *   { kind: "forward", lane: "compute", ...at },
 *   { kind: "backward", group: "fc", lane: "compute", ...at },
 *   { kind: "backward", group: "conv", lane: "compute", ...at },
 *   { kind: "reduce", group: "fc", lane: "comm", ...at },
 * ]);
 * console.log(steps[3].waitsFor); // [2]: reduce fc waits for backward conv, written before it
 * ```
 */
export function withProgramOrder(steps: readonly PlanStep[], sharded: readonly string[] = []): PlanStep[] {
  const out: PlanStep[] = [];
  const ancestors: Set<number>[] = [];
  let lastCompute = -1;
  for (const [index, step] of steps.entries()) {
    out.push(step);
    let direct = dependenciesOf({ name: "", groups: [], steps: out, sharded }, index);
    const implied = direct.some((d) => d === lastCompute || ancestors[d].has(lastCompute));
    if (step.lane === "comm" && lastCompute >= 0 && !implied) {
      out[index] = { ...step, waitsFor: [...(step.waitsFor ?? []), lastCompute] };
      direct = [...direct, lastCompute];
    }
    const mine = new Set<number>();
    for (const d of direct) {
      mine.add(d);
      for (const a of ancestors[d]) mine.add(a);
    }
    ancestors.push(mine);
    if (step.lane === "compute") lastCompute = index;
  }
  return out;
}
