/**
 * Judging whether a network is AlexNet-like, and where to cut it: the verdict and the split that
 * {@link judgeNetwork} hands to `autoSchedule` (in `auto.ts`), which chooses the plan from it.
 *
 * The AlexNet-like test: walk from the output side and take the shortest suffix of layers holding at
 * least `minSuffixParameterFraction` (default 50%) of the parameter bytes. The network is
 * AlexNet-like when that suffix costs at most `maxSuffixBackwardFraction` (default 35%) of the
 * backward time and some layer before it has parameters: most of the bytes are then ready early,
 * with most of the backward work still to do behind which to send them. (AlexNet: fc6–fc8 hold 96%
 * of the bytes at ~5–20% of the compute. A ResNet, parameters spread evenly, fails it.) A profile
 * that names its layers' kinds must also keep at least `minFcParameterFraction` (default 25%) of
 * the bytes in fully-connected layers: a net with little FC weight is not AlexNet-like. For a
 * network on a graph the profile is in topological order, the reverse of backward's, so the output
 * side is still the end of the list.
 *
 * A network that is not AlexNet-like gets DDP-style buckets instead (`bucketed`, 2 to 4 contiguous
 * groups of about equal bytes, output side first) when the simulator predicts them faster than
 * `sequential`, which it does whenever some communication can hide behind an earlier bucket's
 * backward; else `sequential`.
 *
 * The split: every boundary before a layer with parameters that leaves parameters on both sides is a
 * candidate; each is priced by {@link simulate} as a two-group overlap plan, and the one hiding the
 * most communication wins (ties go to the larger output-side group). With a fixed amount of
 * communication in total, the most hidden communication is the shortest iteration; for two groups
 * the hidden time is min(communication of the output side, backward of the input side), so this
 * is the largest output-side suffix whose communication fits under the remaining backward time,
 * unless adding one more layer overflows it by less than it gains.
 *
 * @module
 */

import { bucketedPlan, overlapPlan, sequentialPlan } from "../plan/builtins.ts";
import { bucketGroups } from "../plan/buckets.ts";
import { checkProfile, groupTimes, type LayerProfile, type Profile, regroupProfile } from "./profile.ts";
import type { CostOptions, HybridTraffic, Link } from "./costs.ts";
import { simulate } from "./simulator.ts";
import { STANDARD_LINKS } from "../runtime/exchange/link.ts";

/**
 * The AlexNet-like test's thresholds.
 *
 * @example
 * ```ts
 * import type { AlexnetThresholds } from "./judge.ts";
 * const strict: AlexnetThresholds = {
 *   minSuffixParameterFraction: 0.8,
 *   maxSuffixBackwardFraction: 0.2,
 *   minFcParameterFraction: 0.5,
 * };
 * ```
 */
export interface AlexnetThresholds {
  /** Share of parameter bytes the output-side suffix must hold; default 0.5. */
  readonly minSuffixParameterFraction: number;
  /** Most share of the backward time that suffix may cost; default 0.35. */
  readonly maxSuffixBackwardFraction: number;
  /**
   * Least share of the parameter bytes the fully-connected layers (profile `kind` `Linear`) must
   * hold, when the profile says which layers are; default 0.25. A net with little FC weight (a
   * ResNet: one small classifier) is not AlexNet-like, however its convolutions are distributed.
   */
  readonly minFcParameterFraction: number;
}

/**
 * The default thresholds: ≥ 50% of the bytes in ≤ 35% of the backward time, and (when the profile
 * names its layers' kinds) ≥ 25% of the bytes fully connected.
 *
 * @example
 * ```ts
 * import { DEFAULT_THRESHOLDS } from "./judge.ts";
 * console.log(DEFAULT_THRESHOLDS.maxSuffixBackwardFraction); // 0.35
 * ```
 */
export const DEFAULT_THRESHOLDS: AlexnetThresholds = {
  minSuffixParameterFraction: 0.5,
  maxSuffixBackwardFraction: 0.35,
  minFcParameterFraction: 0.25,
};

/**
 * Options of {@link judgeNetwork}: the link and costs the split is priced at.
 *
 * @example
 * ```ts
 * import type { JudgeOptions } from "./judge.ts";
 * const options: JudgeOptions = { devices: 4, mode: "allreduce", thresholds: { maxSuffixBackwardFraction: 0.3 } };
 * ```
 */
export interface JudgeOptions extends Partial<CostOptions> {
  /** Thresholds of the AlexNet-like test; default {@link DEFAULT_THRESHOLDS}. */
  readonly thresholds?: Partial<AlexnetThresholds>;
}

/**
 * Where to cut the network into an output-side and an input-side group.
 *
 * @example
 * ```ts
 * import type { NetworkSplit } from "./judge.ts";
 * const describe = (s: NetworkSplit) => `${s.groups.join(" then ")}, cut before ${s.boundaryLayer}`;
 * ```
 */
export interface NetworkSplit {
  /** The two groups in backward order; the profile's own names when the cut falls between two of its groups, else `head`, `body`. */
  readonly groups: readonly string[];
  /** The first (input-side-most) layer of the output-side group, e.g. `fc6`. */
  readonly boundaryLayer: string;
  /** Every layer's group under this split; the runtime must group parameters this way. */
  readonly assignment: Readonly<Record<string, string>>;
  /** Predicted communication hidden per iteration with the overlap plan, seconds. */
  readonly hiddenCommSeconds: number;
  /** Predicted iteration seconds with the overlap plan on this split. */
  readonly overlapSeconds: number;
  /** Predicted iteration seconds with the sequential plan. */
  readonly sequentialSeconds: number;
}

/**
 * Buckets for a network that is not AlexNet-like (parameters spread over the layers, little FC
 * weight, as in a ResNet or GoogLeNet), the way PyTorch DDP buckets gradients: the layers cut into
 * contiguous groups of about equal parameter bytes, the output side first, each reduced, updated and
 * broadcast as soon as its backward is done while the next one's backward runs.
 *
 * @example
 * ```ts
 * import type { BucketSplit } from "./judge.ts";
 * const describe = (b: BucketSplit) => `${b.groups.length} buckets, ${b.bucketedSeconds} s per step`;
 * ```
 */
export interface BucketSplit {
  /** The buckets in backward order, `bucket1` (output side) to `bucketK`. */
  readonly groups: readonly string[];
  /** Every layer's bucket; the runtime must group parameters this way. */
  readonly assignment: Readonly<Record<string, string>>;
  /** Each bucket's layers with parameters, `first..last` in forward order, in `groups` order. */
  readonly ranges: readonly string[];
  /** Predicted iteration seconds with the bucketed plan. */
  readonly bucketedSeconds: number;
  /** Predicted communication it hides per iteration, seconds. */
  readonly hiddenCommSeconds: number;
  /** Predicted iteration seconds with the sequential plan on the profile's own groups. */
  readonly sequentialSeconds: number;
}

/**
 * The best hybrid plan for a profile, as {@link hybridCandidate} prices it, beside the data-parallel
 * exchange it replaces.
 *
 * @example
 * ```ts
 * import type { HybridCandidate } from "./judge.ts";
 * const saving = (c: HybridCandidate) => c.dataParallelExchangeSeconds - c.activationSeconds;
 * ```
 */
export interface HybridCandidate {
  /** `[sharded, body]`: the profile's own names when the cut falls between two of its groups, else `head`, `body`. */
  readonly groups: readonly string[];
  /** The sharded group, `[groups[0]]`. */
  readonly sharded: readonly string[];
  /** The first sharded layer, e.g. `fc6`. */
  readonly boundaryLayer: string;
  /** The sharded layers with parameters, forward order, e.g. `fc6`, `fc7`, `fc8`. */
  readonly shardedLayers: readonly string[];
  /** Every layer's group under this plan; the runtime must group parameters this way. */
  readonly assignment: Readonly<Record<string, string>>;
  /** Predicted iteration seconds of the hybrid plan. */
  readonly stepSeconds: number;
  /** Its activation traffic per step. */
  readonly traffic: HybridTraffic;
  /** `traffic.allGatherSeconds + traffic.reduceScatterSeconds`, on the compute lane. */
  readonly activationSeconds: number;
  /** Parameter (= gradient) bytes of the sharded layers, what a data-parallel plan exchanges for them. */
  readonly dataParallelBytes: number;
  /** Seconds of that data-parallel exchange at the same link: its reduce plus its broadcast. */
  readonly dataParallelExchangeSeconds: number;
}

/**
 * The verdict of {@link judgeNetwork}.
 *
 * @example
 * ```ts
 * import type { NetworkJudgement } from "./judge.ts";
 * const report = (j: NetworkJudgement) => (j.alexnetLike ? "overlap: " : "sequential: ") + j.reason;
 * ```
 */
export interface NetworkJudgement {
  /** Whether the network passes the AlexNet-like test. */
  readonly alexnetLike: boolean;
  /** A sentence quoting the numbers behind the verdict. */
  readonly reason: string;
  /** The best split, or `undefined` when no layer boundary leaves parameters on both sides. */
  readonly split?: NetworkSplit;
  /** Parameter-byte share of the shortest output-side suffix that reaches the threshold. */
  readonly suffixParameterFraction: number;
  /** Backward-time share of that suffix. */
  readonly suffixBackwardFraction: number;
  /** The hybrid schedule as priced by `autoSchedule` (`auto.ts`) with `allowHybrid`; absent otherwise. */
  readonly hybrid?: HybridCandidate;
  /**
   * For a network that is not AlexNet-like, the buckets that beat the sequential plan (see
   * {@link BucketSplit}); absent when none does (fewer than two layers with parameters, or
   * communication too short to be worth hiding).
   */
  readonly buckets?: BucketSplit;
}

/**
 * The link {@link judgeNetwork} prices splits at by default: PCIe 3 ×16, 12 GB/s, 10 µs.
 *
 * @example
 * ```ts
 * import { DEFAULT_LINK } from "./judge.ts";
 * console.log(DEFAULT_LINK.bandwidthBytesPerSecond); // 12000000000
 * ```
 */
export const DEFAULT_LINK: Link = STANDARD_LINKS[0];

// Formatting for the verdicts' sentences; `ms`, `mb` and `range` serve `auto.ts`'s as well.
const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
export const ms = (s: number) => `${(s * 1e3).toFixed(2)} ms`;
export const mb = (b: number) => `${(b / 1e6).toFixed(1)} MB`;

/** `first..last` of `names`, or the one name. */
export function range(names: readonly string[]): string {
  return names.length === 1 ? names[0] : `${names[0]}..${names[names.length - 1]}`;
}

/**
 * Decides from per-layer backward times and parameter bytes whether `profile` is AlexNet-like and
 * where to split it (see the module notes for the rules and defaults).
 *
 * @example
 * ```ts
 * import { judgeNetwork } from "./judge.ts";
 * const verdict = judgeNetwork({
 *   batchSize: 128,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 0.03, backwardSeconds: 0.06, parameterBytes: 9e6 },
 *     { name: "fc", group: "fc", forwardSeconds: 0.003, backwardSeconds: 0.006, parameterBytes: 2.3e8 },
 *   ],
 * }, { devices: 4 });
 * console.log(verdict.alexnetLike, verdict.split?.groups, verdict.reason);
 * ```
 */
export function judgeNetwork(profile: Profile, options: JudgeOptions = {}): NetworkJudgement {
  checkProfile(profile);
  const thresholds = { ...DEFAULT_THRESHOLDS, ...options.thresholds };
  const costs: CostOptions = {
    ...options,
    link: options.link ?? DEFAULT_LINK,
    devices: options.devices ?? profile.deviceCount ?? 2,
    mode: options.mode ?? "master",
  };
  const layers = profile.layers;
  const totalBytes = layers.reduce((s, l) => s + l.parameterBytes, 0);
  const totalBackward = layers.reduce((s, l) => s + l.backwardSeconds, 0);

  // The shortest output-side suffix holding the threshold share of the bytes.
  let start = layers.length;
  let suffixBytes = 0;
  let suffixBackward = 0;
  while (
    start > 0 && (suffixBytes < thresholds.minSuffixParameterFraction * totalBytes || suffixBytes === 0)
  ) {
    start--;
    suffixBytes += layers[start].parameterBytes;
    suffixBackward += layers[start].backwardSeconds;
  }
  const byteShare = totalBytes > 0 ? suffixBytes / totalBytes : 0;
  const timeShare = totalBackward > 0 ? suffixBackward / totalBackward : 0;
  const suffixNames = layers.slice(start).filter((l) => l.parameterBytes > 0).map((l) => l.name);

  const split = bestSplit(profile, costs);
  const prefixHasParameters = layers.slice(0, start).some((l) => l.parameterBytes > 0);
  const at = `at ${
    (costs.link.bandwidthBytesPerSecond / 1e9).toFixed(1)
  } GB/s with ${costs.devices} devices (${costs.mode})`;

  // Not AlexNet-like: buckets of about equal bytes, when they are predicted to beat sequential.
  const buckets = bestBuckets(profile, costs);
  const fallback = (unused: string) =>
    buckets
      ? `; use bucketed: ${buckets.groups.length} buckets of about equal bytes (DDP-style: ${
        buckets.ranges.join(", ")
      }) hide ${ms(buckets.hiddenCommSeconds)} of communication ${at}, ${
        ms(buckets.bucketedSeconds)
      } against ${ms(buckets.sequentialSeconds)} sequential`
      : `; use sequential${unused}`;

  if (totalBytes === 0 || totalBackward === 0) {
    const reason = `not AlexNet-like: the profile has ${
      totalBytes === 0 ? "no parameter bytes" : "no backward time"
    }, so there is nothing to overlap; use sequential`;
    return {
      alexnetLike: false,
      reason,
      split,
      suffixParameterFraction: byteShare,
      suffixBackwardFraction: timeShare,
    };
  }
  const suffixText = `the output-side ${suffixNames.length === 1 ? "layer" : "layers"} ${
    range(suffixNames)
  } hold ${pct(byteShare)} of the parameter bytes (${mb(suffixBytes)} of ${mb(totalBytes)}) and take ${
    pct(timeShare)
  } of the backward time (${ms(suffixBackward)} of ${ms(totalBackward)})`;
  // Only a profile that names every parametrised layer's kind can say how much of it is FC.
  const kindsKnown = layers.every((l) => l.parameterBytes === 0 || l.kind !== undefined);
  const fcBytes = layers.filter((l) => l.kind === "Linear").reduce((n, l) => n + l.parameterBytes, 0);
  const littleFc = kindsKnown && fcBytes < thresholds.minFcParameterFraction * totalBytes;
  const alexnetLike = split !== undefined && prefixHasParameters && !littleFc &&
    timeShare <= thresholds.maxSuffixBackwardFraction;
  let reason: string;
  if (littleFc) {
    reason = `not AlexNet-like: the fully-connected layers hold ${
      pct(fcBytes / totalBytes)
    } of the parameter bytes (${mb(fcBytes)} of ${mb(totalBytes)}), less than ${
      pct(thresholds.minFcParameterFraction)
    }: the parameters sit in the convolutions, not in an FC head to send early${
      fallback(" (no bucketing is predicted faster)")
    }`;
  } else if (alexnetLike) {
    // Each group with the layers it holds: the split rarely falls where the suffix test stopped.
    const [head, body] = split.groups.map((g) => `${g} (${range(layersOf(layers, split.assignment, g))})`);
    reason =
      `AlexNet-like: ${suffixText}, within the thresholds (≥ ${
        pct(thresholds.minSuffixParameterFraction)
      } of the bytes in ≤ ${pct(thresholds.maxSuffixBackwardFraction)} of the backward time). ` +
      `Split before ${split.boundaryLayer} into ${head} and ${body}: ${at} the overlap schedule hides ${
        ms(split.hiddenCommSeconds)
      } of communication per iteration, ${ms(split.overlapSeconds)} against ${
        ms(split.sequentialSeconds)
      } sequential`;
  } else if (!prefixHasParameters || split === undefined) {
    reason =
      `not AlexNet-like: ${suffixText}, but no layer before them has parameters, so there is no later backward to hide their communication behind${
        fallback("")
      }`;
  } else {
    reason = `not AlexNet-like: ${suffixText}; more than ${
      pct(thresholds.maxSuffixBackwardFraction)
    } of the backward time, so most parameters are ready too late to hide their communication${
      fallback(" (no bucketing is predicted faster)")
    }`;
  }
  return {
    alexnetLike,
    reason,
    split,
    suffixParameterFraction: byteShare,
    suffixBackwardFraction: timeShare,
    ...(!alexnetLike && buckets ? { buckets } : {}),
  };
}

/** Most buckets {@link bestBuckets} tries. */
const MAX_BUCKETS = 4;

/**
 * The best of 2 … {@link MAX_BUCKETS} buckets of about equal parameter bytes (see
 * {@link BucketSplit}), priced by {@link simulate}; `undefined` unless it beats the sequential plan
 * on the profile's own groups (on a tie the fewer buckets win).
 */
function bestBuckets(profile: Profile, costs: CostOptions): BucketSplit | undefined {
  const layers = profile.layers;
  const withParameters = layers.flatMap((l, i) => (l.parameterBytes > 0 ? [i] : []));
  const total = layers.reduce((s, l) => s + l.parameterBytes, 0);
  if (withParameters.length < 2 || total === 0) return undefined;
  const sequentialSeconds = simulate(sequentialPlan(groupTimes(profile).map((t) => t.group)), profile, costs)
    .stepSeconds;
  let best: BucketSplit | undefined;
  for (let k = 2; k <= Math.min(MAX_BUCKETS, withParameters.length); k++) {
    // From the output side: each bucket takes layers until it holds its share of the bytes not yet
    // bucketed (so one big layer does not leave the next bucket a sliver).
    const starts: number[] = []; // each bucket's first layer with parameters, output side first
    let consumed = 0, current = 0;
    for (let i = withParameters.length - 1; i >= 0 && starts.length < k - 1; i--) {
      current += layers[withParameters[i]].parameterBytes;
      const left = k - starts.length; // buckets still to fill, this one included
      // Leave at least one layer with parameters for each remaining bucket.
      if (current >= (total - consumed) / left && i >= left - 1) {
        starts.push(withParameters[i]);
        consumed += current;
        current = 0;
      }
    }
    if (starts.length !== k - 1) continue;
    const { groups, assignment } = bucketGroups(layers, starts, k);
    const simulated = simulate(bucketedPlan(groups), regroupProfile(profile, assignment), costs);
    if (best === undefined || simulated.stepSeconds < best.bucketedSeconds) {
      best = {
        groups,
        assignment,
        ranges: groups.map((g) => range(layersOf(layers, assignment, g))),
        bucketedSeconds: simulated.stepSeconds,
        hiddenCommSeconds: simulated.hiddenCommSeconds,
        sequentialSeconds,
      };
    }
  }
  return best && best.bucketedSeconds < sequentialSeconds ? best : undefined;
}

/** The layers with parameters that `assignment` puts in `group`, forward order. */
function layersOf(
  layers: readonly LayerProfile[],
  assignment: Readonly<Record<string, string>>,
  group: string,
): string[] {
  return layers.filter((l) => l.parameterBytes > 0 && assignment[l.name] === group).map((l) => l.name);
}

function bestSplit(profile: Profile, costs: CostOptions): NetworkSplit | undefined {
  const layers = profile.layers;
  let best: NetworkSplit | undefined;
  let sequentialSeconds: number | undefined;
  // From the input side, so that on a tie the earlier boundary (the larger output-side group) stays.
  for (let b = 1; b < layers.length; b++) {
    if (layers[b].parameterBytes === 0) continue;
    if (!layers.slice(0, b).some((l) => l.parameterBytes > 0)) continue;
    const { head, body, assignment } = splitAt(layers, b);
    const regrouped = regroupProfile(profile, assignment);
    const groups = [head, body];
    const simulated = simulate(overlapPlan(groups), regrouped, costs);
    sequentialSeconds ??= simulate(sequentialPlan(groups), regrouped, costs).stepSeconds;
    if (best === undefined || simulated.hiddenCommSeconds > best.hiddenCommSeconds) {
      best = {
        groups,
        boundaryLayer: layers[b].name,
        assignment,
        hiddenCommSeconds: simulated.hiddenCommSeconds,
        overlapSeconds: simulated.stepSeconds,
        sequentialSeconds,
      };
    }
  }
  return best;
}

/**
 * The two groups of a cut before layer `b`: the model's own names when each side is one group of its
 * own (e.g. `fc` and `conv`), else `head` and `body`; and the layer → group assignment.
 */
export function splitAt(
  layers: readonly LayerProfile[],
  b: number,
): { head: string; body: string; assignment: Record<string, string> } {
  const headNames = new Set(layers.slice(b).filter((l) => l.parameterBytes > 0).map((l) => l.group));
  const bodyNames = new Set(layers.slice(0, b).filter((l) => l.parameterBytes > 0).map((l) => l.group));
  const [head, body] = headNames.size === 1 && bodyNames.size === 1 && !headNames.has([...bodyNames][0])
    ? [[...headNames][0], [...bodyNames][0]]
    : ["head", "body"];
  return { head, body, assignment: Object.fromEntries(layers.map((l, i) => [l.name, i < b ? body : head])) };
}
