/**
 * Moving gradients and parameters between devices, with optional link emulation.
 *
 * Shared memory between Workers is nearly free, which hides what a schedule is for. An emulated
 * link makes every transfer take `latency + bytes / bandwidth` of wall time, like a DMA engine: the
 * copy itself happens at once and the remaining time is waited out without using a core, so compute
 * on other threads runs on meanwhile. Every output that used one says so.
 *
 * @module
 */

import { ValueError } from "../../../engine/mod.ts";
import type { ReductionMode } from "../../plan/plan.ts";

/**
 * A point-to-point link: what the simulator prices, the runtime emulates and `--link` names.
 *
 * @example
 * ```ts
 * import type { Link } from "./link.ts";
 * const infiniband: Link = { bandwidthBytesPerSecond: 25e9, latencySeconds: 2e-6, label: "HDR IB" };
 * ```
 */
export interface Link {
  /** Sustained bytes per second in one direction. */
  readonly bandwidthBytesPerSecond: number;
  /** Seconds before the first byte arrives, per message (added to every emulated transfer). */
  readonly latencySeconds: number;
  /** How to name it in output, e.g. `PCIe 3` or `1.2 GB/s (emulated)`. */
  readonly label?: string;
}

/**
 * The links Tandem knows by name: what `--link pcie3` and the others emulate, and what the AlexNet
 * scaling table prices by default. Bandwidths are sustained one-direction figures (PCIe 3 ×16
 * 12 GB/s, PCIe 4 ×16 24 GB/s, NVLink 150 GB/s, 10 GbE 1.2 GB/s, 100 GbE 12 GB/s); latencies are
 * typical per-message figures (PCIe 10 µs, NVLink 5 µs, 10 GbE TCP 50 µs, 100 GbE RDMA 10 µs).
 *
 * @example
 * ```ts
 * import { STANDARD_LINKS } from "./link.ts";
 * console.log(STANDARD_LINKS.map((l) => l.label).join(", ")); // PCIe 3, PCIe 4, NVLink, 10 GbE, 100 GbE
 * ```
 */
export const STANDARD_LINKS: readonly Required<Link>[] = [
  { label: "PCIe 3", bandwidthBytesPerSecond: 12e9, latencySeconds: 10e-6 },
  { label: "PCIe 4", bandwidthBytesPerSecond: 24e9, latencySeconds: 10e-6 },
  { label: "NVLink", bandwidthBytesPerSecond: 150e9, latencySeconds: 5e-6 },
  { label: "10 GbE", bandwidthBytesPerSecond: 1.2e9, latencySeconds: 50e-6 },
  { label: "100 GbE", bandwidthBytesPerSecond: 12e9, latencySeconds: 10e-6 },
];

/** `--link` preset names: the labels lower-cased without spaces (`pcie3`, `10gbe`, …). */
const NAMED_LINKS: Record<string, Required<Link>> = Object.fromEntries(
  STANDARD_LINKS.map((link) => [link.label.toLowerCase().replaceAll(" ", ""), link]),
);

/** What {@link parseLink} accepts, for error messages (and `--help`). */
export const LINK_GRAMMAR: string =
  `a bandwidth NUMBER[k|K|M|G|T]UNIT with UNIT B/s (bytes) or b/s, bit/s (bits), e.g. 12GB/s, 800MB/s, 10Gb/s, ` +
  `optionally ",LATENCY" with s, ms, us, µs or ns (1.2GB/s,50us); or one of ${
    Object.keys(NAMED_LINKS).join(", ")
  }`;

// Strict on purpose: a positive decimal, no sign, no exponent, no range. The unit's case matters
// (B bytes, b bits; M mega, never milli), so "10Gb/s" cannot pass for 10 GB/s.
const NUMBER = String.raw`(\d+(?:\.\d+)?|\.\d+)`;
const BANDWIDTH = new RegExp(String.raw`^${NUMBER} ?([kKMGT]?)(B/s|b/s|bit/s)$`);
const LATENCY = new RegExp(String.raw`^${NUMBER} ?(s|ms|us|µs|ns)$`);
const PREFIX: Record<string, number> = { "": 1, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12 };
const LATENCY_UNIT: Record<string, number> = { s: 1, ms: 1e-3, us: 1e-6, "µs": 1e-6, ns: 1e-9 };

/**
 * Parses a link description: a named link (`pcie3`, `pcie4`, `nvlink`, `10gbe`, `100gbe`, any case)
 * or a bandwidth `NUMBER[prefix]UNIT`: prefix `k`/`K`, `M`, `G`, `T` (powers of 1000); unit `B/s`
 * for bytes or `b/s` / `bit/s` for bits (`10Gb/s` is 1.25 GB/s); one optional space before the
 * prefix. A latency may follow a comma (`1.2GB/s,50us`; units `s`, `ms`, `us`, `µs`, `ns`). Anything
 * else (signs, ranges, exponents, zero, stray characters) throws a `ValueError` naming the text and
 * {@link LINK_GRAMMAR}.
 *
 * @example
 * ```ts
 * import { parseLink } from "./link.ts";
 * parseLink("1.2GB/s"); // { bandwidthBytesPerSecond: 1.2e9, latencySeconds: 0, label: "1.2 GB/s (emulated)" }
 * parseLink("10Gb/s").bandwidthBytesPerSecond; // 1.25e9
 * ```
 */
export function parseLink(text: string): Required<Link> {
  const named = NAMED_LINKS[text.trim().toLowerCase()];
  if (named) {
    const { bandwidthBytesPerSecond: bandwidth, latencySeconds: latency, label } = named;
    return {
      bandwidthBytesPerSecond: bandwidth,
      latencySeconds: latency,
      label: `${label} (emulated, ${bandwidth / 1e9} GB/s, ${latency * 1e6} µs)`,
    };
  }
  const refuse = (why: string): never => {
    throw new ValueError("link", `cannot read ${JSON.stringify(text)}: ${why}; expected ${LINK_GRAMMAR}`);
  };
  const parts = text.trim().split(",").map((part) => part.trim());
  if (parts.length > 2) refuse("more than one comma");
  const bandwidthMatch = BANDWIDTH.exec(parts[0]);
  if (!bandwidthMatch) refuse(`"${parts[0]}" is not a bandwidth`);
  const [, amount, prefix, unit] = bandwidthMatch!;
  const bandwidth = Number(amount) * PREFIX[prefix] / (unit === "B/s" ? 1 : 8);
  if (!(bandwidth > 0) || !Number.isFinite(bandwidth)) refuse("the bandwidth must be positive");
  let latency = 0;
  if (parts.length === 2) {
    const latencyMatch = LATENCY.exec(parts[1]);
    if (!latencyMatch) refuse(`"${parts[1]}" is not a latency`);
    latency = Number(latencyMatch![1]) * LATENCY_UNIT[latencyMatch![2]];
  }
  return {
    bandwidthBytesPerSecond: bandwidth,
    latencySeconds: latency,
    label: `${bandwidth / 1e9} GB/s${latency ? `, ${latency * 1e6} µs` : ""} (emulated)`,
  };
}

/** Start and end of a transfer, in milliseconds of `performance.now()`, and what it carried. */
export interface TransferTiming {
  /** When the copy began. */
  start: number;
  /** When the (emulated) transfer finished. */
  end: number;
  /** The bytes the (emulated) link carried: what a trace should record for the transfer. */
  bytes: number;
}

/**
 * Copies `source` into `target` and, when a link is given, resolves only once the emulated transfer
 * time has passed since the call.
 *
 * @example
 * ```ts
 * import { parseLink, transfer } from "./link.ts";
 * await transfer(new Float32Array(1024), new Float32Array(1024), parseLink("1GB/s"));
 * ```
 */
export async function transfer(
  source: Float32Array,
  target: Float32Array,
  link?: Link,
): Promise<TransferTiming> {
  return await timedMove(source.byteLength, link, () => target.set(source));
}

/**
 * Runs `move` (a copy of `bytes`, however it is made) and, when a link is given, resolves no earlier
 * than the link would have carried those bytes since the call.
 *
 * @example
 * ```ts
 * import { parseLink, timedMove } from "./link.ts";
 * await timedMove(4096, parseLink("1GB/s"), () => {});
 * ```
 */
export async function timedMove(
  bytes: number,
  link: Link | undefined,
  move: () => void | Promise<void>,
): Promise<TransferTiming> {
  const start = performance.now();
  await move();
  if (link) await waitUntil(start + (link.latencySeconds + bytes / link.bandwidthBytesPerSecond) * 1000);
  return { start, end: performance.now(), bytes };
}

/**
 * Waits until a ring all-reduce of `bytes` over `devices` devices started at `start` would have
 * finished on `link`: 2(N−1)/N of the bytes cross each link, in 2(N−1) latency-bound steps. No link
 * (shared memory) or one device: no wait.
 *
 * @example
 * ```ts
 * import { emulateRingAllreduce, parseLink } from "./link.ts";
 * await emulateRingAllreduce(performance.now(), 4096, 2, parseLink("1GB/s"));
 * ```
 */
export async function emulateRingAllreduce(
  start: number,
  bytes: number,
  devices: number,
  link: Link | undefined,
): Promise<void> {
  if (!link || devices < 2) return;
  const seconds = (2 * (devices - 1) / devices) * bytes / link.bandwidthBytesPerSecond +
    2 * (devices - 1) * link.latencySeconds;
  await waitUntil(start + seconds * 1000);
}

/**
 * How much later than its deadline a wait's fallback timer fires where the clock thread runs: far
 * more than the thread's reply takes (0.13–0.34 ms here), so that on a busy machine a reply a few
 * milliseconds late still comes first; the timer only ends waits the thread does not (it failed,
 * or it is still starting: under `deno test` its module is type-checked first, a second or two).
 */
const FALLBACK_LATE_MS = 20;

/** The clock thread (`clock_thread.ts`) and the waits it has yet to end; undefined where none runs. */
type Clock = { post(id: number, at: number): void; waiting: Map<number, () => void> } | undefined;
let clock: Promise<Clock> | undefined;
let nextWait = 0;

function startClock(): Promise<Clock> {
  clock ??= (async () => {
    try {
      // Through a variable, as `CpuDevice` loads it: a browser bundle has no `node:worker_threads`.
      const specifier = "node:worker_threads";
      const { Worker } = await import(specifier) as typeof import("node:worker_threads");
      const worker = new Worker(new URL("./clock_thread.ts", import.meta.url));
      // Never what keeps a process alive: a pending wait's fallback timer does that.
      worker.unref();
      const waiting = new Map<number, () => void>();
      worker.on("message", (id: number) => waiting.get(id)?.());
      worker.on("error", () => {
        clock = Promise.resolve(undefined);
      });
      return { post: (id: number, at: number) => worker.postMessage({ id, at }), waiting };
    } catch {
      return undefined;
    }
  })();
  return clock;
}

/**
 * Waits until `performance.now()` reaches `deadline`, without spinning a core, and says what ended
 * the wait: `"clock"`, the clock thread (`clock_thread.ts`, sleeping in the kernel's timer), or
 * `"timer"`, a `setTimeout` (where no clock thread runs, or as a fallback), or `"none"`, the deadline
 * having passed before there was anything to wait for. The runtime's timers fire about 2 ms late
 * (Deno 2.9.6 here: `setTimeout(r, 0)` and `setTimeout(r, 1)` both took 2.1–2.2 ms), which every
 * emulated transfer used to add to its link's time; the clock thread ended the same waits 0.13–0.34
 * ms late (medians of 41 waits of 0.15–10 ms).
 *
 * @example
 * ```ts
 * import { waitUntil } from "./link.ts";
 * await waitUntil(performance.now() + 0.5); // half a millisecond, not two
 * ```
 */
export async function waitUntil(deadline: number): Promise<"clock" | "timer" | "none"> {
  if (performance.now() >= deadline) return "none";
  const thread = await startClock();
  let endedBy: "clock" | "timer" | "none" = "none";
  if (performance.now() < deadline) {
    await new Promise<void>((resolve) => {
      const id = nextWait++;
      const end = (by: "clock" | "timer") => {
        clearTimeout(fallback);
        thread?.waiting.delete(id);
        endedBy = by;
        resolve();
      };
      const fallback = setTimeout(
        () => end("timer"),
        Math.max(0, deadline - performance.now()) + (thread ? FALLBACK_LATE_MS : 0),
      );
      if (thread) {
        thread.waiting.set(id, () => end("clock"));
        thread.post(id, performance.timeOrigin + deadline);
      }
    });
  }
  // A timer may fire early (it rounds to whole milliseconds): wait out the rest.
  while (performance.now() < deadline) {
    endedBy = "timer";
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, deadline - performance.now())));
  }
  return endedBy;
}

/**
 * The smallest chunk {@link pipelineChunkBytes} picks where chunks are sent back (unless the maximum
 * is smaller).
 */
const MIN_PIPELINE_CHUNK_BYTES = 64 * 1024;

/**
 * Where chunks are sent back and the link's rate is known, the least time each chunk spends on the
 * link (see {@link pipelineChunkBytes}): 1 ms.
 */
const MIN_PIPELINE_CHUNK_SECONDS = 1e-3;

/**
 * Bytes of each chunk when a group of `groupBytes` is exchanged as a pipeline of chunks of at most
 * `maxChunkBytes` (each averaged, updated and, in master mode, sent back while the next arrives).
 *
 * - **Master mode** (the default), where chunks are sent back: a 32nd of the group, at least
 *   64 KiB and, where `linkBytesPerSecond` (the link's rate per direction with both busy, as
 *   `measureLink` gives it) is known, at least 1 ms on the link; at most the maximum. The link
 *   carries the group once and then the last chunk's return, which a chunk small next to its group
 *   keeps short: on 2 hosts over 1 Gbit/s, a 4.2 MB group in 1 MiB
 *   chunks reached its last parameters back 38–44 ms after its first gradients left (76–88% of the
 *   link), in 128 KiB chunks (a 32nd) 36 ms, median of 15 (92%, `bench/CLUSTER.md` at c55d52d). On
 *   a fast link per-chunk costs set the pace instead, and a chunk must be long on the link to
 *   amortize them: over 10 Gbit/s the same exchange alone reached 39% of the link in 128 KiB chunks,
 *   55% in 512 KiB and 57% in 1 MiB (3 interleaved launches each, medians), and AlexNet-like master
 *   steps in 1 MiB chunks against a 32nd took 47.2 against 51.6 ms (`overlap`) and 43.3 against
 *   56.2 (`bucketed`), where over 1 Gbit/s they took 62.8 against 58.1 and 69.6 against 56.3
 *   (4 interleaved launches each, medians). The ranks measured 6.8–7.1 Gbit/s both ways over the
 *   first link and 0.92–0.95 over the second: 1 ms of them is 0.85–0.89 MB and 115–119 KB. With
 *   this floor (against the 32nd alone; 4 interleaved launches each, medians) AlexNet-like master
 *   steps over 10 Gbit/s took 32.9 against 35.7 ms (`overlap`), 34.1 against 41.1 (`bucketed`) and
 *   31.7 against 33.5 (`sequential`); over 1 Gbit/s, where the FC group's 32nd is longer than 1 ms,
 *   55.5 against 54.1, 54.8 against 55.7 and 98.5 against 98.2, within the launches' spread.
 * - **Allreduce mode**, where every rank updates its own replica and nothing is sent back: the
 *   maximum. Nothing returns after the last chunk, so only per-chunk costs remain, and they set the
 *   pace where the link is fast: the 4.2 MB group's exchange alone over 10 Gbit/s reached 40% of
 *   the link in 128 KiB chunks and 63% in 1 MiB ones, over 1 Gbit/s 93% and 94% (allreduce, 3
 *   interleaved launches each, medians). AlexNet-like allreduce steps over 10 Gbit/s
 *   (4 interleaved launches each, medians, 32nd → maximum): `sequential` 43.0 → 33.8 ms,
 *   `overlap` 40.9 → 39.7, `bucketed` 48.4 → 41.5; over 1 Gbit/s (6 each) 64.8 → 65.3 and
 *   57.0 → 57.2 (`sequential`, `overlap`; 4 each: `bucketed` 56.0 → 52.5).
 *
 * Per-chunk costs bound both from below: 256 KiB chunks slowed a 66.5 MB exchange over 10 Gbit/s,
 * where the 2 cores, not the link, set its pace, by 13–32% against 1 MiB (master, allreduce).
 *
 * @example
 * ```ts
 * import { pipelineChunkBytes } from "./link.ts";
 * console.log(pipelineChunkBytes(4_194_304, 1 << 20)); // 131072: 32 chunks
 * console.log(pipelineChunkBytes(4_194_304, 1 << 20, "master", 875e6)); // 875000: 1 ms at 7 Gbit/s
 * console.log(pipelineChunkBytes(4_194_304, 1 << 20, "allreduce")); // 1048576: 4 chunks
 * console.log(pipelineChunkBytes(234_524_576, 1 << 20)); // 1048576: the maximum
 * ```
 */
export function pipelineChunkBytes(
  groupBytes: number,
  maxChunkBytes: number,
  mode: ReductionMode = "master",
  linkBytesPerSecond?: number,
): number {
  if (mode === "allreduce") return maxChunkBytes;
  const onLink = linkBytesPerSecond ? Math.ceil(linkBytesPerSecond * MIN_PIPELINE_CHUNK_SECONDS) : 0;
  return Math.min(maxChunkBytes, Math.max(MIN_PIPELINE_CHUNK_BYTES, Math.ceil(groupBytes / 32), onLink));
}
