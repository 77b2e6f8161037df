/**
 * PyTorch DistributedDataParallel's gradient buckets, as groups of a Tandem plan: what a user of DDP
 * gets by default, so that `--schedule bucketed` means what they expect. DDP walks the parameters from
 * the output side and fills a bucket until it holds at least its cap: 1 MiB for the first bucket (so
 * the first all-reduce starts early), `bucket_cap_mb` = 25 MiB for every later one; a tensor larger
 * than the cap makes a bucket on its own. Tandem groups whole layers (a layer's weight and bias stay
 * together), so the same walk runs over layers.
 *
 * @module
 */

import { bucketedPlan } from "./builtins.ts";
import type { Plan } from "./plan.ts";

/** DDP's first bucket cap (`dist._DEFAULT_FIRST_BUCKET_BYTES`): 1 MiB. */
export const DDP_FIRST_BUCKET_BYTES = 1 << 20;

/** DDP's default bucket cap (`bucket_cap_mb=25`): 25 MiB. */
export const DDP_BUCKET_BYTES = 25 << 20;

/** One layer as the bucket rule sees it. */
export interface LayerBytes {
  /** The layer's name, as a model spec's `groups` assignment names it. */
  readonly name: string;
  /** Bytes of its parameters (0 for a parameter-free layer). */
  readonly parameterBytes: number;
}

/** Buckets as plan groups. */
export interface Buckets {
  /** `bucket1` (nearest the output) … `bucketN`: the plan's groups, backward order. */
  readonly groups: string[];
  /** Every layer's bucket; a parameter-free layer joins the bucket of the nearest layer with parameters on its input side. */
  readonly assignment: Record<string, string>;
  /** The parameter bytes of each bucket, in `groups` order. */
  readonly bytes: number[];
  /** The `bucketed` plan over `groups` (train it with a model spec whose `groups` is `assignment`). */
  readonly plan: Plan;
}

/**
 * DDP's buckets over `layers` (forward order, input side first): from the output side, each bucket
 * takes layers until its parameter bytes reach its cap (`firstBucketBytes` for the first, then
 * `bucketBytes`). Layers before the first layer with parameters join the last bucket.
 *
 * @example
 * ```ts
 * import { ddpBuckets } from "./buckets.ts";
 * const MiB = 1 << 20;
 * const { groups, assignment } = ddpBuckets([
 *   { name: "conv1", parameterBytes: 0.1 * MiB },
 *   { name: "relu1", parameterBytes: 0 },
 *   { name: "fc6", parameterBytes: 144 * MiB },
 *   { name: "fc7", parameterBytes: 64 * MiB },
 *   { name: "fc8", parameterBytes: 16 * MiB },
 * ]);
 * console.log(groups, assignment.fc8, assignment.relu1); // [bucket1 … bucket4] bucket1 bucket4
 * ```
 */
export function ddpBuckets(
  layers: readonly LayerBytes[],
  options: { firstBucketBytes?: number; bucketBytes?: number } = {},
): Buckets {
  const first = options.firstBucketBytes ?? DDP_FIRST_BUCKET_BYTES;
  const cap = options.bucketBytes ?? DDP_BUCKET_BYTES;
  const bytes: number[] = [];
  /** Index into `layers` of each bucket's input-most layer with parameters, output side first. */
  const starts: number[] = [];
  let current = 0, open = false;
  for (let i = layers.length - 1; i >= 0; i--) {
    const size = layers[i].parameterBytes;
    if (size <= 0) continue;
    current += size;
    open = true;
    if (current >= (bytes.length === 0 ? first : cap)) {
      bytes.push(current);
      starts.push(i);
      current = 0;
      open = false;
    }
  }
  if (open) {
    bytes.push(current);
    starts.push(layers.findIndex((l) => l.parameterBytes > 0));
  }
  if (bytes.length === 0) {
    // No parameters at all: one bucket holds every layer.
    bytes.push(0);
    starts.push(0);
  }
  const { groups, assignment } = bucketGroups(layers, starts, bytes.length);
  return { groups, assignment, bytes, plan: bucketedPlan(groups) };
}

/**
 * `count` buckets named `bucket1` (output side) … as plan groups over `layers` (forward order), given
 * the index of each bucket's first layer, output side first (`starts`; the last bucket's may be left
 * out): every layer joins the first bucket that starts at or before it, and layers before every start
 * join the last bucket. The one place bucket names and layer assignments are made (`ddpBuckets`, and
 * the equal-byte buckets `autoSchedule` prices).
 *
 * @example
 * ```ts
 * import { bucketGroups } from "./buckets.ts";
 * const layers = [{ name: "conv" }, { name: "relu" }, { name: "fc" }];
 * console.log(bucketGroups(layers, [2], 2).assignment); // { conv: "bucket2", relu: "bucket2", fc: "bucket1" }
 * ```
 */
export function bucketGroups(
  layers: readonly { readonly name: string }[],
  starts: readonly number[],
  count: number,
): { groups: string[]; assignment: Record<string, string> } {
  const groups = Array.from({ length: count }, (_, j) => `bucket${j + 1}`);
  const assignment: Record<string, string> = {};
  layers.forEach((layer, i) => {
    const j = starts.findIndex((start) => i >= start);
    assignment[layer.name] = groups[j < 0 ? count - 1 : j];
  });
  return { groups, assignment };
}
