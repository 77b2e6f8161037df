/**
 * CIFAR-10 binary version reader (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"):
 * each file is a sequence of 3073-byte records, one label byte (0–9) then a 32×32 RGB image as
 * 1024 red, 1024 green and 1024 blue bytes — already CHW, so records copy straight into NCHW.
 *
 * Files are sized and validated before any pixel is read, then streamed in ~1 MB chunks into one
 * preallocated uint8 array per split.
 *
 * @module
 */

import type { ImageDataset } from "./dataset.ts";
import { DataError } from "./errors.ts";
import { CHUNK_BYTES, fileSize, isFile, joinPath, openBytes } from "./io.ts";

/** Bytes per CIFAR-10 record: 1 label + 3×32×32 pixels. */
export const CIFAR10_RECORD_BYTES = 3073;

/** CIFAR-10 class names, index = label. */
export const CIFAR10_CLASSES: readonly string[] = Object.freeze([
  "airplane",
  "automobile",
  "bird",
  "cat",
  "deer",
  "dog",
  "frog",
  "horse",
  "ship",
  "truck",
]);

/** CIFAR-10's training files, in the order their records are concatenated. */
export const CIFAR10_TRAIN_FILES: readonly string[] = Object.freeze(
  [1, 2, 3, 4, 5].map((i) => `data_batch_${i}.bin`),
);

/** CIFAR-10's test file. */
export const CIFAR10_TEST_FILE = "test_batch.bin";

const PIXELS = CIFAR10_RECORD_BYTES - 1;

/**
 * Reads CIFAR-10 binary files and concatenates their records, in the order given, into one uint8
 * dataset (3×32×32, 10 classes). Each file's size must be a positive multiple of 3073 and every
 * label below 10; a {@link DataError} names the file, what was expected and what was found.
 *
 * @example
 * ```ts ignore
 * import { readCifar10Files } from "./cifar.ts";
 * const batch1 = await readCifar10Files(["cifar-10-batches-bin/data_batch_1.bin"], "cifar10/batch1");
 * ```
 */
export async function readCifar10Files(paths: readonly string[], name: string): Promise<ImageDataset> {
  if (paths.length === 0) throw new DataError(name, "no CIFAR-10 files given");
  const records: number[] = [];
  for (const path of paths) {
    const size = await fileSize(path);
    if (size === 0 || size % CIFAR10_RECORD_BYTES !== 0) {
      const whole = Math.floor(size / CIFAR10_RECORD_BYTES);
      throw new DataError(
        path,
        `expected a positive multiple of ${CIFAR10_RECORD_BYTES} bytes (1 label byte + 3072 pixel bytes per ` +
          `record), found ${size} bytes` +
          (size === 0
            ? ""
            : `: ${whole} whole record${whole === 1 ? "" : "s"} and ${
              size % CIFAR10_RECORD_BYTES
            } bytes of a partial one ` +
              `(a complete file of ${whole + 1} records has ${(whole + 1) * CIFAR10_RECORD_BYTES} bytes)`),
      );
    }
    records.push(size / CIFAR10_RECORD_BYTES);
  }
  const count = records.reduce((a, b) => a + b, 0);
  const images = new Uint8Array(count * PIXELS);
  const labels = new Int32Array(count);
  const recordsPerChunk = Math.max(1, Math.floor(CHUNK_BYTES / CIFAR10_RECORD_BYTES));
  const chunk = new Uint8Array(recordsPerChunk * CIFAR10_RECORD_BYTES);
  let next = 0;
  for (let f = 0; f < paths.length; f++) {
    const path = paths[f];
    const reader = await openBytes(path);
    try {
      if (reader.gzip) {
        throw new DataError(
          path,
          "expected an uncompressed CIFAR-10 .bin file, found gzip data (extract it first)",
        );
      }
      for (let done = 0; done < records[f];) {
        const want = Math.min(recordsPerChunk, records[f] - done);
        const got = await reader.readFull(chunk.subarray(0, want * CIFAR10_RECORD_BYTES));
        if (got !== want * CIFAR10_RECORD_BYTES) {
          throw new DataError(
            path,
            `expected ${records[f] * CIFAR10_RECORD_BYTES} bytes, found ${
              done * CIFAR10_RECORD_BYTES + got
            } ` +
              "(the file shrank while being read)",
          );
        }
        for (let r = 0; r < want; r++) {
          const at = r * CIFAR10_RECORD_BYTES;
          const label = chunk[at];
          if (label >= CIFAR10_CLASSES.length) {
            throw new DataError(
              path,
              `record ${done + r} (byte offset ${(done + r) * CIFAR10_RECORD_BYTES}): expected a label in ` +
                `[0, ${CIFAR10_CLASSES.length}), found ${label}; is this the CIFAR-100 or a non-binary version?`,
            );
          }
          labels[next] = label;
          images.set(chunk.subarray(at + 1, at + CIFAR10_RECORD_BYTES), next * PIXELS);
          next++;
        }
        done += want;
      }
    } finally {
      await reader.close();
    }
  }
  return {
    name,
    images,
    labels,
    count,
    channels: 3,
    height: 32,
    width: 32,
    classes: CIFAR10_CLASSES.length,
    classNames: CIFAR10_CLASSES,
  };
}

/**
 * Reads the CIFAR-10 binary version from `dir` (the extracted `cifar-10-batches-bin` folder, or a
 * folder containing it): 50,000 training images from `data_batch_1.bin` … `data_batch_5.bin` in that
 * order, and 10,000 test images from `test_batch.bin`, each as a uint8 NCHW dataset.
 *
 * @example
 * ```ts ignore
 * import { readCifar10 } from "./cifar.ts";
 * const { train, test } = await readCifar10("data/cifar-10-batches-bin");
 * console.log(train.count, test.count); // 50000 10000
 * ```
 */
export async function readCifar10(dir: string): Promise<{ train: ImageDataset; test: ImageDataset }> {
  let root = dir;
  if (!(await isFile(joinPath(root, CIFAR10_TEST_FILE)))) {
    const nested = joinPath(dir, "cifar-10-batches-bin");
    if (await isFile(joinPath(nested, CIFAR10_TEST_FILE))) root = nested;
  }
  const missing: string[] = [];
  for (const file of [...CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE]) {
    if (!(await isFile(joinPath(root, file)))) missing.push(file);
  }
  if (missing.length > 0) {
    throw new DataError(
      dir,
      `expected the CIFAR-10 binary files ${[...CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE].join(", ")}; ` +
        `missing ${missing.join(", ")}`,
    );
  }
  const train = await readCifar10Files(CIFAR10_TRAIN_FILES.map((f) => joinPath(root, f)), "cifar10/train");
  const test = await readCifar10Files([joinPath(root, CIFAR10_TEST_FILE)], "cifar10/test");
  return { train, test };
}
