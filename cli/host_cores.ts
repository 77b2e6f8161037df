/**
 * Which cores each host of `deno task cluster` runs on: a real host has cores of its own, so the
 * hosts emulated on one machine get its cores split evenly ({@link hostCores}), and the cluster's
 * launch runs each host's rank under `taskset` on them.
 *
 * @module
 */

/**
 * The cores this process may run on (`Cpus_allowed_list` of `/proc/self/status`), else 0 … n − 1 for
 * the n that `navigator.hardwareConcurrency` reports.
 *
 * @example
 * ```ts
 * import { allowedCores } from "./host_cores.ts";
 * console.log(allowedCores()); // e.g. [0, 1]
 * ```
 */
export function allowedCores(): number[] {
  try {
    const line = /^Cpus_allowed_list:\s*(\S+)/m.exec(Deno.readTextFileSync("/proc/self/status"));
    if (line) {
      const cores = line[1].split(",").flatMap((part) => {
        const [from, to = from] = part.split("-").map(Number);
        return Array.from({ length: to - from + 1 }, (_, i) => from + i);
      });
      if (cores.length > 0 && cores.every(Number.isInteger)) return cores;
    }
  } catch {
    // Not Linux: every core the runtime reports.
  }
  return Array.from({ length: Math.max(1, navigator.hardwareConcurrency || 1) }, (_, i) => i);
}

/**
 * The cores each of `hosts` hosts runs on: `cores` split evenly, in order, ⌊cores / hosts⌋ each (the
 * rest unused, so the hosts stay alike), or `undefined` where there are fewer cores than hosts and
 * they must share them all. Why: a real host has cores of its own. Left to float over every core,
 * two ranks that wake each other through the link were stacked on one core by Linux's wake-up
 * placement while the other idled (2 cores, 2 hosts, 1 Gbit/s, 66.5 MB exchange: one rank's main
 * thread ran 0.92 s of 4 on core 0 beside the other's 0.76, core 1 idle 75% of the time; rank 0's
 * event loop stalled 10–40 ms once a step, the link idling meanwhile). Pinned, the AlexNet-like step's
 * median ran faster in 50 of 60 alternating launch pairs over 1 and 10 Gbit/s (PyTorch DDP's in 5 of 8),
 * and the 66.5 MB exchange alone reached 92–93% of 1 Gbit/s in 8 of 8 launches (85–92% floating).
 *
 * @example
 * ```ts
 * import { hostCores } from "./host_cores.ts";
 * hostCores(2, [0, 1, 2, 3]); // [[0, 1], [2, 3]]
 * hostCores(3, [0, 1]); // undefined
 * ```
 */
export function hostCores(hosts: number, cores: readonly number[]): number[][] | undefined {
  const each = Math.floor(cores.length / hosts);
  if (each < 1) return undefined;
  return Array.from({ length: hosts }, (_, i) => cores.slice(i * each, (i + 1) * each));
}

/**
 * Cores as a `taskset -c` list: runs of consecutive cores as ranges.
 *
 * @example
 * ```ts
 * import { coreList } from "./host_cores.ts";
 * coreList([0, 1, 2, 5]); // "0-2,5"
 * ```
 */
export function coreList(cores: readonly number[]): string {
  const runs: string[] = [];
  for (let i = 0; i < cores.length;) {
    let j = i;
    while (j + 1 < cores.length && cores[j + 1] === cores[j] + 1) j++;
    runs.push(j === i ? `${cores[i]}` : `${cores[i]}-${cores[j]}`);
    i = j + 1;
  }
  return runs.join(",");
}
