/**
 * Open MPI's C library, bound with Deno's FFI: the handful of calls the MPI transport needs, the
 * predefined handles they take, and an error class that names the failed call and the rank.
 *
 * Open MPI's predefined handles (`MPI_COMM_WORLD`, `MPI_FLOAT`, `MPI_SUM`, …) are not constants:
 * they are the *addresses* of exported data symbols (`ompi_mpi_comm_world`, `ompi_mpi_float`,
 * `ompi_mpi_op_sum`, …). Deno's `statics` would read the value stored at a symbol, so the addresses
 * come from libc's `dlsym` instead. The library is first opened with libc's `dlopen` and
 * `RTLD_GLOBAL`, because Open MPI loads its components as plugins that resolve symbols of libmpi
 * and would fail against a library opened locally.
 *
 * Nothing here runs at import time, so importing the module costs nothing where MPI is absent (or in
 * a browser bundle); {@link MpiLibrary.open} loads it on first use.
 *
 * @module
 */

import { TandemError } from "../../engine/mod.ts";

/**
 * An MPI call returned an error code, or the library could not be loaded. Names the call and the
 * rank (-1 before the rank is known) and carries MPI's own description of the code.
 *
 * @example
 * ```ts
 * import { MpiError } from "./library.ts";
 * const e = new MpiError("MPI_Igather", 1, 15, "MPI_ERR_TRUNCATE: message truncated");
 * console.log(e.message); // MPI rank 1: MPI_Igather failed (error 15): MPI_ERR_TRUNCATE: message truncated
 * ```
 */
export class MpiError extends TandemError {
  /** The MPI function that failed, e.g. `MPI_Iallgather`, or `dlopen` when loading failed. */
  readonly call: string;
  /** The rank that saw the failure; -1 when it is not known yet. */
  readonly rank: number;
  /** MPI's error code (0 for a failure outside an MPI call). */
  readonly code: number;

  /** A failure of `call` on `rank` with MPI error `code`, described by `description`. */
  constructor(call: string, rank: number, code: number, description: string) {
    super(
      `MPI${rank >= 0 ? ` rank ${rank}` : ""}: ${call} failed${
        code ? ` (error ${code})` : ""
      }: ${description}`,
    );
    this.call = call;
    this.rank = rank;
    this.code = code;
  }
}

/**
 * Where {@link MpiLibrary.open} looks for Open MPI, in order, unless `TANDEM_MPI_LIBRARY` names a
 * file: the soname, the development symlink, and Debian/Ubuntu's multiarch path.
 *
 * @example
 * ```ts
 * import { MPI_LIBRARY_CANDIDATES } from "./library.ts";
 * console.log(MPI_LIBRARY_CANDIDATES[0]); // libmpi.so.40
 * ```
 */
export const MPI_LIBRARY_CANDIDATES: readonly string[] = [
  "libmpi.so.40",
  "libmpi.so",
  "/usr/lib/x86_64-linux-gnu/libmpi.so.40",
  "/usr/lib/aarch64-linux-gnu/libmpi.so.40",
  "/usr/lib64/openmpi/lib/libmpi.so.40",
];

/** MPI_THREAD_FUNNELED: only the thread that initialised MPI calls it (Deno's main thread). */
export const MPI_THREAD_FUNNELED = 1;

/** Open MPI's `MPI_MAX_ERROR_STRING`. */
const MAX_ERROR_STRING = 256;

const RTLD_NOW = 0x2, RTLD_GLOBAL = 0x100;

/**
 * The C functions bound, with their FFI signatures: MPI handles are pointers, buffers are typed
 * arrays, every function returns an MPI error code.
 *
 * @example
 * ```ts
 * import { MPI_FUNCTIONS } from "./library.ts";
 * console.log(Object.keys(MPI_FUNCTIONS).includes("MPI_Iallgather")); // true
 * ```
 */
export const MPI_FUNCTIONS = {
  MPI_Initialized: { parameters: ["buffer"], result: "i32" },
  MPI_Finalized: { parameters: ["buffer"], result: "i32" },
  MPI_Init_thread: { parameters: ["pointer", "pointer", "i32", "buffer"], result: "i32" },
  MPI_Comm_rank: { parameters: ["pointer", "buffer"], result: "i32" },
  MPI_Comm_size: { parameters: ["pointer", "buffer"], result: "i32" },
  MPI_Comm_set_errhandler: { parameters: ["pointer", "pointer"], result: "i32" },
  MPI_Error_string: { parameters: ["i32", "buffer", "buffer"], result: "i32" },
  // (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm, request)
  MPI_Igather: {
    parameters: ["buffer", "i32", "pointer", "buffer", "i32", "pointer", "i32", "pointer", "buffer"],
    result: "i32",
  },
  // The same at the root with MPI_IN_PLACE (a pointer that is no buffer) as sendbuf.
  MPI_Igather_in_place: {
    name: "MPI_Igather",
    parameters: ["pointer", "i32", "pointer", "buffer", "i32", "pointer", "i32", "pointer", "buffer"],
    result: "i32",
  },
  // (sendbuf, sendcount, sendtype, recvbuf, recvcounts[], displs[], recvtype, root, comm, request)
  MPI_Igatherv: {
    parameters: [
      "buffer",
      "i32",
      "pointer",
      "buffer",
      "buffer",
      "buffer",
      "pointer",
      "i32",
      "pointer",
      "buffer",
    ],
    result: "i32",
  },
  // (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request)
  MPI_Iallgather: {
    parameters: ["buffer", "i32", "pointer", "buffer", "i32", "pointer", "pointer", "buffer"],
    result: "i32",
  },
  // (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request)
  MPI_Ialltoall: {
    parameters: ["buffer", "i32", "pointer", "buffer", "i32", "pointer", "pointer", "buffer"],
    result: "i32",
  },
  // (buffer, count, datatype, root, comm, request)
  MPI_Ibcast: { parameters: ["buffer", "i32", "pointer", "i32", "pointer", "buffer"], result: "i32" },
  // (sendbuf, recvbuf, count, datatype, op, comm, request)
  MPI_Iallreduce: {
    parameters: ["buffer", "buffer", "i32", "pointer", "pointer", "pointer", "buffer"],
    result: "i32",
  },
  // (sendbuf, recvbuf, count, datatype, op, comm): blocking, for the raw bandwidth figure only.
  MPI_Allreduce: { parameters: ["buffer", "buffer", "i32", "pointer", "pointer", "pointer"], result: "i32" },
  MPI_Ibarrier: { parameters: ["pointer", "buffer"], result: "i32" },
  MPI_Barrier: { parameters: ["pointer"], result: "i32" },
  // (request, flag, status): MPI_STATUS_IGNORE is NULL in Open MPI.
  MPI_Test: { parameters: ["buffer", "buffer", "pointer"], result: "i32" },
  MPI_Wait: { parameters: ["buffer", "pointer"], result: "i32" },
  MPI_Abort: { parameters: ["pointer", "i32"], result: "i32" },
  MPI_Finalize: { parameters: [], result: "i32" },
} as const satisfies Deno.ForeignLibraryInterface;

/**
 * The raw FFI functions of {@link MpiLibrary}, as Deno types them.
 *
 * @example
 * ```ts
 * import type { MpiSymbols } from "./library.ts";
 * const barrier = (symbols: MpiSymbols, world: Deno.PointerObject) => symbols.MPI_Barrier(world);
 * ```
 */
export type MpiSymbols = Deno.DynamicLibrary<typeof MPI_FUNCTIONS>["symbols"];

/**
 * Open MPI's predefined handles: the addresses of its exported objects.
 *
 * @example
 * ```ts
 * import type { MpiHandles } from "./library.ts";
 * const describe = (h: MpiHandles) => Deno.UnsafePointer.value(h.commWorld).toString(16);
 * ```
 */
export interface MpiHandles {
  /** `MPI_COMM_WORLD` (`&ompi_mpi_comm_world`). */
  readonly commWorld: Deno.PointerObject;
  /** `MPI_FLOAT`. */
  readonly float: Deno.PointerObject;
  /** `MPI_DOUBLE`. */
  readonly double: Deno.PointerObject;
  /** `MPI_INT`. */
  readonly int: Deno.PointerObject;
  /** `MPI_BYTE`. */
  readonly byte: Deno.PointerObject;
  /** `MPI_SUM`. */
  readonly sum: Deno.PointerObject;
  /** `MPI_ERRORS_RETURN`: calls return error codes instead of aborting the job. */
  readonly errorsReturn: Deno.PointerObject;
}

const HANDLE_SYMBOLS: Record<keyof MpiHandles, string> = {
  commWorld: "ompi_mpi_comm_world",
  float: "ompi_mpi_float",
  double: "ompi_mpi_double",
  int: "ompi_mpi_int",
  byte: "ompi_mpi_byte",
  sum: "ompi_mpi_op_sum",
  errorsReturn: "ompi_mpi_errors_return",
};

const encoder = new TextEncoder();
const cString = (text: string) => encoder.encode(`${text}\0`);

let opened: MpiLibrary | undefined;

/**
 * Open MPI's `libmpi`, loaded once per process.
 *
 * @example
 * ```ts ignore
 * import { MpiLibrary } from "./library.ts";
 * const mpi = MpiLibrary.open();
 * console.log(mpi.path); // libmpi.so.40
 * ```
 */
export class MpiLibrary {
  /** The path or soname it was loaded from. */
  readonly path: string;
  /** The bound functions; every one returns an MPI error code, 0 on success. */
  readonly symbols: MpiSymbols;
  /** The predefined handles. */
  readonly handles: MpiHandles;

  /**
   * libc's `sched_yield`: lets another thread that is ready to run on this core go first (Open
   * MPI's TCP progress thread, beside a thread that polls `MPI_Test`). Returns 0.
   */
  readonly yieldCore: () => number;

  private constructor(path: string, symbols: MpiSymbols, handles: MpiHandles, yieldCore: () => number) {
    this.path = path;
    this.symbols = symbols;
    this.handles = handles;
    this.yieldCore = yieldCore;
  }

  /**
   * Loads Open MPI (once; later calls return the same library) from `path`, else
   * `TANDEM_MPI_LIBRARY`, else the first of {@link MPI_LIBRARY_CANDIDATES} that loads. Throws an
   * {@link MpiError} listing what was tried when none does, or when the library is not Open MPI.
   */
  static open(path?: string): MpiLibrary {
    if (opened) return opened;
    const libc = Deno.dlopen("libc.so.6", {
      dlopen: { parameters: ["buffer", "i32"], result: "pointer" },
      dlsym: { parameters: ["pointer", "buffer"], result: "pointer" },
      dlerror: { parameters: [], result: "pointer" },
      sched_yield: { parameters: [], result: "i32" },
    });
    let loaded = false;
    try {
      const fromEnv = Deno.env.get("TANDEM_MPI_LIBRARY");
      const candidates = path ? [path] : fromEnv ? [fromEnv] : MPI_LIBRARY_CANDIDATES;
      const failures: string[] = [];
      for (const candidate of candidates) {
        const handle = libc.symbols.dlopen(cString(candidate), RTLD_NOW | RTLD_GLOBAL);
        if (!handle) {
          const reason = libc.symbols.dlerror();
          failures.push(reason ? new Deno.UnsafePointerView(reason).getCString() : candidate);
          continue;
        }
        const handles = {} as Record<keyof MpiHandles, Deno.PointerObject>;
        for (const [key, symbol] of Object.entries(HANDLE_SYMBOLS) as [keyof MpiHandles, string][]) {
          const address = libc.symbols.dlsym(handle, cString(symbol));
          if (!address) {
            throw new MpiError(
              "dlsym",
              -1,
              0,
              `${candidate} has no symbol ${symbol}: it is not Open MPI (MPICH and others define MPI's handles as constants, which this binding does not read)`,
            );
          }
          handles[key] = address;
        }
        // Same file, now also global: Deno's handle just adds a reference to the loaded library.
        const library = Deno.dlopen(candidate, MPI_FUNCTIONS);
        opened = new MpiLibrary(candidate, library.symbols, handles, () => libc.symbols.sched_yield());
        loaded = true;
        return opened;
      }
      throw new MpiError(
        "dlopen",
        -1,
        0,
        `cannot load Open MPI's libmpi (${
          failures.join("; ")
        }); install it (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev) or point TANDEM_MPI_LIBRARY at libmpi.so`,
      );
    } finally {
      // libmpi stays loaded: dlopen's own reference is never closed. libc stays open with it, for
      // `sched_yield`.
      if (!loaded) libc.close();
    }
  }

  /** MPI's description of error `code`, e.g. `MPI_ERR_TRUNCATE: message truncated`. */
  errorString(code: number): string {
    const text = new Uint8Array(MAX_ERROR_STRING + 1);
    const length = new Int32Array(1);
    if (this.symbols.MPI_Error_string(code, text, length) !== 0) return `unknown MPI error ${code}`;
    return new TextDecoder().decode(text.subarray(0, length[0]));
  }
}
