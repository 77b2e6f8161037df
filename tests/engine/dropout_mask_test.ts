/**
 * Dropout masks drawn by the CPU backend's WebAssembly generator (`dropoutMask`) are the engine's
 * TypeScript masks bit for bit: the same Philox4x32-10 words, the same keep/drop test, at any
 * offset (a group of 16 positions entered part way, a counter's low word wrapping into its high
 * word) and length; and `ops.dropout` gives the same outputs and gradients whether the backend
 * draws the mask or the engine does (a CPU backend with TypeScript kernels declines).
 *
 * Mutations tried, each made this test fail: the kernel not carrying the block counter's low word
 * into the high one (the offsets near 4·2^32); `skip` taken as `offset mod 4` instead of
 * `offset mod 16`; the keep test `>` instead of `≥` (the threshold set to a drawn numerator);
 * the key schedule bumping one round late; `dropout` ignoring the backend's mask (the call count).
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import type { DropoutMaskSpec } from "../../backends/backend.ts";
import { ops, registerBackend, setBackend, tensor, valueAndGrad } from "../../mod.ts";
import { philoxWords, type RandomKey, uniformValues } from "../../engine/random.ts";
import { mulberry32 } from "../reference/random.ts";

/** The engine's mask, from the TypeScript generator. */
function engineMask(count: number, key: RandomKey, offset: number, threshold: number, keep: number) {
  const u = uniformValues(count, key, offset);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = u[i] * 2 ** 24 >= threshold ? keep : 0;
  return out;
}

function bitsOf(a: Float32Array): Uint32Array {
  return new Uint32Array(a.buffer, a.byteOffset, a.length);
}

Deno.test("CpuBackend.dropoutMask: the engine's Philox masks bit for bit at any offset and length", () => {
  const cpu = new CpuBackend({ threads: 1 });
  const key = { seed: 2 ** 40 + 99, stream: 12, step: 77 };
  const [k0, k1, stream, step] = philoxWords(key);
  // Numerators drawn at position 0 of the first offset: thresholds right at a value test ≥.
  const drawn = Math.round(uniformValues(1, key, 5)[0] * 2 ** 24);
  const offsets = [0, 1, 5, 15, 16, 17, 12_345, 4 * (2 ** 32 - 3) + 1, 4 * (2 ** 32 - 1), 2 ** 50 + 7];
  const counts = [1, 3, 16, 17, 33, 1000, 20_000];
  let kept = 0, total = 0;
  for (const offset of offsets) {
    for (const count of counts) {
      for (const threshold of [2 ** 23, 1_677_722, drawn, drawn + 1]) {
        const keep = Math.fround(1 / (1 - threshold / 2 ** 24));
        const spec: DropoutMaskSpec = { key: [k0, k1], stream, step, offset, threshold, keep };
        const out = cpu.allocate(count, "float32");
        assert.ok(cpu.dropoutMask(out, spec), "the WebAssembly kernels draw it");
        const got = cpu.readSync(out) as Float32Array, want = engineMask(count, key, offset, threshold, keep);
        const g = bitsOf(got), w = bitsOf(want);
        const first = g.findIndex((v, i) => v !== w[i]);
        assert.equal(first, -1, `offset ${offset} count ${count} threshold ${threshold}: element ${first}`);
        kept += want.filter((v) => v !== 0).length;
        total += count;
        cpu.release(out);
      }
    }
  }
  // Not all kept or all dropped: the comparison means something.
  assert.ok(kept > 0.3 * total && kept < 0.8 * total, `${kept} of ${total} kept`);
  // The threshold at a drawn numerator keeps that position, one above drops it.
  for (const [threshold, value] of [[drawn, 1], [drawn + 1, 0]]) {
    const out = cpu.allocate(1, "float32");
    cpu.dropoutMask(out, { key: [k0, k1], stream, step, offset: 5, threshold, keep: 1 });
    assert.equal((cpu.readSync(out) as Float32Array)[0], value, `threshold ${threshold}`);
  }
  cpu.dispose();
});

Deno.test("ops.dropout: the same outputs and gradients whether the backend or the engine draws the mask", () => {
  const drawing = new CpuBackend({ name: "cpu-dropout-wasm", threads: 1 });
  const declining = new CpuBackend({ name: "cpu-dropout-ts", kernels: "ts" });
  let calls = 0;
  const original = drawing.dropoutMask.bind(drawing);
  drawing.dropoutMask = (out, spec) => {
    calls++;
    return original(out, spec);
  };
  const random = mulberry32(3);
  const values = Float32Array.from({ length: 6 * 1000 }, () => random() * 2 - 1);
  const results = [drawing, declining].map((backend) => {
    registerBackend(backend);
    setBackend(backend.name);
    try {
      const x = tensor(values, { shape: [6, 1000] });
      const options = { p: 0.3, seed: 9, stream: 4, offset: 70 };
      const y = ops.dropout(x, options);
      const { grads: [dx] } = valueAndGrad((t) => ops.sum(ops.mul(ops.dropout(t, options), t)))(x);
      return [y.dataSync() as Float32Array, dx.dataSync() as Float32Array];
    } finally {
      setBackend("cpu");
    }
  });
  assert.ok(calls >= 2, "the WebAssembly backend drew the masks");
  for (const [i, what] of ["output", "gradient"].entries()) {
    const [a, b] = [bitsOf(results[0][i]), bitsOf(results[1][i])];
    assert.equal(a.findIndex((v, j) => v !== b[j]), -1, `${what}: same bits`);
  }
  const dropped = results[0][0].filter((v) => v === 0).length;
  assert.ok(dropped > 1500 && dropped < 2100, `${dropped} of 6000 dropped at p = 0.3`);
  drawing.dispose();
});

Deno.test("ops.dropout of a block of columns: the backend draws it row by row, the same bits as the engine's and as the whole layer's", () => {
  // A hybrid head's slice: columns 37 … 436 of rows 1000 wide, for global rows given out of order
  // (a micro-batch). Mutation: without the per-row branch in `maskOf` the backend is never asked
  // (calls stays 0); with a wrong row offset the bits differ from the whole layer's mask.
  const drawing = new CpuBackend({ name: "cpu-dropout-columns-wasm", threads: 1 });
  const declining = new CpuBackend({ name: "cpu-dropout-columns-ts", kernels: "ts" });
  let calls = 0;
  const original = drawing.dropoutMask.bind(drawing);
  drawing.dropoutMask = (out, spec) => {
    calls++;
    return original(out, spec);
  };
  const random = mulberry32(5);
  const rows = [4, 0, 5], start = 37, width = 400, total = 1000;
  const whole = Float32Array.from({ length: 6 * total }, () => random() * 2 - 1);
  const block = new Float32Array(rows.length * width);
  for (const [r, row] of rows.entries()) {
    block.set(whole.subarray(row * total + start, row * total + start + width), r * width);
  }
  const options = { p: 0.4, seed: 11, stream: 6, offset: 3 };
  const results = [drawing, declining].map((backend) => {
    registerBackend(backend);
    setBackend(backend.name);
    try {
      const y = ops.dropout(tensor(block, { shape: [rows.length, width] }), {
        ...options,
        columns: { start, total, rows },
      });
      const full = ops.dropout(tensor(whole, { shape: [6, total] }), options).dataSync() as Float32Array;
      return { block: y.dataSync() as Float32Array, full };
    } finally {
      setBackend("cpu");
    }
  });
  assert.equal(
    calls,
    1 + rows.length,
    "the WebAssembly backend drew the whole mask, and the block row by row",
  );
  const [a, b] = [bitsOf(results[0].block), bitsOf(results[1].block)];
  assert.equal(a.findIndex((v, j) => v !== b[j]), -1, "backend and engine: same bits");
  for (const [r, row] of rows.entries()) {
    const expected = bitsOf(results[0].full.slice(row * total + start, row * total + start + width));
    const got = a.subarray(r * width, (r + 1) * width);
    assert.equal(got.findIndex((v, j) => v !== expected[j]), -1, `row ${row}: the whole layer's bits`);
  }
  drawing.dispose();
});
