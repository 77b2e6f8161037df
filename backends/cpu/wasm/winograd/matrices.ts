/**
 * The transforms of Winograd's minimal filtering F(m×m, r×r) (Lavin and Gray, "Fast Algorithms for
 * Convolutional Neural Networks", 2016), built here by the Toom-Cook construction in exact
 * rational arithmetic rather than copied as tables: a correlation of an α×α input tile `d`
 * (α = m + r − 1) with an r×r filter `g` is
 *
 *   Y = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A        (m×m outputs, one product per tile position)
 *
 * with Aᵀ (m×α) evaluating at α − 1 points and ∞, G (α×r) the filter's evaluations scaled by the
 * interpolation's denominators, and Bᵀ (α×α) the transposed interpolation matrix. The points are
 * NNPACK's and Lavin's: 0, ±1, ±2 and, for α = 8, ±1/2, which keep fp32 errors near 1e-5 of the
 * outputs' magnitude (the float64 check in the tests measures them).
 *
 * @module
 */

/**
 * Output tile side m of every Winograd convolution here: 4, so a tile row is one `f32x4` and the
 * kernels move tiles with 4×4 transposes.
 *
 * @example
 * ```ts
 * import { WINOGRAD_OUTPUT_TILE } from "./matrices.ts";
 * console.log(WINOGRAD_OUTPUT_TILE); // 4
 * ```
 */
export const WINOGRAD_OUTPUT_TILE = 4;

/** The filter sides with a Winograd path: F(4×4, 3×3) (α = 6) and F(4×4, 5×5) (α = 8). */
export type WinogradFilterSide = 3 | 5;

/** The three transforms of F(m×m, r×r), as float64 values of exact rationals. */
export interface WinogradMatrices {
  /** Output tile side. */
  m: number;
  /** Filter side. */
  r: number;
  /** Input tile side m + r − 1. */
  alpha: number;
  /** Output transform Aᵀ, m rows of α. */
  at: number[][];
  /** Filter transform G, α rows of r. */
  g: number[][];
  /** Input transform Bᵀ, α rows of α. */
  bt: number[][];
}

/** A rational number p/q with q > 0, in lowest terms (bigint: the inversion's terms grow). */
interface Fraction {
  p: bigint;
  q: bigint;
}

function gcd(a: bigint, b: bigint): bigint {
  a = a < 0n ? -a : a;
  b = b < 0n ? -b : b;
  while (b) [a, b] = [b, a % b];
  return a;
}

function fraction(p: bigint, q = 1n): Fraction {
  if (q < 0n) [p, q] = [-p, -q];
  const d = gcd(p, q) || 1n;
  return { p: p / d, q: q / d };
}

const sub = (a: Fraction, b: Fraction) => fraction(a.p * b.q - b.p * a.q, a.q * b.q);
const mul = (a: Fraction, b: Fraction) => fraction(a.p * b.p, a.q * b.q);
const div = (a: Fraction, b: Fraction) => fraction(a.p * b.q, a.q * b.p);
const ZERO = fraction(0n), ONE = fraction(1n);

function power(x: Fraction, k: number): Fraction {
  let out = ONE;
  for (let i = 0; i < k; i++) out = mul(out, x);
  return out;
}

/**
 * Evaluation matrix of polynomials of `n` coefficients at `points` and ∞ (rows), the ∞ row picking
 * the leading coefficient: (points + 1) × n.
 */
function evaluation(points: readonly Fraction[], n: number): Fraction[][] {
  const rows = points.map((x) => Array.from({ length: n }, (_, k) => power(x, k)));
  rows.push(Array.from({ length: n }, (_, k) => (k === n - 1 ? ONE : ZERO)));
  return rows;
}

/** Inverse of a square rational matrix by Gauss-Jordan elimination (exact). */
function inverse(matrix: readonly Fraction[][]): Fraction[][] {
  const n = matrix.length;
  const a = matrix.map((row, i) => [...row, ...Array.from({ length: n }, (_, j) => (i === j ? ONE : ZERO))]);
  for (let col = 0; col < n; col++) {
    const pivot = a.findIndex((row, i) => i >= col && row[col].p !== 0n);
    if (pivot < 0) throw new Error("winograd: singular interpolation matrix");
    [a[col], a[pivot]] = [a[pivot], a[col]];
    const scale = a[col][col];
    a[col] = a[col].map((v) => div(v, scale));
    for (let i = 0; i < n; i++) {
      if (i === col || a[i][col].p === 0n) continue;
      const factor = a[i][col];
      a[i] = a[i].map((v, j) => sub(v, mul(factor, a[col][j])));
    }
  }
  return a.map((row) => row.slice(n));
}

/** The α − 1 finite interpolation points: 0, 1, −1, 2, −2, ½, −½, in that order. */
function pointsFor(alpha: number): Fraction[] {
  const all = [fraction(0n), fraction(1n), fraction(-1n), fraction(2n), fraction(-2n), fraction(1n, 2n)];
  all.push(fraction(-1n, 2n));
  if (alpha - 1 > all.length) throw new RangeError(`winograd: no points for a tile of ${alpha}`);
  return all.slice(0, alpha - 1);
}

const cache = new Map<number, WinogradMatrices>();

/**
 * The transforms of F(4×4, r×r) for r = 3 or 5 (cached).
 *
 * Linear convolution s = u ∗ g of an m-tap u and an r-tap g is, through evaluation at the points
 * and interpolation, s = V⁻¹((Vₘu) ⊙ (Vᵣg)); the correlation y = Cᵍᵀd these tiles compute is its
 * transpose, y = Vₘᵀ((Vᵣg) ⊙ (V⁻ᵀd)): Aᵀ = Vₘᵀ, G = Vᵣ, Bᵀ = V⁻ᵀ. Row j of Bᵀ is then multiplied
 * and row j of G divided by fⱼ = ∏ₗ≠ⱼ(aⱼ − aₗ), which leaves Bᵀ with small integers and puts the
 * fractions in G, transformed once per filter.
 *
 * @example
 * ```ts
 * import { winogradMatrices } from "./matrices.ts";
 * const { alpha, bt } = winogradMatrices(3);
 * console.log(alpha, bt[0]); // 6 [4, 0, -5, 0, 1, 0]
 * ```
 */
export function winogradMatrices(r: WinogradFilterSide): WinogradMatrices {
  const known = cache.get(r);
  if (known) return known;
  const m = WINOGRAD_OUTPUT_TILE, alpha = m + r - 1;
  const points = pointsFor(alpha);
  const at = transpose(evaluation(points, m));
  const g = evaluation(points, r);
  const bt = transpose(inverse(evaluation(points, alpha)));
  points.forEach((a, j) => {
    let f = ONE;
    points.forEach((b, l) => {
      if (l !== j) f = mul(f, sub(a, b));
    });
    bt[j] = bt[j].map((v) => mul(v, f));
    g[j] = g[j].map((v) => div(v, f));
  });
  const toNumbers = (rows: Fraction[][]) => rows.map((row) => row.map((v) => Number(v.p) / Number(v.q)));
  const out = { m, r, alpha, at: toNumbers(at), g: toNumbers(g), bt: toNumbers(bt) };
  cache.set(r, out);
  return out;
}

function transpose<T>(rows: readonly T[][]): T[][] {
  return rows[0].map((_, j) => rows.map((row) => row[j]));
}
