/**
 * Generates the direct weight-gradient kernel of stride-1 convolutions that Winograd does not take
 * (few input channels: cifar10_quick's and the AlexNet-like net's conv1).
 *
 * Such a layer's weight gradient, dw[o, r] = Σ_pixels dy[o, pixel] · column[r, pixel], has few
 * outputs per group (o) and few column-matrix rows (r) but a long sum. Through GEMM, every float of
 * both operands is packed once per cache block and then used only by the other side's few rows, so
 * packing cost as much as the multiply-adds (a 32×75×65536 product ran at 57% of the 2-thread
 * peak). Here both operands are read where they lie, as vectors along the output row: dy's rows
 * as they are, and a column-matrix row of a stride-1 layer is a run of a zero-padded input plane.
 * A tile of {@link FILTER_TILE} outputs × rows keeps one vector accumulator per (o, r), whose lane l
 * sums the pixels with column ≡ l (mod 4) over the image and, across calls, over the images of a
 * chunk; the last call adds the four lanes, ((l0 + l2) + (l1 + l3)), and stores the sums.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, v128 } = ValType;

/**
 * The tile: outputs (dy rows) × column-matrix rows, one accumulator each. 3 × 3 keeps its 9
 * accumulators, the three row vectors and one dy vector in 13 of x64's 16 vector registers and loads
 * 6 vectors per 9 multiply-adds; 4 × 3 needs all 16 and ran at a third of the speed (spills), 5 × 2,
 * 4 × 2 and 2 × 4 ran 0–10% slower on cifar10_quick's conv1.
 *
 * @example
 * ```ts
 * import { FILTER_TILE } from "./filter_kernels.ts";
 * console.log(FILTER_TILE.outputs * FILTER_TILE.rows); // 9 accumulators
 * ```
 */
export const FILTER_TILE = { outputs: 3, rows: 3 } as const;

/**
 * Name under which {@link emitFilterKernels} exports its function, and its arguments:
 * `(dy, dyChannel, dyRow, xpad, taps, xRow, outputs, rows, height, vectors, acc, first, last, dst, ldc)`.
 * Output o's rows start at `dy + o·dyChannel`, `dyRow` bytes apart; column-matrix row r starts
 * `taps[r]` (int32) bytes past `xpad`, its output rows `xRow` bytes apart; each of the `height`
 * rows is `vectors` whole vectors on both sides (zero past the output row's end on at least one
 * side). The accumulator of (o, r) is the vector at `acc + 16·(r·outputs + o)`: started at zero
 * when `first`, else read. Unless `last` the accumulators are stored back; when `last` their lanes'
 * sums go to `dst + o·ldc + 4·r` (float32).
 *
 * @example
 * ```ts
 * import { FILTER_EXPORTS } from "./filter_kernels.ts";
 * console.log(FILTER_EXPORTS.dot); // "conv_filter_dot"
 * ```
 */
export const FILTER_EXPORTS = { dot: "conv_filter_dot" } as const;

/** Vectors along an output row per loop turn (one pointer move per turn). */
const UNROLL = 2;

function writeFilterDot(f: FunctionWriter, fma: boolean): void {
  const [dy, dyChannel, dyRow, xpad, taps, xRow, outputs, rows, height, vectors, acc, first, last, dst, ldc] =
    [
      ...Array(15).keys(),
    ];
  const TM = FILTER_TILE.outputs, TN = FILTER_TILE.rows;
  const i = f.local(i32), j = f.local(i32), y = f.local(i32), v = f.local(i32), index = f.local(i32);
  const dyRest = f.local(i32), xRest = f.local(i32);
  const dyAt = Array.from({ length: TM }, () => f.local(i32)),
    xAt = Array.from({ length: TN }, () => f.local(i32));
  const out = Array.from({ length: TM }, () => f.local(i32)),
    row = Array.from({ length: TN }, () => f.local(i32));
  const sums = Array.from({ length: TM * TN }, () => f.local(v128));
  const xv = Array.from({ length: TN }, () => f.local(v128)), d = f.local(v128), h = f.local(v128);
  const sum = (a: number, b: number) => sums[a * TN + b];
  /** Pushes the accumulator address of (out[a], row[b]). */
  const slot = (a: number, b: number) => {
    f.localGet(acc).localGet(row[b]).localGet(outputs).i32Mul().localGet(out[a]).i32Add().i32Const(4).i32Shl()
      .i32Add();
  };
  /** `target = min(start + offset, limit − 1)`: a tile past the edge repeats the last output or row. */
  const clamp = (target: number, start: number, offset: number, limit: number) => {
    f.localGet(start).i32Const(offset).i32Add().localTee(index);
    f.localGet(limit).i32Const(1).i32Sub();
    f.localGet(index).localGet(limit).i32LtS().select().localSet(target);
  };
  // What each pointer skips at the end of an output row.
  f.localGet(dyRow).localGet(vectors).i32Const(4).i32Shl().i32Sub().localSet(dyRest);
  f.localGet(xRow).localGet(vectors).i32Const(4).i32Shl().i32Sub().localSet(xRest);
  f.forRange(i, () => f.i32Const(0), () => f.localGet(outputs), TM, () => {
    f.forRange(j, () => f.i32Const(0), () => f.localGet(rows), TN, () => {
      for (let a = 0; a < TM; a++) clamp(out[a], i, a, outputs);
      for (let b = 0; b < TN; b++) clamp(row[b], j, b, rows);
      for (let a = 0; a < TM; a++) {
        f.localGet(dy).localGet(out[a]).localGet(dyChannel).i32Mul().i32Add().localSet(dyAt[a]);
      }
      for (let b = 0; b < TN; b++) {
        f.localGet(xpad).localGet(taps).localGet(row[b]).i32Const(2).i32Shl().i32Add().i32Load().i32Add()
          .localSet(xAt[b]);
      }
      f.localGet(first).i32Eqz().if();
      for (let a = 0; a < TM; a++) {
        for (let b = 0; b < TN; b++) {
          slot(a, b);
          f.v128Load().localSet(sum(a, b));
        }
      }
      f.else();
      for (let a = 0; a < TM; a++) {
        for (let b = 0; b < TN; b++) f.v128ConstF32([0, 0, 0, 0]).localSet(sum(a, b));
      }
      f.end();
      f.forRange(y, () => f.i32Const(0), () => f.localGet(height), 1, () => {
        /** `count` vectors along the row, then every pointer moves past them. */
        const steps = (count: number) => {
          for (let u = 0; u < count; u++) {
            for (let b = 0; b < TN; b++) f.localGet(xAt[b]).v128Load(16 * u).localSet(xv[b]);
            for (let a = 0; a < TM; a++) {
              f.localGet(dyAt[a]).v128Load(16 * u).localSet(d);
              for (let b = 0; b < TN; b++) f.accumulateProduct(sum(a, b), d, xv[b], fma);
            }
          }
          for (let a = 0; a < TM; a++) f.localGet(dyAt[a]).i32Const(16 * count).i32Add().localSet(dyAt[a]);
          for (let b = 0; b < TN; b++) f.localGet(xAt[b]).i32Const(16 * count).i32Add().localSet(xAt[b]);
        };
        f.localGet(vectors).localSet(v);
        for (const count of [UNROLL, 1]) {
          f.block().loop();
          f.localGet(v).i32Const(count).i32LtS().brIf(1);
          steps(count);
          f.localGet(v).i32Const(count).i32Sub().localSet(v);
          f.br(0).end().end();
        }
        for (let a = 0; a < TM; a++) f.localGet(dyAt[a]).localGet(dyRest).i32Add().localSet(dyAt[a]);
        for (let b = 0; b < TN; b++) f.localGet(xAt[b]).localGet(xRest).i32Add().localSet(xAt[b]);
      });
      f.localGet(last).i32Eqz().if();
      for (let a = 0; a < TM; a++) {
        for (let b = 0; b < TN; b++) {
          slot(a, b);
          f.localGet(sum(a, b)).v128Store();
        }
      }
      f.else();
      for (let a = 0; a < TM; a++) {
        for (let b = 0; b < TN; b++) {
          // ((l0 + l2) + (l1 + l3)), stored at dst + out·ldc + 4·row.
          f.localGet(sum(a, b)).localGet(sum(a, b)).localGet(sum(a, b)).shuffleF32Lanes([2, 3, 0, 1])
            .f32x4Add()
            .localSet(h);
          f.localGet(dst).localGet(out[a]).localGet(ldc).i32Mul().i32Add().localGet(row[b]).i32Const(2)
            .i32Shl()
            .i32Add();
          f.localGet(h).localGet(h).localGet(h).shuffleF32Lanes([1, 0, 3, 2]).f32x4Add().f32x4ExtractLane(0)
            .f32Store();
        }
      }
      f.end();
    });
  });
}

/**
 * Adds the direct weight-gradient kernel ({@link FILTER_EXPORTS}) to a module, fused multiply-adds
 * where `fma` (relaxed SIMD detected).
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitFilterKernels } from "./filter_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({ module: "env", name: "memory", initialPages: 1, maximumPages: 1, shared: false });
 * emitFilterKernels(builder, { fma: false });
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitFilterKernels(builder: ModuleBuilder, options: { fma: boolean }): void {
  builder.addFunction(FILTER_EXPORTS.dot, Array(15).fill(i32), [], (f) => writeFilterDot(f, options.fma));
}
