/**
 * The GEMM shapes the benchmarks measure, defined once: square products and the three products of
 * a 9216→4096 fully connected layer at batch 64 (Y = X·Wᵀ, dX = dY·W, dW = dYᵀ·X).
 *
 * @module
 */

/** One product C (m×n) = op(A)·op(B) with inner dimension k. */
export interface GemmShape {
  /** Label for tables. */
  name: string;
  m: number;
  n: number;
  k: number;
  transA: boolean;
  transB: boolean;
}

/** n³ products without transposes. */
export function squareShape(n: number, transA = false, transB = false): GemmShape {
  const tag = `${transA ? "T" : "N"}${transB ? "T" : "N"}`;
  return { name: `${n}³ ${tag}`, m: n, n, k: n, transA, transB };
}

/** The FC layer's forward, input-gradient and weight-gradient products. */
export const FC_SHAPES: readonly GemmShape[] = [
  { name: "FC forward X·Wᵀ (64×4096×9216, NT)", m: 64, n: 4096, k: 9216, transA: false, transB: true },
  { name: "FC input grad dY·W (64×9216×4096, NN)", m: 64, n: 9216, k: 4096, transA: false, transB: false },
  { name: "FC weight grad dYᵀ·X (4096×9216×64, TN)", m: 4096, n: 9216, k: 64, transA: true, transB: false },
];

/** Floating-point operations of one product (a multiply-add counts 2). */
export function gemmFlops(s: GemmShape): number {
  return 2 * s.m * s.n * s.k;
}
