/**
 * Waiting on MPI: the handle of one posted non-blocking operation ({@link MpiRequest}), when to give
 * up on it ({@link WaitOptions}), and the {@link TransportError} that a missed deadline — or a
 * transport unusable after one — throws.
 *
 * A collective is posted (`MPI_Igather`, `MPI_Iallgather`, `MPI_Ibcast`, …) by the transport and
 * then tested with `MPI_Test` between short yields to the event loop: immediate ones for the first
 * {@link MpiTransportOptions.spinMs} milliseconds, 1 ms sleeps after that, so a rank waiting for a
 * slower one does not take a core from the computing Workers.
 *
 * @module
 */

import { TandemError } from "../../engine/mod.ts";
import type { MpiLibrary } from "./library.ts";

/**
 * A collective did not complete in time, or the transport cannot be used any more after an earlier
 * failure. Names the rank, the operation and, during training, the step.
 *
 * @example
 * ```ts
 * import { TransportError } from "./request.ts";
 * const e = new TransportError(0, "reduce fc (MPI_Igather)", "did not complete within 5 s", 2);
 * console.log(e.message); // MPI rank 0, step 2: reduce fc (MPI_Igather) did not complete within 5 s
 * ```
 */
export class TransportError extends TandemError {
  /** The rank that saw the failure. */
  readonly rank: number;
  /** What it was doing, e.g. `reduce fc (MPI_Igather)`. */
  readonly operation: string;
  /** The training step, when the failure happened during one. */
  readonly step?: number;

  /** `operation` on `rank` failed as `reason` says, during `step` if given. */
  constructor(rank: number, operation: string, reason: string, step?: number) {
    super(`MPI rank ${rank}${step !== undefined ? `, step ${step}` : ""}: ${operation} ${reason}`);
    this.rank = rank;
    this.operation = operation;
    this.step = step;
  }
}

/** When to give up waiting for a collective. */
export interface WaitOptions {
  /** `performance.now()` milliseconds after which the wait throws a {@link TransportError}. */
  readonly deadline?: number;
  /**
   * `performance.now()` milliseconds from which `deadline` counts (a step's start), so that the error
   * names the time the collective had; default the wait's own start, which may come later.
   */
  readonly since?: number;
  /** The training step, named in errors. */
  readonly step?: number;
  /**
   * Whether other work in this process needs the CPU meanwhile (a device computing), asked again at
   * every poll when a function: while it does, the wait polls at full speed for
   * {@link MpiTransportOptions.spinMs} only. Otherwise (default) it does so for as long as the
   * transfer should take at 1 GB/s on top, since every sleep between polls delays the next step of a
   * large collective by a millisecond or more. A function lets a wait that began beside a computing
   * device poll at full speed once the device is done.
   */
  readonly shareCpu?: boolean | (() => boolean);
  /**
   * Poll at full speed until the operation completes (or the deadline passes), never sleeping:
   * for a collective that this rank's devices wait on with nothing else to do (a hybrid schedule's
   * activations), where a 1 ms sleep between polls also stalls Open MPI's progress through a
   * multi-round collective.
   */
  readonly spin?: boolean;
}

/** Bytes per millisecond a wait that does not share the CPU expects to move while polling at full speed. */
const SPIN_BYTES_PER_MS = 1e6;

/**
 * What a request needs of the transport that posted it (`MpiTransport` in `transport.ts`, which
 * this file does not import): the library and rank, the polling policy, and where to say what it
 * waits on and that it failed.
 *
 * @internal
 */
export interface RequestTransport {
  /** The bound library, for `MPI_Test`. */
  readonly library: MpiLibrary;
  /** This process's rank, named in errors. */
  readonly rank: number;
  /** See {@link MpiTransportOptions.spinMs}. */
  readonly spinMs: number;
  /**
   * Gives this core to a thread that moves the bytes while this one polls (Open MPI's TCP progress
   * thread), between full-speed polls; absent where `MPI_Test` moves them itself.
   */
  readonly yieldCore?: () => void;
  /** What this rank is waiting on now, for the termination message. */
  activity: string | undefined;
  /** Throws an `MpiError` for a non-zero return `code` of `call`. */
  check(call: string, code: number): void;
  /** Marks the transport unusable after `error` (a timed-out collective). */
  poison(error: TransportError): void;
}

/**
 * One posted non-blocking MPI operation. Await {@link MpiRequest.wait} before touching its buffers:
 * MPI reads and writes them until it completes.
 *
 * @example
 * ```ts ignore
 * import { MpiTransport } from "./transport.ts";
 * const mpi = MpiTransport.init();
 * const data = new Float32Array(1024).fill(mpi.rank);
 * await mpi.broadcast(data, 0, "parameters").wait({ deadline: performance.now() + 10_000 });
 * ```
 */
export class MpiRequest {
  /** What was posted, for messages, e.g. `reduce fc (MPI_Igather)`. */
  readonly operation: string;
  readonly #transport: RequestTransport;
  // MPI_Request is a pointer; the slot lives in shared memory, which never moves.
  readonly #slot = new BigUint64Array(new SharedArrayBuffer(8));
  readonly #flag = new Int32Array(1);
  /** Buffers MPI uses until completion: kept reachable so the garbage collector leaves them alone. */
  #buffers: unknown[];
  /** Bytes of those buffers, to size the full-speed polling. */
  readonly #bytes: number;
  #done = false;

  /** @internal Posted by {@link MpiTransport}; `post` starts the operation with the request slot. */
  constructor(
    transport: RequestTransport,
    operation: string,
    call: string,
    buffers: unknown[],
    post: (slot: BigUint64Array) => number,
  ) {
    this.#transport = transport;
    this.operation = `${operation} (${call})`;
    // V8 keeps small typed arrays inside its heap, where the garbage collector may move them while
    // MPI still holds their address; asking for `.buffer` moves the data to a fixed backing store.
    for (const buffer of buffers) void (buffer as ArrayBufferView | undefined)?.buffer;
    this.#buffers = buffers;
    this.#bytes = buffers.reduce<number>(
      (sum, b) => sum + ((b as ArrayBufferView | undefined)?.byteLength ?? 0),
      0,
    );
    transport.check(call, post(this.#slot));
  }

  /** Whether it completed (one `MPI_Test`). */
  test(): boolean {
    if (this.#done) return true;
    this.#transport.check("MPI_Test", this.#transport.library.symbols.MPI_Test(this.#slot, this.#flag, null));
    if (this.#flag[0]) {
      this.#done = true;
      this.#buffers = [];
    }
    return this.#done;
  }

  /**
   * Resolves once the operation completed, testing it between yields to the event loop. Throws a
   * {@link TransportError} when `deadline` passes first; the transport is then unusable (MPI may
   * still write into the buffers, which stay referenced for that reason).
   */
  async wait(options: WaitOptions = {}): Promise<void> {
    const transport = this.#transport;
    const started = performance.now();
    const { shareCpu } = options;
    const sharing = typeof shareCpu === "function" ? shareCpu : () => shareCpu ?? false;
    const alone = options.spin ? Infinity : transport.spinMs + this.#bytes / SPIN_BYTES_PER_MS;
    const previous = transport.activity;
    transport.activity = `waiting on ${this.operation}${
      options.step !== undefined ? ` in step ${options.step}` : ""
    }`;
    // A message to oneself is the quickest turn of the event loop that still lets every other
    // task (Worker messages, Atomics.waitAsync) run; timers would add a millisecond or more.
    let channel: MessageChannel | undefined;
    try {
      for (;;) {
        if (this.test()) return;
        const now = performance.now();
        if (options.deadline !== undefined && now > options.deadline) {
          const error = new TransportError(
            transport.rank,
            this.operation,
            `did not complete within ${
              ((now - (options.since ?? started)) / 1000).toFixed(1)
            } s: another rank stopped taking part (it died, hangs, or runs a different schedule)`,
            options.step,
          );
          transport.poison(error);
          throw error;
        }
        if (now - started < (sharing() ? transport.spinMs : alone)) {
          // With a progress thread, the bytes move only when it runs, and a poll that never leaves
          // the core holds it off for a scheduler slice: see `tcp.ts`.
          transport.yieldCore?.();
          channel ??= new MessageChannel();
          const port = channel.port1;
          await new Promise((resolve) => {
            port.onmessage = resolve;
            channel!.port2.postMessage(0);
          });
        } else await new Promise((resolve) => setTimeout(resolve, 1));
      }
    } finally {
      transport.activity = previous;
      // An open port would keep the process alive.
      channel?.port1.close();
      channel?.port2.close();
    }
  }
}
