/**
 * The WebAssembly kernels as the CPU backend sees them: GEMM, convolution, max and average pooling
 * (and the elementwise, LRN and optimizer kernels) over typed arrays, run on the main thread and,
 * for large enough work, on the pool threads too.
 *
 * Where memory can be shared (so it never moves when it grows), the backend allocates its arrays
 * inside the kernel memory ({@link WasmKernels.allocateArray}): operands that live there are used
 * in place. Any other operand is copied into a temporary block for the call (and an output
 * copied back out). Scratch (packed panels, column matrices) is allocated per call. A call that
 * would need more than the memory limit returns `false`, so the caller runs the TypeScript kernel.
 *
 * It stays one file although long: it is the one facade the backend calls, one short method per
 * kernel (stage the operands, run a task from `tasks.ts`), and what those methods call (the
 * generators in `generate/`, the drivers, the heap and the threads) lives in files of its own.
 *
 * @module
 */

import type {
  Activation,
  AdamStep,
  Conv2dGeometry,
  DropoutMaskSpec,
  MatmulSpec,
  MemoryLoan,
  Pool2dGeometry,
  SgdStep,
} from "../../backend.ts";
import { addFilterChunks, columnRows, filterPartialsBytes } from "./conv.ts";
import { detectWasmFeatures, type WasmFeatures } from "./features.ts";
import { firstFound } from "./finite.ts";
import { pooledFilterOffsets, pooledFilterProblem, pooledFilterScratchBytes } from "./filter_pooled.ts";
import { type GemmBlocks, gemmBlocksProblem, gemmScratchBytes, kernelBlocks } from "./gemm.ts";
import { machineGemmBlocks } from "./blocking.ts";
import { KernelHeap } from "./heap.ts";
import { checkLrn, type LrnParams } from "../../geometry.ts";
import { lrnConstants, lrnScratchBytes } from "./lrn.ts";
import { avgPoolDivisors, avgPoolShareBytes, avgPoolShareRow } from "./generate/avg_pool_kernels.ts";
import {
  instantiateKernels,
  type KernelExports,
  kernelModuleBytes,
  MAX_MEMORY_PAGES,
} from "./generate/module.ts";
import {
  convTaskLayout,
  ElementwiseOp,
  encodeTask,
  filterRowBlock,
  floatBits,
  MAX_TASK_ARGS,
  runTaskShare,
  TaskKind,
} from "./tasks.ts";
import { KernelThreadPool } from "./thread_pool.ts";
import { imageOutputBytes, type StagedPool, withPoolEpilogue } from "./pool_epilogue.ts";
import { transformFilters } from "./winograd/phases.ts";
import {
  type WinogradPass,
  WinogradPhase,
  winogradPlan,
  winogradSharedBytes,
  winogradSide,
  winogradTables,
  type WinogradTask,
  winogradThreadBytes,
} from "./winograd/plan.ts";

/** Below this many floating-point operations per thread, extra threads cost more than they save. */
const FLOPS_PER_THREAD = 2e6;

/** Floats of an optimizer update per kernel thread (see `#updateThreads`). */
const UPDATE_FLOATS_PER_THREAD = 1 << 19;

const PAGE = 65536;

/** Bytes the kernels may read past an operand's end (vector loads whose extra lanes go unused). */
const OVERREAD = 64;

/** Floats of a non-resident array staged at a time for the non-finite scan (1 MiB: stays in L2). */
const STAGED_PIECE = 1 << 18;

/**
 * The kernel module of each variant, compiled once per process and shared by every
 * {@link WasmKernels} (each instantiates it over its own memory). Engines compile WebAssembly in
 * a baseline tier first and optimise hot functions in the background; the optimised code belongs
 * to the module, so a backend created later, or a pool thread, starts with kernels another has
 * already warmed. Compiling per backend instead left a new multi-threaded backend running its
 * first products in the baseline tier while the optimising compiler competed with the kernel
 * threads for the cores (GEMM 512³ on 2 threads: 1.0–1.4× one thread in
 * bench/kernels/wasm_bench.ts, whose 2-thread backend starts cold after the 1-thread one has warmed).
 */
const compiled = new Map<string, WebAssembly.Module>();

function compiledKernels(fma: boolean, shared: boolean): WebAssembly.Module {
  const key = `${fma ? "fma" : "mul-add"}/${shared ? "shared" : "own"}`;
  let module = compiled.get(key);
  if (!module) {
    module = new WebAssembly.Module(kernelModuleBytes({ fma, shared }));
    compiled.set(key, module);
  }
  return module;
}

/** Options of {@link WasmKernels.create}. */
export interface WasmKernelOptions {
  /** Threads to compute with, the calling one included (≥ 1). */
  threads: number;
  /** Use relaxed SIMD's fused multiply-add where the engine has it (default true). */
  fma?: boolean;
  /**
   * GEMM cache blocks (MC, NC); by default this machine's ({@link machineGemmBlocks}: tuned,
   * from its cache sizes, or the defaults). They never change a result's bits.
   */
  blocks?: GemmBlocks;
  /**
   * Run 3×3 and 5×5 stride-1 convolutions by Winograd's F(4×4, r×r) where they qualify (default
   * true; see `winograd/phases.ts`); false keeps every convolution on im2col.
   */
  winograd?: boolean;
  /**
   * Run in part of another thread's kernel memory (see {@link WasmKernels.lend}) instead of a
   * memory of its own: arrays the lender allocated are then operands here without a copy. Ignored
   * where memory cannot be shared.
   */
  memory?: MemoryLoan;
}

/** The Winograd pass of a convolution task. */
function winogradPass(kind: TaskKind): WinogradPass {
  return kind === TaskKind.convForward ? "forward" : kind === TaskKind.convBackwardInput ? "input" : "filter";
}

function checkLength(name: string, a: ArrayLike<number>, expected: number): void {
  if (a.length !== expected) {
    throw new Error(`conv2d: ${name} has ${a.length} elements, geometry expects ${expected}`);
  }
}

/** Where a call's operand lives in kernel memory, and whether it is a temporary copy. */
interface Staged {
  address: number;
  bytes: number;
  temporary: boolean;
}

/**
 * GEMM, convolution and max pooling in generated WebAssembly, optionally multi-threaded.
 *
 * @example
 * ```ts
 * import { WasmKernels } from "./kernels.ts";
 * const kernels = WasmKernels.create({ threads: 1 });
 * if (kernels) {
 *   const out = new Float32Array(4);
 *   kernels.matmul(new Float32Array([1, 2, 3, 4]), new Float32Array([5, 6, 7, 8]), out, {
 *     batch: 1, m: 2, n: 2, k: 2, transA: false, transB: false, aBatchStride: 0, bBatchStride: 0,
 *   }); // out is [19, 22, 43, 50]
 *   kernels.dispose();
 * }
 * ```
 */
export class WasmKernels {
  readonly #memory: WebAssembly.Memory;
  readonly #module: WebAssembly.Module;
  readonly #kernels: KernelExports;
  readonly #heap: KernelHeap;
  /** Where the heap starts: 0, or a borrowed range's start (see {@link MemoryLoan}). */
  readonly #base: number;
  readonly #args = new Int32Array(MAX_TASK_ARGS);
  /**
   * Arrays in kernel memory, by the array object, with their block: allocated here (freed by
   * `freeArray`), or adopted views of memory allocated here (`view`: never freed through them).
   */
  readonly #resident = new WeakMap<object, { address: number; bytes: number; view?: boolean }>();
  /** Every buffer object the memory has had (a shared memory gets a new one when it grows). */
  readonly #buffers = new WeakSet<ArrayBufferLike>();
  /** Frees the block of a resident array the garbage collector took without a release. */
  readonly #collected = new FinalizationRegistry<{ address: number; bytes: number }>((block) =>
    this.#heap.free(block.address, block.bytes)
  );
  #temporaries: Staged[] = [];
  /** Whether the kernel memory was found full once (said once: see `#sayFull`). */
  #saidFull = false;
  #threads: number;
  #pool: KernelThreadPool | undefined;
  #floats: Float32Array<ArrayBufferLike> = new Float32Array(0);

  private constructor(
    readonly features: WasmFeatures,
    readonly fma: boolean,
    /** The GEMM's cache blocks (MC, NC, NC for few rows) and in-place rows, the same on every thread. */
    readonly blocks: Required<GemmBlocks>,
    /** Whether convolutions that qualify run by Winograd's algorithm. */
    readonly winograd: boolean,
    module: WebAssembly.Module,
    memory: WebAssembly.Memory,
    threads: number,
    range?: { start: number; end: number },
  ) {
    this.#module = module;
    this.#memory = memory;
    this.#kernels = instantiateKernels(module, memory);
    // A borrowed range was allocated whole from the lender's heap, so its memory already exists:
    // this heap never grows the memory under the lender (a block's overread may pass its end).
    this.#heap = range
      ? new KernelHeap(memory, range.end - OVERREAD, range.start)
      : new KernelHeap(memory, MAX_MEMORY_PAGES * PAGE - OVERREAD);
    this.#base = range?.start ?? 0;
    this.#threads = threads;
  }

  /**
   * Compiles the kernels for this engine, or returns `undefined` where it lacks SIMD128 (or
   * refuses to compile synchronously, as browsers do on their main thread). Throws a RangeError
   * naming the field when `blocks` cannot drive the GEMM.
   */
  static create(options: WasmKernelOptions): WasmKernels | undefined {
    const blocks = options.blocks;
    const problem = blocks && gemmBlocksProblem(blocks);
    if (problem) throw new RangeError(`GEMM blocks: ${problem}`);
    const features = detectWasmFeatures();
    if (!features.simd128) return undefined;
    const fma = (options.fma ?? true) && features.relaxedSimd;
    const shared = features.sharedMemory;
    try {
      const module = compiledKernels(fma, shared);
      const loan = shared ? options.memory : undefined;
      const memory = loan?.memory ??
        new WebAssembly.Memory({ initial: 16, maximum: MAX_MEMORY_PAGES, shared });
      const threads = shared ? Math.max(1, options.threads) : 1;
      const winograd = options.winograd ?? true;
      return new WasmKernels(
        features,
        fma,
        kernelBlocks(blocks ?? machineGemmBlocks().blocks, fma),
        winograd,
        module,
        memory,
        threads,
        loan,
      );
    } catch {
      return undefined;
    }
  }

  /** Threads used for large enough work (the calling thread included). */
  get threads(): number {
    return this.#threads;
  }

  /** Changes the thread count; extra threads start on the next call that can use them. */
  set threads(count: number) {
    const next = this.features.sharedMemory ? Math.max(1, Math.floor(count)) : 1;
    if (next !== this.#threads) {
      this.#pool?.close();
      this.#pool = undefined;
    }
    this.#threads = next;
  }

  /**
   * Starts the pool threads now (they otherwise start on the first large call) and resolves with
   * the number of threads that will compute, the calling one included.
   */
  async startThreads(): Promise<number> {
    if (this.#threads <= 1) return 1;
    this.#pool ??= new KernelThreadPool(this.#module, this.#memory, this.#threads - 1);
    this.#pool.grow(this.#threads - 1);
    return 1 + await this.#pool.whenReady();
  }

  /** Stops the pool threads (the kernels keep working on the calling thread). */
  dispose(): void {
    this.#pool?.close();
    this.#pool = undefined;
  }

  /** Bytes of kernel memory in use (resident arrays, free blocks between them). */
  get memoryBytes(): number {
    return this.#heap.usedBytes - this.#base;
  }

  /** Bytes of kernel memory that arrays hold now (without the free blocks between them). */
  get residentBytes(): number {
    return this.#heap.usedBytes - this.#base - this.#heap.freeBytes;
  }

  /**
   * A zero-filled array inside the kernel memory, which the kernels then use without copying;
   * `undefined` where the memory is not shared (it could move when it grows) or is full.
   * Return it with {@link WasmKernels.freeArray}; one the garbage collector takes first is freed
   * then.
   */
  allocateArray(length: number, dtype: "float32", zeroed?: boolean): Float32Array | undefined;
  allocateArray(length: number, dtype: "int32", zeroed?: boolean): Int32Array | undefined;
  allocateArray(
    length: number,
    dtype: "float32" | "int32",
    zeroed?: boolean,
  ): Float32Array | Int32Array | undefined;
  allocateArray(
    length: number,
    dtype: "float32" | "int32",
    zeroed = true,
  ): Float32Array | Int32Array | undefined {
    if (!this.features.sharedMemory || length === 0) return undefined;
    const bytes = 4 * length;
    const address = this.#heap.allocate(bytes + OVERREAD);
    if (address === undefined) {
      this.#sayFull(bytes);
      return undefined;
    }
    const buffer = this.#memory.buffer;
    this.#buffers.add(buffer);
    const array = dtype === "int32"
      ? new Int32Array(buffer, address, length)
      : new Float32Array(buffer, address, length);
    // memory.fill is a memset; TypedArray fill on shared memory goes element by element (8× slower).
    if (zeroed) this.#kernels.fill_zero(address, bytes);
    const block = { address, bytes: bytes + OVERREAD };
    this.#resident.set(array, block);
    this.#collected.register(array, block, array);
    return array;
  }

  /**
   * Says once per instance, on stderr, that an array found no room: from then on arrays land
   * outside the kernel memory, and kernels on them copy in and out or run in TypeScript. A silent
   * 4× slower update hid a second trainer's full memory for sessions.
   */
  #sayFull(bytes: number): void {
    if (this.#saidFull) return;
    this.#saidFull = true;
    const mb = (n: number) => (n / 2 ** 20).toFixed(0);
    const size = mb(this.#heap.limitBytes + OVERREAD - this.#base);
    const memory = this.#base > 0
      ? "the kernel memory lent to this device's replica"
      : "the CPU backend's kernel memory";
    console.warn(
      `tandem: ${memory} has no room for ${mb(bytes)} MB (${mb(this.residentBytes)} of ${size} MB held): ` +
        `arrays go to ordinary memory, where kernels copy them or run in TypeScript, slower; dispose ` +
        `tensors and close trainers no longer used`,
    );
  }

  /**
   * Makes a view of kernel memory (a `subarray` of an array from {@link WasmKernels.allocateArray},
   * or any view over the same buffer) resident, so kernels use it in place; false for an array
   * elsewhere. How host buffers that Workers share become operands without a copy.
   */
  adopt(array: Float32Array | Int32Array): boolean {
    if (this.#resident.has(array)) return true;
    if (!this.#buffers.has(array.buffer)) return false;
    this.#resident.set(array, { address: array.byteOffset, bytes: array.byteLength, view: true });
    return true;
  }

  /**
   * Lends `bytes` of this kernel memory to another thread's kernels ({@link WasmKernelOptions.memory}),
   * with the addresses of `arrays` (from {@link WasmKernels.allocateArray}) there; `undefined` where
   * the memory is not shared, an array is not resident, or the loan would take more than half of
   * the room above the heap (the lender keeps at least as much as it lends). Return the range with
   * {@link WasmKernels.reclaim} once the borrower has stopped.
   */
  lend(bytes: number, arrays: readonly Float32Array[]): MemoryLoan | undefined {
    if (!this.features.sharedMemory || !arrays.every((a) => this.#resident.has(a))) return undefined;
    if (this.#heap.limitBytes - this.#heap.usedBytes < 2 * bytes) return undefined;
    const start = this.#heap.allocate(bytes);
    if (start === undefined) return undefined;
    return {
      memory: this.#memory,
      start,
      end: start + bytes,
      addresses: arrays.map((a) => this.#resident.get(a)!.address),
    };
  }

  /** Returns a range from {@link WasmKernels.lend}; its borrower must have stopped. */
  reclaim(loan: MemoryLoan): void {
    this.#heap.free(loan.start, loan.end - loan.start);
  }

  /** Whether these kernels run in `memory` (a loan's, see {@link WasmKernelOptions.memory}). */
  runsIn(memory: WebAssembly.Memory): boolean {
    return memory === this.#memory;
  }

  /**
   * A view of `length` floats at byte `address` of the kernel memory (a lender's array, see
   * {@link MemoryLoan}), resident: kernels use it in place.
   */
  viewAt(address: number, length: number): Float32Array {
    const buffer = this.#memory.buffer;
    this.#buffers.add(buffer);
    const array = new Float32Array(buffer, address, length);
    this.#resident.set(array, { address, bytes: 4 * length, view: true });
    return array;
  }

  /** Frees an array from {@link WasmKernels.allocateArray}; false (and nothing done) for any other. */
  freeArray(array: Float32Array | Int32Array): boolean {
    const block = this.#resident.get(array);
    if (!block || block.view) return false;
    this.#resident.delete(array);
    this.#collected.unregister(array);
    this.#heap.free(block.address, block.bytes);
    return true;
  }

  /** Zero-fills a resident array with a memset; false (nothing done) for any other array. */
  fillZero(array: Float32Array | Int32Array): boolean {
    const block = this.#resident.get(array);
    if (!block) return false;
    this.#kernels.fill_zero(block.address, array.byteLength);
    return true;
  }

  /** True when `array` lives in the kernel memory (from {@link WasmKernels.allocateArray}). */
  isResident(array: Float32Array | Int32Array): boolean {
    return this.#resident.has(array);
  }

  /** Threads for `flops` of work: ready pool threads and enough work for each. */
  #threadsFor(flops: number): number {
    const wanted = Math.min(this.#threads, Math.max(1, Math.floor(flops / FLOPS_PER_THREAD)));
    if (wanted <= 1) return 1;
    this.#pool ??= new KernelThreadPool(this.#module, this.#memory, this.#threads - 1);
    this.#pool.grow(wanted - 1);
    return Math.min(wanted, 1 + this.#pool.ready);
  }

  #view(): Float32Array<ArrayBufferLike> {
    if (this.#floats.buffer.byteLength !== this.#memory.buffer.byteLength) {
      this.#floats = new Float32Array(this.#memory.buffer);
    }
    return this.#floats;
  }

  /**
   * The address of `length` floats of `array` in kernel memory: in place when resident, else a
   * temporary block (filled from the array when `copyIn`). Undefined when memory is full.
   */
  #stage(array: Float32Array | Int32Array, length: number, copyIn: boolean, offset = 0): number | undefined {
    const block = this.#resident.get(array);
    if (block) return block.address + 4 * offset;
    const bytes = 4 * length + OVERREAD;
    const address = this.#heap.allocate(bytes);
    if (address === undefined) return undefined;
    this.#temporaries.push({ address, bytes, temporary: true });
    if (copyIn && length > 0) {
      const source = offset === 0 && array.length === length
        ? array
        : array.subarray(offset, offset + length);
      if (source instanceof Int32Array) new Int32Array(this.#memory.buffer, address, length).set(source);
      else this.#view().set(source, address / 4);
    }
    return address;
  }

  /** Scratch for a call (freed with the temporaries). */
  #scratch(bytes: number): number | undefined {
    if (bytes === 0) return 0;
    const address = this.#heap.allocate(bytes);
    if (address !== undefined) this.#temporaries.push({ address, bytes, temporary: true });
    return address;
  }

  /** Copies an output staged at `address` back into a non-resident array. */
  #unstage(array: Float32Array | Int32Array, address: number, length: number): void {
    if (this.#resident.has(array)) return;
    const target = array.length === length ? array : array.subarray(0, length);
    if (target instanceof Int32Array) target.set(new Int32Array(this.#memory.buffer, address, length));
    else target.set(this.#view().subarray(address / 4, address / 4 + length));
  }

  #releaseTemporaries(): void {
    for (const { address, bytes } of this.#temporaries) this.#heap.free(address, bytes);
    this.#temporaries = [];
  }

  #run(kind: TaskKind, task: Parameters<typeof encodeTask>[1], threads: number): void {
    encodeTask(kind, task, this.#args);
    if (threads <= 1) {
      runTaskShare(this.#kernels, kind, this.#args, 0, 1);
      return;
    }
    this.#pool!.run(
      kind,
      this.#args,
      threads,
      (claim) => runTaskShare(this.#kernels, kind, this.#args, 0, threads, claim),
    );
  }

  /**
   * Batched GEMM with the backend contract's layout (`out` dense `[batch, m, n]`), then `bias`
   * (`[n]`) added to every row and the ReLU with `activation` `"relu"`, each thread on the block of
   * the output it just computed; false when the operands do not fit the kernel memory.
   */
  matmul(
    a: Float32Array,
    b: Float32Array,
    out: Float32Array,
    spec: MatmulSpec,
    bias?: Float32Array,
    activation?: Activation,
  ): boolean {
    const { batch, m, n, k, transA, transB, aBatchStride, bBatchStride } = spec;
    if (batch <= 0 || m <= 0 || n <= 0) return true;
    if (k <= 0) {
      if (bias || activation) return false; // the TypeScript kernel: zeros, then the epilogue
      out.fill(0, 0, batch * m * n);
      return true;
    }
    const aLength = (batch - 1) * aBatchStride + m * k, bLength = (batch - 1) * bBatchStride + k * n;
    const cLength = batch * m * n;
    const threads = this.#threadsFor(2 * batch * m * n * k);
    try {
      const aAt = this.#stage(a, aLength, true), bAt = this.#stage(b, bLength, true);
      const cAt = this.#stage(out, cLength, false), scratchStride = gemmScratchBytes(this.blocks);
      const biasAt = bias ? this.#stage(bias, n, true) : 0;
      const scratch = this.#scratch(threads * scratchStride);
      if (
        aAt === undefined || bAt === undefined || cAt === undefined || biasAt === undefined ||
        scratch === undefined
      ) return false;
      this.#run(TaskKind.matmul, {
        batch,
        m,
        n,
        k,
        a: aAt,
        lda: transA ? m : k,
        transA,
        aBatchStride: 4 * aBatchStride,
        b: bAt,
        ldb: transB ? k : n,
        transB,
        bBatchStride: 4 * bBatchStride,
        c: cAt,
        ldc: n,
        cBatchStride: 4 * m * n,
        accumulate: false,
        scratch,
        scratchStride,
        ...this.blocks,
        bias: biasAt,
        relu: activation === "relu",
      }, threads);
      this.#unstage(out, cAt, cLength);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * Runs a convolution task on operands already in kernel memory (forward and weight-gradient
   * tasks, which pack columns from padded images, get their window-offset table here); false when
   * scratch does not fit.
   */
  #convTask(
    kind: TaskKind,
    g: Conv2dGeometry,
    at: { image: number; weight: number; output: number; bias?: number; relu?: boolean },
    pool?: StagedPool,
  ): boolean {
    const flops = 2 * g.batch * g.outHeight * g.outWidth * g.outChannels * (g.inChannels / g.groups) *
      g.kernelH *
      g.kernelW;
    let threads = this.#threadsFor(flops);
    // Forward and input gradient split the batch: never more threads than images.
    if (kind !== TaskKind.convBackwardFilter) threads = Math.min(threads, g.batch);
    const filter = kind === TaskKind.convBackwardFilter;
    const rows = filter ? filterRowBlock(g, threads) : columnRows(g);
    const layout = convTaskLayout(kind, g, rows, this.blocks);
    const { table } = layout;
    const imageBytes = imageOutputBytes(g.outChannels, g.outHeight, g.outWidth);
    const { scratchStride, epilogue } = withPoolEpilogue(layout.scratchStride, imageBytes, pool);
    const scratch = this.#scratch(threads * scratchStride);
    const partials = filter ? this.#scratch(filterPartialsBytes(g)) : 0;
    let offsets = 0;
    if (table) {
      const address = this.#scratch(4 * table.length);
      if (address === undefined) return false;
      new Int32Array(this.#memory.buffer, address, table.length).set(table);
      offsets = address;
    }
    if (scratch === undefined || partials === undefined) return false;
    this.#run(
      kind,
      {
        ...g,
        ...at,
        bias: at.bias ?? 0,
        relu: at.relu ?? false,
        offsets,
        partials,
        scratch,
        scratchStride,
        ...this.blocks,
        ...epilogue,
      },
      threads,
    );
    if (filter) addFilterChunks(this.#kernels, g, at.weight, partials);
    return true;
  }

  /**
   * Runs a convolution pass by Winograd's algorithm (`winograd/phases.ts`): the filters transformed once,
   * then each chunk of images in its phases; false when scratch does not fit.
   */
  #winograd(
    kind: TaskKind,
    g: Conv2dGeometry,
    at: { image: number; weight: number; output: number; bias: number; relu: boolean },
    pool?: StagedPool,
  ): boolean {
    const pass = winogradPass(kind);
    const plan = winogradPlan(g, pass);
    const flops = 2 * g.batch * g.outHeight * g.outWidth * g.outChannels * (g.inChannels / g.groups) *
      g.kernelH * g.kernelW;
    const threads = this.#threadsFor(flops);
    const shared = winogradSharedBytes(plan), tables = winogradTables(plan);
    const imageBytes = imageOutputBytes(g.outChannels, g.outHeight, g.outWidth);
    const { scratchStride, epilogue } = withPoolEpilogue(winogradThreadBytes(plan), imageBytes, pool);
    const tablesAt = this.#scratch(4 * tables.length), filters = this.#scratch(shared.filters);
    const tilesV = this.#scratch(shared.tilesV), tilesM = this.#scratch(shared.tilesM);
    const scratch = this.#scratch(threads * scratchStride);
    if ([tablesAt, filters, tilesV, tilesM, scratch].includes(undefined)) return false;
    new Int32Array(this.#memory.buffer, tablesAt, tables.length).set(tables);
    // The input gradient is a forward convolution of dy into dx (see WinogradPlan).
    const task: WinogradTask = {
      phase: 0,
      first: 0,
      images: 0,
      parts: plan.parts,
      chunkImages: plan.chunkImages,
      r: plan.r,
      groups: plan.groups,
      depth: plan.depth,
      outputs: plan.outputs,
      inHeight: plan.inHeight,
      inWidth: plan.inWidth,
      outHeight: plan.outHeight,
      outWidth: plan.outWidth,
      padTop: plan.padTop,
      padLeft: plan.padLeft,
      image: pass === "input" ? at.output : at.image,
      output: pass === "input" ? at.image : at.output,
      filters: filters!,
      tilesV: tilesV!,
      tilesM: tilesM!,
      tables: tablesAt!,
      bias: pass === "forward" ? at.bias : 0,
      relu: pass === "forward" && at.relu ? 1 : 0,
      weightGradient: pass === "filter" ? at.weight : 0,
      scratch: scratch!,
      scratchStride,
      ...epilogue,
    };
    if (pass !== "filter") transformFilters(this.#kernels, task, at.weight, pass === "input");
    if (pass !== "filter") {
      this.#run(TaskKind.winograd, { ...task, phase: WinogradPhase.images, images: g.batch }, threads);
      return true;
    }
    if (plan.parts > 1) {
      this.#run(TaskKind.winograd, { ...task, phase: WinogradPhase.filterParts, images: g.batch }, threads);
      this.#run(TaskKind.winograd, { ...task, phase: WinogradPhase.filterSum }, threads);
    } else {
      const phases = [WinogradPhase.filterTiles, WinogradPhase.filterProducts];
      for (let first = 0; first < g.batch; first += plan.chunkImages) {
        const images = Math.min(plan.chunkImages, g.batch - first);
        for (const phase of phases) this.#run(TaskKind.winograd, { ...task, phase, first, images }, threads);
      }
    }
    this.#run(TaskKind.winograd, { ...task, phase: WinogradPhase.filterGradient }, threads);
    return true;
  }

  #conv(
    kind: TaskKind,
    g: Conv2dGeometry,
    image: Float32Array,
    weight: Float32Array,
    output: Float32Array | undefined,
    result: "image" | "weight" | "output",
    bias?: Float32Array,
    relu = false,
    pooling?: Pooling,
  ): boolean {
    checkLength("x", image, g.batch * g.inChannels * g.inHeight * g.inWidth);
    checkLength("w", weight, g.outChannels * (g.inChannels / g.groups) * g.kernelH * g.kernelW);
    if (output) checkLength("out", output, g.batch * g.outChannels * g.outHeight * g.outWidth);
    try {
      const imageAt = this.#stage(image, image.length, result !== "image");
      const weightAt = this.#stage(weight, weight.length, result !== "weight");
      // A pooled forward writes no output: its images go through each thread's scratch.
      const outputAt = output ? this.#stage(output, output.length, result !== "output") : 0;
      const biasAt = bias ? this.#stage(bias, g.outChannels, true) : 0;
      const pooledAt = pooling ? this.#stage(pooling.pooled, pooling.pooled.length, false) : 0;
      const argmaxAt = pooling ? this.#stage(pooling.argmax, pooling.argmax.length, false) : 0;
      if ([imageAt, weightAt, outputAt, biasAt, pooledAt, argmaxAt].includes(undefined)) return false;
      const operands = { image: imageAt!, weight: weightAt!, output: outputAt!, bias: biasAt!, relu };
      const pool = pooling && { geometry: pooling.geometry, pooled: pooledAt!, argmax: argmaxAt! };
      const done = this.winograd && winogradSide(g, winogradPass(kind)) !== undefined
        ? this.#winograd(kind, g, operands, pool)
        : this.#convTask(kind, g, operands, pool);
      if (!done) return false;
      if (result === "image") this.#unstage(image, imageAt!, image.length);
      else if (result === "weight") this.#unstage(weight, weightAt!, weight.length);
      else if (pooling) {
        this.#unstage(pooling.pooled, pooledAt!, pooling.pooled.length);
        this.#unstage(pooling.argmax, argmaxAt!, pooling.argmax.length);
      } else this.#unstage(output!, outputAt!, output!.length);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * Max pooling forward (`out` and `argmax` overwritten, the TypeScript kernel's exact values and
   * indices); false when it does not fit the kernel memory.
   */
  maxPool2dForward(x: Float32Array, out: Float32Array, argmax: Int32Array, g: Pool2dGeometry): boolean {
    const planes = g.batch * g.channels;
    const inPlane = g.inHeight * g.inWidth, outPlane = g.outHeight * g.outWidth;
    if (x.length !== planes * inPlane || out.length !== planes * outPlane || argmax.length !== out.length) {
      throw new Error(`maxPool2d: operand sizes do not match the geometry`);
    }
    // About ten instructions per output and tap (some 1.5 ns per 3×3 window on one thread).
    const threads = this.#threadsFor(10 * out.length * g.kernelH * g.kernelW);
    try {
      const xAt = this.#stage(x, x.length, true), outAt = this.#stage(out, out.length, false);
      const argmaxAt = this.#stage(argmax, argmax.length, false);
      if (xAt === undefined || outAt === undefined || argmaxAt === undefined) return false;
      this.#run(TaskKind.maxPoolForward, {
        planes,
        ...windowFields(g),
        x: xAt,
        out: outAt,
        argmax: argmaxAt,
        scratch: 0,
        scratchStride: 0,
      }, threads);
      this.#unstage(out, outAt, out.length);
      this.#unstage(argmax, argmaxAt, argmax.length);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * A memory-bound pass (see `ElementwiseTask` in `tasks.ts`) on `elements` floats of traffic' worth
   * of threads: large activations split over the kernel threads, small ones stay on this thread.
   * Returns the threads that ran it.
   */
  #elementwise(
    op: number,
    length: number,
    a: number,
    b: number,
    out: number,
    extra = 0,
    extra2 = 0,
    elements = length,
  ): number {
    const threads = this.#threadsFor(elements * 8);
    this.#run(TaskKind.elementwise, { op, length, a, b, out, extra, extra2 }, threads);
    return threads;
  }

  /**
   * Index of the first NaN or ±∞ of `x` (`firstNonFiniteIndex`'s answer), −1 when all are finite;
   * undefined when memory is full. A resident array is scanned in place in one pass over the
   * threads; any other is copied in 1 MiB pieces, each scanned while it is still in cache (some
   * 0.3–0.8 ns per float against the TypeScript scan's 1.0–1.5, without growing the memory by
   * the array), up to the first piece that holds a bad value.
   */
  firstNonFinite(x: Float32Array): number | undefined {
    const piece = this.#resident.has(x) ? x.length : STAGED_PIECE;
    for (let start = 0; start < x.length; start += piece) {
      const length = Math.min(piece, x.length - start);
      try {
        // One slot per thread that may take part; the pass reports how many did.
        const at = this.#stage(x, length, true, start), slots = this.#scratch(4 * this.#threads);
        if (at === undefined || slots === undefined) return undefined;
        const threads = this.#elementwise(ElementwiseOp.firstNonFinite, length, at, 0, slots);
        const found = firstFound(new Int32Array(this.#memory.buffer, slots, threads));
        if (found >= 0) return start + found;
      } finally {
        this.#releaseTemporaries();
      }
    }
    return -1;
  }

  /** {@link Backend.dropoutMask} into `out` (one thread); false when out of memory. */
  dropoutMask(out: Float32Array, spec: DropoutMaskSpec): boolean {
    try {
      const outAt = this.#stage(out, out.length, false), scratch = this.#scratch(64);
      if (outAt === undefined || scratch === undefined) return false;
      // Groups of 16 positions (4 counter blocks) from the one holding `offset`.
      const group = Math.floor(spec.offset / 16), block = 4 * group;
      this.#kernels.dropout_mask(
        outAt,
        out.length,
        block % 2 ** 32,
        Math.floor(block / 2 ** 32),
        spec.offset - 16 * group,
        spec.key[0],
        spec.key[1],
        spec.stream,
        spec.step,
        spec.threshold,
        spec.keep,
        scratch,
      );
      this.#unstage(out, outAt, out.length);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /** `out = relu(x)` over equal-length arrays (the TypeScript kernel's bits); false when out of memory. */
  relu(x: Float32Array, out: Float32Array): boolean {
    try {
      const xAt = this.#stage(x, x.length, true), outAt = this.#stage(out, out.length, false);
      if (xAt === undefined || outAt === undefined) return false;
      this.#elementwise(ElementwiseOp.relu, x.length, xAt, 0, outAt);
      this.#unstage(out, outAt, out.length);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * `out[i] = y[yOffset + i] > 0 ? dy[dyOffset + i] : 0` for i < out.length (the TypeScript
   * kernel's bits); false when out of memory.
   */
  reluGrad(dy: Float32Array, dyOffset: number, y: Float32Array, yOffset: number, out: Float32Array): boolean {
    const n = out.length;
    try {
      const dyAt = this.#stage(dy, n, true, dyOffset), yAt = this.#stage(y, n, true, yOffset);
      const outAt = this.#stage(out, n, false);
      if (dyAt === undefined || yAt === undefined || outAt === undefined) return false;
      this.#elementwise(ElementwiseOp.reluGrad, n, dyAt, yAt, outAt);
      this.#unstage(out, outAt, n);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /** `out = a · b` over equal-length arrays (the TypeScript kernel's bits); false when out of memory. */
  mul(a: Float32Array, b: Float32Array, out: Float32Array): boolean {
    const n = out.length;
    try {
      const aAt = this.#stage(a, n, true), bAt = this.#stage(b, n, true), outAt = this.#stage(out, n, false);
      if (aAt === undefined || bAt === undefined || outAt === undefined) return false;
      this.#elementwise(ElementwiseOp.mul, n, aAt, bAt, outAt);
      this.#unstage(out, outAt, n);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * `out[o, c, i] = x[o, c, i] + bias[c]` over `[outer, channels, inner]` (the TypeScript broadcast
   * add's bits); false when out of memory.
   */
  addChannels(x: Float32Array, bias: Float32Array, out: Float32Array, outer: number, inner: number): boolean {
    try {
      const xAt = this.#stage(x, out.length, true), biasAt = this.#stage(bias, bias.length, true);
      const outAt = this.#stage(out, out.length, false);
      if (xAt === undefined || biasAt === undefined || outAt === undefined) return false;
      this.#elementwise(ElementwiseOp.addChannels, outer, xAt, biasAt, outAt, bias.length, inner, out.length);
      this.#unstage(out, outAt, out.length);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * `out = (inputs[0] + … + inputs[N−1]) · fround(1/N)`, added in index order with one float32
   * rounding per operation (the TypeScript average's bits); false when out of memory.
   */
  averageInOrder(inputs: readonly Float32Array[], out: Float32Array): boolean {
    const n = out.length;
    try {
      const at = inputs.map((input) => this.#stage(input, n, true));
      const outAt = this.#stage(out, n, false);
      if (outAt === undefined || at.some((a) => a === undefined)) return false;
      const addresses = at as number[];
      if (addresses.length === 1) new Float32Array(this.#memory.buffer, outAt, n).set(inputs[0]);
      else {
        const scale = Math.fround(1 / addresses.length);
        for (let d = 1; d < addresses.length; d++) {
          const last = d === addresses.length - 1;
          const factor = floatBits(last ? scale : 1);
          this.#elementwise(
            ElementwiseOp.addScale,
            n,
            d === 1 ? addresses[0] : outAt,
            addresses[d],
            outAt,
            factor,
          );
        }
      }
      this.#unstage(out, outAt, n);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /** `out[r] = Σ x[r·size …]` for `rows` rows, in float64 rounded once; false when out of memory. */
  sumRows(x: Float32Array, out: Float32Array, rows: number, size: number): boolean {
    try {
      const xAt = this.#stage(x, rows * size, true), outAt = this.#stage(out, rows, false);
      if (xAt === undefined || outAt === undefined) return false;
      this.#elementwise(ElementwiseOp.sumRows, rows, xAt, 0, outAt, size, 0, rows * size);
      this.#unstage(out, outAt, rows);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * LRN forward (`out` and `scale` overwritten, the TypeScript kernel's bits) for `beta = 0.75`;
   * false, with nothing done, for another beta, operands whose sizes do not match the shape (the
   * TypeScript kernel reports those), or when it does not fit the kernel memory.
   */
  lrnForward(
    x: Float32Array,
    out: Float32Array,
    scale: Float32Array,
    shape: readonly number[],
    p: LrnParams,
  ): boolean {
    return this.#lrn(TaskKind.lrnForward, [x, out, scale], 1, shape, p);
  }

  /** LRN backward (`dx` overwritten, the TypeScript kernel's bits); false as {@link lrnForward}. */
  lrnBackward(
    x: Float32Array,
    y: Float32Array,
    scale: Float32Array,
    dy: Float32Array,
    dx: Float32Array,
    shape: readonly number[],
    p: LrnParams,
  ): boolean {
    return this.#lrn(TaskKind.lrnBackward, [x, y, scale, dy, dx], 4, shape, p);
  }

  /** An LRN pass over `arrays` (in the task's order), those from index `outputs` on written. */
  #lrn(
    kind: TaskKind,
    arrays: readonly Float32Array[],
    outputs: number,
    shape: readonly number[],
    p: LrnParams,
  ): boolean {
    checkLrn(shape, p);
    const [N, C, H, W] = shape, plane = H * W, total = N * C * plane;
    if (p.beta !== 0.75 || total === 0 || arrays.some((a) => a.length !== total)) return false;
    // ≈ 16 float64 operations per element, square roots and divisions included; whole images per thread.
    const threads = Math.min(N, this.#threadsFor(16 * total));
    try {
      const at = arrays.map((a, i) => this.#stage(a, total, i < outputs));
      const scratchStride = lrnScratchBytes(plane, p.size, kind === TaskKind.lrnBackward);
      const scratch = this.#scratch(threads * scratchStride);
      if (at.some((a) => a === undefined) || scratch === undefined) return false;
      // Forward: x, out (as y), scale; backward: x, y, scale, dy, dx.
      const [x, y, scale, dy = 0, dx = 0] = at as number[];
      const hyper = kind === TaskKind.lrnForward
        ? lrnConstants(p.k, p.alpha / p.size)
        : lrnConstants((2 * p.alpha * p.beta) / p.size, 0);
      const half = (p.size - 1) / 2;
      this.#run(kind, {
        images: N,
        channels: C,
        plane,
        half,
        x,
        y,
        scale,
        dy,
        dx,
        scratch,
        scratchStride,
        hyper,
      }, threads);
      for (let i = outputs; i < arrays.length; i++) this.#unstage(arrays[i], at[i]!, total);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * Convolution forward (`y` overwritten), plus `bias` per output channel when given, then ReLU
   * with `activation` `"relu"` (both per image, while it is in cache); false when it does not fit
   * the kernel memory.
   */
  conv2dForward(
    x: Float32Array,
    w: Float32Array,
    y: Float32Array,
    g: Conv2dGeometry,
    bias?: Float32Array,
    activation?: Activation,
  ): boolean {
    return this.#conv(TaskKind.convForward, g, x, w, y, "output", bias, activation === "relu");
  }

  /**
   * Convolution forward, bias and ReLU as {@link WasmKernels.conv2dForward}, then max pooling by
   * `pool` into `pooled` and `argmax`, each image pooled by the thread that computed it while its
   * output is in that thread's scratch (see `pool_epilogue.ts`): the bits of the two calls, with no
   * output written; false when it does not fit the kernel memory.
   */
  conv2dForwardMaxPool(
    x: Float32Array,
    w: Float32Array,
    pooled: Float32Array,
    argmax: Int32Array,
    g: Conv2dGeometry,
    pool: Pool2dGeometry,
    bias?: Float32Array,
    activation?: Activation,
  ): boolean {
    const planes = g.batch * g.outChannels;
    if (
      pool.batch !== g.batch || pool.channels !== g.outChannels || pool.inHeight !== g.outHeight ||
      pool.inWidth !== g.outWidth
    ) {
      throw new Error(`conv2d: the pooling's input does not match the convolution's output`);
    }
    checkLength("pooled", pooled, planes * pool.outHeight * pool.outWidth);
    if (argmax.length !== pooled.length) throw new Error(`conv2d: argmax and pooled lengths differ`);
    const pooling = { geometry: pool, pooled, argmax };
    return this.#conv(
      TaskKind.convForward,
      g,
      x,
      w,
      undefined,
      "output",
      bias,
      activation === "relu",
      pooling,
    );
  }

  /** Input gradient (`dx` overwritten); false when it does not fit the kernel memory. */
  conv2dBackwardInput(dy: Float32Array, w: Float32Array, dx: Float32Array, g: Conv2dGeometry): boolean {
    return this.#conv(TaskKind.convBackwardInput, g, dx, w, dy, "image");
  }

  /** Weight gradient (`dw` overwritten); false when it does not fit the kernel memory. */
  conv2dBackwardFilter(x: Float32Array, dy: Float32Array, dw: Float32Array, g: Conv2dGeometry): boolean {
    return this.#conv(TaskKind.convBackwardFilter, g, x, dw, dy, "weight");
  }

  /** Addresses of `arrays` when every one is resident and as long as the first; else undefined. */
  #residentAddresses(arrays: readonly Float32Array[]): number[] | undefined {
    const addresses: number[] = [];
    for (const array of arrays) {
      const block = this.#resident.get(array);
      if (!block || array.length !== arrays[0].length) return undefined;
      addresses.push(block.address);
    }
    return addresses;
  }

  /**
   * Threads for an update of `length` floats: one per {@link UPDATE_FLOATS_PER_THREAD} (at least one). An
   * update is memory-bound, so a second thread buys little, and waking it costs most where cores
   * are busy: measured here on 2 cores, 256 Ki floats (an MPI exchange's 1 MiB chunk) took
   * 181 µs at the median on one thread against 430 µs on two (best 162 against 157), and over a
   * 10 Gbit/s link two threads per chunk slowed rank 0's 66.5 MB exchange from 154 to 184 ms. At
   * 1 Mi floats two threads win (median 739 against 1,096 µs).
   */
  #updateThreads(length: number): number {
    return this.#threadsFor(FLOPS_PER_THREAD * Math.floor(length / UPDATE_FLOATS_PER_THREAD));
  }

  /**
   * Fused SGD step in place, the TypeScript kernel's bits (`sgdUpdateKernel`), with `saved` the
   * values of `param` and `history` it overwrites written there in the same pass. Returns whether
   * every new parameter is finite (checked in that pass too), or `undefined`, with nothing done,
   * unless every array lives in kernel memory with equal lengths (arrays elsewhere, such as a
   * device's shared buffers, would be copied in and out every step).
   */
  sgdUpdate(
    param: Float32Array,
    grad: Float32Array,
    history: Float32Array,
    step: SgdStep,
    saved?: { param: Float32Array; history: Float32Array },
  ): boolean | undefined {
    const at = this.#residentAddresses([
      param,
      grad,
      history,
      ...(saved ? [saved.param, saved.history] : []),
    ]);
    if (!at) return undefined;
    if (param.length === 0) return true;
    const threads = this.#updateThreads(param.length);
    try {
      // One flag per thread that takes part.
      const flags = this.#scratch(4 * threads);
      if (flags === undefined) return undefined;
      this.#run(TaskKind.sgdUpdate, {
        length: param.length,
        param: at[0],
        grad: at[1],
        history: at[2],
        v: 0,
        savedParam: at[3] ?? 0,
        savedHistory: at[4] ?? 0,
        finite: flags,
        hyper: [step.rate, step.momentum, step.decay].map(floatBits),
      }, threads);
      return new Int32Array(this.#memory.buffer, flags, threads).every((flag) => flag === 1);
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * Fused Adam step in place, the TypeScript kernel's bits (`adamUpdateKernel`, with its float32
   * constants); false, with nothing done, unless all four arrays are resident with equal lengths.
   */
  adamUpdate(
    param: Float32Array,
    grad: Float32Array,
    m: Float32Array,
    v: Float32Array,
    step: AdamStep,
  ): boolean {
    const at = this.#residentAddresses([param, grad, m, v]);
    if (!at) return false;
    if (param.length === 0) return true;
    const { rate, beta1, beta2, eps, decay, correction1, correction2 } = step;
    this.#run(TaskKind.adamUpdate, {
      length: param.length,
      param: at[0],
      grad: at[1],
      history: at[2],
      v: at[3],
      savedParam: 0,
      savedHistory: 0,
      finite: 0,
      hyper: [beta1, beta2, 1 - beta1, 1 - beta2, decay, eps, Math.sqrt(correction2), rate / correction1].map(
        floatBits,
      ),
    }, this.#updateThreads(param.length));
    return true;
  }

  /**
   * Max pooling backward (`dx` overwritten: zeros, plus each `dy` at its window's argmax, summed
   * in the TypeScript kernel's order); with `reluOf`, only the outputs whose pooled value is > 0
   * (`reluGrad` before it); with `planeSums`, each dx plane then summed as {@link sumRows} sums a
   * row. False when it does not fit the kernel memory.
   */
  maxPool2dBackward(
    dy: Float32Array,
    argmax: Int32Array,
    dx: Float32Array,
    g: Pool2dGeometry,
    epilogue: { reluOf?: Float32Array; planeSums?: Float32Array } = {},
  ): boolean {
    const planes = g.batch * g.channels;
    const inPlane = g.inHeight * g.inWidth, outPlane = g.outHeight * g.outWidth;
    const { reluOf, planeSums } = epilogue;
    if (
      dx.length !== planes * inPlane || dy.length !== planes * outPlane || argmax.length !== dy.length ||
      (reluOf && reluOf.length !== dy.length) || (planeSums && planeSums.length !== planes)
    ) {
      throw new Error(`maxPool2d: operand sizes do not match the geometry`);
    }
    // Scattering one output costs about as much as 32 GEMM flops, clearing one input 2.
    const threads = this.#threadsFor(32 * dy.length + 2 * dx.length);
    try {
      const dyAt = this.#stage(dy, dy.length, true), argmaxAt = this.#stage(argmax, argmax.length, true);
      const dxAt = this.#stage(dx, dx.length, false);
      const reluAt = reluOf ? this.#stage(reluOf, reluOf.length, true) : 0;
      const sumsAt = planeSums ? this.#stage(planeSums, planes, false) : 0;
      if ([dyAt, argmaxAt, dxAt, reluAt, sumsAt].includes(undefined)) return false;
      this.#run(
        TaskKind.maxPoolBackward,
        {
          planes,
          inPlane,
          outPlane,
          dy: dyAt!,
          argmax: argmaxAt!,
          dx: dxAt!,
          reluOf: reluAt!,
          masked: reluOf !== undefined,
          planeSums: sumsAt!,
          summed: planeSums !== undefined,
        },
        threads,
      );
      this.#unstage(dx, dxAt!, dx.length);
      if (planeSums) this.#unstage(planeSums, sumsAt!, planes);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * The weight gradient of a convolution whose output was max-pooled, from the pooled gradient `dy`
   * and the winners `argmax` (`dw` overwritten; see `filter_pooled.ts`); with `reluOf`, only the
   * pooled outputs whose value is > 0 count; with `planeSums` (batch × outChannels), each plane's
   * counted gradients summed. False where the kernels cannot take the shapes
   * (`pooledFilterProblem`) or the operands do not fit the kernel memory.
   */
  convBackwardFilterPooled(
    x: Float32Array,
    dy: Float32Array,
    argmax: Int32Array,
    dw: Float32Array,
    g: Conv2dGeometry,
    pool: Pool2dGeometry,
    epilogue: { reluOf?: Float32Array; planeSums?: Float32Array } = {},
  ): boolean {
    if (pooledFilterProblem(g, pool) !== undefined) return false;
    const { reluOf, planeSums } = epilogue;
    const outputs = pool.outHeight * pool.outWidth, planes = g.batch * g.outChannels;
    checkLength("x", x, g.batch * g.inChannels * g.inHeight * g.inWidth);
    checkLength("dw", dw, g.outChannels * (g.inChannels / g.groups) * g.kernelH * g.kernelW);
    if (
      dy.length !== planes * outputs || argmax.length !== dy.length ||
      (reluOf && reluOf.length !== dy.length) ||
      (planeSums && planeSums.length !== planes)
    ) {
      throw new Error(`conv2d: pooled gradient sizes do not match the geometry`);
    }
    // Each counted pooled output costs kernelH · kernelW multiply-adds (lanes past kernelW too).
    const threads = Math.min(
      g.outChannels,
      this.#threadsFor(2 * dy.length * g.kernelH * 4 * Math.ceil(g.kernelW / 4)),
    );
    try {
      const imageAt = this.#stage(x, x.length, true), dyAt = this.#stage(dy, dy.length, true);
      const argmaxAt = this.#stage(argmax, argmax.length, true);
      const reluAt = reluOf ? this.#stage(reluOf, reluOf.length, true) : 0;
      const weightAt = this.#stage(dw, dw.length, false);
      const sumsAt = planeSums ? this.#stage(planeSums, planes, false) : 0;
      const offsets = pooledFilterOffsets(g), scratchStride = pooledFilterScratchBytes(g);
      const offsetsAt = this.#scratch(4 * offsets.length), scratch = this.#scratch(threads * scratchStride);
      if ([imageAt, dyAt, argmaxAt, reluAt, weightAt, sumsAt, offsetsAt, scratch].includes(undefined)) {
        return false;
      }
      new Int32Array(this.#memory.buffer, offsetsAt!, offsets.length).set(offsets);
      this.#run(TaskKind.filterPooled, {
        ...g,
        pooledOutputs: outputs,
        image: imageAt!,
        dy: dyAt!,
        argmax: argmaxAt!,
        reluOf: reluAt!,
        masked: reluOf !== undefined,
        weight: weightAt!,
        planeSums: sumsAt!,
        summed: planeSums !== undefined,
        offsets: offsetsAt!,
        scratch: scratch!,
        scratchStride,
      }, threads);
      this.#unstage(dw, weightAt!, dw.length);
      if (planeSums) this.#unstage(planeSums, sumsAt!, planes);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }

  /**
   * Average pooling forward (`out` overwritten, the TypeScript kernel's bits); false when it does
   * not fit the kernel memory.
   */
  avgPool2dForward(x: Float32Array, out: Float32Array, g: Pool2dGeometry): boolean {
    return this.#avgPool(TaskKind.avgPoolForward, x, out, g);
  }

  /**
   * Average pooling backward (`dx` overwritten, the TypeScript kernel's bits, its adds in its
   * order); false when it does not fit the kernel memory.
   */
  avgPool2dBackward(dy: Float32Array, dx: Float32Array, g: Pool2dGeometry): boolean {
    return this.#avgPool(TaskKind.avgPoolBackward, dy, dx, g);
  }

  /** An average pooling pass from `source` (x or dy) into `target` (out or dx), by whole planes. */
  #avgPool(kind: TaskKind, source: Float32Array, target: Float32Array, g: Pool2dGeometry): boolean {
    const backward = kind === TaskKind.avgPoolBackward;
    const planes = g.batch * g.channels;
    const inputs = planes * g.inHeight * g.inWidth, outputs = planes * g.outHeight * g.outWidth;
    const [sourceLength, targetLength] = backward ? [outputs, inputs] : [inputs, outputs];
    if (source.length !== sourceLength || target.length !== targetLength) {
      throw new Error(`avgPool2d: operand sizes do not match the geometry`);
    }
    // In GEMM flops of the same time: forward about 10 per output and tap (some 1.6 ns per 3×3
    // window on one thread, as max pooling), backward 8 per input and window it can lie in
    // (some 0.55 ns per input of 3×3, stride-2 windows).
    const work = backward
      ? 8 * inputs * Math.ceil(g.kernelH / g.strideH) * Math.ceil(g.kernelW / g.strideW)
      : 10 * outputs * g.kernelH * g.kernelW;
    const threads = Math.min(planes, this.#threadsFor(work));
    try {
      const sourceAt = this.#stage(source, sourceLength, true),
        targetAt = this.#stage(target, targetLength, false);
      const divisors = avgPoolDivisors(g);
      // Slack: a short row's vector group reads up to three divisors past the table.
      const divisorsAt = this.#scratch(8 * divisors.length + OVERREAD);
      const scratchStride = backward ? avgPoolShareBytes(g) : 0;
      const scratch = this.#scratch(threads * scratchStride);
      if (
        sourceAt === undefined || targetAt === undefined || divisorsAt === undefined || scratch === undefined
      ) return false;
      new Float64Array(this.#memory.buffer, divisorsAt, divisors.length).set(divisors);
      this.#run(kind, {
        planes,
        ...windowFields(g),
        source: sourceAt,
        target: targetAt,
        divisors: divisorsAt,
        shareRow: backward ? avgPoolShareRow(g) : 0,
        scratch,
        scratchStride,
      }, threads);
      this.#unstage(target, targetAt, targetLength);
      return true;
    } finally {
      this.#releaseTemporaries();
    }
  }
}

/** A pooling task's window geometry (every field of `Pool2dGeometry` but batch and channels). */
/** A pooled forward convolution's pooling and where its results go (see `conv2dForwardMaxPool`). */
interface Pooling {
  geometry: Pool2dGeometry;
  pooled: Float32Array;
  argmax: Int32Array;
}

function windowFields(g: Pool2dGeometry) {
  const { inHeight, inWidth, outHeight, outWidth, kernelH, kernelW, strideH, strideW, padH, padW } = g;
  return { inHeight, inWidth, outHeight, outWidth, kernelH, kernelW, strideH, strideW, padH, padW };
}
