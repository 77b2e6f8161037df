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
 * @module
 */

/** What a step does. */
export type StepKind = "forward" | "backward" | "reduce" | "update" | "broadcast";

/** Where a step runs. */
export type Lane = "compute" | "comm";

/** One step of a plan, with the place in the schedule text it came from (1-based; 0 if built in code). */
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
}

/**
 * How gradients are combined: `master` gathers them on device 0, averages in device order, updates
 * there and broadcasts the new parameters; `allreduce` gives every device the average so each updates
 * its own copy (broadcast steps are then no-ops).
 */
export type ReductionMode = "master" | "allreduce";

/** The schedule text a plan was parsed from, so later errors can quote the offending line. */
export interface PlanSource {
  /** The whole text. */
  readonly text: string;
  /** The file it came from, if any. */
  readonly fileName?: string;
}

/** A validated, executable schedule. */
export interface Plan {
  /** Name for messages and traces, e.g. `overlap`. */
  readonly name: string;
  /** Groups in the order backward produces them (output side first). */
  readonly groups: readonly string[];
  /** The steps, in order. */
  readonly steps: readonly PlanStep[];
  /** The text the plan was parsed from; absent for plans built in code. */
  readonly source?: PlanSource;
}

/** The lane a kind of step runs on. */
export function laneOf(kind: StepKind): Lane {
  return kind === "forward" || kind === "backward" ? "compute" : "comm";
}

/**
 * A step as it reads in schedule text, e.g. `reduce fc` or `forward`.
 *
 * @example
 * ```ts
 * import { stepLabel } from "./plan.ts";
 * console.log(stepLabel({ kind: "update", group: "fc", lane: "comm", line: 0, column: 0 })); // update fc
 * ```
 */
export function stepLabel(step: Pick<PlanStep, "kind" | "group">): string {
  return step.group === undefined ? step.kind : `${step.kind} ${step.group}`;
}

/**
 * Indices of the steps that `plan.steps[index]` waits for: the previous step on its lane, and the
 * data it needs — a backward needs the forward, a reduce its group's backward, an update its reduce,
 * a broadcast its update.
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
    update: "reduce",
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
  return [...deps].sort((a, b) => a - b);
}
