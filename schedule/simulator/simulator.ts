/**
 * A cost model that predicts one training iteration's timeline for a plan, from a measured (or
 * synthetic) per-layer profile and a link model, before any device runs it.
 *
 * Model (all devices are identical and hold the same share of the batch):
 * - `forward` takes Σ forwardSeconds; `backward g` takes Σ backwardSeconds of g's layers.
 * - Transfers of b bytes cost `latency + b / bandwidth`.
 * - `master` mode: `reduce g` gathers the N−1 other devices' gradients on device 0 and sums them
 *   there, taking the gather time plus `b·(N−1) / memoryBandwidth`. The gather depends on topology:
 *   `shared` (default): all transfers into device 0 cross one link (its PCIe slot or NIC), so they
 *   run one after another: `(N−1)·(latency + b/bandwidth)`; `star`: device 0 has a separate link to
 *   every other device and they run in parallel: `latency + b/bandwidth`. `broadcast g` costs the
 *   same transfers outwards. `update g` runs on device 0 only: `b · updateSecondsPerByte`.
 * - `allreduce` mode: `reduce g` is a ring all-reduce, `2·(N−1)/N · b/bandwidth + 2·(N−1)·latency`,
 *   plus the additions, `(N−1)/N · b / memoryBandwidth` (each device sums 1/N of the buffer N−1
 *   times); the ring uses each device's own link, so topology does not apply. `update g` runs on
 *   every device; `broadcast g` is a no-op of zero length.
 * - With `pipelineChunkBytes` (how the MPI runtime exchanges), a plan's adjacent `reduce g; update g`
 *   (`; broadcast g`) run as one pipeline of chunks: chunk k is averaged and updated while chunk
 *   k + 1 arrives, and (master) sent back while later chunks arrive, on the other direction of a
 *   full-duplex link. Three resources work side by side — the inbound link (`(N−1)·chunk` bytes:
 *   the master gathers, or every device all-gathers), the CPU (the chunk's sum and update) and the
 *   outbound link (master: the chunk's parameters to N−1 peers) — so the fused action takes
 *   `latency + in + cpu + out + (chunks − 1) · max(in, cpu, out)` and the update and broadcast
 *   actions take no time of their own. A `reduce g` that its update does not follow (`sequential`
 *   reduces every group first) is the same pipeline without the update and the way back, as the
 *   runtime runs it: each chunk is summed while the next arrives.
 * - With one device nothing is transferred: reduce and broadcast take zero time.
 * - Hybrid plans (`Plan.sharded`; see {@link hybridTraffic}): the unsharded (body) groups are priced
 *   as above. A sharded layer's compute stays its per-device time (the full batch's FLOPs / N). Its
 *   activations travel on the compute lane, on the critical path (the next layer waits for them):
 *   `forward` adds an all-gather of the body output and of every sharded layer with parameters'
 *   output (the logits too); `backward g` adds a reduce-scatter of each such layer's input gradient.
 *   Each device receives `(N−1)·x` bytes for an activation of `x` bytes at the per-device batch
 *   (`outputBytes`), as N−1 messages: `shared`, one after another, `(N−1)·(latency + x/bandwidth)`
 *   (also a ring's cost); `star`, side by side, `latency + x/bandwidth`; each also costs
 *   `handoffSeconds` once, the runtime handing the activation over and back; a reduce-scatter also sums
 *   `(N−1)·x` bytes, `(N−1)·x / memoryBandwidth`. Both modes alike (no master). `update g` of a
 *   sharded group runs on every device, on its 1/N slice: `bytes/N · updateSecondsPerByte`; it is
 *   never reduced or broadcast.
 * - An action starts when every action it depends on (`dependenciesOf`) has finished on every device, and
 *   a collective (reduce, broadcast) occupies the communication lane of every device for its whole
 *   length, as a blocking collective call does.
 *
 * Hidden communication is defined as in the trace recorder: the length of time during which some
 * device communicates while some device computes; `commSeconds` is the length of time during which
 * some device communicates.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { type Interval, measure, overlapLength } from "../runtime/intervals.ts";
import {
  type ActionKind,
  dependenciesOf,
  isSharded,
  type Lane,
  type Plan,
  type ReductionMode,
} from "../plan/plan.ts";
import { checkProfile, groupTimes, type Profile } from "./profile.ts";
import { validatePlan } from "../plan/validate.ts";

import { type Link, pipelineChunkBytes } from "../runtime/exchange/link.ts";
export type { Link };

/**
 * How the master's links are laid out (see the module notes).
 *
 * @example
 * ```ts
 * import type { Topology } from "./simulator.ts";
 * const nvswitch: Topology = "star";
 * ```
 */
export type Topology = "star" | "shared";

/**
 * Everything that prices communication and updates.
 *
 * @example
 * ```ts
 * import type { CostOptions } from "./simulator.ts";
 * const costs: CostOptions = {
 *   link: { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 },
 *   devices: 4,
 *   mode: "master",
 *   topology: "shared",
 * };
 * ```
 */
export interface CostOptions {
  /** The link between devices. */
  readonly link: Link;
  /** Number of devices, ≥ 1. */
  readonly devices: number;
  /** How gradients are combined. */
  readonly mode: ReductionMode;
  /** Master-mode link layout; default `shared`. */
  readonly topology?: Topology;
  /** Bytes per second of a device's elementwise add (gradient sums); default 200e9. */
  readonly memoryBandwidthBytesPerSecond?: number;
  /**
   * Seconds per parameter byte of the optimizer update. Default `5 / memoryBandwidth`: SGD with
   * momentum reads parameter, gradient and momentum and writes parameter and momentum.
   */
  readonly updateSecondsPerByte?: number;
  /**
   * Where set, adjacent reduce, update (and broadcast) of a group run as one pipeline of chunks of
   * at most this many bytes, cut as the MPI runtime cuts them (`pipelineChunkBytes` in
   * `runtime/link.ts`; see the module notes); default: blocking actions.
   */
  readonly pipelineChunkBytes?: number;
  /**
   * Seconds a hybrid plan's runtime spends handing each activation collective over: from the
   * device's compute to the collective and back to the device (two messages between a device
   * Worker and the runtime's thread), added to every activation all-gather and reduce-scatter;
   * default 0. Measured on 2 namespaces of one 2-core machine: 0.25–0.51 ms (quartiles), seven
   * times per AlexNet-like step.
   */
  readonly handoffSeconds?: number;
}

/**
 * Default memory bandwidth of {@link CostOptions}: 200 GB/s, a mid-range accelerator's add rate.
 *
 * @example
 * ```ts
 * import { DEFAULT_MEMORY_BANDWIDTH } from "./simulator.ts";
 * console.log(DEFAULT_MEMORY_BANDWIDTH / 1e9, "GB/s"); // 200 GB/s
 * ```
 */
export const DEFAULT_MEMORY_BANDWIDTH = 200e9;

/**
 * Options of {@link simulate}.
 *
 * @example
 * ```ts
 * import type { SimulateOptions } from "./simulator.ts";
 * const options: SimulateOptions = { link: { bandwidthBytesPerSecond: 1.2e9, latencySeconds: 5e-5 }, devices: 2, mode: "allreduce" };
 * ```
 */
export type SimulateOptions = CostOptions;

/**
 * One action as it ran on one device's lane.
 *
 * @example
 * ```ts
 * import type { LaneEntry } from "./simulator.ts";
 * const length = (e: LaneEntry) => e.end - e.start;
 * ```
 */
export interface LaneEntry {
  /** Index into `plan.actions`. */
  readonly action: number;
  /** What it did. */
  readonly kind: ActionKind;
  /** The group, `undefined` for forward. */
  readonly group?: string;
  /** Seconds from the iteration's start. */
  readonly start: number;
  /** Seconds from the iteration's start. */
  readonly end: number;
}

/**
 * Predicted communication for one group.
 *
 * @example
 * ```ts
 * import type { GroupCommunication } from "./simulator.ts";
 * const exposed = (g: GroupCommunication) => g.commSeconds - g.hiddenCommSeconds;
 * ```
 */
export interface GroupCommunication {
  /** Length of time during which the group's actions on the communication lane run. */
  readonly commSeconds: number;
  /** The part of it during which some device computes. */
  readonly hiddenCommSeconds: number;
}

/**
 * The predicted timeline of one iteration.
 *
 * @example
 * ```ts
 * import type { Simulation } from "./simulator.ts";
 * const exposedSeconds = (s: Simulation) => s.commSeconds - s.hiddenCommSeconds;
 * ```
 */
export interface Simulation {
  /** The plan's name. */
  readonly plan: string;
  /** Seconds from the start of forward to the end of the last action. */
  readonly stepSeconds: number;
  /** Per device, the actions on each lane in start order. */
  readonly lanes: readonly { readonly compute: readonly LaneEntry[]; readonly comm: readonly LaneEntry[] }[];
  /** Length of time during which some device communicates (or updates, on the comm lane). */
  readonly commSeconds: number;
  /** The part of `commSeconds` during which some device computes. */
  readonly hiddenCommSeconds: number;
  /** `hiddenCommSeconds / commSeconds`, 0 when there is no communication. */
  readonly hiddenFraction: number;
  /** Length of time during which some device computes. */
  readonly computeSeconds: number;
  /** The same communication figures per group. */
  readonly groups: Readonly<Record<string, GroupCommunication>>;
  /**
   * For a hybrid plan, its activation traffic per step (bytes and seconds; the seconds are inside
   * `forward` and the sharded `backward` actions, so in `computeSeconds`, not `commSeconds`); absent
   * for data-parallel plans.
   */
  readonly hybrid?: HybridTraffic;
}

/**
 * One activation collective of a hybrid plan, per step, as seen by one device.
 *
 * @example
 * ```ts
 * import type { ActivationTransfer } from "./simulator.ts";
 * const label = (t: ActivationTransfer) => `${t.kind} ${t.layer}: ${t.bytes} B in ${t.seconds} s`;
 * ```
 */
export interface ActivationTransfer {
  /** `all-gather` (forward: a layer's output) or `reduce-scatter` (backward: a layer's input gradient). */
  readonly kind: "all-gather" | "reduce-scatter";
  /**
   * The layer whose output is all-gathered (the body's last layer, then each sharded layer with
   * parameters), or the sharded layer whose input gradient is reduce-scattered.
   */
  readonly layer: string;
  /** The plan action that carries it: `forward`, or the `backward` of this sharded group. */
  readonly action: "forward" | `backward ${string}`;
  /** Bytes of one device's piece: the activation at the per-device batch. */
  readonly pieceBytes: number;
  /** Bytes each device receives, `(N−1) · pieceBytes`. */
  readonly bytes: number;
  /** Seconds it adds to its action on the compute lane. */
  readonly seconds: number;
}

/**
 * What a hybrid plan's model-parallel groups move and cost per step (see {@link hybridTraffic}).
 *
 * @example
 * ```ts
 * import type { HybridTraffic } from "./simulator.ts";
 * const mb = (t: HybridTraffic) => `${(t.bytes / 1e6).toFixed(1)} MB of activations per device per step`;
 * ```
 */
export interface HybridTraffic {
  /** The sharded groups, backward order. */
  readonly sharded: readonly string[];
  /** Every collective, forward then backward, in the order they run. */
  readonly transfers: readonly ActivationTransfer[];
  /** Bytes each device receives in the forward all-gathers. */
  readonly allGatherBytes: number;
  /** Bytes each device receives in the backward reduce-scatters. */
  readonly reduceScatterBytes: number;
  /** `allGatherBytes + reduceScatterBytes`: one device's activation traffic per step. */
  readonly bytes: number;
  /** Seconds the all-gathers add to `forward`. */
  readonly allGatherSeconds: number;
  /** Seconds the reduce-scatters add to the sharded `backward` actions. */
  readonly reduceScatterSeconds: number;
  /** Parameter bytes each device updates per sharded group: 1/N of the group's. */
  readonly updateBytes: Readonly<Record<string, number>>;
}

function checkCostOptions(options: CostOptions, where: string): Required<CostOptions> {
  const { link, devices, mode } = options;
  const fail: (message: string) => never = (message) => {
    throw new ValueError(where, message);
  };
  if (!Number.isInteger(devices) || devices < 1) fail(`devices must be an integer >= 1, got ${devices}`);
  if (mode !== "master" && mode !== "allreduce") fail(`mode must be "master" or "allreduce", got ${mode}`);
  if (!(link?.bandwidthBytesPerSecond > 0)) {
    fail(`link.bandwidthBytesPerSecond must be > 0, got ${link?.bandwidthBytesPerSecond}`);
  }
  if (!(link.latencySeconds >= 0) || !Number.isFinite(link.latencySeconds)) {
    fail(`link.latencySeconds must be a finite number >= 0, got ${link.latencySeconds}`);
  }
  const topology = options.topology ?? "shared";
  if (topology !== "star" && topology !== "shared") {
    fail(`topology must be "star" or "shared", got ${topology}`);
  }
  const memory = options.memoryBandwidthBytesPerSecond ?? DEFAULT_MEMORY_BANDWIDTH;
  if (!(memory > 0)) fail(`memoryBandwidthBytesPerSecond must be > 0, got ${memory}`);
  const update = options.updateSecondsPerByte ?? 5 / memory;
  if (!(update >= 0) || !Number.isFinite(update)) {
    fail(`updateSecondsPerByte must be finite and >= 0, got ${update}`);
  }
  const chunk = options.pipelineChunkBytes ?? 0;
  if (!(chunk >= 0) || !Number.isFinite(chunk)) {
    fail(`pipelineChunkBytes must be a finite number >= 0, got ${chunk}`);
  }
  const handoff = options.handoffSeconds ?? 0;
  if (!(handoff >= 0) || !Number.isFinite(handoff)) {
    fail(`handoffSeconds must be a finite number >= 0, got ${handoff}`);
  }
  return {
    link,
    devices,
    mode,
    topology,
    memoryBandwidthBytesPerSecond: memory,
    updateSecondsPerByte: update,
    pipelineChunkBytes: chunk,
    handoffSeconds: handoff,
  };
}

/**
 * Seconds of a group's pipelined `reduce` of `bytes` parameter bytes, with its `update` and (master
 * mode) its `broadcast` where `stages` says they follow it (see the module notes);
 * `options.pipelineChunkBytes` must be set.
 *
 * @example
 * ```ts
 * import { pipelineSeconds } from "./simulator.ts";
 * const link = { bandwidthBytesPerSecond: 125e6, latencySeconds: 5e-5 }; // 1 Gbit/s
 * // AlexNet's FC gradients, 2 hosts, master mode, 1 MiB chunks: about one transfer, not two.
 * const options = { link, devices: 2, mode: "master", pipelineChunkBytes: 1 << 20 } as const;
 * pipelineSeconds(234_524_576, { update: true, broadcast: true }, options);
 * ```
 */
export function pipelineSeconds(
  bytes: number,
  stages: { readonly update: boolean; readonly broadcast: boolean },
  options: CostOptions,
): number {
  const o = checkCostOptions(options, "pipelineSeconds");
  const n = o.devices;
  if (!(o.pipelineChunkBytes > 0)) throw new ValueError("pipelineSeconds", "pipelineChunkBytes is not set");
  if (bytes <= 0) return 0;
  // The runtime's chunks for this group (a 32nd of it, within bounds), as the MPI exchange cuts them.
  const chunk = Math.min(pipelineChunkBytes(bytes, o.pipelineChunkBytes), bytes);
  const chunks = Math.ceil(bytes / chunk);
  const peers = o.topology === "shared" || o.mode === "allreduce" ? n - 1 : 1;
  const inbound = peers * chunk / o.link.bandwidthBytesPerSecond;
  const cpu = (n - 1) * chunk / o.memoryBandwidthBytesPerSecond +
    (stages.update ? chunk * o.updateSecondsPerByte : 0);
  const outbound = stages.update && stages.broadcast && o.mode === "master" ? inbound : 0;
  return o.link.latencySeconds + inbound + cpu + outbound + (chunks - 1) * Math.max(inbound, cpu, outbound);
}

/**
 * Seconds one communication-lane action takes for a group of `bytes` parameter bytes.
 *
 * @example
 * ```ts
 * import { commActionSeconds } from "./simulator.ts";
 * const link = { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 };
 * // fc6..fc8 of AlexNet (234.5 MB) reduced over PCIe 3 between 4 GPUs by ring all-reduce:
 * console.log(commActionSeconds("reduce", 234_524_576, { link, devices: 4, mode: "allreduce" }));
 * ```
 */
export function commActionSeconds(
  kind: "reduce" | "update" | "broadcast",
  bytes: number,
  options: CostOptions,
): number {
  const o = checkCostOptions(options, "commActionSeconds");
  const n = o.devices;
  const transfer = o.link.latencySeconds + bytes / o.link.bandwidthBytesPerSecond;
  const gather = o.topology === "shared" ? (n - 1) * transfer : transfer;
  if (kind === "update") return bytes * o.updateSecondsPerByte;
  if (n === 1) return 0;
  if (o.mode === "master") {
    return kind === "reduce" ? gather + (bytes * (n - 1)) / o.memoryBandwidthBytesPerSecond : gather;
  }
  if (kind === "broadcast") return 0;
  return (2 * (n - 1) / n) * bytes / o.link.bandwidthBytesPerSecond + 2 * (n - 1) * o.link.latencySeconds +
    ((n - 1) / n) * bytes / o.memoryBandwidthBytesPerSecond;
}

/**
 * Seconds one activation collective of a hybrid plan takes for one device's piece of `pieceBytes`
 * (see the module notes): N−1 messages of `pieceBytes`, one after another through a `shared` link or
 * side by side in a `star`, the runtime's `handoffSeconds`, plus, for a reduce-scatter, the sums of
 * `(N−1)·pieceBytes`. The same in
 * both modes; zero with one device.
 *
 * @example
 * ```ts
 * import { activationCollectiveSeconds } from "./simulator.ts";
 * const link = { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 };
 * // AlexNet's pool5 output at 128 samples per device (4.7 MB), all-gathered among 4 devices:
 * console.log(activationCollectiveSeconds("all-gather", 4 * 128 * 9216, { link, devices: 4, mode: "master" }));
 * ```
 */
export function activationCollectiveSeconds(
  kind: "all-gather" | "reduce-scatter",
  pieceBytes: number,
  options: CostOptions,
): number {
  const o = checkCostOptions(options, "activationCollectiveSeconds");
  const n = o.devices;
  if (n === 1) return 0;
  const message = o.link.latencySeconds + pieceBytes / o.link.bandwidthBytesPerSecond;
  const transfers = o.handoffSeconds + (o.topology === "star" ? message : (n - 1) * message);
  return kind === "all-gather"
    ? transfers
    : transfers + (n - 1) * pieceBytes / o.memoryBandwidthBytesPerSecond;
}

/**
 * The activation traffic of a hybrid plan that shards `sharded` (groups of the profile, its output
 * side) on `options.devices` devices: the layers with parameters in those groups are the sharded
 * (fully-connected) layers. Forward all-gathers the output of the layer before the first of them
 * (the body output) and each one's output; backward reduce-scatters each one's input gradient (the
 * output of the layer before it). Each costs {@link activationCollectiveSeconds} of its per-device
 * piece, the layer's `outputBytes`; parameter-free layers in between (ReLU, dropout) add nothing.
 *
 * Throws a `ValueError` when the profile cannot price it: a sharded group the profile lacks, sharded
 * groups that are not the profile's output side, no layer with parameters in them or none before
 * them, a sharded layer of a known kind other than `Linear`, or `outputBytes` missing where needed.
 *
 * @example
 * ```ts
 * import { hybridTraffic } from "./simulator.ts";
 * const traffic = hybridTraffic({
 *   batchSize: 2,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 1, backwardSeconds: 2, parameterBytes: 40, outputBytes: 80 },
 *     { name: "fc", group: "fc", forwardSeconds: 1, backwardSeconds: 2, parameterBytes: 4000, outputBytes: 8 },
 *   ],
 * }, ["fc"], { link: { bandwidthBytesPerSecond: 100, latencySeconds: 0 }, devices: 2, mode: "master" });
 * console.log(traffic.bytes); // 168: all-gathers 80 + 8, reduce-scatter 80; not the 4000 parameter bytes
 * ```
 */
export function hybridTraffic(
  profile: Profile,
  sharded: readonly string[],
  options: CostOptions,
): HybridTraffic {
  const o = checkCostOptions(options, "hybridTraffic");
  checkProfile(profile);
  const fail: (message: string) => never = (message) => {
    throw new ValueError("hybridTraffic", message);
  };
  const layers = profile.layers;
  const mine = new Set(sharded);
  const unknown = sharded.filter((g) => !layers.some((l) => l.group === g));
  if (sharded.length === 0) fail("no group is sharded");
  if (unknown.length > 0) fail(`sharded groups ${unknown.join(", ")} are not in the profile`);
  const first = layers.findIndex((l) => mine.has(l.group));
  if (layers.slice(first).some((l) => !mine.has(l.group))) {
    fail(
      `sharded groups ${sharded.join(", ")} must be the profile's output side, but layer ${
        layers.slice(first).find((l) => !mine.has(l.group))!.name
      } of an unsharded group comes after them`,
    );
  }
  const fc = layers.map((l, i) => (mine.has(l.group) && l.parameterBytes > 0 ? i : -1)).filter((i) => i >= 0);
  if (fc.length === 0) fail(`sharded groups ${sharded.join(", ")} have no layer with parameters to shard`);
  if (fc[0] === 0) fail(`no layer comes before ${layers[0].name}, so there is no data-parallel body`);
  const notLinear = fc.map((i) => layers[i]).find((l) => l.kind !== undefined && l.kind !== "Linear");
  if (notLinear !== undefined) {
    fail(
      `hybrid plans shard fully-connected layers only, but ${notLinear.name} (${notLinear.kind}) is in sharded group ${notLinear.group}`,
    );
  }
  const needed = [...new Set(fc.flatMap((i) => [i - 1, i]))].sort((a, b) => a - b);
  const missing = needed.filter((i) => layers[i].outputBytes === undefined).map((i) => layers[i].name);
  if (missing.length > 0) {
    fail(
      `the profile lacks outputBytes (activation bytes at the per-device batch) for ${
        missing.join(", ")
      }, which a hybrid plan's all-gathers and reduce-scatters move; measure it with measureProfile, which records them`,
    );
  }
  const transfers: ActivationTransfer[] = [];
  const add = (kind: ActivationTransfer["kind"], index: number, action: ActivationTransfer["action"]) => {
    const pieceBytes = layers[index].outputBytes!;
    transfers.push({
      kind,
      layer: layers[kind === "all-gather" ? index : index + 1].name,
      action,
      pieceBytes,
      bytes: (o.devices - 1) * pieceBytes,
      seconds: activationCollectiveSeconds(kind, pieceBytes, o),
    });
  };
  // Forward: the body output (the input of the first sharded layer), then every sharded layer's output.
  add("all-gather", fc[0] - 1, "forward");
  for (const i of fc) add("all-gather", i, "forward");
  // Backward, output side first: each sharded layer's input gradient (the output of the layer before it).
  for (const i of [...fc].reverse()) add("reduce-scatter", i - 1, `backward ${layers[i].group}`);
  const sum = (kind: ActivationTransfer["kind"], field: "bytes" | "seconds") =>
    transfers.filter((t) => t.kind === kind).reduce((s, t) => s + t[field], 0);
  const updateBytes: Record<string, number> = {};
  for (const group of sharded) {
    updateBytes[group] = layers.filter((l) => l.group === group).reduce((s, l) => s + l.parameterBytes, 0) /
      o.devices;
  }
  return {
    sharded: [...sharded],
    transfers,
    allGatherBytes: sum("all-gather", "bytes"),
    reduceScatterBytes: sum("reduce-scatter", "bytes"),
    bytes: sum("all-gather", "bytes") + sum("reduce-scatter", "bytes"),
    allGatherSeconds: sum("all-gather", "seconds"),
    reduceScatterSeconds: sum("reduce-scatter", "seconds"),
    updateBytes,
  };
}

/**
 * Predicts one iteration of `plan` on `options.devices` devices (see the module notes for the
 * model). The plan is validated first; its groups must all appear in the profile. A hybrid plan
 * also needs the profile's `outputBytes` (see {@link hybridTraffic}).
 *
 * @example
 * ```ts
 * import { overlapPlan, sequentialPlan } from "../plan/builtins.ts";
 * import { simulate } from "./simulator.ts";
 * const profile = {
 *   batchSize: 32,
 *   layers: [
 *     { name: "conv", group: "conv", forwardSeconds: 0.05, backwardSeconds: 0.1, parameterBytes: 1e6 },
 *     { name: "fc", group: "fc", forwardSeconds: 0.005, backwardSeconds: 0.01, parameterBytes: 1e8 },
 *   ],
 * };
 * const options = { link: { bandwidthBytesPerSecond: 12e9, latencySeconds: 1e-5 }, devices: 2, mode: "master" } as const;
 * const a = simulate(sequentialPlan(["fc", "conv"]), profile, options);
 * const b = simulate(overlapPlan(["fc", "conv"]), profile, options);
 * console.log(a.stepSeconds > b.stepSeconds, b.hiddenFraction);
 * ```
 */
export function simulate(plan: Plan, profile: Profile, options: SimulateOptions): Simulation {
  const o = checkCostOptions(options, "simulate");
  validatePlan(plan, { mode: o.mode });
  const totals = new Map(groupTimes(profile).map((t) => [t.group, t]));
  const missing = plan.groups.filter((g) => !totals.has(g));
  if (missing.length > 0) {
    throw new ValueError(
      "simulate",
      `plan ${plan.name} has groups ${missing.join(", ")} that the profile lacks; profile groups are ${
        [...totals.keys()].join(", ")
      }`,
    );
  }
  const extra = [...totals.keys()].filter((g) => !plan.groups.includes(g));
  if (extra.length > 0) {
    throw new ValueError("simulate", `profile groups ${extra.join(", ")} are not in plan ${plan.name}`);
  }

  const hybrid = (plan.sharded ?? []).length > 0 ? hybridTraffic(profile, plan.sharded!, o) : undefined;
  /** Seconds of activation collectives inside each compute action, by its label (`forward`, `backward fc`). */
  const collectives = new Map<string, number>();
  for (const t of hybrid?.transfers ?? []) {
    collectives.set(t.action, (collectives.get(t.action) ?? 0) + t.seconds);
  }
  const forwardSeconds = profile.layers.reduce((sum, l) => sum + l.forwardSeconds, 0) +
    (collectives.get("forward") ?? 0);
  const lanes = Array.from(
    { length: o.devices },
    () => ({ compute: [] as LaneEntry[], comm: [] as LaneEntry[] }),
  );
  const done: number[] = [];
  const same = (index: number, kind: ActionKind, group: string | undefined) =>
    plan.actions[index]?.kind === kind && plan.actions[index]?.group === group;
  /** Actions that a pipeline before them already covers: they take no time of their own. */
  const fused = new Set<number>();
  plan.actions.forEach((action, index) => {
    const start = Math.max(0, ...dependenciesOf(plan, index).map((j) => done[j]));
    const group = action.group === undefined ? undefined : totals.get(action.group)!;
    // Under the MPI runtime's chunks every reduce is a pipeline; its update (and broadcast) join it
    // where they follow it.
    const pipelined = o.pipelineChunkBytes > 0 && o.devices > 1 && action.kind === "reduce";
    const update = pipelined && same(index + 1, "update", action.group);
    const broadcast = update && same(index + 2, "broadcast", action.group);
    if (update) fused.add(index + 1);
    if (broadcast) fused.add(index + 2);
    const seconds = fused.has(index)
      ? 0
      : pipelined
      ? pipelineSeconds(group!.parameterBytes, { update, broadcast }, o)
      : action.kind === "forward"
      ? forwardSeconds
      : action.kind === "backward"
      ? group!.backwardSeconds + (collectives.get(`backward ${action.group}`) ?? 0)
      : action.kind === "update" && isSharded(plan, action.group)
      ? hybrid!.updateBytes[action.group!] * o.updateSecondsPerByte
      : commActionSeconds(action.kind, group!.parameterBytes, o);
    done[index] = start + seconds;
    // In master mode only device 0 updates (a sharded group's slices: every device); everything else
    // runs (or waits in the collective) everywhere.
    const devices = action.kind === "update" && o.mode === "master" && !isSharded(plan, action.group)
      ? 1
      : o.devices;
    const lane: Lane = action.lane;
    for (let d = 0; d < devices; d++) {
      lanes[d][lane].push({ action: index, kind: action.kind, group: action.group, start, end: done[index] });
    }
  });

  const computeIntervals: Interval[] = lanes.flatMap((l) => l.compute);
  const commIntervals: Interval[] = lanes.flatMap((l) => l.comm);
  const commSeconds = measure(commIntervals);
  const hiddenCommSeconds = overlapLength(commIntervals, computeIntervals);
  const groups: Record<string, GroupCommunication> = {};
  for (const g of plan.groups) {
    const mine = lanes.flatMap((l) => l.comm.filter((e) => e.group === g));
    groups[g] = { commSeconds: measure(mine), hiddenCommSeconds: overlapLength(mine, computeIntervals) };
  }
  return {
    plan: plan.name,
    stepSeconds: Math.max(0, ...done),
    lanes,
    commSeconds,
    hiddenCommSeconds,
    hiddenFraction: commSeconds > 0 ? hiddenCommSeconds / commSeconds : 0,
    computeSeconds: measure(computeIntervals),
    groups,
    ...(hybrid === undefined ? {} : { hybrid }),
  };
}
