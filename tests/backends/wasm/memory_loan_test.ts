/**
 * `lendMemory`: a CPU backend lends a range of its kernel memory to another backend (a device's
 * Worker, here one on the same thread), whose kernels then take the lender's arrays as operands in
 * place and allocate only inside the range.
 */
import assert from "node:assert/strict";
import { CpuBackend, type CpuStorage } from "../../../backends/cpu/mod.ts";
import { assertRelativelyClose } from "../../reference/close.ts";

const MB = 2 ** 20;

/** `a` (m×k) · `b` (k×n) in float64. */
function reference(a: Float32Array, b: Float32Array, m: number, k: number, n: number): Float64Array {
  const out = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let sum = 0;
      for (let p = 0; p < k; p++) sum += a[i * k + p] * b[p * n + j];
      out[i * n + j] = sum;
    }
  }
  return out;
}

// Mutations seen failing: the borrower ignoring the loan for a memory of its own (`viewLent` finds
// no lent array); `lend` without the half-the-room rule (the 1.5 GB loan is granted); `reclaim`
// doing nothing (the lender's memory stays held).
Deno.test("a lent range: the borrower computes on the lender's arrays in place and allocates only inside it", () => {
  const lender = new CpuBackend({ threads: 1 });
  const [m, k, n] = [33, 40, 17];
  const a = lender.allocateShared(m * k);
  const b = lender.allocateShared(k * n);
  for (let i = 0; i < a.length; i++) a[i] = Math.sin(i);
  for (let i = 0; i < b.length; i++) b[i] = Math.cos(3 * i);
  const held = (lender as unknown as { wasm: { residentBytes: number } }).wasm.residentBytes;

  assert.equal(lender.lendMemory(1536 * MB, [a]), undefined, "a loan of more than half the room");
  const loan = lender.lendMemory(64 * MB, [a, b]);
  assert.ok(loan, "64 MB lent");
  const borrower = new CpuBackend({ threads: 1, memory: loan });
  const lentA = borrower.viewLent(loan, 0, a.length)!;
  const lentB = borrower.viewLent(loan, 1, b.length)!;
  assert.ok(lentA && lentB, "the borrower sees the lender's arrays");
  assert.deepEqual(lentA, a);

  // The borrower's output lies in the range; the lender sees it there.
  const out = borrower.allocate(m * n, "float32") as CpuStorage;
  const at = (out.data as Float32Array).byteOffset;
  assert.ok(at >= loan.start && at + 4 * m * n <= loan.end, `output at ${at}, outside the loan`);
  borrower.matmul(borrower.wrap(lentA), borrower.wrap(lentB), out, {
    batch: 1,
    m,
    n,
    k,
    transA: false,
    transB: false,
    aBatchStride: 0,
    bBatchStride: 0,
  });
  assertRelativelyClose(out.data as Float32Array, reference(a, b, m, k, n), 1e-5, "the borrower's product");
  // A write through the lender's array is the borrower's operand's (one memory, no copy).
  a[0] = 42;
  assert.equal(lentA[0], 42);

  borrower.release(out);
  borrower.dispose();
  lender.reclaimMemory(loan);
  const after = (lender as unknown as { wasm: { residentBytes: number } }).wasm.residentBytes;
  assert.equal(after, held, "the loan is back");
  lender.dispose();
});
