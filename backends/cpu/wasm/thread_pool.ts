/**
 * Pool threads for the kernels: Workers that instantiate the same kernel module over the same
 * shared memory and run their share of each task, signalled through a shared control block with
 * `Atomics` (no messages on the hot path).
 *
 * Life cycle. Threads start in the background when the backend first asks for them, and only as
 * many as it has asked for so far (a 64-core machine does not spawn 63 threads for a test's small
 * product); until they report ready, the main thread computes without them (results do not depend
 * on the thread count). Idle threads block in `Atomics.wait` and are unreferenced, so they never
 * keep a process alive (`node:worker_threads`' `unref()`: a web `Worker` has no such switch, and
 * one blocked in `Atomics.wait` cannot even be terminated). {@link KernelThreadPool.close} ends
 * them.
 *
 * Protocol (one job at a time, the main thread is thread 0):
 * 1. main writes kind, thread count and arguments, then bumps `sequence` and notifies;
 * 2. each pool thread wakes; one whose index is below the thread count runs its share (a fixed
 *    one, or for products and convolutions units taken from the job's `claim` counter until none is
 *    left) and then stores the sequence number in its own `done` slot and notifies it;
 * 3. main runs share 0, then waits until every participant's `done` slot holds the sequence.
 * Per-thread slots (not a shared counter) mean a thread that starts, or wakes late, can never be
 * counted towards a job it did not run.
 *
 * @module
 */

import type { Claim } from "./conv.ts";
import { MAX_TASK_ARGS, type TaskKind } from "./tasks.ts";

/**
 * Slots of the shared control block (Int32): fixed fields, the task arguments, then for each
 * thread index its `ready` flag and its `done` sequence (see {@link readySlot}, {@link doneSlot}).
 *
 * @example
 * ```ts
 * import { Control } from "./thread_pool.ts";
 * const control = new Int32Array(new SharedArrayBuffer(1024));
 * Atomics.load(control, Control.sequence);
 * ```
 */
export const Control = {
  sequence: 0,
  quit: 1,
  threads: 2,
  kind: 3,
  failed: 4,
  failureLength: 5,
  /** The job's next unit of work (see `Claim` in `conv.ts`): reset to 0 before each job. */
  claim: 6,
  args: 8,
} as const;

/**
 * The {@link Control.claim} counter of a control block as a {@link Claim}: each call takes the next unit.
 *
 * @example
 * ```ts
 * import { claimOf } from "./thread_pool.ts";
 * const next = claimOf(new Int32Array(new SharedArrayBuffer(64)));
 * [next(), next()]; // [0, 1]
 * ```
 */
export function claimOf(control: Int32Array): Claim {
  return () => Atomics.add(control, Control.claim, 1);
}

/**
 * Control slot of thread `index`'s ready flag (1 once it can take work).
 *
 * @example
 * ```ts
 * import { readySlot } from "./thread_pool.ts";
 * readySlot(1);
 * ```
 */
export function readySlot(index: number): number {
  return Control.args + MAX_TASK_ARGS + 2 * index;
}

/**
 * Control slot holding the last job sequence thread `index` finished.
 *
 * @example
 * ```ts
 * import { doneSlot } from "./thread_pool.ts";
 * doneSlot(1);
 * ```
 */
export function doneSlot(index: number): number {
  return readySlot(index) + 1;
}

/** How long {@link KernelThreadPool.run} waits for threads that make no progress. */
const STALL_LIMIT_MS = 120_000;

/** How long the calling thread polls for a pool thread's share before it sleeps. */
const DONE_POLL_MS = 0.2;

/** A spin-loop hint where the runtime has it (`Atomics.pause`), else nothing. */
const pause: () => void = (Atomics as unknown as { pause?: () => void }).pause?.bind(Atomics) ?? (() => {});

/**
 * Spins (with the runtime's pause hint) while `control[slot]` still holds `value`, for at most
 * `ms` milliseconds: the poll the pool's threads run before sleeping in `Atomics.wait`, since
 * waking from a futex can take longer than a small job.
 *
 * @example
 * ```ts
 * import { pollWhile } from "./thread_pool.ts";
 * pollWhile(new Int32Array(new SharedArrayBuffer(4)), 0, 1, 0.2); // returns at once: the slot holds 0
 * ```
 */
export function pollWhile(control: Int32Array, slot: number, value: number, ms: number): void {
  const until = performance.now() + ms;
  while (Atomics.load(control, slot) === value && performance.now() < until) pause();
}

/**
 * Bytes reserved for a failing thread's error message.
 *
 * @example
 * ```ts
 * import { FAILURE_BYTES } from "./thread_pool.ts";
 * const failure = new Uint8Array(new SharedArrayBuffer(FAILURE_BYTES));
 * ```
 */
export const FAILURE_BYTES = 1024;

/** What a pool thread receives when it starts. */
export interface PoolThreadData {
  /** The compiled kernel module. */
  module: WebAssembly.Module;
  /** The kernels' shared memory. */
  memory: WebAssembly.Memory;
  /** Int32 control block, laid out as {@link Control}. */
  control: SharedArrayBuffer;
  /** UTF-8 error message of a failed share. */
  failure: SharedArrayBuffer;
  /** This thread's index (1 … pool capacity; the main thread is 0). */
  index: number;
}

/** The part of `node:worker_threads`' Worker the pool uses. */
interface NodeWorker {
  unref(): void;
  on(event: "error" | "exit", listener: (value: unknown) => void): void;
}

type WorkerConstructor = new (url: URL, options: { workerData: PoolThreadData }) => NodeWorker;

/**
 * A pool of kernel threads.
 *
 * @example
 * ```ts
 * import { KernelThreadPool } from "./thread_pool.ts";
 * // const pool = new KernelThreadPool(module, memory, 3); // up to 3 threads besides the main one
 * // pool.grow(1);                                          // start one of them
 * // pool.run(kind, args, 1 + pool.ready, (claim) => runTaskShare(kernels, kind, args, 0, 1 + pool.ready, claim));
 * // pool.close();
 * ```
 */
export class KernelThreadPool {
  readonly #control: Int32Array<SharedArrayBuffer>;
  readonly #claim: Claim;
  readonly #failure = new Uint8Array(new SharedArrayBuffer(FAILURE_BYTES));
  readonly #module: WebAssembly.Module;
  readonly #memory: WebAssembly.Memory;
  #spawned = 0;
  #workerClass: Promise<WorkerConstructor> | undefined;
  #closed = false;
  #broken: string | undefined;

  /** A pool that may grow to `capacity` threads besides the calling one; none start yet. */
  constructor(module: WebAssembly.Module, memory: WebAssembly.Memory, readonly capacity: number) {
    this.#module = module;
    this.#memory = memory;
    this.#control = new Int32Array(new SharedArrayBuffer(4 * (doneSlot(capacity) + 1)));
    this.#claim = claimOf(this.#control);
  }

  /**
   * Starts threads in the background until `count` (at most the capacity) have been asked for;
   * {@link KernelThreadPool.ready} says when they can take work. Where `node:worker_threads` is
   * missing (browsers), none ever start.
   */
  grow(count: number): void {
    const target = Math.min(count, this.capacity);
    if (this.#closed || this.#broken || target <= this.#spawned) return;
    const first = this.#spawned + 1;
    this.#spawned = target;
    // A specifier in a variable keeps bundlers from resolving a module browsers do not have.
    const specifier = "node:worker_threads";
    this.#workerClass ??= (import(specifier) as Promise<{ Worker: WorkerConstructor }>).then((m) => m.Worker);
    this.#workerClass.then((Worker) => {
      for (let index = first; index <= target && !this.#closed; index++) {
        const data: PoolThreadData = {
          module: this.#module,
          memory: this.#memory,
          control: this.#control.buffer,
          failure: this.#failure.buffer as SharedArrayBuffer,
          index,
        };
        const worker = new Worker(new URL("./thread_worker.ts", import.meta.url), { workerData: data });
        worker.unref();
        worker.on("error", (error) => {
          this.#broken = `kernel thread ${index} failed: ${(error as Error)?.message ?? error}`;
        });
      }
    }).catch((error) => {
      this.#broken = `kernel threads did not start: ${(error as Error)?.message ?? error}`;
    });
  }

  /** Threads 1 … n all ready to take work (0 once closed or broken). */
  get ready(): number {
    if (this.#closed || this.#broken) return 0;
    let n = 0;
    while (n < this.#spawned && Atomics.load(this.#control, readySlot(n + 1)) === 1) n++;
    return n;
  }

  /** Why the pool stopped working, if it did. */
  get failure(): string | undefined {
    return this.#broken;
  }

  /**
   * Resolves with the number of ready threads once every thread asked for has started (or the
   * pool broke, or `timeoutMs` passed).
   */
  async whenReady(timeoutMs = 30_000): Promise<number> {
    const deadline = performance.now() + timeoutMs;
    while (this.ready < this.#spawned && !this.#closed && !this.#broken && performance.now() < deadline) {
      // A timer, not Atomics.waitAsync: the threads are unreferenced, and only a timer keeps the
      // event loop (and a test awaiting this) alive meanwhile.
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
    return this.ready;
  }

  /**
   * Runs a task on `threads` threads (1 + at most {@link KernelThreadPool.ready}): writes it to
   * the control block, wakes the pool, runs share 0 here with `mainShare` (given the job's shared
   * {@link claimOf} counter, as every pool thread is), and returns when every share is done.
   * Rethrows the first failure of any thread.
   */
  run(kind: TaskKind, args: Int32Array, threads: number, mainShare: (claim: Claim) => void): void {
    const control = this.#control;
    control[Control.kind] = kind;
    control[Control.threads] = threads;
    control.set(args.subarray(0, MAX_TASK_ARGS), Control.args);
    Atomics.store(control, Control.failed, 0);
    // Before the sequence moves: a thread that sees the new job sees the counter at 0.
    Atomics.store(control, Control.claim, 0);
    const sequence = Atomics.add(control, Control.sequence, 1) + 1;
    Atomics.notify(control, Control.sequence);
    let mainError: unknown;
    try {
      mainShare(this.#claim);
    } catch (error) {
      mainError = error;
    }
    for (let t = 1; t < threads; t++) this.#awaitDone(t, sequence);
    if (mainError !== undefined) throw mainError;
    if (Atomics.load(control, Control.failed) !== 0) {
      const length = Atomics.load(control, Control.failureLength);
      const message = new TextDecoder().decode(this.#failure.slice(0, length));
      throw new Error(`kernel thread failed: ${message}`);
    }
  }

  /**
   * Blocks until thread `t` has finished job `sequence`. A thread that died mid-job (its failure
   * event cannot arrive while this thread blocks) must not hang the process: give up after a
   * long time without it.
   */
  #awaitDone(t: number, sequence: number): void {
    const slot = doneSlot(t), started = performance.now();
    // Threads finish a split job together: poll briefly before sleeping, since waking from a
    // futex can take longer than the wait itself (a 256³ product on 2 threads takes ≈ 0.4 ms).
    const before = Atomics.load(this.#control, slot);
    if (before !== sequence) pollWhile(this.#control, slot, before, DONE_POLL_MS);
    for (;;) {
      const done = Atomics.load(this.#control, slot);
      if (done === sequence) return;
      if (performance.now() - started > STALL_LIMIT_MS) {
        this.#broken = `kernel thread ${t} did not finish a job in ${STALL_LIMIT_MS / 1000} s`;
        throw new Error(this.#broken);
      }
      Atomics.wait(this.#control, slot, done, 1000);
    }
  }

  /** Ends the threads (they finish the current job first, if any). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    Atomics.store(this.#control, Control.quit, 1);
    Atomics.add(this.#control, Control.sequence, 1);
    Atomics.notify(this.#control, Control.sequence);
  }
}
