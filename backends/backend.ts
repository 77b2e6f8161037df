/**
 * The backend contract: the small set of kernels every Tandem backend implements over opaque storage.
 *
 * The engine owns shapes, broadcasting rules, autograd and memory scopes; a backend only moves and
 * computes numbers. Gradients are defined once in the engine from these same kernels, so a new
 * backend (WebGPU, WebAssembly) gets training for free by implementing this interface. Every kernel
 * writes a fresh output storage it is given and never aliases inputs with outputs.
 *
 * Storage is always dense and row-major; views (transpose, slice, broadcast) reach kernels as
 * strides, so no kernel materialises a transpose it does not need.
 *
 * @module
 */

import type { Conv2dGeometry, LrnParams, Pool2dGeometry } from "./geometry.ts";

export type { Conv2dGeometry, LrnParams, Pool2dGeometry } from "./geometry.ts";

/** Element types a storage can hold: float32 for values, int32 for labels and indices. */
export type DType = "float32" | "int32";

/** Host arrays matching {@link DType}. */
export type HostArray = Float32Array | Int32Array;

/**
 * An opaque handle to a backend's memory. The engine never looks inside; it only passes handles back
 * to the backend that made them.
 */
export interface Storage {
  /** Number of elements. */
  readonly length: number;
  /** Element type. */
  readonly dtype: DType;
}

/** Elementwise functions of one float32 argument. */
export type UnaryOp = "neg" | "exp" | "log" | "sqrt" | "relu" | "abs" | "sign";

/**
 * What a convolution or a matrix product applies to its output in its epilogue, after the bias:
 * `"relu"` for now.
 */
export type Activation = "relu";

/**
 * Elementwise functions of two float32 arguments. `equal` and `greater` give 1 or 0;
 * `reluGrad(dy, y)` gives `dy` where `y > 0` and 0 elsewhere.
 */
export type BinaryOp = "add" | "sub" | "mul" | "div" | "pow" | "max" | "equal" | "greater" | "reluGrad";

/** Reductions over the middle axis of an `[outer, size, inner]` view. */
export type ReduceOp = "sum" | "max";

/**
 * A strided view of a storage: element `[i0, i1, …]` lives at `offset + Σ i_d · strides[d]`.
 * A stride of 0 broadcasts that axis.
 */
export interface StridedView {
  /** Element of the storage that index [0, 0, …] maps to. */
  offset: number;
  /** Elements to step per unit of each axis. */
  strides: readonly number[];
}

/** Batched matrix product `out[b] = op(a[b]) · op(b[b])`, row-major; see {@link Backend.matmul}. */
export interface MatmulSpec {
  /** Number of matrix products. */
  batch: number;
  /** Rows of op(a) and of the output. */
  m: number;
  /** Columns of op(b) and of the output. */
  n: number;
  /** Columns of op(a), rows of op(b). */
  k: number;
  /** a holds k×m matrices (read transposed) instead of m×k. */
  transA: boolean;
  /** b holds n×k matrices (read transposed) instead of k×n. */
  transB: boolean;
  /** Elements between consecutive matrices of a (0 broadcasts one matrix over the batch). */
  aBatchStride: number;
  /** Elements between consecutive matrices of b (0 broadcasts one matrix over the batch). */
  bBatchStride: number;
}

/**
 * A dropout mask drawn from the engine's counter-based generator (Philox4x32-10, `engine/random.ts`):
 * position q's value is word q mod 4 of the block whose counter is (⌊q/4⌋ as two words, `stream`,
 * `step`) under `key`, and it is kept where that word's top 24 bits are at least `threshold`
 * (= ⌈p·2^24⌉, so exactly where the uniform `(word >>> 8) / 2^24` is at least p).
 */
export interface DropoutMaskSpec {
  /** The seed's low and high 32-bit words. */
  key: readonly [number, number];
  /** Counter word 2. */
  stream: number;
  /** Counter word 3. */
  step: number;
  /** Position of the mask's first element (below 2^53). */
  offset: number;
  /** Integer in [0, 2^24]. */
  threshold: number;
  /** The value of kept elements (1/(1 − p), rounded to float32); dropped ones are 0. */
  keep: number;
}

/** Hyper-parameters of one fused SGD step (Caffe's order: decay, then momentum with the rate inside). */
export interface SgdStep {
  /** Learning rate of this parameter (base rate × lr_mult). */
  rate: number;
  /** Momentum. */
  momentum: number;
  /** L2 weight decay of this parameter (weight_decay × decay_mult). */
  decay: number;
}

/** Where a fused SGD step writes the values it overwrites (see {@link Backend.sgdUpdate}). */
export interface SgdSaved {
  /** Takes the parameter's values before the step. */
  param: Storage;
  /** Takes the momentum before the step. */
  history: Storage;
}

/** Hyper-parameters of one fused Adam step (PyTorch's order of operations). */
export interface AdamStep {
  /** Learning rate of this parameter. */
  rate: number;
  /** First-moment decay. */
  beta1: number;
  /** Second-moment decay. */
  beta2: number;
  /** Denominator guard. */
  eps: number;
  /** L2 weight decay of this parameter. */
  decay: number;
  /** Bias corrections `1 − β1^t` and `1 − β2^t`. */
  correction1: number;
  /** See `correction1`. */
  correction2: number;
}

/** Row layout for softmax-like kernels: `rows` independent rows of `cols` contiguous values. */
export interface RowSpec {
  /** Number of rows. */
  rows: number;
  /** Values per row. */
  cols: number;
}

/**
 * Values copied off a device by {@link Backend.stageToHost}: a host view the backend lends (for
 * WebGPU, mapped staging memory), valid until `release()` hands its memory back for reuse.
 *
 * @example
 * ```ts
 * import type { StagedValues } from "./backend.ts";
 * function sum(staged: StagedValues): number {
 *   try {
 *     return staged.values.reduce((a, b) => a + b, 0);
 *   } finally {
 *     staged.release();
 *   }
 * }
 * ```
 */
export interface StagedValues {
  /** The staged storages' values back to back, as float32 (int32 storages: reinterpret the buffer). */
  readonly values: Float32Array;
  /** Hands the lent memory back to the backend; `values` is unusable afterwards. */
  release(): void;
}

/**
 * What {@link Backend.maxPool2dBackwardFused} does around the scatter, or
 * {@link Backend.conv2dBackwardFilterPooled} beside its weight gradient; either may be absent.
 */
export interface MaxPoolBackwardEpilogue {
  /** The pooled output of a ReLU: `dy` passes where it is > 0 (`reluGrad`'s mask). */
  reluOf?: Storage;
  /** `batch × channels` floats: each plane of dx summed, as `reduce("sum")` over the plane. */
  planeSums?: Storage;
}

/**
 * A range of a backend's kernel memory lent to a backend on another thread (see
 * {@link Backend.lendMemory}). Structured-cloneable, so it travels to a Worker.
 */
export interface MemoryLoan {
  /** The lender's kernel memory (shared). */
  readonly memory: WebAssembly.Memory;
  /** First byte of the range the borrower allocates in. */
  readonly start: number;
  /** End of that range (exclusive). */
  readonly end: number;
  /** Byte addresses of the lender's arrays named when lending, in that order. */
  readonly addresses: readonly number[];
}

/**
 * What a backend implements. All methods but {@link Backend.read} are synchronous from the engine's
 * point of view: a device backend may queue the work and finish it later, as long as the results are
 * observed in submission order.
 *
 * @example
 * ```ts
 * import type { Backend } from "./backend.ts";
 * function double(backend: Backend, x: import("./backend.ts").Storage) {
 *   const out = backend.allocate(x.length, "float32");
 *   backend.binary("add", x, { offset: 0, strides: [1] }, x, { offset: 0, strides: [1] }, out, [x.length]);
 *   return out;
 * }
 * ```
 */
export interface Backend {
  /** Short name used in messages and by `setBackend`, e.g. `"cpu"`. */
  readonly name: string;

  /** A new zero-filled storage. */
  allocate(length: number, dtype: DType): Storage;
  /**
   * Optional: a new storage whose contents are unspecified, for a kernel's output (every kernel
   * overwrites its output whole). Saves the zero-fill, which on the CPU is a pass over memory as
   * long as the kernel's own.
   */
  allocateUninitialized?(length: number, dtype: DType): Storage;
  /** A new storage holding a copy of `data`. */
  upload(data: HostArray): Storage;
  /** A copy of the storage's contents on the host. */
  read(storage: Storage): Promise<HostArray>;
  /** Synchronous read where the backend can do it cheaply (CPU); `undefined` elsewhere. */
  readSync?(storage: Storage): HostArray;
  /**
   * Storage over `data` itself, without copying, for backends whose memory is the host's (CPU);
   * `undefined` elsewhere. Lets several threads share parameters through a `SharedArrayBuffer`.
   */
  wrap?(data: HostArray): Storage;
  /**
   * Optional: zero-filled host memory on a `SharedArrayBuffer` (so Workers can share it) that this
   * backend's kernels read and write in place when it, or a `subarray` of it, is {@link wrap}ped:
   * where a runtime keeps the parameters and gradients that devices share and a host optimizer
   * updates. Its memory is freed by {@link freeShared}, or once the returned array is garbage:
   * views of it do not keep it, so the owner holds the array for as long as any view is used.
   */
  allocateShared?(length: number): Float32Array;
  /**
   * Optional: frees an array from {@link allocateShared} now rather than once it is garbage. Its
   * memory lies outside the JavaScript heap, so running short of it prompts no collection: an owner
   * that is done with the array frees it here. The array and every view of it must not be used
   * afterwards; an array from elsewhere is left alone.
   */
  freeShared?(array: Float32Array): void;
  /**
   * Optional: lends `bytes` of the kernels' memory to a backend on another thread (a device's
   * Worker, which passes the loan to its backend's constructor), so that `arrays` (from
   * {@link allocateShared}, such as the device's parameters) are that backend's operands in place:
   * the device reads them without copying them into memory of its own. `undefined` where the
   * memory cannot be shared or has no room. Return it with {@link reclaimMemory} once the borrower
   * has stopped.
   */
  lendMemory?(bytes: number, arrays: readonly Float32Array[]): MemoryLoan | undefined;
  /** Optional: takes back a range from {@link lendMemory}; its borrower must have stopped. */
  reclaimMemory?(loan: MemoryLoan): void;
  /** Returns the memory; the handle must not be used afterwards. */
  release(storage: Storage): void;
  /**
   * Optional: overwrites `data.length` elements of an existing `storage` from element `offset` (default
   * 0) with host values, after every kernel queued so far has used the old ones. Lets a runtime
   * refresh parameters or receive a peer's values in place, keeping the handles tensors hold.
   */
  write?(storage: Storage, data: HostArray, offset?: number): void;
  /**
   * Optional: starts copying `storages` back to back into host memory the backend lends until
   * `release()`, recorded now so later kernels cannot delay it. A device-resident runtime starts it
   * as soon as a group's gradients are queued, and reuses the memory instead of a fresh `read` each.
   */
  stageToHost?(storages: readonly Storage[]): Promise<StagedValues>;
  /**
   * Optional: `out = (inputs[0] + … + inputs[N−1]) · fround(1/N)` in float32, added in index order
   * with one rounding per operation (no scaling for one input), `out` not among the inputs. Lets a
   * runtime average replicas' gradients on the device, bit for bit like the host's device-order
   * average.
   */
  averageInOrder?(inputs: readonly Storage[], out: Storage): void;
  /**
   * Optional: resolves when all queued work has finished, and throws any error it raised; how a
   * runtime times device work and learns that a result is final, for backends that queue kernels.
   */
  synchronize?(): Promise<void>;
  /**
   * Optional: frees what the backend holds beyond its storages (WebGPU: destroys its `GPUDevice`)
   * when its owner, e.g. a data-parallel device, is done with it. Whether the backend stays usable
   * afterwards is the backend's to say.
   */
  dispose?(): void;
  /**
   * Optional: a storage over elements `[offset, offset + length)` of `storage` itself, without
   * copying, for backends whose memory can be addressed in part (CPU). Writes through either are
   * seen by the other; releasing the view frees nothing. Lets an optimizer update part of a
   * parameter (a chunk that has arrived) while the rest is still on the wire.
   */
  view?(storage: Storage, offset: number, length: number): Storage;

  /** Sets every element to `value`. */
  fill(out: Storage, value: number): void;
  /** `dst[dstView at i] = src[srcView at i]` for every index `i` of `shape` (any dtype). */
  copyStrided(
    src: Storage,
    srcView: StridedView,
    dst: Storage,
    dstView: StridedView,
    shape: readonly number[],
  ): void;

  /** `out[i] = op(x[i])` over dense storages of equal length. */
  unary(op: UnaryOp, x: Storage, out: Storage): void;
  /** `out[i] = op(a[aView at i], b[bView at i])` for each index `i` of `shape`; `out` is dense. */
  binary(
    op: BinaryOp,
    a: Storage,
    aView: StridedView,
    b: Storage,
    bView: StridedView,
    out: Storage,
    shape: readonly number[],
  ): void;
  /** `out[o, i] = op over s of x[o, s, i]` for a dense `[outer, size, inner]` input. */
  reduce(op: ReduceOp, x: Storage, out: Storage, outer: number, size: number, inner: number): void;

  /**
   * Batched GEMM; see {@link MatmulSpec}. `out` is dense `[batch, m, n]`. With `bias` (`[n]`),
   * each output row then adds it, one float32 rounding, the same bits as a broadcast `add`
   * afterwards; with `activation` `"relu"`, the output is then `x > 0 ? x : 0`, the same bits as a
   * `relu` unary afterwards (a fully connected layer's epilogue: one pass over the output fewer).
   */
  matmul(
    a: Storage,
    b: Storage,
    out: Storage,
    spec: MatmulSpec,
    bias?: Storage,
    activation?: Activation,
  ): void;

  /**
   * Cross-correlation of NCHW `x` with `[Cout, Cin/groups, kh, kw]` weights; with `bias`
   * (`[Cout]`), each output channel then adds its bias, one float32 rounding, the same bits as a
   * broadcast `add` afterwards; with `activation` `"relu"`, the output is then `x > 0 ? x : 0`,
   * the same bits as a `relu` unary afterwards (one pass over the output fewer).
   */
  conv2dForward(
    x: Storage,
    weight: Storage,
    out: Storage,
    geometry: Conv2dGeometry,
    bias?: Storage,
    activation?: Activation,
  ): void;
  /**
   * Optional: {@link Backend.conv2dForward} (with `bias` and `activation`) then
   * {@link Backend.maxPool2dForward} of its output (`pool` the pooling's geometry over it) into
   * `pooled` and `argmax`, the same bits as the two calls, without writing the convolution's output
   * anywhere a later op would read it (a backend pools each image while its output is in cache).
   * Returns false, having done nothing, where this instance cannot; the engine then makes the two
   * calls.
   */
  conv2dForwardMaxPool?(
    x: Storage,
    weight: Storage,
    pooled: Storage,
    argmax: Storage,
    geometry: Conv2dGeometry,
    pool: Pool2dGeometry,
    bias?: Storage,
    activation?: Activation,
  ): boolean;
  /** Gradient of the convolution with respect to its input. */
  conv2dBackwardInput(dy: Storage, weight: Storage, dx: Storage, geometry: Conv2dGeometry): void;
  /** Gradient of the convolution with respect to its weights (summed over the batch). */
  conv2dBackwardFilter(x: Storage, dy: Storage, dw: Storage, geometry: Conv2dGeometry): void;
  /**
   * Optional: the weight gradient of a convolution whose output was max-pooled (`pool`, its winners
   * `argmax`), straight from the pooled gradient `dy`: what {@link Backend.conv2dBackwardFilter}
   * gives on {@link Backend.maxPool2dBackward}'s scatter of `dy`, without the scatter. With
   * `reluOf` (the pooled output of a ReLU) only the pooled outputs whose value is > 0 count
   * (`reluGrad`'s mask); with `planeSums` (`batch × outChannels` floats), each plane's counted
   * gradients are summed into it (the first step of a bias gradient). Each pooled output's
   * product is summed on its own, so the bits are not those of the scatter's route (an element
   * that won two windows adds two products, not one of their sum), but they do not depend on
   * anything but the operands. For a convolution whose input needs no gradient (a first layer):
   * the input gradient would need the scatter anyway. Returns false, having done nothing, where
   * this instance cannot; the engine then scatters.
   */
  conv2dBackwardFilterPooled?(
    x: Storage,
    dy: Storage,
    argmax: Storage,
    dw: Storage,
    geometry: Conv2dGeometry,
    pool: Pool2dGeometry,
    epilogue: MaxPoolBackwardEpilogue,
  ): boolean;

  /** Max pooling; `argmax` (int32, same length as `out`) records the winning input index. */
  maxPool2dForward(x: Storage, out: Storage, argmax: Storage, geometry: Pool2dGeometry): void;
  /** Routes each output gradient to the input element that won the forward max. */
  maxPool2dBackward(dy: Storage, argmax: Storage, dx: Storage, geometry: Pool2dGeometry): void;
  /**
   * Optional: {@link Backend.maxPool2dBackward} with what a pooled convolution's backward does
   * around it, in the same pass: with `reluOf` (the pooled output of a ReLU), `dy` is first masked
   * as `binary("reluGrad", dy, reluOf)` would mask it; with `planeSums` (`batch × channels`
   * floats), each plane of `dx` is then summed into it as `reduce("sum", dx, planes, plane size, 1)`
   * would (the first step of a bias gradient). The same bits as those calls, without `dx` being
   * read back from memory. Returns false, having done nothing, where this instance cannot; the
   * engine then makes the separate calls.
   */
  maxPool2dBackwardFused?(
    dy: Storage,
    argmax: Storage,
    dx: Storage,
    geometry: Pool2dGeometry,
    epilogue: MaxPoolBackwardEpilogue,
  ): boolean;
  /** Average pooling with Caffe's divisor (window clipped to the padded input). */
  avgPool2dForward(x: Storage, out: Storage, geometry: Pool2dGeometry): void;
  /** Gradient of {@link Backend.avgPool2dForward}. */
  avgPool2dBackward(dy: Storage, dx: Storage, geometry: Pool2dGeometry): void;

  /** Caffe across-channel LRN of NCHW `x`; `scale` receives `k + alpha/size · Σx²` for backward. */
  lrnForward(x: Storage, out: Storage, scale: Storage, shape: readonly number[], params: LrnParams): void;
  /** Gradient of {@link Backend.lrnForward}. */
  lrnBackward(
    x: Storage,
    y: Storage,
    scale: Storage,
    dy: Storage,
    dx: Storage,
    shape: readonly number[],
    params: LrnParams,
  ): void;

  /**
   * Optional fused SGD update, in place on `param` and `history` (the one exception to fresh
   * outputs: optimizers exist to mutate state). Must round like the composed elementwise ops:
   * `diff = g + w·decay`, `history = history·momentum + diff·rate`, `w = w − history`, each product
   * and sum rounded to float32. Without it optimizers fall back to those ops. With `saved`, the
   * values `param` and `history` held before are written there too (the copies that undo a failed
   * step), in the same pass where the backend can. Returns whether every new parameter is finite
   * where the backend checks that in the same pass (the runtime's finite check then skips its scan),
   * nothing where it does not.
   */
  sgdUpdate?(
    param: Storage,
    grad: Storage,
    history: Storage,
    step: SgdStep,
    saved?: SgdSaved,
  ): boolean | void;
  /** Optional fused Adam update, in place on `param`, `m` and `v`; rounding as `sgdUpdate`. */
  adamUpdate?(param: Storage, grad: Storage, m: Storage, v: Storage, step: AdamStep): void;
  /**
   * Optional: the index of the first NaN or ±∞ element of a float32 storage, or −1 when every
   * element is finite; one read of `x`, after all queued work. How a runtime checks each update's
   * parameters cheaply (a queueing backend answers once its kernels have run, hence the promise).
   * Without it, callers read the storage back and scan it.
   */
  firstNonFinite?(x: Storage): number | Promise<number>;
  /**
   * Optional: fills float32 `out` with the dropout mask `spec` describes, bit for bit what the
   * engine computes in TypeScript (which has no 64-bit multiply for the generator), and returns
   * true; false when this instance cannot (the engine then makes the mask itself).
   */
  dropoutMask?(out: Storage, spec: DropoutMaskSpec): boolean;

  /** Numerically stable softmax of each row. */
  softmax(x: Storage, out: Storage, rows: RowSpec): void;
  /** Numerically stable log-softmax of each row. */
  logSoftmax(x: Storage, out: Storage, rows: RowSpec): void;
  /**
   * Per-row cross-entropy `−log softmax(logits)[label]` into `losses`, and the softmax into `probs`
   * for backward. Labels are int32 and already validated by the engine.
   */
  softmaxCrossEntropy(logits: Storage, labels: Storage, losses: Storage, probs: Storage, rows: RowSpec): void;
  /** `dLogits[r, c] = (probs[r, c] − [c = label_r]) · dLoss[r]`, with `dLoss` one value per row. */
  softmaxCrossEntropyBackward(
    probs: Storage,
    labels: Storage,
    dLoss: Storage,
    dLogits: Storage,
    rows: RowSpec,
  ): void;
}
