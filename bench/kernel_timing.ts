/**
 * Timing helpers shared by `bench/wasm_bench.ts` and `bench/report.ts`: GEMM on a Tandem CPU
 * backend (operands uploaded once, as a model's tensors are), GEMM on the current TensorFlow.js
 * backend, and the cifar10_quick batch-64 training step on a registered Tandem backend.
 *
 * @module
 */

import type { CpuBackend } from "../backends/cpu/backend.ts";
import { cifarQuick, randn, setBackend, SGD, tensor, trainStep, uniformValues } from "../mod.ts";
import type { GemmShape } from "./gemm_shapes.ts";
import { tf, timeTf } from "./peers/tfjs.ts";

/**
 * Seeded uniform [-1, 1) data, so runs are comparable.
 *
 * @example
 * ```ts
 * import { filled } from "./kernel_timing.ts";
 * filled(3, 1); // the same three values every run
 * ```
 */
export function filled(length: number, seed: number): Float32Array {
  const out = new Float32Array(length);
  let x = seed >>> 0;
  for (let i = 0; i < length; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out[i] = x / 2147483648 - 1;
  }
  return out;
}

/**
 * Best time in seconds of `reps` products of `shape` on `backend`, after warming up (at least
 * one call and 0.2 s: each thread's WebAssembly runs in V8's baseline tier until it has run
 * enough to be optimised, in the background).
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../backends/cpu/backend.ts";
 * import { squareShape } from "./gemm_shapes.ts";
 * import { tandemGemmSeconds } from "./kernel_timing.ts";
 * const seconds = tandemGemmSeconds(new CpuBackend({ threads: 1 }), squareShape(128), 3);
 * ```
 */
export function tandemGemmSeconds(backend: CpuBackend, shape: GemmShape, reps: number): number {
  const { m, n, k, transA, transB } = shape;
  const a = backend.upload(filled(m * k, 1)), b = backend.upload(filled(k * n, 2));
  const out = backend.allocate(m * n, "float32");
  const spec = { batch: 1, m, n, k, transA, transB, aBatchStride: 0, bBatchStride: 0 };
  const warmUntil = performance.now() + 200;
  do backend.matmul(a, b, out, spec); while (performance.now() < warmUntil);
  let best = Infinity;
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    backend.matmul(a, b, out, spec);
    best = Math.min(best, performance.now() - t0);
  }
  for (const s of [a, b, out]) backend.release(s);
  return best / 1000;
}

/**
 * Best time in seconds of `reps` `tf.matMul` calls of `shape` on the current TensorFlow.js
 * backend, each read back (so it has finished), after one warm-up call when `warmup`.
 *
 * @example
 * ```ts
 * import { squareShape } from "./gemm_shapes.ts";
 * import { tfGemmSeconds } from "./kernel_timing.ts";
 * // await useBackend("wasm"); const seconds = tfGemmSeconds(squareShape(512), 5, true);
 * ```
 */
export function tfGemmSeconds(shape: GemmShape, reps: number, warmup: boolean): number {
  const a = tf.tensor2d(filled(shape.m * shape.k, 1), shape.transA ? [shape.k, shape.m] : [shape.m, shape.k]);
  const b = tf.tensor2d(filled(shape.k * shape.n, 2), shape.transB ? [shape.n, shape.k] : [shape.k, shape.n]);
  const call = () => timeTf(() => tf.matMul(a, b, shape.transA, shape.transB));
  if (warmup) call();
  let best = Infinity;
  for (let r = 0; r < reps; r++) best = Math.min(best, call());
  a.dispose();
  b.dispose();
  return best;
}

/**
 * Times `steps` cifar10_quick training steps at `batch` (SGD momentum 0.9, weight decay 5e-4) on
 * the registered backend `backendName`, after one warm-up step; returns each step's seconds.
 *
 * @example
 * ```ts
 * import { cifarQuickStepSeconds } from "./kernel_timing.ts";
 * // const seconds = await cifarQuickStepSeconds("cpu", 64, 5);
 * ```
 */
export async function cifarQuickStepSeconds(
  backendName: string,
  batch: number,
  steps: number,
): Promise<number[]> {
  setBackend(backendName);
  try {
    const model = cifarQuick();
    const images = randn([batch, ...model.inputShape], { seed: 1 });
    const labels = tensor(
      Int32Array.from(uniformValues(batch, { seed: 2 }), (u) => Math.floor(u * model.classes)),
      { dtype: "int32" },
    );
    const optimizer = new SGD(model.namedParameters(), { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 });
    const step = async () => {
      const t0 = performance.now();
      await trainStep(model, optimizer, { images, labels });
      return (performance.now() - t0) / 1000;
    };
    await step();
    const seconds: number[] = [];
    for (let i = 0; i < steps; i++) seconds.push(await step());
    for (const p of model.namedParameters()) p.tensor.dispose();
    images.dispose();
    labels.dispose();
    return seconds;
  } finally {
    setBackend("cpu");
  }
}
