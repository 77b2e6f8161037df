/**
 * Deciding automatically whether a network benefits from the overlap schedule, and where to cut it:
 * {@link autoSchedule} turns the verdict of {@link judgeNetwork} (the AlexNet-like test, the best
 * split, DDP-style buckets; see `judge.ts` for the rules) into the plan to run.
 *
 * Hybrid (opt-in, `allowHybrid`; see {@link hybridCandidate}): when the output-side layers with
 * parameters are fully connected (`kind` `Linear` in the profile) and the profile has `outputBytes`,
 * the `hybrid` schedule that shards them is priced too — its activations travel instead of their
 * gradients — and chosen when the simulator predicts a shorter step than the data-parallel choice.
 *
 * @module
 */

import { bucketedPlan, hybridPlan, overlapPlan, sequentialPlan } from "../plan/builtins.ts";
import type { Plan } from "../plan/plan.ts";
import { checkProfile, groupTimes, type Profile, regroupProfile } from "./profile.ts";
import { commActionSeconds, type CostOptions, type Link } from "./costs.ts";
import { simulate } from "./simulator.ts";
import {
  type HybridCandidate,
  judgeNetwork,
  type JudgeOptions,
  mb,
  ms,
  type NetworkJudgement,
  range,
  splitAt,
} from "./judge.ts";

/**
 * The cheapest `hybrid` plan for `profile` at `costs`, or a sentence saying why there is none. The
 * candidates: cut before a fully-connected layer (profile `kind` `Linear`) such that every layer with
 * parameters from there to the output is fully connected and some layer before it has parameters;
 * the output side is sharded, the rest is one data-parallel group. Each is priced by
 * {@link simulate} (which needs the profile's `outputBytes`); the shortest step wins, ties going to
 * the larger sharded side.
 *
 * @example
 * ```ts
 * import { hybridCandidate } from "./auto.ts";
 * const found = hybridCandidate({
 *   batchSize: 128,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 0.03, backwardSeconds: 0.06, parameterBytes: 9e6,
 *       outputBytes: 4 * 128 * 9216, kind: "Conv2d" },
 *     { name: "fc", group: "fc", forwardSeconds: 0.003, backwardSeconds: 0.006, parameterBytes: 2.3e8,
 *       outputBytes: 4 * 128 * 1000, kind: "Linear" },
 *   ],
 * }, { link: { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 }, devices: 4, mode: "master" });
 * if ("candidate" in found) console.log(found.candidate.stepSeconds, found.candidate.traffic.bytes);
 * else console.log(found.why);
 * ```
 */
export function hybridCandidate(
  profile: Profile,
  costs: CostOptions,
): { readonly candidate: HybridCandidate } | { readonly why: string } {
  checkProfile(profile);
  const layers = profile.layers;
  // The fully-connected output side: from the output, every layer with parameters is Linear.
  let start = layers.length;
  while (start > 0 && (layers[start - 1].parameterBytes === 0 || layers[start - 1].kind === "Linear")) {
    start--;
  }
  const boundaries: number[] = [];
  for (let b = start; b < layers.length; b++) {
    if (
      layers[b].kind === "Linear" && layers[b].parameterBytes > 0 &&
      layers.slice(0, b).some((l) => l.parameterBytes > 0)
    ) {
      boundaries.push(b);
    }
  }
  if (boundaries.length === 0) {
    const last = [...layers].reverse().find((l) => l.parameterBytes > 0);
    return {
      why: last?.kind === undefined
        ? "the profile does not say which layers are fully connected (no `kind`; measureProfile records it)"
        : last.kind !== "Linear"
        ? `the output-side layer with parameters, ${last.name}, is ${last.kind}, not fully connected`
        : "no layer with parameters comes before the fully-connected layers, so there is no data-parallel body",
    };
  }
  const missing = layers.filter((l, i) => i >= boundaries[0] - 1 && l.outputBytes === undefined);
  if (missing.length > 0) {
    return {
      why: `the profile lacks outputBytes for ${
        missing.map((l) => l.name).join(", ")
      }, so the activation traffic cannot be priced (measureProfile records it)`,
    };
  }
  let best: HybridCandidate | undefined;
  for (const b of boundaries) {
    const after = layers.slice(b).filter((l) => l.parameterBytes > 0);
    const { head, body, assignment } = splitAt(layers, b);
    const groups = [head, body];
    const simulated = simulate(hybridPlan(groups, [head]), regroupProfile(profile, assignment), costs);
    if (best !== undefined && simulated.stepSeconds >= best.stepSeconds) continue;
    const traffic = simulated.hybrid!;
    const dataParallelBytes = after.reduce((s, l) => s + l.parameterBytes, 0);
    best = {
      groups,
      sharded: [head],
      boundaryLayer: layers[b].name,
      shardedLayers: after.map((l) => l.name),
      assignment,
      stepSeconds: simulated.stepSeconds,
      traffic,
      activationSeconds: traffic.allGatherSeconds + traffic.reduceScatterSeconds,
      dataParallelBytes,
      dataParallelExchangeSeconds: commActionSeconds("reduce", dataParallelBytes, costs) +
        commActionSeconds("broadcast", dataParallelBytes, costs),
    };
  }
  return { candidate: best! };
}

/**
 * Options of {@link autoSchedule}.
 *
 * @example
 * ```ts
 * import type { AutoOptions } from "./auto.ts";
 * const options: AutoOptions = { mode: "allreduce", allowHybrid: true };
 * ```
 */
export interface AutoOptions extends Omit<JudgeOptions, "link" | "devices"> {
  /**
   * Also price the `hybrid` schedule (see {@link hybridCandidate}) and choose it when it is
   * predicted faster. Default false: turn it on where the runtime executes hybrid plans.
   */
  readonly allowHybrid?: boolean;
}

/**
 * A plan chosen by {@link autoSchedule}, with the verdict and the grouping it assumes.
 *
 * @example
 * ```ts
 * import type { AutoPlan } from "./auto.ts";
 * const groupOf = (plan: AutoPlan, layer: string) => plan.assignment[layer];
 * ```
 */
export type AutoPlan = Plan & {
  /** Why this plan was chosen. */
  readonly judgement: NetworkJudgement;
  /** Every layer's group under this plan; the runtime must group parameters this way. */
  readonly assignment: Readonly<Record<string, string>>;
};

/**
 * The schedule to use when the user asks for an automatic one: the overlap plan on the best split
 * when the network is AlexNet-like, else the sequential plan on the profile's own groups; either way
 * `judgement.reason` says why. With `options.allowHybrid`, the best `hybrid` plan
 * ({@link hybridCandidate}) is priced as well and chosen when its predicted step is shorter than the
 * data-parallel choice's; the reason then leads with its numbers (activation bytes and seconds
 * against the data-parallel exchange of the sharded layers' gradients at the same link), and when it
 * loses or cannot be priced the reason ends by saying so. `judgement.hybrid` holds its figures.
 *
 * @example
 * ```ts
 * import { autoSchedule } from "./auto.ts";
 * const plan = autoSchedule({
 *   batchSize: 128,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 0.03, backwardSeconds: 0.06, parameterBytes: 9e6 },
 *     { name: "fc", group: "fc", forwardSeconds: 0.003, backwardSeconds: 0.006, parameterBytes: 2.3e8 },
 *   ],
 * }, { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 }, 2);
 * console.log(plan.name, plan.judgement.reason);
 * ```
 */
export function autoSchedule(
  profile: Profile,
  link: Link,
  devices: number,
  options: AutoOptions = {},
): AutoPlan {
  const { allowHybrid = false, ...judgeOptions } = options;
  const judgement = judgeNetwork(profile, { ...judgeOptions, link, devices });
  const dataParallel: AutoPlan = judgement.alexnetLike && judgement.split !== undefined
    ? { ...overlapPlan(judgement.split.groups), judgement, assignment: judgement.split.assignment }
    : judgement.buckets
    ? { ...bucketedPlan(judgement.buckets.groups), judgement, assignment: judgement.buckets.assignment }
    : {
      ...sequentialPlan(groupTimes(profile).map((t) => t.group)),
      judgement,
      assignment: Object.fromEntries(profile.layers.map((l) => [l.name, l.group])),
    };
  if (!allowHybrid) return dataParallel;

  const costs: CostOptions = { ...judgeOptions, link, devices, mode: judgeOptions.mode ?? "master" };
  const found = hybridCandidate(profile, costs);
  if (!("candidate" in found)) {
    return {
      ...dataParallel,
      judgement: { ...judgement, reason: `${judgement.reason}; hybrid not considered: ${found.why}` },
    };
  }
  const h = found.candidate;
  const dataParallelSeconds = judgement.alexnetLike && judgement.split !== undefined
    ? judgement.split.overlapSeconds
    : judgement.buckets
    ? judgement.buckets.bucketedSeconds
    : simulate(dataParallel, profile, costs).stepSeconds;
  const at = `at ${
    (link.bandwidthBytesPerSecond / 1e9).toFixed(1)
  } GB/s with ${devices} devices (${costs.mode})`;
  const traffic = `the sharded layers ${range(h.shardedLayers)} move ${
    mb(h.traffic.bytes)
  } of activations per device per step (all-gathers ${mb(h.traffic.allGatherBytes)}, reduce-scatters ${
    mb(h.traffic.reduceScatterBytes)
  }) in ${ms(h.activationSeconds)} on the compute lane, instead of exchanging their ${
    mb(h.dataParallelBytes)
  } of gradients (reduce and broadcast: ${ms(h.dataParallelExchangeSeconds)})`;
  if (h.stepSeconds < dataParallelSeconds) {
    const reason = `hybrid: shard ${
      range(h.shardedLayers)
    } (cut before ${h.boundaryLayer}) and keep the rest data-parallel: ${at} ${traffic}; predicted step ${
      ms(h.stepSeconds)
    } against ${
      ms(dataParallelSeconds)
    } with ${dataParallel.name}. Data-parallel verdict: ${judgement.reason}`;
    return {
      ...hybridPlan(h.groups, h.sharded),
      judgement: { ...judgement, reason, hybrid: h },
      assignment: h.assignment,
    };
  }
  const reason = `${judgement.reason}; hybrid priced too and not faster: ${at} ${traffic}; predicted step ${
    ms(h.stepSeconds)
  } against ${ms(dataParallelSeconds)} with ${dataParallel.name}`;
  return { ...dataParallel, judgement: { ...judgement, reason, hybrid: h } };
}
