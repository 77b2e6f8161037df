/**
 * `Network`: a named `Sequential` that knows its per-sample input shape and class count — what the
 * model zoo and the Caffe importer produce, and what training, checkpoints and the CLI consume.
 *
 * @module
 */

import { Sequential, type SequentialLayers } from "./layers.ts";

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
  /** A network named `name` taking `[C, H, W]` samples and predicting `classes` classes. */
  constructor(
    /** Model name (stored in checkpoints). */
    readonly name: string,
    /** Per-sample input shape, `[channels, height, width]`. */
    readonly inputShape: readonly number[],
    /** Number of output classes. */
    readonly classes: number,
    layers: SequentialLayers,
  ) {
    super(layers);
  }
}
