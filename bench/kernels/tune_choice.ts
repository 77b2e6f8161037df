/**
 * How `deno task tune` decides, apart from its measuring: a candidate's score is the geometric mean
 * of its speedups over the untuned blocks; the margin it must clear is {@link MARGIN} or twice the
 * score the untuned blocks showed against themselves (the noise of the figure compared),
 * whichever is larger; and the leader must clear it twice, in the search and when measured again.
 *
 * @module
 */

import type { GemmBlocks } from "../../backends/cpu/wasm/gemm.ts";

/** The least margin, as a log ratio (3%): a smaller gain is not worth a tuning file. */
export const MARGIN = 0.03;

/** One candidate's measured speedups (untuned time / its time, per product) and their score. */
export interface Measured {
  blocks: GemmBlocks;
  speedups: number[];
  /** Geometric mean of `speedups`. */
  score: number;
}

/**
 * `blocks` with these speedups and their geometric mean.
 *
 * @example
 * ```ts
 * import { measured } from "./tune_choice.ts";
 * measured({ mc: 96, nc: 2048 }, [1.21, 1]).score; // 1.1
 * ```
 */
export function measured(blocks: GemmBlocks, speedups: number[]): Measured {
  const score = Math.exp(speedups.reduce((sum, x) => sum + Math.log(x), 0) / speedups.length);
  return { blocks, speedups, score };
}

/**
 * The margin (log ratio) a candidate's score must clear, given the untuned blocks measured against
 * a second backend in the same blocks over the same products: {@link MARGIN}, or twice their
 * score's deviation from 1×. The score, not the largest single product's deviation: a candidate
 * is judged on its score, and one noisy product (a weight gradient's 64-deep product, which writes
 * far more than it computes, deviated 1.049–1.062× from itself on a 2-core Xeon) would otherwise
 * set a margin (10–13%) that no blocks clear, as the ones there did not at 1.07×, twice, with
 * every product but one ≥ 1×.
 *
 * @example
 * ```ts
 * import { measured, noiseMargin } from "./tune_choice.ts";
 * noiseMargin(measured({ mc: 96, nc: 2048 }, [1.05, 0.99])); // 2·ln √(1.05·0.99) ≈ 0.039
 * ```
 */
export function noiseMargin(noise: Measured): number {
  return Math.max(MARGIN, 2 * Math.abs(Math.log(noise.score)));
}

/**
 * Whether `m`'s score clears `margin` (a log ratio): the one test every choice of the tuner makes.
 *
 * @example
 * ```ts
 * import { clearsMargin, measured } from "./tune_choice.ts";
 * clearsMargin(measured({ mc: 96, nc: 2048 }, [1.05]), 0.03); // true
 * ```
 */
export function clearsMargin(m: Measured, margin: number): boolean {
  return Math.log(m.score) > margin;
}

/**
 * The blocks to file: the leader's when its score and its confirmation's (the leader measured
 * again) both clear `margin`, else the untuned blocks.
 *
 * @example
 * ```ts
 * import { chooseBlocks, measured } from "./tune_choice.ts";
 * const leader = measured({ mc: 288, nc: 2048 }, [1.2]), again = measured({ mc: 288, nc: 2048 }, [1.01]);
 * chooseBlocks({ mc: 192, nc: 4096 }, leader, again, 0.03); // { mc: 192, nc: 4096 }: not confirmed
 * ```
 */
export function chooseBlocks(
  untuned: GemmBlocks,
  leader: Measured,
  confirmation: Measured,
  margin: number,
): GemmBlocks {
  return clearsMargin(leader, margin) && clearsMargin(confirmation, margin) ? confirmation.blocks : untuned;
}
