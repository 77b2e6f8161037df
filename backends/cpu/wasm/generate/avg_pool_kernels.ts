/**
 * Generates average pooling (Caffe's AVE: the divisor is the window clipped to the padded input)
 * with the TypeScript kernels' float64 arithmetic and order, so its bits are theirs too. Forward
 * sums each window in float64 on max pooling's four-window stride-2 path (`max_pool_kernels.ts`;
 * two float64 pairs), then divides by the window's divisor. Backward gathers instead of scattering:
 * each dx element adds the shares `dy / divisor` of the windows covering it in the scatter's order,
 * each add rounded to float32, in a register, and is stored once (no zero-fill, no
 * read-modify-write); stride-2 rows go four columns at a time, even and odd columns in separate
 * float64 pairs, since the odd ones lie in one window fewer of each output row when the kernel is 3
 * wide. Both are bound by the float32 ↔ float64 conversions, which is why the backward keeps them
 * to one per add.
 *
 * The exported helpers compute what the kernels take besides the tensors: the windows' divisors
 * ({@link avgPoolDivisors}) and the layout of backward's share table ({@link avgPoolShareRow},
 * {@link avgPoolShareBytes}).
 *
 * @module
 */

import type { Pool2dGeometry } from "../../../geometry.ts";
import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";
import { dispatchWindowGroup, minMax, windowParameters } from "./max_pool_kernels.ts";

const { i32, v128 } = ValType;

/**
 * Names under which {@link emitAvgPoolKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { AVG_POOL_EXPORTS } from "./avg_pool_kernels.ts";
 * console.log(AVG_POOL_EXPORTS.avgForward); // "avg_pool_forward"
 * ```
 */
export const AVG_POOL_EXPORTS = {
  /**
   * `(x, out, divisors, planes, H, W, OH, OW, kH, kW, sH, sW, pH, pW)`: average pooling forward of
   * `planes` planes; `divisors` holds each window's float64 divisor ({@link avgPoolDivisors}).
   */
  avgForward: "avg_pool_forward",
  /**
   * `(dy, dx, divisors, shares, shareRow, planes, H, W, OH, OW, kH, kW, sH, sW, pH, pW)`: average
   * pooling backward of `planes` planes, dx overwritten; `shares` is scratch of
   * {@link avgPoolShareBytes} bytes, `shareRow` is {@link avgPoolShareRow}.
   */
  avgBackward: "avg_pool_backward",
} as const;

/**
 * Each window's divisor as the TypeScript kernel computes it, `(h1 − h0)·(w1 − w0)` over the
 * window clipped to the padded input (Caffe's AVE pooling), row-major over the output plane: the
 * average pooling kernels divide by these float64 values, as the TypeScript kernels do.
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../../../geometry.ts";
 * import { avgPoolDivisors } from "./avg_pool_kernels.ts";
 * const g = pool2dGeometry([1, 1, 16, 16], { kernel: 3, stride: 2 }); // 8×8 out (ceil)
 * console.log(avgPoolDivisors(g)[7]); // 6: the last column's windows are 3×2
 * ```
 */
export function avgPoolDivisors(g: Pool2dGeometry): Float64Array {
  const { inHeight: H, inWidth: W, outHeight: OH, outWidth: OW } = g;
  const out = new Float64Array(OH * OW);
  for (let oh = 0; oh < OH; oh++) {
    const h0 = oh * g.strideH - g.padH, h1 = Math.min(h0 + g.kernelH, H + g.padH);
    for (let ow = 0; ow < OW; ow++) {
      const w0 = ow * g.strideW - g.padW, w1 = Math.min(w0 + g.kernelW, W + g.padW);
      out[oh * OW + ow] = (h1 - h0) * (w1 - w0);
    }
  }
  return out;
}

/**
 * Float64 entries of one row of average pooling backward's share table: ⌈kW / sW⌉ − 1 zeros, the
 * output row's shares `dy / divisor`, then zeros as far as the last input column's latest window
 * reaches (so that windows before the first and past the last read zeros).
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../../../geometry.ts";
 * import { avgPoolShareRow } from "./avg_pool_kernels.ts";
 * console.log(avgPoolShareRow(pool2dGeometry([1, 1, 16, 16], { kernel: 3, stride: 2 }))); // 9
 * ```
 */
export function avgPoolShareRow(g: Pool2dGeometry): number {
  const rounds = Math.ceil(g.kernelW / g.strideW);
  return rounds - 1 + Math.max(g.outWidth, Math.floor((g.inWidth - 1 + g.padW) / g.strideW) + 1);
}

/**
 * Bytes of scratch one thread's average pooling backward needs: a share row per output row, in
 * whole cache lines.
 *
 * @example
 * ```ts
 * import { pool2dGeometry } from "../../../geometry.ts";
 * import { avgPoolShareBytes } from "./avg_pool_kernels.ts";
 * console.log(avgPoolShareBytes(pool2dGeometry([1, 1, 16, 16], { kernel: 3, stride: 2 }))); // 576
 * ```
 */
export function avgPoolShareBytes(g: Pool2dGeometry): number {
  return Math.ceil((8 * avgPoolShareRow(g) * g.outHeight) / 64) * 64;
}

/**
 * Average pooling forward, the TypeScript kernel's arithmetic: per window a float64 sum from +0
 * over its in-bounds taps, rows top to bottom and each row left to right, divided by the window's
 * float64 divisor and rounded once to float32. Such a sum is never −0, so a tap replaced by +0 (a
 * masked lane) leaves it unchanged, NaNs and infinities included.
 *
 * Stride-2 rows take four windows per step (those of max pooling: two loads per input row,
 * de-interleaved, hold a tap of four neighbouring windows; taps past the right edge masked to +0;
 * the row's last group moved back to end with the row, a row of fewer than four windows stored in
 * part), summed in two float64 pairs. Windows in the left padding, other strides and kernels wider
 * than 8 run one at a time in lane 0. There are no strips: a window's sum must run through its
 * taps in order, so a row's partial sum cannot be shared with the next window.
 */
function writeAvgForward(f: FunctionWriter): void {
  const A = { x: 0, out: 1, divisors: 2, ...windowParameters(3) } as const;
  const p = f.local(i32), base = f.local(i32), outBase = f.local(i32), oh = f.local(i32), ow = f.local(i32);
  const h = f.local(i32), w = f.local(i32), h0 = f.local(i32), hs = f.local(i32), he = f.local(i32);
  const w0 = f.local(i32), ws = f.local(i32), we = f.local(i32), row = f.local(i32), kw = f.local(i32);
  const vecStart = f.local(i32), lastGroup = f.local(i32), group = f.local(i32), column = f.local(i32);
  const needMasks = f.local(i32), plane = f.local(i32), outPlane = f.local(i32), at = f.local(i32);
  const zero = f.local(v128), sumLo = f.local(v128), sumHi = f.local(v128), lo = f.local(v128);
  const hi = f.local(v128), even = f.local(v128), columnsF = f.local(v128), limit1 = f.local(v128);
  const limit2 = f.local(v128), mask1 = f.local(v128), mask2 = f.local(v128), maskV = f.local(v128);
  const result = f.local(v128);

  /**
   * Adds tap `v` (a local: one float per window, lanes where `mask` is clear taken as +0) to the
   * sums of windows 0–1 (`sumLo`) and 2–3 (`sumHi`), in float64: `sum + x`, as `sum += x`.
   */
  const addTap = (v: number, mask?: number) => {
    if (mask !== undefined) f.localGet(v).localGet(mask).v128And().localSet(v);
    f.localGet(sumLo).localGet(v).f64x2PromoteLowF32x4().f64x2Add().localSet(sumLo);
    f.localGet(sumHi).localGet(v).localGet(v).shuffleF32Lanes([2, 3, 0, 1]).f64x2PromoteLowF32x4().f64x2Add()
      .localSet(sumHi);
  };

  /** Window (oh, ow) alone in lane 0, over its in-bounds taps: the TypeScript loop as it stands. */
  const scalarWindow = () => {
    f.localGet(ow).localGet(A.sW).i32Mul().localGet(A.pW).i32Sub().localSet(w0);
    minMax(f, ws, () => f.localGet(w0), () => f.i32Const(0), true);
    minMax(f, we, () => f.localGet(w0).localGet(A.kW).i32Add(), () => f.localGet(A.W), false);
    f.localGet(zero).localSet(sumLo);
    f.forRange(h, () => f.localGet(hs), () => f.localGet(he), 1, () => {
      f.localGet(base).localGet(h).localGet(A.W).i32Mul().i32Const(2).i32Shl().i32Add().localSet(row);
      f.forRange(w, () => f.localGet(ws), () => f.localGet(we), 1, () => {
        f.localGet(sumLo).localGet(row).localGet(w).i32Const(2).i32Shl().i32Add().v128Load32Zero();
        f.f64x2PromoteLowF32x4().f64x2Add().localSet(sumLo);
      });
    });
    f.localGet(oh).localGet(A.OW).i32Mul().localGet(ow).i32Add().localSet(at);
    f.localGet(outBase).localGet(at).i32Const(2).i32Shl().i32Add();
    f.localGet(sumLo).localGet(A.divisors).localGet(at).i32Const(3).i32Shl().i32Add().v128Load64Zero();
    f.f64x2Div().f32x4DemoteF64x2Zero().v128Store32Lane(0, 0);
  };

  /**
   * The four windows at output columns group … group + 3 of output row oh (stride 2), into
   * `result`: per input row, tap kw of the four windows is the even lanes of the eight floats from
   * column kw on (kernel widths 2 and 3 share two loads per row; tap 2 is tap 0 moved on by one
   * window); with `masked`, taps past the row's end count as +0.
   */
  const windows = (width: 2 | 3 | undefined, masked: boolean) => {
    f.localGet(group).i32Const(1).i32Shl().localGet(A.pW).i32Sub().localSet(column);
    if (masked) {
      f.localGet(column).i32x4Splat().v128ConstI32([0, 2, 4, 6]).i32x4Add().f32x4ConvertI32x4S().localSet(
        columnsF,
      );
      if (width !== undefined) f.localGet(columnsF).localGet(limit1).f32x4Lt().localSet(mask1);
      if (width === 3) f.localGet(columnsF).localGet(limit2).f32x4Lt().localSet(mask2);
    }
    f.localGet(zero).localSet(sumLo);
    f.localGet(zero).localSet(sumHi);
    f.localGet(base).localGet(hs).localGet(A.W).i32Mul().localGet(column).i32Add().i32Const(2).i32Shl()
      .i32Add()
      .localSet(row);
    f.forRange(h, () => f.localGet(hs), () => f.localGet(he), 1, () => {
      if (width !== undefined) {
        f.localGet(row).v128Load(0).localSet(lo);
        f.localGet(row).v128Load(16).localSet(hi);
        f.localGet(lo).localGet(hi).shuffleF32Lanes([0, 2, 4, 6]).localSet(even);
        f.localGet(lo).localGet(hi).shuffleF32Lanes([1, 3, 5, 7]).localSet(lo);
        addTap(even);
        addTap(lo, masked ? mask1 : undefined);
        if (width === 3) {
          f.localGet(even).localGet(row).v128Load32Splat(32).shuffleF32Lanes([1, 2, 3, 4]).localSet(hi);
          addTap(hi, masked ? mask2 : undefined);
        }
      } else {
        f.forRange(kw, () => f.i32Const(0), () => f.localGet(A.kW), 1, () => {
          f.localGet(row).localGet(kw).i32Const(2).i32Shl().i32Add().localTee(at).v128Load(0);
          f.localGet(at).v128Load(16).shuffleF32Lanes([0, 2, 4, 6]).localSet(even);
          if (masked) {
            f.localGet(columnsF).localGet(A.W).localGet(kw).i32Sub().f32ConvertI32S().f32x4Splat().f32x4Lt();
            f.localSet(maskV);
          }
          addTap(even, masked ? maskV : undefined);
        });
      }
      f.localGet(row).localGet(A.W).i32Const(2).i32Shl().i32Add().localSet(row);
    });
    // Lanes past OW (a short row's group) divide by whatever follows; they are never stored.
    f.localGet(A.divisors).localGet(oh).localGet(A.OW).i32Mul().localGet(group).i32Add().i32Const(3).i32Shl()
      .i32Add().localSet(at);
    f.localGet(sumLo).localGet(at).v128Load(0).f64x2Div().f32x4DemoteF64x2Zero();
    f.localGet(sumHi).localGet(at).v128Load(16).f64x2Div().f32x4DemoteF64x2Zero();
    f.shuffleF32Lanes([0, 1, 4, 5]).localSet(result);
  };

  /** {@link windows} for the kernel width, masked where the group's last window passes the edge. */
  const anyWindows = () => dispatchWindowGroup(f, { group, needMasks, pW: A.pW, kW: A.kW, W: A.W }, windows);

  /** Pushes the address of output (oh, group). */
  const outAt = () => {
    f.localGet(outBase).localGet(oh).localGet(A.OW).i32Mul().localGet(group).i32Add().i32Const(2).i32Shl()
      .i32Add();
  };

  f.localGet(A.H).localGet(A.W).i32Mul().i32Const(2).i32Shl().localSet(plane);
  f.localGet(A.OH).localGet(A.OW).i32Mul().i32Const(2).i32Shl().localSet(outPlane);
  // The vector path: as max pooling's (stride-2 rows from the first window not in the left
  // padding, every window starting inside the row, kernels at most 8 wide, so that loads read at
  // most 14 floats past a row's end, within the 64 bytes the caller leaves).
  f.localGet(A.OW).localSet(vecStart);
  f.localGet(A.sW).i32Const(2).i32Eq();
  f.localGet(A.kW).i32Const(8).i32LeS().i32And();
  f.localGet(A.OW).i32Const(1).i32Sub().i32Const(1).i32Shl().localGet(A.pW).i32Sub().localGet(A.W).i32LtS();
  f.i32And().if();
  f.localGet(A.pW).i32Const(1).i32Add().i32Const(1).i32ShrS().localSet(vecStart);
  f.end();
  f.localGet(A.OW).i32Const(4).i32Sub().localSet(lastGroup);
  f.localGet(A.W).i32Const(1).i32Sub().f32ConvertI32S().f32x4Splat().localSet(limit1);
  f.localGet(A.W).i32Const(2).i32Sub().f32ConvertI32S().f32x4Splat().localSet(limit2);

  f.localGet(A.x).localSet(base);
  f.localGet(A.out).localSet(outBase);
  f.forRange(p, () => f.i32Const(0), () => f.localGet(A.planes), 1, () => {
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(A.OH), 1, () => {
      f.localGet(oh).localGet(A.sH).i32Mul().localGet(A.pH).i32Sub().localSet(h0);
      minMax(f, hs, () => f.localGet(h0), () => f.i32Const(0), true);
      minMax(f, he, () => f.localGet(h0).localGet(A.kH).i32Add(), () => f.localGet(A.H), false);
      f.forRange(ow, () => f.i32Const(0), () => f.localGet(vecStart), 1, scalarWindow);
      // Groups of four from vecStart on, the last moved back to end at OW; fewer than four
      // windows: one group, stored in part.
      f.localGet(vecStart).localGet(A.OW).i32LtS().if();
      f.localGet(lastGroup).localGet(vecStart).i32GeS().if();
      f.forRange(ow, () => f.localGet(vecStart), () => f.localGet(A.OW), 4, () => {
        minMax(f, group, () => f.localGet(ow), () => f.localGet(lastGroup), false);
        anyWindows();
        outAt();
        f.localGet(result).v128Store();
      });
      f.else();
      f.localGet(vecStart).localSet(group);
      anyWindows();
      for (const lane of [0, 1, 2]) {
        if (lane > 0) f.localGet(A.OW).localGet(group).i32Sub().i32Const(lane).i32GtS().if();
        outAt();
        f.localGet(result).v128Store32Lane(4 * lane, lane);
        if (lane > 0) f.end();
      }
      f.end();
      f.end();
    });
    f.localGet(base).localGet(plane).i32Add().localSet(base);
    f.localGet(outBase).localGet(outPlane).i32Add().localSet(outBase);
  });
}

/**
 * Average pooling backward, the TypeScript kernel's bits without its scatter: that kernel adds
 * `share = dy / divisor` (float64) into each in-bounds tap of window after window in output order,
 * each add rounded to float32; so each dx element receives the shares of the windows covering it
 * in output order — output rows in order, and within one the columns in order. Here each element
 * gathers them in that order in a register, starting from +0 (the zero-fill), and is stored once.
 *
 * Per plane, the shares go first into a table of rows (see {@link avgPoolShareRow}) padded with
 * zeros, so that in "round" r of an output row every input column u (counted from the padded
 * edge) adds entry ⌊u / sW⌋ + r: the window ⌈kW / sW⌉ − 1 − r before the latest covering it, or a
 * zero where that window lies outside the plane; a tap past the kernel's width (the window does
 * not reach u) adds +0 too. A dx element is never −0 (it starts at +0), so adding +0 changes
 * nothing. Stride-2 rows take four columns at a time, in two float64 pairs; the rest, and other
 * strides, one column at a time in lane 0.
 */
function writeAvgBackward(f: FunctionWriter): void {
  const A = { dy: 0, dx: 1, divisors: 2, shares: 3, shareRow: 4, ...windowParameters(5) } as const;
  const p = f.local(i32), oh = f.local(i32), ow = f.local(i32), h = f.local(i32), w = f.local(i32);
  const u = f.local(i32), q = f.local(i32), m = f.local(i32), r = f.local(i32), k = f.local(i32);
  const rounds = f.local(i32), rowBytes = f.local(i32), ohLo = f.local(i32), ohHi = f.local(i32);
  const wStart = f.local(i32), wEnd = f.local(i32), rowDx = f.local(i32), at = f.local(i32), o = f.local(i32);
  const sRow = f.local(i32), dy = f.local(i32), dx = f.local(i32);
  const zero = f.local(v128), even = f.local(v128), odd = f.local(v128), d = f.local(v128);
  const firstMask = f.local(v128), ones = f.local(v128), mask = f.local(v128);

  /** `acc = f64(f32(acc + share))`: one of the TypeScript kernel's `dx += share`. */
  const addShare = (acc: number, share: () => void) => {
    f.localGet(acc);
    share();
    f.f64x2Add().f32x4DemoteF64x2Zero().f64x2PromoteLowF32x4().localSet(acc);
  };

  /** Output rows [ohLo, ohHi) whose windows cover input row h. */
  const coveringRows = () => {
    f.localGet(h).localGet(A.pH).i32Add().localSet(u);
    // ⌈(u − kH + 1) / sH⌉ and ⌊u / sH⌋ + 1, by shifts for stride 2; div_s rounds a negative
    // quotient up, to at most 0, which the max makes 0 as the floor's would be.
    f.localGet(A.sH).i32Const(2).i32Eq().if();
    f.localGet(u).localGet(A.kH).i32Sub().i32Const(2).i32Add().i32Const(1).i32ShrS().localSet(ohLo);
    f.localGet(u).i32Const(1).i32ShrS().localSet(ohHi);
    f.else();
    f.localGet(u).localGet(A.kH).i32Sub().localGet(A.sH).i32Add().localGet(A.sH).i32DivS().localSet(ohLo);
    f.localGet(u).localGet(A.sH).i32DivS().localSet(ohHi);
    f.end();
    minMax(f, ohLo, () => f.localGet(ohLo), () => f.i32Const(0), true);
    minMax(f, ohHi, () => f.localGet(ohHi).i32Const(1).i32Add(), () => f.localGet(A.OH), false);
  };

  /** Element (h, w) alone in lane 0, any stride. */
  const scalarElement = () => {
    f.localGet(w).localGet(A.pW).i32Add().localTee(u).localGet(A.sW).i32DivS().localSet(q);
    f.localGet(u).localGet(q).localGet(A.sW).i32Mul().i32Sub().localSet(m);
    f.localGet(zero).localSet(d);
    f.forRange(oh, () => f.localGet(ohLo), () => f.localGet(ohHi), 1, () => {
      f.localGet(A.shares).localGet(oh).localGet(rowBytes).i32Mul().i32Add().localGet(q).i32Const(3).i32Shl()
        .i32Add().localSet(at);
      // Tap of round 0 (the earliest window); each round's window is one stride later.
      f.localGet(m).localGet(rounds).i32Const(1).i32Sub().localGet(A.sW).i32Mul().i32Add().localSet(k);
      f.forRange(r, () => f.i32Const(0), () => f.localGet(rounds), 1, () => {
        addShare(d, () => {
          f.localGet(at).v128Load64Zero();
          f.i32Const(0).localGet(k).localGet(A.kW).i32LtS().i32Sub().i32x4Splat().v128And();
        });
        f.localGet(at).i32Const(8).i32Add().localSet(at);
        f.localGet(k).localGet(A.sW).i32Sub().localSet(k);
      });
    });
    f.localGet(rowDx).localGet(w).i32Const(2).i32Shl().i32Add();
    f.localGet(d).f32x4DemoteF64x2Zero().v128Store32Lane(0, 0);
  };

  /**
   * Stride 2: columns w … w + 3 (u = w + pW even), the even ones (u, u + 2) in `even`, the odd
   * ones in `odd`: in round r both pairs take entries u/2 + r and u/2 + 1 + r, one load from the
   * share row at `at` (entry u/2), for `rows` covering output rows (each a share row further). An
   * odd column lies past the kernel's width in round 0 when the width is odd (its tap would be kW):
   * the odd pair skips that round (the generic width adds it cleared by `firstMask`). The final
   * rounding of each pair is kept as float32 where the last round is known.
   */
  const vectorColumns = (width: 2 | 3 | undefined, rows: 1 | 2 | undefined) => {
    const known = width !== undefined && rows !== undefined;
    /** `acc = f32(acc + shares)` for the pair at `at + offset`; `last`: left in float32 lanes 0–1. */
    const add = (acc: number, offset: number, last: boolean, masked = false) => {
      f.localGet(acc).localGet(at).v128Load(offset);
      if (masked) f.localGet(mask).v128And();
      f.f64x2Add().f32x4DemoteF64x2Zero();
      if (!last) f.f64x2PromoteLowF32x4();
      f.localSet(acc);
    };
    const outputRow = (last: boolean) => {
      if (width === 3) {
        add(even, 0, false);
        add(even, 8, last);
        add(odd, 8, last);
      } else if (width === 2) {
        add(even, 0, last);
        add(odd, 0, last);
      } else {
        f.localGet(at).localSet(k);
        f.localGet(firstMask).localSet(mask);
        f.forRange(r, () => f.i32Const(0), () => f.localGet(rounds), 1, () => {
          add(even, 0, false);
          add(odd, 0, false, true);
          f.localGet(ones).localSet(mask);
          f.localGet(at).i32Const(8).i32Add().localSet(at);
        });
        f.localGet(k).localSet(at);
      }
    };
    f.forRange(w, () => f.localGet(wStart), () => f.localGet(wEnd), 4, () => {
      f.localGet(zero).localSet(even);
      f.localGet(zero).localSet(odd);
      f.localGet(sRow).localSet(at);
      if (rows === 1) outputRow(known);
      else if (rows === 2) {
        outputRow(false);
        f.localGet(at).localGet(rowBytes).i32Add().localSet(at);
        outputRow(known);
      } else {
        f.forRange(oh, () => f.localGet(ohLo), () => f.localGet(ohHi), 1, () => {
          outputRow(false);
          f.localGet(at).localGet(rowBytes).i32Add().localSet(at);
        });
      }
      if (!known) {
        // Exact: the pairs already hold float32 values.
        f.localGet(even).f32x4DemoteF64x2Zero().localSet(even);
        f.localGet(odd).f32x4DemoteF64x2Zero().localSet(odd);
      }
      f.localGet(rowDx).localGet(w).i32Const(2).i32Shl().i32Add();
      f.localGet(even).localGet(odd).shuffleF32Lanes([0, 4, 1, 5]).v128Store();
      // The next four columns start two windows on.
      f.localGet(sRow).i32Const(16).i32Add().localSet(sRow);
    });
  };

  /** {@link vectorColumns} for the kernel width and the number of covering rows. */
  const vectorRow = (width: 2 | 3 | undefined) => {
    f.localGet(A.shares).localGet(ohLo).localGet(rowBytes).i32Mul().i32Add();
    f.localGet(wStart).localGet(A.pW).i32Add().i32Const(1).i32ShrS().i32Const(3).i32Shl().i32Add().localSet(
      sRow,
    );
    f.localGet(ohHi).localGet(ohLo).i32Sub().localTee(k).i32Const(1).i32Eq().if();
    vectorColumns(width, 1);
    f.else();
    f.localGet(k).i32Const(2).i32Eq().if();
    vectorColumns(width, 2);
    f.else();
    vectorColumns(width, undefined);
    f.end();
    f.end();
  };

  /** The plane's dx, row by row, for the kernel width (as {@link vectorColumns} takes it). */
  const planeRows = (width: 2 | 3 | undefined) => {
    f.forRange(h, () => f.i32Const(0), () => f.localGet(A.H), 1, () => {
      coveringRows();
      f.localGet(dx).localGet(h).localGet(A.W).i32Mul().i32Const(2).i32Shl().i32Add().localSet(rowDx);
      f.forRange(w, () => f.i32Const(0), () => f.localGet(wStart), 1, scalarElement);
      vectorRow(width);
      f.forRange(w, () => f.localGet(wEnd), () => f.localGet(A.W), 1, scalarElement);
    });
  };

  f.localGet(A.kW).localGet(A.sW).i32Add().i32Const(1).i32Sub().localGet(A.sW).i32DivS().localSet(rounds);
  f.localGet(A.shareRow).i32Const(3).i32Shl().localSet(rowBytes);
  f.localGet(A.shares).i32Const(0).localGet(rowBytes).localGet(A.OH).i32Mul().memoryFill();
  f.localGet(A.W).localSet(wStart);
  f.localGet(A.W).localSet(wEnd);
  f.localGet(A.sW).i32Const(2).i32Eq().if();
  f.localGet(A.pW).i32Const(1).i32And().localSet(wStart);
  f.localGet(A.W).localGet(A.W).localGet(wStart).i32Sub().i32Const(3).i32And().i32Sub().localSet(wEnd);
  f.end();
  f.v128ConstI32([-1, -1, -1, -1]).localSet(ones);
  f.localGet(zero).localGet(ones).localGet(A.kW).i32Const(1).i32And().select().localSet(firstMask);
  f.localGet(A.dy).localSet(dy);
  f.localGet(A.dx).localSet(dx);
  f.forRange(p, () => f.i32Const(0), () => f.localGet(A.planes), 1, () => {
    // The plane's shares, dy / divisor in float64, two at a time.
    f.i32Const(0).localSet(o);
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(A.OH), 1, () => {
      f.localGet(A.shares).localGet(oh).localGet(rowBytes).i32Mul().i32Add().localGet(rounds).i32Const(1)
        .i32Sub()
        .i32Const(3).i32Shl().i32Add().localSet(sRow);
      f.forRange(ow, () => f.i32Const(0), () => f.localGet(A.OW).i32Const(1).i32Sub(), 2, () => {
        f.localGet(sRow).localGet(ow).i32Const(3).i32Shl().i32Add();
        f.localGet(dy).localGet(o).localGet(ow).i32Add().i32Const(2).i32Shl().i32Add().v128Load64Zero()
          .f64x2PromoteLowF32x4();
        f.localGet(A.divisors).localGet(o).localGet(ow).i32Add().i32Const(3).i32Shl().i32Add().v128Load(0);
        f.f64x2Div().v128Store();
      });
      f.localGet(ow).localGet(A.OW).i32LtS().if();
      f.localGet(sRow).localGet(ow).i32Const(3).i32Shl().i32Add();
      f.localGet(dy).localGet(o).localGet(ow).i32Add().i32Const(2).i32Shl().i32Add().v128Load32Zero()
        .f64x2PromoteLowF32x4();
      f.localGet(A.divisors).localGet(o).localGet(ow).i32Add().i32Const(3).i32Shl().i32Add().v128Load64Zero();
      f.f64x2Div().v128Store64Lane(0, 0);
      f.end();
      f.localGet(o).localGet(A.OW).i32Add().localSet(o);
    });
    f.localGet(A.kW).i32Const(3).i32Eq().if();
    planeRows(3);
    f.else();
    f.localGet(A.kW).i32Const(2).i32Eq().if();
    planeRows(2);
    f.else();
    planeRows(undefined);
    f.end();
    f.end();
    f.localGet(dy).localGet(A.OH).localGet(A.OW).i32Mul().i32Const(2).i32Shl().i32Add().localSet(dy);
    f.localGet(dx).localGet(A.H).localGet(A.W).i32Mul().i32Const(2).i32Shl().i32Add().localSet(dx);
  });
}

/**
 * Adds the average pooling kernels to `builder`, exported under {@link AVG_POOL_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitAvgPoolKernels } from "./avg_pool_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitAvgPoolKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitAvgPoolKernels(builder: ModuleBuilder): void {
  builder.addFunction(AVG_POOL_EXPORTS.avgForward, Array(14).fill(i32), [], writeAvgForward);
  builder.addFunction(AVG_POOL_EXPORTS.avgBackward, Array(16).fill(i32), [], writeAvgBackward);
}
