/**
 * `Graph`: the wiring of a network whose layers branch and join (Caffe's GoogLeNet, ResNets). Each
 * node is a module reading named blobs (its bottoms, in order) and writing one blob (its top); nodes
 * come in topological order (Caffe's file order), every blob is written once (an in-place Caffe layer
 * is given a fresh blob name by the importer), and a blob read by several nodes is Caffe's `Split`:
 * autograd sums the gradients its readers send back. A `Network` built on a graph holds the nodes'
 * modules as its layers, in node order, so parameters are named `<layer>.<blob>` as for a chain.
 *
 * The graph also names its losses (softmax cross-entropy on a blob, with Caffe's `loss_weight`) and
 * its main output: the bottom of the loss with the largest weight (the last on ties), GoogLeNet's
 * `loss3/classifier`, which accuracy and evaluation use.
 *
 * A forward pass computes only what the requested blobs need (evaluating the main classifier skips
 * GoogLeNet's auxiliary heads) and frees each intermediate blob after its last reader; backward runs
 * in the reverse of the order the nodes ran, as autograd orders every pass.
 *
 * @module
 */

import { formatShape, ShapeError, TandemError } from "../errors.ts";
import type { Tensor } from "../tensor.ts";
import { JoinModule } from "./join.ts";
import { type FusedRun, fusedRun } from "./layers.ts";
import type { ForwardContext, LayerDescription, Module } from "./module.ts";

/** One layer of a graph. */
export interface GraphNode {
  /** The layer's name in the network (its parameters are `<name>.weight`, …). */
  readonly name: string;
  /** The layer. Several bottoms need a {@link JoinModule}. */
  readonly module: Module;
  /** Blobs read, in order. */
  readonly bottoms: readonly string[];
  /** The blob written. */
  readonly top: string;
}

/** A softmax cross-entropy loss on a blob of `[batch, classes]` logits. */
export interface GraphLoss {
  /** For messages (the Caffe loss layer's name). */
  readonly name: string;
  /** The logits blob. */
  readonly bottom: string;
  /** Caffe's `loss_weight` (default 1): the training loss is `Σ weight · loss`. */
  readonly weight: number;
}

/** What a {@link Graph} is built from. */
export interface GraphSpec {
  /** The input blob (the images). */
  readonly input: string;
  /** The layers in topological order. */
  readonly nodes: readonly GraphNode[];
  /** The losses (none: a deploy net, trained with one unit-weight loss on `output`). */
  readonly losses?: readonly GraphLoss[];
  /**
   * The main output; default the bottom of the loss with the largest weight (the last on ties), else
   * the last node's top.
   */
  readonly output?: string;
}

/**
 * A network's wiring (see the module notes). Invalid wiring throws a `TandemError` naming the node:
 * a bottom no earlier node writes (also what a cycle looks like in topological order), a blob written
 * twice, several bottoms on a one-input layer.
 *
 * @example
 * ```ts
 * import { Graph } from "./graph.ts";
 * import { Eltwise } from "./join.ts";
 * import { Conv2d, ReLU } from "./layers.ts";
 * // y = relu(conv(x) + x): a residual block
 * const graph = new Graph({
 *   input: "x",
 *   nodes: [
 *     { name: "conv", module: new Conv2d(8, 8, 3, { padding: 1 }), bottoms: ["x"], top: "conv" },
 *     { name: "sum", module: new Eltwise("SUM"), bottoms: ["conv", "x"], top: "sum" },
 *     { name: "relu", module: new ReLU(), bottoms: ["sum"], top: "out" },
 *   ],
 * });
 * console.log(graph.output); // "out"
 * ```
 */
export class Graph {
  /** The input blob. */
  readonly input: string;
  /** The layers in topological order. */
  readonly nodes: readonly GraphNode[];
  /** The losses, in layer order. */
  readonly losses: readonly GraphLoss[];
  /** The main output blob (see {@link GraphSpec.output}). */
  readonly output: string;
  /** Index of the main loss in `losses` (−1 without losses). */
  readonly mainLoss: number;
  /** Index of the node writing each blob (−1 for the input). */
  readonly #producer = new Map<string, number>();

  /** Checks and freezes `spec`. */
  constructor(spec: GraphSpec) {
    this.input = spec.input;
    this.nodes = [...spec.nodes];
    this.losses = [...(spec.losses ?? [])];
    this.#producer.set(spec.input, -1);
    const names = new Set<string>();
    this.nodes.forEach((node, i) => {
      if (names.has(node.name)) throw new TandemError(`graph: two nodes are named "${node.name}"`);
      names.add(node.name);
      if (node.bottoms.length === 0) throw new TandemError(`graph: node "${node.name}" reads no blob`);
      if (node.bottoms.length > 1 && !(node.module instanceof JoinModule)) {
        throw new TandemError(
          `graph: node "${node.name}" (${node.module.kind}) reads ${node.bottoms.length} blobs but takes one input`,
        );
      }
      for (const bottom of node.bottoms) {
        if (!this.#producer.has(bottom)) {
          const later = this.nodes.findIndex((n, j) => j > i && n.top === bottom);
          throw new TandemError(
            `graph: node "${node.name}" reads blob "${bottom}", which no earlier node writes${
              later >= 0
                ? ` (node "${this.nodes[later].name}" writes it later: a cycle, or nodes out of order)`
                : ""
            }`,
          );
        }
      }
      if (this.#producer.has(node.top)) {
        throw new TandemError(
          `graph: node "${node.name}" writes blob "${node.top}", which is already written`,
        );
      }
      this.#producer.set(node.top, i);
    });
    for (const loss of this.losses) {
      if (!this.#producer.has(loss.bottom)) {
        throw new TandemError(`graph: loss "${loss.name}" reads blob "${loss.bottom}", which no node writes`);
      }
    }
    let main = -1;
    this.losses.forEach((loss, i) => {
      if (main < 0 || loss.weight >= this.losses[main].weight) main = i;
    });
    this.mainLoss = main;
    const output = spec.output ?? (main >= 0 ? this.losses[main].bottom : this.nodes.at(-1)?.top);
    if (output === undefined || !this.#producer.has(output)) {
      throw new TandemError(`graph: the output blob "${output}" is not written by any node`);
    }
    this.output = output;
  }

  /** The blobs training reads: every loss's logits (or the output, without losses), deduplicated. */
  get trainingOutputs(): string[] {
    return this.losses.length ? [...new Set(this.losses.map((l) => l.bottom))] : [this.output];
  }

  /** Indices of the nodes `blobs` depend on, in order. */
  needed(blobs: readonly string[]): number[] {
    const needed = new Set<number>();
    const pending = blobs.map((b) => this.#producerOf(b));
    while (pending.length) {
      const i = pending.pop()!;
      if (i < 0 || needed.has(i)) continue;
      needed.add(i);
      for (const bottom of this.nodes[i].bottoms) pending.push(this.#producer.get(bottom)!);
    }
    return [...needed].sort((a, b) => a - b);
  }

  #producerOf(blob: string): number {
    const i = this.#producer.get(blob);
    if (i === undefined) throw new TandemError(`graph: no node writes blob "${blob}"`);
    return i;
  }

  /**
   * Runs the nodes `outputs` need on input `x` and returns those blobs, in order (the input itself
   * may be one). Every other blob is disposed after its last reader.
   */
  run(x: Tensor, outputs: readonly string[], context?: ForwardContext): Tensor[] {
    const order = this.needed(outputs);
    const readers = new Map<string, number>();
    for (const i of order) for (const b of this.nodes[i].bottoms) readers.set(b, (readers.get(b) ?? 0) + 1);
    const kept = new Set(outputs);
    const blobs = new Map<string, Tensor>([[this.input, x]]);
    for (let k = 0; k < order.length; k++) {
      const node = this.nodes[order[k]], module = node.module;
      const inputs = node.bottoms.map((b) => blobs.get(b)!);
      const fused = this.fusedFrom(order, k, readers, kept);
      const out = module instanceof JoinModule
        ? module.forwardAll(inputs, context)
        : fused
        ? fused.op.forward(inputs[0])
        : module.forward(inputs[0], context);
      const run = fused?.nodes ?? [node];
      for (const inner of run.slice(0, -1)) readers.set(inner.top, 0);
      k += run.length - 1;
      blobs.set(run[run.length - 1].top, out);
      for (const b of node.bottoms) {
        const left = readers.get(b)! - 1;
        readers.set(b, left);
        // The graph keeps what backward needs; the input belongs to the caller.
        if (left === 0 && !kept.has(b) && b !== this.input) {
          blobs.get(b)!.dispose();
          blobs.delete(b);
        }
      }
    }
    return outputs.map((b) => blobs.get(b)!);
  }

  /**
   * The nodes from `order[k]` on that run as one op ({@link fusedRun}: a convolution or fully
   * connected layer, its ReLU, a max pooling) and that op, or `undefined` where the node runs alone.
   * They fuse where each blob between them has the next as its one reader (`readers`: readers left
   * among the nodes `order` runs) and is not asked for (`kept`): those blobs are never made, the
   * last node's is. {@link Graph.run} runs them so, and the simulator's profile times them so.
   *
   * @internal For `Graph.run` and the simulator's profile (`measureProfile`).
   */
  fusedFrom(
    order: readonly number[],
    k: number,
    readers: ReadonlyMap<string, number>,
    kept: ReadonlySet<string>,
  ): { nodes: GraphNode[]; op: FusedRun } | undefined {
    const chain = [this.nodes[order[k]]];
    if (chain[0].module instanceof JoinModule) return undefined;
    while (chain.length < 3) {
      const last = chain[chain.length - 1], after = this.nodes[order[k + chain.length]];
      if (
        after === undefined || after.bottoms.length !== 1 || after.bottoms[0] !== last.top ||
        readers.get(last.top) !== 1 || kept.has(last.top)
      ) break;
      chain.push(after);
    }
    const op = fusedRun(chain.map((n) => n.module));
    return op && { nodes: chain.slice(0, op.length), op };
  }

  /**
   * Every node's output shape and per-sample FLOPs for a batched input shape, in node order, and the
   * shape of every blob. A layer that does not fit its inputs throws a `ShapeError` naming it.
   */
  describe(inputShape: readonly number[]): {
    nodes: LayerDescription[];
    shapes: Map<string, number[]>;
  } {
    const shapes = new Map<string, number[]>([[this.input, [...inputShape]]]);
    const nodes = this.nodes.map((node) => {
      const inputs = node.bottoms.map((b) => shapes.get(b)!);
      let description: LayerDescription;
      try {
        description = node.module instanceof JoinModule
          ? node.module.describeAll(inputs)
          : node.module.describe(inputs[0]);
      } catch (error) {
        if (!(error instanceof Error)) throw error;
        throw new ShapeError(
          `${node.module.kind} ${node.name}`,
          `does not fit its input${inputs.length > 1 ? "s" : ""} ${
            inputs.map((s) => formatShape(s)).join(", ")
          }: ${error.message}`,
        );
      }
      shapes.set(node.top, description.outputShape);
      return description;
    });
    return { nodes, shapes };
  }
}
