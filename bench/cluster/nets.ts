/**
 * Networks the cluster benchmark needs beyond the model zoo: `exchangeProbe(megabytes)`, one FC
 * layer holding `megabytes` of parameters behind a tiny input, so that a training step is almost
 * all exchange — how the FC exchange's rate on a link is measured alone. Imports the engine only:
 * CPU devices' Workers build it.
 *
 * @module
 */

import { Flatten, Linear, Network } from "../../engine/mod.ts";

/**
 * A 16-input FC layer with `megabytes` MB of float32 weights (10 classes out of a wide hidden layer).
 *
 * @example
 * ```ts
 * import { exchangeProbe } from "./nets.ts";
 * console.log(exchangeProbe(4).parameterCount() * 4 / 1e6); // ≈ 4
 * ```
 */
export function exchangeProbe(megabytes: number, seed = 1): Network {
  const hidden = Math.max(1, Math.round(megabytes * 1e6 / 4 / (16 + 10)));
  return new Network(`exchange-probe-${megabytes}MB`, [1, 4, 4], 10, {
    flatten: new Flatten(),
    fc1: new Linear(16, hidden),
    fc2: new Linear(hidden, 10),
  }).initialize(seed);
}
