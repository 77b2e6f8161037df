/**
 * `Network`: a named model that knows its per-sample input shape and class count — what the model
 * zoo and the Caffe importer produce, and what training, checkpoints and the CLI consume. Its layers
 * run as a chain (a `Sequential`) or, built on a {@link Graph}, as a graph whose branches join
 * (GoogLeNet, ResNets), possibly with several weighted losses.
 *
 * @module
 */

import { ShapeError } from "../errors.ts";
import { add, mul } from "../ops/elementwise.ts";
import { flatten } from "../ops/movement.ts";
import { softmaxCrossEntropy } from "../ops/softmax.ts";
import type { Tensor } from "../tensor.ts";
import { Graph } from "./graph.ts";
import { Sequential, type SequentialLayers } from "./layers.ts";
import type { ForwardContext, LayerDescription } from "./module.ts";

/** Options of {@link Network.lossAndLogits}. */
export interface LossOptions {
  /** Dropout key: seed, step and the batch's first global sample. */
  context?: ForwardContext;
  /** Per-head loss: `"mean"` over the batch (default, Caffe's SoftmaxWithLoss) or `"sum"`. */
  reduction?: "mean" | "sum";
  /**
   * `"all"` (default): the training loss, every loss head weighted by its `loss_weight` and summed
   * as Caffe does. `"main"`: the main classifier's loss alone, unweighted (evaluation).
   */
  heads?: "all" | "main";
}

/**
 * A complete classification network.
 *
 * @example
 * ```ts
 * import { Network } from "./network.ts";
 * import { Flatten, Linear } from "./layers.ts";
 * const logistic = new Network("logistic", [1, 28, 28], 10, { flatten: new Flatten(), fc: new Linear(784, 10) });
 * ```
 */
export class Network extends Sequential {
  /** Layer type. */
  override readonly kind: string = "Network";
  /** The wiring when the layers form a graph; `undefined` for a chain. */
  readonly graph: Graph | undefined;

  /**
   * A network named `name` taking `[C, H, W]` samples and predicting `classes` classes, from layers
   * applied in order or from a {@link Graph} (whose nodes become the layers, in node order).
   */
  constructor(
    /** Model name (stored in checkpoints). */
    readonly name: string,
    /** Per-sample input shape, `[channels, height, width]`. */
    readonly inputShape: readonly number[],
    /** Number of output classes. */
    readonly classes: number,
    layers: SequentialLayers | Graph,
  ) {
    super(layers instanceof Graph ? layers.nodes.map((n) => [n.name, n.module] as const) : layers);
    this.graph = layers instanceof Graph ? layers : undefined;
  }

  /** The main classifier's logits (for a graph, only the nodes it needs run). */
  override forward(x: Tensor, context?: ForwardContext): Tensor {
    if (!this.graph) return super.forward(x, context);
    return this.graph.run(x, [this.graph.output], context)[0];
  }

  /** Output shape of the main classifier, and the FLOPs of every layer (auxiliary heads included). */
  override describe(inputShape: readonly number[]): LayerDescription {
    if (!this.graph) return super.describe(inputShape);
    const { nodes, shapes } = this.graph.describe(inputShape);
    return { outputShape: shapes.get(this.graph.output)!, flops: nodes.reduce((n, d) => n + d.flops, 0) };
  }

  /**
   * The loss to minimise (or report) and the main classifier's logits on one batch, both in the
   * caller's scope. A chain: `softmaxCrossEntropy(forward(images), labels)`, exactly the kernels of
   * a plain forward and loss. A graph: Caffe's total `Σ loss_weight · loss` over its losses in layer
   * order (one unit-weight loss is that loss itself), the logits those of the main loss (the largest
   * weight, the last on ties); with `heads: "main"` only the main classifier runs.
   *
   * @example
   * ```ts
   * import type { Network } from "./network.ts";
   * import type { Tensor } from "../tensor.ts";
   * declare const net: Network, images: Tensor, labels: Tensor;
   * const { loss, logits } = net.lossAndLogits(images, labels, { context: { seed: 0, step: 3 } });
   * ```
   */
  lossAndLogits(images: Tensor, labels: Tensor, options: LossOptions = {}): { loss: Tensor; logits: Tensor } {
    const reduction = options.reduction ?? "mean";
    const graph = this.graph;
    if (!graph || options.heads === "main" || graph.losses.length === 0) {
      const logits = this.forward(images, options.context);
      return { loss: softmaxCrossEntropy(asLogits(logits, "output"), labels, { reduction }), logits };
    }
    const blobs = graph.trainingOutputs;
    if (!blobs.includes(graph.output)) blobs.push(graph.output);
    const outputs = graph.run(images, blobs, options.context);
    const byBlob = new Map(blobs.map((b, i) => [b, outputs[i]]));
    let total: Tensor | undefined;
    for (const head of graph.losses) {
      if (head.weight === 0) continue; // Caffe leaves a zero-weight loss out of the total
      const loss = softmaxCrossEntropy(asLogits(byBlob.get(head.bottom)!, head.name), labels, { reduction });
      const weighted = head.weight === 1 ? loss : mul(loss, head.weight);
      if (weighted !== loss) loss.dispose();
      if (!total) total = weighted;
      else {
        const sum = add(total, weighted);
        total.dispose();
        weighted.dispose();
        total = sum;
      }
    }
    const logits = byBlob.get(graph.output)!;
    for (const [blob, t] of byBlob) if (blob !== graph.output) t.dispose();
    if (!total) throw new ShapeError("Network.lossAndLogits", `${this.name}: every loss has weight 0`);
    return { loss: total, logits };
  }
}

/** `[batch, classes]` logits: `[N, C, 1, 1]` (a convolutional classifier) is flattened. */
function asLogits(t: Tensor, what: string): Tensor {
  if (t.rank === 2) return t;
  if (t.rank > 2 && t.shape.slice(2).every((d) => d === 1)) return flatten(t, 1);
  throw new ShapeError(
    "Network.lossAndLogits",
    `${what}: logits must be [batch, classes] (or [batch, classes, 1, 1]), got [${t.shape.join(", ")}]`,
  );
}
