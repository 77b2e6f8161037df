/**
 * The WebGPU backend: storages are pooled `GPUBuffer`s, kernels are WGSL generated from the
 * templates in `kernels.ts`, compiled once per specialisation and cached by key.
 *
 * Work is recorded into one command encoder and submitted when a result is read (or every
 * `maxKernelsPerSubmit` kernels), so a training step costs a handful of submits. Kernel parameters
 * go to one arena buffer, one aligned slot per dispatch, written just before the submit that reads
 * them; queue operations run in order, so reusing the arena across submits is safe.
 *
 * GPU errors are asynchronous in WebGPU. They are recorded (validation failures of pipeline
 * creation, uncaptured errors, device loss) and thrown by the next backend call or by `read`, with
 * the kernel and shapes involved, rather than silently producing wrong numbers.
 *
 * It stays one file although long: it is the one class that implements the backend contract, one
 * method per operation (most under 30 lines: check the shapes, pick the WGSL template, dispatch),
 * over private plumbing they all share (command encoder, parameter arena, buffer pool, pipeline
 * cache, error scopes). The WGSL itself lives in `kernels.ts` and `wgsl.ts`.
 *
 * @module
 */

/// <reference types="@webgpu/types" />

import type {
  Activation,
  AdamStep,
  Backend,
  BinaryOp,
  Conv2dGeometry,
  DType,
  HostArray,
  LrnParams,
  MatmulSpec,
  Pool2dGeometry,
  ReduceOp,
  RowSpec,
  SgdSaved,
  SgdStep,
  StagedValues,
  Storage,
  StridedView,
  UnaryOp,
} from "../backend.ts";
import { checkLrn, isDenseView, isPointwise } from "../geometry.ts";
import {
  adamShader,
  avgPoolBackwardShader,
  avgPoolShader,
  binaryShader,
  col2imShader,
  copyShader,
  crossEntropyBackwardShader,
  fillShader,
  firstNonFiniteShader,
  GEMM_K_CHUNK,
  GEMM_TILE,
  gemmLoad,
  gemmShader,
  im2colShader,
  lrnBackwardShader,
  lrnShader,
  MAX_LOOP_ITERATIONS,
  maxPoolBackwardShader,
  maxPoolShader,
  orderedSumShader,
  REDUCE_CHUNK,
  reduceShader,
  rowShader,
  sgdShader,
  unaryShader,
} from "./kernels.ts";
import { grid1d, gridOf, MAX_WORKGROUPS_PER_DIM, Params } from "./wgsl.ts";

/** Options of {@link createWebGpuBackend}. */
export interface WebGpuBackendOptions {
  /** Adapter preference passed to `requestAdapter`. */
  powerPreference?: GPUPowerPreference;
  /**
   * Submit after every kernel inside a validation error scope, so an error names the exact kernel
   * and shapes (slower; for debugging).
   */
  debug?: boolean;
  /** Kernels recorded before an automatic submit (default 64). */
  maxKernelsPerSubmit?: number;
  /** Name to register the backend under (default `webgpu`); one per GPUDevice when there are several. */
  name?: string;
}

/** A WebGPU storage: a pooled buffer (its size class may exceed `length · 4` bytes). */
export class WebGpuStorage implements Storage {
  /** Set by `release`; later use is an error. */
  released = false;
  /** Wraps a buffer owned by `owner`. */
  constructor(
    readonly owner: WebGpuBackend,
    readonly buffer: GPUBuffer,
    readonly length: number,
    readonly dtype: DType,
  ) {}
}

/**
 * One copy between host memory and a WebGPU device, as reported to
 * {@link WebGpuBackend.observeTransfers}.
 *
 * @example
 * ```ts
 * import type { TransferEvent } from "./backend.ts";
 * const describe = (e: TransferEvent) => `${e.direction} ${e.bytes} bytes`;
 * ```
 */
export interface TransferEvent {
  /** `toDevice`: host data written into the storage; `toHost`: the storage copied out for the host. */
  readonly direction: "toDevice" | "toHost";
  /** The storage whose contents moved. */
  readonly storage: Storage;
  /** Bytes moved. */
  readonly bytes: number;
}

/** Where {@link WebGpuBackend.stageToHost} lends its values; defined by the backend contract. */
export type { StagedValues } from "../backend.ts";

/** Smallest buffer handed out: zero-length storages still need a bindable buffer. */
const MIN_BUFFER_BYTES = 16;

/** Power-of-two size classes: at most 2× waste, and few distinct classes to pool. */
function sizeClass(bytes: number): number {
  let size = MIN_BUFFER_BYTES;
  while (size < bytes) size *= 2;
  return size;
}

/** Words of the largest parameter block (copy at rank 8 needs 27). */
const MAX_PARAM_WORDS = 32;
/** Parameter slots per submit; a full arena forces a submit. */
const ARENA_SLOTS = 256;

function prod(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

function fmt(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

/**
 * The WebGPU backend; create it with {@link createWebGpuBackend}.
 *
 * @example
 * ```ts
 * import { createWebGpuBackend } from "./backend.ts";
 * const gpu = await createWebGpuBackend();
 * if (gpu) {
 *   const x = gpu.upload(new Float32Array([1, -2, 3]));
 *   const y = gpu.allocate(3, "float32");
 *   gpu.unary("relu", x, y);
 *   console.log(await gpu.read(y)); // Float32Array [1, 0, 3]
 * }
 * ```
 */
export class WebGpuBackend implements Backend {
  readonly name: string;

  private readonly pool = new Map<number, GPUBuffer[]>();
  private readonly stagingPool = new Map<number, GPUBuffer[]>();
  private readonly pipelines = new Map<string, GPUComputePipeline>();
  private live = 0;
  private encoder: GPUCommandEncoder | null = null;
  private kernelsInBatch = 0;
  private readonly slotBytes: number;
  private readonly arena: GPUBuffer;
  private readonly arenaData: ArrayBuffer;
  private readonly arenaView: DataView;
  private slotsUsed = 0;
  private failure: Error | null = null;
  private lost: Error | null = null;
  private lastKernel = "(none)";
  private readonly pendingScopes = new Set<Promise<void>>();
  private readonly debug: boolean;
  /** Largest storage-buffer binding the device accepts, in bytes. */
  private readonly maxBinding: number;
  private readonly maxKernelsPerSubmit: number;
  /** Inputs one ordered-sum dispatch can bind besides the parameters and the output. */
  private readonly maxSumInputs: number;
  private readonly transferListeners = new Set<(event: TransferEvent) => void>();

  /** Wraps an already-created device; prefer {@link createWebGpuBackend}. */
  constructor(readonly device: GPUDevice, options: WebGpuBackendOptions = {}) {
    this.name = options.name ?? "webgpu";
    this.maxBinding = device.limits.maxStorageBufferBindingSize;
    this.debug = options.debug ?? false;
    this.maxKernelsPerSubmit = this.debug ? 1 : Math.max(1, options.maxKernelsPerSubmit ?? 64);
    this.maxSumInputs = device.limits.maxStorageBuffersPerShaderStage - 2;
    const align = device.limits.minStorageBufferOffsetAlignment;
    this.slotBytes = Math.ceil((MAX_PARAM_WORDS * 4) / align) * align;
    this.arena = device.createBuffer({
      size: this.slotBytes * ARENA_SLOTS,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
    });
    this.arenaData = new ArrayBuffer(this.slotBytes * ARENA_SLOTS);
    this.arenaView = new DataView(this.arenaData);
    device.lost.then((info) => {
      this.lost = new Error(
        `webgpu backend: device lost (${info.reason}): ${info.message}; last kernel ${this.lastKernel}`,
      );
    });
    device.addEventListener("uncapturederror", (event) => {
      const message = (event as GPUUncapturedErrorEvent).error.message;
      this.failure ??= new Error(`webgpu backend: GPU error near kernel ${this.lastKernel}: ${message}`);
    });
  }

  /** Storages handed out and not yet released (scratch included while a kernel runs); for leak tests. */
  liveBuffers(): number {
    return this.live;
  }

  /** Buffers idle in the pool, ready for reuse. */
  pooledBuffers(): number {
    let n = 0;
    for (const list of this.pool.values()) n += list.length;
    return n;
  }

  /** Compiled pipelines cached so far (one per kernel specialisation). */
  pipelineCount(): number {
    return this.pipelines.size;
  }

  /**
   * Cache keys of the pipelines compiled so far, e.g. `gemm:NT:vec4:scalar`: which specialisations
   * ran (tests use it to prove a variant was exercised).
   */
  pipelineKeys(): string[] {
    return [...this.pipelines.keys()];
  }

  /**
   * Calls `listener` for every copy between the host and this device (uploads, writes, reads and
   * staging), until the returned function is called: how tests prove what crosses the bus.
   *
   * @example
   * ```ts
   * import { createWebGpuBackend } from "./backend.ts";
   * const gpu = await createWebGpuBackend();
   * if (gpu) {
   *   let bytes = 0;
   *   const stop = gpu.observeTransfers((e) => (bytes += e.bytes));
   *   await gpu.read(gpu.upload(new Float32Array(4)));
   *   stop(); // bytes === 32
   * }
   * ```
   */
  observeTransfers(listener: (event: TransferEvent) => void): () => void {
    this.transferListeners.add(listener);
    return () => this.transferListeners.delete(listener);
  }

  /** Submits recorded work and waits for the GPU to finish it; throws any recorded GPU error. */
  async synchronize(): Promise<void> {
    this.flush();
    await this.device.queue.onSubmittedWorkDone();
    await this.settleScopes();
    this.checkHealthy();
  }

  /** Destroys pooled buffers and the device; the backend must not be used afterwards. */
  destroy(): void {
    try {
      this.flush();
      for (const list of [...this.pool.values(), ...this.stagingPool.values()]) {
        for (const b of list) b.destroy();
      }
      this.pool.clear();
      this.stagingPool.clear();
    } finally {
      // Whatever state a failure left behind, the device itself must go.
      this.device.destroy();
    }
  }

  /** The contract's name for {@link WebGpuBackend.destroy}: frees the pools and the `GPUDevice`. */
  dispose(): void {
    this.destroy();
  }

  // ---------------------------------------------------------------------------------------------
  // Memory

  allocate(length: number, dtype: DType): Storage {
    this.checkHealthy();
    const storage = this.acquire(length, dtype);
    this.commandEncoder().clearBuffer(storage.buffer);
    return storage;
  }

  upload(data: HostArray): Storage {
    this.checkHealthy();
    const storage = this.acquire(data.length, data instanceof Int32Array ? "int32" : "float32");
    this.writeHost(storage, data, 0);
    return storage;
  }

  /**
   * Overwrites `data.length` elements of `storage` from element `offset` on with host values, after
   * every kernel recorded so far has used the old ones (the staging path's receiving end).
   *
   * @example
   * ```ts
   * import { createWebGpuBackend } from "./backend.ts";
   * const gpu = await createWebGpuBackend();
   * if (gpu) {
   *   const s = gpu.allocate(4, "float32");
   *   gpu.write(s, new Float32Array([7, 8]), 2);
   *   console.log(await gpu.read(s)); // Float32Array [0, 0, 7, 8]
   * }
   * ```
   */
  write(storage: Storage, data: HostArray, offset = 0): void {
    const s = this.own(storage, "write");
    if (!Number.isInteger(offset) || offset < 0 || offset + data.length > s.length) {
      throw new Error(
        `webgpu backend: write of ${data.length} elements at ${offset} into a storage of ${s.length}`,
      );
    }
    this.writeHost(s, data, offset);
  }

  async read(storage: Storage): Promise<HostArray> {
    const s = this.own(storage, "read");
    const staged = await this.stageToHost([s]);
    const copy = staged.values.slice().buffer;
    staged.release();
    return s.dtype === "int32" ? new Int32Array(copy) : new Float32Array(copy);
  }

  /**
   * Starts copying `storages` back to back into a pooled, mappable staging buffer, after every kernel
   * recorded so far, and submits the copies at once; resolves with a view of the mapped values when
   * the GPU has written them. Recording happens in this call, so later kernels cannot delay the copy:
   * call it right after the work that produces the values. Release the result to reuse the buffer.
   *
   * @example
   * ```ts
   * import { createWebGpuBackend } from "./backend.ts";
   * const gpu = await createWebGpuBackend();
   * if (gpu) {
   *   const a = gpu.upload(new Float32Array([1, 2])), b = gpu.upload(new Float32Array([3]));
   *   const staged = await gpu.stageToHost([a, b]);
   *   console.log(staged.values); // Float32Array [1, 2, 3]
   *   staged.release();
   * }
   * ```
   */
  stageToHost(storages: readonly Storage[]): Promise<StagedValues> {
    const owned = storages.map((s) => this.own(s, "stageToHost"));
    const bytes = owned.reduce((sum, s) => sum + s.length * 4, 0);
    if (bytes === 0) {
      this.flush();
      return this.settleScopes().then(() => {
        this.checkHealthy();
        return { values: new Float32Array(0), release: () => {} };
      });
    }
    const staging = this.acquireStaging(bytes);
    const encoder = this.commandEncoder();
    let at = 0;
    for (const s of owned) {
      if (s.length === 0) continue;
      encoder.copyBufferToBuffer(s.buffer, 0, staging, at, s.length * 4);
      at += s.length * 4;
      this.reportTransfer("toHost", s, s.length * 4);
    }
    this.flush();
    return this.mapStaging(staging, bytes);
  }

  /**
   * `out = (inputs[0] + inputs[1] + … + inputs[N−1]) · fround(1/N)` in float32, added strictly in the
   * order given with one rounding per operation (no scaling for one input): bit for bit the host's
   * device-order average (`averageInDeviceOrder`), computed on the device. `out` must not be one of
   * the inputs.
   *
   * @example
   * ```ts
   * import { createWebGpuBackend } from "./backend.ts";
   * const gpu = await createWebGpuBackend();
   * if (gpu) {
   *   const out = gpu.allocate(1, "float32");
   *   gpu.averageInOrder([gpu.upload(new Float32Array([1])), gpu.upload(new Float32Array([2]))], out);
   *   console.log(await gpu.read(out)); // Float32Array [1.5]
   * }
   * ```
   */
  averageInOrder(inputs: readonly Storage[], out: Storage): void {
    const o = this.own(out, "averageInOrder");
    const buffers = inputs.map((s) => {
      const input = this.own(s, "averageInOrder");
      if (input.length !== o.length || input.dtype !== "float32" || input === o) {
        throw new Error(
          `webgpu backend: averageInOrder needs distinct float32 inputs of ${o.length} elements like its output`,
        );
      }
      return input.buffer;
    });
    if (buffers.length === 0) throw new Error("webgpu backend: averageInOrder of no inputs");
    if (o.length === 0) return;
    const scale = Math.fround(1 / buffers.length);
    // More inputs than one dispatch binds continue the same left-to-right sum in later passes.
    for (let first = 0; first < buffers.length; first += this.maxSumInputs) {
      const chunk = buffers.slice(first, first + this.maxSumInputs);
      const continued = first > 0;
      const last = first + chunk.length === buffers.length;
      this.dispatch(
        "averageInOrder",
        `orderedSum:${chunk.length}:${continued ? "continued" : "fresh"}`,
        () => orderedSumShader(chunk.length, continued),
        [o.buffer, ...chunk],
        new Params().u32(o.length).f32(scale).u32(last && buffers.length > 1 ? 1 : 0),
        grid1d(o.length),
        () => `averageInOrder(${buffers.length} × ${o.length})`,
      );
    }
  }

  release(storage: Storage): void {
    const s = this.own(storage, "release");
    s.released = true;
    this.live--;
    // Later kernels are recorded after every use of this buffer, so stream order makes reuse safe.
    const size = s.buffer.size;
    const list = this.pool.get(size) ?? [];
    list.push(s.buffer);
    this.pool.set(size, list);
  }

  fill(out: Storage, value: number): void {
    const o = this.own(out, "fill");
    if (o.length === 0) return;
    if (value === 0 && !Object.is(value, -0)) {
      this.commandEncoder().clearBuffer(o.buffer, 0, sizeClass(o.length * 4));
      return;
    }
    const p = new Params().u32(o.length);
    if (o.dtype === "int32") p.i32(value);
    else p.f32(value);
    this.dispatch("fill", "fill", fillShader, [o.buffer], p, grid1d(o.length), () => `fill(${o.length})`);
  }

  copyStrided(
    src: Storage,
    srcView: StridedView,
    dst: Storage,
    dstView: StridedView,
    shape: readonly number[],
  ): void {
    const s = this.own(src, "copyStrided"), d = this.own(dst, "copyStrided");
    const n = prod(shape);
    if (n === 0) return;
    if (shape.length > 8) throw new Error(`webgpu backend: copyStrided supports rank ≤ 8, got ${fmt(shape)}`);
    if (s.buffer !== d.buffer && isDenseView(srcView, shape) && isDenseView(dstView, shape)) {
      this.commandEncoder().copyBufferToBuffer(
        s.buffer,
        srcView.offset * 4,
        d.buffer,
        dstView.offset * 4,
        n * 4,
      );
      return;
    }
    const c = coalesce(shape, [srcView, dstView]);
    const rank = c.shape.length;
    const p = new Params().u32(n);
    for (const dim of c.shape) p.u32(dim);
    view(p, c.views[0], rank);
    view(p, c.views[1], rank);
    this.dispatch(
      "copyStrided",
      `copy:${rank}`,
      () => copyShader(rank),
      [s.buffer, d.buffer],
      p,
      grid1d(n),
      () => `copyStrided(shape ${fmt(shape)})`,
    );
  }

  unary(op: UnaryOp, x: Storage, out: Storage): void {
    const a = this.own(x, op), o = this.own(out, op);
    if (o.length === 0) return;
    this.dispatch(
      op,
      `unary:${op}`,
      () => unaryShader(op),
      [a.buffer, o.buffer],
      new Params().u32(o.length),
      grid1d(o.length),
      () => `unary ${op}(${o.length})`,
    );
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
    const sa = this.own(a, op), sb = this.own(b, op), o = this.own(out, op);
    const n = prod(shape);
    if (n === 0) return;
    if (shape.length > 8) throw new Error(`webgpu backend: binary supports rank ≤ 8, got ${fmt(shape)}`);
    const c = coalesce(shape, [aView, bView]);
    const rank = c.shape.length;
    const p = new Params().u32(n);
    for (const dim of c.shape) p.u32(dim);
    view(p, c.views[0], rank);
    view(p, c.views[1], rank);
    this.dispatch(
      op,
      `binary:${op}:${rank}`,
      () => binaryShader(op, rank),
      [sa.buffer, sb.buffer, o.buffer],
      p,
      grid1d(n),
      () => `binary ${op}(shape ${fmt(shape)})`,
    );
  }

  reduce(op: ReduceOp, x: Storage, out: Storage, outer: number, size: number, inner: number): void {
    const sx = this.own(x, op), o = this.own(out, op);
    const n = outer * inner;
    if (n === 0) return;
    // Short reductions get a thread per output; long ones a workgroup per chunk, in passes of at
    // most REDUCE_CHUNK elements per workgroup (see MAX_LOOP_ITERATIONS).
    if (size < 256) {
      this.dispatch(
        `reduce ${op}`,
        `reduce:${op}:thread`,
        () => reduceShader(op, true),
        [sx.buffer, o.buffer],
        new Params().u32(n).u32(size).u32(inner).u32(0),
        grid1d(n),
        () => `reduce ${op}([${outer}, ${size}, ${inner}])`,
      );
      return;
    }
    let src = sx, length = size;
    while (true) {
      const chunks = Math.ceil(length / REDUCE_CHUNK);
      const dst = chunks === 1 ? o : this.acquire(outer * chunks * inner, "float32");
      const groups = outer * chunks * inner;
      this.dispatch(
        `reduce ${op}`,
        `reduce:${op}:group`,
        () => reduceShader(op, false),
        [src.buffer, dst.buffer],
        new Params().u32(groups).u32(length).u32(inner).u32(0).u32(REDUCE_CHUNK).u32(chunks),
        gridOf(groups),
        () => `reduce ${op}([${outer}, ${length}, ${inner}])`,
      );
      if (src !== sx) this.release(src);
      if (dst === o) return;
      src = dst;
      length = chunks;
    }
  }

  matmul(
    a: Storage,
    b: Storage,
    out: Storage,
    spec: MatmulSpec,
    bias?: Storage,
    activation?: Activation,
  ): void {
    const sa = this.own(a, "matmul"), sb = this.own(b, "matmul");
    // The bias along the rows: `[batch·m, n]` plus `[n]`.
    this.withEpilogue("matmul", out, [spec.batch * spec.m, spec.n], bias, [0, 1], activation, (products) => {
      this.gemm(sa.buffer, sb.buffer, products.buffer, {
        ...spec,
        aOffset: 0,
        bOffset: 0,
        cOffset: 0,
        cBatchStride: spec.m * spec.n,
        accumulate: false,
      });
    });
  }

  /**
   * Runs `compute`, which writes a product to the storage it is given, then the product's epilogue
   * into `out`: the broadcast add of `bias` (read with `biasStrides` over `shape`), then the ReLU
   * with `activation` `"relu"`. With neither, `compute` writes `out` itself; otherwise a scratch
   * buffer, since a dispatch cannot read and write one buffer: each pass writes a fresh one and the
   * last writes `out`. `kernel` names the op in errors.
   */
  private withEpilogue(
    kernel: string,
    out: Storage,
    shape: readonly number[],
    bias: Storage | undefined,
    biasStrides: readonly number[],
    activation: Activation | undefined,
    compute: (products: WebGpuStorage) => void,
  ): void {
    const o = this.own(out, kernel), relu = activation === "relu";
    const products = bias || relu ? this.acquire(o.length, "float32") : o;
    compute(products);
    if (products === o) return;
    let result = products;
    if (bias) {
      const biased = relu ? this.acquire(o.length, "float32") : o;
      this.binary(
        "add",
        products,
        { offset: 0, strides: shape.map((_, i) => shape.slice(i + 1).reduce((a, b) => a * b, 1)) },
        bias,
        { offset: 0, strides: biasStrides },
        biased,
        shape,
      );
      this.release(products);
      result = biased;
    }
    if (relu) {
      this.unary("relu", result, out);
      this.release(result);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Convolution: im2col into a pooled scratch buffer, then the tiled GEMM; col2im is a gather.

  conv2dForward(
    x: Storage,
    weight: Storage,
    out: Storage,
    g: Conv2dGeometry,
    bias?: Storage,
    activation?: Activation,
  ): void {
    const sx = this.own(x, "conv2d"), sw = this.own(weight, "conv2d");
    const { P, K, CKK, coutG } = convSizes(g);
    // The bias per channel: `[batch, channels, pixels]` plus `[channels]`.
    this.withEpilogue("conv2d", out, [g.batch, g.outChannels, P], bias, [0, 1, 0], activation, (products) => {
      const col = this.columns(sx, g);
      for (let gi = 0; gi < g.groups; gi++) {
        this.gemm(sw.buffer, col.buffer, products.buffer, {
          batch: g.batch,
          m: coutG,
          n: P,
          k: K,
          transA: false,
          transB: false,
          aOffset: gi * coutG * K,
          aBatchStride: 0,
          bOffset: gi * K * P,
          bBatchStride: CKK * P,
          cOffset: gi * coutG * P,
          cBatchStride: g.outChannels * P,
          accumulate: false,
        });
      }
      if (col !== sx) this.release(col);
    });
  }

  conv2dBackwardInput(dy: Storage, weight: Storage, dx: Storage, g: Conv2dGeometry): void {
    const sdy = this.own(dy, "conv2dBackwardInput"), sw = this.own(weight, "conv2dBackwardInput");
    const sdx = this.own(dx, "conv2dBackwardInput");
    const { P, K, CKK, coutG } = convSizes(g);
    const pointwise = isPointwise(g);
    const col = pointwise ? sdx : this.acquire(g.batch * CKK * P, "float32");
    for (let gi = 0; gi < g.groups; gi++) {
      this.gemm(sw.buffer, sdy.buffer, col.buffer, {
        batch: g.batch,
        m: K,
        n: P,
        k: coutG,
        transA: true,
        transB: false,
        aOffset: gi * coutG * K,
        aBatchStride: 0,
        bOffset: gi * coutG * P,
        bBatchStride: g.outChannels * P,
        cOffset: gi * K * P,
        cBatchStride: CKK * P,
        accumulate: false,
      });
    }
    if (!pointwise) {
      const n = sdx.length;
      this.dispatch(
        "col2im",
        "col2im",
        col2imShader,
        [col.buffer, sdx.buffer],
        convParams(n, g),
        grid1d(n),
        () => `col2im(${describeConv(g)})`,
      );
      this.release(col);
    }
  }

  conv2dBackwardFilter(x: Storage, dy: Storage, dw: Storage, g: Conv2dGeometry): void {
    const sx = this.own(x, "conv2dBackwardFilter"), sdy = this.own(dy, "conv2dBackwardFilter");
    const sdw = this.own(dw, "conv2dBackwardFilter");
    const { P, K, CKK, coutG } = convSizes(g);
    const col = this.columns(sx, g);
    // Groups form the GEMM batch; images accumulate, since their sum lands in the same dw.
    for (let n = 0; n < g.batch; n++) {
      this.gemm(sdy.buffer, col.buffer, sdw.buffer, {
        batch: g.groups,
        m: coutG,
        n: K,
        k: P,
        transA: false,
        transB: true,
        aOffset: n * g.outChannels * P,
        aBatchStride: coutG * P,
        bOffset: n * CKK * P,
        bBatchStride: K * P,
        cOffset: 0,
        cBatchStride: coutG * K,
        accumulate: n > 0,
      });
    }
    if (col !== sx) this.release(col);
  }

  // ---------------------------------------------------------------------------------------------
  // Pooling and LRN

  maxPool2dForward(x: Storage, out: Storage, argmax: Storage, g: Pool2dGeometry): void {
    checkWindow("maxPool2d", g);
    const sx = this.own(x, "maxPool2d"), o = this.own(out, "maxPool2d"), am = this.own(argmax, "maxPool2d");
    const n = g.batch * g.channels * g.outHeight * g.outWidth;
    this.dispatch(
      "maxPool2d",
      "maxPool",
      maxPoolShader,
      [sx.buffer, o.buffer, am.buffer],
      poolParams(n, g),
      grid1d(n),
      () => `maxPool2d(${describePool(g)})`,
    );
  }

  maxPool2dBackward(dy: Storage, argmax: Storage, dx: Storage, g: Pool2dGeometry): void {
    checkWindow("maxPool2dBackward", g);
    const sdy = this.own(dy, "maxPool2dBackward"), am = this.own(argmax, "maxPool2dBackward");
    const sdx = this.own(dx, "maxPool2dBackward");
    const n = g.batch * g.channels * g.inHeight * g.inWidth;
    this.dispatch(
      "maxPool2dBackward",
      "maxPoolBackward",
      maxPoolBackwardShader,
      [sdy.buffer, am.buffer, sdx.buffer],
      poolParams(n, g),
      grid1d(n),
      () => `maxPool2dBackward(${describePool(g)})`,
    );
  }

  avgPool2dForward(x: Storage, out: Storage, g: Pool2dGeometry): void {
    checkWindow("avgPool2d", g);
    const sx = this.own(x, "avgPool2d"), o = this.own(out, "avgPool2d");
    const n = g.batch * g.channels * g.outHeight * g.outWidth;
    this.dispatch(
      "avgPool2d",
      "avgPool",
      avgPoolShader,
      [sx.buffer, o.buffer],
      poolParams(n, g),
      grid1d(n),
      () => `avgPool2d(${describePool(g)})`,
    );
  }

  avgPool2dBackward(dy: Storage, dx: Storage, g: Pool2dGeometry): void {
    checkWindow("avgPool2dBackward", g);
    const sdy = this.own(dy, "avgPool2dBackward"), sdx = this.own(dx, "avgPool2dBackward");
    const n = g.batch * g.channels * g.inHeight * g.inWidth;
    this.dispatch(
      "avgPool2dBackward",
      "avgPoolBackward",
      avgPoolBackwardShader,
      [sdy.buffer, sdx.buffer],
      poolParams(n, g),
      grid1d(n),
      () => `avgPool2dBackward(${describePool(g)})`,
    );
  }

  lrnForward(x: Storage, out: Storage, scale: Storage, shape: readonly number[], params: LrnParams): void {
    checkLrn(shape, params);
    const sx = this.own(x, "lrn"), o = this.own(out, "lrn"), sc = this.own(scale, "lrn");
    const n = prod(shape);
    this.dispatch(
      "lrn",
      "lrn",
      lrnShader,
      [sx.buffer, o.buffer, sc.buffer],
      lrnParams(shape, params),
      grid1d(n),
      () => `lrn(shape ${fmt(shape)}, size ${params.size})`,
    );
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
    checkLrn(shape, params);
    const buffers = [x, y, scale, dy, dx].map((s) => this.own(s, "lrnBackward").buffer);
    const n = prod(shape);
    this.dispatch(
      "lrnBackward",
      "lrnBackward",
      lrnBackwardShader,
      buffers,
      lrnParams(shape, params),
      grid1d(n),
      () => `lrnBackward(shape ${fmt(shape)}, size ${params.size})`,
    );
  }

  // ---------------------------------------------------------------------------------------------
  // Optimizers

  /** {@link Backend.sgdUpdate}; `saved` takes two buffer copies queued before the step. */
  sgdUpdate(param: Storage, grad: Storage, history: Storage, step: SgdStep, saved?: SgdSaved): void {
    const buffers = [param, grad, history].map((s) => this.own(s, "sgdUpdate").buffer);
    const n = param.length;
    if (n === 0) return;
    if (saved) {
      const dense = { offset: 0, strides: [1] };
      this.copyStrided(param, dense, saved.param, dense, [n]);
      this.copyStrided(history, dense, saved.history, dense, [n]);
    }
    this.dispatch(
      "sgdUpdate",
      "sgd",
      sgdShader,
      buffers,
      new Params().u32(n).f32(step.rate).f32(step.momentum).f32(step.decay),
      grid1d(n),
      () => `sgdUpdate(${n})`,
    );
  }

  /**
   * {@link Backend.firstNonFinite}: one kernel folds the smallest bad index into a word with an
   * atomic min, and only that word comes back (4 bytes, not the tensor).
   */
  async firstNonFinite(x: Storage): Promise<number> {
    const s = this.own(x, "firstNonFinite");
    if (s.length === 0) return -1;
    // All bits set: no element is bad (an index is below 2^32 − 1 for every storage we allocate).
    const first = this.upload(new Int32Array([-1]));
    try {
      this.dispatch(
        "firstNonFinite",
        "firstNonFinite",
        firstNonFiniteShader,
        [s.buffer, this.own(first, "firstNonFinite").buffer],
        new Params().u32(s.length),
        grid1d(s.length),
        () => `firstNonFinite(${s.length})`,
      );
      const [index] = await this.read(first) as Int32Array;
      return index;
    } finally {
      this.release(first);
    }
  }

  adamUpdate(param: Storage, grad: Storage, m: Storage, v: Storage, step: AdamStep): void {
    const buffers = [param, grad, m, v].map((s) => this.own(s, "adamUpdate").buffer);
    const n = param.length;
    if (n === 0) return;
    const f = Math.fround;
    const p = new Params().u32(n).f32(step.beta1).f32(step.beta2).f32(step.decay).f32(step.eps)
      .f32(f(1 - step.beta1)).f32(f(1 - step.beta2)).f32(Math.sqrt(step.correction2))
      .f32(step.rate / step.correction1);
    this.dispatch("adamUpdate", "adam", adamShader, buffers, p, grid1d(n), () => `adamUpdate(${n})`);
  }

  // ---------------------------------------------------------------------------------------------
  // Softmax family

  softmax(x: Storage, out: Storage, rows: RowSpec): void {
    this.rowKernel("softmax", [x, out], rows);
  }

  logSoftmax(x: Storage, out: Storage, rows: RowSpec): void {
    this.rowKernel("logSoftmax", [x, out], rows);
  }

  softmaxCrossEntropy(
    logits: Storage,
    labels: Storage,
    losses: Storage,
    probs: Storage,
    rows: RowSpec,
  ): void {
    this.rowKernel("crossEntropy", [logits, probs, labels, losses], rows);
  }

  softmaxCrossEntropyBackward(
    probs: Storage,
    labels: Storage,
    dLoss: Storage,
    dLogits: Storage,
    rows: RowSpec,
  ): void {
    const buffers = [probs, labels, dLoss, dLogits].map((s) =>
      this.own(s, "softmaxCrossEntropyBackward").buffer
    );
    const n = rows.rows * rows.cols;
    if (n === 0) return;
    this.dispatch(
      "softmaxCrossEntropyBackward",
      "crossEntropyBackward",
      crossEntropyBackwardShader,
      buffers,
      new Params().u32(n).u32(rows.cols),
      grid1d(n),
      () => `softmaxCrossEntropyBackward(${rows.rows}×${rows.cols})`,
    );
  }

  // ---------------------------------------------------------------------------------------------
  // Internals

  /** Records a one-workgroup-per-row kernel (softmax family). */
  private rowKernel(
    kind: "softmax" | "logSoftmax" | "crossEntropy",
    storages: Storage[],
    rows: RowSpec,
  ): void {
    const buffers = storages.map((s) => this.own(s, kind).buffer);
    if (rows.rows === 0 || rows.cols === 0) return;
    if ((3 * rows.cols) / 64 > MAX_LOOP_ITERATIONS) {
      throw new Error(
        `webgpu backend: ${kind} with rows of ${rows.cols} > ${
          64 * MAX_LOOP_ITERATIONS
        } values is not implemented yet`,
      );
    }
    this.dispatch(
      kind,
      `row:${kind}`,
      () => rowShader(kind),
      buffers,
      new Params().u32(rows.rows).u32(rows.cols),
      gridOf(rows.rows),
      () => `${kind}(${rows.rows}×${rows.cols})`,
    );
  }

  /** The column matrix of the whole batch (or `x` itself for a pointwise convolution). */
  private columns(x: WebGpuStorage, g: Conv2dGeometry): WebGpuStorage {
    if (isPointwise(g)) return x;
    const { P, CKK } = convSizes(g);
    const n = g.batch * CKK * P;
    const col = this.acquire(n, "float32");
    this.dispatch(
      "im2col",
      "im2col",
      im2colShader,
      [x.buffer, col.buffer],
      convParams(n, g),
      grid1d(n),
      () => `im2col(${describeConv(g)})`,
    );
    return col;
  }

  /** Records the tiled GEMM for one (possibly batched, transposed) product. */
  private gemm(a: GPUBuffer, b: GPUBuffer, c: GPUBuffer, s: GemmCall): void {
    if (s.batch === 0 || s.m === 0 || s.n === 0) return;
    const tilesX = Math.ceil(s.n / GEMM_TILE), tilesY = Math.ceil(s.m / GEMM_TILE);
    if (tilesX > MAX_WORKGROUPS_PER_DIM || tilesY > MAX_WORKGROUPS_PER_DIM) {
      throw new Error(`webgpu backend: matmul ${s.m}×${s.n} exceeds the dispatch limit`);
    }
    // Each operand is read with 4-float loads where its layout allows, else one float at a time.
    const loadA = gemmLoad(s.transA ? s.m : s.k, s.aOffset, s.aBatchStride);
    const loadB = gemmLoad(s.transB ? s.k : s.n, s.bOffset, s.bBatchStride);
    const key = `gemm:${s.transA ? "T" : "N"}${s.transB ? "T" : "N"}:${loadA}:${loadB}`;
    for (let base = 0; base < s.batch; base += MAX_WORKGROUPS_PER_DIM) {
      const count = Math.min(MAX_WORKGROUPS_PER_DIM, s.batch - base);
      // k = 0 still runs one (empty) pass, so the output is overwritten with zeros.
      for (let k0 = 0; k0 === 0 || k0 < s.k; k0 += GEMM_K_CHUNK) {
        const accumulate = s.accumulate || k0 > 0;
        const p = new Params().u32(s.m).u32(s.n).u32(s.k).u32(s.aOffset).u32(s.bOffset).u32(s.cOffset)
          .u32(s.aBatchStride).u32(s.bBatchStride).u32(s.cBatchStride).u32(accumulate ? 1 : 0).u32(base)
          .u32(k0).u32(Math.min(s.k, k0 + GEMM_K_CHUNK));
        this.dispatch(
          "matmul",
          key,
          () => gemmShader(s.transA, s.transB, loadA, loadB),
          [a, b, c],
          p,
          [tilesX, tilesY, count],
          () =>
            `matmul(batch ${s.batch}, m ${s.m}, n ${s.n}, k ${s.k}, transA ${s.transA}, transB ${s.transB})`,
        );
      }
    }
  }

  /** The open command encoder kernels are recorded into until the next submit. */
  private commandEncoder(): GPUCommandEncoder {
    return this.encoder ??= this.device.createCommandEncoder();
  }

  /** Submits recorded work, writing the parameter arena first (queue order keeps it consistent). */
  private flush(): void {
    if (!this.encoder) return;
    if (this.slotsUsed > 0) {
      this.device.queue.writeBuffer(this.arena, 0, this.arenaData, 0, this.slotsUsed * this.slotBytes);
    }
    const commands = this.encoder.finish();
    this.encoder = null;
    this.slotsUsed = 0;
    this.kernelsInBatch = 0;
    this.device.queue.submit([commands]);
  }

  /** The cached compute pipeline for `key`, compiling `code()` on first use. */
  private pipeline(kernel: string, key: string, code: () => string): GPUComputePipeline {
    let pipeline = this.pipelines.get(key);
    if (pipeline) return pipeline;
    this.device.pushErrorScope("validation");
    const module = this.device.createShaderModule({ code: code(), label: key });
    pipeline = this.device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
    this.watch(this.device.popErrorScope(), `compiling ${kernel} (${key})`);
    this.pipelines.set(key, pipeline);
    return pipeline;
  }

  /** Records one compute dispatch of `kernel` with its parameters and bindings. */
  private dispatch(
    kernel: string,
    key: string,
    code: () => string,
    buffers: GPUBuffer[],
    params: Params,
    grid: [number, number, number],
    describe: () => string,
  ): void {
    this.checkHealthy();
    if (params.length > MAX_PARAM_WORDS) {
      throw new Error(`webgpu backend: ${describe()}: too many parameters`);
    }
    const pipeline = this.pipeline(kernel, key, code);
    if (this.slotsUsed === ARENA_SLOTS) this.flush();
    const offset = this.slotsUsed++ * this.slotBytes;
    params.writeTo(this.arenaView, offset);
    if (this.debug) this.device.pushErrorScope("validation");
    const bindGroup = this.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [
        { binding: 0, resource: { buffer: this.arena, offset, size: this.slotBytes } },
        // Pooled buffers are rounded up to a size class, which may pass the binding limit although
        // the data inside fits: bind no more than the device allows.
        ...buffers.map((buffer, i) => ({
          binding: i + 1,
          resource: { buffer, size: Math.min(buffer.size, this.maxBinding) },
        })),
      ],
    });
    const pass = this.commandEncoder().beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(...grid);
    pass.end();
    this.lastKernel = this.debug ? describe() : kernel;
    if (++this.kernelsInBatch >= this.maxKernelsPerSubmit) this.flush();
    if (this.debug) this.watch(this.device.popErrorScope(), describe());
  }

  /** Records the error an error scope reports, to be thrown by the next call. */
  private watch(scope: Promise<GPUError | null>, what: string): void {
    const settled = scope.then((error) => {
      if (error) this.failure ??= new Error(`webgpu backend: ${what}: ${error.message}`);
    });
    this.pendingScopes.add(settled);
    settled.finally(() => this.pendingScopes.delete(settled));
  }

  /** Resolves pending error scopes so their errors surface at the next call. */
  private async settleScopes(): Promise<void> {
    await Promise.all([...this.pendingScopes]);
  }

  /** Throws the first recorded device-lost or validation error, naming the kernel. */
  private checkHealthy(): void {
    if (this.lost) throw this.lost;
    const failure = this.failure;
    if (failure) {
      this.failure = null;
      throw failure;
    }
  }

  /** This backend's storage behind `storage`, or an error naming `kernel`. */
  private own(storage: Storage, kernel: string): WebGpuStorage {
    this.checkHealthy();
    if (!(storage instanceof WebGpuStorage) || storage.owner !== this) {
      throw new Error(`webgpu backend: ${kernel} was given a storage of another backend`);
    }
    if (storage.released) throw new Error(`webgpu backend: ${kernel} was given a released storage`);
    return storage;
  }

  /** A pooled buffer for `length` elements of `dtype`. */
  private acquire(length: number, dtype: DType): WebGpuStorage {
    const bytes = length * 4;
    if (bytes > this.maxBinding) {
      // Kernels bind whole storages; a larger one could only be half-processed, silently.
      throw new Error(
        `webgpu backend: a ${dtype} storage of ${length} elements (${bytes} bytes) exceeds this device's ` +
          `maxStorageBufferBindingSize of ${this.maxBinding} bytes`,
      );
    }
    // Size classes keep the pool small, but never push a buffer past what may be bound.
    const rounded = sizeClass(bytes);
    const size = rounded <= this.maxBinding ? rounded : Math.max(16, Math.ceil(bytes / 16) * 16);
    const buffer = this.pool.get(size)?.pop() ?? this.device.createBuffer({
      size,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    });
    this.live++;
    return new WebGpuStorage(this, buffer, length, dtype);
  }

  /** Writes host `data` into `storage` from element `offset`, ordered after all recorded work. */
  private writeHost(storage: WebGpuStorage, data: HostArray, offset: number): void {
    // writeBuffer runs on the queue ahead of unsubmitted commands, which may still use this buffer
    // (under a previous owner, or reading the values about to be replaced): submit them first.
    this.flush();
    if (data.length === 0) return;
    // Parameters may live in a SharedArrayBuffer (CPU `wrap`), which writeBuffer does not accept.
    const plain = (data.buffer instanceof ArrayBuffer ? data : data.slice()) as Float32Array<ArrayBuffer>;
    this.device.queue.writeBuffer(storage.buffer, offset * 4, plain);
    this.reportTransfer("toDevice", storage, data.length * 4);
  }

  /** Maps a staging buffer whose copies were submitted; any GPU error is thrown after unmapping. */
  private async mapStaging(staging: GPUBuffer, bytes: number): Promise<StagedValues> {
    try {
      await staging.mapAsync(GPUMapMode.READ, 0, bytes);
    } catch (e) {
      await this.settleScopes();
      this.checkHealthy();
      throw new Error(`webgpu backend: read of ${bytes / 4} elements failed: ${(e as Error).message}`);
    }
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      staging.unmap();
      this.releaseStaging(staging);
    };
    try {
      await this.settleScopes();
      this.checkHealthy();
    } catch (error) {
      release();
      throw error;
    }
    return { values: new Float32Array(staging.getMappedRange(0, bytes)), release };
  }

  /** Tells the transfer observers about one copy between host and device. */
  private reportTransfer(direction: TransferEvent["direction"], storage: Storage, bytes: number): void {
    for (const listener of this.transferListeners) listener({ direction, storage, bytes });
  }

  /** A reusable MAP_READ staging buffer of at least `bytes`. */
  private acquireStaging(bytes: number): GPUBuffer {
    const size = sizeClass(bytes);
    return this.stagingPool.get(size)?.pop() ??
      this.device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  }

  /** Returns a staging buffer to the pool. */
  private releaseStaging(buffer: GPUBuffer): void {
    const list = this.stagingPool.get(buffer.size) ?? [];
    list.push(buffer);
    this.stagingPool.set(buffer.size, list);
  }
}

/** {@link MatmulSpec} plus the offsets and output stride the convolutions need. */
interface GemmCall extends MatmulSpec {
  aOffset: number;
  bOffset: number;
  cOffset: number;
  cBatchStride: number;
  accumulate: boolean;
}

function view(p: Params, v: StridedView, rank: number): void {
  p.i32(v.offset);
  for (let d = 0; d < rank; d++) p.i32(v.strides[d]);
}

/**
 * Drops unit axes and merges neighbouring axes that every view walks contiguously, so a dense or
 * scalar-broadcast operand reaches the kernel as rank 1 and pays one index decode, not six.
 */
function coalesce(
  shape: readonly number[],
  views: readonly StridedView[],
): { shape: number[]; views: StridedView[] } {
  const dims: number[] = [];
  const strides: number[][] = views.map(() => []);
  for (let d = 0; d < shape.length; d++) {
    if (shape[d] === 1) continue;
    const last = dims.length - 1;
    if (last >= 0 && views.every((v, i) => strides[i][last] === v.strides[d] * shape[d])) {
      dims[last] *= shape[d];
      views.forEach((v, i) => (strides[i][last] = v.strides[d]));
    } else {
      dims.push(shape[d]);
      views.forEach((v, i) => strides[i].push(v.strides[d]));
    }
  }
  return { shape: dims, views: views.map((v, i) => ({ offset: v.offset, strides: strides[i] })) };
}

function convSizes(g: Conv2dGeometry) {
  const cinG = g.inChannels / g.groups, coutG = g.outChannels / g.groups;
  const K = cinG * g.kernelH * g.kernelW;
  return { P: g.outHeight * g.outWidth, K, CKK: g.inChannels * g.kernelH * g.kernelW, cinG, coutG };
}

function convParams(n: number, g: Conv2dGeometry): Params {
  return new Params().u32(n).u32(g.inChannels).u32(g.inHeight).u32(g.inWidth).u32(g.kernelH).u32(g.kernelW)
    .u32(g.strideH).u32(g.strideW).u32(g.padH).u32(g.padW).u32(g.outHeight).u32(g.outWidth);
}

function poolParams(n: number, g: Pool2dGeometry): Params {
  return new Params().u32(n).u32(g.inHeight).u32(g.inWidth).u32(g.kernelH).u32(g.kernelW)
    .u32(g.strideH).u32(g.strideW).u32(g.padH).u32(g.padW).u32(g.outHeight).u32(g.outWidth);
}

function lrnParams(shape: readonly number[], p: LrnParams): Params {
  const [N, C, H, W] = shape;
  return new Params().u32(N * C * H * W).u32(C).u32(H * W).u32((p.size - 1) / 2)
    .f32(p.alpha / p.size).f32(p.k).f32(p.beta).f32((2 * p.alpha * p.beta) / p.size);
}

/** Window loops run once per window element; see MAX_LOOP_ITERATIONS. */
function checkWindow(kernel: string, g: Pool2dGeometry): void {
  if (g.kernelH * (g.kernelW + 1) > MAX_LOOP_ITERATIONS) {
    throw new Error(
      `webgpu backend: ${kernel} with a ${g.kernelH}×${g.kernelW} window (over ${MAX_LOOP_ITERATIONS} ` +
        `elements) is not implemented yet`,
    );
  }
}

function describeConv(g: Conv2dGeometry): string {
  return `x [${g.batch}, ${g.inChannels}, ${g.inHeight}, ${g.inWidth}], w [${g.outChannels}, ` +
    `${g.inChannels / g.groups}, ${g.kernelH}, ${g.kernelW}], groups ${g.groups}`;
}

function describePool(g: Pool2dGeometry): string {
  return `x [${g.batch}, ${g.channels}, ${g.inHeight}, ${g.inWidth}], kernel ${g.kernelH}×${g.kernelW}`;
}

/**
 * Creates the WebGPU backend, or returns null when this runtime has no WebGPU adapter.
 *
 * @example
 * ```ts
 * import { createWebGpuBackend } from "./backend.ts";
 * import { registerBackend, setBackend } from "../../engine/context.ts";
 * const gpu = await createWebGpuBackend();
 * if (gpu) {
 *   registerBackend(gpu);
 *   setBackend("webgpu");
 * }
 * ```
 */
export async function createWebGpuBackend(options: WebGpuBackendOptions = {}): Promise<WebGpuBackend | null> {
  const gpu = (globalThis.navigator as Navigator & { gpu?: GPU }).gpu;
  if (!gpu) return null;
  // Some runtimes expose navigator.gpu but reject instead of resolving null without a driver.
  const adapter = await gpu.requestAdapter({ powerPreference: options.powerPreference }).catch(() => null);
  if (!adapter) return null;
  // The default 128 MiB binding limit is below AlexNet's fc6 weights (151 MB): ask for what the
  // adapter supports.
  const device = await adapter.requestDevice({
    requiredLimits: {
      maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
      maxBufferSize: adapter.limits.maxBufferSize,
    },
  });
  return new WebGpuBackend(device, options);
}
