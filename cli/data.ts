/**
 * Which dataset a run trains on, and the Caffe-style preprocessing that goes with it.
 *
 * @module
 */

import {
  type ImageDataset,
  loadFashionMnistSplit,
  loadMnistDigitsSplit,
  splitDataset,
  syntheticDataset,
} from "../mod.ts";
import type { CaffeTransform } from "../engine/caffe/mod.ts";
import { channelMean, FASHION_MNIST_CLASSES, readCifar10, readMnistIdx } from "../engine/data/mod.ts";
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
  /** Caffe `mirror`: flip training samples at random. */
  mirror?: boolean;
  /** One line for the summary, e.g. `mnist digits (8000 train / 2000 held out)`. */
  description: string;
}

/** What the model expects, to shape synthetic data and check real data against. */
export interface ModelInput {
  /** Per-sample `[C, H, W]`. */
  inputShape: readonly number[];
  /** Output classes. */
  classes: number;
  /** A Caffe data layer's `transform_param`, applied to the images (see {@link fitToModel}). */
  transform?: CaffeTransform;
}

const SOURCES = ["mnist", "fashion-mnist", "cifar10:<dir>", "mnist-idx:<dir>", "synthetic[:CxHxW]"];

/** The most values one synthetic image may hold (4×1024×1024): beyond it a typo, not a wish. */
export const MAX_SYNTHETIC_ELEMENTS = 4 * 1024 * 1024;

/** Synthetic images per run: enough to learn from, few enough to generate at once for big inputs. */
function syntheticCount(sampleSize: number): number {
  // At most about 256 MiB of float32 pixels in all.
  return sampleSize <= 4 * 32 * 32 ? 2000 : Math.max(16, Math.min(250, Math.floor(2 ** 26 / sampleSize)));
}

/**
 * The shape `--data synthetic:CxHxW` gives (channels × height × width, `x` or `×` between positive
 * integers, at most {@link MAX_SYNTHETIC_ELEMENTS} values), or `undefined` for any other source
 * (plain `synthetic` takes the model's input shape). Throws a {@link CliError} naming `--data`, the
 * text and the grammar for a malformed one.
 *
 * @example
 * ```ts
 * import { syntheticShape } from "./data.ts";
 * console.log(syntheticShape("synthetic:3x32x32")); // [3, 32, 32]
 * console.log(syntheticShape("synthetic")); // undefined
 * ```
 */
export function syntheticShape(source: string): [number, number, number] | undefined {
  if (!source.startsWith("synthetic:")) return undefined;
  const text = source.slice("synthetic:".length);
  const dims = text.split(/[x×]/).map((d) => /^\d+$/.test(d) ? Number(d) : NaN);
  const elements = dims.reduce((a, b) => a * b, 1);
  if (dims.length !== 3 || !dims.every((d) => Number.isSafeInteger(d) && d > 0)) {
    throw new CliError(
      `--data ${source}: expected synthetic:CxHxW, three positive integers (channels x height x width), e.g. synthetic:3x32x32; got "${text}"`,
    );
  }
  if (elements > MAX_SYNTHETIC_ELEMENTS) {
    throw new CliError(
      `--data ${source}: ${
        dims.join("×")
      } is ${elements} values per image; expected synthetic:CxHxW of at most ${MAX_SYNTHETIC_ELEMENTS} (e.g. 4x1024x1024)`,
    );
  }
  return dims as [number, number, number];
}

/**
 * `source` with the directory of `cifar10:<dir>` or `mnist-idx:<dir>` passed through `resolve`
 * (every other source names no file).
 *
 * @example
 * ```ts
 * import { resolveDataPaths } from "./data.ts";
 * console.log(resolveDataPaths("cifar10:data", (d) => `/home/me/${d}`)); // cifar10:/home/me/data
 * ```
 */
export function resolveDataPaths(source: string, resolve: (dir: string) => string): string {
  const [kind, ...rest] = source.split(":");
  const dir = rest.join(":");
  return (kind === "cifar10" || kind === "mnist-idx") && dir !== "" ? `${kind}:${resolve(dir)}` : source;
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
      // Reached without a model only for a net that declares no input shape and no shape given
      // (chooseModelForData builds the model from synthetic:CxHxW first).
      if (!model) {
        throw new CliError(
          "--data synthetic is shaped for the model's input, but the model does not declare one " +
            "(its data layer reads a database); give the shape as --data synthetic:CxHxW, e.g. synthetic:3x32x32",
        );
      }
      const [channels, height, width] = syntheticShape(source) ?? model.inputShape;
      const classes = model.classes;
      const count = syntheticCount(channels * height * width);
      const all = syntheticDataset({ count, classes, channels, height, width, seed });
      const { train, test } = splitDataset(all, { testFraction: 0.2, seed: 0 });
      return {
        train,
        test,
        description:
          `synthetic ${channels}×${height}×${width}, ${classes} classes (${train.count} / ${test.count})`,
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
 * the images are larger than the model's input. A Caffe data layer's `transform_param` (the model's
 * `transform`) wins where it speaks: its `scale`, `mean_value`s, `crop_size` and `mirror`; a
 * `mean_file` is not read (the training images' per-channel means stand in for it). Throws a {@link CliError} naming both shapes when
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
  const transform = model.transform ?? {};
  let cropSize: number | undefined;
  if (transform.cropSize !== undefined) {
    // The importer made the crop the model's input; images smaller than it cannot be cropped.
    const crop = transform.cropSize;
    cropSize = crop === h && crop === w && train.height >= crop && train.width >= crop ? crop : -1;
  } else if (train.height !== h || train.width !== w) {
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
  const meanValue = transform.meanValue;
  if (meanValue && meanValue.length !== 1 && meanValue.length !== train.channels) {
    throw new CliError(
      `--data ${source}: the model's data layer (transform_param) gives ${meanValue.length} mean_value entries for these ${train.channels}-channel images; expected 1 or ${train.channels}`,
    );
  }
  const colour = train.channels === 3;
  return {
    train,
    test,
    // Mean-subtracted colour pixels scaled to about unit range, so one default learning rate suits
    // every built-in model (Caffe's cifar10 solvers use scale 1 with a 20× smaller rate instead).
    scale: transform.scale ?? (colour ? 1 / 64 : 1 / 256),
    meanValue: meanValue ?? (colour ? channelMean(train) : undefined),
    cropSize: cropSize === train.height && cropSize === train.width ? undefined : cropSize,
    mirror: transform.mirror,
    description,
  };
}
