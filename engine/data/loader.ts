/**
 * The data loader: per-epoch seeded shuffling, batching, Caffe's `transform_param` preprocessing
 * (crop, mirror, mean subtraction, scale) and sharding of global batches across devices.
 *
 * Every random decision is keyed by position, never by call order (invariant 3 of lossless data
 * parallelism): the epoch's order is a Philox permutation keyed by (seed, epoch), and a sample's
 * crop and mirror are keyed by (seed, epoch, sample index). So sample i gets the same pixels in a
 * batch of 4, in a batch of 2, on device 1 of 2, or after resuming from a checkpoint at any step.
 *
 * @module
 */

import { tensor } from "../creation.ts";
import { slice } from "../ops/movement.ts";
import { noGrad } from "../context.ts";
import type { Tensor } from "../tensor.ts";
import { DATA_STREAMS, type ImageDataset, seededPermutation } from "./dataset.ts";
import { DataError } from "./errors.ts";
import { uniformValues } from "../random.ts";

/**
 * Options of {@link DataLoader}. The preprocessing fields follow Caffe's `transform_param`: a pixel
 * v at source position (c, y, x) becomes `(v − mean) · scale`, where mean is `meanImage[c, y, x]`
 * if given, else `meanValue[c]`, else 0.
 */
export interface DataLoaderOptions {
  /** Samples per global batch. */
  batchSize: number;
  /**
   * `"train"` (default): random crop and (with `mirror`) random mirror, shuffled order.
   * `"eval"`: center crop, no mirror, dataset order — Caffe's TEST phase.
   */
  mode?: "train" | "eval";
  /** Shuffle each epoch; default true in train mode and false in eval mode. */
  shuffle?: boolean;
  /** Seed of shuffling and augmentation; default 0. */
  seed?: number;
  /** Drop the last batch when it is incomplete; default false (it comes out smaller). */
  dropLast?: boolean;
  /** Multiplier applied after mean subtraction (Caffe `scale`, e.g. 1/256 for MNIST); default 1. */
  scale?: number;
  /** Per-channel mean (Caffe `mean_value`): one value for all channels, or one per channel. */
  meanValue?: number | readonly number[];
  /** Per-pixel mean, C×H×W at the dataset's full size (Caffe `mean_file`); overrides `meanValue`. */
  meanImage?: Float32Array;
  /** Side of the square crop (Caffe `crop_size`); default: no crop. */
  cropSize?: number;
  /** Mirror each training sample horizontally with probability 1/2 (Caffe `mirror`); default false. */
  mirror?: boolean;
  /** If given, the number of devices a batch will be sharded over: checks batchSize divides evenly. */
  deviceCount?: number;
}

/** Which part of a global batch a device loads: shard `index` of `count` contiguous equal parts. */
export interface Shard {
  /** The device's position, in [0, count). */
  index: number;
  /** The number of devices. */
  count: number;
}

/**
 * One batch (or one device's shard of it). The caller owns `images` and `labels`: dispose them
 * (or call `dispose()`) when done, or create the batch inside `tidy`.
 */
export interface Batch {
  /** Preprocessed pixels, float32 [B, C, H', W'] (H', W' = crop size if cropping). */
  readonly images: Tensor;
  /** Class indices, int32 [B]. */
  readonly labels: Tensor;
  /** Host copy of the labels (for accuracy and checks without a device read). */
  readonly labelValues: Int32Array;
  /** Dataset index of each sample, in batch order. */
  readonly indices: Int32Array;
  /** The epoch the batch belongs to. */
  readonly epoch: number;
  /** The batch's position within the epoch (the same for all shards of one global batch). */
  readonly step: number;
  /** Which shard of the global batch this is; `{ index: 0, count: 1 }` for a whole batch. */
  readonly shard: Shard;
  /** Disposes `images` and `labels`. */
  dispose(): void;
}

/** Where a sample's crop starts and whether it is mirrored, for one epoch. */
export interface Augmentation {
  /** First source row of the crop. */
  top: number;
  /** First source column of the crop. */
  left: number;
  /** Whether the crop is flipped left–right. */
  mirror: boolean;
}

function checkInteger(what: string, value: number, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new DataError("DataLoader", `${what} must be an integer in [${min}, ${max}], found ${value}`);
  }
  return value;
}

function checkShard(shard: Shard, batchSize: number, what: string): void {
  checkInteger("shard count", shard.count, 1);
  checkInteger("shard index", shard.index, 0, shard.count - 1);
  if (batchSize % shard.count !== 0) {
    throw new DataError(
      what,
      `a batch of ${batchSize} samples cannot be split into ${shard.count} equal shards ` +
        `(${batchSize} % ${shard.count} = ${batchSize % shard.count}); use a batch size divisible by the ` +
        `device count${what === "DataLoader" ? "" : ", or dropLast so no smaller last batch occurs"}`,
    );
  }
}

function makeBatch(
  pixels: Float32Array,
  shape: readonly number[],
  labelValues: Int32Array,
  indices: Int32Array,
  epoch: number,
  step: number,
  shard: Shard,
): Batch {
  const images = tensor(pixels, { shape });
  let labels: Tensor;
  try {
    labels = tensor(labelValues, { dtype: "int32" });
  } catch (error) {
    images.dispose();
    throw error;
  }
  return {
    images,
    labels,
    labelValues,
    indices,
    epoch,
    step,
    shard,
    dispose(): void {
      images.dispose();
      labels.dispose();
    },
  };
}

/**
 * Batches of an {@link ImageDataset}, shuffled per epoch and preprocessed the way Caffe's data layer
 * does it.
 *
 * Epoch e's order is `seededPermutation(N, { seed, stream: DATA_STREAMS.shuffle, step: e })` (or
 * 0…N−1 without shuffling); batch s holds order[s·B … s·B+B). In train mode with a crop, sample i's
 * crop offset is drawn uniformly from the valid offsets and its mirror flag with probability 1/2,
 * from the Philox block at position 4i of `{ seed, stream: DATA_STREAMS.augment, step: e }`; in eval
 * mode the crop is centred (offset ⌊(H − crop)/2⌋, as Caffe) and nothing is mirrored.
 *
 * Batches are computed on demand and random-access (`batch(epoch, step)`), so resuming at any step
 * needs no replay. The caller owns each batch's tensors.
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { DataLoader, syntheticDataset } from "./mod.ts";
 * const ds = syntheticDataset({ count: 256, classes: 4, channels: 3, height: 32, width: 32, seed: 1 });
 * const loader = new DataLoader(ds, { batchSize: 64, cropSize: 28, mirror: true, meanValue: 128, scale: 1 / 64, seed: 7 });
 * for (const batch of loader.batches(0)) {
 *   // batch.images: float32 [64, 3, 28, 28]; batch.labels: int32 [64]
 *   batch.dispose();
 * }
 * ```
 */
export class DataLoader {
  /** The dataset batches come from. */
  readonly dataset: ImageDataset;
  /** Samples per global batch. */
  readonly batchSize: number;
  /** Train (random crop/mirror) or eval (center crop) preprocessing. */
  readonly mode: "train" | "eval";
  /** Whether each epoch is shuffled. */
  readonly shuffle: boolean;
  /** Seed of shuffling and augmentation. */
  readonly seed: number;
  /** Whether an incomplete last batch is dropped. */
  readonly dropLast: boolean;
  /** Shape of one preprocessed sample, [C, H', W']. */
  readonly sampleShape: readonly [number, number, number];

  #scale: number;
  #mean: Float64Array;
  #meanImage: Float32Array | undefined;
  #crop: number;
  #mirror: boolean;
  #orderEpoch = -1;
  #order: Int32Array = new Int32Array(0);

  /** A loader over `dataset`; checks every option against the dataset up front. */
  constructor(dataset: ImageDataset, options: DataLoaderOptions) {
    this.dataset = dataset;
    const { channels, height, width } = dataset;
    this.batchSize = checkInteger("batchSize", options.batchSize, 1);
    this.mode = options.mode ?? "train";
    if (this.mode !== "train" && this.mode !== "eval") {
      throw new DataError(
        "DataLoader",
        `mode must be "train" or "eval", found ${JSON.stringify(options.mode)}`,
      );
    }
    this.shuffle = options.shuffle ?? this.mode === "train";
    this.seed = checkInteger("seed", options.seed ?? 0, 0);
    this.dropLast = options.dropLast ?? false;
    const scale = options.scale ?? 1;
    if (!Number.isFinite(scale)) throw new DataError("DataLoader", `scale must be finite, found ${scale}`);
    this.#scale = Math.fround(scale);
    const meanValue = options.meanValue ?? 0;
    const means = typeof meanValue === "number" ? [meanValue] : meanValue;
    if (means.length !== 1 && means.length !== channels) {
      throw new DataError(
        "DataLoader",
        `meanValue must hold 1 or ${channels} (channels of ${dataset.name}) values, found ${means.length}`,
      );
    }
    if (!means.every(Number.isFinite)) {
      throw new DataError("DataLoader", `meanValue must be finite, found [${means.join(", ")}]`);
    }
    // Caffe replicates a single mean_value over all channels.
    this.#mean = Float64Array.from(
      { length: channels },
      (_, c) => Math.fround(means[means.length === 1 ? 0 : c]),
    );
    if (options.meanImage !== undefined && options.meanImage.length !== channels * height * width) {
      throw new DataError(
        "DataLoader",
        `meanImage must hold C×H×W = ${channels}×${height}×${width} = ${channels * height * width} values ` +
          `(the full-size image of ${dataset.name}, as a Caffe mean_file), found ${options.meanImage.length}`,
      );
    }
    this.#meanImage = options.meanImage;
    this.#crop = options.cropSize === undefined ? 0 : checkInteger("cropSize", options.cropSize, 1);
    if (this.#crop > height || this.#crop > width) {
      throw new DataError(
        "DataLoader",
        `cropSize ${this.#crop} does not fit in the ${height}×${width} images of ${dataset.name}`,
      );
    }
    this.#mirror = options.mirror ?? false;
    if (options.deviceCount !== undefined) {
      checkShard({ index: 0, count: options.deviceCount }, this.batchSize, "DataLoader");
    }
    this.sampleShape = [channels, this.#crop || height, this.#crop || width];
  }

  /** Batches per epoch: ⌈N / B⌉, or ⌊N / B⌋ with `dropLast`. */
  get numBatches(): number {
    const n = this.dataset.count;
    return this.dropLast ? Math.floor(n / this.batchSize) : Math.ceil(n / this.batchSize);
  }

  /**
   * The dataset indices in the order epoch `epoch` visits them (a fresh copy).
   *
   * @example
   * ```ts
   * import { DataLoader, syntheticDataset } from "./mod.ts";
   * const loader = new DataLoader(syntheticDataset({ count: 8, classes: 2, seed: 1 }), { batchSize: 4, seed: 3 });
   * console.log(loader.order(0)); // a permutation of 0…7
   * ```
   */
  order(epoch: number): Int32Array {
    return this.#epochOrder(epoch).slice();
  }

  #epochOrder(epoch: number): Int32Array {
    checkInteger("epoch", epoch, 0, 2 ** 32 - 1);
    if (epoch !== this.#orderEpoch) {
      const n = this.dataset.count;
      this.#order = this.shuffle
        ? seededPermutation(n, { seed: this.seed, stream: DATA_STREAMS.shuffle, step: epoch })
        : Int32Array.from({ length: n }, (_, i) => i);
      this.#orderEpoch = epoch;
    }
    return this.#order;
  }

  /**
   * Where sample `index`'s crop starts in epoch `epoch` and whether it is mirrored: a pure function of
   * (seed, epoch, index) in train mode, the center crop in eval mode.
   *
   * @example
   * ```ts
   * import { DataLoader, syntheticDataset } from "./mod.ts";
   * const ds = syntheticDataset({ count: 8, classes: 2, height: 32, width: 32, seed: 1 });
   * const loader = new DataLoader(ds, { batchSize: 4, cropSize: 28, mirror: true });
   * console.log(loader.augmentation(5, 0)); // e.g. { top: 3, left: 0, mirror: true }
   * ```
   */
  augmentation(index: number, epoch: number): Augmentation {
    checkInteger("sample index", index, 0, this.dataset.count - 1);
    checkInteger("epoch", epoch, 0, 2 ** 32 - 1);
    const { height, width } = this.dataset;
    if (this.mode === "eval") {
      return this.#crop
        ? {
          top: Math.floor((height - this.#crop) / 2),
          left: Math.floor((width - this.#crop) / 2),
          mirror: false,
        }
        : { top: 0, left: 0, mirror: false };
    }
    if (!this.#crop && !this.#mirror) return { top: 0, left: 0, mirror: false };
    // One Philox block (4 values) per sample: positions 4i…4i+2.
    const [u0, u1, u2] = uniformValues(
      3,
      { seed: this.seed, stream: DATA_STREAMS.augment, step: epoch },
      4 * index,
    );
    return {
      top: this.#crop ? Math.floor(u0 * (height - this.#crop + 1)) : 0,
      left: this.#crop ? Math.floor(u1 * (width - this.#crop + 1)) : 0,
      mirror: this.#mirror && u2 < 0.5,
    };
  }

  /**
   * Dataset indices of batch `step` of epoch `epoch` (or of one shard of it).
   *
   * @example
   * ```ts
   * import { DataLoader, syntheticDataset } from "./mod.ts";
   * const loader = new DataLoader(syntheticDataset({ count: 10, classes: 2, seed: 1 }), { batchSize: 4 });
   * console.log(loader.batchIndices(0, 2)); // the last 2 samples of epoch 0's order
   * ```
   */
  batchIndices(epoch: number, step: number, shard: Shard = { index: 0, count: 1 }): Int32Array {
    checkInteger("step", step, 0, this.numBatches - 1);
    const order = this.#epochOrder(epoch);
    const start = step * this.batchSize;
    const size = Math.min(this.batchSize, order.length - start);
    checkShard(shard, size, `${this.dataset.name} epoch ${epoch} batch ${step}`);
    const part = size / shard.count;
    return order.slice(start + shard.index * part, start + (shard.index + 1) * part);
  }

  /**
   * Loads batch `step` of epoch `epoch` — or only shard `shard` of it, for one device of a
   * data-parallel run; its pixels equal the matching rows of the whole batch exactly.
   *
   * @example
   * ```ts
   * import "../../mod.ts";
   * import { DataLoader, syntheticDataset } from "./mod.ts";
   * const loader = new DataLoader(syntheticDataset({ count: 64, classes: 4, seed: 1 }), { batchSize: 16, seed: 2 });
   * const device1 = loader.batch(3, 1, { index: 1, count: 2 }); // samples 8…15 of epoch 3's batch 1
   * device1.dispose();
   * ```
   */
  batch(epoch: number, step: number, shard: Shard = { index: 0, count: 1 }): Batch {
    const indices = this.batchIndices(epoch, step, shard);
    return this.#load(indices, epoch, step, { index: shard.index, count: shard.count });
  }

  /**
   * The batches of epoch `epoch` in order (optionally one shard of each), computed lazily: each is
   * made when the iterator advances, so memory holds one batch at a time if the caller disposes it.
   *
   * @example
   * ```ts
   * import "../../mod.ts";
   * import { DataLoader, syntheticDataset } from "./mod.ts";
   * const loader = new DataLoader(syntheticDataset({ count: 64, classes: 4, seed: 1 }), { batchSize: 16 });
   * for (const { images, labels, dispose } of loader.batches(0)) {
   *   dispose();
   * }
   * ```
   */
  *batches(epoch: number, shard?: Shard): Generator<Batch, void, undefined> {
    checkInteger("epoch", epoch, 0, 2 ** 32 - 1);
    for (let step = 0; step < this.numBatches; step++) yield this.batch(epoch, step, shard);
  }

  /**
   * Loads arbitrary samples (dataset indices, in the given order) with epoch `epoch`'s augmentation:
   * each sample's pixels depend only on (seed, epoch, its index), not on its neighbours.
   *
   * @example
   * ```ts
   * import "../../mod.ts";
   * import { DataLoader, syntheticDataset } from "./mod.ts";
   * const loader = new DataLoader(syntheticDataset({ count: 64, classes: 4, seed: 1 }), { batchSize: 16 });
   * const two = loader.load([5, 9], 0);
   * two.dispose();
   * ```
   */
  load(indices: ArrayLike<number>, epoch: number, step = 0): Batch {
    const chosen = Int32Array.from(indices as ArrayLike<number>);
    for (let k = 0; k < chosen.length; k++) {
      if (chosen[k] !== indices[k] || chosen[k] < 0 || chosen[k] >= this.dataset.count) {
        throw new DataError(
          this.dataset.name,
          `sample ${k} must be an index in [0, ${this.dataset.count}), found ${indices[k]}`,
        );
      }
    }
    checkInteger("epoch", epoch, 0, 2 ** 32 - 1);
    return this.#load(chosen, epoch, step, { index: 0, count: 1 });
  }

  #load(indices: Int32Array, epoch: number, step: number, shard: Shard): Batch {
    const [c, oh, ow] = this.sampleShape;
    const per = c * oh * ow;
    const pixels = new Float32Array(indices.length * per);
    const labels = new Int32Array(indices.length);
    for (let k = 0; k < indices.length; k++) {
      this.#transform(indices[k], epoch, pixels, k * per);
      labels[k] = this.dataset.labels[indices[k]];
    }
    return makeBatch(pixels, [indices.length, c, oh, ow], labels, indices, epoch, step, shard);
  }

  /** Crop, mirror, subtract the mean and scale one sample into `out` at `at`. */
  #transform(index: number, epoch: number, out: Float32Array, at: number): void {
    const { channels, height, width, images } = this.dataset;
    const [, oh, ow] = this.sampleShape;
    const { top, left, mirror } = this.augmentation(index, epoch);
    const scale = this.#scale, meanImage = this.#meanImage;
    for (let c = 0; c < channels; c++) {
      const mean = this.#mean[c];
      for (let y = 0; y < oh; y++) {
        // Caffe indexes the mean at the source position (before mirroring).
        const source = ((index * channels + c) * height + top + y) * width + left;
        const meanRow = (c * height + top + y) * width + left;
        const row = at + (c * oh + y) * ow;
        for (let x = 0; x < ow; x++) {
          const m = meanImage ? meanImage[meanRow + x] : mean;
          // Rounding the difference to float32 before the (exact in float64) product, and the
          // product on store, reproduces Caffe's float arithmetic bit for bit.
          out[row + (mirror ? ow - 1 - x : x)] = Math.fround(images[source + x] - m) * scale;
        }
      }
    }
  }
}

/**
 * Splits a batch into `deviceCount` contiguous, equal shards in device order (invariant 4): shard d
 * holds rows [d·B/n, (d+1)·B/n). The shards are new tensors the caller owns; the batch is left as is.
 * Loading a shard directly with `loader.batch(epoch, step, { index, count })` gives the same values
 * without materialising the whole batch.
 *
 * @example
 * ```ts
 * import "../../mod.ts";
 * import { DataLoader, shardBatch, syntheticDataset } from "./mod.ts";
 * const loader = new DataLoader(syntheticDataset({ count: 64, classes: 4, seed: 1 }), { batchSize: 16 });
 * const batch = loader.batch(0, 0);
 * const [first, second] = shardBatch(batch, 2); // 8 samples each
 * for (const b of [batch, first, second]) b.dispose();
 * ```
 */
export function shardBatch(batch: Batch, deviceCount: number): Batch[] {
  const size = batch.indices.length;
  checkShard({ index: 0, count: deviceCount }, size, `shardBatch (epoch ${batch.epoch}, step ${batch.step})`);
  if (batch.shard.count !== 1) {
    throw new DataError(
      "shardBatch",
      `the batch is already shard ${batch.shard.index} of ${batch.shard.count}`,
    );
  }
  const part = size / deviceCount;
  const [, c, h, w] = batch.images.shape;
  const shards: Batch[] = [];
  try {
    for (let d = 0; d < deviceCount; d++) {
      const images = noGrad(() => slice(batch.images, [d * part, 0, 0, 0], [part, c, h, w]));
      let labels: Tensor;
      try {
        labels = tensor(batch.labelValues.slice(d * part, (d + 1) * part), { dtype: "int32" });
      } catch (error) {
        images.dispose();
        throw error;
      }
      shards.push({
        images,
        labels,
        labelValues: labels.hostInts!,
        indices: batch.indices.slice(d * part, (d + 1) * part),
        epoch: batch.epoch,
        step: batch.step,
        shard: { index: d, count: deviceCount },
        dispose(): void {
          images.dispose();
          labels.dispose();
        },
      });
    }
  } catch (error) {
    for (const s of shards) s.dispose();
    throw error;
  }
  return shards;
}
