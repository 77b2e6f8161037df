/**
 * `Tensor.readInto`: reads into host memory the caller keeps. On the CPU it copies straight into
 * that memory through `wrap`, with no fresh array (a hybrid step reads megabytes of slice gradients
 * each time, and fresh pages cost it ≈ 15 ms a step on a 2-core EPYC VM); elsewhere it reads and
 * copies. Values are checked against `data()`, dense and as columns of a wider matrix, on the CPU
 * (into ordinary and kernel-shared memory) and on WebGPU.
 *
 * @module
 */

import assert from "node:assert/strict";
import type { Backend, Storage } from "../../backends/backend.ts";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import { ShapeError } from "../../engine/errors.ts";
import { fromStorage } from "../../engine/creation.ts";
import type { Tensor } from "../../engine/tensor.ts";
import { moduleWebGpu } from "../fixtures/webgpu.ts";

const gpu = await moduleWebGpu();

/** A `[rows, width]` tensor of distinct values on `backend`. */
function matrix(backend: Backend, rows: number, width: number): Tensor {
  const values = Float32Array.from({ length: rows * width }, (_, i) => 0.5 + i * 1.25);
  return fromStorage(backend, backend.upload(values), [rows, width]);
}

/** What `readInto(…, columns)` must leave: `values` as columns start… of `total`, the rest as `before`. */
function expectedColumns(
  values: Float32Array,
  width: number,
  start: number,
  total: number,
  before: Float32Array,
) {
  const out = before.slice();
  for (let i = 0; i < values.length; i++) {
    out[Math.floor(i / width) * total + start + (i % width)] = values[i];
  }
  return out;
}

async function checkValues(backend: Backend, target: () => Float32Array): Promise<void> {
  const t = matrix(backend, 5, 7);
  const values = (await t.data()) as Float32Array;
  const dense = target().subarray(0, 35);
  await t.readInto(dense);
  assert.deepEqual(dense, values);
  const wide = target().subarray(0, 5 * 11);
  wide.fill(-1);
  const before = wide.slice();
  await t.readInto(wide, { start: 3, total: 11 });
  assert.deepEqual(wide, expectedColumns(values, 7, 3, 11, before));
  t.dispose();
}

Deno.test("readInto: the CPU writes the caller's memory in place, never reading a fresh copy", async () => {
  const cpu = new CpuBackend();
  // Mutation: readInto without its `wrap` branch (a `data()` and a set, as before) fails here.
  let reads = 0;
  const counted: Backend = Object.create(cpu);
  counted.read = (s: Storage) => {
    reads++;
    return cpu.read(s);
  };
  counted.readSync = (s: Storage) => {
    reads++;
    return cpu.readSync(s);
  };
  const t = matrix(counted, 4, 6);
  const values = cpu.readSync(t.storage) as Float32Array;
  const target = new Float32Array(4 * 9);
  await t.readInto(target, { start: 2, total: 9 });
  await t.readInto(target.subarray(0, 24));
  assert.equal(reads, 0);
  assert.deepEqual(target.subarray(0, 24), values);
  await checkValues(cpu, () => new Float32Array(64));
  // Into memory the kernels share (a device's gradients), which `wrap` adopts in place.
  const shared = cpu.allocateShared(128);
  await checkValues(cpu, () => shared.subarray(5));
});

Deno.test("readInto: a target that does not fit is refused in one line, naming the op", async () => {
  const cpu = new CpuBackend();
  const t = matrix(cpu, 3, 4);
  const target = new Float32Array(12).fill(7);
  for (
    const [into, columns] of [
      [new Float32Array(11), undefined],
      [target, { start: 1, total: 4 }],
      [new Float32Array(14), { start: 0, total: 5 }],
      [target, { start: -1, total: 5 }],
    ] as const
  ) {
    await assert.rejects(() => t.readInto(into, columns), (e: Error) => {
      assert.ok(e instanceof ShapeError, String(e));
      assert.match(
        e.message,
        /^readInto: float32 tensor \[3, 4\] does not fit .*a target of \d+ float32 elements$/,
      );
      return true;
    });
  }
  assert.deepEqual(target, new Float32Array(12).fill(7), "nothing written");
});

Deno.test({
  name: "readInto: WebGPU (no host memory to wrap) reads back and copies the same values",
  ignore: gpu === null,
  fn: async () => {
    await checkValues(gpu!, () => new Float32Array(64));
  },
});
