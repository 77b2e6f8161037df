/**
 * The WebAssembly non-finite scan (`first_non_finite`, run as an elementwise task by
 * `WasmKernels.firstNonFinite` and `CpuBackend.firstNonFinite`) against the TypeScript scan
 * `firstNonFiniteIndex`: every short length and position, every finite edge value and NaN payload,
 * the thread split simulated at small lengths and run on 2 pool threads at large ones, on arrays
 * in kernel memory and outside it (staged piece by piece).
 *
 * Mutations tried, each made a test here fail (the tests that caught it in brackets):
 * - testing the mantissa bits (`0x007fffff`) instead of the exponent, in the vector loop or in the
 *   scalar loop (every test; in the vector loop only once the plain background was added: on the
 *   edge values alone, 0x007fffff in every vector sent each one to the exact scalar loop);
 * - the kernel reporting its range's last bad index instead of its first (every test);
 * - the 16-float step testing only three of its four vectors (all but "CpuBackend");
 * - an off-by-one at the tail, the scalar loop stopping one float early (every test);
 * - a thread reporting its index relative to its share, without `first` ("thread split", "2 pool
 *   threads");
 * - an empty share leaving its slot as it was instead of writing −1 ("thread split");
 * - the host taking the first thread's answer instead of the smallest, or the largest ("thread
 *   split", "2 pool threads");
 * - a staged piece's index not offset by the piece's start ("2 pool threads", "in pieces");
 * - `CpuBackend.firstNonFinite` answering −1 for any array outside kernel memory ("CpuBackend").
 *
 * @module
 */

import assert from "node:assert/strict";
import { CpuBackend, CpuStorage } from "../../../backends/cpu/backend.ts";
import { firstNonFiniteIndex } from "../../../backends/cpu/elementwise.ts";
import { firstFound } from "../../../backends/cpu/wasm/finite.ts";
import { instantiateKernels, kernelModuleBytes } from "../../../backends/cpu/wasm/generate/module.ts";
import { WasmKernels } from "../../../backends/cpu/wasm/kernels.ts";
import {
  ElementwiseOp,
  encodeTask,
  MAX_TASK_ARGS,
  runTaskShare,
  TaskKind,
} from "../../../backends/cpu/wasm/tasks.ts";

/**
 * Finite bit patterns on every edge: ±0, the smallest and largest subnormals (the latter with all
 * mantissa bits set), the smallest normal, ±FLT_MAX (exponent one short of all ones), 1 and −1.
 */
const FINITE_BITS = [
  0x00000000,
  0x80000000,
  0x00000001,
  0x807fffff,
  0x007fffff,
  0x00800000,
  0x7f7fffff,
  0xff7fffff,
  0x3f800000,
  0xbf800000,
];
/** NaN with several payloads and signs (quiet and signalling), and ±∞. */
const BAD_BITS = [
  0x7fc00000,
  0xffc00000,
  0x7f800001,
  0x7fffffff,
  0xff800001,
  0x7fa00000,
  0x7f800000,
  0xff800000,
];

/**
 * `n` finite floats: the edge values in a cycle (`edges`), or small integers and halves (`plain`),
 * whose mantissas are far from all ones, so a vector test on the wrong bits lets a bad value
 * through (on `edges` the all-ones mantissa of 0x007fffff in every vector would send each one to
 * the exact scalar loop and hide it).
 */
function finiteValues(n: number, background: "edges" | "plain" = "plain"): Float32Array {
  if (background === "plain") return Float32Array.from({ length: n }, (_, i) => (i % 13) / 2 - 3);
  const bits = new Uint32Array(n);
  for (let i = 0; i < n; i++) bits[i] = FINITE_BITS[i % FINITE_BITS.length];
  return new Float32Array(bits.buffer);
}

/** Sets the bits of `x[i]` (NaN payloads survive only through integer views). */
function setBits(x: Float32Array, i: number, bits: number): void {
  new Uint32Array(x.buffer, x.byteOffset, x.length)[i] = bits;
}

/** Every length up to 70 (tails of 0–15 floats after 0–4 16-float steps), and some longer ones. */
const LENGTHS = [...Array.from({ length: 71 }, (_, n) => n), 127, 128, 129, 1001, 4099];

/** Positions to spoil in an array of `n`: all of them when short, else the ends and a spread. */
function positions(n: number): number[] {
  if (n <= 140) return Array.from({ length: n }, (_, i) => i);
  const spread = [0, 1, 3, 15, 16, 17, 63, 64, 65, n >> 1, n - 17, n - 16, n - 15, n - 4, n - 3, n - 1];
  return [...new Set(spread)].filter((i) => i >= 0 && i < n);
}

const single = WasmKernels.create({ threads: 1 })!;
const twoThreads = WasmKernels.create({ threads: 2 })!;

/** A copy of `values` inside `kernels`' memory (length 0 has none: kept outside, which is fine). */
function resident(kernels: WasmKernels, values: Float32Array): Float32Array {
  const array = kernels.allocateArray(values.length, "float32", false) ?? new Float32Array(0);
  array.set(values);
  return array;
}

/** The kernel's answer for `values`, in kernel memory and outside it; both must be the TS scan's. */
function checkBoth(kernels: WasmKernels, values: Float32Array, what: string): void {
  const expected = firstNonFiniteIndex(values);
  const inside = resident(kernels, values);
  try {
    assert.ok(values.length === 0 || kernels.isResident(inside));
    assert.equal(kernels.firstNonFinite(inside), expected, `${what} in kernel memory`);
    assert.equal(kernels.firstNonFinite(values), expected, `${what} outside kernel memory`);
  } finally {
    kernels.freeArray(inside);
  }
}

Deno.test("wasm firstNonFinite: every length, position, NaN payload and finite edge value, as the TS scan", () => {
  for (const background of ["edges", "plain"] as const) {
    for (const n of LENGTHS) {
      checkBoth(single, finiteValues(n, background), `${background}: all finite n=${n}`);
      for (const at of positions(n)) {
        for (const bad of BAD_BITS) {
          const values = finiteValues(n, background);
          setBits(values, at, bad);
          // A later bad value (in the same vector, the next one, or the tail) must not win.
          for (const later of [at + 1, at + 5, at + 16, n - 1]) {
            if (later > at && later < n) setBits(values, later, bad);
          }
          checkBoth(single, values, `${background}: n=${n} bad 0x${bad.toString(16)} at ${at}`);
        }
      }
    }
  }
});

/**
 * The task run share by share on this thread, as `threads` pool threads would (the pool only takes
 * part from some 500,000 floats on), with the slots pre-filled with 0, a wrong answer, and the
 * host's {@link firstFound} over them.
 */
const shareMemory = new WebAssembly.Memory({ initial: 2, maximum: 16, shared: true });
const shareKernels = instantiateKernels(
  new WebAssembly.Module(kernelModuleBytes({ fma: false, shared: true })),
  shareMemory,
);

function simulatedShares(values: Float32Array, threads: number): number {
  const memory = shareMemory, kernels = shareKernels;
  const x = 1024, slots = 64;
  new Float32Array(memory.buffer, x, values.length).set(values);
  new Int32Array(memory.buffer, slots, threads).fill(0);
  const args = new Int32Array(MAX_TASK_ARGS);
  const task = {
    op: ElementwiseOp.firstNonFinite,
    length: values.length,
    a: x,
    b: 0,
    out: slots,
    extra: 0,
    extra2: 0,
  };
  encodeTask(TaskKind.elementwise, task, args);
  for (let t = threads - 1; t >= 0; t--) runTaskShare(kernels, TaskKind.elementwise, args, t, threads);
  return firstFound(new Int32Array(memory.buffer, slots, threads));
}

Deno.test("wasm firstNonFinite: the thread split (1, 2, 3 shares) gives the TS scan's index at every position", () => {
  for (const n of [0, 1, 3, 16, 17, 31, 32, 33, 47, 48, 49, 95, 100, 161]) {
    for (const threads of [1, 2, 3]) {
      const cases: number[][] = [
        [],
        ...positions(n).map((at) => [at]),
        ...positions(n).map((at) => [at, n - 1]),
      ];
      for (const bad of cases) {
        const values = finiteValues(n);
        for (const at of bad) setBits(values, at, BAD_BITS[at % BAD_BITS.length]);
        const what = `n=${n} ${threads} shares bad at ${bad}`;
        assert.equal(simulatedShares(values, threads), firstNonFiniteIndex(values), what);
      }
    }
  }
});

Deno.test("wasm firstNonFinite: 2 pool threads on a large array, around the split and the tail", async () => {
  assert.equal(await twoThreads.startThreads(), 2);
  // Large enough for two threads, not a whole number of cache lines; the 2-thread split falls at
  // half the 16-float lines.
  const n = (1 << 20) + 13, split = Math.floor(Math.ceil(n / 16) / 2) * 16;
  const base = finiteValues(n);
  const spots = [0, 1, split - 17, split - 1, split, split + 1, split + 16, n - 14, n - 2, n - 1];
  const cases: number[][] = [[], ...spots.map((at) => [at]), [split + 3, split - 5], [split + 1, n - 1], [
    3,
    split,
  ]];
  for (const kernels of [twoThreads, single]) {
    const inside = resident(kernels, base);
    for (const bad of cases) {
      for (const at of bad) setBits(inside, at, BAD_BITS[at % BAD_BITS.length]);
      const expected = firstNonFiniteIndex(inside);
      const what = `${kernels.threads} threads, bad at ${bad}`;
      assert.equal(kernels.firstNonFinite(inside), expected, `${what} in kernel memory`);
      assert.equal(kernels.firstNonFinite(inside.slice()), expected, `${what} outside kernel memory`);
      for (const at of bad) inside[at] = base[at];
    }
    kernels.freeArray(inside);
  }
});

Deno.test("wasm firstNonFinite: outside kernel memory, in pieces: bad values in later pieces and on their edges", () => {
  const piece = 1 << 18, n = 3 * piece + 5;
  const values = finiteValues(n);
  for (const at of [piece - 1, piece, 2 * piece + 7, 3 * piece, n - 1]) {
    setBits(values, at, 0x7f800000);
    assert.equal(single.firstNonFinite(values), at, `bad at ${at}`);
    assert.equal(single.firstNonFinite(values.subarray(1)), at - 1, `a view, bad at ${at - 1}`);
    setBits(values, at, FINITE_BITS[0]);
  }
  assert.equal(single.firstNonFinite(values), -1);
});

Deno.test("CpuBackend firstNonFinite: kernel memory, wrapped arrays and the TypeScript backend agree", () => {
  const wasm = new CpuBackend({ threads: 1 }), ts = new CpuBackend({ kernels: "ts" });
  try {
    for (const n of [0, 1, 7, 33, 1000]) {
      for (const at of [-1, 0, n >> 1, n - 1]) {
        if (n === 0 && at >= 0) continue;
        const values = finiteValues(n);
        if (at >= 0) setBits(values, at, 0xff800000);
        const expected = firstNonFiniteIndex(values);
        assert.equal(wasm.firstNonFinite(wasm.upload(values)), expected, `uploaded n=${n} bad at ${at}`);
        assert.equal(
          wasm.firstNonFinite(new CpuStorage(values.slice())),
          expected,
          `wrapped n=${n} bad at ${at}`,
        );
        assert.equal(ts.firstNonFinite(ts.upload(values)), expected, `ts n=${n} bad at ${at}`);
      }
    }
  } finally {
    wasm.dispose();
  }
});

addEventListener("unload", () => twoThreads.dispose());
