/**
 * Gradient checking: an op's analytic (float32, autograd) gradient against central differences of a
 * float64 reference of the same op, for the scalar loss `L = Σ op(inputs) · R` with a fixed random
 * `R`, so that every output element contributes.
 *
 * Besides the float64 conv/pool/LRN/softmax references of `reference/float64.ts`, this module holds
 * tiny float64 references of the elementwise, reduction, layout and matrix ops (the `f64`
 * namespace), written from their definitions over `Float64Array`.
 *
 * @module
 */

import assert from "node:assert/strict";
import { memory, ops, type Tensor, tensor, tidy, valueAndGrad } from "../../mod.ts";
import type { RefTensor } from "./float64.ts";
import { mulberry32 } from "./random.ts";

export type { RefTensor };

// ---------------------------------------------------------------------------------------------
// Seeded inputs

/** The seeded PRNG the gradient checks draw inputs from. */
export const rng: (seed: number) => () => number = mulberry32;

/** Number of elements of a shape. */
export function prod(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/**
 * Uniform float32 values in [low, high), rejecting those with |x| < `avoid` (kinks such as relu's at
 * 0); optionally given a random sign (`signed`), for magnitudes in [low, high) of either sign.
 */
export function values(
  n: number,
  rand: () => number,
  opts: { low?: number; high?: number; avoid?: number; signed?: boolean } = {},
): Float32Array {
  const low = opts.low ?? -1, high = opts.high ?? 1, avoid = opts.avoid ?? 0;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let v: number;
    do {
      v = Math.fround(low + (high - low) * rand());
      if (opts.signed && rand() < 0.5) v = -v;
    } while (Math.abs(v) < avoid);
    out[i] = v;
  }
  return out;
}

/** Distinct values `spacing` apart, centred on 0 and shuffled: no near-ties for max-like ops. */
export function distinct(n: number, rand: () => number, spacing = 0.01): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (i - n / 2) * spacing;
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/** A float64 reference tensor holding the (float32-exact) `data`. */
export function r64(data: ArrayLike<number>, shape: readonly number[]): RefTensor {
  return { data: Float64Array.from(data), shape: [...shape] };
}

// ---------------------------------------------------------------------------------------------
// Float64 references of the elementwise, reduction, layout and matrix ops

function stridesOf(shape: readonly number[]): number[] {
  const s = new Array<number>(shape.length);
  let acc = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    s[d] = acc;
    acc *= shape[d];
  }
  return s;
}

/** Calls `fn(flatIndex, multiIndex)` for every element of `shape`, row-major. */
function forEachIndex(shape: readonly number[], fn: (flat: number, idx: number[]) => void): void {
  const n = prod(shape);
  const idx = new Array<number>(shape.length).fill(0);
  for (let flat = 0; flat < n; flat++) {
    fn(flat, idx);
    for (let d = shape.length - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

function broadcastShape(a: readonly number[], b: readonly number[]): number[] {
  const rank = Math.max(a.length, b.length);
  const out: number[] = [];
  for (let i = 0; i < rank; i++) {
    const da = a[a.length - rank + i] ?? 1, db = b[b.length - rank + i] ?? 1;
    if (da !== db && da !== 1 && db !== 1) throw new Error(`f64: [${a}] and [${b}] do not broadcast`);
    out.push(da === 1 ? db : da);
  }
  return out;
}

/** Flat index into `shape` of the element at `idx` of a broadcast result of rank ≥ shape's. */
function broadcastIndex(shape: readonly number[], idx: readonly number[]): number {
  const offset = idx.length - shape.length;
  let flat = 0;
  for (let d = 0; d < shape.length; d++) flat = flat * shape[d] + (shape[d] === 1 ? 0 : idx[d + offset]);
  return flat;
}

function normalize(axes: number | readonly number[] | undefined, rank: number): number[] {
  if (axes === undefined) return [...Array(rank).keys()];
  return (typeof axes === "number" ? [axes] : [...axes]).map((a) => (a < 0 ? a + rank : a));
}

/** Float64 references of the non-CNN ops (NumPy semantics). */
export const f64 = {
  /** `fn` elementwise. */
  map(x: RefTensor, fn: (v: number) => number): RefTensor {
    return { data: x.data.map(fn), shape: [...x.shape] };
  },

  /** `fn(a, b)` elementwise with NumPy broadcasting. */
  zip(a: RefTensor, b: RefTensor, fn: (u: number, v: number) => number): RefTensor {
    const shape = broadcastShape(a.shape, b.shape);
    const data = new Float64Array(prod(shape));
    forEachIndex(shape, (flat, idx) => {
      data[flat] = fn(a.data[broadcastIndex(a.shape, idx)], b.data[broadcastIndex(b.shape, idx)]);
    });
    return { data, shape };
  },

  /** sum / mean / max over `axes` (all when omitted). */
  reduce(
    x: RefTensor,
    kind: "sum" | "mean" | "max",
    axes?: number | readonly number[],
    keepDims = false,
  ): RefTensor {
    const reduced = normalize(axes, x.shape.length);
    const kept = x.shape.map((d, i) => (reduced.includes(i) ? 1 : d));
    const count = prod(x.shape) / prod(kept);
    const data = new Float64Array(prod(kept)).fill(kind === "max" ? -Infinity : 0);
    forEachIndex(x.shape, (flat, idx) => {
      const o = broadcastIndex(kept, idx);
      data[o] = kind === "max" ? Math.max(data[o], x.data[flat]) : data[o] + x.data[flat];
    });
    if (kind === "mean") { for (let i = 0; i < data.length; i++) data[i] /= count; }
    const shape = keepDims ? kept : x.shape.filter((_, i) => !reduced.includes(i));
    return { data, shape };
  },

  /** Same data, new shape (−1 inferred). */
  reshape(x: RefTensor, shape: readonly number[]): RefTensor {
    const known = prod(shape.filter((d) => d !== -1));
    return { data: x.data.slice(), shape: shape.map((d) => (d === -1 ? x.data.length / known : d)) };
  },

  /** Result axis i is input axis perm[i]. */
  permute(x: RefTensor, perm: readonly number[]): RefTensor {
    const shape = perm.map((p) => x.shape[p]);
    const inStrides = stridesOf(x.shape);
    const data = new Float64Array(x.data.length);
    forEachIndex(shape, (flat, idx) => {
      let src = 0;
      for (let d = 0; d < perm.length; d++) src += idx[d] * inStrides[perm[d]];
      data[flat] = x.data[src];
    });
    return { data, shape };
  },

  /** The block at `begin` with extent `size`. */
  slice(x: RefTensor, begin: readonly number[], size: readonly number[]): RefTensor {
    const inStrides = stridesOf(x.shape);
    const data = new Float64Array(prod(size));
    forEachIndex(size, (flat, idx) => {
      let src = 0;
      for (let d = 0; d < size.length; d++) src += (idx[d] + begin[d]) * inStrides[d];
      data[flat] = x.data[src];
    });
    return { data, shape: [...size] };
  },

  /** Joins along `axis`. */
  concat(xs: readonly RefTensor[], axis: number): RefTensor {
    const shape = [...xs[0].shape];
    shape[axis] = xs.reduce((acc, t) => acc + t.shape[axis], 0);
    const data = new Float64Array(prod(shape));
    const outStrides = stridesOf(shape);
    let start = 0;
    for (const t of xs) {
      forEachIndex(t.shape, (flat, idx) => {
        let dst = 0;
        for (let d = 0; d < shape.length; d++) dst += (idx[d] + (d === axis ? start : 0)) * outStrides[d];
        data[dst] = t.data[flat];
      });
      start += t.shape[axis];
    }
    return { data, shape };
  },

  /**
   * NumPy matmul: batched over broadcast leading axes; 1-D operands promoted to a row (left) or
   * column (right) and the added axis removed; `transA/B` swap an operand's last two axes (ignored
   * for 1-D operands).
   */
  matmul(a: RefTensor, b: RefTensor, transA = false, transB = false): RefTensor {
    const a2 = a.shape.length === 1 ? { data: a.data, shape: [1, a.shape[0]] } : a;
    const b2 = b.shape.length === 1 ? { data: b.data, shape: [b.shape[0], 1] } : b;
    const ta = transA && a.shape.length > 1, tb = transB && b.shape.length > 1;
    const [ar, ac] = a2.shape.slice(-2), [br, bc] = b2.shape.slice(-2);
    const m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
    if ((tb ? bc : br) !== k) throw new Error("f64 matmul: inner dimensions differ");
    const aBatch = a2.shape.slice(0, -2), bBatch = b2.shape.slice(0, -2);
    const batch = broadcastShape(aBatch, bBatch);
    const out = new Float64Array(prod(batch) * m * n);
    forEachIndex(batch, (flat, idx) => {
      const aBase = broadcastIndex(aBatch, idx) * ar * ac, bBase = broadcastIndex(bBatch, idx) * br * bc;
      for (let i = 0; i < m; i++) {
        for (let j = 0; j < n; j++) {
          let s = 0;
          for (let p = 0; p < k; p++) {
            const av = a2.data[aBase + (ta ? p * ac + i : i * ac + p)];
            const bv = b2.data[bBase + (tb ? j * bc + p : p * bc + j)];
            s += av * bv;
          }
          out[(flat * m + i) * n + j] = s;
        }
      }
    });
    let shape = [...batch, m, n];
    if (a.shape.length === 1) shape = shape.filter((_, i) => i !== batch.length);
    if (b.shape.length === 1) shape = shape.slice(0, -1);
    return { data: out, shape };
  },

  /** `x · wᵀ + bias`. */
  linear(x: RefTensor, w: RefTensor, bias?: RefTensor): RefTensor {
    const y = f64.matmul(x, w, false, true);
    return bias ? f64.zip(y, bias, (u, v) => u + v) : y;
  },
};

// ---------------------------------------------------------------------------------------------
// The check

/** One input of a checked op. */
export interface CheckInput {
  /** Float32-exact values (they are fed unchanged to both the float32 op and the float64 reference). */
  values: Float32Array;
  shape: readonly number[];
  /** Differentiate with respect to this input (default true). */
  grad?: boolean;
}

/** What {@link gradCheck} compares. */
export interface GradCheckCase {
  /** For messages. */
  name: string;
  inputs: readonly CheckInput[];
  /** The op under test, through the public Tandem API, one tensor per input. */
  op: (...xs: Tensor[]) => Tensor;
  /** The same function in float64. */
  reference: (...xs: RefTensor[]) => RefTensor;
  /** Central-difference step (default 1e-3); keep it below half the gap to any kink or tie. */
  h?: number;
  /** Gradient tolerance: |analytic − numeric| ≤ tol · max(1, |numeric|) (default 1e-4). */
  tol?: number;
  /** Forward tolerance: |y32 − y64| ≤ forwardTol · max(1, max|y64|) (default 1e-5). */
  forwardTol?: number;
  /** Seed of the random weights R (default 1234). */
  seed?: number;
}

/** Largest error seen, relative as in the tolerance, for reporting. */
export interface GradCheckResult {
  forwardError: number;
  gradError: number;
}

function lossOf(y: RefTensor, r: Float32Array): number {
  let s = 0;
  for (let i = 0; i < y.data.length; i++) s += y.data[i] * r[i];
  return s;
}

/**
 * Checks the forward values and the gradients of `c.op` against `c.reference`, and that no tensor
 * outlives the check (a leak in the op or its backward).
 *
 * @example
 * ```ts
 * import { ops } from "../../mod.ts";
 * import { f64, gradCheck, rng, values } from "./gradcheck.ts";
 * gradCheck({
 *   name: "exp",
 *   inputs: [{ values: values(6, rng(1)), shape: [2, 3] }],
 *   op: (x) => ops.exp(x),
 *   reference: (x) => f64.map(x, Math.exp),
 * });
 * ```
 */
export function gradCheck(c: GradCheckCase): GradCheckResult {
  const h = c.h ?? 1e-3, tol = c.tol ?? 1e-4, forwardTol = c.forwardTol ?? 1e-5;
  for (const [i, input] of c.inputs.entries()) {
    assert.equal(
      input.values.length,
      prod(input.shape),
      `${c.name}: input ${i} values do not fill its shape`,
    );
  }
  const refs = c.inputs.map((input) => r64(input.values, input.shape));
  const y64 = c.reference(...refs);
  const r = values(y64.data.length, rng(c.seed ?? 1234));
  const wrt = c.inputs.map((input, i) => (input.grad ?? true) ? i : -1).filter((i) => i >= 0);

  // Analytic gradients (float32, autograd).
  const before = memory().tensors;
  let y32: Float32Array = new Float32Array(0);
  let y32Shape: readonly number[] = [];
  const analytic: Float32Array[] = [];
  tidy(() => {
    const all = c.inputs.map((input) => tensor(input.values, { shape: input.shape }));
    const weights = tensor(r, { shape: y64.shape });
    const f = valueAndGrad((...args: Tensor[]) => {
      const full = all.map((t, i) => (wrt.includes(i) ? args[wrt.indexOf(i)] : t));
      const y = c.op(...full);
      y32 = Float32Array.from(y.dataSync());
      y32Shape = y.shape;
      return ops.sum(ops.mul(y, weights));
    });
    const { grads } = f(...wrt.map((i) => all[i]));
    for (const [j, g] of grads.entries()) {
      assert.deepEqual(g.shape, c.inputs[wrt[j]].shape, `${c.name}: gradient ${wrt[j]} shape`);
      analytic.push(Float32Array.from(g.dataSync()));
      g.dispose();
    }
  });
  assert.equal(memory().tensors, before, `${c.name}: tensors leaked by the op or its backward`);

  // Forward.
  assert.deepEqual(y32Shape, y64.shape, `${c.name}: output shape`);
  let maxY = 0;
  for (const v of y64.data) maxY = Math.max(maxY, Math.abs(v));
  let forwardError = 0;
  for (let i = 0; i < y64.data.length; i++) {
    const e = Math.abs(y32[i] - y64.data[i]) / Math.max(1, maxY);
    if (!(e <= forwardError)) forwardError = e;
  }
  assert.ok(
    forwardError <= forwardTol,
    `${c.name}: forward differs from the float64 reference by ${forwardError} > ${forwardTol}`,
  );

  // Numeric gradients (float64 central differences) and comparison.
  let gradError = 0;
  for (const [j, i] of wrt.entries()) {
    const x = refs[i].data;
    const failures: string[] = [];
    for (let e = 0; e < x.length; e++) {
      const v = x[e];
      x[e] = v + h;
      const up = lossOf(c.reference(...refs), r);
      x[e] = v - h;
      const down = lossOf(c.reference(...refs), r);
      x[e] = v;
      const numeric = (up - down) / (2 * h);
      const err = Math.abs(analytic[j][e] - numeric) / Math.max(1, Math.abs(numeric));
      if (!(err <= gradError)) gradError = err;
      if (!(err <= tol) && failures.length < 5) {
        failures.push(`[${e}] analytic ${analytic[j][e]} vs numeric ${numeric}`);
      }
    }
    assert.ok(
      failures.length === 0,
      `${c.name}: gradient of input ${i} ${JSON.stringify(c.inputs[i].shape)} off by more than ${tol}: ${
        failures.join("; ")
      }`,
    );
  }
  return { forwardError, gradError };
}
