/**
 * The work the kernel threads share: a task is a kind and a flat list of integers (sizes and byte
 * addresses in kernel memory), so it crosses to pool threads through shared memory without
 * messages. {@link runTaskShare} is what every thread runs, the main thread included: it picks
 * the thread's share by index and runs it.
 *
 * How each kind splits never changes the arithmetic of any output element (see `gemm.ts` and
 * `conv.ts`), so results are bit-identical whatever the thread count.
 *
 * It stays one file although long: each kind's fields, its encoding and its share of the work are
 * one contract between the thread that encodes a task and the threads that run it; kept together,
 * a field added to one side cannot be missed on the other. The kernels themselves live apart.
 *
 * @module
 */

import type { Conv2dGeometry } from "../../geometry.ts";
import {
  type Claim,
  columnRows,
  convBackwardFilterRows,
  convBackwardInputImages,
  convForwardImages,
  convScratchBytes,
  filterChunkImages,
  filterChunks,
  filterChunkTarget,
  packingTables,
  rangeClaim,
} from "./conv.ts";
import {
  convBackwardFilterDirect,
  directFilter,
  directFilterScratchBytes,
  directFilterTaps,
} from "./filter_direct.ts";
import { GEMM_TILE, gemmBlocked, type GemmBlocks, type GemmProblem, gemmWindow } from "./gemm.ts";
import type { KernelExports } from "./generate/module.ts";
import { LRN_FIELDS, type LrnTask, runLrnImages } from "./lrn.ts";
import { runWinogradPhase } from "./winograd/phases.ts";
import { convBackwardFilterPooled, type PooledFilterTask } from "./filter_pooled.ts";
import { WINOGRAD_FIELDS, type WinogradTask } from "./winograd/plan.ts";
import { POOL_EPILOGUE_FIELDS, type PoolEpilogue } from "./pool_epilogue.ts";

/**
 * What a task computes.
 *
 * @example
 * ```ts
 * import { TaskKind } from "./tasks.ts";
 * console.log(TaskKind.convForward); // 2
 * ```
 */
export const TaskKind = {
  matmul: 1,
  convForward: 2,
  convBackwardInput: 3,
  convBackwardFilter: 4,
  maxPoolForward: 5,
  sgdUpdate: 6,
  adamUpdate: 7,
  maxPoolBackward: 8,
  lrnForward: 9,
  lrnBackward: 10,
  avgPoolForward: 11,
  avgPoolBackward: 12,
  elementwise: 13,
  winograd: 14,
  filterPooled: 15,
} as const;

/**
 * What an {@link TaskKind.elementwise} task computes (see `ELEMENTWISE_EXPORTS` for each kernel).
 *
 * @example
 * ```ts
 * import { ElementwiseOp } from "./tasks.ts";
 * console.log(ElementwiseOp.reluGrad); // 2
 * ```
 */
export const ElementwiseOp = {
  relu: 1,
  reluGrad: 2,
  addChannels: 3,
  sumRows: 4,
  addScale: 5,
  mul: 6,
  firstNonFinite: 7,
} as const;

/**
 * A memory-bound pass (see {@link ElementwiseOp}): `length` elements (rows for `sumRows`, outer
 * blocks for `addChannels`) from byte addresses `a` and `b` into `out`; `extra` is the row size
 * (`sumRows`), the channels (`addChannels`) or the scale's float32 bits (`addScale`), `extra2` the
 * inner size (`addChannels`). Threads take whole elements, rows or blocks, so no bit depends on them.
 * `firstNonFinite` scans `a` and writes int32 slot t at `out` for thread t (see `finite.ts`).
 */
export interface ElementwiseTask {
  op: number;
  length: number;
  a: number;
  b: number;
  out: number;
  extra: number;
  extra2: number;
}

/** One of the {@link TaskKind} codes. */
export type TaskKind = typeof TaskKind[keyof typeof TaskKind];

/**
 * A batch of products `c[i] = [c[i] +] op(a[i])·op(b[i])`, strides in bytes, in the cache blocks
 * `mc`, `nc` (every thread must pack in the same blocks its scratch was sized for), then the
 * epilogue: `bias` per column, then the ReLU.
 */
export interface MatmulTask extends GemmProblem, Required<GemmBlocks> {
  batch: number;
  aBatchStride: number;
  bBatchStride: number;
  cBatchStride: number;
  /** Address of the `[n]` bias every row of C adds, 0 for none. */
  bias: number;
  /** ReLU after the bias. */
  relu: boolean;
}

/** A convolution pass: geometry, operand addresses and the GEMM's cache blocks. */
export interface ConvTask extends Conv2dGeometry, Required<GemmBlocks> {
  image: number;
  weight: number;
  output: number;
  /**
   * Forward and weight gradient: address of the int32 packing tables (see `packingTables`), or for a
   * direct weight gradient its tap table (see `directFilterTaps`).
   */
  offsets: number;
  /** Forward: address of the bias, 0 for none. */
  bias: number;
  /** Forward: ReLU after the bias. */
  relu: boolean;
  /** Weight gradient: address of the partial gradients of image chunks 1, 2, … (see `filterChunks`). */
  partials: number;
}

/** A forward convolution task that pools each image's output (see `pool_epilogue.ts`). */
export type PooledConvTask = ConvTask & PoolEpilogue;

/** Pooling windows over `planes` planes (geometry as `Pool2dGeometry`, batch × channels = planes). */
export interface PoolWindows {
  planes: number;
  inHeight: number;
  inWidth: number;
  outHeight: number;
  outWidth: number;
  kernelH: number;
  kernelW: number;
  strideH: number;
  strideW: number;
  padH: number;
  padW: number;
}

/** Max pooling forward (see {@link PoolWindows}). */
export interface PoolTask extends PoolWindows {
  x: number;
  out: number;
  argmax: number;
}

/**
 * A fused optimizer update of `length` floats from byte addresses `param`, `grad`, `history` (SGD's
 * momentum, or Adam's first moment) and `v` (Adam's second moment); for SGD, `savedParam` and
 * `savedHistory` (0: none) take the values it overwrites, and thread t writes to the int32 at
 * `finite + 4·t` (0: none) whether every new parameter of its share is finite. The hyper-parameters
 * are float32 bit patterns (see {@link floatBits}), in the order of the kernel's arguments.
 */
export interface UpdateTask {
  length: number;
  param: number;
  grad: number;
  history: number;
  v: number;
  savedParam: number;
  savedHistory: number;
  finite: number;
  hyper: readonly number[];
}

/** Max pooling backward over `planes` planes (plane sizes in floats, addresses in bytes). */
export interface PoolBackwardTask {
  planes: number;
  inPlane: number;
  outPlane: number;
  dy: number;
  argmax: number;
  dx: number;
  /** The pooled output of a ReLU (`masked`): dy passes where it is > 0. */
  reluOf: number;
  masked: boolean;
  /** `planes` floats (`summed`): each dx plane's sum, by `sum_rows`. */
  planeSums: number;
  summed: boolean;
}

/**
 * Average pooling over `planes` planes (geometry as `Pool2dGeometry`, batch × channels = planes):
 * forward from `source` (x) into `target` (out), backward from `source` (dy) into `target` (dx),
 * with the windows' float64 `divisors` (see `avgPoolDivisors`); backward's share table rows hold
 * `shareRow` float64s (see `avgPoolShareRow`), one table in each thread's scratch.
 */
export interface AvgPoolTask extends PoolWindows {
  source: number;
  target: number;
  divisors: number;
  shareRow: number;
}

/** Every task carries where thread t's scratch starts: `scratch + t·scratchStride`. */
export interface TaskScratch {
  scratch: number;
  scratchStride: number;
}

const MATMUL_FIELDS = [
  "batch",
  "m",
  "n",
  "k",
  "a",
  "lda",
  "transA",
  "aBatchStride",
  "b",
  "ldb",
  "transB",
  "bBatchStride",
  "c",
  "ldc",
  "cBatchStride",
  "accumulate",
  "scratch",
  "scratchStride",
  "mc",
  "nc",
  "inPlaceRows",
  "fewRowsNc",
  "bias",
  "relu",
] as const;

const CONV_FIELDS = [
  "batch",
  "inChannels",
  "inHeight",
  "inWidth",
  "outChannels",
  "kernelH",
  "kernelW",
  "strideH",
  "strideW",
  "padH",
  "padW",
  "groups",
  "outHeight",
  "outWidth",
  "image",
  "weight",
  "output",
  "offsets",
  "bias",
  "relu",
  "partials",
  "scratch",
  "scratchStride",
  "mc",
  "nc",
  "inPlaceRows",
  "fewRowsNc",
  ...POOL_EPILOGUE_FIELDS,
] as const;

/** The fields of {@link PoolWindows}, in the order every pooling kernel takes them. */
const WINDOW_FIELDS = [
  "planes",
  "inHeight",
  "inWidth",
  "outHeight",
  "outWidth",
  "kernelH",
  "kernelW",
  "strideH",
  "strideW",
  "padH",
  "padW",
] as const;

const POOL_FIELDS = [
  ...WINDOW_FIELDS,
  "x",
  "out",
  "argmax",
  "scratch",
  "scratchStride",
] as const;

/**
 * Most integers any task needs (the size of the shared argument block).
 *
 * @example
 * ```ts
 * import { MAX_TASK_ARGS } from "./tasks.ts";
 * const args = new Int32Array(MAX_TASK_ARGS);
 * ```
 */
export const MAX_TASK_ARGS = 48;

const UPDATE_FIELDS = [
  "length",
  "param",
  "grad",
  "history",
  "v",
  "savedParam",
  "savedHistory",
  "finite",
] as const;

const ELEMENTWISE_FIELDS = ["op", "length", "a", "b", "out", "extra", "extra2"] as const;

const POOL_BACKWARD_FIELDS = [
  "planes",
  "inPlane",
  "outPlane",
  "dy",
  "argmax",
  "dx",
  "reluOf",
  "masked",
  "planeSums",
  "summed",
] as const;

/** A pooled weight gradient (`filter_pooled.ts`): the convolution's geometry, then its operands. */
const FILTER_POOLED_FIELDS = [
  ...CONV_FIELDS.slice(0, 14),
  "pooledOutputs",
  "image",
  "dy",
  "argmax",
  "reluOf",
  "masked",
  "weight",
  "planeSums",
  "summed",
  "offsets",
  "scratch",
  "scratchStride",
] as const;

/**
 * Bytes of dx a max-pooling backward task scatters before it sums those planes (with plane sums):
 * few enough that they are still in L2 when summed.
 */
const SUMMED_CHUNK_BYTES = 128 << 10;

const AVG_POOL_FIELDS = [
  ...WINDOW_FIELDS,
  "source",
  "target",
  "divisors",
  "shareRow",
  "scratch",
  "scratchStride",
] as const;

function fieldsOf(kind: TaskKind): readonly string[] {
  if (kind === TaskKind.matmul) return MATMUL_FIELDS;
  if (kind === TaskKind.sgdUpdate || kind === TaskKind.adamUpdate) return UPDATE_FIELDS;
  if (kind === TaskKind.elementwise) return ELEMENTWISE_FIELDS;
  if (kind === TaskKind.maxPoolBackward) return POOL_BACKWARD_FIELDS;
  if (kind === TaskKind.avgPoolForward || kind === TaskKind.avgPoolBackward) return AVG_POOL_FIELDS;
  if (kind === TaskKind.lrnForward || kind === TaskKind.lrnBackward) return LRN_FIELDS;
  if (kind === TaskKind.winograd) return WINOGRAD_FIELDS;
  if (kind === TaskKind.filterPooled) return FILTER_POOLED_FIELDS;
  return kind === TaskKind.maxPoolForward ? POOL_FIELDS : CONV_FIELDS;
}

/**
 * Writes a task's fields, in their fixed order, into `out` (booleans as 0/1).
 *
 * @example
 * ```ts
 * import { encodeTask, MAX_TASK_ARGS, TaskKind } from "./tasks.ts";
 * const args = new Int32Array(MAX_TASK_ARGS);
 * encodeTask(TaskKind.matmul, {
 *   batch: 1, m: 2, n: 2, k: 2, a: 0, lda: 2, transA: false, aBatchStride: 0, b: 16, ldb: 2,
 *   transB: false, bBatchStride: 0, c: 32, ldc: 2, cBatchStride: 0, accumulate: false,
 *   scratch: 1024, scratchStride: 0, mc: 96, nc: 2048, inPlaceRows: 6, fewRowsNc: 2048, bias: 0, relu: false,
 * }, args);
 * ```
 */
export function encodeTask(
  kind: TaskKind,
  task:
    | ((MatmulTask | ConvTask | PooledConvTask | PoolTask | AvgPoolTask) & TaskScratch)
    | UpdateTask
    | PoolBackwardTask
    | LrnTask
    | ElementwiseTask
    | WinogradTask
    | PooledFilterTask,
  out: Int32Array,
): void {
  const record = task as unknown as Record<string, number | boolean>;
  const fields = fieldsOf(kind);
  // A typed array drops writes past its end: a kind that outgrew the block would lose its last
  // fields without a word (the pooled convolution's epilogue once took it past 32).
  if (fields.length > out.length) {
    throw new RangeError(
      `encodeTask: task kind ${kind} has ${fields.length} fields, the block holds ${out.length}`,
    );
  }
  fields.forEach((field, i) => {
    const value = record[field];
    out[i] = typeof value === "boolean" ? (value ? 1 : 0) : value;
  });
  // An update's float32 hyper-parameters follow its fields, as bit patterns.
  if ("hyper" in task) out.set(task.hyper, fields.length);
}

const bitsView = new Int32Array(1), floatView = new Float32Array(bitsView.buffer);

/**
 * The bit pattern of `value` rounded to float32 (how float arguments cross in a task).
 *
 * @example
 * ```ts
 * import { floatBits } from "./tasks.ts";
 * console.log(floatBits(1).toString(16)); // "3f800000"
 * ```
 */
export function floatBits(value: number): number {
  floatView[0] = value;
  return bitsView[0];
}

function bitsFloat(bits: number): number {
  bitsView[0] = bits;
  return floatView[0];
}

/**
 * Runs thread `t`'s share of an update: one contiguous range of whole cache lines (16 floats),
 * every element computed alone, so the split never changes a bit.
 */
function runUpdate(x: KernelExports, kind: TaskKind, args: Int32Array, t: number, threads: number): void {
  const [length, param, grad, history, v, savedParam, savedHistory, finite] = args;
  const [e0, e1] = share(length, t, threads, 16);
  // Every thread an update takes has a share (`#updateThreads` gives each at least 512 Ki floats), so
  // no flag is left unwritten by this return.
  if (e1 <= e0) return;
  const hyper: number[] = [];
  for (let i = UPDATE_FIELDS.length; i < UPDATE_FIELDS.length + (kind === TaskKind.sgdUpdate ? 3 : 8); i++) {
    hyper.push(bitsFloat(args[i]));
  }
  const flag = finite === 0 ? 0 : finite + 4 * t;
  const at = 4 * e0;
  if (kind === TaskKind.sgdUpdate && savedParam !== 0) {
    x.sgd_update_saving(
      param + at,
      grad + at,
      history + at,
      savedParam + at,
      savedHistory + at,
      e1 - e0,
      ...hyper,
      flag,
    );
  } else if (kind === TaskKind.sgdUpdate) {
    x.sgd_update(param + at, grad + at, history + at, e1 - e0, ...hyper, flag);
  } else x.adam_update(param + at, grad + at, history + at, v + at, e1 - e0, ...hyper);
}

/** Runs thread `t`'s share of an elementwise task (see {@link ElementwiseTask}). */
function runElementwise(x: KernelExports, args: Int32Array, t: number, threads: number): void {
  const [op, length, a, b, out, extra, extra2] = args;
  if (op === ElementwiseOp.addChannels) {
    const [o0, o1] = share(length, t, threads);
    const block = 4 * extra * extra2;
    if (extra2 === 1) {
      // A bias along the last axis (a fully connected layer's): each row plus the whole vector.
      for (let o = o0; o < o1; o++) x.add_scale(a + o * block, b, out + o * block, extra, 1);
    } else if (o1 > o0) x.add_channels(a + o0 * block, b, out + o0 * block, o1 - o0, extra, extra2);
    return;
  }
  if (op === ElementwiseOp.sumRows) {
    const [r0, r1] = share(length, t, threads);
    if (r1 > r0) x.sum_rows(a + 4 * r0 * extra, out + 4 * r0, r1 - r0, extra);
    return;
  }
  // Whole cache lines (16 floats) per thread.
  const [e0, e1] = share(length, t, threads, 16);
  if (op === ElementwiseOp.firstNonFinite) {
    // Every thread answers in its own slot, an empty share too (−1), so no slot is left stale.
    x.first_non_finite(a + 4 * e0, e1 - e0, e0, out + 4 * t);
    return;
  }
  if (e1 <= e0) return;
  const at = 4 * e0;
  if (op === ElementwiseOp.relu) x.relu(a + at, out + at, e1 - e0);
  else if (op === ElementwiseOp.reluGrad) x.relu_grad(a + at, b + at, out + at, e1 - e0);
  else if (op === ElementwiseOp.mul) x.mul(a + at, b + at, out + at, e1 - e0);
  else x.add_scale(a + at, b + at, out + at, e1 - e0, bitsFloat(extra));
}

/** Per field list, a record holding every field once: what {@link decode} copies. */
const decodeTemplates = new Map<readonly string[], Record<string, number>>();

/**
 * A task's fields as a record, on every call of every thread's share. Built by copying a template
 * that already has every field, not by adding fields one by one: V8 turns an object that gains more
 * than about a dozen properties by computed keys into a slow dictionary. Measured on a 2-core EPYC:
 * 10–16 µs per call in a loop of 256³ products (which take about 350 µs on 2 threads), against
 * 1 µs for the copy; 2.4 against 1.7 µs per call in an AlexNet-like training step (53 calls).
 */
function decode(kind: TaskKind, args: Int32Array): Record<string, number> {
  const fields = fieldsOf(kind);
  let template = decodeTemplates.get(fields);
  if (!template) {
    template = Object.fromEntries(fields.map((field) => [field, 0]));
    decodeTemplates.set(fields, template);
  }
  const out = { ...template };
  for (let i = 0; i < fields.length; i++) out[fields[i]] = args[i];
  return out;
}

/** [start, end) of share `t` of `count` items over `threads`, in multiples of `quantum`. */
function share(count: number, t: number, threads: number, quantum = 1): [number, number] {
  const units = Math.ceil(count / quantum);
  const start = Math.min(count, Math.floor((units * t) / threads) * quantum);
  const end = Math.min(count, Math.floor((units * (t + 1)) / threads) * quantum);
  return [start, end];
}

function runMatmul(
  x: KernelExports,
  task: Record<string, number>,
  t: number,
  threads: number,
  claim?: Claim,
): void {
  const scratch = task.scratch + t * task.scratchStride;
  const blocks = { mc: task.mc, nc: task.nc, inPlaceRows: task.inPlaceRows, fewRowsNc: task.fewRowsNc };
  const problem = (i: number): GemmProblem => ({
    m: task.m,
    n: task.n,
    k: task.k,
    a: task.a + i * task.aBatchStride,
    lda: task.lda,
    transA: task.transA === 1,
    b: task.b + i * task.bBatchStride,
    ldb: task.ldb,
    transB: task.transB === 1,
    c: task.c + i * task.cBatchStride,
    ldc: task.ldc,
    accumulate: task.accumulate === 1,
  });
  // The epilogue on the block of C a thread just computed, while it is in cache.
  const epilogue = (p: GemmProblem, column: number) => {
    if (task.bias) x.bias_rows(p.c, task.bias + 4 * column, p.m, p.n, 4 * p.ldc, task.relu);
    else if (task.relu) {
      for (let r = 0; r < p.m; r++) {
        x.relu(p.c + 4 * r * p.ldc, p.c + 4 * r * p.ldc, p.n);
      }
    }
  };
  if (task.batch >= 4 * threads || task.batch % threads === 0) {
    // Whole products per thread.
    const next = claim ?? rangeClaim(...share(task.batch, t, threads));
    for (let i = next(); i < task.batch; i = next()) {
      const p = problem(i);
      gemmBlocked(x, p, scratch, blocks);
      epilogue(p, 0);
    }
    return;
  }
  // Few products: each is cut along the longer side of C into windows, which threads claim (or take
  // a fixed share of); a window is a product of its own, every element summed whole in it.
  const p0 = problem(0), columns = p0.n >= p0.m;
  const { size, quantum } = columns
    ? { size: p0.n, quantum: GEMM_TILE.nr }
    : { size: p0.m, quantum: GEMM_TILE.mr };
  const window = claim ? matmulWindow(size, quantum, threads) : size;
  const perProduct = Math.ceil(size / window);
  const run = (i: number, w0: number, w1: number) => {
    const p = problem(i);
    if (w1 <= w0) return;
    const window = columns ? gemmWindow(p, 0, p.m, w0, w1) : gemmWindow(p, w0, w1, 0, p.n);
    gemmBlocked(x, window, scratch, blocks);
    epilogue(window, columns ? w0 : 0);
  };
  if (claim) {
    for (let u = claim(); u < task.batch * perProduct; u = claim()) {
      const i = Math.floor(u / perProduct), w0 = (u % perProduct) * window;
      run(i, w0, Math.min(size, w0 + window));
    }
    return;
  }
  for (let i = 0; i < task.batch; i++) run(i, ...share(size, t, threads, quantum));
}

/**
 * Columns (or rows) of C per window a thread claims of a product cut `size` long on `threads`
 * threads: a thread's fixed share, in whole register tiles. Each window packs its own copy of the
 * other operand, so finer windows repack it more often: a quarter share (4 windows per thread)
 * scaled 2 threads over 1 by 1.47–1.62× on 256³ and 1.71–1.83× on 1024³ where one share scaled
 * 1.71–1.76× and 1.84–1.95× (this 2-core EPYC, alternating runs). A thread that starts late
 * still loses its window to one that asks first.
 *
 * @example
 * ```ts
 * import { matmulWindow } from "./tasks.ts";
 * matmulWindow(9216, 8, 2); // 4608: 2 windows of the FC input gradient's 9216 columns
 * ```
 */
export function matmulWindow(size: number, quantum: number, threads: number): number {
  return quantum * Math.max(1, Math.ceil(size / quantum / threads));
}

/** A pooling kernel's geometry arguments for `planes` planes, in {@link WINDOW_FIELDS} order. */
function windowArgs(task: Record<string, number>, planes: number): number[] {
  return WINDOW_FIELDS.map((field) => (field === "planes" ? planes : task[field]));
}

/** Average pooling, forward or backward, of planes [p0, p1) on thread `t` (its scratch). */
function runAvgPoolPlanes(
  x: KernelExports,
  backward: boolean,
  task: Record<string, number>,
  p0: number,
  p1: number,
  t: number,
): void {
  const inPlane = 4 * task.inHeight * task.inWidth, outPlane = 4 * task.outHeight * task.outWidth;
  const geometry = windowArgs(task, p1 - p0);
  if (backward) {
    const scratch = task.scratch + t * task.scratchStride;
    x.avg_pool_backward(
      task.source + p0 * outPlane,
      task.target + p0 * inPlane,
      task.divisors,
      scratch,
      task.shareRow,
      ...geometry,
    );
  } else {
    x.avg_pool_forward(task.source + p0 * inPlane, task.target + p0 * outPlane, task.divisors, ...geometry);
  }
}

/**
 * Runs thread `t`'s share (of `threads`) of the task encoded in `args`. With `claim` (the job's
 * shared counter, see {@link Claim}), products and convolutions take their units of work as they
 * come instead of a fixed share — whole products or windows of one ({@link matmulWindow}), images
 * (forward, input gradient) or weight-gradient image chunks and row blocks ({@link filterRowBlock}) — so
 * threads that run at different speeds finish together; every other kind keeps its fixed share.
 *
 * @example
 * ```ts
 * import { runTaskShare, TaskKind } from "./tasks.ts";
 * // runTaskShare(kernels, TaskKind.matmul, args, 0, 1); // the whole task on one thread
 * ```
 */
export function runTaskShare(
  x: KernelExports,
  kind: TaskKind,
  args: Int32Array,
  t: number,
  threads: number,
  claim?: Claim,
): void {
  const task = decode(kind, args);
  if (kind === TaskKind.matmul) {
    runMatmul(x, task, t, threads, claim);
    return;
  }
  if (kind === TaskKind.sgdUpdate || kind === TaskKind.adamUpdate) {
    runUpdate(x, kind, args, t, threads);
    return;
  }
  if (kind === TaskKind.elementwise) {
    runElementwise(x, args, t, threads);
    return;
  }
  if (kind === TaskKind.winograd) {
    // Units are taken one by one (one thread alone takes them all); each is computed whole.
    const winograd = task as unknown as WinogradTask;
    runWinogradPhase(
      x,
      winograd,
      winograd.scratch + t * winograd.scratchStride,
      claim ?? rangeClaim(0, Infinity),
    );
    return;
  }
  if (kind === TaskKind.lrnForward || kind === TaskKind.lrnBackward) {
    // Whole images per thread: each image's sums run through all its channels on one thread.
    const [n0, n1] = share(task.images, t, threads);
    if (n1 > n0) runLrnImages(x, kind === TaskKind.lrnBackward, args, n0, n1, t);
    return;
  }
  if (kind === TaskKind.avgPoolForward || kind === TaskKind.avgPoolBackward) {
    // Whole planes per thread: every output (and every dx element) is computed by one thread.
    const [p0, p1] = share(task.planes, t, threads);
    if (p1 > p0) runAvgPoolPlanes(x, kind === TaskKind.avgPoolBackward, task, p0, p1, t);
    return;
  }
  if (kind === TaskKind.filterPooled) {
    // Whole filters per thread: each filter's sums run through every image on one thread.
    const [f0, f1] = share(task.outChannels, t, threads);
    convBackwardFilterPooled(
      x,
      task as unknown as Conv2dGeometry,
      task.pooledOutputs,
      {
        image: task.image,
        dy: task.dy,
        argmax: task.argmax,
        reluOf: task.reluOf,
        masked: task.masked === 1,
        weight: task.weight,
        planeSums: task.planeSums,
        summed: task.summed === 1,
        offsets: task.offsets,
      },
      f0,
      f1,
      task.scratch + t * task.scratchStride,
    );
    return;
  }
  if (kind === TaskKind.maxPoolBackward) {
    const [p0, p1] = share(task.planes, t, threads);
    // With plane sums, a chunk of planes at a time, each summed while in cache by `sum_rows`, the
    // kernel `reduce("sum")` runs (the same bits as the separate reduce).
    const chunk = task.summed ? Math.max(1, Math.floor(SUMMED_CHUNK_BYTES / (4 * task.inPlane))) : p1 - p0;
    for (let q0 = p0; q0 < p1; q0 += chunk) {
      const q1 = Math.min(p1, q0 + chunk);
      const dx = task.dx + 4 * q0 * task.inPlane;
      x.max_pool_backward(
        task.dy + 4 * q0 * task.outPlane,
        task.argmax + 4 * q0 * task.outPlane,
        dx,
        q1 - q0,
        task.inPlane,
        task.outPlane,
        task.reluOf + 4 * q0 * task.outPlane,
        task.masked,
      );
      if (task.summed) x.sum_rows(dx, task.planeSums + 4 * q0, q1 - q0, task.inPlane);
    }
    return;
  }
  if (kind === TaskKind.maxPoolForward) {
    const [p0, p1] = share(task.planes, t, threads);
    const inPlane = 4 * task.inHeight * task.inWidth, outPlane = 4 * task.outHeight * task.outWidth;
    if (p1 > p0) {
      x.max_pool_forward(
        task.x + p0 * inPlane,
        task.out + p0 * outPlane,
        task.argmax + p0 * outPlane,
        ...windowArgs(task, p1 - p0),
      );
    }
    return;
  }
  const g = task as unknown as Conv2dGeometry;
  const at = {
    image: task.image,
    weight: task.weight,
    output: task.output,
    bias: task.bias,
    relu: task.relu === 1,
  };
  const scratch = task.scratch + t * task.scratchStride;
  const blocks = { mc: task.mc, nc: task.nc, inPlaceRows: task.inPlaceRows, fewRowsNc: task.fewRowsNc };
  if (kind === TaskKind.convBackwardFilter) {
    // Units are (image chunk, row block) pairs, chunk by chunk; each sums into its chunk's partial.
    const rows = columnRows(g), block = filterRowBlock(g, threads), blocksPerChunk = Math.ceil(rows / block);
    const units = filterChunks(g) * blocksPerChunk, direct = directFilter(g);
    const next = claim ?? rangeClaim(...share(units, t, threads));
    for (let u = next(); u < units; u = next()) {
      const chunk = Math.floor(u / blocksPerChunk), r0 = (u % blocksPerChunk) * block;
      const target = { ...at, weight: filterChunkTarget(g, at.weight, task.partials, chunk) };
      const images = filterChunkImages(g, chunk);
      if (direct) {
        convBackwardFilterDirect(x, g, target, r0, Math.min(rows, r0 + block), scratch, task.offsets, images);
        continue;
      }
      convBackwardFilterRows(
        x,
        g,
        target,
        r0,
        Math.min(rows, r0 + block),
        scratch,
        task.offsets,
        blocks,
        images,
      );
    }
    return;
  }
  const next = claim ?? rangeClaim(...share(g.batch, t, threads));
  if (kind === TaskKind.convForward) {
    convForwardImages(x, g, at, next, scratch, task.offsets, blocks, task as unknown as PoolEpilogue);
  } else convBackwardInputImages(x, g, at, next, scratch, blocks);
}

/**
 * What a convolution task of `kind` needs beside its operands: the int32 table it reads at
 * `offsets` (forward and weight gradient: `packingTables`, or a direct weight gradient's
 * `directFilterTaps`; none for the input gradient) and each thread's scratch bytes for units of
 * `rows` column-matrix rows, in `blocks`.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../geometry.ts";
 * import { DEFAULT_GEMM_BLOCKS } from "./gemm.ts";
 * import { convTaskLayout, TaskKind } from "./tasks.ts";
 * const g = conv2dGeometry([64, 3, 32, 32], [32, 3, 5, 5], { padding: 2 });
 * convTaskLayout(TaskKind.convBackwardFilter, g, 75, DEFAULT_GEMM_BLOCKS).table?.length; // 75 taps
 * ```
 */
export function convTaskLayout(
  kind: TaskKind,
  g: Conv2dGeometry,
  rows: number,
  blocks: GemmBlocks,
): { table?: Int32Array; scratchStride: number } {
  if (kind === TaskKind.convBackwardFilter && directFilter(g)) {
    return { table: directFilterTaps(g), scratchStride: directFilterScratchBytes(g, rows) };
  }
  const implicit = kind !== TaskKind.convBackwardInput;
  return {
    table: implicit ? packingTables(g) : undefined,
    scratchStride: convScratchBytes(g, rows, implicit, blocks),
  };
}

/**
 * Fewest NR-lane panels in a weight-gradient row block. Every block pads its images and packs
 * dy's rows of every image again (its GEMM's A), and a block of r rows does only 2·r
 * multiply-adds per packed float: at 8 rows, cifar10_quick's conv1 (75 rows) ran its weight
 * gradient no faster on 2 threads than on 1; at 48, 2 threads went from 20 to 28 GFLOP/s.
 */
const FILTER_BLOCK_PANELS = 6;

/**
 * Rows of the column matrix in one unit of a weight-gradient task on `threads` threads: all of
 * them while the image chunks ({@link filterChunks}) alone give every thread work; with more
 * threads than chunks, about a 2·threads/chunks-th of them in whole NR-lane panels, at least
 * {@link FILTER_BLOCK_PANELS} (it also sizes each thread's scratch). Rows never change a bit.
 *
 * @example
 * ```ts
 * import { filterRowBlock } from "./tasks.ts";
 * import { conv2dGeometry } from "../../geometry.ts";
 * filterRowBlock(conv2dGeometry([64, 32, 16, 16], [32, 32, 5, 5], { padding: 2 }), 2); // all 800 rows
 * filterRowBlock(conv2dGeometry([1, 32, 16, 16], [32, 32, 5, 5], { padding: 2 }), 2); // 200 of 800 rows
 * ```
 */
export function filterRowBlock(g: Conv2dGeometry, threads: number): number {
  const nr = GEMM_TILE.nr, rows = columnRows(g), chunks = filterChunks(g);
  if (threads <= chunks) return rows;
  const panels = Math.ceil(rows / nr);
  const blocks = Math.min(Math.ceil((2 * threads) / chunks), Math.floor(panels / FILTER_BLOCK_PANELS));
  return blocks <= 1 ? rows : nr * Math.ceil(panels / blocks);
}
