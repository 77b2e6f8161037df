/**
 * The machine's CPU time from Linux's `/proc/stat`, which every network namespace reads alike: what
 * a transfer costs the cores beside it (its copies, TCP, and on one machine's emulated hosts the
 * software switch run on the cores the hosts compute on), for the link probe that `auto` prices with
 * (`link_probe.ts`) and for `bench:cluster`.
 *
 * @module
 */

/** CPU seconds the machine has spent since boot, summed over its cores. */
export interface CpuTimes {
  /** Every core's time not idle, waiting for I/O or stolen by a hypervisor. */
  readonly busy: number;
  /** The kernel's part of `busy`: system calls, interrupts and softirqs (the network stack's work). */
  readonly kernel: number;
  /** The cores `/proc/stat` lists. */
  readonly cores: number;
}

/**
 * `/proc/stat` counts in USER_HZ ticks, 100 per second on every Linux architecture that Deno runs on
 * (`sysconf(_SC_CLK_TCK)`; the kernel's tick rate does not change it).
 */
const TICKS_PER_SECOND = 100;

/**
 * The machine's CPU times in the text of `/proc/stat`; throws on text without its `cpu` line.
 *
 * @example
 * ```ts
 * import { parseProcStat } from "./cpu_use.ts";
 * parseProcStat("cpu  100 0 50 900 0 0 25 0 0 0\ncpu0 100 0 50 900 0 0 25 0 0 0\n");
 * // { busy: 1.75, kernel: 0.75, cores: 1 }
 * ```
 */
export function parseProcStat(text: string): CpuTimes {
  const lines = text.split("\n");
  const total = lines.find((line) => /^cpu\s/.test(line));
  if (!total) throw new Error("/proc/stat: no cpu line");
  // user nice system idle iowait irq softirq steal guest guest_nice (guest time is inside user).
  const [user, nice, system, _idle, _iowait, irq, softirq] = total.trim().split(/\s+/).slice(1).map(Number);
  const kernel = system + irq + softirq;
  return {
    busy: (user + nice + kernel) / TICKS_PER_SECOND,
    kernel: kernel / TICKS_PER_SECOND,
    cores: lines.filter((line) => /^cpu\d+\s/.test(line)).length,
  };
}

/**
 * The machine's CPU times now, or `undefined` where there is no `/proc/stat` (not Linux).
 *
 * @example
 * ```ts
 * import { readCpuTimes } from "./cpu_use.ts";
 * const times = readCpuTimes();
 * if (times) console.log(`${times.busy} CPU seconds on ${times.cores} cores since boot`);
 * ```
 */
export function readCpuTimes(): CpuTimes | undefined {
  try {
    return parseProcStat(Deno.readTextFileSync("/proc/stat"));
  } catch {
    return undefined;
  }
}
