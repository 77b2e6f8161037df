/**
 * What the simulator consumes and the runtime measures: per-layer forward and backward times,
 * parameter sizes and (optionally) output sizes and layer types for one device's share of the batch.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";

/**
 * One layer's cost on one device for one iteration.
 *
 * @example
 * ```ts
 * import type { LayerProfile } from "./profile.ts";
 * const fc6: LayerProfile = {
 *   name: "fc6",
 *   group: "fc",
 *   forwardSeconds: 0.005,
 *   backwardSeconds: 0.01,
 *   parameterBytes: 4 * 37_752_832,
 * };
 * ```
 */
export interface LayerProfile {
  /** Layer name, unique in the profile, e.g. `fc6`. */
  readonly name: string;
  /** The parameter group the layer belongs to, e.g. `fc` or `conv`. */
  readonly group: string;
  /** Seconds of forward computation. */
  readonly forwardSeconds: number;
  /** Seconds of backward computation (input and weight gradients). */
  readonly backwardSeconds: number;
  /** Bytes of parameters (and so of gradients), e.g. 4 × count for fp32. */
  readonly parameterBytes: number;
  /**
   * Bytes of the layer's output for the profile's per-device batch, fp32 (4 × batchSize × features
   * per sample). Optional; the simulator needs it to price hybrid plans, whose sharded layers
   * exchange activations (see `hybridTraffic`). `measureProfile` fills it in.
   *
   * @example
   * ```ts
   * import type { LayerProfile } from "./profile.ts";
   * // fc7 of AlexNet at 128 samples per device: 4096 outputs each.
   * const fc7: LayerProfile = {
   *   name: "fc7", group: "fc", forwardSeconds: 0.002, backwardSeconds: 0.004,
   *   parameterBytes: 4 * 16_781_312, outputBytes: 4 * 128 * 4096, kind: "Linear",
   * };
   * ```
   */
  readonly outputBytes?: number;
  /**
   * The layer's type (`Module.kind`, e.g. `Linear`, `Conv2d`, `ReLU`). Optional; it tells
   * `autoSchedule` which output-side layers are fully connected and so can be sharded by a hybrid
   * plan. `measureProfile` fills it in.
   *
   * @example
   * ```ts
   * import type { LayerProfile } from "./profile.ts";
   * const isFullyConnected = (l: LayerProfile) => l.kind === "Linear";
   * ```
   */
  readonly kind?: string;
}

/**
 * Per-layer costs of a network, layers in forward order (input side first).
 *
 * @example
 * ```ts
 * import type { Profile } from "./profile.ts";
 * const profile: Profile = {
 *   batchSize: 64,
 *   layers: [
 *     { name: "conv1", group: "conv", forwardSeconds: 0.02, backwardSeconds: 0.04, parameterBytes: 4e4 },
 *     { name: "fc1", group: "fc", forwardSeconds: 0.002, backwardSeconds: 0.004, parameterBytes: 4e6 },
 *   ],
 * };
 * ```
 */
export interface Profile {
  /** Layers in forward order. Each group's layers must be contiguous. */
  readonly layers: readonly LayerProfile[];
  /** Samples per device per iteration that the times were measured at. */
  readonly batchSize: number;
  /** How many devices the times were measured with, when known. */
  readonly deviceCount?: number;
  /** Where the numbers came from (machine, backend, date), for reports. */
  readonly description?: string;
}

/**
 * Sums over one group's layers.
 *
 * @example
 * ```ts
 * import { type GroupTime, groupTimes } from "./profile.ts";
 * const heaviest = (totals: GroupTime[]) => totals.reduce((a, b) => (a.parameterBytes >= b.parameterBytes ? a : b));
 * ```
 */
export interface GroupTime {
  /** The group. */
  readonly group: string;
  /** Its layers in forward order. */
  readonly layers: readonly string[];
  /** Σ forward seconds. */
  readonly forwardSeconds: number;
  /** Σ backward seconds. */
  readonly backwardSeconds: number;
  /** Σ parameter bytes. */
  readonly parameterBytes: number;
}

/**
 * Throws a `ValueError` naming the layer and field if `profile` is unusable: no layers, duplicate
 * names, negative or non-finite numbers (`outputBytes` too, where given), an empty `kind`, a group
 * named `all`, or a group whose layers are not contiguous (backward could then not be cut into one
 * segment per group).
 *
 * @example
 * ```ts
 * import { checkProfile } from "./profile.ts";
 * try {
 *   checkProfile({ batchSize: 1, layers: [] });
 * } catch (e) {
 *   console.log((e as Error).message); // profile: has no layers
 * }
 * ```
 */
export function checkProfile(profile: Profile): void {
  const fail: (message: string) => never = (message) => {
    throw new ValueError("profile", message);
  };
  if (!Number.isInteger(profile.batchSize) || profile.batchSize < 1) {
    fail(`batchSize must be a positive integer, got ${profile.batchSize}`);
  }
  if (profile.layers.length === 0) fail("has no layers");
  const names = new Set<string>();
  const closed = new Set<string>();
  let current: string | undefined;
  for (const layer of profile.layers) {
    if (names.has(layer.name)) fail(`layer ${layer.name} appears twice`);
    names.add(layer.name);
    if (typeof layer.group !== "string" || layer.group === "" || layer.group === "all") {
      fail(
        `layer ${layer.name} has group ${JSON.stringify(layer.group)}; groups are non-empty and not "all"`,
      );
    }
    for (const field of ["forwardSeconds", "backwardSeconds", "parameterBytes"] as const) {
      const value = layer[field];
      if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
        fail(`layer ${layer.name} has ${field} ${value}; expected a finite number >= 0`);
      }
    }
    const output = layer.outputBytes;
    if (output !== undefined && (typeof output !== "number" || !Number.isFinite(output) || output < 0)) {
      fail(`layer ${layer.name} has outputBytes ${output}; expected a finite number >= 0`);
    }
    if (layer.kind !== undefined && (typeof layer.kind !== "string" || layer.kind === "")) {
      fail(
        `layer ${layer.name} has kind ${JSON.stringify(layer.kind)}; expected a layer type such as "Linear"`,
      );
    }
    if (layer.group !== current) {
      if (closed.has(layer.group)) {
        fail(
          `group ${layer.group} is not contiguous: layer ${layer.name} comes after a layer of another group`,
        );
      }
      if (current !== undefined) closed.add(current);
      current = layer.group;
    }
  }
}

/**
 * Per-group sums in backward order (the group of the last layer first), the order `Plan.groups`
 * uses.
 *
 * @example
 * ```ts
 * import { groupTimes } from "./profile.ts";
 * const totals = groupTimes({
 *   batchSize: 1,
 *   layers: [
 *     { name: "c", group: "conv", forwardSeconds: 2, backwardSeconds: 4, parameterBytes: 10 },
 *     { name: "f", group: "fc", forwardSeconds: 1, backwardSeconds: 1, parameterBytes: 100 },
 *   ],
 * });
 * console.log(totals.map((t) => t.group)); // ["fc", "conv"]
 * ```
 */
export function groupTimes(profile: Profile): GroupTime[] {
  checkProfile(profile);
  const byGroup = new Map<
    string,
    { layers: string[]; forwardSeconds: number; backwardSeconds: number; parameterBytes: number }
  >();
  for (const layer of profile.layers) {
    let total = byGroup.get(layer.group);
    if (total === undefined) {
      total = { layers: [], forwardSeconds: 0, backwardSeconds: 0, parameterBytes: 0 };
      byGroup.set(layer.group, total);
    }
    total.layers.push(layer.name);
    total.forwardSeconds += layer.forwardSeconds;
    total.backwardSeconds += layer.backwardSeconds;
    total.parameterBytes += layer.parameterBytes;
  }
  return [...byGroup].reverse().map(([group, total]) => ({ group, ...total }));
}

/**
 * The profile with each layer's group replaced by `assignment[layer.name]` (layers not named keep
 * their group), e.g. to price a different FC/conv boundary.
 *
 * @example
 * ```ts
 * import { regroupProfile } from "./profile.ts";
 * const p = regroupProfile({
 *   batchSize: 1,
 *   layers: [{ name: "a", group: "x", forwardSeconds: 1, backwardSeconds: 1, parameterBytes: 4 }],
 * }, { a: "y" });
 * console.log(p.layers[0].group); // y
 * ```
 */
export function regroupProfile(profile: Profile, assignment: Readonly<Record<string, string>>): Profile {
  const regrouped = {
    ...profile,
    layers: profile.layers.map((l) => ({
      ...l,
      group: Object.hasOwn(assignment, l.name) ? assignment[l.name] : l.group,
    })),
  };
  checkProfile(regrouped);
  return regrouped;
}

/** Measured totals a profile is scaled to: forward seconds, and backward seconds per group. */
export interface ProfileTargets {
  /** Σ forward seconds the devices actually took. */
  readonly forwardSeconds: number;
  /** Backward seconds per group the devices actually took. */
  readonly backwardSeconds: Readonly<Record<string, number>>;
}

/**
 * Scales a per-layer profile so its forward total and each group's backward total equal what the
 * devices measured while training side by side (sharing cores and memory bandwidth), keeping the
 * per-layer proportions. Layer-by-layer timing on an idle machine is optimistic; this calibration is
 * what makes the simulator's step times match measured ones.
 *
 * @example
 * ```ts
 * import { calibrateProfile } from "./profile.ts";
 * const p = calibrateProfile({
 *   batchSize: 1,
 *   layers: [{ name: "a", group: "x", forwardSeconds: 1, backwardSeconds: 2, parameterBytes: 4 }],
 * }, { forwardSeconds: 1.5, backwardSeconds: { x: 3 } });
 * console.log(p.layers[0].backwardSeconds); // 3
 * ```
 */
export function calibrateProfile(profile: Profile, targets: ProfileTargets): Profile {
  checkProfile(profile);
  const forward = profile.layers.reduce((s, l) => s + l.forwardSeconds, 0);
  const backward = new Map<string, number>();
  for (const l of profile.layers) backward.set(l.group, (backward.get(l.group) ?? 0) + l.backwardSeconds);
  const scale = (measured: number | undefined, modelled: number) =>
    measured === undefined || modelled === 0 ? 1 : measured / modelled;
  const forwardScale = scale(targets.forwardSeconds, forward);
  const calibrated = {
    ...profile,
    layers: profile.layers.map((l) => ({
      ...l,
      forwardSeconds: l.forwardSeconds * forwardScale,
      backwardSeconds: l.backwardSeconds * scale(targets.backwardSeconds[l.group], backward.get(l.group)!),
    })),
  };
  checkProfile(calibrated);
  return calibrated;
}

/**
 * A step of `microBatches` micro-batches (gradient accumulation) as one step of the micro-batch
 * profile `profile`: every layer's compute and output bytes (what a hybrid plan's activation
 * collectives carry, once per micro-batch) `microBatches` times, the parameter bytes (the gradients,
 * exchanged once after the last micro-batch) unchanged. So data-parallel and hybrid plans are priced
 * per step alike. Only the bandwidth term of the activations scales: their per-message latency, paid
 * per micro-batch, is counted once.
 *
 * @example
 * ```ts
 * import { accumulatedProfile } from "./profile.ts";
 * const p = accumulatedProfile({
 *   batchSize: 4,
 *   layers: [{ name: "a", group: "x", forwardSeconds: 1, backwardSeconds: 2, parameterBytes: 4, outputBytes: 16 }],
 * }, 3);
 * console.log(p.batchSize, p.layers[0].backwardSeconds, p.layers[0].outputBytes); // 12 6 48
 * ```
 */
export function accumulatedProfile(profile: Profile, microBatches: number): Profile {
  checkProfile(profile);
  if (!Number.isInteger(microBatches) || microBatches < 1) {
    throw new ValueError(
      "accumulatedProfile",
      `microBatches must be a positive integer, got ${microBatches}`,
    );
  }
  if (microBatches === 1) return profile;
  return {
    ...profile,
    batchSize: profile.batchSize * microBatches,
    layers: profile.layers.map((l) => ({
      ...l,
      forwardSeconds: l.forwardSeconds * microBatches,
      backwardSeconds: l.backwardSeconds * microBatches,
      ...(l.outputBytes === undefined ? {} : { outputBytes: l.outputBytes * microBatches }),
    })),
  };
}
