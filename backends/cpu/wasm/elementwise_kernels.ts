/**
 * Generates the elementwise kernels that pay in WebAssembly: ReLU and its gradient. In TypeScript
 * both branch on the sign of each value, and on activations that branch is a coin flip (≈ 4.5 ns
 * per element here, most of it mispredictions); lane-wise compares and blends do not branch.
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
} as const;

/**
 * `for i in [0, n)`: four floats at a time, then the tail one at a time in lane 0 (the same
 * vector code, so the tail rounds and blends exactly like the body). `body(offset, single)`
 * computes the result vector of the element(s) at byte offset `offset` (a local).
 */
function writeLanes(
  f: FunctionWriter,
  n: number,
  out: number,
  body: (offset: number, single: boolean) => void,
): void {
  const offset = f.local(i32), end = f.local(i32);
  f.localGet(n).i32Const(2).i32Shl().localSet(end);
  f.i32Const(0).localSet(offset);
  f.block().loop();
  f.localGet(offset).i32Const(16).i32Add().localGet(end).i32GtS().brIf(1);
  f.localGet(out).localGet(offset).i32Add();
  body(offset, false);
  f.v128Store();
  f.localGet(offset).i32Const(16).i32Add().localSet(offset);
  f.br(0).end().end();
  f.block().loop();
  f.localGet(offset).localGet(end).i32GeS().brIf(1);
  f.localGet(out).localGet(offset).i32Add();
  body(offset, true);
  f.f32x4ExtractLane(0).f32Store();
  f.localGet(offset).i32Const(4).i32Add().localSet(offset);
  f.br(0).end().end();
}

/** Pushes the vector at `base + offset` (one float splat when `single`). */
function load(f: FunctionWriter, base: number, offset: number, single: boolean): void {
  f.localGet(base).localGet(offset).i32Add();
  if (single) f.v128Load32Splat();
  else f.v128Load();
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
    writeLanes(f, n, out, (offset, single) => {
      f.localGet(zero);
      load(f, x, offset, single);
      f.f32x4Pmax();
    });
  });
  builder.addFunction(ELEMENTWISE_EXPORTS.reluGrad, [i32, i32, i32, i32], [], (f) => {
    const [dy, y, out, n] = [0, 1, 2, 3];
    const zero = f.local(v128);
    writeLanes(f, n, out, (offset, single) => {
      load(f, dy, offset, single);
      f.localGet(zero);
      load(f, y, offset, single);
      f.localGet(zero).f32x4Gt();
      f.v128Bitselect();
    });
  });
}
