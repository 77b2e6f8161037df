/**
 * Generates the kernels of a max-pooled convolution's weight gradient taken straight from the
 * pooled gradient (`filter_pooled.ts`): for one output channel f, one input channel c and one
 * image, every pooled output o of f's plane whose ReLU passed it (pooled value > 0) adds
 * dy[o] · (the patch of c's zero-padded input plane under the window of o's winner) to the
 * filter's kernelH × kernelW sums.
 *
 * The sums live in registers as kernelH rows of `vectors` f32x4 (lanes past kernelW are computed
 * and thrown away): per pooled output one broadcast, then per kernel row `vectors` loads and
 * multiply-adds. Where each winner's patch starts comes from a table indexed by the winner (its
 * byte offset in the padded plane), so no division runs per output.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, f32, v128 } = ValType;

/**
 * The kernel shapes generated: kernelH rows of `vectors` accumulators, at most
 * {@link POOLED_FILTER_ACCUMULATORS} of them (with the broadcast and the loaded vector, within the
 * 16 vector registers V8 allocates on x64).
 */
export const POOLED_FILTER_ROWS = 7;
/** Vectors per kernel row: kernelW up to 4 · this. */
export const POOLED_FILTER_VECTORS = 2;
/** Most accumulators one kernel keeps: kernelH · vectors. */
export const POOLED_FILTER_ACCUMULATORS = 12;

/**
 * The exported name of the kernel for `rows` kernel rows of `vectors` vectors, and its arguments:
 * `(dy, argmax, reluOf, outputs, offsets, plane, rowBytes, tile, flags, sum, dw, kernelW)`.
 * `outputs` pooled gradients at `dy` with their winners at `argmax` (int32, indices into the
 * convolution's output plane) and, with flag 2, their pooled values at `reluOf` (only those > 0
 * count); `offsets[winner]` (int32) is the byte offset of the winner's patch in the padded input
 * plane at `plane`, whose rows are `rowBytes` apart. The accumulators start from the tile at
 * `tile` (rows × vectors f32x4) with flag 1, else at zero, and go back to it; with flag 4 each row's
 * first `kernelW` floats then go to `dw` (rows `kernelW` floats apart); with flag 8 the sum of the
 * counted gradients (in order) goes to `sum`.
 *
 * @example
 * ```ts
 * import { pooledFilterExport } from "./filter_pooled_kernels.ts";
 * console.log(pooledFilterExport(5, 2)); // "conv_filter_pooled_5x2"
 * ```
 */
export function pooledFilterExport(rows: number, vectors: number): `conv_filter_pooled_${string}` {
  return `conv_filter_pooled_${rows}x${vectors}`;
}

/** Flag bits of a {@link pooledFilterExport} call. */
export const PooledFilterFlags = { resume: 1, masked: 2, store: 4, sum: 8 } as const;

function writePooledFilter(f: FunctionWriter, rows: number, vectors: number, fma: boolean): void {
  const [dy, argmax, reluOf, outputs, offsets, plane, rowBytes, tile, flags, sum, dw, kernelW] = [
    ...Array(12).keys(),
  ];
  const acc = Array.from({ length: rows * vectors }, () => f.local(v128));
  const gradient = f.local(f32), total = f.local(f32), splat = f.local(v128), x = f.local(v128);
  const end = f.local(i32), at = f.local(i32), masked = f.local(i32), r = f.local(i32), k = f.local(i32);
  const to = f.local(i32), from = f.local(i32);

  f.localGet(flags).i32Const(PooledFilterFlags.resume).i32And().if();
  acc.forEach((a, i) => f.localGet(tile).v128Load(16 * i).localSet(a));
  f.end();
  f.localGet(flags).i32Const(PooledFilterFlags.masked).i32And().localSet(masked);
  // end = dy + 4·outputs; dy, argmax and reluOf walk together.
  f.localGet(dy).localGet(outputs).i32Const(2).i32Shl().i32Add().localSet(end);
  f.block().loop();
  f.localGet(dy).localGet(end).i32GeS().brIf(1);
  f.localGet(dy).f32Load().localSet(gradient);
  // Counted unless masked and its pooled value is not > 0 (reluGrad's mask; NaN does not pass).
  f.localGet(masked).i32Eqz().localGet(reluOf).f32Load().f32Const(0).f32Gt().i32Or().if();
  {
    f.localGet(total).localGet(gradient).f32Add().localSet(total);
    f.localGet(gradient).f32x4Splat().localSet(splat);
    // at = plane + offsets[argmax[o]]
    f.localGet(plane).localGet(offsets).localGet(argmax).i32Load().i32Const(2).i32Shl().i32Add().i32Load()
      .i32Add().localSet(at);
    for (let row = 0; row < rows; row++) {
      if (row > 0) f.localGet(at).localGet(rowBytes).i32Add().localSet(at);
      for (let v = 0; v < vectors; v++) {
        f.localGet(at).v128Load(16 * v).localSet(x);
        f.accumulateProduct(acc[row * vectors + v], splat, x, fma);
      }
    }
  }
  f.end();
  f.localGet(dy).i32Const(4).i32Add().localSet(dy);
  f.localGet(argmax).i32Const(4).i32Add().localSet(argmax);
  f.localGet(reluOf).i32Const(4).i32Add().localSet(reluOf);
  f.br(0).end().end();

  acc.forEach((a, i) => f.localGet(tile).localGet(a).v128Store(16 * i));
  f.localGet(flags).i32Const(PooledFilterFlags.sum).i32And().if();
  f.localGet(sum).localGet(total).f32Store();
  f.end();
  f.localGet(flags).i32Const(PooledFilterFlags.store).i32And().if();
  {
    // dw row r = the tile's row r, its first kernelW floats.
    f.localGet(dw).localSet(to);
    f.forRange(r, () => f.i32Const(0), () => f.i32Const(rows), 1, () => {
      f.localGet(tile).localGet(r).i32Const(16 * vectors).i32Mul().i32Add().localSet(from);
      f.forRange(k, () => f.i32Const(0), () => f.localGet(kernelW), 1, () => {
        f.localGet(to).localGet(from).f32Load().f32Store();
        f.localGet(to).i32Const(4).i32Add().localSet(to);
        f.localGet(from).i32Const(4).i32Add().localSet(from);
      });
    });
  }
  f.end();
}

/**
 * Adds one kernel per shape (kernelH ≤ {@link POOLED_FILTER_ROWS}, vectors ≤
 * {@link POOLED_FILTER_VECTORS}, at most {@link POOLED_FILTER_ACCUMULATORS} accumulators), each
 * exported under {@link pooledFilterExport}.
 */
export function emitPooledFilterKernels(builder: ModuleBuilder, options: { fma: boolean }): void {
  for (let vectors = 1; vectors <= POOLED_FILTER_VECTORS; vectors++) {
    for (let rows = 1; rows <= POOLED_FILTER_ROWS && rows * vectors <= POOLED_FILTER_ACCUMULATORS; rows++) {
      builder.addFunction(
        pooledFilterExport(rows, vectors),
        Array(12).fill(i32),
        [],
        (f) => writePooledFilter(f, rows, vectors, options.fma),
      );
    }
  }
}
