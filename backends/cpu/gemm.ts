/**
 * Single-precision GEMM for the CPU backend: C (m×n, row-major, contiguous) = op(A)·op(B) (+ C).
 *
 * op(A) is m×k: A is stored m×k row-major (lda = k), or k×m when `transA` (lda = m).
 * op(B) is k×n: B is stored k×n row-major (ldb = n), or n×k when `transB` (ldb = k).
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

/** Naive placeholder (to be replaced by the tiled kernel). */
export function gemm(args: GemmArgs): void {
  const { m, n, k, a, aOffset, transA, b, bOffset, transB, c, cOffset, accumulate } = args;
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let sum = 0;
      for (let p = 0; p < k; p++) {
        const av = transA ? a[aOffset + p * m + i] : a[aOffset + i * k + p];
        const bv = transB ? b[bOffset + j * k + p] : b[bOffset + p * n + j];
        sum += av * bv;
      }
      c[cOffset + i * n + j] = accumulate ? c[cOffset + i * n + j] + sum : sum;
    }
  }
}
