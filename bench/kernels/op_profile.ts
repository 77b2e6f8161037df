/**
 * A per-op profile of whatever runs on a {@link Backend}: {@link OpProfiler} wraps a backend in a
 * Proxy that times every method call with `performance.now()` and adds the time, the call and, for
 * GEMM and convolution, the floating-point operations to a category (GEMM, convolution, pooling,
 * LRN, elementwise, softmax / loss, optimizer, copies, allocation, device messages).
 *
 * The CPU backend's kernels are synchronous (its kernel threads are woken through shared memory and
 * `Atomics` inside the call and have finished when it returns), so on it a call's time is exactly
 * the kernel's. On a backend that queues work (WebGPU) the times are only the cost of queueing, and
 * `read` is timed until it returns its promise, not until the promise settles.
 *
 * The WebAssembly convolution packs its im2col panels (or, on the Winograd path, transforms its
 * tiles) inside the call, so the category `convolution` is GEMM and packing or transforms
 * together; it cannot be split from outside the backend. Its flops are those of the direct
 * convolution ({@link conv2dFlops}) whichever algorithm ran, so a Winograd layer's rate is an
 * effective one and may pass the machine's peak.
 *
 * Calls a backend makes on itself (e.g. the CPU backend's `upload` allocating) go to the unwrapped
 * object and are not counted twice. Tensors remember the backend they were made on, so only tensors
 * created while the wrapped backend is current (see {@link withBackend}) are profiled.
 *
 * @example
 * ```ts
 * import { CpuBackend, randn, tidy, ops } from "../../mod.ts";
 * import { OpProfiler, withBackend } from "./op_profile.ts";
 * const profiler = new OpProfiler(new CpuBackend({ threads: 1 }), { name: "cpu-profiled" });
 * await withBackend(profiler.backend, () => {
 *   tidy(() => ops.matmul(randn([64, 32], { seed: 1 }), randn([32, 16], { seed: 2 })));
 * });
 * console.log(profiler.snapshot().categories.gemm); // { ms: …, calls: 1, flops: 65536 }
 * ```
 *
 * @module
 */

import type { Backend, Conv2dGeometry, MatmulSpec } from "../../backends/backend.ts";
import { getBackend, registerBackend, setBackend } from "../../engine/context.ts";

/** The groups a backend call is counted under. */
export type OpCategory =
  | "gemm"
  | "convolution"
  | "pooling"
  | "lrn"
  | "elementwise"
  | "softmax"
  | "optimizer"
  | "copies"
  | "allocation"
  | "messages"
  | "other";

/** Every category, in the order tables list them. */
export const OP_CATEGORIES: readonly OpCategory[] = [
  "gemm",
  "convolution",
  "pooling",
  "lrn",
  "elementwise",
  "softmax",
  "optimizer",
  "copies",
  "allocation",
  "messages",
  "other",
];

/** How tables name each category. */
export const CATEGORY_LABELS: Readonly<Record<OpCategory, string>> = {
  gemm: "GEMM (`matmul`)",
  convolution: "convolution (GEMM + im2col packing or Winograd transforms)",
  pooling: "pooling (max, average)",
  lrn: "LRN",
  elementwise: "elementwise (unary, binary, reduce, fill, dropout masks)",
  softmax: "softmax / loss",
  optimizer: "optimizer (fused SGD, Adam)",
  copies: "copies (copyStrided, upload, read, write, view)",
  allocation: "allocation (allocate, release)",
  messages: "device messages (synchronize, stageToHost, averageInOrder)",
  other: "other backend calls",
};

/**
 * The category of each {@link Backend} method; any other method (e.g. the CPU backend's
 * `startThreads` or `dispose`) counts as `other`.
 */
export const METHOD_CATEGORIES: Readonly<Record<string, OpCategory>> = {
  matmul: "gemm",
  conv2dForward: "convolution",
  conv2dForwardMaxPool: "convolution",
  conv2dBackwardInput: "convolution",
  conv2dBackwardFilter: "convolution",
  conv2dBackwardFilterPooled: "convolution",
  maxPool2dForward: "pooling",
  maxPool2dBackward: "pooling",
  maxPool2dBackwardFused: "pooling",
  avgPool2dForward: "pooling",
  avgPool2dBackward: "pooling",
  lrnForward: "lrn",
  lrnBackward: "lrn",
  unary: "elementwise",
  binary: "elementwise",
  reduce: "elementwise",
  fill: "elementwise",
  dropoutMask: "elementwise",
  softmax: "softmax",
  logSoftmax: "softmax",
  softmaxCrossEntropy: "softmax",
  softmaxCrossEntropyBackward: "softmax",
  sgdUpdate: "optimizer",
  adamUpdate: "optimizer",
  copyStrided: "copies",
  upload: "copies",
  read: "copies",
  readSync: "copies",
  write: "copies",
  view: "copies",
  wrap: "copies",
  allocate: "allocation",
  allocateUninitialized: "allocation",
  allocateShared: "allocation",
  release: "allocation",
  synchronize: "messages",
  stageToHost: "messages",
  averageInOrder: "messages",
};

/**
 * The category `method` is counted under.
 *
 * @example
 * ```ts
 * import { categoryOf } from "./op_profile.ts";
 * categoryOf("conv2dBackwardFilter"); // "convolution"
 * categoryOf("startThreads"); // "other"
 * ```
 */
export function categoryOf(method: string): OpCategory {
  return Object.hasOwn(METHOD_CATEGORIES, method) ? METHOD_CATEGORIES[method] : "other";
}

/**
 * Floating-point operations of one batched product (a multiply-add counts 2): `2·batch·m·n·k`.
 *
 * @example
 * ```ts
 * import { matmulFlops } from "./op_profile.ts";
 * matmulFlops({ batch: 1, m: 64, n: 16, k: 32, transA: false, transB: false, aBatchStride: 0, bBatchStride: 0 }); // 65536
 * ```
 */
export function matmulFlops(spec: MatmulSpec): number {
  return 2 * spec.batch * spec.m * spec.n * spec.k;
}

/**
 * Floating-point operations of one convolution pass (forward, input gradient or filter gradient
 * each do the same products): `2·N·outC·outH·outW·(inC/groups)·kH·kW`.
 *
 * @example
 * ```ts
 * import { conv2dFlops } from "./op_profile.ts";
 * conv2dFlops({
 *   batch: 2, inChannels: 3, inHeight: 8, inWidth: 8, outChannels: 4, kernelH: 3, kernelW: 3,
 *   strideH: 1, strideW: 1, padH: 1, padW: 1, groups: 1, outHeight: 8, outWidth: 8,
 * }); // 27648
 * ```
 */
export function conv2dFlops(g: Conv2dGeometry): number {
  return 2 * g.batch * g.outChannels * g.outHeight * g.outWidth * (g.inChannels / g.groups) * g.kernelH *
    g.kernelW;
}

/** Flops of a call of `method` with `args`, for the methods that are counted (0 for the rest). */
function callFlops(method: string, args: readonly unknown[]): number {
  switch (method) {
    case "matmul":
      return matmulFlops(args[3] as MatmulSpec);
    case "conv2dForward":
    case "conv2dBackwardInput":
    case "conv2dBackwardFilter":
      return conv2dFlops(args[3] as Conv2dGeometry);
    case "conv2dForwardMaxPool":
    case "conv2dBackwardFilterPooled":
      return conv2dFlops(args[4] as Conv2dGeometry);
    default:
      return 0;
  }
}

/** Accumulated time, calls and counted flops of one category or method. */
export interface OpTotals {
  /** Milliseconds inside the calls. */
  ms: number;
  /** Number of calls. */
  calls: number;
  /** Floating-point operations counted (GEMM and convolution only; 0 elsewhere). */
  flops: number;
}

/** What an {@link OpProfiler} has recorded since it was made or last reset. */
export interface OpProfile {
  /** Totals per category (every category present, zero when nothing ran). */
  categories: Record<OpCategory, OpTotals>;
  /** Totals per backend method that was called, keyed by method name. */
  methods: Record<string, OpTotals>;
  /** Sum over all calls. */
  total: OpTotals;
}

const zero = (): OpTotals => ({ ms: 0, calls: 0, flops: 0 });

/** Options of {@link OpProfiler}. */
export interface OpProfilerOptions {
  /**
   * The name the wrapped backend reports (and is registered under by {@link withBackend}); default
   * the inner backend's name with `-profiled` appended, so it does not replace the inner one.
   */
  name?: string;
}

/**
 * Wraps a backend so that every method call is timed and counted by category. Use
 * {@link OpProfiler.backend} where the backend would be used, {@link OpProfiler.snapshot} to read
 * the totals and {@link OpProfiler.reset} to start again (e.g. after warm-up steps).
 *
 * The wrapper is a Proxy: properties that are not functions (and getters and setters such as the
 * CPU backend's `threads`) pass through to the inner backend, optional methods the inner backend
 * lacks stay absent, and `instanceof` sees the inner backend's class. Calls run with the inner
 * backend as `this`. The per-call overhead is two `performance.now()` calls and a few additions.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../mod.ts";
 * import { OpProfiler } from "./op_profile.ts";
 * const profiler = new OpProfiler(new CpuBackend({ threads: 1 }));
 * const s = profiler.backend.upload(new Float32Array([1, 2, 3]));
 * profiler.backend.release(s);
 * console.log(profiler.snapshot().categories.copies.calls); // 1
 * ```
 */
export class OpProfiler {
  /** The wrapped backend: register it, or pass it where a backend is expected. */
  readonly backend: Backend;
  readonly #methods = new Map<string, OpTotals>();
  readonly #wrappers = new Map<PropertyKey, { method: unknown; wrapper: unknown }>();

  /** A profiler of `inner`; nothing is recorded until the wrapped {@link OpProfiler.backend} is called. */
  constructor(readonly inner: Backend, options: OpProfilerOptions = {}) {
    const name = options.name ?? `${inner.name}-profiled`;
    this.backend = new Proxy(inner, {
      get: (target, prop) => {
        if (prop === "name") return name;
        const value = Reflect.get(target, prop, target);
        if (typeof value !== "function") return value;
        // One wrapper per method, made on first use (again if the property is reassigned), so a call
        // allocates no closure.
        const cached = this.#wrappers.get(prop);
        if (cached !== undefined && cached.method === value) return cached.wrapper;
        const wrapper = this.#wrap(target, prop, value as (...args: unknown[]) => unknown);
        this.#wrappers.set(prop, { method: value, wrapper });
        return wrapper;
      },
      set: (target, prop, value) => Reflect.set(target, prop, value, target),
    });
  }

  #wrap(target: Backend, prop: PropertyKey, method: (...args: unknown[]) => unknown) {
    const key = String(prop);
    // One totals object per method name for the profiler's life; reset zeroes it in place.
    const totals = this.#methods.get(key) ?? zero();
    this.#methods.set(key, totals);
    return (...args: unknown[]) => {
      const t0 = performance.now();
      let result: unknown;
      try {
        return result = method.apply(target, args);
      } finally {
        totals.ms += performance.now() - t0;
        totals.calls++;
        // An optional fused call that declined (false) did no work: the engine's fallback counts it.
        if (result !== false) totals.flops += callFlops(key, args);
      }
    };
  }

  /** Forgets everything recorded so far. */
  reset(): void {
    for (const totals of this.#methods.values()) Object.assign(totals, zero());
  }

  /** A copy of the totals recorded since the profiler was made or last reset. */
  snapshot(): OpProfile {
    const categories = Object.fromEntries(OP_CATEGORIES.map((c) => [c, zero()])) as Record<
      OpCategory,
      OpTotals
    >;
    const methods: Record<string, OpTotals> = {};
    const total = zero();
    for (const [method, t] of this.#methods) {
      if (t.calls === 0) continue;
      methods[method] = { ...t };
      for (const into of [categories[categoryOf(method)], total]) {
        into.ms += t.ms;
        into.calls += t.calls;
        into.flops += t.flops;
      }
    }
    return { categories, methods, total };
  }
}

/**
 * Runs `fn` with `backend` registered and current (tensors created inside are made on it), then
 * makes the previously current backend current again, also when `fn` throws. The backend stays
 * registered under its name.
 *
 * @example
 * ```ts
 * import { CpuBackend, randn } from "../../mod.ts";
 * import { OpProfiler, withBackend } from "./op_profile.ts";
 * const profiler = new OpProfiler(new CpuBackend({ threads: 1 }));
 * const x = await withBackend(profiler.backend, () => randn([4], { seed: 1 }));
 * ```
 */
export async function withBackend<T>(backend: Backend, fn: () => T | Promise<T>): Promise<T> {
  const previous = getBackend().name;
  registerBackend(backend);
  setBackend(backend.name);
  try {
    return await fn();
  } finally {
    setBackend(previous);
  }
}

/** One row of {@link stepBreakdown}. */
export interface StepBreakdownRow {
  /** The category, or `"outside"` for the step's time outside every backend call. */
  category: OpCategory | "outside";
  /** The row's label for tables. */
  label: string;
  /** Mean milliseconds per step. */
  msPerStep: number;
  /** Share of the mean step, 0 to 1. */
  share: number;
  /** Mean calls per step (0 for `outside`). */
  callsPerStep: number;
  /** Counted flops per step (GEMM and convolution; 0 elsewhere). */
  flopsPerStep: number;
  /** Counted flops over the row's time, GFLOP/s; undefined where no flops are counted. */
  gflops?: number;
}

/**
 * Splits `steps` profiled steps that took `stepMs` milliseconds in all into per-step rows: one per
 * category that was called, largest first, then "outside kernels" (the step time minus the
 * time inside all calls: the engine's JavaScript, autograd, tensor bookkeeping and the profiler's
 * own overhead).
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../mod.ts";
 * import { OpProfiler, stepBreakdown } from "./op_profile.ts";
 * const profiler = new OpProfiler(new CpuBackend({ threads: 1 }));
 * const rows = stepBreakdown(profiler.snapshot(), 1, 10); // [{ category: "outside", msPerStep: 10, … }]
 * ```
 */
export function stepBreakdown(profile: OpProfile, steps: number, stepMs: number): StepBreakdownRow[] {
  const meanStep = stepMs / steps;
  const rows: StepBreakdownRow[] = OP_CATEGORIES
    .filter((c) => profile.categories[c].calls > 0)
    .map((c) => {
      const t = profile.categories[c];
      return {
        category: c,
        label: CATEGORY_LABELS[c],
        msPerStep: t.ms / steps,
        share: t.ms / stepMs,
        callsPerStep: t.calls / steps,
        flopsPerStep: t.flops / steps,
        gflops: t.flops > 0 ? t.flops / (t.ms * 1e6) : undefined,
      };
    })
    .sort((a, b) => b.msPerStep - a.msPerStep);
  const outsideMs = meanStep - profile.total.ms / steps;
  rows.push({
    category: "outside",
    label: "outside kernels (engine JavaScript, autograd, profiler)",
    msPerStep: outsideMs,
    share: outsideMs / meanStep,
    callsPerStep: 0,
    flopsPerStep: 0,
  });
  return rows;
}
