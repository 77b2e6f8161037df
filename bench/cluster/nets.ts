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
 * The hidden width is a multiple of 16, so every parameter starts on a 64-byte boundary of the
 * shared buffers, as in the model zoo's nets: a Worker's copies between two `SharedArrayBuffer`s go
 * byte by byte where the two are not 8-byte aligned alike (4.1 GB/s here against 6.3–6.8), and an
 * odd width had put fc2's 25.6 MB of the 66.5 MB probe on that path, slowing its step by a cost
 * no real net has.
 *
 * @example
 * ```ts
 * import { exchangeProbe } from "./nets.ts";
 * console.log(exchangeProbe(4).parameterCount() * 4 / 1e6); // ≈ 4
 * ```
 */
export function exchangeProbe(megabytes: number, seed = 1): Network {
  const hidden = 16 * Math.max(1, Math.round(megabytes * 1e6 / 4 / (16 + 10) / 16));
  return new Network(`exchange-probe-${megabytes}MB`, [1, 4, 4], 10, {
    flatten: new Flatten(),
    fc1: new Linear(16, hidden),
    fc2: new Linear(hidden, 10),
  }).initialize(seed);
}
