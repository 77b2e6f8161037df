/**
 * Generates max pooling: forward per window the first maximum in row-major order (a NaN wins and
 * stays), its value and its index within the plane — the TypeScript kernel's exact rule, so both
 * give the same bits and the same argmax; backward the TypeScript kernel's scatter, in its order.
 *
 * Why WebAssembly: a scalar max over a window branches on data, and on real activations that
 * branch is a coin flip; the TypeScript loop spends most of its time in mispredictions. Here
 * every comparison is lane-wise and every choice a blend (`v128.bitselect`, or relaxed SIMD's lane
 * select, one instruction, where the runtime has it), so nothing branches on data.
 *
 * Stride-2 rows (the common layers) take four windows per step: two loads per input row,
 * de-interleaved by shuffles, hold a tap of four neighbouring windows. Windows clipped by the
 * right edge stay on this path with their taps past the edge masked out; a row's last group is
 * moved back to end with the row (recomputing a few windows), and a row of fewer than four
 * windows stores only those lanes. 3-row, stride-2 windows go down the plane in strips four
 * windows wide, reducing each input row once per window and carrying the row a window shares
 * with the next. Windows in the left padding, other strides and kernels wider than 8 run one at
 * a time in lane 0.
 *
 * Average pooling (`avg_pool_kernels.ts`) reuses the forward's four-window stride-2 scheme and this
 * file's {@link minMax}.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, v128 } = ValType;

/**
 * Names under which {@link emitMaxPoolKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { MAX_POOL_EXPORTS } from "./max_pool_kernels.ts";
 * console.log(MAX_POOL_EXPORTS.maxForward); // "max_pool_forward"
 * ```
 */
export const MAX_POOL_EXPORTS = {
  /**
   * `(x, out, argmax, planes, H, W, OH, OW, kH, kW, sH, sW, pH, pW)`: max pooling forward of
   * `planes` planes.
   */
  maxForward: "max_pool_forward",
  /**
   * `(dy, argmax, dx, planes, inPlane, outPlane, reluOf, masked)`: max pooling backward of
   * `planes` planes, dx overwritten; with `masked` 1, `dy[o]` counts only where `reluOf[o] > 0`
   * (the ReLU's backward on the pooled gradient, fused).
   */
  maxBackward: "max_pool_backward",
} as const;

/**
 * Parameter indices of a pooling kernel's window geometry (planes, H, W, OH, OW, kH, kW, sH, sW,
 * pH, pW, as `WINDOW_FIELDS` in `../tasks.ts` orders them), which follow its `first` operands.
 *
 * @example
 * ```ts
 * import { windowParameters } from "./max_pool_kernels.ts";
 * console.log(windowParameters(3).pW); // 13
 * ```
 */
export function windowParameters(first: number) {
  return {
    planes: first,
    H: first + 1,
    W: first + 2,
    OH: first + 3,
    OW: first + 4,
    kH: first + 5,
    kW: first + 6,
    sH: first + 7,
    sW: first + 8,
    pH: first + 9,
    pW: first + 10,
  } as const;
}

const P = { x: 0, out: 1, argmax: 2, ...windowParameters(3) } as const;

/**
 * `dst = max(a, b)` (`keepLarger`) or `dst = min(a, b)` on the i32 values `a` and `b` push, without
 * branches (a `select`).
 *
 * @example
 * ```ts
 * import { ModuleBuilder, ValType } from "./encoder.ts";
 * import { minMax } from "./max_pool_kernels.ts";
 * const builder = new ModuleBuilder();
 * builder.addFunction("max", [ValType.i32, ValType.i32], [ValType.i32], (f) => {
 *   const dst = f.local(ValType.i32);
 *   minMax(f, dst, () => f.localGet(0), () => f.localGet(1), true);
 *   f.localGet(dst);
 * });
 * const { instance } = await WebAssembly.instantiate(builder.build());
 * console.log((instance.exports.max as (a: number, b: number) => number)(2, -3)); // 2
 * ```
 */
export function minMax(
  f: FunctionWriter,
  dst: number,
  a: () => void,
  b: () => void,
  keepLarger: boolean,
): void {
  a();
  b();
  a();
  b();
  if (keepLarger) f.i32GtS();
  else f.i32LtS();
  f.select().localSet(dst);
}

/**
 * Emits `body(width, masked)` for the group of four stride-2 windows starting at output column
 * `group` (locals and parameters by index): specialised for kernel widths 3 and 2, every common
 * layer, generic (`undefined`) otherwise, and masked only where the group's last window, or a lane
 * past the row, reaches column W (`needMasks` is set here). Max and average pooling both run their
 * four-window path through it.
 *
 * @example
 * ```ts
 * import { FunctionWriter, ValType } from "./encoder.ts";
 * import { dispatchWindowGroup } from "./max_pool_kernels.ts";
 * const f = new FunctionWriter([ValType.i32, ValType.i32, ValType.i32], []);
 * const group = f.local(ValType.i32), needMasks = f.local(ValType.i32);
 * dispatchWindowGroup(f, { group, needMasks, pW: 0, kW: 1, W: 2 }, () => {});
 * ```
 */
export function dispatchWindowGroup(
  f: FunctionWriter,
  at: { group: number; needMasks: number; pW: number; kW: number; W: number },
  body: (width: 2 | 3 | undefined, masked: boolean) => void,
): void {
  f.localGet(at.group).i32Const(1).i32Shl().localGet(at.pW).i32Sub().i32Const(6).i32Add().localGet(at.kW)
    .i32Add();
  f.localGet(at.W).i32GtS().localSet(at.needMasks);
  const bothMasks = (width: 2 | 3 | undefined) => {
    f.localGet(at.needMasks).if();
    body(width, true);
    f.else();
    body(width, false);
    f.end();
  };
  f.localGet(at.kW).i32Const(3).i32Eq().if();
  bothMasks(3);
  f.else();
  f.localGet(at.kW).i32Const(2).i32Eq().if();
  bothMasks(2);
  f.else();
  bothMasks(undefined);
  f.end();
  f.end();
}

/**
 * `v128.bitselect` of two vectors under a mask whose lanes are all ones or all zeros; with
 * `relaxed`, `i32x4.relaxed_laneselect`, which engines compile to one blend instruction where
 * bitselect takes three, and which is exact for such masks.
 */
function blend(f: FunctionWriter, relaxed: boolean): void {
  if (relaxed) f.i32x4RelaxedLaneselect();
  else f.v128Bitselect();
}

function writeMaxForward(f: FunctionWriter, relaxed: boolean): void {
  const p = f.local(i32), base = f.local(i32), oh = f.local(i32), ow = f.local(i32), h = f.local(i32);
  const w = f.local(i32), h0 = f.local(i32), hs = f.local(i32), he = f.local(i32), w0 = f.local(i32);
  const ws = f.local(i32), we = f.local(i32), idx = f.local(i32), i = f.local(i32), o = f.local(i32);
  const plane = f.local(i32);
  // Vector path: first output column it takes, start of the last full group, the group's start
  // and first input column, the output row's start, the current input row's address.
  const vecStart = f.local(i32), lastGroup = f.local(i32), group = f.local(i32), groupColumn = f.local(i32);
  const rowOut = f.local(i32), row = f.local(i32), kw = f.local(i32), scalarEnd = f.local(i32);
  const needMasks = f.local(i32);
  const bestV = f.local(v128), idxV = f.local(v128), vV = f.local(v128), takeV = f.local(v128);
  const lo = f.local(v128), hi = f.local(v128), even = f.local(v128), rowIdx = f.local(v128);
  const columns = f.local(v128), columnsF = f.local(v128), stepRow = f.local(v128), maskV = f.local(v128);
  const one = f.local(v128), two = f.local(v128), limit1 = f.local(v128), limit2 = f.local(v128);
  const mask1 = f.local(v128), mask2 = f.local(v128), tapV = f.local(v128);
  // Strip path: the current row's own first maximum (value, index), carried to the next window.
  const rowBestV = f.local(v128), rowIdxV = f.local(v128), strip = f.local(i32), planeOut = f.local(i32);

  /**
   * Lane-wise, the TypeScript rule: take v (and its index) where `v > best`, or v is NaN and best
   * is not, i.e. `(best == best) & !(v <= best)`; `mask` (a local) clears lanes whose tap lies
   * past the input's right edge. The value kept is always some input's exact bits (the first
   * maximum), so it is stored as is.
   */
  const take = (v: number, tapIdx: () => void, mask?: number, [best, index] = [bestV, idxV]) => {
    f.localGet(best).localGet(best).f32x4Eq();
    f.localGet(v).localGet(best).f32x4Le();
    f.v128AndNot();
    if (mask !== undefined) f.localGet(mask).v128And();
    f.localSet(takeV);
    tapIdx();
    f.localGet(index).localGet(takeV);
    blend(f, relaxed);
    f.localSet(index);
    f.localGet(v).localGet(best).localGet(takeV);
    blend(f, relaxed);
    f.localSet(best);
  };

  /**
   * Window (oh, ow) alone, clipped to the input: the exact rule, branch-free, with the value and
   * index held in lane 0 of vectors (`v128.bitselect` is a plain bitwise blend, where scalar
   * `f32.max` and a float `select` compile to branches). Only for windows the vector path does
   * not take (left padding, strides other than 2, kernels wider than 8).
   */
  const scalarWindow = () => {
    f.localGet(ow).localGet(P.sW).i32Mul().localGet(P.pW).i32Sub().localSet(w0);
    minMax(f, ws, () => f.localGet(w0), () => f.i32Const(0), true);
    minMax(f, we, () => f.localGet(w0).localGet(P.kW).i32Add(), () => f.localGet(P.W), false);
    f.localGet(hs).localGet(P.W).i32Mul().localGet(ws).i32Add().localTee(idx).i32x4Splat().localSet(idxV);
    f.localGet(base).localGet(idx).i32Const(2).i32Shl().i32Add().v128Load32Splat().localSet(bestV);
    f.forRange(h, () => f.localGet(hs), () => f.localGet(he), 1, () => {
      f.forRange(w, () => f.localGet(ws), () => f.localGet(we), 1, () => {
        f.localGet(h).localGet(P.W).i32Mul().localGet(w).i32Add().localTee(i).i32x4Splat().localSet(tapV);
        f.localGet(base).localGet(i).i32Const(2).i32Shl().i32Add().v128Load32Splat().localSet(vV);
        take(vV, () => f.localGet(tapV));
      });
    });
    f.localGet(P.out).localGet(o).i32Const(2).i32Shl().i32Add().localGet(bestV).f32x4ExtractLane(0)
      .f32Store();
    f.localGet(P.argmax).localGet(o).i32Const(2).i32Shl().i32Add().localGet(idxV).i32x4ExtractLane(0)
      .i32Store();
  };

  /**
   * One input row of the four windows starting at output column `group` (stride 2): for kernel
   * column kw, lanes j of the vectors loaded at column kw hold columns kw + j and kw + j + 4 of
   * the first window, so their even lanes are tap kw of all four windows. Kernel widths 2 and 3
   * share two loads per row (tap 2 is tap 0 moved on by one window); others load per tap. The
   * row's first tap starts the windows (`first`) or is taken like the rest; with `masked`, taps
   * past the right edge are never taken.
   */
  const windowsRow = (
    width: 2 | 3 | undefined,
    first: boolean,
    masked: boolean,
    into: [number, number] = [bestV, idxV],
  ) => {
    const tapIndex = (offset: number | undefined) => () => {
      f.localGet(rowIdx);
      if (offset === 1) f.localGet(one).i32x4Add();
      else if (offset === 2) f.localGet(two).i32x4Add();
      else if (offset === undefined) f.localGet(kw).i32x4Splat().i32x4Add();
    };
    const start = () => {
      if (first) {
        f.localGet(even).localSet(into[0]);
        f.localGet(rowIdx).localSet(into[1]);
      } else {
        take(even, tapIndex(0), undefined, into);
      }
    };
    if (width !== undefined) {
      f.localGet(row).v128Load(0).localSet(lo);
      f.localGet(row).v128Load(16).localSet(hi);
      f.localGet(lo).localGet(hi).shuffleF32Lanes([0, 2, 4, 6]).localSet(even);
      start();
      f.localGet(lo).localGet(hi).shuffleF32Lanes([1, 3, 5, 7]).localSet(vV);
      take(vV, tapIndex(1), masked ? mask1 : undefined, into);
      if (width === 3) {
        f.localGet(even).localGet(row).v128Load32Splat(32).shuffleF32Lanes([1, 2, 3, 4]).localSet(vV);
        take(vV, tapIndex(2), masked ? mask2 : undefined, into);
      }
      return;
    }
    const tapAt = (column: () => void, into: number) => {
      column();
      f.localTee(i).v128Load(0).localGet(i).v128Load(16).shuffleF32Lanes([0, 2, 4, 6]).localSet(into);
    };
    tapAt(() => f.localGet(row), even);
    start();
    f.forRange(kw, () => f.i32Const(1), () => f.localGet(P.kW), 1, () => {
      tapAt(() => f.localGet(row).localGet(kw).i32Const(2).i32Shl().i32Add(), vV);
      if (masked) {
        f.localGet(columnsF).localGet(P.W).localGet(kw).i32Sub().f32ConvertI32S().f32x4Splat().f32x4Lt();
        f.localSet(maskV);
      }
      take(vV, tapIndex(undefined), masked ? maskV : undefined, into);
    });
  };

  /**
   * The four windows at output columns group … group + 3 of output row oh, rows hs … he − 1 (at
   * least one), left to right within each row, rows top to bottom: the TypeScript kernel's
   * order. Their first taps lie inside the input (the caller checks), so they start the windows.
   */
  const windows = (width: 2 | 3 | undefined, masked: boolean) => {
    groupColumns(width, masked);
    firstRow();
    windowsRow(width, true, masked);
    f.forRange(h, () => f.localGet(hs).i32Const(1).i32Add(), () => f.localGet(he), 1, () => {
      nextRow();
      windowsRow(width, false, masked);
    });
  };

  /** Input columns of the group's four windows, and with `masked` which taps lie inside the row. */
  const groupColumns = (width: 2 | 3 | undefined, masked: boolean) => {
    f.localGet(group).i32Const(1).i32Shl().localGet(P.pW).i32Sub().localTee(groupColumn);
    f.i32x4Splat().v128ConstI32([0, 2, 4, 6]).i32x4Add().localSet(columns);
    if (masked) {
      f.localGet(columns).f32x4ConvertI32x4S().localSet(columnsF);
      if (width !== undefined) f.localGet(columnsF).localGet(limit1).f32x4Lt().localSet(mask1);
      if (width === 3) f.localGet(columnsF).localGet(limit2).f32x4Lt().localSet(mask2);
    }
  };

  /** `row` and `rowIdx` of input row hs. */
  const firstRow = () => {
    f.localGet(hs).localGet(P.W).i32Mul().localTee(i).i32x4Splat().localGet(columns).i32x4Add().localSet(
      rowIdx,
    );
    f.localGet(base).localGet(i).localGet(groupColumn).i32Add().i32Const(2).i32Shl().i32Add().localSet(row);
  };

  /** Moves `row` and `rowIdx` one input row down. */
  const nextRow = () => {
    f.localGet(rowIdx).localGet(stepRow).i32x4Add().localSet(rowIdx);
    f.localGet(row).localGet(P.W).i32Const(2).i32Shl().i32Add().localSet(row);
  };

  /**
   * 3-row, stride-2 windows: the group's four columns of windows down the whole plane. Each input
   * row is reduced once to its own first maximum per window (row order within a window is the
   * TypeScript kernel's order, and every tap of a row comes before the next row's, so combining
   * the row results top to bottom with the same rule gives the same winner), and a window's last
   * row, which is the next window's first, is carried over rather than reduced again.
   */
  const stripWindows = (width: 2 | 3 | undefined, masked: boolean) => {
    groupColumns(width, masked);
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(P.OH), 1, () => {
      rowRange();
      firstRow();
      f.localGet(oh).i32Eqz().if();
      windowsRow(width, true, masked, [rowBestV, rowIdxV]);
      f.end();
      // Otherwise row hs is the previous window's last row, whose result is still there.
      f.localGet(rowBestV).localSet(bestV);
      f.localGet(rowIdxV).localSet(idxV);
      f.forRange(h, () => f.localGet(hs).i32Const(1).i32Add(), () => f.localGet(he), 1, () => {
        nextRow();
        windowsRow(width, true, masked, [rowBestV, rowIdxV]);
        take(rowBestV, () => f.localGet(rowIdxV));
      });
      f.localGet(planeOut).localGet(oh).localGet(P.OW).i32Mul().i32Add().localSet(rowOut);
      f.localGet(P.OW).localGet(group).i32Sub().i32Const(4).i32GeS().if();
      storeGroup();
      f.else();
      storePartialGroup();
      f.end();
    });
  };

  /** hs and he of output row oh. */
  const rowRange = () => {
    f.localGet(oh).localGet(P.sH).i32Mul().localGet(P.pH).i32Sub().localSet(h0);
    minMax(f, hs, () => f.localGet(h0), () => f.i32Const(0), true);
    minMax(f, he, () => f.localGet(h0).localGet(P.kH).i32Add(), () => f.localGet(P.H), false);
  };

  /** {@link windows} for the kernel width, masked where the last window reaches past the edge. */
  const anyWindows = (body = windows) =>
    dispatchWindowGroup(f, { group, needMasks, pW: P.pW, kW: P.kW, W: P.W }, body);

  const storeLane = (lane: number) => {
    f.localGet(P.out).localGet(rowOut).localGet(group).i32Add().i32Const(2).i32Shl().i32Add();
    f.localGet(bestV).f32x4ExtractLane(lane).f32Store(4 * lane);
    f.localGet(P.argmax).localGet(rowOut).localGet(group).i32Add().i32Const(2).i32Shl().i32Add();
    f.localGet(idxV).i32x4ExtractLane(lane).i32Store(4 * lane);
  };

  /** Stores the four windows at output (rowOut + group). */
  function storeGroup(): void {
    f.localGet(P.out).localGet(rowOut).localGet(group).i32Add().i32Const(2).i32Shl().i32Add();
    f.localGet(bestV).v128Store();
    f.localGet(P.argmax).localGet(rowOut).localGet(group).i32Add().i32Const(2).i32Shl().i32Add();
    f.localGet(idxV).v128Store();
  }

  /** Stores the first OW − group (1 to 3) windows of the group. */
  function storePartialGroup(): void {
    storeLane(0);
    f.localGet(P.OW).localGet(group).i32Sub().i32Const(1).i32GtS().if();
    storeLane(1);
    f.end();
    f.localGet(P.OW).localGet(group).i32Sub().i32Const(2).i32GtS().if();
    storeLane(2);
    f.end();
  }

  /**
   * `body()` for each group of four windows from vecStart on (the last moved back to end at OW,
   * recomputing a few windows; with fewer than four windows, one group stored in part).
   */
  const eachGroup = (body: (full: boolean) => void) => {
    f.localGet(vecStart).localGet(P.OW).i32LtS().if();
    f.localGet(lastGroup).localGet(vecStart).i32GeS().if();
    f.forRange(ow, () => f.localGet(vecStart), () => f.localGet(P.OW), 4, () => {
      minMax(f, group, () => f.localGet(ow), () => f.localGet(lastGroup), false);
      body(true);
    });
    f.else();
    f.localGet(vecStart).localSet(group);
    body(false);
    f.end();
    f.end();
  };

  f.localGet(P.H).localGet(P.W).i32Mul().i32Const(2).i32Shl().localSet(plane);
  // The vector path takes stride-2 rows from the first window not in the left padding, when
  // every window starts inside the row and kernels are at most 8 wide: its loads then read at
  // most 14 floats past a row's end (into the next row, or past the input's end, where the
  // caller leaves 64 bytes); lanes past the edge are masked or never stored.
  f.localGet(P.OW).localSet(vecStart);
  f.localGet(P.sW).i32Const(2).i32Eq();
  f.localGet(P.kW).i32Const(8).i32LeS().i32And();
  f.localGet(P.OW).i32Const(1).i32Sub().i32Const(1).i32Shl().localGet(P.pW).i32Sub().localGet(P.W).i32LtS();
  f.i32And().if();
  f.localGet(P.pW).i32Const(1).i32Add().i32Const(1).i32ShrS().localSet(vecStart);
  f.end();
  f.localGet(P.OW).i32Const(4).i32Sub().localSet(lastGroup);
  f.localGet(P.W).i32x4Splat().localSet(stepRow);
  f.v128ConstI32([1, 1, 1, 1]).localSet(one);
  f.v128ConstI32([2, 2, 2, 2]).localSet(two);
  f.localGet(P.W).i32Const(1).i32Sub().f32ConvertI32S().f32x4Splat().localSet(limit1);
  f.localGet(P.W).i32Const(2).i32Sub().f32ConvertI32S().f32x4Splat().localSet(limit2);

  // Strips down the plane for 3-row, stride-2 windows whose rows all overlap the input (a window
  // then shares its last row with the next).
  f.localGet(P.kH).i32Const(3).i32Eq().localGet(P.sH).i32Const(2).i32Eq().i32And();
  f.localGet(P.pH).i32Const(3).i32LtS().i32And();
  f.localGet(P.OH).i32Const(1).i32Sub().i32Const(1).i32Shl().localGet(P.pH).i32Sub().localGet(P.H).i32LtS();
  f.i32And().localSet(strip);

  f.i32Const(0).localSet(o);
  f.localGet(P.x).localSet(base);
  f.forRange(p, () => f.i32Const(0), () => f.localGet(P.planes), 1, () => {
    f.localGet(o).localSet(planeOut);
    f.localGet(strip).if();
    // Windows left of vecStart one at a time, then the strips.
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(P.OH), 1, () => {
      rowRange();
      f.localGet(planeOut).localGet(oh).localGet(P.OW).i32Mul().i32Add().localSet(o);
      f.forRange(ow, () => f.i32Const(0), () => f.localGet(vecStart), 1, () => {
        scalarWindow();
        f.localGet(o).i32Const(1).i32Add().localSet(o);
      });
    });
    eachGroup(() => anyWindows(stripWindows));
    f.localGet(planeOut).localGet(P.OH).localGet(P.OW).i32Mul().i32Add().localSet(o);
    f.else();
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(P.OH), 1, () => {
      rowRange();
      f.localGet(o).localSet(rowOut);
      // Windows before vecStart, and rows without a row inside the input, one at a time.
      f.localGet(vecStart).localGet(P.OW).localGet(he).localGet(hs).i32GtS().select().localSet(scalarEnd);
      f.forRange(ow, () => f.i32Const(0), () => f.localGet(scalarEnd), 1, () => {
        scalarWindow();
        f.localGet(o).i32Const(1).i32Add().localSet(o);
      });
      f.localGet(he).localGet(hs).i32GtS().if();
      eachGroup((full) => {
        anyWindows();
        if (full) storeGroup();
        else storePartialGroup();
      });
      f.end();
      f.localGet(rowOut).localGet(P.OW).i32Add().localSet(o);
    });
    f.end();
    f.localGet(base).localGet(plane).i32Add().localSet(base);
  });
}

/**
 * Max pooling backward over `planes` planes: each plane of dx zero-filled, then `dy[o]` added
 * into `dx[argmax[o]]` in output order — the TypeScript kernel's order, so sums where windows
 * share a winner round the same way. An argmax outside the plane is skipped (it never is one
 * that the forward pass wrote). Masked (`reluOf` the pooled output of a ReLU), an output whose
 * pooled value is not > 0 is skipped too: `reluGrad` would have made its gradient +0, and every
 * window an element wins has that element's value, so the element's sum is +0 either way.
 */
function writeMaxBackward(f: FunctionWriter): void {
  const [dy, argmax, dx, planes, inPlane, outPlane, reluOf, masked] = [0, 1, 2, 3, 4, 5, 6, 7];
  const p = f.local(i32), o = f.local(i32), end = f.local(i32), at = f.local(i32);
  const scatter = (mask: boolean) => {
    f.forRange(o, () => f.i32Const(0), () => f.localGet(end), 4, () => {
      // at < inPlane, unsigned: one compare, where a signed pair of them made the loop a third
      // slower.
      f.localGet(argmax).localGet(o).i32Add().i32Load().localTee(at).localGet(inPlane);
      f.i32LtU();
      if (mask) f.localGet(reluOf).localGet(o).i32Add().f32Load().f32Const(0).f32Gt().i32And();
      f.if();
      f.localGet(dx).localGet(at).i32Const(2).i32Shl().i32Add().localTee(at);
      f.localGet(at).f32Load().localGet(dy).localGet(o).i32Add().f32Load().f32Add().f32Store();
      f.end();
    });
  };
  f.forRange(p, () => f.i32Const(0), () => f.localGet(planes), 1, () => {
    f.localGet(dx).i32Const(0).localGet(inPlane).i32Const(2).i32Shl().memoryFill();
    f.localGet(outPlane).i32Const(2).i32Shl().localSet(end);
    f.localGet(masked).if();
    scatter(true);
    f.else();
    scatter(false);
    f.end();
    f.localGet(dx).localGet(inPlane).i32Const(2).i32Shl().i32Add().localSet(dx);
    f.localGet(dy).localGet(end).i32Add().localSet(dy);
    f.localGet(argmax).localGet(end).i32Add().localSet(argmax);
    f.localGet(reluOf).localGet(end).i32Add().localSet(reluOf);
  });
}

/** Which code {@link emitMaxPoolKernels} generates. */
export interface MaxPoolKernelOptions {
  /**
   * Blend with relaxed SIMD's lane select (only in modules for runtimes with relaxed SIMD): exact
   * here, since every mask lane is all ones or all zeros, and about 30% faster than bitselect.
   */
  relaxed: boolean;
}

/**
 * Adds the max pooling kernels to `builder`, exported under {@link MAX_POOL_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitMaxPoolKernels } from "./max_pool_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitMaxPoolKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitMaxPoolKernels(
  builder: ModuleBuilder,
  options: MaxPoolKernelOptions = { relaxed: false },
): void {
  builder.addFunction(
    MAX_POOL_EXPORTS.maxForward,
    Array(14).fill(i32),
    [],
    (f) => writeMaxForward(f, options.relaxed),
  );
  builder.addFunction(MAX_POOL_EXPORTS.maxBackward, Array(8).fill(i32), [], writeMaxBackward);
}
