/**
 * Measuring a network's per-layer profile on this machine: forward and backward seconds, parameter
 * bytes, output bytes and the layer type for every layer, the input the simulator and the
 * AlexNet-like test need.
 *
 * Each layer is timed in isolation on the activation that really reaches it (captured in one
 * forward pass), forward and backward separately, taking the median of several repeats so a stray
 * pause does not skew a layer. A network on a graph is measured node by node in topological order,
 * each node on its own bottoms, so the profile reads from the output side in the order backward
 * runs (what the AlexNet-like test walks).
 *
 * @module
 */

import {
  type Graph,
  JoinModule,
  type Module,
  type Network,
  noGrad,
  ops,
  randn,
  type Tensor,
  tidy,
} from "../../engine/mod.ts";
import type { LayerProfile, Profile } from "./profile.ts";

/** Options of {@link measureProfile}. */
export interface MeasureOptions {
  /** Timed repeats per layer; the median is kept (default 3). */
  repeats?: number;
  /** Seed of the random input batch (default 0). */
  seed?: number;
  /** Text stored in the profile's `description`. */
  description?: string;
}

function leaves(module: Module): Module[] {
  const children = module.children();
  return children.length === 0 ? [module] : children.flatMap(([, child]) => leaves(child));
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

/**
 * Measures `network` at `batchSize` samples (one device's share of a global batch).
 *
 * @example
 * ```ts
 * import { measureProfile } from "./measure.ts";
 * // const profile = measureProfile(alexnetLike(), 32);
 * // profile.layers[0] → { name: "conv1", group: "conv", forwardSeconds: 0.012, backwardSeconds: 0.031,
 * //   parameterBytes: 3328, outputBytes: 4 × 32 × (channels × height × width), kind: "Conv2d" }
 * ```
 */
export function measureProfile(network: Network, batchSize: number, options: MeasureOptions = {}): Profile {
  if (network.graph) return measureGraph(network, network.graph, batchSize, options);
  const repeats = options.repeats ?? 3;
  const layers: LayerProfile[] = [];
  let input: Tensor = randn([batchSize, ...network.inputShape], { seed: options.seed ?? 0 });
  const wasTraining = network.training;
  network.train();
  let group = network.namedParameters().at(-1)?.group ?? "all";
  const all = leaves(network);
  // Parameter-free layers belong to the group of the parametrised layer before them, as in summaries.
  const firstGroup = all.flatMap((l) => l.namedParameters())[0]?.group ?? group;
  group = firstGroup;
  all.forEach((layer, index) => {
    const own = layer.namedParameters();
    if (own.length > 0) group = own[0].group;
    const forwardTimes: number[] = [], backwardTimes: number[] = [];
    let output: Tensor | undefined;
    for (let r = 0; r <= repeats; r++) {
      tidy(() => {
        const x = noGrad(() => ops.reshape(input, input.shape));
        x.requiresGrad = index > 0; // the first layer's input needs no gradient in training
        const t0 = performance.now();
        const y = layer.forward(x, { step: r });
        const t1 = performance.now();
        const probe = randn(y.shape, { seed: 7, stream: index });
        const t2 = performance.now();
        // A parameter-free first layer (a flatten) has no backward in training: nothing needs it.
        const backward = y.requiresGrad;
        if (backward) y.backward({ gradOutput: probe });
        const t3 = performance.now();
        for (const p of own) {
          p.tensor.grad?.dispose();
          p.tensor.grad = null;
        }
        if (r > 0) { // the first run warms up the JIT and scratch buffers
          forwardTimes.push((t1 - t0) / 1000);
          backwardTimes.push(backward ? (t3 - t2) / 1000 : 0);
        }
        if (r === repeats) {
          output = noGrad(() => ops.reshape(y, y.shape));
          return output;
        }
      });
    }
    layers.push({
      name: layer.path,
      group,
      forwardSeconds: median(forwardTimes),
      backwardSeconds: median(backwardTimes),
      parameterBytes: own.reduce((n, p) => n + p.tensor.size * 4, 0),
      // fp32 activations at this batch: what a hybrid plan's all-gathers and reduce-scatters move.
      outputBytes: output!.size * 4,
      kind: layer.kind,
    });
    input.dispose();
    input = output!;
    input.requiresGrad = false;
  });
  input.dispose();
  network.train(wasTraining);
  return { layers, batchSize, description: options.description };
}

/**
 * {@link measureProfile} of a network on a graph: every node in topological order (the reverse of
 * the order backward runs them), each timed on the blobs that really reach it — one forward pass's,
 * each kept until its last reader is measured — with gradients into every bottom but the images.
 * Auxiliary heads count, as training runs them.
 */
function measureGraph(network: Network, graph: Graph, batchSize: number, options: MeasureOptions): Profile {
  const repeats = options.repeats ?? 3;
  const layers: LayerProfile[] = [];
  const wasTraining = network.training;
  network.train();
  const blobs = new Map<string, Tensor>([[
    graph.input,
    randn([batchSize, ...network.inputShape], {
      seed: options.seed ?? 0,
    }),
  ]]);
  const readers = new Map<string, number>();
  for (const node of graph.nodes) for (const b of node.bottoms) readers.set(b, (readers.get(b) ?? 0) + 1);
  const firstGroup = network.namedParameters()[0]?.group ?? "all";
  let group = firstGroup;
  graph.nodes.forEach((node, index) => {
    const own = node.module.namedParameters();
    if (own.length > 0) group = own[0].group;
    const forwardTimes: number[] = [], backwardTimes: number[] = [];
    let output: Tensor | undefined;
    for (let r = 0; r <= repeats; r++) {
      tidy(() => {
        const xs = node.bottoms.map((b) => {
          const source = blobs.get(b)!;
          const x = noGrad(() => ops.reshape(source, source.shape));
          x.requiresGrad = b !== graph.input;
          return x;
        });
        const t0 = performance.now();
        const y = node.module instanceof JoinModule
          ? node.module.forwardAll(xs, { step: r })
          : node.module.forward(xs[0], { step: r });
        const t1 = performance.now();
        const probe = randn(y.shape, { seed: 7, stream: index });
        const t2 = performance.now();
        const backward = y.requiresGrad;
        if (backward) y.backward({ gradOutput: probe });
        const t3 = performance.now();
        for (const p of own) {
          p.tensor.grad?.dispose();
          p.tensor.grad = null;
        }
        if (r > 0) {
          forwardTimes.push((t1 - t0) / 1000);
          backwardTimes.push(backward ? (t3 - t2) / 1000 : 0);
        }
        if (r === repeats) {
          output = noGrad(() => ops.reshape(y, y.shape));
          return output;
        }
      });
    }
    layers.push({
      name: node.module.path,
      group,
      forwardSeconds: median(forwardTimes),
      backwardSeconds: median(backwardTimes),
      parameterBytes: own.reduce((n, p) => n + p.tensor.size * 4, 0),
      outputBytes: output!.size * 4,
      kind: node.module.kind,
    });
    output!.requiresGrad = false;
    blobs.set(node.top, output!);
    for (const b of node.bottoms) {
      const left = readers.get(b)! - 1;
      readers.set(b, left);
      if (left === 0) {
        blobs.get(b)?.dispose();
        blobs.delete(b);
      }
    }
  });
  for (const t of blobs.values()) t.dispose();
  network.train(wasTraining);
  return { layers, batchSize, description: options.description };
}
