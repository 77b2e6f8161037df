/**
 * The typed, in-code form of a schedule. It produces exactly the plan the text form would, except
 * that every step's `line` and `column` are 0 (the {@link PlanStep} convention for "built in code");
 * validation then names the step index instead of a line. Builders are immutable, so a common prefix
 * can be shared between variants.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { checkGroupNames } from "./dsl.ts";
import {
  laneOf,
  type Plan,
  type PlanStep,
  type ReductionMode,
  type StepKind,
  withProgramOrder,
} from "./plan.ts";
import { validatePlan } from "./validate.ts";

/**
 * What a group step acts on: one group, several (in the order given), or `"all"` in backward order.
 *
 * @example
 * ```ts
 * import type { GroupTarget } from "./builder.ts";
 * const targets: GroupTarget<"fc" | "conv">[] = ["fc", "all", ["conv", "fc"]];
 * ```
 */
export type GroupTarget<G extends string> = G | "all" | readonly G[];

/**
 * Builds a {@link Plan} step by step; group names are checked by the type system (and at run time for
 * callers without types).
 *
 * @example
 * ```ts
 * import { scheduleBuilder } from "./builder.ts";
 * const plan = scheduleBuilder(["fc", "conv"])
 *   .forward()
 *   .backward("fc").reduce("fc").update("fc")
 *   .backward("conv").reduce("conv").update("conv")
 *   .broadcast("all")
 *   .build("overlap", { mode: "master" });
 * console.log(plan.steps.length); // 9
 * ```
 */
export class ScheduleBuilder<G extends string> {
  /** The groups in backward order (output side first). */
  readonly groups: readonly G[];
  readonly #steps: readonly PlanStep[];

  /** A builder for `groups` holding `steps` so far; use {@link scheduleBuilder} to start one. */
  constructor(groups: readonly G[], steps: readonly PlanStep[] = []) {
    checkGroupNames(groups, "scheduleBuilder");
    this.groups = [...groups];
    this.#steps = steps;
  }

  /** Adds the forward pass. */
  forward(): ScheduleBuilder<G> {
    return new ScheduleBuilder(this.groups, [...this.#steps, {
      kind: "forward",
      lane: "compute",
      line: 0,
      column: 0,
    }]);
  }

  /** Adds the backward pass of `target` (segments in the order given; `"all"` in backward order). */
  backward(target: GroupTarget<G>): ScheduleBuilder<G> {
    return this.#add("backward", target);
  }

  /** Adds the gradient reduction of `target`. */
  reduce(target: GroupTarget<G>): ScheduleBuilder<G> {
    return this.#add("reduce", target);
  }

  /** Adds the optimizer update of `target`. */
  update(target: GroupTarget<G>): ScheduleBuilder<G> {
    return this.#add("update", target);
  }

  /** Adds the broadcast of `target`'s new parameters from device 0. */
  broadcast(target: GroupTarget<G>): ScheduleBuilder<G> {
    return this.#add("broadcast", target);
  }

  /** The plan named `name`; with `options.mode` it is validated first (throws a `ScheduleError`). */
  build(name = "custom", options: { readonly mode?: ReductionMode } = {}): Plan {
    const plan: Plan = { name, groups: [...this.groups], steps: withProgramOrder(this.#steps) };
    if (options.mode !== undefined) validatePlan(plan, { mode: options.mode });
    return plan;
  }

  #add(kind: StepKind, target: GroupTarget<G>): ScheduleBuilder<G> {
    const list: readonly string[] = target === "all"
      ? this.groups
      : typeof target === "string"
      ? [target]
      : target;
    if (list.length === 0) throw new ValueError(`scheduleBuilder.${kind}`, "needs at least one group");
    for (const group of list) {
      if (!(this.groups as readonly string[]).includes(group)) {
        throw new ValueError(
          `scheduleBuilder.${kind}`,
          `unknown group ${JSON.stringify(group)}; groups are ${this.groups.join(", ")}`,
        );
      }
    }
    const added = list.map((group): PlanStep => ({ kind, group, lane: laneOf(kind), line: 0, column: 0 }));
    return new ScheduleBuilder(this.groups, [...this.#steps, ...added]);
  }
}

/**
 * Starts a typed schedule builder for `groups` in backward order (output side first).
 *
 * @example
 * ```ts
 * import { scheduleBuilder } from "./builder.ts";
 * const sequential = scheduleBuilder(["fc", "conv"])
 *   .forward().backward("all").reduce("all").update("all").broadcast("all").build("sequential");
 * console.log(sequential.steps.map((s) => s.kind).join(" "));
 * ```
 */
export function scheduleBuilder<const G extends string>(groups: readonly G[]): ScheduleBuilder<G> {
  return new ScheduleBuilder(groups);
}
