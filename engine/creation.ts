/**
 * Creating tensors: from host data, constants, and seeded random values.
 *
 * @module
 */

import type { Backend, HostArray, Storage } from "../backends/backend.ts";
import { formatShape, ShapeError, ValueError } from "./errors.ts";
import { nextGlobalKey, normalValues, type RandomKey, uniformValues } from "./random.ts";
import { getBackend } from "./context.ts";
import { checkShape, sizeOf } from "./shape.ts";
import { Tensor } from "./tensor.ts";

/** Nested arrays of numbers, as written in source code. */
export type NestedArray = number | readonly NestedArray[];

/** Options common to the creation functions. */
export interface CreationOptions {
  /** Gradients flow to this tensor (a parameter or an input to differentiate). */
  requiresGrad?: boolean;
}

/** Options of {@link tensor}. */
export interface TensorOptions extends CreationOptions {
  /** Shape of flat data; inferred from nested arrays when omitted. */
  shape?: readonly number[];
  /** `"float32"` (default) or `"int32"` (labels). */
  dtype?: "float32" | "int32";
}

function inferShape(data: NestedArray): number[] {
  const shape: number[] = [];
  let level: NestedArray = data;
  while (Array.isArray(level)) {
    shape.push(level.length);
    level = level[0] as NestedArray;
    if (level === undefined) break;
  }
  return shape;
}

function flatten(data: NestedArray, shape: readonly number[], depth: number, out: number[]): void {
  if (depth === shape.length) {
    if (typeof data !== "number") {
      throw new ShapeError(
        "tensor",
        `ragged nested array: expected a number at depth ${depth} of ${formatShape(shape)}`,
      );
    }
    out.push(data);
    return;
  }
  if (!Array.isArray(data) || data.length !== shape[depth]) {
    throw new ShapeError(
      "tensor",
      `ragged nested array: expected ${shape[depth]} entries at depth ${depth} of ${formatShape(shape)}`,
    );
  }
  for (const item of data) flatten(item, shape, depth + 1, out);
}

/**
 * A tensor holding a copy of `data` on the current backend.
 *
 * @example
 * ```ts
 * import { tensor } from "./creation.ts";
 * const x = tensor([[1, 2], [3, 4]]);                  // float32 [2, 2]
 * const labels = tensor([0, 3, 1], { dtype: "int32" }); // int32 [3]
 * const flat = tensor(new Float32Array(6), { shape: [2, 3] });
 * ```
 */
export function tensor(
  data: NestedArray | ArrayLike<number> | HostArray,
  options: TensorOptions = {},
): Tensor {
  let values: ArrayLike<number>;
  let shape: readonly number[];
  if (typeof data === "number") {
    values = [data];
    shape = options.shape ?? [];
  } else if (ArrayBuffer.isView(data) || !Array.isArray(data) || !data.some(Array.isArray)) {
    values = data as ArrayLike<number>;
    shape = options.shape ?? [values.length];
  } else {
    const inferred = inferShape(data as NestedArray);
    const flat: number[] = [];
    flatten(data as NestedArray, inferred, 0, flat);
    values = flat;
    shape = options.shape ?? inferred;
  }
  checkShape("tensor", shape);
  if (sizeOf(shape) !== values.length) {
    throw new ShapeError(
      "tensor",
      `${values.length} values do not fill shape ${formatShape(shape)} (${sizeOf(shape)})`,
    );
  }
  const backend = getBackend();
  if (options.dtype === "int32" || (options.dtype === undefined && data instanceof Int32Array)) {
    const ints = Int32Array.from(values);
    for (let i = 0; i < values.length; i++) {
      if (ints[i] !== values[i]) {
        throw new ValueError("tensor", `int32 tensor value at ${i} is ${values[i]}, not a 32-bit integer`);
      }
    }
    if (options.requiresGrad) throw new ValueError("tensor", "int32 tensors cannot require gradients");
    return new Tensor(backend, backend.upload(ints), shape, { hostInts: ints });
  }
  const floats = values instanceof Float32Array ? values : Float32Array.from(values);
  return new Tensor(backend, backend.upload(floats), shape, { requiresGrad: options.requiresGrad });
}

/**
 * A zero-dimensional tensor.
 *
 * @example
 * ```ts
 * import { scalar } from "./creation.ts";
 * const half = scalar(0.5);
 * ```
 */
export function scalar(value: number, options: CreationOptions = {}): Tensor {
  return tensor(value, { ...options, shape: [] });
}

/**
 * A tensor of `shape` filled with `value`.
 *
 * @example
 * ```ts
 * import { full } from "./creation.ts";
 * const sevens = full([2, 3], 7);
 * ```
 */
export function full(shape: readonly number[], value: number, options: CreationOptions = {}): Tensor {
  checkShape("full", shape);
  const backend = getBackend();
  const storage = backend.allocate(sizeOf(shape), "float32");
  if (value !== 0) backend.fill(storage, value);
  return new Tensor(backend, storage, shape, options);
}

/**
 * A tensor of zeros.
 *
 * @example
 * ```ts
 * import { zeros } from "./creation.ts";
 * const bias = zeros([64], { requiresGrad: true });
 * ```
 */
export function zeros(shape: readonly number[], options: CreationOptions = {}): Tensor {
  return full(shape, 0, options);
}

/**
 * A tensor of ones.
 *
 * @example
 * ```ts
 * import { ones } from "./creation.ts";
 * const o = ones([3]);
 * ```
 */
export function ones(shape: readonly number[], options: CreationOptions = {}): Tensor {
  return full(shape, 1, options);
}

/** Options of the random creation functions. */
export interface RandomOptions extends CreationOptions, Partial<RandomKey> {
  /** First position of the counter-based sequence (default 0). */
  offset?: number;
}

function keyOf(options: RandomOptions): RandomKey {
  if (options.seed !== undefined) return { seed: options.seed, stream: options.stream ?? 0 };
  return nextGlobalKey();
}

/**
 * Normally distributed values (mean 0, std 1 unless given) from the counter-based generator:
 * identical on every backend and platform for the same seed, stream and offset.
 *
 * @example
 * ```ts
 * import { randn } from "./creation.ts";
 * const w = randn([64, 128], { seed: 1, std: 0.01, requiresGrad: true });
 * ```
 */
export function randn(
  shape: readonly number[],
  options: RandomOptions & { mean?: number; std?: number } = {},
): Tensor {
  checkShape("randn", shape);
  const values = normalValues(
    sizeOf(shape),
    keyOf(options),
    options.offset ?? 0,
    options.mean ?? 0,
    options.std ?? 1,
  );
  return tensor(values, { shape, requiresGrad: options.requiresGrad });
}

/**
 * Uniformly distributed values in [low, high) (default [0, 1)) from the counter-based generator.
 *
 * @example
 * ```ts
 * import { uniform } from "./creation.ts";
 * const u = uniform([10], { seed: 3, low: -1, high: 1 });
 * ```
 */
export function uniform(
  shape: readonly number[],
  options: RandomOptions & { low?: number; high?: number } = {},
): Tensor {
  checkShape("uniform", shape);
  const low = options.low ?? 0, high = options.high ?? 1;
  if (!(high > low)) throw new ValueError("uniform", `high (${high}) must be greater than low (${low})`);
  const values = uniformValues(sizeOf(shape), keyOf(options), options.offset ?? 0, low, high);
  return tensor(values, { shape, requiresGrad: options.requiresGrad });
}

/**
 * A tensor over storage the caller already holds on `backend` (for example a CPU storage wrapping a
 * `SharedArrayBuffer` view), without copying. The tensor releases the storage when disposed.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../mod.ts";
 * import { fromStorage } from "./creation.ts";
 * const cpu = new CpuBackend();
 * const shared = new Float32Array(new SharedArrayBuffer(16));
 * const t = fromStorage(cpu, cpu.wrap(shared), [4]);
 * ```
 */
export function fromStorage(backend: Backend, storage: Storage, shape: readonly number[]): Tensor {
  checkShape("fromStorage", shape);
  if (sizeOf(shape) !== storage.length) {
    throw new ShapeError(
      "fromStorage",
      `storage of ${storage.length} elements does not fit shape ${formatShape(shape)}`,
    );
  }
  return new Tensor(backend, storage, shape);
}
