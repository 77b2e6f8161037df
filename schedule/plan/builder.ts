/**
 * The typed, in-code form of a schedule. It produces exactly the plan the text form would, except
 * that every action's `line` and `column` are 0 (the {@link PlanAction} convention for "built in code");
 * validation then names the action index instead of a line. Builders are immutable, so a common prefix
 * can be shared between variants. `shard` declares a hybrid plan's model-parallel groups, like the
 * text's `shard` statement.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { checkGroupNames } from "./dsl.ts";
import {
  type ActionKind,
  laneOf,
  type Plan,
  type PlanAction,
  type ReductionMode,
  withProgramOrder,
} from "./plan.ts";
import { shardingProblem, validatePlan } from "./validate.ts";

/**
 * What a group action acts on: one group, several (in the order given), or `"all"` in backward order.
 *
 * @example
 * ```ts
 * import type { GroupTarget } from "./builder.ts";
 * const targets: GroupTarget<"fc" | "conv">[] = ["fc", "all", ["conv", "fc"]];
 * ```
 */
export type GroupTarget<G extends string> = G | "all" | readonly G[];

/**
 * Builds a {@link Plan} one action at a time; group names are checked by the type system (and at run time for
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
 * console.log(plan.actions.length); // 9
 * ```
 */
export class ScheduleBuilder<G extends string> {
  /** The groups in backward order (output side first). */
  readonly groups: readonly G[];
  readonly #actions: readonly PlanAction[];
  readonly #sharded: readonly G[] | undefined;

  /**
   * A builder for `groups` holding `actions` so far and, for a hybrid plan, the `sharded` groups; use
   * {@link scheduleBuilder} to start one.
   */
  constructor(groups: readonly G[], actions: readonly PlanAction[] = [], sharded?: readonly G[]) {
    checkGroupNames(groups, "scheduleBuilder");
    this.groups = [...groups];
    this.#actions = actions;
    this.#sharded = sharded;
  }

  /**
   * Declares `target` model-parallel, as the text's `shard` statement does (see `Plan.sharded`):
   * groups from the output side, leaving at least one unsharded; stored in backward order. Unknown
   * groups, `"all"`, a second call, and a list that is not a prefix of the groups or leaves no group
   * unsharded throw a `ValueError` here; the actions' order is checked by `build` with a mode.
   *
   * @example
   * ```ts
   * import { scheduleBuilder } from "./builder.ts";
   * const plan = scheduleBuilder(["fc", "conv"]).shard("fc")
   *   .forward().backward("fc").update("fc")
   *   .backward("conv").reduce("conv").update("conv").broadcast("conv")
   *   .build("hybrid", { mode: "master" });
   * console.log(plan.sharded); // ["fc"]
   * ```
   */
  shard(target: G | readonly G[]): ScheduleBuilder<G> {
    const list: readonly string[] = typeof target === "string" ? [target] : target;
    const fail = (reason: string): never => {
      throw new ValueError("scheduleBuilder.shard", reason);
    };
    if (this.#sharded !== undefined) fail("shard is declared twice");
    if (list.length === 0) fail("needs at least one group");
    if (list.includes("all")) {
      fail(`"all" is not allowed: at least one group must stay unsharded (data-parallel)`);
    }
    const problem = shardingProblem(this.groups, list);
    if (problem !== undefined) fail(problem.reason);
    const sharded = this.groups.filter((g) => list.includes(g));
    return new ScheduleBuilder(this.groups, this.#actions, sharded);
  }

  /** Adds the forward pass. */
  forward(): ScheduleBuilder<G> {
    return new ScheduleBuilder(this.groups, [...this.#actions, {
      kind: "forward",
      lane: "compute",
      line: 0,
      column: 0,
    }], this.#sharded);
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
    const plan: Plan = {
      name,
      groups: [...this.groups],
      actions: withProgramOrder(this.#actions, this.#sharded),
      ...(this.#sharded === undefined ? {} : { sharded: [...this.#sharded] }),
    };
    if (options.mode !== undefined) validatePlan(plan, { mode: options.mode });
    return plan;
  }

  #add(kind: ActionKind, target: GroupTarget<G>): ScheduleBuilder<G> {
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
    const added = list.map((group): PlanAction => ({ kind, group, lane: laneOf(kind), line: 0, column: 0 }));
    return new ScheduleBuilder(this.groups, [...this.#actions, ...added], this.#sharded);
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
 * console.log(sequential.actions.map((s) => s.kind).join(" "));
 * ```
 */
export function scheduleBuilder<const G extends string>(groups: readonly G[]): ScheduleBuilder<G> {
  return new ScheduleBuilder(groups);
}
