/**
 * The `Tensor` handle: a shape and dtype over storage owned by a backend, plus its place in the
 * gradient graph.
 *
 * Lifetime: a tensor's storage is returned to its backend once the user has disposed the handle
 * (directly or through `tidy`) and no recorded op still needs it for backward. `reshape` views share
 * storage with their source; the storage lives until the last sharer is gone.
 *
 * @module
 */

import type { Backend, DType, HostArray, Storage } from "../backends/backend.ts";
import { type BackwardOptions, backwardPass, type GradNode, releaseNode } from "./autograd.ts";
import { DisposedError, formatShape, ShapeError, TandemError } from "./errors.ts";
import { sizeOf } from "./shape.ts";
import { countBytes, countTensor, trackInScope } from "./context.ts";

/** Storage shared by a tensor and its reshape views, returned to the backend with the last sharer. */
class SharedStorage {
  holders = 1;
  constructor(readonly backend: Backend, readonly storage: Storage) {
    countBytes(storage.length * 4);
  }
  release(): void {
    if (--this.holders === 0) {
      this.backend.release(this.storage);
      countBytes(-this.storage.length * 4);
    }
  }
}

let nextTensorId = 0;

/**
 * An n-dimensional float32 (or int32) array on a backend, with reverse-mode autograd.
 *
 * Create tensors with `tensor`, `zeros`, `randn`, …; combine them with `ops`; read values with
 * `await t.data()`.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../mod.ts";
 * const w = tensor([1, 2, 3], { requiresGrad: true });
 * const loss = ops.sum(ops.mul(w, w));
 * loss.backward();
 * console.log(await w.grad!.data()); // Float32Array [2, 4, 6]
 * ```
 */
export class Tensor {
  /** Unique, increasing id (useful in messages and for stable ordering). */
  readonly id: number = nextTensorId++;
  /** Dimensions, outermost first. */
  readonly shape: readonly number[];
  /** Element type. */
  readonly dtype: DType;
  /** The backend that owns the storage. */
  readonly backend: Backend;
  /** Whether gradients flow to (or through) this tensor. */
  requiresGrad: boolean;
  /** Accumulated gradient of a leaf tensor after `backward()`; `null` before. */
  grad: Tensor | null = null;
  /**
   * The recorded op that produced this tensor, if it is part of a gradient graph.
   *
   * @internal Autograd's bookkeeping; `backward()` and `valueAndGrad` are the public way in.
   */
  node: GradNode | null = null;
  /**
   * Host copy kept for int32 tensors made from host data (labels), so ops can validate them
   * without a device round trip.
   */
  readonly hostInts: Int32Array | undefined;

  #shared: SharedStorage;
  #disposed = false;
  #retainers = 0;
  #storageReleased = false;

  /** @internal Use the creation functions instead. */
  constructor(
    backend: Backend,
    storage: Storage | Tensor,
    shape: readonly number[],
    options: { requiresGrad?: boolean; hostInts?: Int32Array } = {},
  ) {
    this.backend = backend;
    this.shape = Object.freeze([...shape]);
    if (storage instanceof Tensor) {
      this.#shared = storage.#liveShared();
      this.#shared.holders++;
      this.dtype = storage.dtype;
    } else {
      this.#shared = new SharedStorage(backend, storage);
      this.dtype = storage.dtype;
    }
    this.requiresGrad = options.requiresGrad ?? false;
    this.hostInts = options.hostInts;
    countTensor(1);
    trackInScope(this);
  }

  /** Number of elements. */
  get size(): number {
    return this.#shared.storage.length;
  }

  /** Number of dimensions. */
  get rank(): number {
    return this.shape.length;
  }

  /** True after `dispose()` (or the end of the `tidy` scope that created it). */
  get isDisposed(): boolean {
    return this.#disposed;
  }

  /** The backend storage, for ops and backends. Throws if the tensor was disposed. */
  get storage(): Storage {
    return this.#liveShared().storage;
  }

  #liveShared(): SharedStorage {
    if (this.#storageReleased) {
      throw new DisposedError(
        `tensor #${this.id} ${formatShape(this.shape)} was disposed and its storage freed`,
      );
    }
    return this.#shared;
  }

  /**
   * Reads the values back to the host (async, so device backends share the API).
   *
   * @example
   * ```ts
   * import { ones } from "../mod.ts";
   * console.log(await ones([2]).data()); // Float32Array [1, 1]
   * ```
   */
  async data(): Promise<HostArray> {
    return await this.backend.read(this.storage);
  }

  /**
   * Reads the values into `target`, host memory the caller keeps, instead of a fresh array as
   * {@link Tensor.data} returns: where the backend addresses host memory (CPU, `wrap`) the copy goes
   * straight there. A step that reads megabytes each time saves the fresh pages: on a 2-core EPYC
   * VM, `data()` of a 1.2 MB gradient took 4–5 ms where the copy alone takes 0.03 ms. With
   * `columns`, this `[rows, width]` tensor lands as columns `start … start + width − 1` of a
   * `[rows, total]` row-major matrix (a device's slice of a layer's outputs).
   *
   * @example
   * ```ts
   * import { tensor } from "../mod.ts";
   * const out = new Float32Array(6);
   * await tensor([1, 2, 3, 4], { shape: [2, 2] }).readInto(out, { start: 1, total: 3 });
   * console.log(out); // Float32Array [0, 1, 2, 0, 3, 4]
   * ```
   */
  async readInto(target: Float32Array, columns?: { start: number; total: number }): Promise<void> {
    const rows = columns ? this.shape[0] : 1, width = columns ? this.shape[1] : this.size;
    const start = columns?.start ?? 0, total = columns?.total ?? width;
    const fits = this.dtype === "float32" &&
      (columns
        ? this.shape.length === 2 && Number.isInteger(start) && start >= 0 && start + width <= total &&
          rows * total <= target.length
        : target.length === this.size);
    if (!fits) {
      throw new ShapeError(
        "readInto",
        `${this.dtype} tensor ${formatShape(this.shape)} does not fit ${
          columns ? `columns ${start}…${start + width - 1} of ${total} in ` : ""
        }a target of ${target.length} float32 elements`,
      );
    }
    if (this.size === 0) return;
    if (this.backend.wrap) {
      const dense = { offset: 0, strides: [width, 1] };
      this.backend.copyStrided(this.storage, dense, this.backend.wrap(target), {
        offset: start,
        strides: [total, 1],
      }, [rows, width]);
      // A backend that queues its kernels has written host memory only once they ran.
      await this.backend.synchronize?.();
      return;
    }
    const values = (await this.data()) as Float32Array;
    for (let r = 0; r < rows; r++) target.set(values.subarray(r * width, (r + 1) * width), r * total + start);
  }

  /**
   * Synchronous read, available on backends that can do it cheaply (CPU); throws elsewhere.
   *
   * @example
   * ```ts
   * import { ones } from "../mod.ts";
   * console.log(ones([2]).dataSync());
   * ```
   */
  dataSync(): HostArray {
    if (!this.backend.readSync) {
      throw new TandemError(
        `dataSync: backend "${this.backend.name}" reads asynchronously; use await data()`,
      );
    }
    return this.backend.readSync(this.storage);
  }

  /**
   * The single value of a one-element tensor.
   *
   * @example
   * ```ts
   * import { scalar } from "../mod.ts";
   * console.log(await scalar(3).item()); // 3
   * ```
   */
  async item(): Promise<number> {
    if (this.size !== 1) {
      throw new ShapeError("item", `tensor ${formatShape(this.shape)} has ${this.size} elements, expected 1`);
    }
    return (await this.data())[0];
  }

  /**
   * Runs reverse-mode autograd from this scalar, accumulating `.grad` on every leaf that requires
   * gradients (as PyTorch does; clear them between steps with the optimizer's `zeroGrad`).
   *
   * @example
   * ```ts
   * import { ops, tensor } from "../mod.ts";
   * const x = tensor([3], { requiresGrad: true });
   * ops.sum(ops.mul(x, x)).backward();
   * console.log(await x.grad!.data()); // Float32Array [6]
   * ```
   */
  backward(options: BackwardOptions = {}): void {
    backwardPass(this, options).runToEnd();
  }

  /**
   * Frees the tensor. Idempotent. Storage still needed by a recorded op for backward is kept until
   * that graph is freed.
   *
   * @example
   * ```ts
   * import { zeros } from "../mod.ts";
   * const t = zeros([1024]);
   * t.dispose();
   * ```
   */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    countTensor(-1);
    if (this.grad) {
      this.grad.dispose();
      this.grad = null;
    }
    if (this.node) releaseNode(this.node);
    this.#maybeReleaseStorage();
  }

  /** @internal Keeps the storage alive for a recorded op's backward. */
  retainForBackward(): void {
    this.#liveShared();
    this.#retainers++;
  }

  /** @internal Drops a hold taken by {@link Tensor.retainForBackward}. */
  releaseForBackward(): void {
    this.#retainers--;
    this.#maybeReleaseStorage();
  }

  #maybeReleaseStorage(): void {
    if (this.#disposed && this.#retainers === 0 && !this.#storageReleased) {
      this.#storageReleased = true;
      this.#shared.release();
    }
  }

  /**
   * Overwrites this tensor's values with `source`'s (same shape), outside the gradient graph: how
   * optimizers update parameters in place so the tensor handle users hold stays the same.
   *
   * @example
   * ```ts
   * import { ones, zeros } from "../mod.ts";
   * const w = zeros([3]);
   * w.assign(ones([3]));
   * ```
   */
  assign(source: Tensor): void {
    if (source.shape.length !== this.shape.length || source.shape.some((d, i) => d !== this.shape[i])) {
      throw new ShapeError(
        "assign",
        `source ${formatShape(source.shape)} does not match ${formatShape(this.shape)}`,
      );
    }
    if (source.dtype !== this.dtype || source.backend !== this.backend) {
      throw new ShapeError(
        "assign",
        `source is ${source.dtype} on ${source.backend.name}, expected ${this.dtype} on ${this.backend.name}`,
      );
    }
    // From itself (a state loaded partly from the optimizer's own tensors) nothing changes, and a
    // GPU may not bind one buffer for reading and writing in one dispatch.
    if (this.size === 0 || source.storage === this.storage) return;
    const dense = { offset: 0, strides: [1] };
    this.backend.copyStrided(source.storage, dense, this.storage, dense, [this.size]);
  }

  /**
   * @internal Puts this tensor over `storage` (same length and dtype) from now on, keeping the
   * handle: how a device's replica makes its parameters the runtime's shared ones (`cpu_worker.ts`)
   * while the layers keep the tensors they hold. Only for a tensor no graph or view refers to.
   */
  rebind(storage: Storage): void {
    const shared = this.#liveShared();
    if (storage.length !== shared.storage.length || storage.dtype !== this.dtype || shared.holders !== 1) {
      throw new TandemError(
        `tensor #${this.id} ${formatShape(this.shape)} cannot be rebound to that storage`,
      );
    }
    shared.release();
    this.#shared = new SharedStorage(this.backend, storage);
  }

  /** @internal A new tensor on this tensor's backend over `storage` (used by autograd). */
  withStorage(storage: Storage, shape: readonly number[]): Tensor {
    return new Tensor(this.backend, storage, shape);
  }

  /** Shape and dtype, for logs. */
  toString(): string {
    return `Tensor(${formatShape(this.shape)}, ${this.dtype}${this.requiresGrad ? ", requiresGrad" : ""})`;
  }
}

/** @internal A new zero-filled tensor over freshly allocated storage on `backend`. */
export function allocateTensor(backend: Backend, shape: readonly number[], dtype: DType = "float32"): Tensor {
  return new Tensor(backend, backend.allocate(sizeOf(shape), dtype), shape);
}

/**
 * @internal A tensor for a kernel to overwrite whole: its contents are unspecified until then
 * (the backend may skip zero-filling it). Never for a tensor the caller reads before a kernel
 * has written every element.
 */
export function outputTensor(backend: Backend, shape: readonly number[], dtype: DType = "float32"): Tensor {
  const length = sizeOf(shape);
  return new Tensor(
    backend,
    backend.allocateUninitialized?.(length, dtype) ?? backend.allocate(length, dtype),
    shape,
  );
}

/** @internal A tensor sharing `source`'s storage with a different shape of the same size. */
export function viewTensor(source: Tensor, shape: readonly number[]): Tensor {
  return new Tensor(source.backend, source, shape);
}

export type { HostArray };
