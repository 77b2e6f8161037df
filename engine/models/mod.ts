/**
 * The model zoo: Caffe's reference nets (AlexNet, CaffeNet, cifar10_quick, LeNet) with their exact
 * layer names, fillers and multipliers, plus the small AlexNet-like default the CLI trains, and a
 * registry for looking them up by name.
 *
 * @example
 * ```ts
 * import { builtinModels } from "./mod.ts";
 * const net = builtinModels["alexnet-like"].create({ seed: 1 });
 * ```
 *
 * @module
 */

import type { Network } from "../nn/network.ts";
import { alexnet, caffenet } from "./alexnet.ts";
import { alexnetLike, type AlexnetLikeOptions } from "./alexnet_like.ts";
import type { ModelOptions } from "./options.ts";
import { cifarQuick, lenet } from "./small.ts";

export { alexnet, caffenet } from "./alexnet.ts";
export { alexnetLike, type AlexnetLikeOptions } from "./alexnet_like.ts";
export { cifarQuick, lenet } from "./small.ts";
export type { ModelOptions } from "./options.ts";

/**
 * A registry entry: how to build the model and what it expects.
 *
 * @example
 * ```ts
 * import type { BuiltinModel } from "./mod.ts";
 * function describe(m: BuiltinModel) { return `${m.description} — input ${m.inputShape.join("×")}`; }
 * ```
 */
export interface BuiltinModel {
  /** Builds the model, initialised with `options.seed` (default 0). */
  create(options?: ModelOptions): Network;
  /** Per-sample input `[channels, height, width]`. */
  readonly inputShape: readonly number[];
  /** Default number of classes. */
  readonly classes: number;
  /** One line for `--help` and listings. */
  readonly description: string;
}

/**
 * Names accepted by {@link builtinModels}.
 *
 * @example
 * ```ts
 * import type { BuiltinModelName } from "./mod.ts";
 * const name: BuiltinModelName = "cifar-quick";
 * ```
 */
export type BuiltinModelName = "alexnet" | "caffenet" | "cifar-quick" | "lenet" | "alexnet-like";

/**
 * Every built-in model by CLI name.
 *
 * @example
 * ```ts
 * import { builtinModels } from "./mod.ts";
 * for (const [name, m] of Object.entries(builtinModels)) console.log(name, m.description);
 * ```
 */
export const builtinModels: Readonly<Record<BuiltinModelName, BuiltinModel>> = Object.freeze({
  "alexnet": {
    create: (options?: ModelOptions) => alexnet(options),
    inputShape: [3, 227, 227],
    classes: 1000,
    description: "AlexNet as Caffe's bvlc_alexnet (60,965,224 parameters, 96.2% in FC layers)",
  },
  "caffenet": {
    create: (options?: ModelOptions) => caffenet(options),
    inputShape: [3, 227, 227],
    classes: 1000,
    description: "CaffeNet (bvlc_reference_caffenet): AlexNet with pooling before LRN",
  },
  "cifar-quick": {
    create: (options?: ModelOptions) => cifarQuick(options),
    inputShape: [3, 32, 32],
    classes: 10,
    description: "Caffe's cifar10_quick for 32×32 colour images (145,578 parameters)",
  },
  "lenet": {
    create: (options?: ModelOptions) => lenet(options),
    inputShape: [1, 28, 28],
    classes: 10,
    description: "Caffe's MNIST LeNet (431,080 parameters)",
  },
  "alexnet-like": {
    create: (options?: AlexnetLikeOptions) => alexnetLike(options),
    inputShape: [1, 28, 28],
    classes: 10,
    description:
      "small AlexNet for 28×28 grey images (default): 1.09 M parameters, 95.7% FC; 80.6% of FLOPs in conv",
  },
});
