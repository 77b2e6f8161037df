/**
 * Parameter initialisers with Caffe's filler semantics. Values come from the counter-based
 * generator keyed by the model seed and the parameter's dotted name, so a model initialises
 * identically on every device and backend, whatever order its layers are built in.
 *
 * @module
 */

import { ValueError } from "../errors.ts";
import { normalValues, type RandomKey, uniformValues } from "../random.ts";

/**
 * How to fill a parameter, as Caffe's `FillerParameter`:
 * - `gaussian`: normal with `std` (default 0.01 here, as AlexNet) and `mean` (default 0);
 * - `xavier`: uniform in ±√(3/n); `msra`: normal with std √(2/n) — n is fan-in (default), fan-out
 *   or their average, with Caffe's fan-in = count / shape[0] and fan-out = count / shape[1];
 * - `uniform`: in [min, max); `constant`: every value `value`.
 */
export type Filler =
  | { type: "gaussian"; std?: number; mean?: number }
  | { type: "xavier"; varianceNorm?: VarianceNorm }
  | { type: "msra"; varianceNorm?: VarianceNorm }
  | { type: "uniform"; min?: number; max?: number }
  | { type: "constant"; value?: number };

/** Which fan Caffe's xavier/msra fillers scale by. */
export type VarianceNorm = "fanIn" | "fanOut" | "average";

function fanOf(shape: readonly number[], norm: VarianceNorm = "fanIn"): number {
  const count = shape.reduce((a, b) => a * b, 1);
  const fanIn = count / (shape[0] ?? 1);
  const fanOut = shape.length > 1 ? count / shape[1] : count;
  return norm === "fanIn" ? fanIn : norm === "fanOut" ? fanOut : (fanIn + fanOut) / 2;
}

/** Open {@link withoutFillers} scopes. */
let fillersSkipped = 0;

/**
 * Runs `build` with `Module.initialize` leaving parameters at zero (buffers still take their
 * values), and returns what it returns: for replicas whose parameters are overwritten as soon as
 * they are built — a data-parallel device gets device 0's — where drawing the values is wasted
 * (bvlc_alexnet's 61 M normal values take 4–5 s), as PyTorch's `skip_init`. The scope is
 * synchronous: an async `build` skips only what it initialises before its first `await`.
 *
 * @example
 * ```ts
 * import { withoutFillers } from "./init.ts";
 * import { alexnetLike } from "../models/alexnet_like.ts";
 * const replica = withoutFillers(() => alexnetLike()); // every parameter 0 until assigned
 * ```
 */
export function withoutFillers<T>(build: () => T): T {
  fillersSkipped++;
  try {
    return build();
  } finally {
    fillersSkipped--;
  }
}

/** Whether parameters are being built inside {@link withoutFillers} (and so keep their zeros). */
export function skippingFillers(): boolean {
  return fillersSkipped > 0;
}

/**
 * The values a filler gives a parameter of `shape` under `key`.
 *
 * @example
 * ```ts
 * import { fillerValues } from "./init.ts";
 * const w = fillerValues({ type: "gaussian", std: 0.01 }, [96, 3, 11, 11], { seed: 1, stream: 7 });
 * ```
 */
export function fillerValues(filler: Filler, shape: readonly number[], key: RandomKey): Float32Array {
  const count = shape.reduce((a, b) => a * b, 1);
  switch (filler.type) {
    case "constant":
      return new Float32Array(count).fill(filler.value ?? 0);
    case "gaussian": {
      const std = filler.std ?? 0.01;
      if (!(std >= 0)) throw new ValueError("gaussian filler", `std must be ≥ 0, got ${std}`);
      return normalValues(count, key, 0, filler.mean ?? 0, std);
    }
    case "uniform": {
      const min = filler.min ?? 0, max = filler.max ?? 1;
      if (!(max > min)) throw new ValueError("uniform filler", `max (${max}) must exceed min (${min})`);
      return uniformValues(count, key, 0, min, max);
    }
    case "xavier": {
      const scale = Math.sqrt(3 / fanOf(shape, filler.varianceNorm));
      return uniformValues(count, key, 0, -scale, scale);
    }
    case "msra":
      return normalValues(count, key, 0, 0, Math.sqrt(2 / fanOf(shape, filler.varianceNorm)));
    default:
      throw new ValueError("filler", `unknown filler type "${(filler as { type: string }).type}"`);
  }
}

/**
 * A 32-bit stream number derived from a name (FNV-1a), so randomness is keyed by where a
 * parameter or layer sits in the model, not by when it was created.
 *
 * @example
 * ```ts
 * import { streamOf } from "./init.ts";
 * console.log(streamOf("conv1.weight"));
 * ```
 */
export function streamOf(name: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) {
    hash ^= name.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash;
}
