/**
 * The schedules Tandem ships. All are valid in both reduction modes (in `allreduce` their broadcasts
 * are no-ops), and the data-parallel ones compute the same parameters bit for bit: group updates are
 * elementwise and reductions run in device order, so only the timing differs. `hybrid` makes the
 * output-side group model-parallel: activations travel instead of that group's gradients.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { scheduleBuilder } from "./builder.ts";
import type { Plan } from "./plan.ts";

/**
 * The classic schedule: compute every gradient, then reduce, update and broadcast every group.
 * Text form: `forward; backward all; reduce all; update all; broadcast all`.
 *
 * @example
 * ```ts
 * import { sequentialPlan } from "./builtins.ts";
 * console.log(sequentialPlan(["fc", "conv"]).actions.length); // 9
 * ```
 */
export function sequentialPlan(groups: readonly string[]): Plan {
  return scheduleBuilder(groups).forward().backward("all").reduce("all").update("all").broadcast("all")
    .build("sequential");
}

/**
 * One communication bucket per group from the output side, the way PyTorch DDP's gradient buckets
 * work: as soon as backward has produced a group's gradients, that group is reduced, updated and
 * broadcast on the communication lane while the compute lane carries on with the next group's
 * backward. For groups g1 (output side) … gn the text is
 * `forward; backward g1; reduce g1; update g1; broadcast g1; …; backward gn; reduce gn; update gn; broadcast gn`.
 *
 * Each group is broadcast right after its own update rather than all at the end, so the output
 * side's new parameters travel while the input side's backward is still running; in the plan order
 * that puts `backward g2` after `broadcast g1`, but they are on different lanes and do not wait for
 * each other (see `dependenciesOf`).
 *
 * @example
 * ```ts
 * import { bucketedPlan } from "./builtins.ts";
 * const plan = bucketedPlan(["fc8", "fc7", "fc6", "conv"]);
 * console.log(plan.actions.length); // 17
 * ```
 */
export function bucketedPlan(groups: readonly string[], name = "bucketed"): Plan {
  let builder = scheduleBuilder(groups).forward();
  for (const group of groups) builder = builder.backward(group).reduce(group).update(group).broadcast(group);
  return builder.build(name);
}

/**
 * The overlap schedule: {@link bucketed} named `overlap`, typically with two groups, FC (holding
 * most parameters, backwarded first) and conv (holding most compute). The FC gradients are reduced,
 * the FC update applied and the new FC parameters broadcast while conv backward still runs.
 *
 * @example
 * ```ts
 * import { overlapPlan } from "./builtins.ts";
 * import { formatPlan } from "./dsl.ts";
 * console.log(formatPlan(overlapPlan(["fc", "conv"])));
 * ```
 */
export function overlapPlan(groups: readonly string[]): Plan {
  return bucketedPlan(groups, "overlap");
}

/**
 * The hybrid schedule ("one weird trick", Krizhevsky 2014): the `sharded` groups (by default the
 * output-side one, e.g. `fc`) are model-parallel — each device holds 1/N of every layer's output
 * units and their optimizer state — and the rest stay data-parallel. Forward all-gathers the body
 * output and every sharded layer's output slices; `backward g` of a sharded group reduce-scatters
 * each layer's input gradient; its weight gradients never travel, so `update g` follows `backward g`
 * directly, on each device's own slice, on the communication lane while the body's backward runs.
 * Each unsharded group is then bucketed as in {@link overlap}. For groups fc, conv the text is
 * `shard fc; forward; backward fc; update fc; backward conv; reduce conv; update conv; broadcast conv`.
 * `sharded` must be a prefix of `groups` leaving at least one group unsharded (else `ValueError`).
 *
 * @example
 * ```ts
 * import { hybridPlan } from "./builtins.ts";
 * import { formatPlan } from "./dsl.ts";
 * console.log(formatPlan(hybridPlan(["fc", "conv"])));
 * console.log(hybridPlan(["fc8", "fc7", "fc6", "conv"], ["fc8", "fc7", "fc6"]).sharded); // ["fc8", "fc7", "fc6"]
 * ```
 */
export function hybridPlan(groups: readonly string[], sharded: readonly string[] = groups.slice(0, 1)): Plan {
  let builder = scheduleBuilder(groups).shard(sharded).forward();
  for (const group of groups) {
    builder = sharded.includes(group)
      ? builder.backward(group).update(group)
      : builder.backward(group).reduce(group).update(group).broadcast(group);
  }
  return builder.build("hybrid");
}

/**
 * Names accepted by {@link builtinPlan}.
 *
 * @example
 * ```ts
 * import { builtinPlan, type BuiltinName } from "./builtins.ts";
 * const name: BuiltinName = "overlap";
 * console.log(builtinPlan(name, ["fc", "conv"]).actions.length); // 9
 * ```
 */
export type BuiltinName = "sequential" | "overlap" | "bucketed" | "hybrid";

/**
 * A built-in schedule by name, for command lines and config files. `hybrid` shards the output-side
 * group (see {@link hybrid}).
 *
 * @example
 * ```ts
 * import { builtinPlan } from "./builtins.ts";
 * console.log(builtinPlan("overlap", ["fc", "conv"]).name); // overlap
 * ```
 */
export function builtinPlan(name: BuiltinName, groups: readonly string[]): Plan {
  switch (name) {
    case "sequential":
      return sequentialPlan(groups);
    case "overlap":
      return overlapPlan(groups);
    case "bucketed":
      return bucketedPlan(groups);
    case "hybrid":
      return hybridPlan(groups);
    default:
      throw new ValueError(
        "builtinPlan",
        `unknown schedule ${JSON.stringify(name)}; built-ins are sequential, overlap, bucketed, hybrid`,
      );
  }
}
