/**
 * Measuring the link between the ranks of an MPI job, so that `auto` prices its candidates at what
 * the network gives instead of at an assumed link. Across hosts nothing else says what connects them:
 * 12 GB/s assumed where a 1 Gbit/s Ethernet runs (96× slower) prices the FC gradients' exchange as
 * free, and `auto` then overlaps a net that sharding the FC layers (`hybrid`) runs faster.
 *
 * Every rank sends a buffer of gradient size over the data plane the trainer will use, in the
 * exchange's chunks: both ways at once (an all-gather: what an exchange's reduce and broadcast
 * pipeline loads the link with), then one way (a gather to rank 0: master mode's gather alone), once
 * to warm the connections up and then {@link LINK_PROBE_REPEATS} times each, medians taken; tiny
 * all-gathers give the latency. Where Linux's `/proc/stat` exists, the cores kept busy during the
 * two-way transfers give the share of compute a transfer takes (its copies and TCP: the `commCpuShare`
 * of the simulator's costs).
 *
 * @module
 */

import type { Link } from "../runtime/exchange/link.ts";
import { readCpuTimes } from "./cpu_use.ts";
import type { WaitOptions } from "./request.ts";
import { type BulkCollectives, type BulkRequest, type DataPlane, SocketMesh } from "./sockets.ts";
import type { MpiTransport } from "./transport.ts";

/** Timed transfers per direction, after one warm-up: the medians are taken. */
export const LINK_PROBE_REPEATS = 3;

/** Bytes per posted message: a chunk as the exchange pipelines gradients (1 MiB). */
const MESSAGE_BYTES = 1 << 20;

/** Smallest and largest buffer a rank sends: 1 MiB and 32 MiB (about a second over 1 Gbit/s both ways). */
export const LINK_PROBE_BYTES: Readonly<{ min: number; max: number }> = Object.freeze({
  min: 1 << 20,
  max: 32 << 20,
});

/** The most of the cores a transfer is said to take: the simulator needs compute to move. */
const MAX_SHARE = 0.95;

/** What {@link measureLink} found. */
export interface MeasuredLink {
  /**
   * The simulator's link: bytes per second per direction with both directions busy, the latency of
   * a tiny message, and a label saying both were measured.
   */
  readonly link: Required<Link>;
  /** Bytes per second with one direction busy (every rank to rank 0). */
  readonly oneWayBytesPerSecond: number;
  /**
   * Share of the cores the two-way transfers kept busy (0 to 0.95), or `undefined` without
   * `/proc/stat`: compute beside a transfer runs at 1 − this of its speed.
   */
  readonly commCpuShare?: number;
  /** Bytes each rank sent per transfer. */
  readonly bytes: number;
}

/** Options of {@link measureLink}. */
export interface LinkProbeOptions {
  /** Bytes each rank sends: the gradients' size, clamped to {@link LINK_PROBE_BYTES}. */
  readonly bytes: number;
  /** The data plane to measure: the one training will move gradients over (default `sockets`). */
  readonly dataPlane?: DataPlane;
  /** `performance.now()` milliseconds by which the whole probe must finish (default 2 minutes). */
  readonly deadline?: number;
  /**
   * The sockets between the ranks, where they are open already (with the `sockets` data plane):
   * measured over, and left open. Default: the probe opens its own and closes them.
   */
  readonly mesh?: SocketMesh;
}

/**
 * The buffer {@link measureLink} sends for `gradientBytes` of gradients: clamped to
 * {@link LINK_PROBE_BYTES}, a whole number of floats.
 *
 * @example
 * ```ts
 * import { linkProbeBytes } from "./link_probe.ts";
 * console.log(linkProbeBytes(244e6)); // 33554432: 32 MiB
 * ```
 */
export function linkProbeBytes(gradientBytes: number): number {
  const clamped = Math.min(LINK_PROBE_BYTES.max, Math.max(LINK_PROBE_BYTES.min, gradientBytes));
  return 4 * Math.floor(clamped / 4);
}

/**
 * A one-line description of `measured` for the user: rates in Gbit/s, latency in µs, and the share.
 *
 * @example
 * ```ts
 * import { describeMeasuredLink } from "./link_probe.ts";
 * describeMeasuredLink(2, 116e6, 119e6, 80e-6, 0.3);
 * // "the link measured between the 2 ranks: 0.93 Gbit/s per direction both ways, 0.95 one way, 80 µs; transfers kept 30% of the cores busy"
 * ```
 */
export function describeMeasuredLink(
  ranks: number,
  twoWayBytesPerSecond: number,
  oneWayBytesPerSecond: number,
  latencySeconds: number,
  commCpuShare: number | undefined,
): string {
  const gbit = (bytesPerSecond: number) => (bytesPerSecond * 8 / 1e9).toFixed(2);
  return `the link measured between the ${ranks} ranks: ${gbit(twoWayBytesPerSecond)} Gbit/s per direction ` +
    `both ways, ${gbit(oneWayBytesPerSecond)} one way, ${(latencySeconds * 1e6).toFixed(0)} µs${
      commCpuShare === undefined
        ? ""
        : `; transfers kept ${(commCpuShare * 100).toFixed(0)}% of the cores busy`
    }`;
}

/**
 * Collective (every rank calls it, with the same options): measures the link between the ranks
 * over `options.dataPlane` (see the module notes). Every rank gets the same figures (rank 0's).
 * Throws a `TransportError` when a rank does not take part by the deadline.
 *
 * @example
 * ```ts ignore
 * import { measureLink, MpiTransport } from "./mod.ts";
 * const transport = MpiTransport.init();
 * const measured = await measureLink(transport, { bytes: 16 << 20 });
 * if (transport.rank === 0) console.log(measured.link.label);
 * ```
 */
export async function measureLink(transport: MpiTransport, options: LinkProbeOptions): Promise<MeasuredLink> {
  const { rank, size } = transport;
  const deadline = options.deadline ?? performance.now() + 120_000;
  const wait: WaitOptions = { deadline };
  const bytes = linkProbeBytes(options.bytes);
  const floats = bytes / 4, perMessage = MESSAGE_BYTES / 4;
  // Shared memory: MPI reads and writes it while the event loop runs on.
  const mine = new Float32Array(new SharedArrayBuffer(bytes)).fill(rank + 1);
  const all = new Float32Array(new SharedArrayBuffer(bytes * size));
  const own = !options.mesh && (options.dataPlane ?? "sockets") === "sockets"
    ? await SocketMesh.open(transport, wait)
    : undefined;
  const bulk: BulkCollectives = options.mesh ?? own ?? transport;
  try {
    /** The buffer's messages, `[from, to)` in floats. */
    const messages: [number, number][] = [];
    for (let from = 0; from < floats; from += perMessage) {
      messages.push([from, Math.min(floats, from + perMessage)]);
    }
    /**
     * Seconds from leaving a barrier together until this rank's requests are done, and (with
     * `everyone`) every rank's: the receiving side finishes last.
     */
    const timed = async (name: string, post: () => BulkRequest[], everyone = true) => {
      await transport.barrier(`link probe: before ${name}`).wait({ ...wait, spin: true });
      const start = performance.now();
      for (const request of post()) await request.wait(wait);
      if (everyone) await transport.barrier(`link probe: after ${name}`).wait({ ...wait, spin: true });
      return (performance.now() - start) / 1000;
    };
    const twoWay = () =>
      messages.map(([from, to]) =>
        bulk.allgather(mine.subarray(from, to), all.subarray(size * from, size * to), "link probe: both ways")
      );
    const oneWay = () =>
      messages.map(([from, to]) =>
        bulk.gather(
          mine.subarray(from, to),
          rank === 0 ? all.subarray(size * from, size * to) : undefined,
          0,
          "link probe: one way",
        )
      );
    // One float each way: its own arrival, not a closing barrier's round trip.
    const tiny = () => [bulk.allgather(mine.subarray(0, 1), all.subarray(0, size), "link probe: latency")];
    await timed("warm-up", twoWay);
    const before = readCpuTimes();
    const twoWaySeconds: number[] = [];
    for (let i = 0; i < LINK_PROBE_REPEATS; i++) twoWaySeconds.push(await timed("both ways", twoWay));
    const after = readCpuTimes();
    const oneWaySeconds: number[] = [];
    for (let i = 0; i < LINK_PROBE_REPEATS; i++) oneWaySeconds.push(await timed("one way", oneWay));
    const latencies: number[] = [];
    for (let i = 0; i < 5; i++) latencies.push(await timed("latency", tiny, false));
    const spent = twoWaySeconds.reduce((a, b) => a + b, 0);
    const share = before && after && after.cores > 0
      ? Math.min(MAX_SHARE, Math.max(0, (after.busy - before.busy) / (spent * after.cores)))
      : undefined;
    // Each rank sends `bytes` to each of the others: its link carries (size − 1) · bytes each way.
    const carried = (size - 1) * bytes;
    const figures = [
      carried / median(twoWaySeconds),
      carried / median(oneWaySeconds),
      median(latencies),
      share ?? -1,
    ];
    // Rank 0's figures for everyone: the ranks must price alike.
    const shared = new Float64Array(new SharedArrayBuffer(8 * figures.length));
    if (rank === 0) shared.set(figures);
    await transport.broadcast(shared, 0, "link probe: figures").wait(wait);
    const [twoWayRate, oneWayRate, latency, measuredShare] = shared;
    return {
      link: {
        bandwidthBytesPerSecond: twoWayRate,
        latencySeconds: latency,
        label: describeMeasuredLink(
          size,
          twoWayRate,
          oneWayRate,
          latency,
          measuredShare < 0 ? undefined : measuredShare,
        ),
      },
      oneWayBytesPerSecond: oneWayRate,
      commCpuShare: measuredShare < 0 ? undefined : measuredShare,
      bytes,
    };
  } finally {
    own?.close();
  }
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}
