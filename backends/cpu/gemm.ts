/**
 * Single-precision GEMM for the CPU backend: C (m×n, row-major, contiguous) = op(A)·op(B) (+ C).
 *
 * op(A) is m×k: A is stored m×k row-major (lda = k), or k×m when `transA` (lda = m).
 * op(B) is k×n: B is stored k×n row-major (ldb = n), or n×k when `transB` (ldb = k).
 *
 * Why it is structured this way (GotoBLAS-style, in plain TypeScript):
 *
 * - A 4×4 register tile. V8 keeps the 16 accumulators and the 8 operands of one rank-1 update
 *   in registers (with cheap spills), so every value loaded from memory feeds 4 multiply-adds.
 *   Larger tiles (4×8, 8×4, 6×4) and unrolling the k loop measured no faster or slower (more
 *   spills), smaller ones (2×4, 2×8) slower (more loads per multiply-add).
 * - Packing. Before the micro-kernel runs, a KC-deep slice of A is copied into MR-row panels and
 *   of B into NR-column panels, interleaved so that the kernel reads both with unit stride. The
 *   copy is where the transposes are absorbed, so all four `transA`/`transB` combinations run
 *   the same kernel on the same layout and at the same speed; only panels are ever copied.
 *   Panels are Float64Array: widening once while packing spares the kernel a float→double
 *   conversion per load (a few percent). Short edges are zero-padded, so the kernel never branches on size.
 * - Blocking. The KC × NR panel of packed B (16 KiB) stays in L1 while the kernel sweeps the
 *   MC × KC block of packed A (128 KiB, L2); the KC × NC block of packed B (1 MiB, L2/L3) is
 *   reused by every MC block. The kernel is compute-bound on a scalar JIT, so these sizes matter
 *   mostly for the large and skinny shapes (they were tuned on the 9216×4096 FC products).
 * - Sums are accumulated in float64 within a KC block and rounded when stored to C.
 *
 * Scratch buffers are module-level and only grow, so steady-state calls allocate nothing.
 * Not re-entrant (JS is single-threaded per isolate; workers get their own module instance).
 * C must not alias A or B.
 *
 * @module
 */

/** Operands of one GEMM call; offsets index into the arrays so batched callers need no subarrays. */
export interface GemmArgs {
  m: number;
  n: number;
  k: number;
  a: Float32Array;
  aOffset: number;
  transA: boolean;
  b: Float32Array;
  bOffset: number;
  transB: boolean;
  c: Float32Array;
  cOffset: number;
  /** When true C += op(A)·op(B); otherwise C is overwritten. */
  accumulate: boolean;
}

/** Rows of the register tile (and of one packed A panel). */
const MR = 4;
/** Columns of the register tile (and of one packed B panel). */
const NR = 4;
/** Depth of one packed block (shared dimension k). */
const KC = 256;
/** Rows of op(A) packed at a time (multiple of MR). */
const MC = 64;
/** Columns of op(B) packed at a time (multiple of NR). */
const NC = 512;

let packedA = new Float64Array(0);
let packedB = new Float64Array(0);
/** Receives a partial tile at the bottom/right edge before it is merged into C. */
const edgeTile = new Float32Array(MR * NR);

/**
 * Packs rows [ic, ic+mc) × depth [pc, pc+kc) of op(A) into consecutive MR-row panels;
 * within a panel element (p, i) lands at p*MR + i. Rows past mc are zero.
 */
function packA(
  a: Float32Array,
  aOff: number,
  transA: boolean,
  m: number,
  k: number,
  ic: number,
  mc: number,
  pc: number,
  kc: number,
  dst: Float64Array,
): void {
  let d = 0;
  for (let i0 = 0; i0 < mc; i0 += MR) {
    const rows = Math.min(MR, mc - i0);
    if (transA) {
      // A is k×m: each depth step reads MR consecutive values.
      for (let p = 0; p < kc; p++) {
        const s = aOff + (pc + p) * m + ic + i0;
        const o = d + p * MR;
        let i = 0;
        for (; i < rows; i++) dst[o + i] = a[s + i];
        for (; i < MR; i++) dst[o + i] = 0;
      }
    } else {
      // A is m×k: stream along each row, scattering with stride MR.
      for (let i = 0; i < MR; i++) {
        let o = d + i;
        if (i < rows) {
          let s = aOff + (ic + i0 + i) * k + pc;
          for (let p = 0; p < kc; p++, o += MR) dst[o] = a[s++];
        } else {
          for (let p = 0; p < kc; p++, o += MR) dst[o] = 0;
        }
      }
    }
    d += kc * MR;
  }
}

/**
 * Packs depth [pc, pc+kc) × columns [jc, jc+nc) of op(B) into consecutive NR-column panels;
 * within a panel element (p, j) lands at p*NR + j. Columns past nc are zero.
 */
function packB(
  b: Float32Array,
  bOff: number,
  transB: boolean,
  n: number,
  k: number,
  pc: number,
  kc: number,
  jc: number,
  nc: number,
  dst: Float64Array,
): void {
  let d = 0;
  for (let j0 = 0; j0 < nc; j0 += NR) {
    const cols = Math.min(NR, nc - j0);
    if (transB) {
      // B is n×k: stream along each row of B (a column of op(B)), scattering with stride NR.
      for (let j = 0; j < NR; j++) {
        let o = d + j;
        if (j < cols) {
          let s = bOff + (jc + j0 + j) * k + pc;
          for (let p = 0; p < kc; p++, o += NR) dst[o] = b[s++];
        } else {
          for (let p = 0; p < kc; p++, o += NR) dst[o] = 0;
        }
      }
    } else {
      // B is k×n: each depth step reads NR consecutive values.
      for (let p = 0; p < kc; p++) {
        const s = bOff + (pc + p) * n + jc + j0;
        const o = d + p * NR;
        let j = 0;
        for (; j < cols; j++) dst[o + j] = b[s + j];
        for (; j < NR; j++) dst[o + j] = 0;
      }
    }
    d += kc * NR;
  }
}

/**
 * 4×4 micro-kernel: C[ci.., ldc] (+)= Apanel(kc×4)ᵀ·Bpanel(kc×4), always a full tile.
 * Kept free of size branches so V8 compiles one tight, monomorphic loop.
 */
function kernel4x4(
  kc: number,
  pa: Float64Array,
  ai: number,
  pb: Float64Array,
  bi: number,
  c: Float32Array,
  ci: number,
  ldc: number,
  add: boolean,
): void {
  let c00 = 0, c01 = 0, c02 = 0, c03 = 0;
  let c10 = 0, c11 = 0, c12 = 0, c13 = 0;
  let c20 = 0, c21 = 0, c22 = 0, c23 = 0;
  let c30 = 0, c31 = 0, c32 = 0, c33 = 0;
  for (let p = 0; p < kc; p++) {
    const a0 = pa[ai], a1 = pa[ai + 1], a2 = pa[ai + 2], a3 = pa[ai + 3];
    const b0 = pb[bi], b1 = pb[bi + 1], b2 = pb[bi + 2], b3 = pb[bi + 3];
    c00 += a0 * b0;
    c01 += a0 * b1;
    c02 += a0 * b2;
    c03 += a0 * b3;
    c10 += a1 * b0;
    c11 += a1 * b1;
    c12 += a1 * b2;
    c13 += a1 * b3;
    c20 += a2 * b0;
    c21 += a2 * b1;
    c22 += a2 * b2;
    c23 += a2 * b3;
    c30 += a3 * b0;
    c31 += a3 * b1;
    c32 += a3 * b2;
    c33 += a3 * b3;
    ai += MR;
    bi += NR;
  }
  const r0 = ci, r1 = ci + ldc, r2 = r1 + ldc, r3 = r2 + ldc;
  if (add) {
    c[r0] += c00;
    c[r0 + 1] += c01;
    c[r0 + 2] += c02;
    c[r0 + 3] += c03;
    c[r1] += c10;
    c[r1 + 1] += c11;
    c[r1 + 2] += c12;
    c[r1 + 3] += c13;
    c[r2] += c20;
    c[r2 + 1] += c21;
    c[r2 + 2] += c22;
    c[r2 + 3] += c23;
    c[r3] += c30;
    c[r3 + 1] += c31;
    c[r3 + 2] += c32;
    c[r3 + 3] += c33;
  } else {
    c[r0] = c00;
    c[r0 + 1] = c01;
    c[r0 + 2] = c02;
    c[r0 + 3] = c03;
    c[r1] = c10;
    c[r1 + 1] = c11;
    c[r1 + 2] = c12;
    c[r1 + 3] = c13;
    c[r2] = c20;
    c[r2 + 1] = c21;
    c[r2 + 2] = c22;
    c[r2 + 3] = c23;
    c[r3] = c30;
    c[r3 + 1] = c31;
    c[r3 + 2] = c32;
    c[r3 + 3] = c33;
  }
}

/**
 * Single-precision matrix multiply: C = op(A)·op(B), or C += op(A)·op(B) when `accumulate`.
 *
 * C is m×n row-major and contiguous from `cOffset`; op(X) is X or Xᵀ as selected by the
 * `trans*` flags (see the module doc for the storage of each operand). With k = 0 the product
 * is zero, so C is cleared (or left unchanged when accumulating). C must not overlap A or B.
 *
 * @example
 * ```ts
 * import { gemm } from "./gemm.ts";
 *
 * // C(2×2) = A(2×3) · B(3×2)
 * const a = new Float32Array([1, 2, 3, 4, 5, 6]);
 * const b = new Float32Array([7, 8, 9, 10, 11, 12]);
 * const c = new Float32Array(4);
 * gemm({
 *   m: 2, n: 2, k: 3,
 *   a, aOffset: 0, transA: false,
 *   b, bOffset: 0, transB: false,
 *   c, cOffset: 0, accumulate: false,
 * });
 * // c is now [58, 64, 139, 154]
 * ```
 */
export function gemm(args: GemmArgs): void {
  const { m, n, k, a, aOffset, transA, b, bOffset, transB, c, cOffset, accumulate } = args;
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) c.fill(0, cOffset, cOffset + m * n);
    return;
  }

  const kcMax = Math.min(KC, k);
  const mcMax = Math.ceil(Math.min(MC, m) / MR) * MR;
  const ncMax = Math.ceil(Math.min(NC, n) / NR) * NR;
  if (packedA.length < mcMax * kcMax) packedA = new Float64Array(mcMax * kcMax);
  if (packedB.length < kcMax * ncMax) packedB = new Float64Array(kcMax * ncMax);
  const pa = packedA, pb = packedB, tile = edgeTile;

  for (let jc = 0; jc < n; jc += NC) {
    const nc = Math.min(NC, n - jc);
    for (let pc = 0; pc < k; pc += KC) {
      const kc = Math.min(KC, k - pc);
      // The first depth block overwrites C unless accumulating; later ones add to it.
      const add = accumulate || pc > 0;
      packB(b, bOffset, transB, n, k, pc, kc, jc, nc, pb);
      for (let ic = 0; ic < m; ic += MC) {
        const mc = Math.min(MC, m - ic);
        packA(a, aOffset, transA, m, k, ic, mc, pc, kc, pa);
        const cBlock = cOffset + ic * n + jc;
        for (let j0 = 0, bi = 0; j0 < nc; j0 += NR, bi += kc * NR) {
          const nr = Math.min(NR, nc - j0);
          for (let i0 = 0, ai = 0; i0 < mc; i0 += MR, ai += kc * MR) {
            const mr = Math.min(MR, mc - i0);
            const ci = cBlock + i0 * n + j0;
            if (mr === MR && nr === NR) {
              kernel4x4(kc, pa, ai, pb, bi, c, ci, n, add);
              continue;
            }
            // Partial tile: compute the padded 4×4 into scratch, merge only the valid part.
            kernel4x4(kc, pa, ai, pb, bi, tile, 0, NR, false);
            for (let i = 0; i < mr; i++) {
              const row = ci + i * n;
              const t = i * NR;
              for (let j = 0; j < nr; j++) c[row + j] = add ? c[row + j] + tile[t + j] : tile[t + j];
            }
          }
        }
      }
    }
  }
}

/**
 * `c[r, j] += bias[j]` over the rows of `c` (each `bias.length` floats, one float32 rounding as the
 * broadcast add): a product's bias in its epilogue.
 *
 * @example
 * ```ts
 * import { addRowBias } from "./gemm.ts";
 * const c = new Float32Array([1, 2, 3, 4]);
 * addRowBias(c, new Float32Array([10, 20])); // c = [11, 22, 13, 24]
 * ```
 */
export function addRowBias(c: Float32Array, bias: Float32Array): void {
  const n = bias.length;
  for (let row = 0; row < c.length; row += n) {
    for (let j = 0; j < n; j++) c[row + j] += bias[j];
  }
}
