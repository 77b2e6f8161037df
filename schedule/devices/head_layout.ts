/**
 * How a hybrid plan's fully-connected head is cut across devices ("one weird trick", Krizhevsky
 * 2014): the network's body (its conv layers) stays a data-parallel replica, while the
 * fully-connected head is split by output units — device d of N holds units `unitRange(units, N, d)`
 * of every head layer (those rows of the weight, those entries of the bias) and computes them for the
 * whole global batch.
 *
 * This holds the split itself: where a network divides into body and head (`headLayout`), which
 * units each device takes (`unitRange`), and which parameter slots those units are (`sliceSlots`,
 * `sliceLayout`). The object that runs a device's slice phase by phase is in `sharded_head.ts`.
 *
 * @module
 */

import { type Graph, type Module, type Network, TandemError } from "../../engine/mod.ts";
import type { Linear } from "../../engine/nn/layers.ts";
import type { ParameterLayout, ParameterSlot } from "./parameter_layout.ts";
import { ScheduleError } from "../plan/errors.ts";

/** One model-parallel layer and the parameter-free layers after it. */
export interface HeadStage {
  /** The fully-connected layer's path, e.g. `fc6`. */
  readonly linear: string;
  /** Its parameter group. */
  readonly group: string;
  /** Paths of the ReLU and Dropout layers applied to its output before the next stage. */
  readonly after: readonly string[];
  /** Input features (the width of the gathered input). */
  readonly inFeatures: number;
  /** Output units, split over the devices. */
  readonly units: number;
}

/** Where a network splits into a data-parallel body and a model-parallel head. */
export interface HeadLayout {
  /** Number of top-level layers in the body. */
  readonly bodyLayers: number;
  /**
   * For a network on a graph: the blob the head reads, which the body's graph computes (the body
   * runs as a graph, the head as a chain). Absent for a chain.
   */
  readonly bodyOutput?: string;
  /** The head's stages in forward order. */
  readonly stages: readonly HeadStage[];
  /** Devices the head is split over. */
  readonly devices: number;
  /** The model-parallel groups. */
  readonly sharded: readonly string[];
}

/**
 * Units `[start, end)` of a layer of `units` outputs that device `device` of `devices` holds: as even
 * as can be, earlier devices taking one fewer where they do not divide.
 *
 * @example
 * ```ts
 * import { unitRange } from "./head_layout.ts";
 * console.log(unitRange(10, 3, 2)); // { start: 6, end: 10 }
 * ```
 */
export function unitRange(units: number, devices: number, device: number): { start: number; end: number } {
  return { start: Math.floor(units * device / devices), end: Math.floor(units * (device + 1) / devices) };
}

const HEAD_ELEMENTWISE = new Set(["ReLU", "Dropout"]);

/**
 * Splits `network` at its first layer with parameters in a `sharded` group. Every layer from there
 * on must be fully connected (in a sharded group) or a ReLU or Dropout, and no earlier layer may hold
 * parameters of a sharded group; anything else is refused naming the layer.
 *
 * @example
 * ```ts
 * import { headLayout } from "./head_layout.ts";
 * // headLayout(alexnetLike(), ["fc"], 2).stages.map((s) => s.linear); // ["fc6", "fc7", "fc8"]
 * ```
 */
export function headLayout(
  network: Network,
  sharded: readonly string[],
  devices: number,
  schedule = "hybrid",
): HeadLayout {
  const layers = network.layers();
  const groupsOf = (layer: Module) => new Set(layer.namedParameters().map((p) => p.group));
  const isSharded = (layer: Module) => [...groupsOf(layer)].some((g) => sharded.includes(g));
  const first = layers.findIndex(([, layer]) => isSharded(layer));
  const where = `hybrid schedule on ${network.name}`;
  if (first < 0) {
    throw new TandemError(`${where}: no layer holds parameters of the sharded groups ${sharded.join(", ")}`);
  }
  const bodyOutput = network.graph
    ? graphBodyOutput(network.graph, first, network.name, schedule)
    : undefined;
  const stages: { linear: string; group: string; after: string[]; inFeatures: number; units: number }[] = [];
  for (const [name, layer] of layers.slice(first)) {
    if (layer.kind === "Linear") {
      const groups = [...groupsOf(layer)];
      if (groups.length !== 1 || !sharded.includes(groups[0])) {
        throw new TandemError(
          `${where}: layer ${name} is fully connected but in group ${
            groups.join(", ")
          }, which is not sharded; ` +
            `every layer after the first sharded one must be`,
        );
      }
      const linear = layer as Linear;
      if (linear.outFeatures < devices) {
        throw new TandemError(
          `${where}: layer ${name} has ${linear.outFeatures} output units, fewer than the ${devices} devices to split them over`,
        );
      }
      stages.push({
        linear: name,
        group: groups[0],
        after: [],
        inFeatures: linear.inFeatures,
        units: linear.outFeatures,
      });
    } else if (HEAD_ELEMENTWISE.has(layer.kind) && stages.length > 0) {
      stages[stages.length - 1].after.push(name);
    } else {
      throw new TandemError(
        `${where}: layer ${name} (${layer.kind}) is in the model-parallel head, which holds only ` +
          `fully-connected layers with ReLU and Dropout after them`,
      );
    }
  }
  for (const [name, layer] of layers.slice(0, first)) {
    if (isSharded(layer)) {
      throw new TandemError(`${where}: layer ${name} before the head holds parameters of a sharded group`);
    }
  }
  return { bodyLayers: first, stages, devices, sharded: [...sharded], ...(bodyOutput ? { bodyOutput } : {}) };
}

/**
 * For a network on a graph: the blob a hybrid head starting at node `first` reads, when the head is
 * a chain — each node reads the one before it, one loss on the last, nothing else reads the head —
 * and every node before it feeds that blob (the body). Anything else (GoogLeNet's auxiliary
 * classifiers, a branch inside the head) is refused with a {@link ScheduleError} naming the node.
 */
function graphBodyOutput(graph: Graph, first: number, name: string, schedule: string): string {
  const refuse = (why: string): never => {
    throw new ScheduleError(`the hybrid head of ${name} must be a chain: ${why}`, {
      schedule,
      line: 0,
      column: 0,
    });
  };
  const head = graph.nodes.slice(first);
  head.forEach((node, i) => {
    if (node.bottoms.length !== 1) {
      refuse(`layer ${node.name} joins ${node.bottoms.length} blobs`);
    }
    if (i > 0 && node.bottoms[0] !== head[i - 1].top) {
      refuse(`layer ${node.name} reads "${node.bottoms[0]}", not the output of ${head[i - 1].name}`);
    }
  });
  const last = head[head.length - 1].top;
  if (graph.losses.length > 1) {
    refuse(
      `the net has ${graph.losses.length} losses (${
        graph.losses.map((l) => l.name).join(", ")
      }); the head ends in one`,
    );
  }
  if (graph.output !== last) refuse(`its classifier "${graph.output}" is not the head's last layer`);
  const bodyOutput = head[0].bottoms[0];
  const body = new Set(graph.needed([bodyOutput]));
  const outside = graph.nodes.slice(0, first).findIndex((_, i) => !body.has(i));
  if (outside >= 0) {
    refuse(
      `layer ${graph.nodes[outside].name} is neither in the body (what ${
        head[0].name
      } reads) nor in the head`,
    );
  }
  return bodyOutput;
}

/**
 * The parameter slots device `device` holds of the head: each head weight's rows and bias entries of
 * its units, as slots of the full layout (same names, the slice's shape, offsets into the full flat
 * buffers), so an optimizer over them updates a device's slice in place.
 *
 * @example
 * ```ts
 * import { sliceSlots } from "./head_layout.ts";
 * // sliceSlots(layout, head, 1).map((s) => `${s.name} ${s.shape}`); // ["fc6.weight 128,576", …]
 * ```
 */
export function sliceSlots(layout: ParameterLayout, head: HeadLayout, device: number): ParameterSlot[] {
  const out: ParameterSlot[] = [];
  for (const stage of head.stages) {
    const { start, end } = unitRange(stage.units, head.devices, device);
    for (const slot of layout.slots.filter((s) => s.name.startsWith(`${stage.linear}.`))) {
      const row = slot.size / stage.units; // inFeatures for the weight, 1 for the bias
      out.push({
        ...slot,
        shape: slot.shape.length === 2 ? [end - start, slot.shape[1]] : [end - start],
        offset: slot.offset + start * row,
        size: (end - start) * row,
      });
    }
  }
  return out;
}

/**
 * A layout of just `slots` (a device's slice), for `hostParameterEntries`: offsets stay those of the
 * full flat buffers.
 *
 * @example
 * ```ts
 * import { sliceLayout, sliceSlots } from "./head_layout.ts";
 * // const optimizer = new SGD(hostParameterEntries(sliceLayout(sliceSlots(layout, head, d)), params, grads));
 * ```
 */
export function sliceLayout(slots: readonly ParameterSlot[]): ParameterLayout {
  const groups = [...new Set(slots.map((s) => s.group))].map((name) => {
    const members = slots.filter((s) => s.group === name);
    const offset = Math.min(...members.map((s) => s.offset));
    return { name, offset, size: members.reduce((a, s) => a + s.size, 0) };
  });
  return { slots, groups, total: Math.max(0, ...slots.map((s) => s.offset + s.size)) };
}
