/**
 * Which dataset a run trains on, and the Caffe-style preprocessing that goes with it.
 *
 * @module
 */

import {
  channelMean,
  FASHION_MNIST_CLASSES,
  type ImageDataset,
  loadFashionMnistSplit,
  loadMnistDigitsSplit,
  readCifar10,
  readMnistIdx,
  splitDataset,
  syntheticDataset,
} from "../mod.ts";
import { CliError, closest } from "./errors.ts";

/** Training and held-out images plus the preprocessing both loaders apply. */
export interface RunData {
  /** Training images. */
  train: ImageDataset;
  /** Held-out images. */
  test: ImageDataset;
  /** Caffe `scale`. */
  scale: number;
  /** Caffe `mean_value` per channel (none for grey digits). */
  meanValue?: number[];
  /** Caffe `crop_size` when the images are larger than the model's input. */
  cropSize?: number;
  /** One line for the summary, e.g. `mnist digits (8000 train / 2000 held out)`. */
  description: string;
}

/** What the model expects, to shape synthetic data and check real data against. */
export interface ModelInput {
  /** Per-sample `[C, H, W]`. */
  inputShape: readonly number[];
  /** Output classes. */
  classes: number;
}

const SOURCES = ["mnist", "fashion-mnist", "cifar10:<dir>", "mnist-idx:<dir>", "synthetic"];

/** Synthetic images per run: enough to learn from, few enough to generate at once for big inputs. */
function syntheticCount(sampleSize: number): number {
  return sampleSize <= 4 * 32 * 32 ? 2000 : 250;
}

/** The images of `source`, before preprocessing is chosen. */
export interface LoadedImages {
  /** Training images. */
  train: ImageDataset;
  /** Held-out images. */
  test: ImageDataset;
  /** One line for the summary. */
  description: string;
}

/**
 * Loads `source`; `model` shapes synthetic data and may be absent for every other source (a Caffe net
 * whose data layer leaves the input shape to the database takes it from the images).
 *
 * @example
 * ```ts ignore
 * import { loadImages } from "./data.ts";
 * const { train } = await loadImages("mnist", undefined, 1);
 * ```
 */
export async function loadImages(source: string, model: ModelInput | undefined, seed: number): Promise<{
  train: ImageDataset;
  test: ImageDataset;
  description: string;
}> {
  const [kind, ...rest] = source.split(":");
  const dir = rest.join(":");
  const needsDir = (what: string) => {
    if (!dir) throw new CliError(`--data ${what}:<dir> needs a directory, e.g. --data ${what}:data/${what}`);
  };
  switch (kind) {
    case "mnist": {
      const { train, test } = await loadMnistDigitsSplit();
      return { train, test, description: `MNIST digits (${train.count} train / ${test.count} held out)` };
    }
    case "fashion-mnist": {
      const { train, test } = await loadFashionMnistSplit();
      return { train, test, description: `Fashion-MNIST (${train.count} train / ${test.count} held out)` };
    }
    case "cifar10": {
      needsDir("cifar10");
      const { train, test } = await readCifar10(dir);
      return { train, test, description: `CIFAR-10 from ${dir} (${train.count} train / ${test.count} test)` };
    }
    case "mnist-idx": {
      needsDir("mnist-idx");
      const fashion = /fashion/i.test(dir);
      const { train, test } = await readMnistIdx(
        dir,
        fashion ? { name: "fashion-mnist", classNames: FASHION_MNIST_CLASSES } : {},
      );
      return { train, test, description: `MNIST IDX files from ${dir} (${train.count} / ${test.count})` };
    }
    case "synthetic": {
      if (!model) {
        throw new CliError(
          "--data synthetic is shaped for the model's input, but the model does not declare one; use real data",
        );
      }
      const [channels, height, width] = model.inputShape;
      const count = syntheticCount(channels * height * width);
      const all = syntheticDataset({ count, classes: model.classes, channels, height, width, seed });
      const { train, test } = splitDataset(all, { testFraction: 0.2, seed: 0 });
      return {
        train,
        test,
        description:
          `synthetic ${channels}×${height}×${width}, ${model.classes} classes (${train.count} / ${test.count})`,
      };
    }
    default: {
      const hint = closest(kind, SOURCES.map((s) => s.split(":")[0]));
      throw new CliError(
        `--data must be one of ${SOURCES.join(", ")}, got "${source}"${
          hint ? `; did you mean ${hint}?` : ""
        }`,
      );
    }
  }
}

const shape = (s: readonly number[]) => s.join("×");

/**
 * Loads `source` for a model and chooses the preprocessing: pixels scaled by 1/256 for grey digits
 * (Caffe's MNIST recipe), per-channel mean subtraction for colour images, a centre/random crop when
 * the images are larger than the model's input. Throws a {@link CliError} naming both shapes when
 * the images cannot feed the model, when held-out and training images differ in size, or when the
 * data has more classes than the model predicts.
 *
 * @example
 * ```ts ignore
 * import { loadRunData } from "./data.ts";
 * const data = await loadRunData("synthetic", { inputShape: [1, 28, 28], classes: 10 }, 1);
 * ```
 */
export async function loadRunData(source: string, model: ModelInput, seed: number): Promise<RunData> {
  return fitToModel(await loadImages(source, model, seed), source, model);
}

/**
 * Checks that loaded images fit `model` and chooses their preprocessing (see {@link loadRunData}).
 *
 * @example
 * ```ts ignore
 * import { fitToModel, loadImages } from "./data.ts";
 * const model = { inputShape: [1, 28, 28], classes: 10 };
 * const data = fitToModel(await loadImages("mnist", model, 1), "mnist", model);
 * ```
 */
export function fitToModel(images: LoadedImages, source: string, model: ModelInput): RunData {
  const { train, test, description } = images;
  const [c, h, w] = model.inputShape;
  const dataShape = [train.channels, train.height, train.width];
  // Found only at the held-out evaluation after the last step otherwise, losing the run's result.
  const testShape = [test.channels, test.height, test.width];
  if (shape(testShape) !== shape(dataShape)) {
    throw new CliError(
      `--data ${source}: the held-out images are ${shape(testShape)} (C×H×W) but the training images are ${
        shape(dataShape)
      }; expected one size for both splits`,
    );
  }
  let cropSize: number | undefined;
  if (train.height !== h || train.width !== w) {
    // Caffe feeds larger images to a smaller net by cropping (crop_size); it needs a square input.
    if (train.height >= h && train.width >= w && h === w) cropSize = h;
    else cropSize = -1;
  }
  if (train.channels !== c || cropSize === -1) {
    throw new CliError(
      `--data ${source} gives ${shape(dataShape)} images (C×H×W) but the model takes ${
        shape(model.inputShape)
      }; choose a model for ${shape(dataShape)} inputs or other data`,
    );
  }
  if (train.classes > model.classes) {
    throw new CliError(
      `--data ${source} has ${train.classes} classes but the model predicts only ${model.classes}`,
    );
  }
  const colour = train.channels === 3;
  return {
    train,
    test,
    // Mean-subtracted colour pixels scaled to about unit range, so one default learning rate suits
    // every built-in model (Caffe's cifar10 solvers use scale 1 with a 20× smaller rate instead).
    scale: colour ? 1 / 64 : 1 / 256,
    meanValue: colour ? channelMean(train) : undefined,
    cropSize,
    description,
  };
}
