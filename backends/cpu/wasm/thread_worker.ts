/**
 * A kernel pool thread (see `thread_pool.ts`): instantiates the kernel module over the shared
 * memory, reports ready, then loops: wait for a job, run its share if it takes part, mark the
 * job done in its own slot.
 *
 * @module
 */

import { workerData } from "node:worker_threads";
import { instantiateKernels } from "./generate/module.ts";
import {
  claimOf,
  Control,
  doneSlot,
  FAILURE_BYTES,
  pollWhile,
  type PoolThreadData,
  readySlot,
} from "./thread_pool.ts";
import { MAX_TASK_ARGS, runTaskShare, type TaskKind } from "./tasks.ts";

const data = workerData as PoolThreadData;
/** How long an idle thread polls for the next job before it sleeps. */
const POLL_MS = 0.2;
const control = new Int32Array(data.control);
const failure = new Uint8Array(data.failure);
const kernels = instantiateKernels(data.module, data.memory);
const claim = claimOf(control);

function fail(error: unknown): void {
  // Only the first failure of a job is kept.
  if (Atomics.compareExchange(control, Control.failed, 0, 1) !== 0) return;
  const text = `thread ${data.index}: ${(error as Error)?.stack ?? String(error)}`;
  const bytes = new TextEncoder().encode(text).subarray(0, FAILURE_BYTES);
  failure.set(bytes);
  Atomics.store(control, Control.failureLength, bytes.length);
}

// Jobs issued before this thread was ready are not its own: start from the current sequence.
let seen = Atomics.load(control, Control.sequence);
Atomics.store(control, readySlot(data.index), 1);
for (;;) {
  // Jobs come in bursts (a training step's convolutions): poll briefly before sleeping, since
  // waking from a futex can take longer than a small job (measured here: 192³ products on 2
  // threads ran at 48–92 GFLOP/s without the poll, 114–123 with it).
  pollWhile(control, Control.sequence, seen, POLL_MS);
  Atomics.wait(control, Control.sequence, seen);
  const sequence = Atomics.load(control, Control.sequence);
  if (sequence === seen) continue;
  seen = sequence;
  if (Atomics.load(control, Control.quit) !== 0) break;
  const threads = control[Control.threads];
  if (data.index >= threads) continue;
  try {
    const args = control.slice(Control.args, Control.args + MAX_TASK_ARGS);
    runTaskShare(kernels, control[Control.kind] as TaskKind, args, data.index, threads, claim);
  } catch (error) {
    fail(error);
  }
  Atomics.store(control, doneSlot(data.index), sequence);
  Atomics.notify(control, doneSlot(data.index));
}
