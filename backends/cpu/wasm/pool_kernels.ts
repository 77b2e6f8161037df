/**
 * Generates max pooling forward: per window, the first maximum in row-major order (a NaN wins and
 * stays), its value and its index within the plane — the TypeScript kernel's exact rule, so both
 * give the same bits and the same argmax.
 *
 * Why WebAssembly: a scalar max over a window branches on data, and on real activations that
 * branch is a coin flip; the TypeScript loop spends most of its time in mispredictions. Here
 * every comparison is lane-wise (`f32x4.gt`) and every choice a bitwise blend (`v128.bitselect`),
 * so nothing branches on data. Interior windows of stride-2 rows, the common layer, take four
 * outputs per step: two loads per tap de-interleaved by a shuffle into the columns of four
 * windows. Border windows and other strides run one window at a time in lane 0.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, v128 } = ValType;

/**
 * Names under which {@link emitPoolKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { POOL_EXPORTS } from "./pool_kernels.ts";
 * console.log(POOL_EXPORTS.maxForward); // "max_pool_forward"
 * ```
 */
export const POOL_EXPORTS = {
  /**
   * `(x, out, argmax, planes, H, W, OH, OW, kH, kW, sH, sW, pH, pW)`: max pooling forward of
   * `planes` planes.
   */
  maxForward: "max_pool_forward",
} as const;

const P = {
  x: 0,
  out: 1,
  argmax: 2,
  planes: 3,
  H: 4,
  W: 5,
  OH: 6,
  OW: 7,
  kH: 8,
  kW: 9,
  sH: 10,
  sW: 11,
  pH: 12,
  pW: 13,
} as const;

/** `dst = max(a, b)` etc. on i32 locals, without branches (a `select`). */
function minMax(f: FunctionWriter, dst: number, a: () => void, b: () => void, keepLarger: boolean): void {
  a();
  b();
  a();
  b();
  if (keepLarger) f.i32GtS();
  else f.i32LtS();
  f.select().localSet(dst);
}

function writeMaxForward(f: FunctionWriter): void {
  const p = f.local(i32), base = f.local(i32), oh = f.local(i32), ow = f.local(i32), h = f.local(i32);
  const w = f.local(i32), h0 = f.local(i32), hs = f.local(i32), he = f.local(i32), w0 = f.local(i32);
  const ws = f.local(i32), we = f.local(i32), idx = f.local(i32), i = f.local(i32), o = f.local(i32);
  const plane = f.local(i32);
  // Vector path locals: first and last output column whose window is inside the row, lane state.
  const owLo = f.local(i32), owHi = f.local(i32), row = f.local(i32);
  const bestV = f.local(v128), idxV = f.local(v128), vV = f.local(v128), takeV = f.local(v128);
  const lo = f.local(v128), hi = f.local(v128), tapIdx = f.local(v128), rowIdx = f.local(v128);
  const kh = f.local(i32), kw = f.local(i32);

  /**
   * Lane-wise: where v > best, or v is NaN and best is not, take v and its index. The value kept
   * is always some input's exact bits (the first maximum), so it is stored as is.
   */
  const take = () => {
    f.localGet(vV).localGet(bestV).f32x4Gt();
    f.localGet(vV).localGet(vV).f32x4Eq().v128Not().localGet(bestV).localGet(bestV).f32x4Eq().v128And();
    f.v128Or().localSet(takeV);
    f.localGet(tapIdx).localGet(idxV).localGet(takeV).v128Bitselect().localSet(idxV);
    f.localGet(vV).localGet(bestV).localGet(takeV).v128Bitselect().localSet(bestV);
  };

  /**
   * Window (oh, ow) alone, clipped to the input: the exact rule, branch-free, with the value and
   * index held in lane 0 of vectors (`v128.bitselect` is a plain bitwise blend, where scalar
   * `f32.max` and a float `select` compile to branches).
   */
  const scalarWindow = () => {
    f.localGet(ow).localGet(P.sW).i32Mul().localGet(P.pW).i32Sub().localSet(w0);
    minMax(f, ws, () => f.localGet(w0), () => f.i32Const(0), true);
    minMax(f, we, () => f.localGet(w0).localGet(P.kW).i32Add(), () => f.localGet(P.W), false);
    f.localGet(hs).localGet(P.W).i32Mul().localGet(ws).i32Add().localTee(idx).i32x4Splat().localSet(idxV);
    f.localGet(base).localGet(idx).i32Const(2).i32Shl().i32Add().v128Load32Splat().localSet(bestV);
    f.forRange(h, () => f.localGet(hs), () => f.localGet(he), 1, () => {
      f.forRange(w, () => f.localGet(ws), () => f.localGet(we), 1, () => {
        f.localGet(h).localGet(P.W).i32Mul().localGet(w).i32Add().localTee(i).i32x4Splat().localSet(tapIdx);
        f.localGet(base).localGet(i).i32Const(2).i32Shl().i32Add().v128Load32Splat().localSet(vV);
        take();
      });
    });
    f.localGet(P.out).localGet(o).i32Const(2).i32Shl().i32Add().localGet(bestV).f32x4ExtractLane(0)
      .f32Store();
    f.localGet(P.argmax).localGet(o).i32Const(2).i32Shl().i32Add().localGet(idxV).i32x4ExtractLane(0)
      .i32Store();
  };

  /**
   * Four interior windows (ow … ow+3) of a stride-2 row: for kernel column kw, lanes j of `lo`
   * and `hi` hold input columns kw + 2j and kw + 2j + 4 … of the first window, so shuffling the
   * even lanes of both gives that tap of all four windows. Kernel widths 2 and 3 (every common
   * layer) are unrolled; others loop.
   */
  const vectorWindows = () => {
    f.localGet(ow).i32Const(2).i32Mul().localGet(P.pW).i32Sub().localSet(w0);
    // Start from the first tap, then take each later tap lane-wise.
    f.localGet(hs).localGet(P.W).i32Mul().localGet(w0).i32Add().localSet(idx);
    f.localGet(idx).i32x4Splat().v128ConstI32([0, 2, 4, 6]).i32x4Add().localSet(idxV);
    f.localGet(base).localGet(idx).i32Const(2).i32Shl().i32Add().localSet(row);
    f.localGet(row).v128Load(0).localGet(row).v128Load(16).shuffleF32Lanes([0, 2, 4, 6]).localSet(bestV);
    /** Tap at column offset `column` (a constant, or the local kw when undefined) of this row. */
    const tap = (column: number | undefined) => {
      f.localGet(row);
      if (column === undefined) f.localGet(kw).i32Const(2).i32Shl().i32Add();
      f.localTee(i).v128Load(column === undefined ? 0 : column * 4).localSet(lo);
      f.localGet(i).v128Load(column === undefined ? 16 : column * 4 + 16).localSet(hi);
      f.localGet(lo).localGet(hi).shuffleF32Lanes([0, 2, 4, 6]).localSet(vV);
      f.localGet(rowIdx);
      if (column === undefined) f.localGet(kw).i32x4Splat().i32x4Add();
      else if (column > 0) f.v128ConstI32([column, column, column, column]).i32x4Add();
      f.localSet(tapIdx);
      take();
    };
    f.forRange(kh, () => f.i32Const(0), () => f.localGet(P.kH), 1, () => {
      f.localGet(hs).localGet(kh).i32Add().localGet(P.W).i32Mul().localGet(w0).i32Add().localSet(i);
      f.localGet(i).i32x4Splat().v128ConstI32([0, 2, 4, 6]).i32x4Add().localSet(rowIdx);
      f.localGet(base).localGet(i).i32Const(2).i32Shl().i32Add().localSet(row);
      f.localGet(P.kW).i32Const(3).i32Eq().if();
      for (let column = 0; column < 3; column++) tap(column);
      f.else();
      f.localGet(P.kW).i32Const(2).i32Eq().if();
      for (let column = 0; column < 2; column++) tap(column);
      f.else();
      f.forRange(kw, () => f.i32Const(0), () => f.localGet(P.kW), 1, () => tap(undefined));
      f.end();
      f.end();
    });
    f.localGet(P.out).localGet(o).i32Const(2).i32Shl().i32Add().localGet(bestV).v128Store();
    f.localGet(P.argmax).localGet(o).i32Const(2).i32Shl().i32Add().localGet(idxV).v128Store();
  };

  f.localGet(P.H).localGet(P.W).i32Mul().i32Const(2).i32Shl().localSet(plane);
  // Interior columns: ow·sW − pW ≥ 0 and ow·sW − pW + kW ≤ W. The vector loads also read odd
  // lanes a few columns past the last window (into the next row, or past the input's end, where
  // the caller leaves 64 bytes); those lanes are shuffled away, never compared.
  f.localGet(P.pW).localGet(P.sW).i32Add().i32Const(1).i32Sub().localGet(P.sW).i32DivS().localSet(owLo);
  f.localGet(P.W).localGet(P.pW).i32Add().localGet(P.kW).i32Sub().localTee(owHi).i32Const(0).i32LtS().if();
  f.i32Const(-1).localSet(owHi);
  f.else();
  f.localGet(owHi).localGet(P.sW).i32DivS().localSet(owHi);
  f.end();
  // owHi is the last interior column; make it one past, clamped to OW.
  f.localGet(owHi).i32Const(1).i32Add().localSet(owHi);
  minMax(f, owHi, () => f.localGet(owHi), () => f.localGet(P.OW), false);
  f.localGet(P.sW).i32Const(2).i32Ne().if().i32Const(0).localSet(owHi).end();

  f.i32Const(0).localSet(o);
  f.localGet(P.x).localSet(base);
  f.forRange(p, () => f.i32Const(0), () => f.localGet(P.planes), 1, () => {
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(P.OH), 1, () => {
      f.localGet(oh).localGet(P.sH).i32Mul().localGet(P.pH).i32Sub().localSet(h0);
      minMax(f, hs, () => f.localGet(h0), () => f.i32Const(0), true);
      minMax(f, he, () => f.localGet(h0).localGet(P.kH).i32Add(), () => f.localGet(P.H), false);
      f.i32Const(0).localSet(ow);
      f.block().loop();
      f.localGet(ow).localGet(P.OW).i32GeS().brIf(1);
      // Four interior windows of a full-height row at once where possible.
      f.localGet(ow).localGet(owLo).i32GeS();
      f.localGet(ow).i32Const(4).i32Add().localGet(owHi).i32LeS().i32And();
      f.localGet(he).localGet(hs).i32Sub().localGet(P.kH).i32Eq().i32And();
      f.if();
      vectorWindows();
      f.localGet(ow).i32Const(4).i32Add().localSet(ow);
      f.localGet(o).i32Const(4).i32Add().localSet(o);
      f.else();
      scalarWindow();
      f.localGet(ow).i32Const(1).i32Add().localSet(ow);
      f.localGet(o).i32Const(1).i32Add().localSet(o);
      f.end();
      f.br(0).end().end();
    });
    f.localGet(base).localGet(plane).i32Add().localSet(base);
  });
}

/**
 * Adds the pooling kernels to `builder`, exported under {@link POOL_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitPoolKernels } from "./pool_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitPoolKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitPoolKernels(builder: ModuleBuilder): void {
  builder.addFunction(POOL_EXPORTS.maxForward, Array(14).fill(i32), [], writeMaxForward);
}
