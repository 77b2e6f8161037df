/**
 * Static checks on a plan before anything runs: every rule here is something that would otherwise
 * deadlock the runtime, read a gradient that does not exist yet, or let replicas silently diverge.
 * Errors quote the step's line and column (or its index for plans built in code).
 *
 * Rules, for groups `G` in backward order:
 * - `forward` exists and is the first step;
 * - no step appears twice;
 * - every group step names a known group, every step is on its kind's lane, and `waitsFor` names
 *   only earlier steps;
 * - `backward` segments follow the backward order (autograd produces the output side first);
 * - `reduce g` follows `backward g`, `update g` follows `reduce g`;
 * - every group is backwarded, reduced and updated;
 * - `master` mode: `broadcast g` follows `update g`, and every group is broadcast (otherwise devices
 *   other than 0 keep stale parameters and the replicas diverge);
 * - `allreduce` mode: every device updates its own copy, so broadcasts are allowed but are no-ops;
 *   each one is reported as a note rather than an error.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { ScheduleError } from "./errors.ts";
import { laneOf, type Plan, type ReductionMode, type StepKind, stepLabel } from "./plan.ts";

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
 * import { sequential } from "./builtins.ts";
 * import { checkPlan, type PlanReport } from "./validate.ts";
 * const report: PlanReport = checkPlan(sequential(["fc", "conv"]), { mode: "master" });
 * console.log(report.errors.length); // 0
 * ```
 */
export interface PlanReport {
  /** Problems that stop the plan from running, earliest step first. */
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
  const steps = plan.steps;

  const where = (index: number) => {
    const step = steps[index];
    return step.line > 0 ? `line ${step.line}, column ${step.column}` : `step ${index}`;
  };
  const report = (index: number | undefined, reason: string) => {
    const step = index === undefined ? undefined : steps[index];
    const located = step !== undefined && step.line > 0;
    const error = new ScheduleError(reason, {
      schedule: label,
      line: located ? step.line : 0,
      column: located ? step.column : 0,
      sourceLine: located ? lines?.[step.line - 1]?.replace(/\r$/, "") : undefined,
      stepIndex: index,
    });
    problems.push({ index: index ?? -1, error });
  };

  const groups = plan.groups;
  if (groups.length === 0) report(undefined, "the plan has no groups");
  const duplicateGroup = groups.find((g, i) => groups.indexOf(g) !== i);
  if (duplicateGroup !== undefined) {
    report(undefined, `group ${duplicateGroup} is listed twice in the plan's groups`);
  }

  const forwardAt = steps.findIndex((s) => s.kind === "forward");
  if (forwardAt < 0) {
    report(steps.length > 0 ? 0 : undefined, "forward is missing; a plan starts with forward");
  } else if (forwardAt > 0) {
    report(forwardAt, `forward must be the first step, but ${stepLabel(steps[0])} comes before it`);
  }

  const firstSeen = new Map<string, number>();
  const done: Record<Exclude<StepKind, "forward">, Map<string, number>> = {
    backward: new Map(),
    reduce: new Map(),
    update: new Map(),
    broadcast: new Map(),
  };
  const needs = { reduce: "backward", update: "reduce", broadcast: "update" } as const;

  steps.forEach((step, index) => {
    const name = stepLabel(step);
    if (step.lane !== laneOf(step.kind)) {
      report(index, `${name} must run on the ${laneOf(step.kind)} lane, not ${step.lane}`);
    }
    const badWait = (step.waitsFor ?? []).find((j) => !Number.isInteger(j) || j < 0 || j >= index);
    if (badWait !== undefined) {
      report(index, `${name} waits for step ${badWait}, which is not an earlier step`);
    }
    const first = firstSeen.get(name);
    if (first !== undefined) {
      report(index, `${name} is repeated (first at ${where(first)})`);
      return;
    }
    firstSeen.set(name, index);
    if (step.kind === "forward") {
      if (step.group !== undefined) report(index, "forward takes no group");
      return;
    }
    const group = step.group;
    if (group === undefined) {
      report(index, `${step.kind} needs a group`);
      return;
    }
    if (!groups.includes(group)) {
      report(index, `unknown group ${JSON.stringify(group)}; groups are ${groups.join(", ")}`);
      return;
    }
    done[step.kind].set(group, index);
    if (step.kind === "backward") {
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
    if (step.kind === "broadcast" && !master) {
      notes.push(
        `broadcast ${group} (${
          where(index)
        }) is a no-op in allreduce mode: every device updates its own copy`,
      );
      return;
    }
    const need = needs[step.kind];
    if (!done[need].has(group)) report(index, `${name} comes before ${need} ${group}`);
  });

  // A stage is "never done" only when no later stage of the group exists either; otherwise the later
  // stage has already been reported as coming too early, and one mistake should give one error.
  const stages: readonly Exclude<StepKind, "forward">[] = master
    ? ["backward", "reduce", "update", "broadcast"]
    : ["backward", "reduce", "update"];
  const verbs = { backward: "backwarded", reduce: "reduced", update: "updated", broadcast: "broadcast" };
  const last = steps.length > 0 ? steps.length - 1 : undefined;
  for (const group of groups) {
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

  const backwards = steps.map((s, i) => (s.kind === "backward" ? i : -1)).filter((i) => i >= 0);
  const firstReduce = steps.findIndex((s) => s.kind === "reduce");
  if (groups.length > 1 && firstReduce > backwards[backwards.length - 1]) {
    notes.push(
      `every reduce comes after the last backward, so no communication overlaps computation (a sequential schedule)`,
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
