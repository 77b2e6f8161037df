/**
 * The blocked GEMM driver over the generated kernels: C (m×n at `c`, rows `ldc` floats apart) =
 * [C if accumulating] + op(A)·op(B), everything addressed by byte pointers into the kernels'
 * memory. It runs unchanged on the main thread and on every pool thread, each on its own
 * sub-problem (a range of columns or rows of C) with its own scratch.
 *
 * Loop order (GotoBLAS): columns in NC blocks, depth in KC blocks (B block packed once, it stays
 * in L2/L3), rows in MC blocks (A block packed, it stays in L2), then the macro-kernel sweeps
 * MR×NR tiles with one KC×NR panel of B in L1. Each depth block sums into fresh accumulators that
 * are then added to C (blocked summation: rounding error grows with KC, not with k). An element's
 * arithmetic depends on KC only, never on MC, NC or on how the threads split C, so results are
 * the same whatever the thread count, and whatever MC and NC a machine chooses (`blocking.ts`):
 * KC alone is fixed for every machine.
 *
 * @module
 */

/**
 * The register tile of the generated GEMM kernels: MR×NR, 10 accumulator vectors, 2 of B, the
 * current step's first 4 A values as one vector and a lane of it broadcast, the fifth splat-loaded
 * (14 of the 16 SIMD registers). Ten independent multiply-add chains cover the instruction's
 * latency on two FMA pipes where the 4×8 tile's eight did not: on the FC input gradient's
 * macro-kernel (64×9216×4096, B packed) 5×8 ran at 47.7–48.5 GFLOP/s against 41.8 for 4×8, with
 * the same bits (a 2-core AMD EPYC, family 26, whose 128-bit peak is about 52). 6×8 needs 16
 * registers and spills (23 GFLOP/s); 3×12 and 2×16 ran at 31–33. Winograd's products keep 4-row A
 * panels (`QUAD_ROWS`), the layout its transforms write.
 *
 * @example
 * ```ts
 * import { GEMM_TILE } from "./gemm.ts";
 * console.log(`${GEMM_TILE.mr}×${GEMM_TILE.nr}`); // "5×8"
 * ```
 */
export const GEMM_TILE = { mr: 5, nr: 8 } as const;

/**
 * Rows of the A panels `gemm_macro_quads` reads: 4, one `f32x4` of them per depth step, whatever
 * {@link GEMM_TILE}'s MR. Winograd's transforms write its tiles (and output gradients) straight
 * into this layout, four to a vector.
 */
export const QUAD_ROWS = 4;

/**
 * Rows of W per register tile that {@link GemmBlocks.inPlaceRows} may choose for a fully connected
 * layer's forward product X·Wᵀ, where W is read in place (`gemm_macro_rows5`, `gemm_macro_rows6`; see
 * `generate/gemm_rows_kernels.ts`), or 0: W packed like any other B ({@link GEMM_TILE}). The tile's
 * columns are NR rows of X. 6 rows hold 12 accumulators, 2 vectors of X and one splat-loaded W value
 * (15 registers), at 8 loads per 12 multiply-adds; 5 rows, 7 per 10; the packed tile, 4 loads and 4
 * shuffles per 10, but W is read and written once more. Which is fastest depends on the core: on the
 * 9216→4096 layer at batch 64 (one thread, a 2-core AMD EPYC, family 26, 128-bit peak about 58
 * GFLOP/s) 6 rows ran at 52.4–53.1 GFLOP/s, 5 at 49.7, packed at 47.7 (4 rows: 47.3; 7 spill, 29.5),
 * but on a shared core where loads were scarce, a splat load per row (6×8) had run slower than 4×8
 * packed tiles. So it is chosen per machine: `deno task tune` measures the three.
 *
 * @example
 * ```ts
 * import { IN_PLACE_ROWS } from "./gemm.ts";
 * console.log(IN_PLACE_ROWS); // [0, 5, 6]
 * ```
 */
export const IN_PLACE_ROWS = [0, 5, 6] as const;

/** {@link GemmBlocks.inPlaceRows} where a machine has not chosen: the fastest where it was measured. */
export const DEFAULT_IN_PLACE_ROWS = 6;

/**
 * Depth of a cache block (KC): the one blocking size that fixes bits (each depth block sums into
 * fresh accumulators), so it is the same on every machine; MC and NC ({@link GemmBlocks}) are
 * chosen per machine.
 *
 * @example
 * ```ts
 * import { GEMM_DEPTH } from "./gemm.ts";
 * console.log(GEMM_DEPTH); // 256
 * ```
 */
export const GEMM_DEPTH = 256;

/**
 * The cache blocks a machine chooses: rows of A packed at once (MC, its MC×KC block meant to stay
 * in L2; the driver packs whole MR-row panels, {@link blockRows} of them) and columns of B packed
 * at once (NC, a multiple of NR, its KC×NC block in a thread's share of L3), and how a fully
 * connected layer's forward product reads its weights. None changes any bit of any result.
 */
export interface GemmBlocks {
  /** MC: rows of op(A) per packed block. */
  mc: number;
  /** NC: columns of op(B) per packed block. */
  nc: number;
  /**
   * Rows of W per register tile where few rows of X times Wᵀ read W in place, or 0 to pack W
   * ({@link IN_PLACE_ROWS}; default {@link DEFAULT_IN_PLACE_ROWS}).
   */
  inPlaceRows?: number;
  /**
   * NC where op(A) has few rows ({@link fewRows}) and op(B) is packed in blocks (default `nc`).
   * Such a product reads each packed B block only once per MC block of its few rows, so keeping
   * that block in L2 is worth packing A again for every block of B: on a 2-core Xeon (2 MiB L2)
   * the FC input gradient dY·W (64×9216×4096) ran 46.5 GFLOP/s on 1 thread at NC 1024 and 43.1 at
   * NC 8192, while its weight gradient (4096 rows) ran 3% faster at 8192 than at 1024.
   */
  fewRowsNc?: number;
}

/**
 * The blocks the kernels were tuned with, on a machine with 256 KiB of L2 per core (where they
 * ran at 95% of the FMA peak); what a machine that reports nothing of its caches gets.
 *
 * @example
 * ```ts
 * import { DEFAULT_GEMM_BLOCKS } from "./gemm.ts";
 * console.log(DEFAULT_GEMM_BLOCKS); // { mc: 96, nc: 2048 }
 * ```
 */
export const DEFAULT_GEMM_BLOCKS: GemmBlocks = Object.freeze({ mc: 96, nc: 2048 });

/**
 * What MC must be a multiple of: 12, the quantum every tuning so far measured and filed in (the
 * tile's MR has been 6, 4 and 5); the driver rounds it down to whole MR-row panels
 * ({@link blockRows}).
 */
export const GEMM_ROW_QUANTUM = 12;

/**
 * Smallest and largest MC and NC accepted: below, the packing overhead dominates; above, one
 * thread's scratch ({@link gemmScratchBytes}) would pass 9 MiB.
 */
export const GEMM_BLOCK_LIMITS = Object.freeze({ mc: [12, 480], nc: [256, 8192] } as const);

/**
 * Why `blocks` cannot drive the GEMM (a one-line reason naming the field), or `undefined`.
 *
 * @example
 * ```ts
 * import { gemmBlocksProblem } from "./gemm.ts";
 * gemmBlocksProblem({ mc: 100, nc: 2048 }); // "mc 100 is not a multiple of 12 in [12, 480]"
 * ```
 */
export function gemmBlocksProblem(blocks: GemmBlocks): string | undefined {
  const quanta = { mc: GEMM_ROW_QUANTUM, nc: GEMM_TILE.nr } as const;
  for (const field of ["mc", "nc", "fewRowsNc"] as const) {
    const value = blocks[field];
    if (field === "fewRowsNc" && value === undefined) continue;
    const limits = field === "mc" ? "mc" : "nc", quantum = quanta[limits];
    const [low, high] = GEMM_BLOCK_LIMITS[limits];
    if (!Number.isInteger(value) || value! < low || value! > high || value! % quantum !== 0) {
      return `${field} ${value} is not a multiple of ${quantum} in [${low}, ${high}]`;
    }
  }
  const rows = blocks.inPlaceRows;
  if (rows !== undefined && !(IN_PLACE_ROWS as readonly number[]).includes(rows)) {
    return `inPlaceRows ${rows} is not one of ${IN_PLACE_ROWS.join(", ")}`;
  }
  return undefined;
}

/**
 * `blocks` as kernels and their threads use them, every optional field filled in:
 * {@link GemmBlocks.fewRowsNc} is NC where unset; {@link GemmBlocks.inPlaceRows} is
 * {@link DEFAULT_IN_PLACE_ROWS} where unset, and 5 for 6 where the kernels lack the fused
 * multiply-add (`fma` false): there each product needs a temporary register, so 6 rows take 16
 * and spill (27.6 GFLOP/s against 46.3 for 5 rows on the FC forward product, one thread, the
 * machine of {@link IN_PLACE_ROWS}).
 *
 * @example
 * ```ts
 * import { kernelBlocks } from "./gemm.ts";
 * console.log(kernelBlocks({ mc: 96, nc: 2048 }, true)); // { mc: 96, nc: 2048, inPlaceRows: 6, fewRowsNc: 2048 }
 * console.log(kernelBlocks({ mc: 96, nc: 2048 }, false).inPlaceRows); // 5
 * ```
 */
export function kernelBlocks(blocks: GemmBlocks, fma: boolean): Required<GemmBlocks> {
  const rows = blocks.inPlaceRows ?? DEFAULT_IN_PLACE_ROWS;
  return {
    mc: blocks.mc,
    nc: blocks.nc,
    inPlaceRows: !fma && rows === 6 ? 5 : rows,
    fewRowsNc: blocks.fewRowsNc ?? blocks.nc,
  };
}

/**
 * Rows of A one MC block holds: MC rounded down to whole MR-row panels (95 of MC 96 with MR 5),
 * so a block's packed panels fit its MC×KC slot.
 *
 * @example
 * ```ts
 * import { blockRows } from "./gemm.ts";
 * console.log(blockRows({ mc: 96, nc: 2048 })); // 95
 * ```
 */
export function blockRows(blocks: GemmBlocks): number {
  return blocks.mc - (blocks.mc % GEMM_TILE.mr);
}

/**
 * Rows of X that still count as few in X·Wᵀ (transposed B, depth past one KC block): up to which
 * the product runs as a fully connected layer's forward, W read in place or packed panel by panel
 * ({@link GemmBlocks.inPlaceRows}) instead of in KC × NC blocks: {@link blockRows}, and at least
 * {@link FEW_ROWS} whatever MC. Neither path packs X in MC blocks (each packs all of its rows on
 * its own), and a machine whose L1-sized MC suits every other product would otherwise lose them
 * on a batch of 64: on a 2-core Xeon (48 KiB L1d) MC 24 ran the square and FC-gradient products
 * 1.02–1.20× faster than MC 480, but the FC forward, blocked at MC 48, 0.93×.
 *
 * @example
 * ```ts
 * import { fewRows } from "./gemm.ts";
 * console.log(fewRows({ mc: 24, nc: 1024 }), fewRows({ mc: 480, nc: 8192 })); // 128 480
 * ```
 */
export function fewRows(blocks: GemmBlocks): number {
  return Math.max(blockRows(blocks), FEW_ROWS);
}

/**
 * The least {@link fewRows}: a batch of 128, whose packed X (128 × `ROWS_DEPTH` × 4 bytes = 1 MiB
 * read in place; twice that beside packed W) still stays in a 2 MiB L2 beside W's stream.
 */
export const FEW_ROWS = 128;

/**
 * A generated macro-kernel: C block (`mc` × `nc` at byte address `c`, rows `ldc` bytes apart) =
 * [C if `accumulate`] + packed A · packed B over `kc` depth steps, edge tiles through `tile`.
 */
export type MacroKernel = (
  a: number,
  b: number,
  c: number,
  mc: number,
  nc: number,
  kc: number,
  ldc: number,
  accumulate: number,
  tile: number,
) => void;

/**
 * A generated in-place macro-kernel: C (m × n at byte address `c`, rows `ldc` bytes apart) (+)= X·Wᵀ
 * over `depth` steps, W's n rows at `a` (`lda` bytes apart), X packed in NR-lane panels at `bPacked`.
 */
export type RowsMacroKernel = (
  a: number,
  lda: number,
  bPacked: number,
  c: number,
  n: number,
  m: number,
  depth: number,
  ldc: number,
  accumulate: number,
  tile: number,
) => void;

/** The generated GEMM functions (see `GEMM_EXPORTS` in `generate/gemm_kernels.ts`). */
export interface GemmExports {
  /** See `GEMM_EXPORTS.macro`: A in MR-row panels ({@link GEMM_TILE}). */
  gemm_macro: MacroKernel;
  /** See `GEMM_EXPORTS.quadMacro`: A in 4-row panels ({@link QUAD_ROWS}). */
  gemm_macro_quads: MacroKernel;
  /** `ROWS_MACRO` (`generate/gemm_rows_kernels.ts`) with 5-row tiles: W in place, X in NR-lane panels. */
  gemm_macro_rows5: RowsMacroKernel;
  /** The same with 6-row tiles. */
  gemm_macro_rows6: RowsMacroKernel;
  /** See `GEMM_EXPORTS.packA`. */
  gemm_pack_a(
    src: number,
    laneStride: number,
    depthStride: number,
    lanes: number,
    depth: number,
    dst: number,
  ): void;
  /** See `GEMM_EXPORTS.packB`. */
  gemm_pack_b(
    src: number,
    laneStride: number,
    depthStride: number,
    lanes: number,
    depth: number,
    dst: number,
  ): void;
  /** See `GEMM_EXPORTS.packBRows`. */
  gemm_pack_b_rows(src: number, depthStride: number, lanes: number, depth: number, dst: number): void;
}

/**
 * One product C = [C +] op(A)·op(B) in kernel memory. Pointers are byte addresses; leading
 * dimensions count floats. A is m×k (lda ≥ k), or k×m when `transA` (lda ≥ m); B is k×n
 * (ldb ≥ n), or n×k when `transB` (ldb ≥ k).
 */
export interface GemmProblem {
  m: number;
  n: number;
  k: number;
  a: number;
  lda: number;
  transA: boolean;
  b: number;
  ldb: number;
  transB: boolean;
  c: number;
  ldc: number;
  /** Add to C instead of overwriting it. */
  accumulate: boolean;
}

/**
 * Bytes of scratch one thread needs for {@link gemmBlocked} with `blocks`: an MC×KC block of A,
 * a KC×NC block of B and a tile, or {@link gemmPanels}' deeper A block and one B panel, or
 * {@link gemmRowsInPlace}' panels of X and a tile.
 *
 * @example
 * ```ts
 * import { DEFAULT_GEMM_BLOCKS, gemmScratchBytes } from "./gemm.ts";
 * console.log(gemmScratchBytes(DEFAULT_GEMM_BLOCKS) > 2 << 20); // true
 * ```
 */
export function gemmScratchBytes(blocks: GemmBlocks): number {
  const blocked = blocks.mc * GEMM_DEPTH + GEMM_DEPTH * Math.max(blocks.nc, blocks.fewRowsNc ?? 0);
  const panels = (fewRows(blocks) + GEMM_TILE.mr) * PANEL_DEPTH + GEMM_TILE.nr * PANEL_DEPTH;
  // X's rows rounded up to whole NR-lane panels (m ≤ fewRows), and the tallest in-place tile.
  const inPlace = (fewRows(blocks) + GEMM_TILE.nr) * ROWS_DEPTH + Math.max(...IN_PLACE_ROWS) * GEMM_TILE.nr;
  return 4 * (Math.max(blocked, panels, inPlace) + GEMM_TILE.mr * GEMM_TILE.nr) + 3 * 64;
}

/**
 * Rows [m0, m1) × columns [n0, n1) of a problem as a problem of its own (pointers moved to the
 * window), so threads can split C without the kernels knowing.
 *
 * @example
 * ```ts
 * import { gemmWindow } from "./gemm.ts";
 * const p = { m: 4, n: 8, k: 2, a: 0, lda: 2, transA: false, b: 64, ldb: 8, transB: false, c: 256, ldc: 8, accumulate: false };
 * gemmWindow(p, 0, 4, 4, 8); // the right half of C
 * ```
 */
export function gemmWindow(p: GemmProblem, m0: number, m1: number, n0: number, n1: number): GemmProblem {
  return {
    ...p,
    m: m1 - m0,
    n: n1 - n0,
    a: p.a + 4 * (p.transA ? m0 : m0 * p.lda),
    b: p.b + 4 * (p.transB ? n0 * p.ldb : n0),
    c: p.c + 4 * (m0 * p.ldc + n0),
  };
}

/**
 * Packs depth [pc, pc + kc) × columns [jc, jc + nc) of op(B) into NR-column panels at `dst`: how
 * a caller supplies B without it existing as a matrix (convolution's implicit im2col).
 */
export type PanelPacker = (pc: number, kc: number, jc: number, nc: number, dst: number) => void;

/**
 * Bytes that {@link packWholeA} writes for an m×k op(A): one MC×KC slot per cache block.
 *
 * @example
 * ```ts
 * import { DEFAULT_GEMM_BLOCKS, packedABytes } from "./gemm.ts";
 * console.log(packedABytes(64, 576, DEFAULT_GEMM_BLOCKS)); // 3 depth blocks × 1 row block × 96·256 floats
 * ```
 */
export function packedABytes(m: number, k: number, blocks: GemmBlocks): number {
  const { mc: MC } = blocks, KC = GEMM_DEPTH;
  return 4 * MC * KC * Math.ceil(k / KC) * Math.ceil(m / blockRows(blocks));
}

/**
 * Packs all of op(A) at `dst` ({@link packedABytes} bytes) in the blocks {@link gemmBlocked}
 * would pack one at a time, so products that share A (a convolution's weights, image after
 * image) pack it once. Packing copies, so the products' bits are unchanged.
 *
 * @example
 * ```ts
 * import { gemmBlocked, packWholeA } from "./gemm.ts";
 * // packWholeA(kernels, problem, packed, blocks);
 * // gemmBlocked(kernels, problem, scratch, blocks, undefined, packed); // for each product sharing A
 * ```
 */
export function packWholeA(x: GemmExports, p: GemmProblem, dst: number, blocks: GemmBlocks): void {
  const { mc: MC } = blocks, KC = GEMM_DEPTH, rows = blockRows(blocks);
  const aLane = p.transA ? 4 : 4 * p.lda, aDepth = p.transA ? 4 * p.lda : 4;
  for (let pc = 0, slot = dst; pc < p.k; pc += KC) {
    for (let ic = 0; ic < p.m; ic += rows, slot += 4 * MC * KC) {
      x.gemm_pack_a(
        p.a + ic * aLane + pc * aDepth,
        aLane,
        aDepth,
        Math.min(rows, p.m - ic),
        Math.min(KC, p.k - pc),
        slot,
      );
    }
  }
}

/**
 * Runs one product with the generated kernels, single-threaded, using `scratch`
 * ({@link gemmScratchBytes} bytes at a byte address) for packed panels, in `blocks`. With `packColumns`,
 * op(B) comes from that packer instead of from `p.b`; with `packedA`, op(A) was packed by
 * {@link packWholeA} at that address and `p.a` is not read.
 *
 * @example
 * ```ts
 * import { DEFAULT_GEMM_BLOCKS, gemmBlocked } from "./gemm.ts";
 * // kernels: the exports of an instantiated kernel module (see generate/module.ts)
 * // gemmBlocked(kernels, { m: 2, n: 2, k: 3, a: 0, lda: 3, transA: false, b: 64, ldb: 2,
 * //   transB: false, c: 128, ldc: 2, accumulate: false }, 1024, DEFAULT_GEMM_BLOCKS);
 * ```
 */
export function gemmBlocked(
  x: GemmExports,
  p: GemmProblem,
  scratch: number,
  blocks: GemmBlocks,
  packColumns?: PanelPacker,
  packedWholeA?: number,
): void {
  const { m, n, k, lda, ldb, transA, transB } = p;
  if (m <= 0 || n <= 0) return;
  const { mc: MC } = blocks, KC = GEMM_DEPTH, rows = blockRows(blocks);
  const NC = m <= fewRows(blocks) ? blocks.fewRowsNc ?? blocks.nc : blocks.nc;
  const packedA = align64(scratch);
  const packedB = align64(packedA + 4 * MC * KC);
  const tile = align64(packedB + 4 * KC * Math.max(blocks.nc, blocks.fewRowsNc ?? 0));
  const ldcBytes = 4 * p.ldc;
  // With k = 0 the product is zero: callers clear C themselves (the kernels have no fill).
  if (k <= 0) return;
  // op(A) element (i, p): A[i·lda + p], or A[p·lda + i] transposed. Lanes of an A panel are rows i.
  const aLane = transA ? 4 : 4 * lda, aDepth = transA ? 4 * lda : 4;
  // op(B) element (p, j): B[p·ldb + j], or B[j·ldb + p] transposed. Lanes of a B panel are columns j.
  const bLane = transB ? 4 * ldb : 4, bDepth = transB ? 4 : 4 * ldb;
  const inPlaceRows = blocks.inPlaceRows ?? DEFAULT_IN_PLACE_ROWS;
  if (!packColumns && packedWholeA === undefined && transB && k > KC && m <= fewRows(blocks)) {
    if (inPlaceRows === 0) gemmPanels(x, p, scratch);
    else gemmRowsInPlace(x, p, scratch, inPlaceRows);
    return;
  }
  for (let jc = 0; jc < n; jc += NC) {
    const nc = Math.min(NC, n - jc);
    for (let pc = 0; pc < k; pc += KC) {
      const kc = Math.min(KC, k - pc);
      const accumulate = p.accumulate || pc > 0 ? 1 : 0;
      // Each B block is packed whole before its macro-kernels, not in pieces between them. On the FC
      // input gradient (64×9216×4096, whose 151 MB of W come from memory once) packing the next block
      // in 8-row, 512-byte pieces between 64-column macro-kernel calls, double-buffered, ran no faster
      // on 1 thread (38–40 GFLOP/s either way; 50–52 with the packing skipped, a 2-core Xeon): the
      // core reads W no sooner for the compute beside it, and WebAssembly has no prefetch.
      if (packColumns) packColumns(pc, kc, jc, nc, packedB);
      else packB(x, p.b + jc * bLane + pc * bDepth, bLane, bDepth, nc, kc, packedB);
      for (let ic = 0; ic < m; ic += rows) {
        const mc = Math.min(rows, m - ic);
        let a = packedA;
        if (packedWholeA === undefined) {
          x.gemm_pack_a(p.a + ic * aLane + pc * aDepth, aLane, aDepth, mc, kc, a);
        } else a = packedWholeA + 4 * MC * KC * ((pc / KC) * Math.ceil(m / rows) + ic / rows);
        x.gemm_macro(a, packedB, p.c + ic * ldcBytes + 4 * jc, mc, nc, kc, ldcBytes, accumulate, tile);
      }
    }
  }
}

/**
 * Depth of the A block {@link gemmPanels} packs at once: a multiple of KC, m (at most
 * {@link fewRows}) × it floats of A and NR × it of one B panel in the scratch
 * ({@link gemmScratchBytes} makes room for them). 1024 packed B measurably slower
 * (shorter streams); 2048, 4096 and the full 9216 of the FC layer ran alike.
 */
const PANEL_DEPTH = 16 * GEMM_DEPTH;

/**
 * Few rows (m ≤ {@link fewRows}) times transposed B with W packed ({@link GemmBlocks.inPlaceRows}
 * 0; {@link gemmRowsInPlace} reads it in place instead), a fully connected layer's forward product
 * X·Wᵀ: op(B) is the big operand, each packed element of it is used only m times, and reading it
 * from memory is what costs. Transposed B's lanes (rows of W) are contiguous along the depth:
 * packing one NR-lane panel `PANEL_DEPTH` deep reads NR sequential streams of 16 KiB, where the blocked loop
 * packs KC × NC blocks, NC rows of W touched for 1 KiB each (on the 9216→4096 layer's 151 MB of
 * weights: ≈ 11 ms of packing against ≈ 17 ms, one thread). A is packed once per depth block,
 * all m rows × PANEL_DEPTH, and every panel runs the macro-kernel once per KC step of it: the same depth
 * blocks, summed in the same order, as {@link gemmBlocked}, so every element of C gets the same
 * bits either way (and whatever the thread count: threads take column ranges of C).
 */
function gemmPanels(x: GemmExports, p: GemmProblem, scratch: number): void {
  const { m, n, k, lda, ldb, transA } = p;
  const KC = GEMM_DEPTH;
  const NR = GEMM_TILE.nr;
  // Rows of one KC step of packed A: m in whole MR-row panels (m ≤ fewRows, whatever MC).
  const rows = Math.ceil(m / GEMM_TILE.mr) * GEMM_TILE.mr;
  const packedA = align64(scratch);
  const packedB = align64(packedA + 4 * rows * PANEL_DEPTH);
  const tile = align64(packedB + 4 * NR * PANEL_DEPTH);
  const ldcBytes = 4 * p.ldc;
  const aLane = transA ? 4 : 4 * lda, aDepth = transA ? 4 * lda : 4;
  const bLane = 4 * ldb;
  for (let p2 = 0; p2 < k; p2 += PANEL_DEPTH) {
    const depth = Math.min(PANEL_DEPTH, k - p2);
    // KC step s of the A block at packedA + 4·rows·KC·s.
    for (let pc = 0; pc < depth; pc += KC) {
      const kc = Math.min(KC, depth - pc);
      x.gemm_pack_a(p.a + (p2 + pc) * aDepth, aLane, aDepth, m, kc, packedA + 4 * rows * pc);
    }
    for (let j0 = 0; j0 < n; j0 += NR) {
      const cols = Math.min(NR, n - j0);
      // One panel PANEL_DEPTH deep: its KC steps lie one after another.
      x.gemm_pack_b(p.b + j0 * bLane + 4 * p2, bLane, 4, cols, depth, packedB);
      for (let pc = 0; pc < depth; pc += KC) {
        const kc = Math.min(KC, depth - pc);
        const accumulate = p.accumulate || p2 + pc > 0 ? 1 : 0;
        x.gemm_macro(
          packedA + 4 * rows * pc,
          packedB + 4 * NR * pc,
          p.c + 4 * j0,
          m,
          cols,
          kc,
          ldcBytes,
          accumulate,
          tile,
        );
      }
    }
  }
}

/**
 * Depth of X that {@link gemmRowsInPlace} packs at once: a multiple of KC. Its packed panels (64 rows
 * × 2048 × 4 bytes = 512 KiB on a batch of 64) stay in L2 beside W's stream; 1024 and 4096 ran
 * 1–3% slower on the 9216→4096 layer's forward product (one thread).
 */
const ROWS_DEPTH = 8 * GEMM_DEPTH;

/**
 * Few rows (m ≤ {@link fewRows}) times transposed B, a fully connected layer's forward product
 * X·Wᵀ, where W (op(B), n×k) is the big operand and each of its elements is used only m times:
 * W is read in place in tiles of `rows` rows of W ({@link IN_PLACE_ROWS}; `gemm_macro_rows5` or
 * `gemm_macro_rows6`, see `generate/gemm_rows_kernels.ts`), never packed, and only X is packed,
 * `ROWS_DEPTH` steps at a time. Packing W ({@link gemmPanels}) costs a full read and write of it
 * (151 MB on the 9216→4096 layer). Read in place with 6-row tiles, that product at batch 64 ran at
 * 51.9–52.3 GFLOP/s on one thread and 102.8–103.6 on two, against 47.7 and 93.7 packed (a 2-core
 * AMD EPYC, family 26, 128-bit peak about 58 per core; interleaved runs). The depth
 * blocks are {@link gemmBlocked}'s, summed in the same order, so every element of C gets the same
 * bits either way, whatever the thread count (threads take ranges of W's rows, columns of C).
 */
function gemmRowsInPlace(x: GemmExports, p: GemmProblem, scratch: number, rows: number): void {
  const macro = rows === 5 ? x.gemm_macro_rows5 : x.gemm_macro_rows6;
  const { m, n, k, lda, transA } = p;
  const NR = GEMM_TILE.nr;
  const packed = align64(scratch);
  const tile = align64(packed + 4 * Math.ceil(m / NR) * NR * ROWS_DEPTH);
  const aLane = transA ? 4 : 4 * lda, aDepth = transA ? 4 * lda : 4;
  for (let p2 = 0; p2 < k; p2 += ROWS_DEPTH) {
    const depth = Math.min(ROWS_DEPTH, k - p2);
    // X's rows are the B operand's lanes: NR-lane panels, `depth` deep.
    x.gemm_pack_b(p.a + p2 * aDepth, aLane, aDepth, m, depth, packed);
    const accumulate = p.accumulate || p2 > 0 ? 1 : 0;
    macro(p.b + 4 * p2, 4 * p.ldb, packed, p.c, n, m, depth, 4 * p.ldc, accumulate, tile);
  }
}

/**
 * Packs op(B): whole panels of contiguous columns a block of rows at a time (streaming the source),
 * the rest (transposed B, the last partial panel) panel by panel.
 */
function packB(
  x: GemmExports,
  src: number,
  laneStride: number,
  depthStride: number,
  lanes: number,
  depth: number,
  dst: number,
): void {
  const whole = laneStride === 4 ? lanes - (lanes % GEMM_TILE.nr) : 0;
  if (whole > 0) x.gemm_pack_b_rows(src, depthStride, whole, depth, dst);
  if (whole < lanes) {
    x.gemm_pack_b(
      src + whole * laneStride,
      laneStride,
      depthStride,
      lanes - whole,
      depth,
      dst + 4 * whole * depth,
    );
  }
}

/**
 * `address` rounded up to a cache line (64 bytes).
 *
 * @example
 * ```ts
 * import { align64 } from "./gemm.ts";
 * console.log(align64(65)); // 128
 * ```
 */
export function align64(address: number): number {
  return (address + 63) & ~63;
}
