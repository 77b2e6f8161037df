/**
 * Generates the fused optimizer updates (SGD with momentum, Adam) in WebAssembly SIMD, with the
 * TypeScript kernels' arithmetic bit for bit (`backends/cpu/optimizers.ts`): every product, sum,
 * quotient and square root is one float32 operation (`f32x4.mul`, `add`, `sub`, `div`, `sqrt`,
 * all correctly rounded, as `Math.fround` of the float64 result is for float32 operands), in the
 * same order, and never a fused multiply-add. A zero decay skips the decay term, as there.
 *
 * Why WebAssembly: the TypeScript loop rounds through float64 with `Math.fround` one element at a
 * time (≈ 2 ns per element); four lanes per instruction leave the update bound by memory.
 *
 * Each element is computed alone by the same instructions (the scalar tail runs the vector code
 * in lane 0), so splitting a range between threads never changes a bit.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";
import { EXPONENT } from "./elementwise_kernels.ts";

const { i32, f32, v128 } = ValType;

/**
 * Names under which {@link emitOptimizerKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { OPTIMIZER_EXPORTS } from "./optimizer_kernels.ts";
 * console.log(OPTIMIZER_EXPORTS.sgdUpdate); // "sgd_update"
 * ```
 */
export const OPTIMIZER_EXPORTS = {
  /**
   * `(param, grad, history, n, rate, momentum, decay, finite)`, rate to decay float32: Caffe SGD
   * over n floats in place, `diff = g + w·decay` (just g when decay is 0), `h = h·momentum +
   * diff·rate`, `w = w − h`; then, where `finite` is not 0, the int32 there is 1 when every new w
   * is finite and 0 when one is NaN or ±∞ (the runtime's finite check, in the same pass).
   */
  sgdUpdate: "sgd_update",
  /**
   * `(param, grad, history, savedParam, savedHistory, n, rate, momentum, decay, finite)`:
   * `sgd_update`, also storing each w and h it reads at `savedParam` and `savedHistory` (the copies
   * that undo the update), in the same pass: 7 streams over memory where copying first, then
   * updating, takes 9.
   */
  sgdUpdateSaving: "sgd_update_saving",
  /**
   * `(param, grad, m, v, n, beta1, beta2, oneMinusBeta1, oneMinusBeta2, decay, eps, root2,
   * step)`, the last eight float32 (`root2 = fround(√correction2)`, `step = fround(rate /
   * correction1)`): Adam over n floats in place, as `adamUpdateKernel`.
   */
  adamUpdate: "adam_update",
} as const;

/**
 * `for each element of [0, n)`: eight floats per iteration, then four, then one at a time in
 * lane 0. `body(constantOffset, single)` updates the element(s) at byte `constantOffset` past the
 * pointers, which advance by the bytes done; `pointers` are the i32 locals to advance.
 */
function forEachLanes(
  f: FunctionWriter,
  n: number,
  pointers: readonly number[],
  body: (constantOffset: number, single: boolean) => void,
): void {
  const remaining = f.local(i32);
  f.localGet(n).localSet(remaining);
  const advance = (bytes: number) => {
    for (const p of pointers) f.localGet(p).i32Const(bytes).i32Add().localSet(p);
    f.localGet(remaining).i32Const(bytes / 4).i32Sub().localSet(remaining);
  };
  for (const [floats, single] of [[8, false], [4, false], [1, true]] as const) {
    f.block().loop();
    f.localGet(remaining).i32Const(floats).i32LtS().brIf(1);
    for (let at = 0; at < floats; at += single ? 1 : 4) body(4 * at, single);
    advance(4 * floats);
    f.br(0).end().end();
  }
}

/** Pushes the vector at `pointer + offset` (one float splat when `single`). */
function load(f: FunctionWriter, pointer: number, offset: number, single: boolean): void {
  f.localGet(pointer);
  if (single) f.v128Load32Splat(offset);
  else f.v128Load(offset);
}

/** Stores `value` (a v128 local) at `pointer + offset` (lane 0 only when `single`). */
function store(f: FunctionWriter, pointer: number, offset: number, single: boolean, value: number): void {
  f.localGet(pointer).localGet(value);
  if (single) f.f32x4ExtractLane(0).f32Store(offset);
  else f.v128Store(offset);
}

/** Splats the f32 parameter `param` into a new v128 local. */
function splat(f: FunctionWriter, param: number): number {
  const local = f.local(v128);
  f.localGet(param).f32x4Splat().localSet(local);
  return local;
}

/**
 * The decayed gradient of both updates, as the TypeScript kernels compute it: loads w into `w`,
 * then `into = g + fround(w·d)` where the decay is on, else `g`.
 */
function decayedGradient(
  f: FunctionWriter,
  [param, grad]: readonly [number, number],
  at: number,
  single: boolean,
  w: number,
  d: number | undefined,
  into: number,
): void {
  load(f, param, at, single);
  f.localSet(w);
  load(f, grad, at, single);
  if (d !== undefined) f.localGet(w).localGet(d).f32x4Mul().f32x4Add();
  f.localSet(into);
}

/**
 * `loop(true)` where the decay parameter is not ±0 (`d !== 0` of the TypeScript kernels, true for
 * NaN), else `loop(false)`: decided once per call.
 */
function byDecay(f: FunctionWriter, decay: number, loop: (withDecay: boolean) => void): void {
  f.localGet(decay).f32Const(0).f32Ne().if();
  loop(true);
  f.else();
  loop(false);
  f.end();
}

/** `sgd_update`, or with `saving` `sgd_update_saving` (two more pointers after `history`). */
function writeSgd(f: FunctionWriter, saving: boolean): void {
  const [param, grad, history] = [0, 1, 2];
  const saved = saving ? [3, 4] : [];
  const [n, rate, momentum, decay, finite] = [3, 4, 5, 6, 7].map((i) => i + saved.length);
  const r = splat(f, rate), m = splat(f, momentum), d = splat(f, decay);
  const w = f.local(v128), diff = f.local(v128), h = f.local(v128);
  // Lanes whose new w had an all-ones exponent (NaN, ±∞), ORed over the pass.
  const exponent = f.local(v128), bad = f.local(v128);
  f.v128ConstI32([EXPONENT, EXPONENT, EXPONENT, EXPONENT]).localSet(exponent);
  f.v128ConstI32([0, 0, 0, 0]).localSet(bad);
  const loop = (withDecay: boolean) =>
    forEachLanes(f, n, [param, grad, history, ...saved], (at, single) => {
      // diff = g + fround(w·d): the order of the TypeScript kernel.
      decayedGradient(f, [param, grad], at, single, w, withDecay ? d : undefined, diff);
      load(f, history, at, single);
      if (saving) {
        f.localSet(h);
        store(f, saved[0], at, single, w);
        store(f, saved[1], at, single, h);
        f.localGet(h);
      }
      // h = fround(h·m) + fround(diff·r)
      f.localGet(m).f32x4Mul().localGet(diff).localGet(r).f32x4Mul().f32x4Add().localSet(h);
      store(f, history, at, single, h);
      f.localGet(w).localGet(h).f32x4Sub().localSet(w);
      store(f, param, at, single, w);
      f.localGet(bad).localGet(w).localGet(exponent).v128And().localGet(exponent).i32x4Eq().v128Or()
        .localSet(bad);
    });
  byDecay(f, decay, loop);
  f.localGet(finite).if();
  f.localGet(finite).i32Const(1).localGet(bad).v128AnyTrue().i32Sub().i32Store();
  f.end();
}

function writeAdam(f: FunctionWriter): void {
  const [param, grad, mParam, vParam, n] = [0, 1, 2, 3, 4];
  const [beta1, beta2, oneMinusB1, oneMinusB2, decay, eps, root2, step] = [5, 6, 7, 8, 9, 10, 11, 12];
  const b1 = splat(f, beta1), b2 = splat(f, beta2), c1 = splat(f, oneMinusB1), c2 = splat(f, oneMinusB2);
  const d = splat(f, decay), e = splat(f, eps), root = splat(f, root2), s = splat(f, step);
  const w = f.local(v128), g = f.local(v128), mi = f.local(v128), vi = f.local(v128);
  const loop = (withDecay: boolean) =>
    forEachLanes(f, n, [param, grad, mParam, vParam], (at, single) => {
      decayedGradient(f, [param, grad], at, single, w, withDecay ? d : undefined, g);
      // mi = fround(m·β1) + fround(g·(1 − β1))
      load(f, mParam, at, single);
      f.localGet(b1).f32x4Mul().localGet(g).localGet(c1).f32x4Mul().f32x4Add().localSet(mi);
      // vi = fround(v·β2) + fround(fround(g·g)·(1 − β2))
      load(f, vParam, at, single);
      f.localGet(b2).f32x4Mul().localGet(g).localGet(g).f32x4Mul().localGet(c2).f32x4Mul().f32x4Add()
        .localSet(vi);
      store(f, mParam, at, single, mi);
      store(f, vParam, at, single, vi);
      // w − fround(fround(mi / (fround(√vi / root2) + eps)) · step)
      f.localGet(w);
      f.localGet(mi);
      f.localGet(vi).f32x4Sqrt().localGet(root).f32x4Div().localGet(e).f32x4Add();
      f.f32x4Div().localGet(s).f32x4Mul();
      f.f32x4Sub().localSet(w);
      store(f, param, at, single, w);
    });
  byDecay(f, decay, loop);
}

/**
 * Adds the optimizer kernels to `builder`, exported under {@link OPTIMIZER_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitOptimizerKernels } from "./optimizer_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitOptimizerKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitOptimizerKernels(builder: ModuleBuilder): void {
  builder.addFunction(
    OPTIMIZER_EXPORTS.sgdUpdate,
    [i32, i32, i32, i32, f32, f32, f32, i32],
    [],
    (f) => writeSgd(f, false),
  );
  builder.addFunction(
    OPTIMIZER_EXPORTS.sgdUpdateSaving,
    [i32, i32, i32, i32, i32, i32, f32, f32, f32, i32],
    [],
    (f) => writeSgd(f, true),
  );
  builder.addFunction(
    OPTIMIZER_EXPORTS.adamUpdate,
    [i32, i32, i32, i32, i32, f32, f32, f32, f32, f32, f32, f32, f32],
    [],
    writeAdam,
  );
}
