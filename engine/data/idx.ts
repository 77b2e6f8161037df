/**
 * IDX readers for MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/): big-endian headers,
 * magic 2051 (0x00000803: unsigned bytes, 3 dimensions) for images and 2049 (0x00000801: unsigned
 * bytes, 1 dimension) for labels, then the raw bytes. Plain or gzip files (detected by content,
 * decompressed with the built-in `DecompressionStream`).
 *
 * The header is read and checked against the file's size before the payload is allocated; the
 * payload is streamed in chunks straight into its final typed array.
 *
 * @module
 */

import type { ImageDataset } from "./dataset.ts";
import { DataError } from "./errors.ts";
import { type ByteReader, CHUNK_BYTES, isFile, joinPath, openBytes } from "./io.ts";

/** IDX magic number of an image file (ubyte, 3 dimensions). */
export const IDX_IMAGES_MAGIC = 2051;
/** IDX magic number of a label file (ubyte, 1 dimension). */
export const IDX_LABELS_MAGIC = 2049;

/** Fashion-MNIST class names, index = label. */
export const FASHION_MNIST_CLASSES: readonly string[] = Object.freeze([
  "T-shirt/top",
  "Trouser",
  "Pullover",
  "Dress",
  "Coat",
  "Sandal",
  "Shirt",
  "Sneaker",
  "Bag",
  "Ankle boot",
]);

/** Images of an IDX file: `count` uint8 images of `height`×`width`, row-major. */
export interface IdxImages {
  /** Number of images. */
  readonly count: number;
  /** Rows per image. */
  readonly height: number;
  /** Columns per image. */
  readonly width: number;
  /** count×height×width bytes. */
  readonly pixels: Uint8Array;
}

/** Deflate cannot expand data by more than about 1032:1, which bounds what a gzip file can hold. */
const MAX_GZIP_RATIO = 1032;

function describeMagic(magic: number): string {
  if (magic === IDX_IMAGES_MAGIC) return `${magic} (an IDX image file)`;
  if (magic === IDX_LABELS_MAGIC) return `${magic} (an IDX label file)`;
  return `${magic} (0x${magic.toString(16).padStart(8, "0")}, not an IDX ubyte file)`;
}

/** Reads and checks the header, then streams exactly the payload the header promises. */
async function readIdx(
  path: string,
  magic: number,
  rank: number,
  what: string,
): Promise<{ dims: number[]; payload: Uint8Array }> {
  const reader = await openBytes(path);
  try {
    const headerBytes = 4 + 4 * rank;
    const header = new Uint8Array(headerBytes);
    const got = await reader.readFull(header);
    const view = new DataView(header.buffer);
    if (got >= 4 && view.getUint32(0) !== magic) {
      throw new DataError(
        path,
        `expected IDX magic ${describeMagic(magic)} for ${what}, found ${describeMagic(view.getUint32(0))}`,
      );
    }
    if (got < headerBytes) {
      throw new DataError(
        path,
        `truncated header: expected ${headerBytes} header bytes for ${what}, found ${got}${
          reader.gzip ? " (after decompression)" : ""
        }`,
      );
    }
    const dims = Array.from({ length: rank }, (_, i) => view.getUint32(4 + 4 * i));
    const payloadBytes = dims.reduce((a, b) => a * b, 1);
    const expected = headerBytes + payloadBytes;
    const formula = `${headerBytes} + ${dims.join("×")} = ${expected} bytes`;
    if (!reader.gzip && reader.fileBytes !== expected) {
      throw new DataError(
        path,
        `${reader.fileBytes < expected ? "truncated" : "trailing data"}: the header promises ${what} of ` +
          `${dims.join("×")}, so expected ${formula}, found ${reader.fileBytes} bytes`,
      );
    }
    if (reader.gzip && expected > reader.fileBytes * MAX_GZIP_RATIO + 1024) {
      throw new DataError(
        path,
        `the header promises ${formula} but a gzip file of ${reader.fileBytes} bytes cannot hold that much; ` +
          "the file is truncated or corrupt",
      );
    }
    const payload = new Uint8Array(payloadBytes);
    const truncated = (found: number, detail = "") =>
      new DataError(
        path,
        `truncated: the header promises ${what} of ${dims.join("×")}, so expected ${formula}` +
          `${reader.gzip ? " after decompression" : ""}, found ${found} bytes${detail}`,
      );
    for (let done = 0; done < payloadBytes;) {
      const want = Math.min(payloadBytes - done, CHUNK_BYTES);
      let n: number;
      try {
        n = await reader.readFull(payload.subarray(done, done + want));
      } catch (error) {
        if (!(error instanceof DataError) || !reader.gzip) throw error;
        throw truncated(
          reader.position,
          ` before the gzip stream broke off: ${error.message.slice(error.source.length + 2)}`,
        );
      }
      done += n;
      if (n < want) throw truncated(headerBytes + done);
    }
    if (reader.gzip) {
      try {
        await expectEnd(reader, expected);
      } catch (error) {
        if (!(error instanceof DataError) || error.message.includes("trailing data")) throw error;
        throw new DataError(
          path,
          `corrupt gzip data after the ${formula} the header promises: ${
            error.message.slice(error.source.length + 2)
          }`,
        );
      }
    }
    return { dims, payload };
  } finally {
    await reader.close();
  }
}

async function expectEnd(reader: ByteReader, expected: number): Promise<void> {
  const probe = new Uint8Array(CHUNK_BYTES);
  let extra = 0;
  for (;;) {
    const n = await reader.readFull(probe);
    extra += n;
    if (n < probe.length) break;
  }
  if (extra > 0) {
    throw new DataError(
      reader.path,
      `trailing data: expected ${expected} bytes after decompression, found ${expected + extra}`,
    );
  }
}

/**
 * Reads an IDX image file (`*-images-idx3-ubyte`, optionally gzip): magic 2051, count, rows, columns,
 * then the pixels. The file's size must match its header exactly; a {@link DataError} names the file
 * and the expected and found byte counts.
 *
 * @example
 * ```ts ignore
 * import { readIdxImages } from "./idx.ts";
 * const { count, height, width, pixels } = await readIdxImages("mnist/train-images-idx3-ubyte.gz");
 * ```
 */
export async function readIdxImages(path: string): Promise<IdxImages> {
  const { dims, payload } = await readIdx(path, IDX_IMAGES_MAGIC, 3, "images");
  const [count, height, width] = dims;
  return { count, height, width, pixels: payload };
}

/**
 * Reads an IDX label file (`*-labels-idx1-ubyte`, optionally gzip): magic 2049, count, then one byte
 * per label.
 *
 * @example
 * ```ts ignore
 * import { readIdxLabels } from "./idx.ts";
 * const labels = await readIdxLabels("mnist/train-labels-idx1-ubyte.gz"); // Int32Array(60000)
 * ```
 */
export async function readIdxLabels(path: string): Promise<Int32Array> {
  const { payload } = await readIdx(path, IDX_LABELS_MAGIC, 1, "labels");
  return Int32Array.from(payload);
}

async function findIdxFile(dir: string, prefix: string, kind: "images" | "labels"): Promise<string> {
  const suffix = kind === "images" ? "idx3-ubyte" : "idx1-ubyte";
  // The canonical name, the dotted variant some mirrors use, each plain or gzip.
  const names = [`${prefix}-${kind}-${suffix}`, `${prefix}-${kind}.${suffix}`].flatMap((n) => [n, `${n}.gz`]);
  for (const name of names) {
    const path = joinPath(dir, name);
    if (await isFile(path)) return path;
  }
  throw new DataError(dir, `expected one of ${names.join(", ")}; found none`);
}

/** Options of {@link readMnistIdx}. */
export interface MnistIdxOptions {
  /** Dataset name prefix; default `"mnist"`. */
  name?: string;
  /** Class names (e.g. {@link FASHION_MNIST_CLASSES}); default the digits "0" … "9". */
  classNames?: readonly string[];
}

async function readSplit(
  dir: string,
  prefix: string,
  name: string,
  classNames: readonly string[],
): Promise<ImageDataset> {
  const imagesPath = await findIdxFile(dir, prefix, "images");
  const labelsPath = await findIdxFile(dir, prefix, "labels");
  const images = await readIdxImages(imagesPath);
  const labels = await readIdxLabels(labelsPath);
  if (labels.length !== images.count) {
    throw new DataError(
      labelsPath,
      `expected ${images.count} labels (one per image of ${imagesPath}), found ${labels.length}`,
    );
  }
  for (let i = 0; i < labels.length; i++) {
    if (labels[i] >= classNames.length) {
      throw new DataError(
        labelsPath,
        `label ${i}: expected a class in [0, ${classNames.length}), found ${labels[i]}`,
      );
    }
  }
  return {
    name,
    images: images.pixels,
    labels,
    count: images.count,
    channels: 1,
    height: images.height,
    width: images.width,
    classes: classNames.length,
    classNames,
  };
}

/**
 * Reads MNIST or Fashion-MNIST from the four standard IDX files in `dir` (`train-images-idx3-ubyte`,
 * `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`, each plain or `.gz`):
 * 60,000 training and 10,000 test images as uint8 1×28×28 datasets with 10 classes.
 *
 * @example
 * ```ts ignore
 * import { FASHION_MNIST_CLASSES, readMnistIdx } from "./idx.ts";
 * const mnist = await readMnistIdx("data/mnist");
 * const fashion = await readMnistIdx("data/fashion", { name: "fashion-mnist", classNames: FASHION_MNIST_CLASSES });
 * ```
 */
export async function readMnistIdx(
  dir: string,
  options: MnistIdxOptions = {},
): Promise<{ train: ImageDataset; test: ImageDataset }> {
  const name = options.name ?? "mnist";
  const classNames = options.classNames ?? Array.from({ length: 10 }, (_, k) => String(k));
  const train = await readSplit(dir, "train", `${name}/train`, classNames);
  const test = await readSplit(dir, "t10k", `${name}/test`, classNames);
  return { train, test };
}
