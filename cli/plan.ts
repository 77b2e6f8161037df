/**
 * Which plan a run executes: a built-in schedule, `auto` (measured on this machine and priced on
 * the link), or a schedule file in the DSL.
 *
 * @module
 */

import { basename } from "node:path";
import { autoSchedule, builtinPlan, type Network, type Plan } from "../mod.ts";
import { accumulatedProfile, DEFAULT_LINK, measureProfile } from "../schedule/simulator/mod.ts";
import { layerParameterBytes, layoutOf, type ModelSpec } from "../schedule/devices/mod.ts";
import type { Link } from "../schedule/runtime/mod.ts";
import { ddpBuckets, loadSchedule } from "../schedule/mod.ts";
import type { MeasuredLink } from "../schedule/mpi/mod.ts";
import { SCHEDULE_NAMES, type TrainArgs } from "./args.ts";
import { CliError, closest } from "./errors.ts";

/**
 * The groups of `plan` in its order (output side first), each with the layers that hold parameters
 * in it (forward order), from the plan's own assignment, and the layer a two-group plan splits
 * before: `head (conv2..fc8), body (conv1); split before conv2`. Read from the plan that runs, so
 * the line cannot disagree with it.
 *
 * @example
 * ```ts ignore
 * import { describeGroups } from "./plan.ts";
 * console.log(describeGroups(plan, network)); // fc (ip1..ip2), conv (conv1..conv2); split before ip1
 * ```
 */
export function describeGroups(
  plan: { groups: readonly string[]; assignment: Readonly<Record<string, string>> },
  network: Network,
): string {
  const withParameters = new Set(
    network.namedParameters().map((p) => p.name.slice(0, p.name.lastIndexOf("."))),
  );
  const members = (group: string) =>
    Object.keys(plan.assignment).filter((layer) =>
      plan.assignment[layer] === group && withParameters.has(layer)
    );
  const range = (names: string[]) => names.length <= 1 ? names.join("") : `${names[0]}..${names.at(-1)}`;
  const groups = plan.groups.map((g) => `${g} (${range(members(g))})`).join(", ");
  const head = members(plan.groups[0])[0];
  return plan.groups.length === 2 && head ? `${groups}; split before ${head}` : groups;
}

/**
 * The plan `--schedule` names for `local` (the model as built here), with the model spec the devices
 * build: `auto` may regroup its layers, priced at `measured` (the link between MPI ranks) where
 * given, else at `link`, else at an assumed one. Prints what `auto` chose and why through `say`.
 */
export async function choosePlan(
  args: TrainArgs,
  local: Network,
  spec: ModelSpec,
  link: Link | undefined,
  say: (line: string) => void,
  measured?: MeasuredLink,
): Promise<{ plan: Plan; spec: ModelSpec }> {
  const groups = layoutOf(local.namedParameters()).groups.map((g) => g.name);
  const name = args.schedule;
  if (name === "bucketed") {
    // PyTorch DDP's default buckets, regrouping the layers: 1 MiB first, then up to 25 MiB each.
    const buckets = ddpBuckets(layerParameterBytes(local));
    say(
      `bucketed schedule: PyTorch DDP's default buckets, ${
        describeGroups({ groups: buckets.groups, assignment: buckets.assignment }, local)
      }`,
    );
    return { plan: buckets.plan, spec: { ...spec, groups: buckets.assignment } };
  }
  if (name === "overlap" || name === "sequential" || name === "hybrid") {
    return { plan: builtinPlan(name, groups), spec };
  }
  if (name === "auto") {
    // What a device runs at once: a micro-batch when accumulating.
    const perDevice = args.batch / args.devices / args.accumulate;
    const micro = measureProfile(local, perDevice, { description: `${local.name}, batch ${perDevice}` });
    // Priced per step: K micro-batches' compute and activations, the gradients once.
    const profile = accumulatedProfile(micro, args.accumulate);
    // Hybrid cannot carry BatchNorm statistics yet, nor split a graph with several losses.
    const allowHybrid = local.namedBuffers().length === 0 && (local.graph?.losses.length ?? 0) <= 1;
    // Priced in the run's own reduction mode: master and allreduce move, sum and update differently.
    // Across ranks, at the link measured between them: both ways, one way, and the cores it takes.
    const priced = measured?.link ?? link;
    const plan = autoSchedule(profile, priced ?? DEFAULT_LINK, args.devices, {
      allowHybrid,
      mode: args.reduce,
      oneWayBandwidthBytesPerSecond: measured?.oneWayBytesPerSecond,
      commCpuShare: measured?.commCpuShare,
    });
    say(
      `auto schedule: ${plan.name} over groups ${describeGroups(plan, local)} (priced at ${
        priced
          ? priced.label
          : `${DEFAULT_LINK.bandwidthBytesPerSecond / 1e9} GB/s, ${
            DEFAULT_LINK.latencySeconds * 1e6
          } µs (${DEFAULT_LINK.label}, assumed)`
      })`,
    );
    say(`  why: ${plan.judgement.reason}`);
    return { plan, spec: { ...spec, groups: plan.assignment } };
  }
  let isFile = false;
  try {
    isFile = (await Deno.stat(name)).isFile;
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  if (!isFile) {
    // The last component: a typo of a built-in name arrives resolved to a path (cli/paths.ts).
    const hint = closest(basename(name), SCHEDULE_NAMES);
    throw new CliError(
      `--schedule must be ${SCHEDULE_NAMES.join(", ")} or a schedule file; "${name}" is none of them${
        hint ? `; did you mean ${hint}?` : ""
      }`,
    );
  }
  return { plan: await loadSchedule(name, { groups, mode: args.reduce }), spec };
}
