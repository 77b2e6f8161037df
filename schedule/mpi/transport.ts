/**
 * The MPI transport: `MPI_COMM_WORLD` seen from Deno's main thread, with non-blocking collectives
 * that are driven by polling, so the event loop — and with it the device Worker's "gradients
 * ready" signals — keeps running while data moves between processes.
 *
 * Every MPI call happens on the main thread (MPI is initialised `MPI_THREAD_FUNNELED`); a
 * collective is posted (`MPI_Igather`, `MPI_Iallgather`, `MPI_Ibcast`, …) and returns an
 * {@link MpiRequest} (`request.ts`), which tests it with `MPI_Test` between yields to the event
 * loop. The Open MPI TCP settings asked for before `MPI_Init` are in `tcp.ts`.
 *
 * Failure never hangs a job: the communicator returns error codes (`MPI_ERRORS_RETURN`) that are
 * thrown as {@link MpiError}s naming the call and rank; a collective that does not complete by its
 * deadline throws a {@link TransportError} naming the rank, the step and what it waited for; and
 * when mpirun tears the job down because another rank died (it sends SIGTERM), this rank prints one
 * line saying what it was doing before it exits.
 *
 * @module
 */

import { MPI_THREAD_FUNNELED, MpiError, MpiLibrary } from "./library.ts";
import { MpiRequest, TransportError, type WaitOptions } from "./request.ts";
import { TCP_PROGRESS_THREAD, tuneTcpTransport } from "./tcp.ts";

/** Options of {@link MpiTransport.gather}. */
export interface GatherOptions {
  /**
   * On the root: `MPI_IN_PLACE`, so the root sends nothing and its own block of `receive` is left
   * as it is (it fills or ignores that block itself), and its `send` buffer is not read — so the
   * root may post the gather before its own data exists. Other ranks ignore it.
   */
  readonly inPlace?: boolean;
}

/** Options of {@link MpiTransport.init}. */
export interface MpiTransportOptions {
  /** Path of `libmpi` (default: see `MpiLibrary.open`). */
  readonly library?: string;
  /**
   * Milliseconds a wait polls at full speed (yielding to the event loop between tests) before it
   * falls back to 1 ms sleeps (default 2; more for large transfers, see {@link WaitOptions.shareCpu}):
   * short collectives finish without sleep latency, long waits for a slower rank cost no core.
   */
  readonly spinMs?: number;
  /**
   * Print one line and exit when mpirun sends SIGTERM (it does when another rank died or the job is
   * interrupted), instead of dying silently (default true).
   */
  readonly reportTermination?: boolean;
}

/**
 * What a collective moves: `MPI_FLOAT`, `MPI_DOUBLE`, `MPI_INT` or `MPI_BYTE` elements. MPI reads and
 * writes it until the request completes; the transport keeps it reachable and in place meanwhile.
 *
 * @example
 * ```ts
 * import type { MpiBuffer } from "./transport.ts";
 * const gradients: MpiBuffer = new Float32Array(new SharedArrayBuffer(4 * 1024));
 * ```
 */
export type MpiBuffer = Float32Array | Float64Array | Int32Array | Uint8Array;

let initialised: MpiTransport | undefined;

/**
 * `MPI_COMM_WORLD` for this process. {@link MpiTransport.init} starts MPI once per process; every
 * later call returns the same transport.
 *
 * @example
 * ```ts ignore
 * // Run as: mpirun -np 2 deno run -A script.ts
 * import { MpiTransport } from "./transport.ts";
 * const mpi = MpiTransport.init();
 * const all = await mpi.allgatherJson({ rank: mpi.rank, host: Deno.hostname() });
 * if (mpi.rank === 0) console.log(all);
 * mpi.finalize();
 * ```
 */
export class MpiTransport {
  /**
   * The bound library.
   *
   * @internal The FFI symbol tables behind the transport; not part of the public API.
   */
  readonly library: MpiLibrary;
  /** This process's rank. */
  readonly rank: number;
  /** Number of ranks. */
  readonly size: number;
  /** See {@link MpiTransportOptions.spinMs}. */
  readonly spinMs: number;
  /**
   * Yields this core between full-speed polls where Open MPI's TCP progress thread is on (see
   * `RequestTransport.yieldCore` in `request.ts`); `undefined` where it is off.
   */
  readonly yieldCore: (() => void) | undefined;
  /** What this rank is waiting on now, for the termination message. */
  activity: string | undefined;
  #failure: TransportError | undefined;
  #finalized = false;
  readonly #onTerminate: (() => void) | undefined;

  private constructor(library: MpiLibrary, rank: number, size: number, options: MpiTransportOptions) {
    this.library = library;
    this.rank = rank;
    this.size = size;
    this.spinMs = options.spinMs ?? 2;
    this.yieldCore = Deno.env.get(TCP_PROGRESS_THREAD) === "1" ? library.yieldCore : undefined;
    if (options.reportTermination ?? true) {
      this.#onTerminate = () => {
        const doing = this.activity ? ` while ${this.activity}` : "";
        console.error(
          `tandem: MPI rank ${rank} stopped by mpirun${doing}: another rank failed or the job was interrupted (mpirun's report names the first rank that failed)`,
        );
        Deno.exit(143);
      };
      Deno.addSignalListener("SIGTERM", this.#onTerminate);
    }
  }

  /**
   * Starts MPI (`MPI_Init_thread` with `MPI_THREAD_FUNNELED`), makes `MPI_COMM_WORLD` return error
   * codes, and learns the rank and size. Later calls return the same transport.
   */
  static init(options: MpiTransportOptions = {}): MpiTransport {
    if (initialised) return initialised;
    const library = MpiLibrary.open(options.library);
    const { symbols, handles } = library;
    const check = (call: string, code: number, rank = -1) => {
      if (code !== 0) throw new MpiError(call, rank, code, library.errorString(code));
    };
    const flag = new Int32Array(1);
    check("MPI_Finalized", symbols.MPI_Finalized(flag));
    if (flag[0]) throw new MpiError("MPI_Init_thread", -1, 0, "MPI was already finalized in this process");
    check("MPI_Initialized", symbols.MPI_Initialized(flag));
    if (!flag[0]) {
      tuneTcpTransport();
      const provided = new Int32Array(1);
      check("MPI_Init_thread", symbols.MPI_Init_thread(null, null, MPI_THREAD_FUNNELED, provided));
      if (provided[0] < MPI_THREAD_FUNNELED) {
        throw new MpiError(
          "MPI_Init_thread",
          -1,
          0,
          `the library provides thread level ${provided[0]}, below MPI_THREAD_FUNNELED`,
        );
      }
    }
    check(
      "MPI_Comm_set_errhandler",
      symbols.MPI_Comm_set_errhandler(handles.commWorld, handles.errorsReturn),
    );
    const rank = new Int32Array(1), size = new Int32Array(1);
    check("MPI_Comm_rank", symbols.MPI_Comm_rank(handles.commWorld, rank));
    check("MPI_Comm_size", symbols.MPI_Comm_size(handles.commWorld, size), rank[0]);
    initialised = new MpiTransport(library, rank[0], size[0], options);
    return initialised;
  }

  /**
   * The transport {@link MpiTransport.init} started in this process, until it is finalized;
   * `undefined` otherwise. Error handlers use it to end the whole job rather than one rank.
   */
  static get current(): MpiTransport | undefined {
    return initialised && !initialised.finalized ? initialised : undefined;
  }

  /** @internal Throws an {@link MpiError} for a non-zero return `code` of `call`. */
  check(call: string, code: number): void {
    if (code !== 0) throw new MpiError(call, this.rank, code, this.library.errorString(code));
  }

  /** @internal Marks the transport unusable after `error` (a timed-out collective). */
  poison(error: TransportError): void {
    this.#failure ??= error;
  }

  #post(
    operation: string,
    call: string,
    buffers: unknown[],
    post: (slot: BigUint64Array) => number,
  ): MpiRequest {
    this.#checkUsable(operation);
    return new MpiRequest(this, operation, call, buffers, post);
  }

  #checkUsable(operation: string): void {
    if (this.#finalized) throw new TransportError(this.rank, operation, "cannot run: MPI was finalized");
    if (this.#failure) {
      throw new TransportError(
        this.rank,
        operation,
        `cannot run: an earlier collective failed (${this.#failure.message})`,
      );
    }
  }

  #type(buffer: MpiBuffer): Deno.PointerObject {
    const { handles } = this.library;
    if (buffer instanceof Float32Array) return handles.float;
    if (buffer instanceof Float64Array) return handles.double;
    if (buffer instanceof Int32Array) return handles.int;
    return handles.byte;
  }

  #count(operation: string, n: number): number {
    if (n > 0x7fffffff) {
      throw new TransportError(this.rank, operation, `cannot send ${n} elements: MPI counts are 32-bit`);
    }
    return n;
  }

  /**
   * `MPI_Igather`: every rank's `send` lands, in rank order, in `receive` on `root` (`size ×
   * send.length` elements; other ranks pass nothing). See {@link GatherOptions.inPlace}.
   */
  gather(
    send: MpiBuffer,
    receive: MpiBuffer | undefined,
    root: number,
    operation = "gather",
    options: GatherOptions = {},
  ): MpiRequest {
    if (this.rank === root && (!receive || receive.length < send.length * this.size)) {
      throw new TransportError(
        this.rank,
        operation,
        `needs a receive buffer of ${send.length * this.size} elements on the root`,
      );
    }
    const { symbols, handles } = this.library;
    const type = this.#type(send), count = this.#count(operation, send.length);
    if (this.rank === root && options.inPlace) {
      // Open MPI's MPI_IN_PLACE is `(void *) 1`; `send` only gives the count and type.
      const inPlace = Deno.UnsafePointer.create(1n);
      return this.#post(
        operation,
        "MPI_Igather",
        [receive],
        (slot) =>
          symbols.MPI_Igather_in_place(
            inPlace,
            count,
            type,
            receive!,
            count,
            type,
            root,
            handles.commWorld,
            slot,
          ),
      );
    }
    const target = this.rank === root ? receive! : null;
    return this.#post(
      operation,
      "MPI_Igather",
      [send, receive],
      (slot) => symbols.MPI_Igather(send, count, type, target, count, type, root, handles.commWorld, slot),
    );
  }

  /** `MPI_Iallgather`: every rank's `send` lands, in rank order, in every rank's `receive`. */
  allgather(send: MpiBuffer, receive: MpiBuffer, operation = "allgather"): MpiRequest {
    if (receive.length < send.length * this.size) {
      throw new TransportError(
        this.rank,
        operation,
        `needs a receive buffer of ${send.length * this.size} elements`,
      );
    }
    const { symbols, handles } = this.library;
    const type = this.#type(send), count = this.#count(operation, send.length);
    return this.#post(
      operation,
      "MPI_Iallgather",
      [send, receive],
      (slot) => symbols.MPI_Iallgather(send, count, type, receive, count, type, handles.commWorld, slot),
    );
  }

  /**
   * `MPI_Ialltoall`: `send` holds one block per rank in rank order; block r goes to rank r, and
   * `receive` gets every rank's block for this rank, in rank order (blocks of `send.length / size`).
   */
  alltoall(send: MpiBuffer, receive: MpiBuffer, operation = "alltoall"): MpiRequest {
    if (send.length % this.size !== 0 || receive.length < send.length) {
      throw new TransportError(
        this.rank,
        operation,
        `needs ${this.size} equal blocks to send (${send.length} elements) and room for as many to receive (${receive.length})`,
      );
    }
    const { symbols, handles } = this.library;
    const type = this.#type(send), count = this.#count(operation, send.length / this.size);
    return this.#post(
      operation,
      "MPI_Ialltoall",
      [send, receive],
      (slot) => symbols.MPI_Ialltoall(send, count, type, receive, count, type, handles.commWorld, slot),
    );
  }

  /** `MPI_Ibcast`: `root`'s `buffer` is copied into every other rank's `buffer`. */
  broadcast(buffer: MpiBuffer, root: number, operation = "broadcast"): MpiRequest {
    const { symbols, handles } = this.library;
    const count = this.#count(operation, buffer.length);
    return this.#post(
      operation,
      "MPI_Ibcast",
      [buffer],
      (slot) => symbols.MPI_Ibcast(buffer, count, this.#type(buffer), root, handles.commWorld, slot),
    );
  }

  /**
   * `MPI_Iallreduce` with `MPI_SUM`: MPI's own reduction. Its summation order is the library's
   * choice, so results are reproducible bit for bit only for 2 ranks (IEEE addition commutes); the
   * trainer averages in rank order instead and uses this for comparison.
   */
  allreduceSum(send: Float32Array, receive: Float32Array, operation = "allreduce"): MpiRequest {
    const { symbols, handles } = this.library;
    const count = this.#count(operation, send.length);
    return this.#post(
      operation,
      "MPI_Iallreduce",
      [send, receive],
      (slot) =>
        symbols.MPI_Iallreduce(send, receive, count, handles.float, handles.sum, handles.commWorld, slot),
    );
  }

  /**
   * Blocking `MPI_Allreduce` with `MPI_SUM`, the raw library figure for bandwidth comparisons. It
   * blocks the event loop and has no deadline: not for training.
   */
  allreduceSumBlocking(send: Float32Array, receive: Float32Array): void {
    const { symbols, handles } = this.library;
    this.#checkUsable("allreduce");
    this.check(
      "MPI_Allreduce",
      symbols.MPI_Allreduce(
        send,
        receive,
        this.#count("allreduce", send.length),
        handles.float,
        handles.sum,
        handles.commWorld,
      ),
    );
  }

  /** `MPI_Ibarrier`. */
  barrier(operation = "barrier"): MpiRequest {
    const { symbols, handles } = this.library;
    return this.#post(operation, "MPI_Ibarrier", [], (slot) => symbols.MPI_Ibarrier(handles.commWorld, slot));
  }

  /**
   * Shares every rank's byte count and copies `bytes` into a buffer as long as the longest: padding
   * keeps the exchange one fixed-size collective (the payloads here are small).
   */
  async #padToLongest(
    bytes: Uint8Array,
    options: WaitOptions,
    operation: string,
  ): Promise<{ lengths: Int32Array; longest: number; padded: Uint8Array }> {
    const lengths = new Int32Array(new SharedArrayBuffer(4 * this.size));
    const length = new Int32Array(new SharedArrayBuffer(4));
    length[0] = bytes.length;
    await this.allgather(length, lengths, `${operation} (lengths)`).wait(options);
    const longest = Math.max(...lengths);
    const padded = new Uint8Array(new SharedArrayBuffer(longest));
    padded.set(bytes);
    return { lengths, longest, padded };
  }

  /** Every rank's `bytes` (any length), in rank order, on every rank. */
  async allgatherBytes(
    bytes: Uint8Array,
    options: WaitOptions = {},
    operation = "allgather",
  ): Promise<Uint8Array[]> {
    const { lengths, longest, padded } = await this.#padToLongest(bytes, options, operation);
    const all = new Uint8Array(new SharedArrayBuffer(longest * this.size));
    await this.allgather(padded, all, operation).wait(options);
    return Array.from(lengths, (n, r) => all.slice(r * longest, r * longest + n));
  }

  /** Every rank's `bytes` (any length), in rank order, on `root`; `undefined` on the other ranks. */
  async gatherBytes(
    bytes: Uint8Array,
    root: number,
    options: WaitOptions = {},
    operation = "gather",
  ): Promise<Uint8Array[] | undefined> {
    const { lengths, longest, padded } = await this.#padToLongest(bytes, options, operation);
    const all = this.rank === root ? new Uint8Array(new SharedArrayBuffer(longest * this.size)) : undefined;
    await this.gather(padded, all, root, operation).wait(options);
    return all && Array.from(lengths, (n, r) => all.slice(r * longest, r * longest + n));
  }

  /** Every rank's `value` (JSON), in rank order, on every rank. */
  async allgatherJson<T>(value: T, options: WaitOptions = {}, operation = "allgather"): Promise<T[]> {
    const parts = await this.allgatherBytes(
      new TextEncoder().encode(JSON.stringify(value)),
      options,
      operation,
    );
    return parts.map((p) => JSON.parse(new TextDecoder().decode(p)) as T);
  }

  /** `root`'s `bytes` on every rank (other ranks' arguments are ignored). */
  async broadcastBytes(
    bytes: Uint8Array | undefined,
    root: number,
    options: WaitOptions = {},
    operation = "broadcast",
  ): Promise<Uint8Array> {
    const length = new Int32Array(new SharedArrayBuffer(4));
    if (this.rank === root) length[0] = bytes?.length ?? 0;
    await this.broadcast(length, root, `${operation} (length)`).wait(options);
    const data = new Uint8Array(new SharedArrayBuffer(length[0]));
    if (this.rank === root && bytes) data.set(bytes);
    await this.broadcast(data, root, operation).wait(options);
    return data.slice();
  }

  /** `root`'s `value` (JSON) on every rank. */
  async broadcastJson<T>(
    value: T,
    root: number,
    options: WaitOptions = {},
    operation = "broadcast",
  ): Promise<T> {
    const bytes = this.rank === root ? new TextEncoder().encode(JSON.stringify(value)) : undefined;
    return JSON.parse(
      new TextDecoder().decode(await this.broadcastBytes(bytes, root, options, operation)),
    ) as T;
  }

  /**
   * Ends the job without waiting for anyone: `MPI_Abort` on `MPI_COMM_WORLD`, which makes mpirun stop
   * every rank and exit with `code`. Print what went wrong first.
   */
  abort(code: number): never {
    if (this.#onTerminate) Deno.removeSignalListener("SIGTERM", this.#onTerminate);
    this.library.symbols.MPI_Abort(this.library.handles.commWorld, code);
    Deno.exit(code); // not reached: MPI_Abort does not return
  }

  /** `MPI_Finalize`: call once, on every rank, after the last collective. */
  finalize(): void {
    if (this.#finalized) return;
    this.#finalized = true;
    if (this.#onTerminate) Deno.removeSignalListener("SIGTERM", this.#onTerminate);
    this.check("MPI_Finalize", this.library.symbols.MPI_Finalize());
  }

  /** Whether {@link MpiTransport.finalize} ran. */
  get finalized(): boolean {
    return this.#finalized;
  }
}
