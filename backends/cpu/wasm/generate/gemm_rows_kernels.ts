/**
 * Generates the GEMM macro-kernel that reads its big operand in place: C = [C +] X·Wᵀ for a few
 * rows of X (a fully connected layer's forward product), computed as Cᵀ = W·Xᵀ with W's rows as
 * the register tile's MR rows, read straight from W (one `v128.load32_splat` per row and depth
 * step, MR row pointers walking W's rows), and X packed into NR-lane panels as the B operand.
 *
 * Why: each element of W is used only m times (the batch), so packing W (a full read and write
 * of 151 MB on the 9216→4096 layer) cost about a tenth of the product on one thread. Read in
 * place, W streams from memory once, each MR × KC slice staying in L1 while the NR-row tiles of
 * X sweep it.
 *
 * Arithmetic is the blocked kernel's: each depth block (KC steps, fixed) sums into fresh
 * accumulators in depth order, then is added to C; a·b and b·a round alike, so every element of
 * C has the bits `gemm_macro` gives it. The tile is transposed on its way out (a 4×4 shuffle
 * transpose per four rows of W, the rows past them lane by lane), so C keeps its row-major layout.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";
import { GEMM_DEPTH } from "../gemm.ts";
import { type GemmKernelShape, writeTranspose4 } from "./gemm_kernels.ts";

const { i32, v128 } = ValType;

/**
 * Depth steps per iteration of the in-place kernel's depth loop, whatever the shape's `unroll`.
 *
 * Why 8: Deno runs WebAssembly without V8's trap handler (denoland/deno#35658), so every load
 * carries an explicit bounds check (a compare and branch). 6 rows of W and 2 vectors of X make 8
 * checks per 12 multiply-adds, and the loop's own work (7 pointers, 3 of them spilled to the stack,
 * and V8's interrupt check) comes on top. Eight steps share that loop work where four did: on the
 * 9216→4096 layer's forward product at batch 64 (one thread, the 2-core Intel Xeon of
 * `bench/RESULTS.md`, 4 interleaved processes each) the best calls ran at 51.4–52.3 GFLOP/s
 * against 49.4–50.8 with 4; 16 ran alike (51.6–52.5). The packed kernel's loop (fewer pointers)
 * gained nothing from 8.
 *
 * What the checks cost: with them switched off (V8's test-only `--no-wasm-bounds-checks`) this
 * kernel ran at 59.5 GFLOP/s where it ran at 51 (89% of that peak against 77%). Tried and slower
 * or no faster: 4-row tiles splatting W by shuffles from one load per 4 steps (half the checks on
 * W), and 3×16 tiles (17 vector registers, one more than V8 allocates: they spill).
 */
export const ROWS_UNROLL = 8;

/**
 * The micro-kernel `(a, lda, b, c, kc, ldc, accumulate, cols, tile)`: for `rows` rows of W at `a`
 * (`lda` bytes apart) and one packed NR-lane panel of X at `b`, C[j, i] (+)= Σ_p W[i, p]·X[j, p]
 * over `kc` depth steps, C at `c` (element (j, i) at `c + j·ldc + 4i`). With `fast`, rows is MR
 * and all NR columns of the tile exist (`cols` and `tile` unused); otherwise the tile goes through
 * the MR×NR scratch `tile` and only its first `cols` rows of X are written.
 */
function writeRowsMicroKernel(f: FunctionWriter, shape: GemmKernelShape, rows: number, fast: boolean): void {
  const { nr, fma } = shape;
  const unroll = ROWS_UNROLL;
  const vectors = nr / 4;
  const [a, lda, b, c, kc, ldc, accumulate, cols, tile] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const acc: number[][] = [];
  for (let i = 0; i < rows; i++) acc.push(Array.from({ length: vectors }, () => f.local(v128)));
  const bv = Array.from({ length: vectors }, () => f.local(v128));
  const av = f.local(v128);
  const row = Array.from({ length: rows }, () => f.local(i32));
  f.localGet(a).localSet(row[0]);
  for (let i = 1; i < rows; i++) f.localGet(row[i - 1]).localGet(lda).i32Add().localSet(row[i]);

  const step = (offset: number) => {
    for (let v = 0; v < vectors; v++) f.localGet(b).v128Load((offset * nr + v * 4) * 4).localSet(bv[v]);
    for (let i = 0; i < rows; i++) {
      f.localGet(row[i]).v128Load32Splat(offset * 4).localSet(av);
      for (let v = 0; v < vectors; v++) f.accumulateProduct(acc[i][v], av, bv[v], fma);
    }
  };
  const depthLoop = (count: number) => {
    f.block().loop();
    f.localGet(kc).i32Const(count).i32LtS().brIf(1);
    for (let u = 0; u < count; u++) step(u);
    for (let i = 0; i < rows; i++) f.localGet(row[i]).i32Const(count * 4).i32Add().localSet(row[i]);
    f.localGet(b).i32Const(count * nr * 4).i32Add().localSet(b);
    f.localGet(kc).i32Const(count).i32Sub().localSet(kc);
    f.br(0).end().end();
  };
  if (unroll > 1) depthLoop(unroll);
  depthLoop(1);

  const out = f.local(i32);
  if (fast) {
    // acc[i][v] lane l is C[j0 + 4v + l, i0 + i]: rows 0–3 of each four columns transpose into
    // four vectors along a row of C, the rows past them go lane by lane.
    const s = [f.local(v128), f.local(v128), f.local(v128), f.local(v128)];
    const t = [f.local(v128), f.local(v128), f.local(v128), f.local(v128)];
    const store = (add: boolean) => {
      f.localGet(c).localSet(out);
      for (let v = 0; v < vectors; v++) {
        writeTranspose4(f, [acc[0][v], acc[1][v], acc[2][v], acc[3][v]], s, (l, push) => {
          push();
          f.localSet(t[l]);
        });
        for (let l = 0; l < 4; l++) {
          if (v > 0 || l > 0) f.localGet(out).localGet(ldc).i32Add().localSet(out);
          f.localGet(out).localGet(t[l]);
          if (add) f.localGet(out).v128Load().f32x4Add();
          f.v128Store();
          for (let i = 4; i < rows; i++) {
            f.localGet(out).localGet(acc[i][v]).f32x4ExtractLane(l);
            if (add) f.localGet(out).f32Load(4 * i).f32Add();
            f.f32Store(4 * i);
          }
        }
      }
    };
    f.localGet(accumulate).if();
    store(true);
    f.else();
    store(false);
    f.end();
    return;
  }
  // Edge tiles: the tile as computed (row i of W at tile + 4·nr·i), then element by element.
  for (let i = 0; i < rows; i++) {
    for (let v = 0; v < vectors; v++) f.localGet(tile).localGet(acc[i][v]).v128Store((i * nr + v * 4) * 4);
  }
  const j = f.local(i32), from = f.local(i32), value = f.local(ValType.f32);
  f.localGet(c).localSet(out);
  f.localGet(tile).localSet(from);
  f.forRange(j, () => f.i32Const(0), () => f.localGet(cols), 1, () => {
    for (let i = 0; i < rows; i++) {
      f.localGet(from).f32Load(i * nr * 4).localSet(value);
      f.localGet(accumulate).if().localGet(value).localGet(out).f32Load(4 * i).f32Add().localSet(value).end();
      f.localGet(out).localGet(value).f32Store(4 * i);
    }
    f.localGet(out).localGet(ldc).i32Add().localSet(out);
    f.localGet(from).i32Const(4).i32Add().localSet(from);
  });
}

/**
 * Stem of the exported names of {@link emitRowsMacro}'s kernels (the tile's rows appended).
 *
 * `(a, lda, bPacked, c, n, m, depth, ldc, accumulate, tile)`: C (m × n at `c`, rows `ldc` bytes
 * apart) (+)= X·Wᵀ over `depth` steps, W's n rows at `a` (`lda` bytes apart, read in place), X
 * packed by `gemm_pack_b` into NR-lane panels `depth` deep at `bPacked`, the MR×NR scratch tile
 * at `tile`. The first depth block adds to C only if `accumulate`; later ones always do.
 */
export const ROWS_MACRO = "gemm_macro_rows";

/** Adds the in-place micro-kernels of `shape` and the macro-kernel sweeping them, exported as `name`. */
export function emitRowsMacro(builder: ModuleBuilder, shape: GemmKernelShape, name: string): void {
  const { mr, nr } = shape;
  if (mr < 4 || nr % 4 !== 0) {
    throw new RangeError(`emitRowsMacro: tile ${mr}×${nr} needs MR ≥ 4 and NR a multiple of 4`);
  }
  const params = Array(9).fill(i32);
  const fast = builder.addFunction(undefined, params, [], (f) => writeRowsMicroKernel(f, shape, mr, true));
  const edge = [-1];
  for (let rows = 1; rows <= mr; rows++) {
    edge.push(builder.addFunction(undefined, params, [], (f) => writeRowsMicroKernel(f, shape, rows, false)));
  }
  builder.addFunction(name, Array(10).fill(i32), [], (f) => {
    const [a, lda, bPacked, c, n, m, depth, ldc, accumulate, tile] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
    const i0 = f.local(i32), pc = f.local(i32), j0 = f.local(i32);
    const rows = f.local(i32), kc = f.local(i32), cols = f.local(i32), add = f.local(i32);
    const ap = f.local(i32), bp = f.local(i32), cp = f.local(i32), panelBytes = f.local(i32);
    f.localGet(depth).i32Const(nr * 4).i32Mul().localSet(panelBytes);
    f.forRange(i0, () => f.i32Const(0), () => f.localGet(n), mr, () => {
      // rows = min(MR, n − i0)
      f.localGet(n).localGet(i0).i32Sub().localTee(rows).i32Const(mr).i32GtS().if();
      f.i32Const(mr).localSet(rows).end();
      f.forRange(pc, () => f.i32Const(0), () => f.localGet(depth), GEMM_DEPTH, () => {
        f.localGet(depth).localGet(pc).i32Sub().localTee(kc).i32Const(GEMM_DEPTH).i32GtS().if();
        f.i32Const(GEMM_DEPTH).localSet(kc).end();
        f.localGet(accumulate).localGet(pc).i32Const(0).i32GtS().i32Or().localSet(add);
        // ap = a + i0·lda + 4·pc, bp = bPacked + 4·NR·pc, cp = c + 4·i0
        f.localGet(a).localGet(i0).localGet(lda).i32Mul().i32Add().localGet(pc).i32Const(2).i32Shl().i32Add()
          .localSet(ap);
        f.localGet(bPacked).localGet(pc).i32Const(nr * 4).i32Mul().i32Add().localSet(bp);
        f.localGet(c).localGet(i0).i32Const(2).i32Shl().i32Add().localSet(cp);
        f.forRange(j0, () => f.i32Const(0), () => f.localGet(m), nr, () => {
          f.localGet(m).localGet(j0).i32Sub().localTee(cols).i32Const(nr).i32GtS().if();
          f.i32Const(nr).localSet(cols).end();
          const args = () =>
            f.localGet(ap).localGet(lda).localGet(bp).localGet(cp).localGet(kc).localGet(ldc).localGet(add)
              .localGet(cols).localGet(tile);
          f.localGet(rows).i32Const(mr).i32Eq().localGet(cols).i32Const(nr).i32Eq().i32And().if();
          args();
          f.call(fast);
          f.else();
          f.switchCount(rows, mr, (r) => args().call(edge[r]));
          f.end();
          f.localGet(bp).localGet(panelBytes).i32Add().localSet(bp);
          f.localGet(cp).localGet(ldc).i32Const(nr).i32Mul().i32Add().localSet(cp);
        });
      });
    });
  });
}
