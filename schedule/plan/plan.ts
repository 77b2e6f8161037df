/**
 * The plan a schedule compiles to: an ordered list of actions, each on a lane, that the runtime
 * executes per training iteration and the simulator prices.
 *
 * Lanes: every device has a compute lane and a communication lane. `forward` and `backward` run on
 * the compute lane; `reduce`, `update` and `broadcast` run on the communication lane, so that the
 * FC update can be applied while the conv gradients are still being computed (a compute lane is one
 * thread here and would otherwise have to finish the conv backward first). Actions on one lane run in
 * plan order; an action also waits for the actions it depends on (see {@link dependenciesOf}).
 *
 * Hybrid plans (`Plan.sharded`, "one weird trick", Krizhevsky 2014): the sharded groups are
 * model-parallel — each of N devices holds 1/N of every layer's output units and their optimizer
 * state — while the other groups stay data-parallel. A sharded group's activations travel inside
 * its compute actions (`forward` all-gathers the body output and each layer's output slices;
 * `backward g` reduce-scatters each layer's input gradient), its gradients never travel, and
 * `update g` updates each device's own slice right after `backward g`.
 *
 * @module
 */

/**
 * What an action does.
 *
 * @example
 * ```ts
 * import { laneOf, type ActionKind } from "./plan.ts";
 * const kinds: ActionKind[] = ["forward", "backward", "reduce", "update", "broadcast"];
 * console.log(kinds.map(laneOf));
 * ```
 */
export type ActionKind = "forward" | "backward" | "reduce" | "update" | "broadcast";

/**
 * Where an action runs.
 *
 * @example
 * ```ts
 * import type { Lane } from "./plan.ts";
 * const lanes: Lane[] = ["compute", "comm"];
 * ```
 */
export type Lane = "compute" | "comm";

/**
 * One action of a plan, with the place in the schedule text it came from (1-based; 0 if built in code).
 *
 * @example
 * ```ts
 * import type { PlanAction } from "./plan.ts";
 * const action: PlanAction = { kind: "reduce", group: "fc", lane: "comm", line: 3, column: 1 };
 * ```
 */
export interface PlanAction {
  /** What it does. */
  readonly kind: ActionKind;
  /** The parameter group it acts on (`undefined` for `forward`). */
  readonly group?: string;
  /** The lane it runs on. */
  readonly lane: Lane;
  /** Line in the schedule text. */
  readonly line: number;
  /** Column in the schedule text. */
  readonly column: number;
  /**
   * Extra actions (indices of earlier actions) this one waits for, beyond the lane order and the data
   * ({@link dependenciesOf} adds them). Parsed and built plans use it for program order: a
   * communication action waits for the compute actions written before it (see {@link withProgramOrder}).
   * Absent means no extra waits.
   */
  readonly waitsFor?: readonly number[];
}

/**
 * How gradients are combined: `master` gathers them on device 0, averages in device order, updates
 * there and broadcasts the new parameters; `allreduce` gives every device the average so each updates
 * its own copy (broadcast actions are then no-ops).
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
 *   actions: [{ kind: "forward", lane: "compute", line: 0, column: 0 }],
 * };
 * ```
 */
export interface Plan {
  /** Name for messages and traces, e.g. `overlap`. */
  readonly name: string;
  /** Groups in the order backward produces them (output side first). */
  readonly groups: readonly string[];
  /** The actions, in order. */
  readonly actions: readonly PlanAction[];
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
 * const plan: Plan = { name: "h", groups: ["fc", "conv"], sharded: ["fc"], actions: [] };
 * console.log(isSharded(plan, "fc"), isSharded(plan, "conv")); // true false
 * ```
 */
export function isSharded(plan: Pick<Plan, "sharded">, group: string | undefined): boolean {
  return group !== undefined && (plan.sharded ?? []).includes(group);
}

/**
 * The lane a kind of action runs on.
 *
 * @example
 * ```ts
 * import { laneOf } from "./plan.ts";
 * console.log(laneOf("update")); // comm
 * ```
 */
export function laneOf(kind: ActionKind): Lane {
  return kind === "forward" || kind === "backward" ? "compute" : "comm";
}

/**
 * An action as it reads in schedule text, e.g. `reduce fc` or `forward`.
 *
 * @example
 * ```ts
 * import { actionLabel } from "./plan.ts";
 * console.log(actionLabel({ kind: "update", group: "fc" })); // update fc
 * ```
 */
export function actionLabel(action: Pick<PlanAction, "kind" | "group">): string {
  return action.group === undefined ? action.kind : `${action.kind} ${action.group}`;
}

/**
 * Indices of the actions that `plan.actions[index]` waits for: the previous action on its lane, the
 * data it needs — a backward needs the forward, a reduce its group's backward, an update its reduce
 * (the update of a sharded group, which is never reduced, its backward), a broadcast its update —
 * and the action's own `waitsFor`.
 *
 * @example
 * ```ts
 * import { dependenciesOf } from "./plan.ts";
 * // dependenciesOf(plan, 3) → [1, 2]
 * ```
 */
export function dependenciesOf(plan: Plan, index: number): number[] {
  const action = plan.actions[index];
  const deps = new Set<number>();
  for (let i = index - 1; i >= 0; i--) {
    if (plan.actions[i].lane === action.lane) {
      deps.add(i);
      break;
    }
  }
  const needs: ActionKind | undefined = {
    forward: undefined,
    backward: "forward",
    reduce: "backward",
    update: isSharded(plan, action.group) ? "backward" : "reduce",
    broadcast: "update",
  }[action.kind] as ActionKind | undefined;
  if (needs) {
    for (let i = index - 1; i >= 0; i--) {
      const candidate = plan.actions[i];
      if (candidate.kind === needs && (needs === "forward" || candidate.group === action.group)) {
        deps.add(i);
        break;
      }
    }
  }
  for (const i of action.waitsFor ?? []) deps.add(i);
  return [...deps].sort((a, b) => a - b);
}

/**
 * `actions` with program order made explicit: each communication action also waits for the last compute
 * action written before it, unless it already waits for it through lane order or data. Compute actions
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
 * const actions = withProgramOrder([
 *   { kind: "forward", lane: "compute", ...at },
 *   { kind: "backward", group: "fc", lane: "compute", ...at },
 *   { kind: "backward", group: "conv", lane: "compute", ...at },
 *   { kind: "reduce", group: "fc", lane: "comm", ...at },
 * ]);
 * console.log(actions[3].waitsFor); // [2]: reduce fc waits for backward conv, written before it
 * ```
 */
export function withProgramOrder(
  actions: readonly PlanAction[],
  sharded: readonly string[] = [],
): PlanAction[] {
  const out: PlanAction[] = [];
  const ancestors: Set<number>[] = [];
  let lastCompute = -1;
  for (const [index, action] of actions.entries()) {
    out.push(action);
    let direct = dependenciesOf({ name: "", groups: [], actions: out, sharded }, index);
    const implied = direct.some((d) => d === lastCompute || ancestors[d].has(lastCompute));
    if (action.lane === "comm" && lastCompute >= 0 && !implied) {
      out[index] = { ...action, waitsFor: [...(action.waitsFor ?? []), lastCompute] };
      direct = [...direct, lastCompute];
    }
    const mine = new Set<number>();
    for (const d of direct) {
      mine.add(d);
      for (const a of ancestors[d]) mine.add(a);
    }
    ancestors.push(mine);
    if (action.lane === "compute") lastCompute = index;
  }
  return out;
}
