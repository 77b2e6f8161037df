/**
 * Static checks on a plan before anything runs: every rule here is something that would otherwise
 * deadlock the runtime, read a gradient that does not exist yet, or let replicas silently diverge.
 * Errors quote the action's line and column (or its index for plans built in code).
 *
 * Rules, for groups `G` in backward order:
 * - `forward` exists and is the first action;
 * - no action appears twice;
 * - every group action names a known group, every action is on its kind's lane, and `waitsFor` names
 *   only earlier actions;
 * - `backward` segments follow the backward order (autograd produces the output side first);
 * - `reduce g` follows `backward g`, `update g` follows `reduce g`;
 * - every group is backwarded, reduced and updated;
 * - `master` mode: `broadcast g` follows `update g`, and every group is broadcast (otherwise devices
 *   other than 0 keep stale parameters and the replicas diverge);
 * - `allreduce` mode: every device updates its own copy, so broadcasts are allowed but are no-ops;
 *   each one is reported as a note rather than an error.
 * - sharded (model-parallel) groups, `Plan.sharded`: known, each once, a prefix of `G` (the output
 *   side), leaving at least one group unsharded (the data-parallel body; see {@link shardingProblem});
 *   a sharded group is never reduced or broadcast (its gradients never travel; each device keeps
 *   its own slice), in either mode, and `update g` follows `backward g`.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { ScheduleError } from "./errors.ts";
import { type ActionKind, actionLabel, laneOf, type Plan, type ReductionMode } from "./plan.ts";

/**
 * What is wrong with a `shard` declaration, from {@link shardingProblem}.
 *
 * @example
 * ```ts
 * import { type ShardingProblem, shardingProblem } from "./validate.ts";
 * const problem: ShardingProblem | undefined = shardingProblem(["fc", "conv"], ["conv"]);
 * console.log(problem?.at); // 0: the first sharded name is the culprit
 * ```
 */
export interface ShardingProblem {
  /** What is wrong, e.g. `conv is sharded but fc, on its output side, is not: …`. */
  readonly reason: string;
  /** Index into the sharded list of the offending name; absent when the declaration as a whole is. */
  readonly at?: number;
}

/**
 * Checks a list of sharded (model-parallel) groups against the plan's `groups` (backward order):
 * every name known and listed once, the list a prefix of `groups` in any order (the output side:
 * the body's output is all-gathered into the first sharded layer, so no data-parallel group can sit
 * between two sharded ones), and at least one group left unsharded. Returns the first problem, or
 * `undefined` when the declaration is fine (an empty list always is).
 *
 * @example
 * ```ts
 * import { shardingProblem } from "./validate.ts";
 * console.log(shardingProblem(["fc8", "fc7", "conv"], ["fc7", "fc8"])); // undefined
 * console.log(shardingProblem(["fc8", "fc7", "conv"], ["fc7"])?.reason);
 * // fc7 is sharded but fc8, on its output side, is not: sharded groups must be a prefix of the
 * // groups in backward order (fc8, fc7, conv)
 * console.log(shardingProblem(["fc", "conv"], ["fc", "conv"])?.reason);
 * ```
 */
export function shardingProblem(
  groups: readonly string[],
  sharded: readonly string[],
): ShardingProblem | undefined {
  for (const [at, group] of sharded.entries()) {
    if (!groups.includes(group)) {
      return { reason: `unknown group ${JSON.stringify(group)}; groups are ${groups.join(", ")}`, at };
    }
    if (sharded.indexOf(group) !== at) return { reason: `group ${group} is sharded twice`, at };
  }
  for (const [at, group] of sharded.entries()) {
    const gap = groups.slice(0, groups.indexOf(group)).find((g) => !sharded.includes(g));
    if (gap !== undefined) {
      return {
        reason:
          `${group} is sharded but ${gap}, on its output side, is not: sharded groups must be a prefix ` +
          `of the groups in backward order (${groups.join(", ")})`,
        at,
      };
    }
  }
  if (sharded.length > 0 && groups.every((g) => sharded.includes(g))) {
    return {
      reason: `every group is sharded; at least one group must stay unsharded (data-parallel): the body ` +
        `whose output is all-gathered into the sharded layers`,
    };
  }
  return undefined;
}

/**
 * Options of {@link validatePlan}.
 *
 * @example
 * ```ts
 * import type { ValidateOptions } from "./validate.ts";
 * const options: ValidateOptions = { mode: "allreduce" };
 * ```
 */
export interface ValidateOptions {
  /** How gradients are combined; decides whether broadcasts are required or no-ops. */
  readonly mode: ReductionMode;
}

/**
 * What validation found: `errors` in plan order (empty when the plan is valid) and advisory `notes`.
 *
 * @example
 * ```ts
 * import { sequentialPlan } from "./builtins.ts";
 * import { checkPlan, type PlanReport } from "./validate.ts";
 * const report: PlanReport = checkPlan(sequentialPlan(["fc", "conv"]), { mode: "master" });
 * console.log(report.errors.length); // 0
 * ```
 */
export interface PlanReport {
  /** Problems that stop the plan from running, earliest action first. */
  readonly errors: readonly ScheduleError[];
  /** Things worth knowing that do not stop it, e.g. no-op broadcasts in `allreduce` mode. */
  readonly notes: readonly string[];
}

/**
 * Every problem in `plan` for `options.mode`, without throwing.
 *
 * @example
 * ```ts
 * import { parseSchedule } from "./dsl.ts";
 * import { checkPlan } from "./validate.ts";
 * const plan = parseSchedule("forward\nupdate fc", { groups: ["fc"] });
 * for (const e of checkPlan(plan, { mode: "master" }).errors) console.log(e.message);
 * ```
 */
export function checkPlan(plan: Plan, options: ValidateOptions): PlanReport {
  if (options.mode !== "master" && options.mode !== "allreduce") {
    throw new ValueError(
      "validatePlan",
      `mode must be "master" or "allreduce", got ${JSON.stringify(options.mode)}`,
    );
  }
  const master = options.mode === "master";
  const problems: { index: number; error: ScheduleError }[] = [];
  const notes: string[] = [];
  const lines = plan.source?.text.split("\n");
  const label = plan.source?.fileName ?? plan.name;
  const actions = plan.actions;

  const where = (index: number) => {
    const action = actions[index];
    return action.line > 0 ? `line ${action.line}, column ${action.column}` : `action ${index}`;
  };
  const report = (index: number | undefined, reason: string) => {
    const action = index === undefined ? undefined : actions[index];
    const located = action !== undefined && action.line > 0;
    const error = new ScheduleError(reason, {
      schedule: label,
      line: located ? action.line : 0,
      column: located ? action.column : 0,
      sourceLine: located ? lines?.[action.line - 1]?.replace(/\r$/, "") : undefined,
      actionIndex: index,
    });
    problems.push({ index: index ?? -1, error });
  };

  const groups = plan.groups;
  if (groups.length === 0) report(undefined, "the plan has no groups");
  const duplicateGroup = groups.find((g, i) => groups.indexOf(g) !== i);
  if (duplicateGroup !== undefined) {
    report(undefined, `group ${duplicateGroup} is listed twice in the plan's groups`);
  }
  const sharded = new Set(plan.sharded ?? []);
  const sharding = shardingProblem(groups, plan.sharded ?? []);
  if (sharding !== undefined) report(undefined, `shard: ${sharding.reason}`);
  /** Whether the action at `index` came from a statement naming `all`, e.g. `reduce all`. */
  const fromAll = (index: number) => {
    const action = actions[index];
    const text = action.line > 0 ? lines?.[action.line - 1]?.slice(action.column - 1) : undefined;
    return text !== undefined && /^[A-Za-z]+[ \t]+all(?![A-Za-z0-9_.-])/.test(text);
  };

  const forwardAt = actions.findIndex((s) => s.kind === "forward");
  if (forwardAt < 0) {
    report(actions.length > 0 ? 0 : undefined, "forward is missing; a plan starts with forward");
  } else if (forwardAt > 0) {
    report(forwardAt, `forward must be the first action, but ${actionLabel(actions[0])} comes before it`);
  }

  const firstSeen = new Map<string, number>();
  const done: Record<Exclude<ActionKind, "forward">, Map<string, number>> = {
    backward: new Map(),
    reduce: new Map(),
    update: new Map(),
    broadcast: new Map(),
  };
  const needs = { reduce: "backward", update: "reduce", broadcast: "update" } as const;

  actions.forEach((action, index) => {
    const name = actionLabel(action);
    if (action.lane !== laneOf(action.kind)) {
      report(index, `${name} must run on the ${laneOf(action.kind)} lane, not ${action.lane}`);
    }
    const badWait = (action.waitsFor ?? []).find((j) => !Number.isInteger(j) || j < 0 || j >= index);
    if (badWait !== undefined) {
      report(index, `${name} waits for action ${badWait}, which is not an earlier action`);
    }
    const first = firstSeen.get(name);
    if (first !== undefined) {
      report(index, `${name} is repeated (first at ${where(first)})`);
      return;
    }
    firstSeen.set(name, index);
    if (action.kind === "forward") {
      if (action.group !== undefined) report(index, "forward takes no group");
      return;
    }
    const group = action.group;
    if (group === undefined) {
      report(index, `${action.kind} needs a group`);
      return;
    }
    if (!groups.includes(group)) {
      report(index, `unknown group ${JSON.stringify(group)}; groups are ${groups.join(", ")}`);
      return;
    }
    done[action.kind].set(group, index);
    if (action.kind === "backward") {
      const missing = groups.slice(0, groups.indexOf(group)).find((g) => !done.backward.has(g));
      if (missing !== undefined) {
        report(
          index,
          `backward ${group} comes before backward ${missing}; autograd produces groups in the order ${
            groups.join(", ")
          } (output side first)`,
        );
      }
      return;
    }
    if (sharded.has(group) && (action.kind === "reduce" || action.kind === "broadcast")) {
      const why = action.kind === "reduce"
        ? "its gradients never travel"
        : "each device keeps and updates its own slice, so there is nothing to broadcast";
      const unsharded = groups.filter((g) => !sharded.has(g));
      const instead = fromAll(index)
        ? ` (name the unsharded groups instead of \`all\`: ${action.kind} ${unsharded.join(", ")})`
        : "";
      report(index, `${group} is sharded (model-parallel): ${why}; remove \`${name}\`${instead}`);
      return;
    }
    if (action.kind === "broadcast" && !master) {
      notes.push(
        `broadcast ${group} (${
          where(index)
        }) is a no-op in allreduce mode: every device updates its own copy`,
      );
      return;
    }
    // A sharded group is never reduced: its update needs only its backward.
    const need = action.kind === "update" && sharded.has(group) ? "backward" : needs[action.kind];
    if (!done[need].has(group)) report(index, `${name} comes before ${need} ${group}`);
  });

  // A stage is "never done" only when no later stage of the group exists either; otherwise the later
  // stage has already been reported as coming too early, and one mistake should give one error.
  const dataParallelStages: readonly Exclude<ActionKind, "forward">[] = master
    ? ["backward", "reduce", "update", "broadcast"]
    : ["backward", "reduce", "update"];
  const verbs = { backward: "backwarded", reduce: "reduced", update: "updated", broadcast: "broadcast" };
  const last = actions.length > 0 ? actions.length - 1 : undefined;
  for (const group of groups) {
    const stages = sharded.has(group) ? ["backward", "update"] as const : dataParallelStages;
    for (let s = 0; s < stages.length; s++) {
      if (stages.slice(s).some((stage) => done[stage].has(group))) continue;
      const previous = s > 0 ? done[stages[s - 1]].get(group) : undefined;
      const after = s > 0 ? ` after its ${stages[s - 1]}` : "";
      const why = stages[s] === "broadcast"
        ? ": in master mode only device 0 has the new parameters, so the replicas would diverge"
        : "";
      report(previous ?? last, `group ${group} is never ${verbs[stages[s]]}${after}${why}`);
      break;
    }
  }

  const backwards = actions.map((s, i) => (s.kind === "backward" ? i : -1)).filter((i) => i >= 0);
  // A sharded group's update is communication-lane work too (it is not reduced, so it is the first).
  const firstReduce = actions.findIndex((s) =>
    s.kind === "reduce" || (s.kind === "update" && s.group !== undefined && sharded.has(s.group))
  );
  if (groups.length > 1 && firstReduce > backwards[backwards.length - 1]) {
    notes.push(
      sharded.size === 0
        ? `every reduce comes after the last backward, so no communication overlaps computation (a sequential schedule)`
        : `every reduce and sharded update comes after the last backward, so no communication or update overlaps computation`,
    );
  }

  problems.sort((a, b) => a.index - b.index);
  return { errors: problems.map((p) => p.error), notes };
}

/**
 * Validates `plan` for `options.mode`: throws the earliest {@link ScheduleError}, else returns the
 * advisory notes.
 *
 * @example
 * ```ts
 * import { parseSchedule } from "./dsl.ts";
 * import { validatePlan } from "./validate.ts";
 * const plan = parseSchedule("forward; backward all; reduce all; update all; broadcast all", {
 *   groups: ["fc", "conv"],
 * });
 * const { notes } = validatePlan(plan, { mode: "allreduce" });
 * console.log(notes.length); // 3: two no-op broadcasts and the "sequential" remark
 * ```
 */
export function validatePlan(plan: Plan, options: ValidateOptions): { readonly notes: readonly string[] } {
  const { errors, notes } = checkPlan(plan, options);
  if (errors.length > 0) throw errors[0];
  return { notes };
}
