/**
 * Convolutions on the kernel threads take their work as it comes: images (forward, input gradient)
 * and the weight gradient's image chunks (or, with more threads than chunks, row blocks of them)
 * are handed out by one shared counter to whichever thread asks first, so a thread on a busy core
 * takes fewer, and the bits do not depend on who took what.
 *
 * Two threads are played here one after the other on this thread, with the job's counter shared:
 * the one that runs first takes every unit, the other none, and the output (pre-filled with NaN)
 * has the bits of the whole task run on one thread with fixed shares.
 *
 * Products do the same with whole products, or windows of few products' longer side.
 *
 * Mutations tried: `runTaskShare` ignoring the counter (fixed shares: the first thread takes 0 units
 * from it and the split is [0, 0], not [all, 0]); the weight-gradient units stopping one early
 * (`u < units - 1`: the last rows or chunk stay NaN or unsummed); `filterRowBlock`'s
 * `threads <= chunks` reversed (the one-image case gets no row blocks); a chunk's first image
 * accumulating (`n > 0`: NaN); `runMatmul` ignoring the counter
 * (the same [0, 0]); a claimed window's product index taken as `u % batch` (NaN left, bits differ).
 */

import assert from "node:assert/strict";
import {
  addFilterChunks,
  columnRows,
  filterChunks,
  filterPartialsBytes,
} from "../../../backends/cpu/wasm/conv.ts";
import { directFilter } from "../../../backends/cpu/wasm/filter_direct.ts";
import { instantiateKernels, kernelModuleBytes } from "../../../backends/cpu/wasm/generate/module.ts";
import {
  convTaskLayout,
  encodeTask,
  filterRowBlock,
  matmulWindow,
  MAX_TASK_ARGS,
  runTaskShare,
  TaskKind,
} from "../../../backends/cpu/wasm/tasks.ts";
import {
  DEFAULT_GEMM_BLOCKS,
  GEMM_TILE,
  gemmScratchBytes,
  kernelBlocks,
} from "../../../backends/cpu/wasm/gemm.ts";
import { type Conv2dGeometry, conv2dGeometry } from "../../../backends/geometry.ts";
import { mulberry32 } from "../../reference/random.ts";

const memory = new WebAssembly.Memory({ initial: 256, maximum: 1024 });
const kernels = instantiateKernels(
  new WebAssembly.Module(kernelModuleBytes({ fma: false, shared: false })),
  memory,
);

/** A bump allocator over the kernel memory, 64-byte aligned. */
function allocator(): (bytes: number) => number {
  let next = 1024;
  return (bytes) => {
    const at = next;
    next = (next + bytes + 63) & ~63;
    if (next > memory.buffer.byteLength) throw new Error("test memory too small");
    return at;
  };
}

interface Case {
  kind: TaskKind;
  name: string;
  g: Conv2dGeometry;
}

// 162 column-matrix rows in 2 groups. The weight gradient: 5 images, 5 chunks of one; 11 images,
// 8 chunks of 1 or 2; 1 image, one chunk in 3 row blocks of at least 6 panels (FILTER_BLOCK_PANELS).
// At stride 1 (9 channels per group: not Winograd's) it runs directly (`filter_direct.ts`); at
// stride 2 through GEMM.
const [w, options] = [[8, 9, 3, 3], { padding: 1, groups: 2 }] as const;
const g = conv2dGeometry([5, 18, 9, 9], w, options);
const CASES: Case[] = [
  { kind: TaskKind.convForward, name: "forward", g },
  { kind: TaskKind.convBackwardInput, name: "input gradient", g },
  { kind: TaskKind.convBackwardFilter, name: "weight gradient, 5 images", g },
  {
    kind: TaskKind.convBackwardFilter,
    name: "weight gradient, 11 images",
    g: conv2dGeometry([11, 18, 9, 9], w, options),
  },
  {
    kind: TaskKind.convBackwardFilter,
    name: "weight gradient, 1 image",
    g: conv2dGeometry([1, 18, 9, 9], w, options),
  },
  {
    kind: TaskKind.convBackwardFilter,
    name: "weight gradient by GEMM, 5 images",
    g: conv2dGeometry([5, 18, 9, 9], w, { ...options, stride: 2 }),
  },
  {
    kind: TaskKind.convBackwardFilter,
    name: "weight gradient by GEMM, 1 image",
    g: conv2dGeometry([1, 18, 9, 9], w, { ...options, stride: 2 }),
  },
];

/** Units of work the counter hands out for a case on `threads` threads. */
function units(c: Case, threads: number): number {
  return c.kind === TaskKind.convBackwardFilter
    ? filterChunks(c.g) * Math.ceil(columnRows(c.g) / filterRowBlock(c.g, threads))
    : c.g.batch;
}

/**
 * Runs `c` as `threads` threads in the order `order`, sharing one counter (or, without `order`,
 * on one thread with fixed shares); returns the result and how many units each thread took.
 */
function run(c: Case, threads: number, order?: number[]): { result: Float32Array; taken: number[] } {
  const alloc = allocator();
  const random = mulberry32(7);
  const fill = (at: number, n: number) => {
    const view = new Float32Array(memory.buffer, at, n);
    for (let i = 0; i < n; i++) view[i] = random() * 2 - 1;
  };
  const xLen = c.g.batch * c.g.inChannels * c.g.inHeight * c.g.inWidth;
  const wLen = c.g.outChannels * (c.g.inChannels / c.g.groups) * c.g.kernelH * c.g.kernelW;
  const yLen = c.g.batch * c.g.outChannels * c.g.outHeight * c.g.outWidth;
  const [image, weight, output] = [xLen, wLen, yLen].map((n) => alloc(4 * n + 64));
  fill(image, xLen);
  fill(weight, wLen);
  fill(output, yLen);
  // The result is written over NaN: a unit nobody computed shows.
  const [resultAt, resultLen] = c.kind === TaskKind.convForward
    ? [output, yLen]
    : c.kind === TaskKind.convBackwardInput
    ? [image, xLen]
    : [weight, wLen];
  new Float32Array(memory.buffer, resultAt, resultLen).fill(NaN);
  const backwardFilter = c.kind === TaskKind.convBackwardFilter;
  const rows = backwardFilter ? filterRowBlock(c.g, threads) : columnRows(c.g);
  // Partials start as NaN too: a chunk that added to them instead of overwriting shows.
  const partials = alloc(filterPartialsBytes(c.g));
  new Float32Array(memory.buffer, partials, filterPartialsBytes(c.g) / 4).fill(NaN);
  const { table, scratchStride } = convTaskLayout(c.kind, c.g, rows, DEFAULT_GEMM_BLOCKS);
  const scratch = alloc(threads * scratchStride);
  const offsets = table ? alloc(4 * table.length) : 0;
  if (table) new Int32Array(memory.buffer, offsets, table.length).set(table);
  const args = new Int32Array(MAX_TASK_ARGS);
  const task = {
    ...c.g,
    image,
    weight,
    output,
    bias: 0,
    relu: false,
    offsets,
    partials,
    scratch,
    scratchStride,
    ...kernelBlocks(DEFAULT_GEMM_BLOCKS, true),
  };
  encodeTask(c.kind, task, args);
  const taken = Array(threads).fill(0);
  if (!order) {
    runTaskShare(kernels, c.kind, args, 0, 1);
  } else {
    let counter = 0;
    const total = units(c, threads);
    for (const t of order) {
      runTaskShare(kernels, c.kind, args, t, threads, () => {
        const unit = counter++;
        if (unit < total) taken[t]++;
        return unit;
      });
    }
  }
  if (backwardFilter) addFilterChunks(kernels, c.g, weight, partials);
  return { result: new Float32Array(memory.buffer, resultAt, resultLen).slice(), taken };
}

function sameBits(actual: Float32Array, expected: Float32Array): boolean {
  const a = new Uint32Array(actual.buffer), b = new Uint32Array(expected.buffer);
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

Deno.test("wasm threads: convolutions hand their images and weight-gradient chunks and row blocks to whichever thread asks first", () => {
  for (const c of CASES) {
    if (c.kind === TaskKind.convBackwardFilter) {
      assert.equal(directFilter(c.g), c.g.strideH === 1, `${c.name}: direct exactly at stride 1`);
    }
    const whole = run(c, 1).result;
    assert.ok(whole.every(Number.isFinite), `${c.name}: the one-thread result is complete`);
    assert.ok(units(c, 2) > 2, `${c.name}: more units than threads, so the split means something`);
    for (const order of [[0, 1], [1, 0]]) {
      const { result, taken } = run(c, 2, order);
      const expected = order[0] === 0 ? [units(c, 2), 0] : [0, units(c, 2)];
      assert.deepEqual(
        taken,
        expected,
        `${c.name}: the thread that asks first (${order[0]}) takes every unit`,
      );
      assert.ok(sameBits(result, whole), `${c.name}: bits of the one-thread result whoever took the units`);
    }
  }
});

/** Products: [batch, m, n, k, transA, transB], each cut into a different kind of unit on 2 threads. */
const PRODUCTS: [string, number, number, number, number, boolean, boolean][] = [
  ["9 whole products", 9, 40, 50, 300, false, true],
  ["one product in column windows", 1, 30, 260, 301, true, false],
  ["one product in row windows", 1, 270, 40, 70, false, false],
  ["3 products in windows across them", 3, 20, 130, 90, true, true],
];

function runProducts(
  [, batch, m, n, k, transA, transB]: typeof PRODUCTS[number],
  threads: number,
  order?: number[],
): { result: Float32Array; taken: number[]; units: number } {
  const alloc = allocator();
  const random = mulberry32(11);
  const a = alloc(4 * batch * m * k), b = alloc(4 * batch * k * n), c = alloc(4 * batch * m * n);
  for (const [at, count] of [[a, batch * m * k], [b, batch * k * n]]) {
    const view = new Float32Array(memory.buffer, at, count);
    for (let i = 0; i < count; i++) view[i] = random() * 2 - 1;
  }
  new Float32Array(memory.buffer, c, batch * m * n).fill(NaN);
  const scratchStride = gemmScratchBytes(DEFAULT_GEMM_BLOCKS);
  const scratch = alloc(threads * scratchStride);
  const args = new Int32Array(MAX_TASK_ARGS);
  encodeTask(TaskKind.matmul, {
    batch,
    m,
    n,
    k,
    a,
    lda: transA ? m : k,
    transA,
    aBatchStride: 4 * m * k,
    b,
    ldb: transB ? k : n,
    transB,
    bBatchStride: 4 * k * n,
    c,
    ldc: n,
    cBatchStride: 4 * m * n,
    accumulate: false,
    scratch,
    scratchStride,
    ...kernelBlocks(DEFAULT_GEMM_BLOCKS, true),
    bias: 0,
    relu: false,
  }, args);
  const whole = batch >= 4 * threads || batch % threads === 0;
  const [size, quantum] = n >= m ? [n, GEMM_TILE.nr] : [m, GEMM_TILE.mr];
  const units = whole ? batch : batch * Math.ceil(size / matmulWindow(size, quantum, threads));
  const taken = Array(threads).fill(0);
  if (!order) runTaskShare(kernels, TaskKind.matmul, args, 0, 1);
  else {
    let counter = 0;
    for (const t of order) {
      runTaskShare(kernels, TaskKind.matmul, args, t, threads, () => {
        const unit = counter++;
        if (unit < units) taken[t]++;
        return unit;
      });
    }
  }
  return { result: new Float32Array(memory.buffer, c, batch * m * n).slice(), taken, units };
}

Deno.test("wasm threads: products hand whole products or windows of C to whichever thread asks first", () => {
  for (const product of PRODUCTS) {
    const name = product[0];
    const whole = runProducts(product, 1).result;
    assert.ok(whole.every(Number.isFinite), `${name}: the one-thread result is complete`);
    for (const order of [[0, 1], [1, 0]]) {
      const { result, taken, units } = runProducts(product, 2, order);
      assert.ok(units >= 2, `${name}: at least one unit per thread (${units})`);
      assert.deepEqual(
        taken,
        order[0] === 0 ? [units, 0] : [0, units],
        `${name}: the first to ask takes all`,
      );
      assert.ok(sameBits(result, whole), `${name}: bits of the one-thread result whoever took the units`);
    }
  }
});

// Mutation that fails this test: `encodeTask` without its size check (the short block's last
// fields are dropped silently and nothing throws).
Deno.test("wasm threads: every task kind's fields fit the shared argument block, and a block too short is refused", () => {
  const zeros = new Proxy({}, { get: () => 0, has: () => false });
  for (const kind of Object.values(TaskKind)) {
    const args = new Int32Array(MAX_TASK_ARGS).fill(-1);
    encodeTask(kind, zeros as Parameters<typeof encodeTask>[1], args);
    const used = args.includes(-1) ? args.indexOf(-1) : MAX_TASK_ARGS;
    assert.throws(
      () => encodeTask(kind, zeros as Parameters<typeof encodeTask>[1], new Int32Array(used - 1)),
      /has \d+ fields, the block holds/,
      `kind ${kind}: ${used} fields`,
    );
  }
});
