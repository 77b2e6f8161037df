/**
 * Communication before compute on a busy CPU: a device thread lowers its own scheduling priority
 * so that the runtime's thread, which averages, updates and moves gradients while the next group's
 * backward runs, gets a core the moment it wakes instead of a time slice later. NCCL gets the same
 * from high-priority CUDA streams.
 *
 * It matters where ranks share cores with their compute (every rank's device thread busy, as two
 * hosts on one 2-core machine are): the exchange's thread wakes once per chunk, and each wake-up
 * waited behind a computing thread for up to a scheduler slice.
 *
 * On Linux the nice value is a per-thread attribute (`setpriority(PRIO_PROCESS, 0, …)` sets the
 * calling thread's), inherited by the threads it starts later (the CPU backend's kernel threads).
 * Raising one's own nice value needs no privilege. Elsewhere, or without FFI permission, nothing
 * changes.
 *
 * @module
 */

/**
 * The nice value device threads take by default: 10, a weight of 110 against the runtime thread's
 * 1024 (nice 0), so a computing thread keeps about a tenth of a core the runtime thread wants.
 *
 * @example
 * ```ts
 * import { COMPUTE_NICE } from "./thread_priority.ts";
 * console.log(COMPUTE_NICE); // 10
 * ```
 */
export const COMPUTE_NICE = 10;

/**
 * Sets the calling thread's nice value to `nice` (Linux only; 0 to 19, higher yields more) and
 * says whether it did: `false` on another OS, without FFI permission (never prompted for), or
 * where libc refuses.
 *
 * @example
 * ```ts
 * import { COMPUTE_NICE, lowerThreadPriority } from "./thread_priority.ts";
 * // In a device's compute thread, before it starts kernel threads:
 * lowerThreadPriority(COMPUTE_NICE);
 * ```
 */
export function lowerThreadPriority(nice: number): boolean {
  if (!Number.isInteger(nice) || nice < 0 || nice > 19) {
    throw new RangeError(`lowerThreadPriority: nice must be an integer in [0, 19], got ${nice}`);
  }
  const deno = (globalThis as { Deno?: typeof Deno }).Deno;
  if (deno?.build.os !== "linux") return false;
  if (deno.permissions.querySync({ name: "ffi" }).state !== "granted") return false;
  try {
    const libc = deno.dlopen(
      "libc.so.6",
      {
        setpriority: { parameters: ["i32", "u32", "i32"], result: "i32" },
      } as const,
    );
    try {
      // PRIO_PROCESS (0) with who = 0: on Linux, the calling thread alone.
      return libc.symbols.setpriority(0, 0, nice) === 0;
    } finally {
      libc.close();
    }
  } catch {
    return false;
  }
}

/**
 * The nice value in the text of a Linux `/proc/<pid>/task/<tid>/stat` file: its 19th field,
 * counted after the command name (which may hold spaces, inside parentheses).
 *
 * @example
 * ```ts
 * import { niceOfStat } from "./thread_priority.ts";
 * niceOfStat("12 (deno worker) S 1 12 12 0 -1 0 0 0 0 0 3 1 0 0 30 10 9 0 5"); // 10
 * ```
 */
export function niceOfStat(stat: string): number {
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
}

/**
 * The calling thread's nice value (Linux, from `/proc/thread-self/stat`), or `undefined` where it
 * cannot be read: how tests and reports see what {@link lowerThreadPriority} did.
 *
 * @example
 * ```ts
 * import { threadNice } from "./thread_priority.ts";
 * console.log(threadNice()); // 0 in a thread that never lowered itself
 * ```
 */
export function threadNice(): number | undefined {
  const deno = (globalThis as { Deno?: typeof Deno }).Deno;
  if (deno?.build.os !== "linux") return undefined;
  try {
    if (deno.permissions.querySync({ name: "read", path: "/proc/thread-self/stat" }).state !== "granted") {
      return undefined;
    }
    return niceOfStat(deno.readTextFileSync("/proc/thread-self/stat"));
  } catch {
    return undefined;
  }
}
