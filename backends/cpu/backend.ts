/**
 * The CPU backend: storages are typed arrays on the host. Where the engine supports SIMD128, GEMM,
 * convolution, pooling, LRN, ReLU and its gradient, the bias add, row sums, the device-order average,
 * the SGD and Adam updates and the non-finite check run as WebAssembly kernels generated at run time
 * (`wasm/`), the heavy ones multi-threaded over shared memory, and storages are allocated inside the
 * kernels' memory so those kernels use them in place; everything else, and everything on engines
 * without SIMD128, runs as plain TypeScript loops. `new CpuBackend({ kernels: "ts" })` keeps to
 * TypeScript throughout: that is the reference the WebAssembly kernels (and every other backend)
 * are tested against.
 *
 * It stays one file although long: it is the one class that implements the backend contract, one
 * short method per operation that picks the WebAssembly kernel or the TypeScript loop; the kernels
 * themselves live in `wasm/` and the loops in their own files.
 *
 * @module
 */

import type {
  Activation,
  AdamStep,
  Backend,
  BinaryOp,
  Conv2dGeometry,
  DropoutMaskSpec,
  DType,
  HostArray,
  LrnParams,
  MatmulSpec,
  MaxPoolBackwardEpilogue,
  MemoryLoan,
  Pool2dGeometry,
  ReduceOp,
  RowSpec,
  SgdSaved,
  SgdStep,
  Storage,
  StridedView,
  UnaryOp,
} from "../backend.ts";
import { conv2dBackwardFilter, conv2dBackwardInput, conv2dForward } from "./conv.ts";
import {
  averageKernel,
  binaryKernel,
  copyStridedKernel,
  firstNonFiniteIndex,
  reduceKernel,
  unaryKernel,
} from "./elementwise.ts";
import { addRowBias, gemm } from "./gemm.ts";
import { adamUpdateKernel, sgdUpdateKernel } from "./optimizers.ts";
import { lrnBackward, lrnForward } from "./lrn.ts";
import { avgPool2dBackward, avgPool2dForward, maxPool2dBackward, maxPool2dForward } from "./pool.ts";
import {
  logSoftmaxKernel,
  softmaxCrossEntropyBackwardKernel,
  softmaxCrossEntropyKernel,
  softmaxKernel,
} from "./softmax.ts";
import { isDenseView } from "../geometry.ts";
import { ArrayPool } from "./array_pool.ts";
import { WasmKernels } from "./wasm/kernels.ts";
import type { GemmBlocks } from "./wasm/gemm.ts";

/**
 * CPU storage: a typed array the kernels use directly.
 *
 * @example
 * ```ts
 * import { CpuStorage } from "./backend.ts";
 * const s = new CpuStorage(new Float32Array([1, 2, 3]));
 * console.log(s.length, s.dtype); // 3 "float32"
 * ```
 */
export class CpuStorage implements Storage {
  /**
   * Wraps `data` without copying. A `view` is part of another storage's array, which releasing it
   * must leave alone.
   */
  constructor(readonly data: HostArray, readonly view = false) {}
  get length(): number {
    return this.data.length;
  }
  get dtype(): DType {
    return this.data instanceof Int32Array ? "int32" : "float32";
  }
}

function f32(storage: Storage): Float32Array {
  return (storage as CpuStorage).data as Float32Array;
}

function i32(storage: Storage): Int32Array {
  return (storage as CpuStorage).data as Int32Array;
}

/**
 * Options of {@link CpuBackend}.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "./backend.ts";
 * const oracle = new CpuBackend({ name: "cpu-ts", kernels: "ts" });
 * const fourThreads = new CpuBackend({ threads: 4 });
 * const plainSimd = new CpuBackend({ relaxedSimd: false });
 * ```
 */
export interface CpuBackendOptions {
  /** Name to register it under (default `"cpu"`), e.g. `"cpu-ts"` for a TypeScript oracle beside it. */
  name?: string;
  /**
   * `"wasm"`: GEMM and convolution in generated WebAssembly SIMD (needs SIMD128); `"ts"`: pure
   * TypeScript everywhere (the oracle); `"auto"` (default): WebAssembly where supported.
   */
  kernels?: "auto" | "wasm" | "ts";
  /**
   * Use relaxed SIMD's fused multiply-add where the runtime has it (default true); false keeps
   * to plain SIMD128 (`f32x4.mul` + `f32x4.add`), as on runtimes without relaxed SIMD.
   */
  relaxedSimd?: boolean;
  /**
   * Threads for large GEMMs and convolutions, the calling one included. Defaults to
   * `navigator.hardwareConcurrency`. Results do not depend on it: threads split outputs, never
   * a sum.
   */
  threads?: number;
  /**
   * The WebAssembly GEMM's cache blocks (MC rows of A, NC columns of B per packed block). By
   * default this machine's: tuned by `deno task tune`, else derived from the cache sizes the OS
   * reports. They never change a result's bits.
   */
  gemmBlocks?: GemmBlocks;
  /**
   * Run 3×3 and 5×5 stride-1 convolutions with enough channels by Winograd's F(4×4, r×r) (default
   * true): 4–6× fewer multiplications, results within about 1e-5 of the outputs' magnitude of
   * im2col's (bit-identical for any thread count either way); false keeps im2col everywhere.
   */
  winograd?: boolean;
  /**
   * Kernel memory lent by a backend on another thread ({@link CpuBackend.lendMemory}): this
   * backend's arrays are allocated in its range, and the lender's arrays it names are operands in
   * place ({@link CpuBackend.viewLent}). How a device's Worker reads the runtime's parameters
   * without copying them.
   */
  memory?: MemoryLoan;
}

/**
 * Row length from which a sum over contiguous rows runs in the WebAssembly kernels (`sum_rows`),
 * and only from which plane sums fused into max pooling's backward may: both must sum alike.
 */
const WASM_SUM_SIZE = 8;

/** Free arrays the backend keeps for reuse, at most. */
const RECYCLED_BYTES = 256 * 1024 * 1024;

/** Cores this process may use, as the runtime reports them (at least 1). */
function availableCores(): number {
  const cores = (globalThis as { navigator?: { hardwareConcurrency?: number } }).navigator
    ?.hardwareConcurrency;
  return Math.max(1, Math.floor(cores ?? 1));
}

/**
 * The CPU backend.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "./backend.ts";
 * const cpu = new CpuBackend(); // WebAssembly kernels where supported, one thread per core
 * const s = cpu.upload(new Float32Array([1, 2]));
 * console.log(cpu.readSync(s), cpu.kernels, cpu.threads);
 * const oracle = new CpuBackend({ kernels: "ts" }); // pure TypeScript
 * ```
 */
export class CpuBackend implements Backend {
  readonly name: string;
  // Plain (not #private) fields: tests derive backends with Object.create(new CpuBackend()),
  // and #private members do not resolve through a prototype.
  private readonly wasm: WasmKernels | undefined;
  private readonly arrays = new ArrayPool(RECYCLED_BYTES);
  private requestedThreads: number;

  /** A CPU backend; throws when `kernels: "wasm"` is asked of an engine without SIMD128. */
  constructor(options: CpuBackendOptions = {}) {
    this.name = options.name ?? "cpu";
    const kernels = options.kernels ?? "auto";
    this.requestedThreads = Math.max(1, Math.floor(options.threads ?? availableCores()));
    if (kernels !== "ts") {
      this.wasm = WasmKernels.create({
        threads: this.requestedThreads,
        fma: options.relaxedSimd ?? true,
        blocks: options.gemmBlocks,
        winograd: options.winograd,
        memory: options.memory,
      });
      if (!this.wasm && kernels === "wasm") {
        throw new Error("CpuBackend: WebAssembly SIMD128 kernels are not supported by this runtime");
      }
    }
  }

  /** Which kernels run GEMM and convolution: `"wasm"` (generated SIMD) or `"ts"`. */
  get kernels(): "wasm" | "ts" {
    return this.wasm ? "wasm" : "ts";
  }

  /** True when the WebAssembly GEMM uses relaxed SIMD's fused multiply-add. */
  get fusedMultiplyAdd(): boolean {
    return this.wasm?.fma ?? false;
  }

  /** The WebAssembly GEMM's cache blocks (undefined with the TypeScript kernels). */
  get gemmBlocks(): GemmBlocks | undefined {
    return this.wasm?.blocks;
  }

  /** Threads for large GEMMs and convolutions (1 with the TypeScript kernels). */
  get threads(): number {
    return this.wasm ? this.wasm.threads : 1;
  }

  /** Changes the thread count (a device inside a multi-device run takes its share of the cores). */
  set threads(count: number) {
    this.requestedThreads = Math.max(1, Math.floor(count));
    if (this.wasm) this.wasm.threads = this.requestedThreads;
  }

  /**
   * Starts the kernel threads now rather than on the first large call, and resolves with the
   * number that will compute (the calling thread included).
   */
  startThreads(): Promise<number> {
    return this.wasm ? this.wasm.startThreads() : Promise.resolve(1);
  }

  /** Stops the kernel threads and drops recycled arrays; the backend keeps working. */
  dispose(): void {
    this.wasm?.dispose();
    this.arrays.clear();
  }

  /**
   * A zero-filled storage: inside the WebAssembly kernels' memory where it can be shared (GEMM,
   * convolution and pooling then read and write it in place), else a recycled or new array.
   */
  allocate(length: number, dtype: DType): Storage {
    return new CpuStorage(this.wasm?.allocateArray(length, dtype) ?? this.arrays.take(length, dtype));
  }

  /** Like {@link CpuBackend.allocate} without the zero-fill: for kernel outputs. */
  allocateUninitialized(length: number, dtype: DType): Storage {
    return new CpuStorage(
      this.wasm?.allocateArray(length, dtype, false) ?? this.arrays.take(length, dtype, false),
    );
  }

  upload(data: HostArray): Storage {
    const storage = this.allocateUninitialized(data.length, data instanceof Int32Array ? "int32" : "float32");
    (storage as CpuStorage).data.set(data);
    return storage;
  }

  /**
   * Storage over `data` itself, without copying: writes through either side are seen by the other.
   * Devices use it to keep parameters and gradients in `SharedArrayBuffer`s that other threads read.
   */
  wrap(data: HostArray): Storage {
    // A view of kernel memory (see `allocateShared`) is used in place by the kernels.
    this.wasm?.adopt(data);
    return new CpuStorage(data);
  }

  /**
   * Zero-filled host memory on a `SharedArrayBuffer`, inside the kernels' memory where it fits, so
   * that storages wrapping it (or parts of it) are kernel operands without a copy; see
   * {@link Backend.allocateShared}. Freed by {@link CpuBackend.freeShared}, or once the returned
   * array is garbage (views do not keep it).
   */
  allocateShared(length: number): Float32Array {
    return this.wasm?.allocateArray(length, "float32") ?? new Float32Array(new SharedArrayBuffer(4 * length));
  }

  /** {@link Backend.lendMemory}: a range of the kernel memory, where it has room. */
  lendMemory(bytes: number, arrays: readonly Float32Array[]): MemoryLoan | undefined {
    return this.wasm?.lend(bytes, arrays);
  }

  /** {@link Backend.reclaimMemory}. */
  reclaimMemory(loan: MemoryLoan): void {
    this.wasm?.reclaim(loan);
  }

  /**
   * The lender's array at `loan.addresses[index]`, `length` floats, in place: `undefined` unless
   * this backend runs in the loan ({@link CpuBackendOptions.memory}).
   */
  viewLent(loan: MemoryLoan, index: number, length: number): Float32Array | undefined {
    if (!this.wasm?.runsIn(loan.memory)) return undefined;
    return this.wasm.viewAt(loan.addresses[index], length);
  }

  /** Frees an array from {@link CpuBackend.allocateShared} now; see {@link Backend.freeShared}. */
  freeShared(array: Float32Array): void {
    this.wasm?.freeArray(array);
  }

  /** Elements `[offset, offset + length)` of `storage`'s array, shared; see {@link Backend.view}. */
  view(storage: Storage, offset: number, length: number): Storage {
    const data = (storage as CpuStorage).data;
    if (
      !Number.isInteger(offset) || !Number.isInteger(length) || offset < 0 || length < 0 ||
      offset + length > data.length
    ) {
      throw new RangeError(`view: [${offset}, ${offset + length}) is outside a storage of ${data.length}`);
    }
    const part = data.subarray(offset, offset + length);
    // A part of kernel memory stays a kernel operand (an optimizer updating a range in place).
    this.wasm?.adopt(part);
    return new CpuStorage(part, true);
  }

  read(storage: Storage): Promise<HostArray> {
    return Promise.resolve(this.readSync(storage));
  }

  readSync(storage: Storage): HostArray {
    const data = (storage as CpuStorage).data;
    // `slice` of an array on shared memory copies element by element (≈ 4 ms for 8 MB); `set`
    // into a fresh array is a memcpy.
    if (!this.wasm?.isResident(data)) return data.slice();
    const copy = data instanceof Int32Array ? new Int32Array(data.length) : new Float32Array(data.length);
    copy.set(data);
    return copy;
  }

  release(storage: Storage): void {
    // Arrays in kernel memory go back to its heap; large ordinary arrays this backend allocated
    // are recycled; the rest (wrapped host memory included) are left to the garbage collector.
    if ((storage as CpuStorage).view) return;
    const data = (storage as CpuStorage).data;
    if (!this.wasm?.freeArray(data)) this.arrays.give(data);
  }

  fill(out: Storage, value: number): void {
    const data = (out as CpuStorage).data;
    if (Object.is(value, 0) && this.wasm?.fillZero(data)) return;
    data.fill(value);
  }

  copyStrided(
    src: Storage,
    srcView: StridedView,
    dst: Storage,
    dstView: StridedView,
    shape: readonly number[],
  ): void {
    copyStridedKernel((src as CpuStorage).data, srcView, (dst as CpuStorage).data, dstView, shape);
  }

  unary(op: UnaryOp, x: Storage, out: Storage): void {
    if (op === "relu" && x.length === out.length && this.wasm?.relu(f32(x), f32(out))) return;
    unaryKernel(op, f32(x), f32(out));
  }

  binary(
    op: BinaryOp,
    a: Storage,
    aView: StridedView,
    b: Storage,
    bView: StridedView,
    out: Storage,
    shape: readonly number[],
  ): void {
    if (
      op === "reluGrad" && this.wasm && isDenseView(aView, shape) && isDenseView(bView, shape) &&
      this.wasm.reluGrad(f32(a), aView.offset, f32(b), bView.offset, f32(out))
    ) return;
    if (op === "add" && this.wasm && addChannels(this.wasm, a, aView, b, bView, out, shape)) return;
    if (
      op === "mul" && this.wasm && isDenseView(aView, shape) && isDenseView(bView, shape) &&
      aView.offset === 0 && bView.offset === 0 && this.wasm.mul(f32(a), f32(b), f32(out))
    ) return;
    binaryKernel(op, f32(a), aView, f32(b), bView, f32(out), shape);
  }

  reduce(op: ReduceOp, x: Storage, out: Storage, outer: number, size: number, inner: number): void {
    if (
      op === "sum" && inner === 1 && size >= WASM_SUM_SIZE &&
      this.wasm?.sumRows(f32(x), f32(out), outer, size)
    ) {
      return;
    }
    reduceKernel(op, f32(x), f32(out), outer, size, inner);
  }

  matmul(
    a: Storage,
    b: Storage,
    out: Storage,
    spec: MatmulSpec,
    bias?: Storage,
    activation?: Activation,
  ): void {
    const { batch, m, n, k, transA, transB, aBatchStride, bBatchStride } = spec;
    const row = bias ? f32(bias) : undefined;
    if (row && row.length !== n) {
      throw new Error(`matmul: bias has ${row.length} elements, the product has ${n} columns`);
    }
    if (this.wasm?.matmul(f32(a), f32(b), f32(out), spec, row, activation)) return;
    for (let i = 0; i < batch; i++) {
      gemm({
        m,
        n,
        k,
        a: f32(a),
        aOffset: i * aBatchStride,
        transA,
        b: f32(b),
        bOffset: i * bBatchStride,
        transB,
        c: f32(out),
        cOffset: i * m * n,
        accumulate: false,
      });
    }
    const c = f32(out).subarray(0, batch * m * n);
    if (row) addRowBias(c, row);
    if (activation === "relu") unaryKernel("relu", c, c);
  }

  conv2dForward(
    x: Storage,
    weight: Storage,
    out: Storage,
    geometry: Conv2dGeometry,
    bias?: Storage,
    activation?: Activation,
  ): void {
    const b = convBias(bias, geometry);
    if (this.wasm?.conv2dForward(f32(x), f32(weight), f32(out), geometry, b, activation)) return;
    conv2dForward(f32(x), f32(weight), f32(out), geometry, b, activation);
  }

  /** Through the WebAssembly kernels only (false without them: the engine then makes the two calls). */
  conv2dForwardMaxPool(
    x: Storage,
    weight: Storage,
    pooled: Storage,
    argmax: Storage,
    geometry: Conv2dGeometry,
    pool: Pool2dGeometry,
    bias?: Storage,
    activation?: Activation,
  ): boolean {
    const b = convBias(bias, geometry);
    return this.wasm?.conv2dForwardMaxPool(
      f32(x),
      f32(weight),
      f32(pooled),
      i32(argmax),
      geometry,
      pool,
      b,
      activation,
    ) ??
      false;
  }

  conv2dBackwardInput(dy: Storage, weight: Storage, dx: Storage, geometry: Conv2dGeometry): void {
    if (this.wasm?.conv2dBackwardInput(f32(dy), f32(weight), f32(dx), geometry)) return;
    conv2dBackwardInput(f32(dy), f32(weight), f32(dx), geometry);
  }

  conv2dBackwardFilter(x: Storage, dy: Storage, dw: Storage, geometry: Conv2dGeometry): void {
    if (this.wasm?.conv2dBackwardFilter(f32(x), f32(dy), f32(dw), geometry)) return;
    conv2dBackwardFilter(f32(x), f32(dy), f32(dw), geometry);
  }

  maxPool2dForward(x: Storage, out: Storage, argmax: Storage, geometry: Pool2dGeometry): void {
    if (this.wasm?.maxPool2dForward(f32(x), f32(out), i32(argmax), geometry)) return;
    maxPool2dForward(f32(x), f32(out), i32(argmax), geometry);
  }

  maxPool2dBackward(dy: Storage, argmax: Storage, dx: Storage, geometry: Pool2dGeometry): void {
    if (this.wasm?.maxPool2dBackward(f32(dy), i32(argmax), f32(dx), geometry)) return;
    maxPool2dBackward(f32(dy), i32(argmax), f32(dx), geometry, this.wasm?.fillZero(f32(dx)) ?? false);
  }

  /**
   * Through the WebAssembly kernels only, and with plane sums only where {@link reduce} would sum
   * the planes with them too (false otherwise: the engine then makes the separate calls).
   */
  maxPool2dBackwardFused(
    dy: Storage,
    argmax: Storage,
    dx: Storage,
    geometry: Pool2dGeometry,
    epilogue: MaxPoolBackwardEpilogue,
  ): boolean {
    if (epilogue.planeSums && geometry.inHeight * geometry.inWidth < WASM_SUM_SIZE) return false;
    return this.wasm?.maxPool2dBackward(f32(dy), i32(argmax), f32(dx), geometry, {
      reluOf: epilogue.reluOf && f32(epilogue.reluOf),
      planeSums: epilogue.planeSums && f32(epilogue.planeSums),
    }) ?? false;
  }

  conv2dBackwardFilterPooled(
    x: Storage,
    dy: Storage,
    argmax: Storage,
    dw: Storage,
    geometry: Conv2dGeometry,
    pool: Pool2dGeometry,
    epilogue: MaxPoolBackwardEpilogue,
  ): boolean {
    return this.wasm?.convBackwardFilterPooled(f32(x), f32(dy), i32(argmax), f32(dw), geometry, pool, {
      reluOf: epilogue.reluOf && f32(epilogue.reluOf),
      planeSums: epilogue.planeSums && f32(epilogue.planeSums),
    }) ?? false;
  }

  avgPool2dForward(x: Storage, out: Storage, geometry: Pool2dGeometry): void {
    if (this.wasm?.avgPool2dForward(f32(x), f32(out), geometry)) return;
    avgPool2dForward(f32(x), f32(out), geometry);
  }

  avgPool2dBackward(dy: Storage, dx: Storage, geometry: Pool2dGeometry): void {
    if (this.wasm?.avgPool2dBackward(f32(dy), f32(dx), geometry)) return;
    avgPool2dBackward(f32(dy), f32(dx), geometry, this.wasm?.fillZero(f32(dx)) ?? false);
  }

  lrnForward(x: Storage, out: Storage, scale: Storage, shape: readonly number[], params: LrnParams): void {
    if (this.wasm?.lrnForward(f32(x), f32(out), f32(scale), shape, params)) return;
    lrnForward(f32(x), f32(out), f32(scale), shape, params);
  }

  lrnBackward(
    x: Storage,
    y: Storage,
    scale: Storage,
    dy: Storage,
    dx: Storage,
    shape: readonly number[],
    params: LrnParams,
  ): void {
    if (this.wasm?.lrnBackward(f32(x), f32(y), f32(scale), f32(dy), f32(dx), shape, params)) return;
    lrnBackward(f32(x), f32(y), f32(scale), f32(dy), f32(dx), shape, params);
  }

  /**
   * `out = (inputs[0] + … + inputs[N−1]) · fround(1/N)` in float32, added in index order; see
   * {@link Backend.averageInOrder}. The data-parallel runtime averages replicas' gradients with it.
   */
  averageInOrder(inputs: readonly Storage[], out: Storage): void {
    const o = f32(out);
    const arrays = inputs.map((s) => {
      const input = f32(s);
      if (input.length !== o.length || input === o) {
        throw new Error(
          `cpu backend: averageInOrder needs distinct inputs of ${o.length} elements like its output`,
        );
      }
      return input;
    });
    if (arrays.length === 0) throw new Error("cpu backend: averageInOrder of no inputs");
    if (this.wasm?.averageInOrder(arrays, o)) return;
    averageKernel(arrays, o);
  }

  /** {@link Backend.sgdUpdate}; the finite check of the new parameters runs in the same pass. */
  sgdUpdate(param: Storage, grad: Storage, history: Storage, step: SgdStep, saved?: SgdSaved): boolean {
    const into = saved && { param: f32(saved.param), history: f32(saved.history) };
    // WebAssembly only on arrays in kernel memory: wrapped host memory is updated where it lies.
    return this.wasm?.sgdUpdate(f32(param), f32(grad), f32(history), step, into) ??
      sgdUpdateKernel(f32(param), f32(grad), f32(history), step, into);
  }

  /**
   * {@link Backend.firstNonFinite}: the WebAssembly scan (over the kernel threads for an array in
   * kernel memory, such as the parameters the runtime checks after every update, staged piece by
   * piece for any other); without the kernels, a TypeScript scan that stops at the first NaN or ±∞.
   */
  firstNonFinite(x: Storage): number {
    const data = f32(x);
    return this.wasm?.firstNonFinite(data) ?? firstNonFiniteIndex(data);
  }

  /**
   * {@link Backend.dropoutMask}: the WebAssembly generator, four counter blocks per SIMD step
   * (98,304 values of an AlexNet-like step in about a tenth of the TypeScript generator's time);
   * false without the kernels, so the engine makes the mask itself.
   */
  dropoutMask(out: Storage, spec: DropoutMaskSpec): boolean {
    return this.wasm?.dropoutMask(f32(out), spec) ?? false;
  }

  adamUpdate(param: Storage, grad: Storage, m: Storage, v: Storage, step: AdamStep): void {
    if (this.wasm?.adamUpdate(f32(param), f32(grad), f32(m), f32(v), step)) return;
    adamUpdateKernel(f32(param), f32(grad), f32(m), f32(v), step);
  }

  softmax(x: Storage, out: Storage, rows: RowSpec): void {
    softmaxKernel(f32(x), f32(out), rows);
  }

  logSoftmax(x: Storage, out: Storage, rows: RowSpec): void {
    logSoftmaxKernel(f32(x), f32(out), rows);
  }

  softmaxCrossEntropy(
    logits: Storage,
    labels: Storage,
    losses: Storage,
    probs: Storage,
    rows: RowSpec,
  ): void {
    softmaxCrossEntropyKernel(f32(logits), i32(labels), f32(losses), f32(probs), rows);
  }

  softmaxCrossEntropyBackward(
    probs: Storage,
    labels: Storage,
    dLoss: Storage,
    dLogits: Storage,
    rows: RowSpec,
  ): void {
    softmaxCrossEntropyBackwardKernel(f32(probs), i32(labels), f32(dLoss), f32(dLogits), rows);
  }
}

/**
 * A dense tensor plus a vector broadcast along one axis (a bias over NCHW channels or over FC
 * rows) in one SIMD pass; false for any other layout. Addition commutes bit for bit, so either
 * operand may be the vector.
 */
function addChannels(
  wasm: WasmKernels,
  a: Storage,
  aView: StridedView,
  b: Storage,
  bView: StridedView,
  out: Storage,
  shape: readonly number[],
): boolean {
  const dense = isDenseView(aView, shape) && aView.offset === 0
    ? [a, bView] as const
    : isDenseView(bView, shape) && bView.offset === 0
    ? [b, aView] as const
    : undefined;
  if (!dense) return false;
  const [x, vector] = dense;
  let axis = -1;
  for (let d = 0; d < shape.length; d++) {
    if (shape[d] === 1 || vector.strides[d] === 0) continue;
    if (axis >= 0 || vector.strides[d] !== 1) return false;
    axis = d;
  }
  if (axis < 0) return false;
  const outer = shape.slice(0, axis).reduce((p, n) => p * n, 1);
  const inner = shape.slice(axis + 1).reduce((p, n) => p * n, 1);
  const values = f32(x === a ? b : a);
  const bias = values.subarray(vector.offset, vector.offset + shape[axis]);
  return wasm.addChannels(f32(x), bias, f32(out), outer, inner);
}

/** A convolution's bias as floats, checked against the geometry's output channels. */
function convBias(bias: Storage | undefined, geometry: Conv2dGeometry): Float32Array | undefined {
  const b = bias ? f32(bias) : undefined;
  if (b && b.length !== geometry.outChannels) {
    throw new Error(`conv2d: bias has ${b.length} elements, geometry expects ${geometry.outChannels}`);
  }
  return b;
}
