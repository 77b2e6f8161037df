/**
 * Generates the GEMM kernels: a register-blocked MR×NR micro-kernel in straight-line SIMD code,
 * the macro-kernel that sweeps it over a packed block, and the packing routine that lays operands
 * out for it.
 *
 * Layout (GotoBLAS): op(A) is packed into panels of MR rows, element (p, i) of a panel at
 * `p·MR + i`; op(B) into panels of NR columns, element (p, j) at `p·NR + j`. The micro-kernel then
 * reads both with unit stride: per depth step one `v128.load` per four columns of B and one per
 * four rows of A (each row's value broadcast from it by a shuffle; leftover rows of an MR that is
 * not a multiple of 4 use `v128.load32_splat`), feeding MR·NR/4 multiply-adds into MR·NR/4
 * accumulator vectors that live in registers for the whole depth loop.
 *
 * Accumulators start at zero for every depth block and are added to C at the end when asked
 * (`accumulate`): blocked summation, whose rounding error grows with the block depth rather than
 * with the whole depth (a weight gradient sums 65,536 products per element on cifar10_quick).
 * Each element is one lane of one accumulator, computed in depth order whatever the tiling, so
 * the result does not depend on the thread that computed a tile or on where tile boundaries fall;
 * it depends on the depth blocking, which is fixed.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";
import { IN_PLACE_ROWS, QUAD_ROWS } from "../gemm.ts";
import { emitRowsMacro, ROWS_MACRO } from "./gemm_rows_kernels.ts";

const { i32, v128 } = ValType;

/** Shape and arithmetic of a generated GEMM kernel. */
export interface GemmKernelShape {
  /** Rows of the register tile. */
  mr: number;
  /** Columns of the register tile (a multiple of 4: one `f32x4` per four columns). */
  nr: number;
  /** Depth steps per iteration of the unrolled depth loop. */
  unroll: number;
  /** Use `f32x4.relaxed_madd` (fused) instead of `f32x4.mul` + `f32x4.add`. */
  fma: boolean;
}

/**
 * Names under which {@link emitGemmKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { GEMM_EXPORTS } from "./gemm_kernels.ts";
 * console.log(GEMM_EXPORTS.macro); // "gemm_macro"
 * ```
 */
export const GEMM_EXPORTS = {
  /** `(aPacked, bPacked, c, mc, nc, kc, ldcBytes, accumulate, tile)`: C block (+)= packed A · packed B. */
  macro: "gemm_macro",
  /**
   * The same over A packed in 4-row panels (`QUAD_ROWS` in `gemm.ts`), whatever the GEMM tile's MR: the
   * layout Winograd's transforms write directly, four tiles or outputs to a vector.
   */
  quadMacro: "gemm_macro_quads",
  /**
   * A few rows of X times Wᵀ with W read in place: see `ROWS_MACRO` in `gemm_rows_kernels.ts`; one
   * export per tile height in `IN_PLACE_ROWS` (`gemm.ts`), the height appended (`gemm_macro_rows6`).
   */
  rowsMacro: ROWS_MACRO,
  /** `(src, laneStrideBytes, depthStrideBytes, lanes, depth, dst)`: packs op(A) into MR-row panels. */
  packA: "gemm_pack_a",
  /** Same for op(B) into NR-column panels. */
  packB: "gemm_pack_b",
  /**
   * `(src, depthStrideBytes, lanes, depth, dst)`: op(B) with contiguous columns, whole panels only
   * (`lanes` a multiple of NR), several depth rows at a time.
   */
  packBRows: "gemm_pack_b_rows",
} as const;

/**
 * The micro-kernel `(a, b, c, kc, ldcBytes, accumulate)`: C tile (MR×NR at `c`, rows `ldcBytes`
 * apart) = Σ_p a[p]·b[p] over the `kc` depth steps of one A panel and one B panel, plus the C tile
 * if `accumulate`.
 */
function writeMicroKernel(f: FunctionWriter, shape: GemmKernelShape, rows: number): void {
  // `rows` of the MR-row panel are computed: fewer at the bottom edge of C, where the panel's
  // last rows are zero padding (computing them would waste work and need a scratch tile).
  const { mr, nr, unroll, fma } = shape;
  const vectors = nr / 4;
  const [a, b, c, kc, ldc, accumulate] = [0, 1, 2, 3, 4, 5];
  // Accumulators are zero on entry: locals are zero-initialised.
  const acc: number[][] = [];
  for (let i = 0; i < rows; i++) acc.push(Array.from({ length: vectors }, () => f.local(v128)));
  const bv = Array.from({ length: vectors }, () => f.local(v128));
  const av = f.local(v128), quad = f.local(v128);
  const row = f.local(i32);
  // Rows in whole groups of four read their A values as one vector and broadcast each lane with a
  // shuffle; the rest load-and-splat. Loads are scarcer than multiply-adds on a shared core
  // (another tenant's thread on the same physical core): a splat load for every row (6×8, 8 loads
  // per 12 multiply-adds) ran at 21.5 GFLOP/s there where the 4×8 tile's 3 per 8 held 26. The
  // 5×8 tile (4 per 10) keeps that, and its 10 accumulators cover the multiply-add's latency
  // where 8 did not (see `GEMM_TILE` in `gemm.ts`).
  const quadRows = mr - (mr % 4);

  /** One depth step read at `offset` steps past the panel pointers. */
  const step = (offset: number) => {
    for (let v = 0; v < vectors; v++) f.localGet(b).v128Load((offset * nr + v * 4) * 4).localSet(bv[v]);
    for (let i = 0; i < rows; i++) {
      if (i < quadRows) {
        // The panel holds MR values per step (zero past the block's rows), so the vector stays
        // inside it even when fewer rows are computed.
        if (i % 4 === 0) f.localGet(a).v128Load((offset * mr + i) * 4).localSet(quad);
        const lane = i % 4;
        f.localGet(quad).localGet(quad).shuffleF32Lanes([lane, lane, lane, lane]).localSet(av);
      } else f.localGet(a).v128Load32Splat((offset * mr + i) * 4).localSet(av);
      for (let v = 0; v < vectors; v++) {
        f.accumulateProduct(acc[i][v], av, bv[v], fma);
      }
    }
  };
  /** `while (kc >= count) { count steps; advance }`. */
  const depthLoop = (count: number) => {
    f.block().loop();
    f.localGet(kc).i32Const(count).i32LtS().brIf(1);
    for (let u = 0; u < count; u++) step(u);
    f.localGet(a).i32Const(count * mr * 4).i32Add().localSet(a);
    f.localGet(b).i32Const(count * nr * 4).i32Add().localSet(b);
    f.localGet(kc).i32Const(count).i32Sub().localSet(kc);
    f.br(0).end().end();
  };
  if (unroll > 1) depthLoop(unroll);
  depthLoop(1);

  const store = (add: boolean) => {
    f.localGet(c).localSet(row);
    for (let i = 0; i < rows; i++) {
      if (i > 0) f.localGet(row).localGet(ldc).i32Add().localSet(row);
      for (let v = 0; v < vectors; v++) {
        f.localGet(row).localGet(acc[i][v]);
        if (add) f.localGet(row).v128Load(v * 16).f32x4Add();
        f.v128Store(v * 16);
      }
    }
  };
  f.localGet(accumulate).if();
  store(true);
  f.else();
  store(false);
  f.end();
}

/**
 * Copies `rows × cols` floats between two row-major windows (`fromLd`/`toLd` bytes per row):
 * how an edge tile moves between C and the full-size scratch tile.
 */
function writeTileCopy(
  f: FunctionWriter,
  from: number,
  fromLd: () => void,
  to: number,
  toLd: () => void,
  rows: number,
  cols: number,
): void {
  const i = f.local(i32), j = f.local(i32), src = f.local(i32), dst = f.local(i32);
  f.localGet(from).localSet(src).localGet(to).localSet(dst);
  f.forRange(i, () => f.i32Const(0), () => f.localGet(rows), 1, () => {
    f.forRange(j, () => f.i32Const(0), () => f.localGet(cols), 1, () => {
      f.localGet(dst).localGet(j).i32Const(2).i32Shl().i32Add();
      f.localGet(src).localGet(j).i32Const(2).i32Shl().i32Add().f32Load();
      f.f32Store();
    });
    f.localGet(src);
    fromLd();
    f.i32Add().localSet(src);
    f.localGet(dst);
    toLd();
    f.i32Add().localSet(dst);
  });
}

/**
 * The macro-kernel `(aPacked, bPacked, c, mc, nc, kc, ldcBytes, accumulate, tile)`: sweeps the
 * micro-kernel over an `mc × nc` block of C from `ceil(mc/MR)` packed A panels and `ceil(nc/NR)`
 * packed B panels of depth `kc`. Tiles short of rows at the bottom edge run a micro-kernel for
 * exactly their rows; tiles short of columns at the right edge run on the MR×NR scratch `tile`
 * and copy back only their valid part, so C is never written outside its window.
 */
function writeMacroKernel(f: FunctionWriter, shape: GemmKernelShape, micro: readonly number[]): void {
  const { mr, nr } = shape;
  const [aPacked, bPacked, c, mc, nc, kc, ldc, accumulate, tile] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const i0 = f.local(i32), j0 = f.local(i32), ap = f.local(i32), bp = f.local(i32), cp = f.local(i32);
  const rows = f.local(i32), cols = f.local(i32);
  f.localGet(bPacked).localSet(bp);
  f.forRange(j0, () => f.i32Const(0), () => f.localGet(nc), nr, () => {
    f.localGet(aPacked).localSet(ap);
    // cols = min(NR, nc − j0)
    f.localGet(nc).localGet(j0).i32Sub().localTee(cols).i32Const(nr).i32GtS().if();
    f.i32Const(nr).localSet(cols).end();
    f.forRange(i0, () => f.i32Const(0), () => f.localGet(mc), mr, () => {
      f.localGet(mc).localGet(i0).i32Sub().localTee(rows).i32Const(mr).i32GtS().if();
      f.i32Const(mr).localSet(rows).end();
      f.localGet(c).localGet(i0).localGet(ldc).i32Mul().i32Add().localGet(j0).i32Const(2).i32Shl().i32Add();
      f.localSet(cp);
      f.localGet(cols).i32Const(nr).i32Eq().if();
      // Full width: the micro-kernel for exactly this many rows, straight into C.
      f.switchCount(rows, mr, (r) => {
        f.localGet(ap).localGet(bp).localGet(cp).localGet(kc).localGet(ldc).localGet(accumulate).call(
          micro[r],
        );
      });
      f.else();
      f.localGet(accumulate).if();
      writeTileCopy(f, cp, () => f.localGet(ldc), tile, () => f.i32Const(nr * 4), rows, cols);
      f.end();
      f.localGet(ap).localGet(bp).localGet(tile).localGet(kc).i32Const(nr * 4).localGet(accumulate).call(
        micro[mr],
      );
      writeTileCopy(f, tile, () => f.i32Const(nr * 4), cp, () => f.localGet(ldc), rows, cols);
      f.end();
      f.localGet(ap).localGet(kc).i32Const(mr * 4).i32Mul().i32Add().localSet(ap);
    });
    f.localGet(bp).localGet(kc).i32Const(nr * 4).i32Mul().i32Add().localSet(bp);
  });
}

/**
 * The packing routine `(src, laneStrideBytes, depthStrideBytes, lanes, depth, dst)` for panels
 * of `width` lanes: element (lane l, depth p) of the source, at `src + l·laneStride + p·depthStride`,
 * goes to panel ⌊l/width⌋ at `p·width + l mod width`; lanes past `lanes` are zero. Full panels
 * whose lanes are contiguous (laneStride = 4) copy whole vectors; the rest go element by element.
 */
function writePack(f: FunctionWriter, width: number): void {
  const [src, laneStride, depthStride, lanes, depth, dst] = [0, 1, 2, 3, 4, 5];
  const l0 = f.local(i32), p = f.local(i32), l = f.local(i32), count = f.local(i32);
  const panel = f.local(i32), from = f.local(i32);
  f.forRange(l0, () => f.i32Const(0), () => f.localGet(lanes), width, () => {
    f.localGet(lanes).localGet(l0).i32Sub().localTee(count).i32Const(width).i32GtS().if();
    f.i32Const(width).localSet(count).end();
    // panel = src + l0·laneStride: the first lane of this panel at depth 0
    f.localGet(src).localGet(l0).localGet(laneStride).i32Mul().i32Add().localSet(panel);
    f.localGet(count).i32Const(width).i32Eq().localGet(laneStride).i32Const(4).i32Eq().i32And().if();
    {
      f.forRange(p, () => f.i32Const(0), () => f.localGet(depth), 1, () => {
        f.localGet(panel).localGet(p).localGet(depthStride).i32Mul().i32Add().localSet(from);
        // Whole vectors, then a pair, then a single float: any width (MR = 4 and NR = 8 here).
        let lane = 0;
        for (; lane + 4 <= width; lane += 4) {
          f.localGet(dst).localGet(from).v128Load(lane * 4).v128Store(lane * 4);
        }
        for (; lane + 2 <= width; lane += 2) {
          f.localGet(dst).localGet(from).i64Load(lane * 4).i64Store(lane * 4);
        }
        for (; lane < width; lane++) f.localGet(dst).localGet(from).f32Load(lane * 4).f32Store(lane * 4);
        f.localGet(dst).i32Const(width * 4).i32Add().localSet(dst);
      });
    }
    f.else();
    f.localGet(count).i32Const(width).i32Eq().localGet(depthStride).i32Const(4).i32Eq().i32And().if();
    writeTransposingPack(f, width, { panel, laneStride, depth, dst, p });
    f.else();
    {
      f.forRange(p, () => f.i32Const(0), () => f.localGet(depth), 1, () => {
        f.localGet(panel).localGet(p).localGet(depthStride).i32Mul().i32Add().localSet(from);
        f.forRange(l, () => f.i32Const(0), () => f.localGet(count), 1, () => {
          f.localGet(dst).localGet(l).i32Const(2).i32Shl().i32Add();
          f.localGet(from).localGet(l).localGet(laneStride).i32Mul().i32Add().f32Load();
          f.f32Store();
        });
        f.forRange(l, () => f.localGet(count), () => f.i32Const(width), 1, () => {
          f.localGet(dst).localGet(l).i32Const(2).i32Shl().i32Add().f32Const(0).f32Store();
        });
        f.localGet(dst).i32Const(width * 4).i32Add().localSet(dst);
      });
    }
    f.end();
    f.end();
  });
}

/**
 * A 4×4 transpose of the vectors in locals `r` (row q = r[q]) with 8 shuffles through the 4 scratch
 * locals `t`: `use(l, push)` is called for each column l in order, and `push()` leaves column l
 * (r[0][l], r[1][l], r[2][l], r[3][l]) on the stack.
 */
export function writeTranspose4(
  f: FunctionWriter,
  r: readonly number[],
  t: readonly number[],
  use: (column: number, push: () => void) => void,
): void {
  f.localGet(r[0]).localGet(r[1]).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[0]); // a0 b0 a1 b1
  f.localGet(r[0]).localGet(r[1]).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[1]); // a2 b2 a3 b3
  f.localGet(r[2]).localGet(r[3]).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[2]); // c0 d0 c1 d1
  f.localGet(r[2]).localGet(r[3]).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[3]); // c2 d2 c3 d3
  const columns: [number, number, [number, number, number, number]][] = [
    [t[0], t[2], [0, 1, 4, 5]],
    [t[0], t[2], [2, 3, 6, 7]],
    [t[1], t[3], [0, 1, 4, 5]],
    [t[1], t[3], [2, 3, 6, 7]],
  ];
  columns.forEach(([x, y, lanes], column) =>
    use(column, () => f.localGet(x).localGet(y).shuffleF32Lanes(lanes))
  );
}

/**
 * A full panel whose lanes are rows of contiguous depth (row-major A, transposed B): four depth
 * steps at a time, each group of four lanes is loaded as four vectors along the depth and
 * transposed with shuffles into four vectors across the lanes; a trailing pair of lanes (a 4k + 2
 * wide panel) is interleaved into 64-bit halves, a trailing single lane (4k + 1) copied as floats.
 * Leftover depth steps go element by element.
 */
function writeTransposingPack(
  f: FunctionWriter,
  width: number,
  at: { panel: number; laneStride: number; depth: number; dst: number; p: number },
): void {
  const { panel, laneStride, depth, dst, p } = at;
  const rows = Array.from({ length: width }, () => f.local(i32));
  const r = [f.local(v128), f.local(v128), f.local(v128), f.local(v128)];
  const t = [f.local(v128), f.local(v128), f.local(v128), f.local(v128)];
  // rows[l] = address of lane l at depth 0
  f.localGet(panel).localSet(rows[0]);
  for (let l = 1; l < width; l++) f.localGet(rows[l - 1]).localGet(laneStride).i32Add().localSet(rows[l]);
  f.i32Const(0).localSet(p);
  f.block().loop();
  f.localGet(p).i32Const(4).i32Add().localGet(depth).i32GtS().brIf(1);
  let g = 0;
  for (; g + 4 <= width; g += 4) {
    for (let q = 0; q < 4; q++) f.localGet(rows[g + q]).v128Load().localSet(r[q]);
    writeTranspose4(f, r, t, (step, push) => {
      f.localGet(dst);
      push();
      f.v128Store((step * width + g) * 4);
    });
  }
  if (width - g === 1) {
    // A last single lane (a 4k + 1 wide panel, the 5-row A panel): its four depth steps as floats.
    for (let step = 0; step < 4; step++) {
      f.localGet(dst).localGet(rows[g]).f32Load(step * 4).f32Store((step * width + g) * 4);
    }
  } else if (width - g === 2) {
    f.localGet(rows[g]).v128Load().localSet(r[0]);
    f.localGet(rows[g + 1]).v128Load().localSet(r[1]);
    f.localGet(r[0]).localGet(r[1]).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[0]);
    f.localGet(r[0]).localGet(r[1]).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[1]);
    for (let step = 0; step < 4; step++) {
      f.localGet(dst).localGet(t[step >> 1]).v128Store64Lane((step * width + g) * 4, step & 1);
    }
  } else if (width - g !== 0) {
    throw new RangeError(`transposing pack: panel width ${width} is not 4k, 4k + 1 or 4k + 2`);
  }
  for (let l = 0; l < width; l++) f.localGet(rows[l]).i32Const(16).i32Add().localSet(rows[l]);
  f.localGet(dst).i32Const(16 * width).i32Add().localSet(dst);
  f.localGet(p).i32Const(4).i32Add().localSet(p);
  f.br(0).end().end();
  // Leftover depth steps.
  f.block().loop();
  f.localGet(p).localGet(depth).i32GeS().brIf(1);
  for (let l = 0; l < width; l++) {
    f.localGet(dst).localGet(rows[l]).f32Load().f32Store(l * 4);
    f.localGet(rows[l]).i32Const(4).i32Add().localSet(rows[l]);
  }
  f.localGet(dst).i32Const(4 * width).i32Add().localSet(dst);
  f.localGet(p).i32Const(1).i32Add().localSet(p);
  f.br(0).end().end();
}

/** Depth rows per block of {@link writeRowBlockPack} (8 measured best of 2, 4, 8 and 16). */
const ROW_BLOCK = 8;

/**
 * Packing of whole panels with contiguous lanes, `(src, depthStrideBytes, lanes, depth, dst)`
 * with `lanes` a multiple of `width`, in blocks of {@link ROW_BLOCK} depth rows: each block reads
 * that many rows of the source front to back (sequential streams the hardware prefetcher follows)
 * and writes each panel's rows as whole cache lines. Walking one panel at a time down the depth
 * instead touches a new row, `depthStride` bytes away, at every step: one cache miss each,
 * latency-bound (≈ 11 GB/s here against the FC layer's 151 MB weight matrix).
 */
function writeRowBlockPack(f: FunctionWriter, width: number): void {
  const block = ROW_BLOCK;
  const [src, depthStride, lanes, depth, dst] = [0, 1, 2, 3, 4];
  const p = f.local(i32),
    l0 = f.local(i32),
    from = f.local(i32),
    to = f.local(i32),
    panelBytes = f.local(i32);
  const rows = f.local(i32), q = f.local(i32);
  f.localGet(depth).i32Const(width * 4).i32Mul().localSet(panelBytes);
  f.i32Const(0).localSet(p);
  f.block().loop();
  f.localGet(p).localGet(depth).i32GeS().brIf(1);
  // rows = min(4, depth − p)
  f.localGet(depth).localGet(p).i32Sub().localTee(rows).i32Const(block).i32GtS().if().i32Const(block)
    .localSet(rows)
    .end();
  f.localGet(rows).i32Const(block).i32Eq().if();
  {
    f.localGet(src).localGet(p).localGet(depthStride).i32Mul().i32Add().localSet(from);
    f.localGet(dst).localGet(p).i32Const(width * 4).i32Mul().i32Add().localSet(to);
    const stride = f.local(i32);
    f.forRange(l0, () => f.i32Const(0), () => f.localGet(lanes), width, () => {
      f.localGet(from).localSet(stride);
      for (let r = 0; r < block; r++) {
        if (r > 0) f.localGet(stride).localGet(depthStride).i32Add().localSet(stride);
        for (let lane = 0; lane < width; lane += 4) {
          f.localGet(to).localGet(stride).v128Load(lane * 4).v128Store((r * width + lane) * 4);
        }
      }
      f.localGet(from).i32Const(width * 4).i32Add().localSet(from);
      f.localGet(to).localGet(panelBytes).i32Add().localSet(to);
    });
  }
  f.else();
  // The last rows short of a block, one at a time.
  f.forRange(q, () => f.i32Const(0), () => f.localGet(rows), 1, () => {
    f.localGet(src).localGet(p).localGet(q).i32Add().localGet(depthStride).i32Mul().i32Add().localSet(from);
    f.localGet(dst).localGet(p).localGet(q).i32Add().i32Const(width * 4).i32Mul().i32Add().localSet(to);
    f.forRange(l0, () => f.i32Const(0), () => f.localGet(lanes), width, () => {
      for (let lane = 0; lane < width; lane += 4) {
        f.localGet(to).localGet(from).v128Load(lane * 4).v128Store(lane * 4);
      }
      f.localGet(from).i32Const(width * 4).i32Add().localSet(from);
      f.localGet(to).localGet(panelBytes).i32Add().localSet(to);
    });
  });
  f.end();
  f.localGet(p).i32Const(block).i32Add().localSet(p);
  f.br(0).end().end();
}

/**
 * Adds the micro-kernels of `shape` (one per row count 1..MR) and the macro-kernel sweeping them,
 * exported as `name`.
 */
function emitMacro(builder: ModuleBuilder, shape: GemmKernelShape, name: string): void {
  // micro[r]: the micro-kernel computing the first r rows of a panel (index 0 unused).
  const micro = [-1];
  for (let rows = 1; rows <= shape.mr; rows++) {
    micro.push(
      builder.addFunction(
        undefined,
        [i32, i32, i32, i32, i32, i32],
        [],
        (f) => writeMicroKernel(f, shape, rows),
      ),
    );
  }
  builder.addFunction(name, Array(9).fill(i32), [], (f) => writeMacroKernel(f, shape, micro));
}

/**
 * Adds the GEMM kernels for `shape` to `builder`, exported under {@link GEMM_EXPORTS}: the
 * macro-kernel and packing for `shape`, and the macro-kernel over {@link QUAD_ROWS}-row A panels.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitGemmKernels } from "./gemm_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitGemmKernels(builder, { mr: 5, nr: 8, unroll: 4, fma: false });
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitGemmKernels(builder: ModuleBuilder, shape: GemmKernelShape): void {
  if (shape.nr % 4 !== 0 || shape.mr < 1 || shape.unroll < 1) {
    throw new RangeError(`emitGemmKernels: bad tile ${shape.mr}×${shape.nr} unroll ${shape.unroll}`);
  }
  emitMacro(builder, shape, GEMM_EXPORTS.macro);
  emitMacro(builder, { ...shape, mr: QUAD_ROWS }, GEMM_EXPORTS.quadMacro);
  for (const rows of IN_PLACE_ROWS) {
    if (rows > 0) emitRowsMacro(builder, { ...shape, mr: rows }, `${ROWS_MACRO}${rows}`);
  }
  builder.addFunction(GEMM_EXPORTS.packA, Array(6).fill(i32), [], (f) => writePack(f, shape.mr));
  builder.addFunction(GEMM_EXPORTS.packB, Array(6).fill(i32), [], (f) => writePack(f, shape.nr));
  builder.addFunction(GEMM_EXPORTS.packBRows, Array(5).fill(i32), [], (f) => writeRowBlockPack(f, shape.nr));
}
