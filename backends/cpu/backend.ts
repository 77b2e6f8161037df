/**
 * The pure-TypeScript CPU backend: storages are typed arrays on the host, kernels are plain loops
 * (GEMM register-tiled and cache-blocked). It is the reference every other backend is tested against.
 *
 * @module
 */

import type {
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
  SgdStep,
  Storage,
  StridedView,
  UnaryOp,
} from "../backend.ts";
import { conv2dBackwardFilter, conv2dBackwardInput, conv2dForward } from "./conv.ts";
import { binaryKernel, copyStridedKernel, reduceKernel, unaryKernel } from "./elementwise.ts";
import { gemm } from "./gemm.ts";
import { adamUpdateKernel, sgdUpdateKernel } from "./optimizers.ts";
import { lrnBackward, lrnForward } from "./lrn.ts";
import { avgPool2dBackward, avgPool2dForward, maxPool2dBackward, maxPool2dForward } from "./pool.ts";
import {
  logSoftmaxKernel,
  softmaxCrossEntropyBackwardKernel,
  softmaxCrossEntropyKernel,
  softmaxKernel,
} from "./softmax.ts";

/** CPU storage: a typed array the kernels use directly. */
export class CpuStorage implements Storage {
  /** Wraps `data` without copying. */
  constructor(readonly data: HostArray) {}
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
 * The CPU backend.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "./backend.ts";
 * const cpu = new CpuBackend();
 * const s = cpu.upload(new Float32Array([1, 2]));
 * console.log(cpu.readSync(s));
 * ```
 */
export class CpuBackend implements Backend {
  readonly name = "cpu";

  allocate(length: number, dtype: DType): Storage {
    return new CpuStorage(dtype === "int32" ? new Int32Array(length) : new Float32Array(length));
  }

  upload(data: HostArray): Storage {
    return new CpuStorage(data.slice());
  }

  /**
   * Storage over `data` itself, without copying: writes through either side are seen by the other.
   * Devices use it to keep parameters and gradients in `SharedArrayBuffer`s that other threads read.
   */
  wrap(data: HostArray): Storage {
    return new CpuStorage(data);
  }

  read(storage: Storage): Promise<HostArray> {
    return Promise.resolve(this.readSync(storage));
  }

  readSync(storage: Storage): HostArray {
    return (storage as CpuStorage).data.slice();
  }

  release(_storage: Storage): void {
    // Garbage-collected; the engine's counters already account for it.
  }

  fill(out: Storage, value: number): void {
    (out as CpuStorage).data.fill(value);
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
    binaryKernel(op, f32(a), aView, f32(b), bView, f32(out), shape);
  }

  reduce(op: ReduceOp, x: Storage, out: Storage, outer: number, size: number, inner: number): void {
    reduceKernel(op, f32(x), f32(out), outer, size, inner);
  }

  matmul(a: Storage, b: Storage, out: Storage, spec: MatmulSpec): void {
    const { batch, m, n, k, transA, transB, aBatchStride, bBatchStride } = spec;
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
  }

  conv2dForward(x: Storage, weight: Storage, out: Storage, geometry: Conv2dGeometry): void {
    conv2dForward(f32(x), f32(weight), f32(out), geometry);
  }

  conv2dBackwardInput(dy: Storage, weight: Storage, dx: Storage, geometry: Conv2dGeometry): void {
    conv2dBackwardInput(f32(dy), f32(weight), f32(dx), geometry);
  }

  conv2dBackwardFilter(x: Storage, dy: Storage, dw: Storage, geometry: Conv2dGeometry): void {
    conv2dBackwardFilter(f32(x), f32(dy), f32(dw), geometry);
  }

  maxPool2dForward(x: Storage, out: Storage, argmax: Storage, geometry: Pool2dGeometry): void {
    maxPool2dForward(f32(x), f32(out), i32(argmax), geometry);
  }

  maxPool2dBackward(dy: Storage, argmax: Storage, dx: Storage, geometry: Pool2dGeometry): void {
    maxPool2dBackward(f32(dy), i32(argmax), f32(dx), geometry);
  }

  avgPool2dForward(x: Storage, out: Storage, geometry: Pool2dGeometry): void {
    avgPool2dForward(f32(x), f32(out), geometry);
  }

  avgPool2dBackward(dy: Storage, dx: Storage, geometry: Pool2dGeometry): void {
    avgPool2dBackward(f32(dy), f32(dx), geometry);
  }

  lrnForward(x: Storage, out: Storage, scale: Storage, shape: readonly number[], params: LrnParams): void {
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
    lrnBackward(f32(x), f32(y), f32(scale), f32(dy), f32(dx), shape, params);
  }

  sgdUpdate(param: Storage, grad: Storage, history: Storage, step: SgdStep): void {
    sgdUpdateKernel(f32(param), f32(grad), f32(history), step);
  }

  adamUpdate(param: Storage, grad: Storage, m: Storage, v: Storage, step: AdamStep): void {
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
