/**
 * The blocked CPU GEMM against a naive float64 reference: every transpose combination, odd and
 * unit sizes (tails of the 4×4 tile and of the cache blocks), operands at offsets inside larger
 * arrays, overwrite and accumulate, and k = 0.
 */

import assert from "node:assert/strict";
import { gemm, type GemmArgs } from "../../../backends/cpu/gemm.ts";
import { mulberry32 } from "../../reference/random.ts";

const rand = mulberry32(0x7a4d3);

function randomArray(len: number, r: () => number = rand): Float32Array {
  const out = new Float32Array(len);
  for (let i = 0; i < len; i++) out[i] = r() * 2 - 1;
  return out;
}

const SENTINEL = 12345.5;

interface Case {
  m: number;
  n: number;
  k: number;
  transA: boolean;
  transB: boolean;
  accumulate: boolean;
}

/**
 * Runs one case with every operand placed at a random offset inside a larger array, checks C
 * against the float64 reference and that nothing outside C's m×n window was written.
 */
function check({ m, n, k, transA, transB, accumulate }: Case): void {
  const aOffset = Math.floor(rand() * 7), bOffset = Math.floor(rand() * 7), cOffset = Math.floor(rand() * 7);
  const a = randomArray(aOffset + m * k + 3);
  const b = randomArray(bOffset + k * n + 3);
  const c = new Float32Array(cOffset + m * n + 3).fill(SENTINEL);
  const c0 = randomArray(m * n);
  c.set(c0, cOffset);
  const args: GemmArgs = { m, n, k, a, aOffset, transA, b, bOffset, transB, c, cOffset, accumulate };
  gemm(args);

  const label = `m=${m} n=${n} k=${k} transA=${transA} transB=${transB} accumulate=${accumulate}`;
  for (let i = 0; i < cOffset; i++) assert.equal(c[i], SENTINEL, `${label}: wrote before C`);
  for (let i = cOffset + m * n; i < c.length; i++) assert.equal(c[i], SENTINEL, `${label}: wrote after C`);

  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let sum = 0;
      let absSum = 0;
      for (let p = 0; p < k; p++) {
        const av = transA ? a[aOffset + p * m + i] : a[aOffset + i * k + p];
        const bv = transB ? b[bOffset + j * k + p] : b[bOffset + p * n + j];
        sum += av * bv;
        absSum += Math.abs(av * bv);
      }
      const prior = accumulate ? c0[i * n + j] : 0;
      const want = prior + sum;
      const got = c[cOffset + i * n + j];
      // float32 rounding of inputs is exact here; the error comes from storing partial sums.
      const tol = 1e-6 * Math.sqrt(k + 1) * (absSum + Math.abs(prior)) + 1e-30;
      if (!(Math.abs(got - want) <= tol)) {
        assert.fail(`${label}: C[${i},${j}] = ${got}, want ${want} (tol ${tol})`);
      }
    }
  }
}

const TRANSPOSES: [boolean, boolean][] = [[false, false], [true, false], [false, true], [true, true]];

Deno.test("gemm: every small shape, all transposes, overwrite and accumulate", () => {
  const sizes = [1, 2, 3, 4, 5, 7];
  for (const [transA, transB] of TRANSPOSES) {
    for (const m of sizes) {
      for (const n of sizes) {
        for (const k of sizes) {
          for (const accumulate of [false, true]) check({ m, n, k, transA, transB, accumulate });
        }
      }
    }
  }
});

Deno.test("gemm: random odd and tile-crossing shapes", () => {
  const sizes = [1, 2, 3, 5, 7, 16, 17, 33, 64, 65, 130];
  const pick = () => sizes[Math.floor(rand() * sizes.length)];
  for (const [transA, transB] of TRANSPOSES) {
    for (let t = 0; t < 150; t++) {
      check({ m: pick(), n: pick(), k: pick(), transA, transB, accumulate: t % 2 === 1 });
    }
  }
});

Deno.test("gemm: shapes crossing the cache blocks (k > 256, n > 512, m > 64)", () => {
  const shapes: [number, number, number][] = [[3, 5, 257], [2, 1030, 9], [67, 3, 520], [1, 1, 600], [
    70,
    1027,
    2,
  ]];
  for (const [m, n, k] of shapes) {
    for (const [transA, transB] of TRANSPOSES) {
      for (const accumulate of [false, true]) check({ m, n, k, transA, transB, accumulate });
    }
  }
});

Deno.test("gemm: k = 0 clears C, or leaves it unchanged when accumulating", () => {
  for (const accumulate of [false, true]) {
    const c = new Float32Array([9, 1, 2, 3, 4, 5, 6, 9]);
    const empty = new Float32Array(0);
    gemm({
      m: 2,
      n: 3,
      k: 0,
      a: empty,
      aOffset: 0,
      transA: false,
      b: empty,
      bOffset: 0,
      transB: true,
      c,
      cOffset: 1,
      accumulate,
    });
    const want = accumulate ? [9, 1, 2, 3, 4, 5, 6, 9] : [9, 0, 0, 0, 0, 0, 0, 9];
    assert.deepEqual(Array.from(c), want);
  }
});

Deno.test("gemm: m = 0 or n = 0 touches nothing", () => {
  const a = randomArray(8), b = randomArray(8);
  for (const [m, n] of [[0, 3], [3, 0]]) {
    const c = new Float32Array(8).fill(SENTINEL);
    gemm({
      m,
      n,
      k: 2,
      a,
      aOffset: 0,
      transA: false,
      b,
      bOffset: 0,
      transB: false,
      c,
      cOffset: 0,
      accumulate: false,
    });
    assert.ok(c.every((v) => v === SENTINEL));
  }
});

Deno.test("gemm: the four transpose layouts of one product agree bit for bit", () => {
  // Packing absorbs the transposes, so the kernel sees identical panels in every variant.
  const m = 37, n = 70, k = 300;
  const a = randomArray(m * k), b = randomArray(k * n);
  const aT = new Float32Array(k * m), bT = new Float32Array(n * k);
  for (let i = 0; i < m; i++) for (let p = 0; p < k; p++) aT[p * m + i] = a[i * k + p];
  for (let p = 0; p < k; p++) for (let j = 0; j < n; j++) bT[j * k + p] = b[p * n + j];
  const results = TRANSPOSES.map(([transA, transB]) => {
    const c = new Float32Array(m * n);
    gemm({
      m,
      n,
      k,
      a: transA ? aT : a,
      aOffset: 0,
      transA,
      b: transB ? bT : b,
      bOffset: 0,
      transB,
      c,
      cOffset: 0,
      accumulate: false,
    });
    return c;
  });
  for (const c of results.slice(1)) assert.deepEqual(c, results[0]);
});

Deno.test("gemm: a large call followed by a small one (scratch reuse) stays correct", () => {
  check({ m: 130, n: 130, k: 300, transA: false, transB: true, accumulate: false });
  check({ m: 3, n: 2, k: 5, transA: true, transB: false, accumulate: true });
});
