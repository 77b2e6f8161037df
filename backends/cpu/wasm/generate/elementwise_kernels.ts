/**
 * Generates the elementwise kernels that pay in WebAssembly: ReLU and its gradient, the per-channel
 * bias add and the row sums behind bias gradients. In TypeScript ReLU branches on the sign of each
 * value, and on activations that branch is a coin flip (≈ 4.5 ns per element here, most of it
 * mispredictions); lane-wise compares and blends do not branch. The bias add and the row sums are
 * memory-bound, and TypeScript's strided loops (one dependent float64 add per element for a sum)
 * ran them at a fraction of the bandwidth.
 *
 * Semantics are the TypeScript kernels', bit for bit: `relu(x) = x > 0 ? x : 0` is
 * `f32x4.pmax(0, x)` (which is `0 < x ? x : 0`: NaN and −0 give +0), and
 * `reluGrad(dy, y) = y > 0 ? dy : 0` is a blend of dy and 0 under `y > 0`.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, v128 } = ValType;

/**
 * Names under which {@link emitElementwiseKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { ELEMENTWISE_EXPORTS } from "./elementwise_kernels.ts";
 * console.log(ELEMENTWISE_EXPORTS.relu); // "relu"
 * ```
 */
export const ELEMENTWISE_EXPORTS = {
  /** `(x, out, n)`: out = relu(x) over n floats. */
  relu: "relu",
  /** `(dy, y, out, n)`: out = y > 0 ? dy : 0 over n floats. */
  reluGrad: "relu_grad",
  /**
   * `(x, bias, out, outer, channels, inner)`: `out[o, c, i] = x[o, c, i] + bias[c]` (one float32
   * rounding, as the TypeScript broadcast add).
   */
  addChannels: "add_channels",
  /**
   * `(c, bias, rows, columns, rowBytes, relu)`: in place, `c[r, j] = c[r, j] + bias[j]` over `rows`
   * rows `rowBytes` apart, then `relu(·)` when `relu` is not 0 (each the bits of the broadcast add
   * and of the `relu` kernel): a product's epilogue, run on the rows a thread just wrote.
   */
  biasRows: "bias_rows",
  /**
   * `(y, bias, channels, inner, relu)`: in place, `y[c, i] = y[c, i] + bias[c]` over `channels`
   * planes of `inner` floats, then `relu(·)` when `relu` is not 0, in one pass (each the bits of
   * `add_channels` and of the `relu` kernel): a convolution's epilogue on one image's output.
   */
  channelBias: "channel_bias",
  /**
   * `(x, out, rows, size)`: `out[r] = Σ_s x[r·size + s]`, accumulated in float64 (as the TypeScript
   * reduction) over four interleaved partial sums, then rounded once to float32.
   */
  sumRows: "sum_rows",
  /**
   * `(a, b, out, n, scale)`: `out = (a + b) · scale` over n floats, each operation rounded to
   * float32 (the device-order average's step; `out` may be `a`).
   */
  addScale: "add_scale",
  /** `(a, b, out, n)`: `out = a · b` over n floats (one float32 rounding, as the TypeScript `mul`). */
  mul: "mul",
  /**
   * `(x, n, first, slot)`: writes to the int32 at `slot` `first + i` for the first of the n floats
   * at `x` whose exponent bits are all ones (NaN with any payload, ±∞), or −1 when all are finite
   * (emitted by {@link emitFiniteKernel}).
   */
  firstNonFinite: "first_non_finite",
} as const;

/** The float32 exponent field: all ones exactly for NaN and ±∞. */
export const EXPONENT = 0x7f800000;

/** Vectors per trip of {@link writeLanes}' main loop. */
const UNROLL = 4;

/**
 * `for i in [0, n)`: four floats at a time ({@link UNROLL} vectors per loop trip, then one at a
 * time), then the tail one at a time in lane 0 (the same vector code, so the tail rounds and blends
 * exactly like the body). `body(offset, single, at)` computes the result vector of the element(s)
 * at byte `offset` (a local) plus `at` (a constant, for the unrolled vectors).
 */
function writeLanes(
  f: FunctionWriter,
  n: number,
  out: number,
  body: (offset: number, single: boolean, at: number) => void,
): void {
  const offset = f.local(i32), end = f.local(i32);
  f.localGet(n).i32Const(2).i32Shl().localSet(end);
  f.i32Const(0).localSet(offset);
  // Why unroll: a short body is bound by the loop's own compare, branch and address arithmetic.
  // On 256 KB in L2, one vector a trip ran the ReLU at 27 GB/s of output and the scaled sum at 20.5;
  // four, at 37 and 28.
  for (const vectors of [UNROLL, 1]) {
    f.block().loop();
    f.localGet(offset).i32Const(16 * vectors).i32Add().localGet(end).i32GtS().brIf(1);
    for (let v = 0; v < vectors; v++) {
      f.localGet(out).localGet(offset).i32Add();
      body(offset, false, 16 * v);
      f.v128Store(16 * v);
    }
    f.localGet(offset).i32Const(16 * vectors).i32Add().localSet(offset);
    f.br(0).end().end();
  }
  f.block().loop();
  f.localGet(offset).localGet(end).i32GeS().brIf(1);
  f.localGet(out).localGet(offset).i32Add();
  body(offset, true, 0);
  f.f32x4ExtractLane(0).f32Store();
  f.localGet(offset).i32Const(4).i32Add().localSet(offset);
  f.br(0).end().end();
}

/** Pushes the vector at `base + offset + at` (one float splat when `single`). */
function load(f: FunctionWriter, base: number, offset: number, single: boolean, at = 0): void {
  f.localGet(base).localGet(offset).i32Add();
  if (single) f.v128Load32Splat(at);
  else f.v128Load(at);
}

/**
 * Adds the elementwise kernels to `builder`, exported under {@link ELEMENTWISE_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitElementwiseKernels } from "./elementwise_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitElementwiseKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitElementwiseKernels(builder: ModuleBuilder): void {
  builder.addFunction(ELEMENTWISE_EXPORTS.relu, [i32, i32, i32], [], (f) => {
    const [x, out, n] = [0, 1, 2];
    const zero = f.local(v128);
    writeLanes(f, n, out, (offset, single, at) => {
      f.localGet(zero);
      load(f, x, offset, single, at);
      f.f32x4Pmax();
    });
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.reluGrad, [i32, i32, i32, i32], [], (f) => {
    const [dy, y, out, n] = [0, 1, 2, 3];
    const zero = f.local(v128);
    writeLanes(f, n, out, (offset, single, at) => {
      load(f, dy, offset, single, at);
      f.localGet(zero);
      load(f, y, offset, single, at);
      f.localGet(zero).f32x4Gt();
      f.v128Bitselect();
    });
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.addChannels, [i32, i32, i32, i32, i32, i32], [], (f) => {
    const [x, bias, out, outer, channels, inner] = [0, 1, 2, 3, 4, 5];
    const o = f.local(i32), c = f.local(i32), plane = f.local(i32), xPlane = f.local(i32);
    const outPlane = f.local(i32), b = f.local(v128);
    f.localGet(inner).i32Const(2).i32Shl().localSet(plane);
    f.localGet(x).localSet(xPlane);
    f.localGet(out).localSet(outPlane);
    f.forRange(o, () => f.i32Const(0), () => f.localGet(outer), 1, () => {
      f.forRange(c, () => f.i32Const(0), () => f.localGet(channels), 1, () => {
        f.localGet(bias).localGet(c).i32Const(2).i32Shl().i32Add().v128Load32Splat().localSet(b);
        writeLanes(f, inner, outPlane, (offset, single, at) => {
          load(f, xPlane, offset, single, at);
          f.localGet(b).f32x4Add();
        });
        f.localGet(xPlane).localGet(plane).i32Add().localSet(xPlane);
        f.localGet(outPlane).localGet(plane).i32Add().localSet(outPlane);
      });
    });
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.biasRows, [i32, i32, i32, i32, i32, i32], [], (f) => {
    const [c, bias, rows, columns, rowBytes, relu] = [0, 1, 2, 3, 4, 5];
    const r = f.local(i32), row = f.local(i32), zero = f.local(v128);
    const pass = (withRelu: boolean) => {
      f.localGet(c).localSet(row);
      f.forRange(r, () => f.i32Const(0), () => f.localGet(rows), 1, () => {
        writeLanes(f, columns, row, (offset, single, at) => {
          if (withRelu) f.localGet(zero);
          load(f, row, offset, single, at);
          load(f, bias, offset, single, at);
          f.f32x4Add();
          if (withRelu) f.f32x4Pmax();
        });
        f.localGet(row).localGet(rowBytes).i32Add().localSet(row);
      });
    };
    f.localGet(relu).if();
    pass(true);
    f.else();
    pass(false);
    f.end();
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.channelBias, [i32, i32, i32, i32, i32], [], (f) => {
    const [y, bias, channels, inner, relu] = [0, 1, 2, 3, 4];
    const c = f.local(i32), plane = f.local(i32), b = f.local(v128), zero = f.local(v128);
    const pass = (withRelu: boolean) => {
      f.localGet(y).localSet(plane);
      f.forRange(c, () => f.i32Const(0), () => f.localGet(channels), 1, () => {
        f.localGet(bias).localGet(c).i32Const(2).i32Shl().i32Add().v128Load32Splat().localSet(b);
        writeLanes(f, inner, plane, (offset, single, at) => {
          if (withRelu) f.localGet(zero);
          load(f, plane, offset, single, at);
          f.localGet(b).f32x4Add();
          if (withRelu) f.f32x4Pmax();
        });
        f.localGet(plane).localGet(inner).i32Const(2).i32Shl().i32Add().localSet(plane);
      });
    };
    f.localGet(relu).if();
    pass(true);
    f.else();
    pass(false);
    f.end();
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.sumRows, [i32, i32, i32, i32], [], (f) => {
    const [x, out, rows, size] = [0, 1, 2, 3];
    const r = f.local(i32), p = f.local(i32), end = f.local(i32), rowEnd = f.local(i32);
    const v = f.local(v128), a0 = f.local(v128), a1 = f.local(v128), a2 = f.local(v128);
    const a3 = f.local(v128), tail = f.local(ValType.f64);
    const zero = f.local(v128);
    f.localGet(x).localSet(p);
    f.forRange(r, () => f.i32Const(0), () => f.localGet(rows), 1, () => {
      for (const a of [a0, a1, a2, a3]) f.localGet(zero).localSet(a);
      f.localGet(p).localGet(size).i32Const(2).i32Shl().i32Add().localSet(rowEnd);
      f.localGet(rowEnd).i32Const(32).i32Sub().localSet(end);
      // Eight floats per step: lanes 0–1 and 2–3 of each vector into their own float64 pair.
      f.block().loop();
      f.localGet(p).localGet(end).i32GtS().brIf(1);
      for (const [at, lo, hi] of [[0, a0, a1], [16, a2, a3]] as const) {
        f.localGet(p).v128Load(at).localSet(v);
        f.localGet(lo).localGet(v).f64x2PromoteLowF32x4().f64x2Add().localSet(lo);
        f.localGet(hi).localGet(v).localGet(v).shuffleF32Lanes([2, 3, 0, 1]).f64x2PromoteLowF32x4().f64x2Add()
          .localSet(hi);
      }
      f.localGet(p).i32Const(32).i32Add().localSet(p);
      f.br(0).end().end();
      // The last < 8 floats one at a time.
      f.localGet(zero).f64x2ExtractLane(0).localSet(tail);
      f.block().loop();
      f.localGet(p).localGet(rowEnd).i32GeS().brIf(1);
      f.localGet(tail).localGet(p).f32Load().f64PromoteF32().f64Add().localSet(tail);
      f.localGet(p).i32Const(4).i32Add().localSet(p);
      f.br(0).end().end();
      f.localGet(a0).localGet(a2).f64x2Add().localGet(a1).localGet(a3).f64x2Add().f64x2Add().localSet(v);
      f.localGet(out).localGet(r).i32Const(2).i32Shl().i32Add();
      f.localGet(v).f64x2ExtractLane(0).localGet(v).f64x2ExtractLane(1).f64Add().localGet(tail).f64Add();
      f.f32DemoteF64().f32Store();
    });
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.addScale, [i32, i32, i32, i32, ValType.f32], [], (f) => {
    const [a, b, out, n, scale] = [0, 1, 2, 3, 4];
    const factor = f.local(v128);
    f.localGet(scale).f32x4Splat().localSet(factor);
    writeLanes(f, n, out, (offset, single, at) => {
      load(f, a, offset, single, at);
      load(f, b, offset, single, at);
      f.f32x4Add().localGet(factor).f32x4Mul();
    });
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.mul, [i32, i32, i32, i32], [], (f) => {
    const [a, b, out, n] = [0, 1, 2, 3];
    writeLanes(f, n, out, (offset, single, at) => {
      load(f, a, offset, single, at);
      load(f, b, offset, single, at);
      f.f32x4Mul();
    });
  });
}

/**
 * Adds `first_non_finite` (see {@link ELEMENTWISE_EXPORTS}). It is emitted last in the module, so
 * every other function keeps its index and its bytes. Sixteen floats a step: the four vectors'
 * exponent tests are or-ed, so one branch per 64 bytes leaves the loop at a cache line holding a
 * bad value; the scalar loop then finds the exact element, in index order, from the start of that
 * line (and scans the < 16 floats of the tail). Testing bits, not arithmetic, keeps subnormals,
 * ±0 and ±FLT_MAX finite and cannot trap or depend on float modes.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitFiniteKernel } from "./elementwise_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitFiniteKernel(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitFiniteKernel(builder: ModuleBuilder): void {
  builder.addFunction(ELEMENTWISE_EXPORTS.firstNonFinite, [i32, i32, i32, i32], [], (f) => {
    const [x, n, first, slot] = [0, 1, 2, 3];
    const offset = f.local(i32), end = f.local(i32), at = f.local(i32), exponent = f.local(v128);
    f.v128ConstI32([EXPONENT, EXPONENT, EXPONENT, EXPONENT]).localSet(exponent);
    f.localGet(n).i32Const(2).i32Shl().localSet(end);
    f.i32Const(0).localSet(offset);
    f.block().loop();
    f.localGet(offset).i32Const(64).i32Add().localGet(end).i32GtS().brIf(1);
    f.localGet(x).localGet(offset).i32Add().localSet(at);
    for (let k = 0; k < 4; k++) {
      f.localGet(at).v128Load(16 * k).localGet(exponent).v128And().localGet(exponent).i32x4Eq();
      if (k > 0) f.v128Or();
    }
    f.v128AnyTrue().brIf(1);
    f.localGet(offset).i32Const(64).i32Add().localSet(offset);
    f.br(0).end().end();
    f.block().loop();
    f.localGet(offset).localGet(end).i32GeS().brIf(1);
    f.localGet(x).localGet(offset).i32Add().i32Load().i32Const(EXPONENT).i32And().i32Const(EXPONENT).i32Eq();
    f.if();
    f.localGet(slot).localGet(first).localGet(offset).i32Const(2).i32ShrS().i32Add().i32Store();
    f.return();
    f.end();
    f.localGet(offset).i32Const(4).i32Add().localSet(offset);
    f.br(0).end().end();
    f.localGet(slot).i32Const(-1).i32Store();
  });
}
