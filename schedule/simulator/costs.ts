/**
 * What each action of a plan costs, the simulator's price list: transfers over a link, the sums and
 * updates on a device's CPU, the MPI runtime's pipelined exchange, and a hybrid plan's activation
 * collectives. `simulator.ts` lays these out on a timeline.
 *
 * Model (all devices are identical and hold the same share of the batch):
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
 * - With `pipelineChunkBytes` (how the MPI runtime exchanges), a group's `reduce` runs as a pipeline
 *   of chunks ({@link pipelineSeconds}): each chunk is summed while the next arrives and, where the
 *   plan's update (and broadcast) follow the reduce, also updated and (master) sent back while later
 *   chunks arrive, on the other direction of a full-duplex link. Three resources work side by side —
 *   the inbound link (`(N−1)·chunk` bytes: the master gathers, or every device all-gathers), the CPU
 *   (the chunk's sum and update) and the outbound link (master: the chunk's parameters to N−1 peers)
 *   — so with equal chunks it takes `latency + in + cpu + out + (chunks − 1) · max(in, cpu, out)`;
 *   the runtime's last chunk holds what is left of the group, and is priced by its size.
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
 * - Where a runtime undoes failed steps (`undo`), an update that may still be followed by a failure
 *   also saves its group's parameters and optimizer state (`plan/undo.ts` says which), and with
 *   finite checks (`checkSecondsPerByte`) every update is followed by a scan of what it wrote; both
 *   run where the update runs and add to its length.
 * - Where one direction alone runs faster than both at once (`oneWayBandwidthBytesPerSecond`, a link
 *   whose hosts' CPU sets its rate), master mode's gathers and broadcasts outside a pipeline that
 *   carries both directions run at that rate.
 * - Where transfers take CPU from compute (`commCpuShare`, a host's network stack on the cores that
 *   compute), a compute action runs at `1 − commCpuShare` of its speed while a reduce or broadcast is
 *   on the wire beside it.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { checkProfile, type Profile } from "./profile.ts";
import type { ReductionMode } from "../plan/plan.ts";
import type { UndoRule } from "../plan/undo.ts";
import { type Link, pipelineChunkBytes } from "../runtime/exchange/link.ts";
export type { Link };

/**
 * How the master's links are laid out (see the module notes).
 *
 * @example
 * ```ts
 * import type { Topology } from "./costs.ts";
 * const nvswitch: Topology = "star";
 * ```
 */
export type Topology = "star" | "shared";

/**
 * Everything that prices communication and updates.
 *
 * @example
 * ```ts
 * import type { CostOptions } from "./costs.ts";
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
   * Where set, a group's reduce (with its update and broadcast where they follow it) runs as one
   * pipeline of chunks of at most this many bytes, cut as the MPI runtime cuts them
   * (`pipelineChunkBytes` in `runtime/exchange/link.ts`; see the module notes); default: blocking
   * actions.
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
  /**
   * Seconds per parameter byte of the finite check that follows every update (the runtime's
   * `checkFinite`, on by default: the updated group's parameters scanned for NaN and ±∞, on the
   * thread that updates); default 0. Not priced inside pipelines (`pipelineChunkBytes`).
   */
  readonly checkSecondsPerByte?: number;
  /**
   * Where set, every update that `undoableUpdates` (`plan/undo.ts`) names under `rule` also saves
   * the group's parameters and optimizer state for the undo of a failed step, which takes
   * `secondsPerByte` per parameter byte beyond the update (the CPU backend writes the copies in the
   * update's own pass); default: no update saves. Not priced inside pipelines.
   */
  readonly undo?: { readonly rule: UndoRule; readonly secondsPerByte: number };
  /**
   * The share of a device's compute speed that its transfers take, in [0, 1): while a reduce or
   * broadcast is on the wire, compute beside it runs at `1 − commCpuShare` of its speed; default 0.
   * A host's network stack (copies, TCP, a software switch) and the runtime run on the cores that
   * compute: measured as the cores an exchange alone keeps busy beyond compute, over the cores the
   * devices compute on (`bench:cluster` measures it on its probes).
   */
  readonly commCpuShare?: number;
  /**
   * Bytes per second of a transfer while the other direction of the link is idle, where that differs
   * from `link.bandwidthBytesPerSecond` (the rate per direction with both busy): a link whose hosts'
   * CPU, not the wire, sets the rate carries one direction faster than two. Prices master mode's
   * gathers and broadcasts outside a pipeline that carries both (`reduce g; update g; broadcast g`);
   * default the link's rate.
   */
  readonly oneWayBandwidthBytesPerSecond?: number;
  /**
   * Master mode: the master reads the peers' gradients where they lie (devices sharing its memory,
   * no emulated link), so a reduce is the average alone and only the broadcast moves bytes; default
   * false.
   */
  readonly gatherInPlace?: boolean;
}

/**
 * Default memory bandwidth of {@link CostOptions}: 200 GB/s, a mid-range accelerator's add rate.
 *
 * @example
 * ```ts
 * import { DEFAULT_MEMORY_BANDWIDTH } from "./costs.ts";
 * console.log(DEFAULT_MEMORY_BANDWIDTH / 1e9, "GB/s"); // 200 GB/s
 * ```
 */
export const DEFAULT_MEMORY_BANDWIDTH = 200e9;

/**
 * One activation collective of a hybrid plan, per step, as seen by one device.
 *
 * @example
 * ```ts
 * import type { ActivationTransfer } from "./costs.ts";
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
 * import type { HybridTraffic } from "./costs.ts";
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

export function checkCostOptions(options: CostOptions, where: string): Required<CostOptions> {
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
  const check = options.checkSecondsPerByte ?? 0;
  if (!(check >= 0) || !Number.isFinite(check)) {
    fail(`checkSecondsPerByte must be a finite number >= 0, got ${check}`);
  }
  const undo = options.undo ?? NO_UNDO;
  if (!(undo.secondsPerByte >= 0) || !Number.isFinite(undo.secondsPerByte)) {
    fail(`undo.secondsPerByte must be a finite number >= 0, got ${undo.secondsPerByte}`);
  }
  const flags = ["rollsBack", "transfersCanFail", "checkFinite"] as const;
  if (flags.some((f) => typeof undo.rule?.[f] !== "boolean")) {
    fail(`undo.rule must give ${flags.join(", ")} as booleans, got ${JSON.stringify(undo.rule)}`);
  }
  const oneWay = options.oneWayBandwidthBytesPerSecond ?? link.bandwidthBytesPerSecond;
  if (!(oneWay > 0) || !Number.isFinite(oneWay)) {
    fail(`oneWayBandwidthBytesPerSecond must be a finite number > 0, got ${oneWay}`);
  }
  const share = options.commCpuShare ?? 0;
  if (!(share >= 0 && share < 1)) fail(`commCpuShare must be a number in [0, 1), got ${share}`);
  const inPlace = options.gatherInPlace ?? false;
  if (typeof inPlace !== "boolean") fail(`gatherInPlace must be a boolean, got ${JSON.stringify(inPlace)}`);
  return {
    link,
    devices,
    mode,
    topology,
    memoryBandwidthBytesPerSecond: memory,
    updateSecondsPerByte: update,
    pipelineChunkBytes: chunk,
    handoffSeconds: handoff,
    checkSecondsPerByte: check,
    undo,
    commCpuShare: share,
    oneWayBandwidthBytesPerSecond: oneWay,
    gatherInPlace: inPlace,
  };
}

/** No update copies: the default of {@link CostOptions.undo}. */
const NO_UNDO = {
  rule: { rollsBack: false, transfersCanFail: false, checkFinite: false },
  secondsPerByte: 0,
} as const;

/**
 * Seconds of a group's pipelined `reduce` of `bytes` parameter bytes, with its `update` and (master
 * mode) its `broadcast` where `stages` says they follow it (see the module notes);
 * `options.pipelineChunkBytes` must be set.
 *
 * @example
 * ```ts
 * import { pipelineSeconds } from "./costs.ts";
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
  // The runtime's chunks for this group, as the MPI exchange cuts them: in master mode a 32nd of
  // it within bounds, at least 1 ms on the link (the runtime's measured rate; here the link's), in
  // allreduce mode (nothing sent back) the maximum.
  const chunk = Math.min(
    pipelineChunkBytes(bytes, o.pipelineChunkBytes, o.mode, o.link.bandwidthBytesPerSecond),
    bytes,
  );
  const peers = o.topology === "shared" || o.mode === "allreduce" ? n - 1 : 1;
  // Both directions busy: an all-reduce, or a master pipeline that sends parameters back.
  const twoWay = o.mode === "allreduce" || (stages.update && stages.broadcast);
  const perByte = {
    inbound: peers / (twoWay ? o.link.bandwidthBytesPerSecond : o.oneWayBandwidthBytesPerSecond),
    cpu: (n - 1) / o.memoryBandwidthBytesPerSecond + (stages.update ? o.updateSecondsPerByte : 0),
    outbound: 0,
  };
  if (stages.update && stages.broadcast && o.mode === "master") perByte.outbound = perByte.inbound;
  // The three resources as a flow shop: each takes the chunks one at a time, in order, and a chunk
  // moves on once the resource before has finished it. Whole chunks, then the rest of the group as a
  // short last one, as the runtime cuts its messages: pricing that one whole put 7 ms too many on a
  // 2.4 MB bucket over 1 Gbit/s (2.3 chunks of 1 MiB priced as 3).
  let inbound = 0, cpu = 0, outbound = 0;
  for (let offset = 0; offset < bytes; offset += chunk) {
    const size = Math.min(chunk, bytes - offset);
    inbound += size * perByte.inbound;
    cpu = Math.max(cpu, inbound) + size * perByte.cpu;
    outbound = Math.max(outbound, cpu) + size * perByte.outbound;
  }
  return o.link.latencySeconds + outbound;
}

/**
 * Seconds one communication-lane action takes for a group of `bytes` parameter bytes.
 *
 * @example
 * ```ts
 * import { commActionSeconds } from "./costs.ts";
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
  // A master-mode gather or broadcast keeps one direction busy; an all-reduce both.
  const transfer = o.link.latencySeconds + bytes / o.oneWayBandwidthBytesPerSecond;
  const gather = o.topology === "shared" ? (n - 1) * transfer : transfer;
  if (kind === "update") return bytes * o.updateSecondsPerByte;
  if (n === 1) return 0;
  if (o.mode === "master") {
    if (kind === "broadcast") return gather;
    return (o.gatherInPlace ? 0 : gather) + (bytes * (n - 1)) / o.memoryBandwidthBytesPerSecond;
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
 * import { activationCollectiveSeconds } from "./costs.ts";
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
 * import { hybridTraffic } from "./costs.ts";
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
