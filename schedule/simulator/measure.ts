/**
 * Measuring a network's per-layer profile on this machine: forward and backward seconds, parameter
 * bytes, output bytes and the layer type for every layer, the input the simulator and the
 * AlexNet-like test need.
 *
 * Each layer is timed on its own on the activation that really reaches it (captured in one forward
 * pass), forward and backward separately, taking the median of several repeats so a stray pause
 * does not skew a layer; layers that training runs as one op (`fusedRun`: a convolution or fully
 * connected layer with its ReLU, and a max pooling after them) are timed as that op, on the first
 * layer's entry. A network on a graph is measured node by node in topological order, each node on
 * its own bottoms, so the profile reads from the output side in the order backward runs (what the
 * AlexNet-like test walks).
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
  type ParameterEntry,
  randn,
  type Tensor,
  tidy,
} from "../../engine/mod.ts";
import { fusedRun } from "../../engine/nn/layers.ts";
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

/** The parent path of a leaf: only layers of one container fuse, as its `Sequential.forward` runs them. */
const parentOf = (layer: Module) => layer.path.slice(0, Math.max(0, layer.path.lastIndexOf(".")));

/** Elements of a tensor of `shape`. */
const sizeOf = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/**
 * Times one run of the network — a layer, or layers that run as one op — `repeats` times after a
 * warm-up on `sources` (copies, so each repeat's graph is its own; those with `needsGradient` take
 * a gradient, as inside the network), and keeps the last repeat's output, detached.
 */
function timeRun(
  forward: (xs: Tensor[], step: number) => Tensor,
  sources: readonly Tensor[],
  needsGradient: readonly boolean[],
  parameters: readonly ParameterEntry[],
  stream: number,
  repeats: number,
): { forwardSeconds: number; backwardSeconds: number; output: Tensor } {
  const forwardTimes: number[] = [], backwardTimes: number[] = [];
  let output: Tensor | undefined;
  for (let r = 0; r <= repeats; r++) {
    tidy(() => {
      const xs = sources.map((source, i) => {
        const x = noGrad(() => ops.reshape(source, source.shape));
        x.requiresGrad = needsGradient[i];
        return x;
      });
      const t0 = performance.now();
      const y = forward(xs, r);
      const t1 = performance.now();
      const probe = randn(y.shape, { seed: 7, stream });
      const t2 = performance.now();
      // A parameter-free first layer (a flatten) has no backward in training: nothing needs it.
      const backward = y.requiresGrad;
      if (backward) y.backward({ gradOutput: probe });
      const t3 = performance.now();
      for (const p of parameters) {
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
  output!.requiresGrad = false;
  return { forwardSeconds: median(forwardTimes), backwardSeconds: median(backwardTimes), output: output! };
}

/**
 * The profile's entries of one timed run: its time on its first layer (layers fused into one op run
 * inside it and get 0), and every layer's own output bytes (`outputs`, elements) and kind.
 */
function runEntries(
  run: readonly Module[],
  names: readonly string[],
  groups: readonly string[],
  timed: { forwardSeconds: number; backwardSeconds: number },
  outputs: readonly number[],
): LayerProfile[] {
  return run.map((layer, i) => ({
    name: names[i],
    group: groups[i],
    forwardSeconds: i === 0 ? timed.forwardSeconds : 0,
    backwardSeconds: i === 0 ? timed.backwardSeconds : 0,
    parameterBytes: layer.namedParameters().reduce((n, p) => n + p.tensor.size * 4, 0),
    // fp32 activations at this batch: what a hybrid plan's all-gathers and reduce-scatters move.
    outputBytes: outputs[i] * 4,
    kind: layer.kind,
  }));
}

/**
 * Measures `network` at `batchSize` samples (one device's share of a global batch). Layers that
 * training runs as one op ({@link fusedRun}: a convolution or fully connected layer with its ReLU,
 * and the max pooling after it) are timed as that op, on the first layer's entry: timed one by one,
 * the ReLU and pooling passes of AlexNet-like's body and their backward cost as much again as its
 * convolutions, which put most of a step in the wrong place.
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
  const all = leaves(network);
  // Parameter-free layers belong to the group of the parametrised layer before them, as in summaries.
  let group = all.flatMap((l) => l.namedParameters())[0]?.group ?? network.namedParameters().at(-1)?.group ??
    "all";
  for (let index = 0; index < all.length;) {
    const layer = all[index];
    // Only the leaves right after it in the same container: a nested one runs its own forward.
    const siblings = all.slice(index, index + 3);
    const stranger = siblings.findIndex((l) => parentOf(l) !== parentOf(layer));
    const fused = fusedRun(stranger < 0 ? siblings : siblings.slice(0, stranger));
    const run = all.slice(index, index + (fused?.length ?? 1));
    const groups = run.map((l) => group = l.namedParameters()[0]?.group ?? group);
    const outputs: number[] = [];
    let shape = input.shape;
    for (const l of run) outputs.push(sizeOf(shape = l.describe(shape).outputShape));
    const timed = timeRun(
      ([x], step) => fused ? fused.forward(x) : layer.forward(x, { step }),
      [input],
      [index > 0], // the first layer's input needs no gradient in training
      run.flatMap((l) => l.namedParameters()),
      index,
      repeats,
    );
    layers.push(...runEntries(run, run.map((l) => l.path), groups, timed, outputs));
    input.dispose();
    input = timed.output;
    index += run.length;
  }
  input.dispose();
  network.train(wasTraining);
  return { layers, batchSize, description: options.description };
}

/**
 * {@link measureProfile} of a network on a graph: every node in topological order (the reverse of
 * the order backward runs them), each timed on the blobs that really reach it — one forward pass's,
 * each kept until its last reader is measured — with gradients into every bottom but the images,
 * and the nodes that training runs as one op ({@link Graph.fusedFrom}) timed as that op.
 * Auxiliary heads count, as training runs them.
 */
function measureGraph(network: Network, graph: Graph, batchSize: number, options: MeasureOptions): Profile {
  const repeats = options.repeats ?? 3;
  const layers: LayerProfile[] = [];
  const wasTraining = network.training;
  network.train();
  const inputShape = [batchSize, ...network.inputShape];
  const shapes = graph.describe(inputShape).shapes;
  const blobs = new Map<string, Tensor>([[graph.input, randn(inputShape, { seed: options.seed ?? 0 })]]);
  const readers = new Map<string, number>();
  for (const node of graph.nodes) for (const b of node.bottoms) readers.set(b, (readers.get(b) ?? 0) + 1);
  // Training asks for its losses' logits (`Network.lossAndLogits`): those blobs never fuse away.
  const kept = new Set([...graph.trainingOutputs, graph.output]);
  const order = graph.nodes.map((_, i) => i);
  let group = network.namedParameters()[0]?.group ?? "all";
  for (let index = 0; index < graph.nodes.length;) {
    const node = graph.nodes[index];
    const fused = graph.fusedFrom(order, index, readers, kept);
    const run = fused?.nodes ?? [node];
    const groups = run.map((n) => group = n.module.namedParameters()[0]?.group ?? group);
    const timed = timeRun(
      (xs, step) =>
        node.module instanceof JoinModule
          ? node.module.forwardAll(xs, { step })
          : fused
          ? fused.op.forward(xs[0])
          : node.module.forward(xs[0], { step }),
      node.bottoms.map((b) => blobs.get(b)!),
      node.bottoms.map((b) => b !== graph.input),
      run.flatMap((n) => n.module.namedParameters()),
      index,
      repeats,
    );
    layers.push(
      ...runEntries(
        run.map((n) => n.module),
        run.map((n) => n.module.path),
        groups,
        timed,
        run.map((n) => sizeOf(shapes.get(n.top)!)),
      ),
    );
    blobs.set(run[run.length - 1].top, timed.output);
    // The blobs inside a fused run are never made; their one reader is in the run.
    for (const inner of run.slice(0, -1)) readers.set(inner.top, 0);
    for (const b of node.bottoms) {
      const left = readers.get(b)! - 1;
      readers.set(b, left);
      if (left === 0) {
        blobs.get(b)?.dispose();
        blobs.delete(b);
      }
    }
    index += run.length;
  }
  for (const t of blobs.values()) t.dispose();
  network.train(wasTraining);
  return { layers, batchSize, description: options.description };
}
