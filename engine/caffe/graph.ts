/**
 * How the Caffe importer turns a net's blobs into a network's wiring: Caffe's blob semantics, and
 * the choice between a chain (today's `Sequential` network, bit for bit) and a {@link Graph}.
 *
 * Caffe runs layers in file order, each reading the blobs its `bottom`s name as they stand at that
 * point; a layer whose `top` names a blob it also reads works in place (ReLU after a convolution)
 * and every later reader sees its result. {@link BlobTable} gives every write a fresh name (SSA), so
 * an in-place layer is an ordinary node and a blob read by several layers (Caffe's implicit
 * `Split`) is one value whose gradients autograd sums. A bottom no earlier layer writes is refused,
 * naming the later layer that writes it if one does (a cycle, or layers out of order).
 *
 * @module
 */

import { Graph, type GraphLoss, type GraphNode } from "../nn/graph.ts";
import { JoinModule } from "../nn/join.ts";
import type { Module } from "../nn/module.ts";
import { Network } from "../nn/network.ts";
import { sizeOf } from "../shape.ts";
import { type LayerRef, type Reader, sampleShape } from "./reader.ts";

/** One written blob: its unique name in the graph and its shape (batch axis of 1). */
interface BlobVersion {
  id: string;
  shape: number[];
}

/**
 * Caffe's blobs as they are written, layer by layer (see the module notes).
 *
 * @example
 * ```ts ignore
 * const blobs = new BlobTable(reader, layers);
 * const id = blobs.write("conv1", [1, 96, 55, 55]); // "conv1"
 * blobs.write("conv1", [1, 96, 55, 55]);            // an in-place ReLU: "conv1@2"
 * blobs.read("conv1", reluRef).id;                  // "conv1@2"
 * ```
 */
export class BlobTable {
  readonly #current = new Map<string, BlobVersion>();
  readonly #writes = new Map<string, number>();
  readonly #usedIds = new Set<string>();
  /** The first layer writing each blob, for the message about a bottom read too early. */
  readonly #writers = new Map<string, LayerRef>();

  /** A table for `layers` (the ones kept in this phase, in file order). */
  constructor(readonly reader: Reader, layers: readonly LayerRef[]) {
    for (const ref of layers) {
      for (const top of ref.message.all("top")) {
        const name = reader.string(top, `layer "${ref.name}"`, ref.name);
        if (!this.#writers.has(name)) this.#writers.set(name, ref);
      }
    }
  }

  /** Whether `name` has been written. */
  has(name: string): boolean {
    return this.#current.has(name);
  }

  /** The current value of `name`, or a refusal naming `ref` (the reader) and why. */
  read(name: string, ref: LayerRef): BlobVersion {
    const blob = this.#current.get(name);
    if (blob) return blob;
    const writer = this.#writers.get(name);
    const later = writer && writer !== ref
      ? `; layer "${writer.name}" (line ${writer.field.line}) writes it later: a cycle, or layers out of order (Caffe runs layers in file order)`
      : "";
    return this.reader.fail(
      ref.field,
      `layer "${ref.name}" (${ref.type}) reads blob "${name}", which no earlier layer produces${later}`,
      ref.name,
    );
  }

  /** Records a new value of `name` and returns its unique id. */
  write(name: string, shape: number[]): string {
    const count = (this.#writes.get(name) ?? 0) + 1;
    this.#writes.set(name, count);
    let id = count === 1 ? name : `${name}@${count}`;
    while (this.#usedIds.has(id)) id += "'";
    this.#usedIds.add(id);
    this.#current.set(name, { id, shape });
    return id;
  }

  /** Makes `name` another name of an existing value (Caffe's explicit `Split` layer). */
  alias(name: string, blob: BlobVersion): void {
    this.#writes.set(name, (this.#writes.get(name) ?? 0) + 1);
    this.#current.set(name, blob);
  }
}

/** A module built for a Caffe layer, wired. */
export interface CaffeNode extends GraphNode {
  /** The Caffe layer. */
  readonly ref: LayerRef;
}

/** What {@link assembleNetwork} builds from. */
export interface NetworkParts {
  /** Net name. */
  readonly name: string;
  /** The input blob's id. */
  readonly input: string;
  /** Per-sample input shape. */
  readonly inputShape: readonly number[];
  /** The layers in file order. */
  readonly nodes: readonly CaffeNode[];
  /** The SoftmaxWithLoss layers, in file order. */
  readonly losses: readonly (GraphLoss & { ref: LayerRef })[];
  /** The output without a loss (a deploy net's last `Softmax` bottom), if any. */
  readonly softmaxOutput?: string;
  /** Shape of every blob id. */
  readonly shapes: ReadonlyMap<string, readonly number[]>;
}

/**
 * Whether `parts` is a chain: each layer reads only the one before it (the first the input), none
 * joins blobs, at most one loss, on the last layer's output. Such a net imports as a `Sequential`
 * network exactly as before graphs were supported.
 */
function isChain(parts: NetworkParts, output: string): boolean {
  if (parts.losses.length > 1) return false;
  let previous = parts.input;
  for (const node of parts.nodes) {
    if (node.module instanceof JoinModule || node.bottoms.length !== 1 || node.bottoms[0] !== previous) {
      return false;
    }
    previous = node.top;
  }
  return previous === output;
}

/**
 * The network of `parts`: a chain as a `Sequential` network, otherwise a network on a {@link Graph}
 * with its losses and main output. Layers whose result nothing uses are noted.
 *
 * @example
 * ```ts ignore
 * const network = assembleNetwork(reader, parts, notes).initialize(seed);
 * ```
 */
export function assembleNetwork(reader: Reader, parts: NetworkParts, notes: string[]): Network {
  const losses = parts.losses;
  let main = -1;
  losses.forEach((loss, i) => {
    if (main < 0 || loss.weight >= losses[main].weight) main = i;
  });
  const output = main >= 0 ? losses[main].bottom : parts.softmaxOutput ?? parts.nodes.at(-1)!.top;
  const outputShape = parts.shapes.get(output)!;
  const classes = sizeOf(outputShape.slice(1));
  if (isChain(parts, output)) {
    const modules: Record<string, Module> = {};
    for (const node of parts.nodes) modules[node.name] = node.module;
    return new Network(parts.name, parts.inputShape, classes, modules);
  }
  // Per-head checks (a chain's output is taken as before: its size is the class count): every loss
  // reads one score per class, as many classes as the main one.
  for (const loss of losses) {
    const shape = parts.shapes.get(loss.bottom)!;
    const n = sizeOf(shape.slice(1));
    if (shape.length > 2 && shape.slice(2).some((d) => d !== 1)) {
      reader.fail(
        loss.ref.field,
        `layer "${loss.ref.name}" (SoftmaxWithLoss) reads ${
          sampleShape(shape)
        }, not one score per class ([classes] or [classes, 1, 1])`,
        loss.ref.name,
      );
    }
    if (n !== classes) {
      reader.fail(
        loss.ref.field,
        `layer "${loss.ref.name}" (SoftmaxWithLoss) reads ${n} scores, but the main classifier has ${classes} classes`,
        loss.ref.name,
      );
    }
  }
  const graph = new Graph({
    input: parts.input,
    nodes: parts.nodes.map(({ name, module, bottoms, top }) => ({ name, module, bottoms, top })),
    losses: losses.map(({ name, bottom, weight }) => ({ name, bottom, weight })),
    output,
  });
  const needed = new Set(graph.needed([...graph.trainingOutputs, output]));
  const unused = parts.nodes.filter((_, i) => !needed.has(i)).map((n) => n.ref.name);
  if (unused.length) {
    notes.push(
      `${unused.join(", ")}: no loss or output reads ${
        unused.length === 1 ? "its result, so it never runs" : "their results, so they never run"
      } (their parameters stay as initialised)`,
    );
  }
  if (losses.length > 1) {
    notes.push(
      `training loss: ${
        losses.map((l) => `${l.weight} × ${l.name}`).join(" + ")
      } (Caffe's loss_weight sum); ` +
        `accuracy and evaluation use the main classifier, the input of ${losses[main].name}`,
    );
  }
  return new Network(parts.name, parts.inputShape, classes, graph);
}
