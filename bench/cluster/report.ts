/**
 * `deno task bench:cluster`: Tandem across 2 hosts joined by a real, tc-shaped link (the network
 * namespaces of `deno task cluster`), beside PyTorch's DistributedDataParallel on the same hosts,
 * link, nets, global batch and optimizer, and beside the simulator's prediction for every row;
 * written to `bench/CLUSTER.md` in one run.
 *
 * Rows: nets (the AlexNet-like default; Caffe's bvlc_alexnet at 227×227 on synthetic data) ×
 * schedules (sequential, overlap, bucketed as PyTorch DDP's default buckets, auto, hybrid, and overlap
 * with fp16 gradients on the wire) × reductions (master, allreduce) × links (1 and 10 Gbit/s), and the
 * FC exchange alone (`probe:<MB>` nets: one FC layer, a step that is almost all exchange) at 4, 16, 64
 * MB, and the MPI transfers alone (`bench/cluster/transfers.ts`: no CPU work, Open MPI's TCP progress
 * thread off and on). Each Tandem row is `bench/cluster/rank.ts` under mpirun on the hosts, run once
 * alone and, for every schedule but sequential, once more with its steps taking turns with sequential
 * ones (the hidden fraction and the overlap goal), which nearly doubles the time a run takes.
 *
 * Run as root: `npx deno task bench:cluster [--quick] [--links L,M] [--alexnet-batch N,M] [--rows FILE]`
 * (`--rows` also writes each Tandem run's config and rank 0's result, one JSON object per line; the full
 * run took 110 min on a 2-core machine at commit e008b77; leave the machine otherwise idle). `--quick`
 * runs the AlexNet-like rows and the probes only, and writes them to `bench/CLUSTER_QUICK.md`, leaving
 * the full report as it was; `--links` or `--alexnet-batch` narrowing the run write
 * `bench/CLUSTER_PARTIAL.md`.
 *
 * It stays one file although long: it is the report itself, written top to bottom in the order of
 * its sections; the ranks' run, the transfers alone, the nets and the overlap goal live beside it in
 * `bench/cluster/`, the peer in `bench/peers/`.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { CpuBackend, type Plan } from "../../mod.ts";
import {
  calibrateProfile,
  measureProfile,
  type Profile,
  regroupProfile,
  simulate,
} from "../../schedule/simulator/mod.ts";
import { groupTimes } from "../../schedule/simulator/profile.ts";
import { type GoalRow, hiddenShare, overlapGoal } from "./overlap_goal.ts";
import { rateAtSize, type SizedRate } from "./sized_link.ts";
import { wireBytesPerElement, type WireFormat } from "../../schedule/runtime/mod.ts";
import { writeFileAtomic } from "../../engine/io/mod.ts";
import { buildModel } from "../../schedule/devices/model_spec.ts";
import { DEFAULT_CHUNK_BYTES } from "../../schedule/mpi/exchange.ts";
import { TCP_PROGRESS_THREAD } from "../../schedule/mpi/tcp.ts";
import type { DataPlane } from "../../schedule/mpi/sockets.ts";
import {
  type Cluster,
  commandAcross,
  createCluster,
  missingRequirement,
  rateBitsPerSecond,
  removeCluster,
} from "../../cli/cluster.ts";
import { allowedCores, hostCores } from "../../cli/host_cores.ts";
import { pytorchAvailable, pytorchCommand, type PytorchResult } from "../peers/pytorch.ts";
import { type RankConfig, specOf } from "./rank.ts";
import { measureStamp, stampBlock } from "../stamp.ts";
import { measureExchangeRates } from "../exchange_rates.ts";

const { values: flags } = parseArgs({
  args: Deno.args,
  options: {
    quick: { type: "boolean" },
    "alexnet-batch": { type: "string" },
    links: { type: "string" },
    rows: { type: "string" },
  },
});
const LINKS = (flags.links ?? "1gbit,10gbit").split(",");
/** The Tandem rows of each net and mode: schedules, and one with compressed gradients. */
const ROWS: { schedule: string; wire?: WireFormat }[] = [
  { schedule: "sequential" },
  { schedule: "overlap" },
  { schedule: "bucketed" },
  { schedule: "auto" },
  { schedule: "hybrid" },
  { schedule: "overlap", wire: "fp16" },
];
const MODES = ["master", "allreduce"] as const;
/**
 * Global batches: 64 for the AlexNet-like net as everywhere else (10 timed steps: its steps take a
 * tenth of a second, and 5 left the medians at the mercy of this machine's slow stretches); AlexNet's
 * as given (a comma list, default 16 and 64: the small batch is where the link, not the 2 cores, sets
 * the pace), 5 timed steps (3 gave medians that moved by a third between runs: over 10 Gbit/s the
 * same row's FC broadcast took 0.2 s in one step and 0.7–0.85 s in the next).
 *
 * Launches: each AlexNet-like row (and its PyTorch row) runs 3 times and reports its median launch.
 * Its timed steps last half a second, inside one of this shared machine's stretches (its 2-thread rate
 * moved between 60 and 104 GFLOP/s in stretches of seconds), so one launch lands wherever it lands: 6
 * launches of the same `hybrid` row over 1 Gbit/s took 37.7–51.8 ms, 6 in allreduce mode 36.6–52.0 ms.
 * AlexNet's rows run for a minute or more each, long enough to span the stretches once.
 */
const NETS = [
  { net: "alexnet-like", batch: 64, steps: 10, warmup: 3, launches: 3 },
  ...(flags.quick ? [] : (flags["alexnet-batch"] ?? "16,64").split(",").map((batch) => ({
    net: "alexnet",
    batch: Number(batch),
    steps: 5,
    warmup: 1,
    launches: 1,
  }))),
];
const PROBES = [4, 16, 64];
/**
 * The probes run over both data planes: the trainer's default (sockets between the ranks), which
 * every other row uses, and Open MPI's collectives, for comparison.
 */
const DATA_PLANES: readonly DataPlane[] = ["sockets", "mpi"];
const DATA_PLANE_LABELS: Readonly<Record<DataPlane, string>> = {
  sockets: "sockets (default)",
  mpi: "MPI collectives",
};
/**
 * Kernel threads per rank: its host's cores, as `createCluster` splits the cores this process may
 * run on (`hostCores`), or 1 where the hosts must share them.
 */
const HOSTS = 2;
const DEVICE_THREADS = hostCores(HOSTS, allowedCores())?.[0].length ?? 1;
/** The MPI exchange's largest chunk, in MiB, as the report describes it. */
const CHUNK_MIB = DEFAULT_CHUNK_BYTES / (1 << 20);
/** The probes' global batch (the FC layer's compute is small at any batch). */
const PROBE_BATCH = 8;
/**
 * The probes' warm-up and timed steps: a step is one exchange, and over 10 Gbit/s, where the 2 shared
 * cores set the pace, consecutive 4.2 MB exchanges took anything from 4 to 16 ms (400 in a row: median
 * 6.4 ms, the first 20 slower): 5 timed steps after 2 left the median to chance.
 */
const PROBE_WARMUP = 5, PROBE_STEPS = 15;
/**
 * The most of compute's speed a transfer may take in the `pred.` column: where the exchange alone
 * keeps every core busy (1.9-2.1 of 2 on the 66.5 MB probe over 10 Gbit/s here), compute beside it
 * still moves, slowly.
 */
const MAX_CPU_SHARE = 0.95;

// `--rows FILE`: every Tandem run's config and rank 0's result, one JSON object per line, to price
// the rows again offline (a simulator change need not rerun the hosts). Emptied before any work.
if (flags.rows !== undefined) {
  try {
    Deno.writeTextFileSync(flags.rows, "");
  } catch (e) {
    console.error(
      `bench:cluster: --rows: cannot write ${JSON.stringify(flags.rows)}: ${(e as Error).message}`,
    );
    Deno.exit(2);
  }
}
const missing = await missingRequirement();
if (missing) {
  console.error(`bench:cluster: cannot build the hosts: ${missing}`);
  Deno.exit(2);
}
// Taken before any host exists, so the peak probe has every core to itself.
// A run narrower than the full one never replaces the full report: a quick run (no AlexNet tables)
// writes its own file, and so does one limited to some links or AlexNet batches.
const SOURCES = ["bench/cluster", "bench/peers", "cli/cluster.ts", "cli/host_cores.ts"];
const narrowed = flags.links !== undefined || flags["alexnet-batch"] !== undefined;
const stamp = await measureStamp(
  flags.quick
    ? { file: "bench/CLUSTER_QUICK.md", command: "npx deno task bench:cluster --quick", sources: SOURCES }
    : narrowed
    ? {
      file: "bench/CLUSTER_PARTIAL.md",
      command: ["npx deno task bench:cluster", ...Deno.args].join(" "),
      sources: SOURCES,
    }
    : { file: "bench/CLUSTER.md", command: "npx deno task bench:cluster", sources: SOURCES },
);

interface RankResult {
  net: string;
  schedule: string;
  requested: string;
  groups: string[];
  plan: Plan;
  /** Layer → group of an automatic schedule's split. */
  assignment?: Record<string, string>;
  mode: "master" | "allreduce";
  batch: number;
  stepMs: number;
  bestStepMs: number;
  computeMs: number;
  /** The slowest rank's compute per step (median over steps): the pace of a synchronous step. */
  slowestComputeMs: number;
  /** The conv layers' backward (every group but the FC one), the slowest rank's, median over steps. */
  bodyBackwardMs: number;
  hiddenFraction: number;
  fcCommMs: number;
  fcExchangeMs: number;
  fcBytes: number;
  activationMs: number;
  /** A hybrid step's handoff around each activation collective (0 for data-parallel rows). */
  handoffMs: number;
  /** A hybrid step's activation collectives as the last rank to enter each spent them, summed (`collectiveTimes`). */
  lastInMs: number;
  /** How much longer the first rank to enter each of them spent in it, summed. */
  waitMs: number;
  /** What the ranks being late by turns between those collectives cost, beyond the slower rank's pace. */
  turnsMs: number;
  /** The cores the machine kept busy beyond the devices' compute, per second of FC exchange (Linux). */
  exchangeCores?: number;
  /** The machine's cores (Linux). */
  cores?: number;
  wireBytes: number;
  wire: WireFormat;
  imagesPerSecond: number;
  /** The `sequential` steps that took turns with this row's in the same launch (`pairedWith`). */
  paired?: GoalRow & { schedule: string };
}

const decoder = new TextDecoder();

/**
 * Ctrl-C or SIGTERM stops the launch in flight (mpirun passes the signal to its ranks), removes the
 * hosts and ends the run without a report: Deno's default on a signal would leave the namespaces.
 */
const interrupt = new AbortController();
for (const signal of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(signal, () => interrupt.abort());

/** Runs `argv` as one rank per host of `cluster`; rank 0's last stdout line as JSON. */
async function across<T>(cluster: Cluster, argv: string[], what: string): Promise<T> {
  const output = await commandAcross(cluster, argv, {
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.any([interrupt.signal, AbortSignal.timeout(3_600_000)]),
  }).output();
  if (interrupt.signal.aborted) throw new Error(`${what}: interrupted`);
  const stdout = decoder.decode(output.stdout).trim();
  if (!output.success) throw new Error(`${what} failed:\n${decoder.decode(output.stderr).slice(-3000)}`);
  return JSON.parse(stdout.split("\n").at(-1)!) as T;
}

async function tandem(cluster: Cluster, config: RankConfig): Promise<RankResult> {
  const script = new URL("./rank.ts", import.meta.url).pathname;
  const result = await across<RankResult>(
    cluster,
    [Deno.execPath(), "run", "-A", script, JSON.stringify({ deviceThreads: DEVICE_THREADS, ...config })],
    `${config.net} ${config.schedule}`,
  );
  if (flags.rows) {
    Deno.writeTextFileSync(flags.rows, JSON.stringify({ config, result }) + "\n", { append: true });
  }
  return result;
}

/**
 * Runs `launch` `launches` times, one after another, and gives the launch whose `stepMs` is the median
 * (the lower one of an even count), with the lowest and highest `stepMs` of them all.
 */
async function medianLaunch<T>(
  launches: number,
  launch: () => Promise<T>,
  stepMs: (result: T) => number,
): Promise<{ result: T; low: number; high: number }> {
  const results: T[] = [];
  for (let i = 0; i < launches; i++) results.push(await launch());
  results.sort((a, b) => stepMs(a) - stepMs(b));
  return {
    result: results[Math.floor((launches - 1) / 2)],
    low: stepMs(results[0]),
    high: stepMs(results.at(-1)!),
  };
}

/** A step figure: the median launch's, with the range of the launches' in parentheses when there were several. */
function stepCell(stepMs: number, launches: { low: number; high: number }, count: number): string {
  return count > 1 ? `${ms(stepMs)} (${figure(launches.low)}–${figure(launches.high)})` : ms(stepMs);
}

/** What `bench/cluster/transfers.ts` prints on rank 0. */
interface TransferResult {
  rawTcp?: { bestMs: number; medianMs: number };
  duplexTcp?: { bestMs: number; medianMs: number };
  megabytes: number;
  messageBytes: number;
  progressThread: boolean;
  rows: {
    direction: "gather" | "broadcast";
    polling: "spin" | "shareCpu";
    bestMs: number;
    medianMs: number;
  }[];
}

/** MiB the transfers-alone rows move each way. */
const TRANSFER_MIB = 64;

/** The MPI transfers alone across `cluster`, with Open MPI's TCP progress thread on or off. */
function transfersAlone(cluster: Cluster, progressThread: boolean): Promise<TransferResult> {
  const script = new URL("./transfers.ts", import.meta.url).pathname;
  return across(
    cluster,
    [
      "-x",
      `${TCP_PROGRESS_THREAD}=${progressThread ? 1 : 0}`,
      Deno.execPath(),
      "run",
      "-A",
      script,
      String(TRANSFER_MIB),
      ...(progressThread ? [cluster.addresses[0]] : []),
    ],
    "MPI transfers",
  );
}

/** The per-layer profile of a net at its per-rank batch, as the simulator and `auto` use it. */
const profiles = new Map<string, Profile>();
async function profileOf(net: string, perRank: number): Promise<Profile> {
  const key = `${net}/${perRank}`;
  if (!profiles.has(key)) {
    const reference = await buildModel(specOf(net));
    profiles.set(key, measureProfile(reference, perRank, { description: net }));
    reference.dispose();
  }
  return profiles.get(key)!;
}

// The CPU side of the exchange, measured on one kernel thread: a rank's share of the cores.
const cpuRates = (() => {
  const backend = new CpuBackend({ name: "cluster-rates", threads: 1 });
  try {
    return measureExchangeRates(backend);
  } finally {
    backend.dispose();
  }
})();

/**
 * The simulator's step for run `r`'s plan on `profile` scaled to the compute of the slowest rank of
 * run `computeOf` (by default `r` itself; the simulator's devices are alike, and a synchronous step
 * waits for the slowest: rank 0's alone, 1977 ms against its peer's 2099 in one AlexNet step over 10
 * Gbit/s, prices such a step short), over a link of `link.twoWay` bytes per second per direction with
 * both directions busy and `link.oneWay` with one (default the same), with the CPU rates above and
 * compute beside a transfer at `1 − commCpuShare` of its speed: milliseconds.
 */
function predictMs(
  r: RankResult,
  profile: Profile,
  link: LinkRates,
  { computeOf = r, commCpuShare = 0 }: { computeOf?: RankResult; commCpuShare?: number } = {},
): number {
  /**
   * Measured compute over the profile's, for a run's own grouping of the layers, in two parts: the
   * backward of every group but the plan's first (`bodyBackwardMs`: what runs beside the first
   * group's exchange, and slows with it), and the rest (forward and the first group's backward, which
   * no transfer of the step runs beside). One scale for both priced the AlexNet-like net's `overlap`
   * rows over 1 Gbit/s 3–5 ms long (its `bucketed` allreduce row up to 2): their conv backward ran
   * twice as long as in `sequential`, their forward no longer.
   */
  const scalesOf = (run: RankResult, split: boolean) => {
    const grouped = run.assignment ? regroupProfile(profile, run.assignment) : profile;
    const times = groupTimes(grouped);
    const body = times.filter((t) => t.group !== run.plan.groups[0]).reduce(
      (n, t) => n + t.backwardSeconds,
      0,
    );
    const head = times.reduce((n, t) => n + t.backwardSeconds, 0) - body +
      grouped.layers.reduce((n, l) => n + l.forwardSeconds, 0);
    const whole = (run.slowestComputeMs / 1000) / (head + body);
    if (!split || !(body > 0 && run.bodyBackwardMs > 0 && run.bodyBackwardMs < run.slowestComputeMs)) {
      return { head: whole, body: whole };
    }
    return {
      head: ((run.slowestComputeMs - run.bodyBackwardMs) / 1000) / head,
      body: (run.bodyBackwardMs / 1000) / body,
    };
  };
  const grouped = r.assignment ? regroupProfile(profile, r.assignment) : profile;
  const totals = groupTimes(grouped);
  const forward = grouped.layers.reduce((n, l) => n + l.forwardSeconds, 0);
  // Another run's compute (`pred.`: `sequential`'s, beside no transfer) in one scale: its groups
  // need not be this row's.
  const scales = scalesOf(computeOf, computeOf === r);
  const first = r.plan.groups[0];
  const scaled = calibrateProfile(grouped, {
    forwardSeconds: forward * scales.head,
    backwardSeconds: Object.fromEntries(
      totals.map((t) => [t.group, t.backwardSeconds * (t.group === first ? scales.head : scales.body)]),
    ),
  });
  return simulate(r.plan, scaled, {
    link: { bandwidthBytesPerSecond: link.twoWay, latencySeconds: 50e-6 },
    oneWayBandwidthBytesPerSecond: link.oneWay,
    devices: 2,
    mode: r.mode,
    memoryBandwidthBytesPerSecond: cpuRates.sumBytesPerSecond,
    updateSecondsPerByte: cpuRates.updateSecondsPerByte,
    pipelineChunkBytes: DEFAULT_CHUNK_BYTES,
    // Measured in the row's own trace, as its compute is: the runtime, not the link.
    handoffSeconds: (r.handoffMs ?? 0) / 1000,
    commCpuShare,
  }).stepSeconds * 1000;
}

/** The simulator's link: bytes per second per direction with both directions busy, and with one. */
interface LinkRates {
  twoWay: number;
  oneWay?: number;
}

/**
 * The link rate at which the simulator's own model of probe run `r` (its transfers, and the
 * averaging and update it prices at the CPU rates above) takes the step `r` measured, found by
 * bisection between 1% and 100% of the line rate; the line rate where even that is too slow. The
 * probe's achieved exchange rate alone would count the CPU work twice: once in the rate, and
 * again where the simulator adds it. The probe runs `overlap` with one group, whose reduce, update
 * and broadcast pipeline both ways: the rate is the two-way one.
 */
function calibrateLink(r: RankResult, profile: Profile, lineBytesPerSecond: number): number {
  let low = Math.log(lineBytesPerSecond / 100), high = Math.log(lineBytesPerSecond);
  if (predictMs(r, profile, { twoWay: lineBytesPerSecond }) >= r.stepMs) return lineBytesPerSecond;
  for (let i = 0; i < 40; i++) {
    const middle = (low + high) / 2;
    if (predictMs(r, profile, { twoWay: Math.exp(middle) }) > r.stepMs) low = middle;
    else high = middle;
  }
  return Math.exp(high);
}

/**
 * The FC bytes the busier direction of the link carried in run `r`: the gradients (float32, or as
 * the wire encodes them), or in master mode the float32 parameters coming back where those are more.
 */
function directionBytes(r: RankResult): number {
  const gradients = r.fcBytes / 4 * wireBytesPerElement(r.wire);
  return r.mode === "master" ? Math.max(gradients, r.fcBytes) : gradients;
}

/** Milliseconds to the figures the tables show: one decimal under 10. */
const figure = (v: number) => v.toFixed(v < 10 ? 1 : 0);
const ms = (v: number) => `${figure(v)} ms`;
const lines: string[] = [];
const say = (line = "") => {
  console.log(line);
  lines.push(line);
};

const pytorchWhy = await pytorchAvailable();
say("# Tandem across hosts on a real link, beside PyTorch DDP");
say();
say(stampBlock(stamp));
say();
say(
  `On one ${navigator.hardwareConcurrency}-core machine: 2 hosts are network namespaces joined through a bridge by ` +
    `veth links shaped with tc (tbf: 1 ms of burst, 5 ms of queue) in both directions, each connection's ` +
    `packets kept in order as on a real link (receive packet steering); Open MPI over TCP only ` +
    `launches the ranks and carries the small collectives, while gradients and parameters travel over direct ` +
    `TCP connections between the ranks (the trainer's default \`dataPlane: "sockets"\`); ` +
    `one rank per host, whose CPU device runs ${DEVICE_THREADS} kernel thread${
      DEVICE_THREADS > 1 ? "s" : ""
    } ` +
    `(its host's cores: each host runs on ${DEVICE_THREADS} core${
      DEVICE_THREADS > 1 ? "s" : ""
    } of its own, \`deviceThreads\`; PyTorch runs 1 thread per process); Open MPI's ` +
    `TCP progress thread on; ` +
    `SGD momentum 0.9, weight decay 5e-4; one synthetic batch, made before the first step; ` +
    `the ranks meet at a barrier before each step, outside the timed span, Tandem's as PyTorch's. ` +
    `Medians of the timed steps after warm-up. The hosts' network stacks still work on any of the machine's ` +
    `${navigator.hardwareConcurrency} cores, so a transfer takes from compute, as it would not on 2 machines.`,
);
say();
say(
  "Columns: **step** median step (where a net's rows ran in several launches, see its heading, the median " +
    "launch's, every other column from that launch too, and in parentheses the fastest and slowest launch's); " +
    "**FC comm** rank 0's FC reduce and broadcast (transfers, not the update; " +
    "for `bucketed`, PyTorch DDP's default buckets, those of its first bucket, nearest the output), " +
    "or for `hybrid` its activation all-gathers and reduce-scatters (marked act.); **wire** the bytes rank 0's " +
    "transfers carried per step (trace); " +
    "**hidden** (T_seq − T) / T_fc_comm from a second launch of the row in which its steps took turns with " +
    "`sequential` ones (a second trainer on the same ranks; which of the two steps first alternates), T_seq and " +
    "T_fc_comm being those steps', so that the machine's drift between launches does not pass for hiding (in " +
    "parentheses T_seq → T of that launch: taking turns slows some rows, so every other column comes from the " +
    "row's own launch, its steps alone, as the peer's are); **trace** the part of " +
    "rank 0's communication that overlapped its compute; **rate** the FC bytes of the busier direction (gradients as " +
    "the wire carries them, or in master mode the float32 parameters sent back) over the FC exchange's span " +
    "(on every rank's trace, the ranks' clocks aligned: from when the last rank starts sending its FC gradients to " +
    "when the last rank holds the new FC parameters), as a fraction of the link rate per direction; **sim.** the " +
    "simulator's step for the same plan on the per-layer profile scaled to the slowest rank's measured compute " +
    "(each step's slowest, median over steps; the backward of every group but the plan's first, which runs " +
    "beside the first group's exchange, and the rest of the compute each scaled to its own) and, for " +
    "`hybrid`, with each activation collective's handoff between the device and the runtime measured in " +
    "the same row's trace (median), and its error; **pred.** " +
    "the simulator's step for the row from the compute of the same mode's `sequential` row (whose compute no " +
    "transfer runs beside) instead of the row's own, with compute beside a transfer at 1 − s of its speed, s " +
    "measured on the largest probe (below): what the simulator tells before the row runs, and its error.",
);
say();
say(
  "The simulator is calibrated, not fitted to the rows it predicts: its link runs at the rate at which its " +
    "own model of a probe (below; same mode, same link) takes the step that probe measured, at the row's FC " +
    "bytes between the probes' sizes, and one way (master mode's gathers and broadcasts outside a pipeline that carries both directions) at the " +
    "median rate of one plain TCP connection between the hosts (the transfers alone, below) where that is " +
    "higher; the " +
    "exchange is the MPI runtime's pipeline " +
    `of chunks (in master mode a 32nd of the group, 64 KiB to ${CHUNK_MIB} MiB and at least 1 ms on the link: at the rate the ` +
    `ranks measure when they start, and in the simulator at its link's; in allreduce mode ` +
    `${CHUNK_MIB} MiB; the last chunk holds what is left of the group; each averaged and updated, then sent ` +
    `back in master mode, while the next arrives; where a plan's ` +
    `update does not follow its reduce, as in \`sequential\`, each averaged while the next arrives); its CPU ` +
    `rates are measured here on one kernel thread, a rank's share: SGD update ${
      (1 / cpuRates.updateSecondsPerByte / 1e9).toFixed(1)
    } GB/s of parameters, device-order sum ${
      (cpuRates.sumBytesPerSecond / 1e9).toFixed(1)
    } GB/s per input. ` +
    "An `auto` row chooses its plan as `train --schedule auto` does across ranks: the ranks measure the link " +
    "between them first (`schedule/mpi/link_probe.ts`: both ways, one way, latency, and the share of the cores " +
    "the transfers keep busy), and rank 0 prices every candidate at it on the net's per-layer profile, in the " +
    "row's reduction mode.",
);

for (const rate of LINKS) {
  const bytesPerSecond = rateBitsPerSecond(rate) / 8;
  const cluster = await createCluster(HOSTS, rate);
  try {
    say();
    say(`## ${rate} link`);
    say();
    if (cluster.reorders) {
      say(`**These links may reorder packets**, which TCP takes for loss: ${cluster.reorders}.`);
      say();
    }
    const [off, on] = [await transfersAlone(cluster, false), await transfersAlone(cluster, true)];
    say(
      `MPI transfers alone (\`bench/cluster/transfers.ts\`: ${TRANSFER_MIB} MiB in ${
        on.messageBytes >> 10
      } KiB messages all posted at once, no averaging or update; gather: rank 1 to rank 0, broadcast: ` +
        "back; polled at full speed, or with 1 ms sleeps after 2 ms as beside a computing device), with Open " +
        "MPI's TCP progress thread off and on; best / median of 5:",
    );
    say();
    say("| direction | polling | progress thread off | progress thread on (default) |");
    say("| --- | --- | --- | --- |");
    const gbit = (ms: number) => on.megabytes * 8 / ms; // MB · 8 / ms = Gbit/s
    const cell = (r: { bestMs: number; medianMs: number }) =>
      `${gbit(r.bestMs).toFixed(2)} / ${gbit(r.medianMs).toFixed(2)} Gbit/s (${
        (100 * gbit(r.medianMs) * 1e9 / 8 / bytesPerSecond).toFixed(0)
      }%)`;
    for (const [i, row] of on.rows.entries()) {
      const polling = row.polling === "spin" ? "full speed" : "1 ms sleeps";
      say(`| ${row.direction} | ${polling} | ${cell(off.rows[i])} | ${cell(row)} |`);
    }
    if (on.rawTcp) {
      say();
      say(
        `One plain TCP connection (no MPI) carried the same bytes from rank 1 to rank 0 at ${
          cell(on.rawTcp)
        }${
          on.duplexTcp
            ? `; both ways at once, as an exchange uses the link, ${
              cell(on.duplexTcp)
            } per direction (the two hosts' network stacks share this machine's ${navigator.hardwareConcurrency} cores: ` +
              `this is the most a two-way exchange can reach here)`
            : ""
        }.`,
      );
    }
    say();
    say("FC exchange alone (`probe:<MB>`: one FC layer; the step is almost all exchange), overlap schedule:");
    say();
    say("| FC gradients | mode | data plane | exchange | rate (of link) | cores busy beyond compute |");
    say("| --- | --- | --- | --- | --- | --- |");
    /** The simulator's two-way link per mode, calibrated on each probe (its FC bytes, its rate). */
    const calibrated: Record<(typeof MODES)[number], SizedRate[]> = { master: [], allreduce: [] };
    /** The share of compute speed a transfer takes per mode, measured on the largest probe. */
    const cpuShare: Partial<Record<(typeof MODES)[number], number>> = {};
    for (const megabytes of PROBES) {
      for (const mode of MODES) {
        for (const dataPlane of DATA_PLANES) {
          const r = await tandem(cluster, {
            net: `probe:${megabytes}`,
            schedule: "overlap",
            mode,
            batch: PROBE_BATCH,
            steps: PROBE_STEPS,
            warmup: PROBE_WARMUP,
            linkBytesPerSecond: bytesPerSecond,
            dataPlane,
          });
          const achieved = r.fcBytes / (r.fcExchangeMs / 1000);
          if (dataPlane === "sockets") {
            calibrated[mode].push({
              bytes: r.fcBytes,
              bytesPerSecond: calibrateLink(
                r,
                await profileOf(`probe:${megabytes}`, PROBE_BATCH / 2),
                bytesPerSecond,
              ),
            });
          }
          if (megabytes === PROBES.at(-1) && dataPlane === "sockets") {
            if (r.exchangeCores !== undefined && r.cores) {
              cpuShare[mode] = Math.min(MAX_CPU_SHARE, r.exchangeCores / r.cores);
            }
          }
          say(
            `| ${(r.fcBytes / 1e6).toFixed(1)} MB | ${mode} | ${DATA_PLANE_LABELS[dataPlane]} | ${
              ms(r.fcExchangeMs)
            } | ${(achieved * 8 / 1e9).toFixed(2)} Gbit/s (${
              (100 * achieved / bytesPerSecond).toFixed(0)
            }%) | ${r.exchangeCores === undefined ? "—" : `${r.exchangeCores.toFixed(2)} of ${r.cores}`} |`,
          );
        }
      }
    }
    // One direction at a time: where the hosts' CPU, not the wire, sets the pace, one direction alone
    // runs faster than both at once (over 10 Gbit/s here a plain connection carried 9.58 Gbit/s one way,
    // and the largest probe's two-way exchange 6.10 per direction). Master mode's gathers and broadcasts
    // outside a two-way pipeline (`sequential`'s) run at the plain connection's rate. A probe cannot
    // calibrate it: with one group its reduce, update and broadcast pipeline both ways.
    const plainTcp = on.rawTcp ? on.megabytes * 1e6 / (on.rawTcp.medianMs / 1000) : 0;
    /** The simulator's two-way rate in `mode` for an exchange of `bytes` (the line rate if uncalibrated). */
    const twoWayAt = (mode: (typeof MODES)[number], bytes: number) =>
      calibrated[mode].length ? rateAtSize(calibrated[mode], bytes) : bytesPerSecond;
    /**
     * The simulator's link for a row of `bytes` FC bytes in `mode`: master mode's gathers and broadcasts
     * alone run one way, at the plain connection's rate where that is higher.
     */
    const linkAt = (mode: (typeof MODES)[number], bytes: number): LinkRates => ({
      twoWay: twoWayAt(mode, bytes),
      oneWay: Math.max(twoWayAt("master", bytes), plainTcp),
    });
    const gbitOf = (rate: number) => (rate * 8 / 1e9).toFixed(2);
    say();
    say(
      `The simulator's link here, calibrated on each probe, per direction with both busy: ${
        calibrated.master.map(({ bytes }, i) =>
          `${(bytes / 1e6).toFixed(1)} MB ${
            MODES.map((mode) =>
              `${calibrated[mode][i] ? gbitOf(calibrated[mode][i].bytesPerSecond) : "—"} Gbit/s (${mode})`
            ).join(", ")
          }`
        ).join("; ") || "not calibrated"
      }; a row's link is the rate at its FC bytes, interpolated in log bytes between the probes around it ` +
        `(the nearest one's beyond them); one way (master mode's gathers and broadcasts outside a pipeline) ` +
        `at the plain connection's ${
          gbitOf(plainTcp)
        } Gbit/s where that is higher; the share of the cores the exchange kept busy beyond compute (last column), over the machine's ${navigator.hardwareConcurrency}, and so of the speed of compute beside a transfer (the \`pred.\` column): ${
          MODES.map((mode) => `${cpuShare[mode]?.toFixed(2) ?? "not measured"} (${mode})`).join(", ")
        }.`,
    );
    for (const { net, batch, steps, warmup, launches } of NETS) {
      say();
      say(
        `### ${net}, global batch ${batch} (${batch / 2} per host)${
          launches > 1 ? `, each row the median of ${launches} launches` : ""
        }`,
      );
      say();
      say(
        "| schedule | mode | step | images/s | FC comm | wire | hidden | trace | rate | sim. (error) | pred. (error) |",
      );
      say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
      const profile = await profileOf(net, batch / 2);
      const goals: string[] = [];
      const collectives: string[] = [];
      for (const mode of MODES) {
        const overlapping: { name: string; r: RankResult; seq: GoalRow }[] = [];
        /** This mode's `sequential` row (the first): its compute has no transfer beside it. */
        let sequential: RankResult | undefined;
        for (const { schedule, wire } of ROWS) {
          const config = {
            net,
            schedule,
            mode,
            batch,
            steps,
            warmup,
            linkBytesPerSecond: bytesPerSecond,
            wire,
          };
          // The row's own launch gives every column but hidden: its steps run alone, as the peer's do.
          const own = await medianLaunch(launches, () => tandem(cluster, config), (x) => x.stepMs);
          const r = own.result;
          // What it hid comes from a second launch in which its steps take turns with sequential ones.
          const p = schedule === "sequential"
            ? undefined
            : await tandem(cluster, { ...config, pairedWith: "sequential" });
          const seq = p?.paired;
          const hidden = p && seq && seq.fcCommMs > 0
            ? `${hiddenShare(seq, p).toFixed(2)} (${ms(seq.stepMs)} → ${ms(p.stepMs)})`
            : "—";
          const achieved = r.fcExchangeMs > 0 ? directionBytes(r) / (r.fcExchangeMs / 1000) : 0;
          if (schedule === "sequential") sequential = r;
          const link = linkAt(mode, r.fcBytes);
          const cell = (predicted: number) =>
            `${ms(predicted)} (${((predicted - r.stepMs) / r.stepMs * 100).toFixed(0)}%)`;
          let sim = "—", pred = "—";
          try {
            if (r.wire !== "fp32") throw new Error("compressed gradients are not modelled");
            sim = cell(predictMs(r, profile, link));
            if (sequential && cpuShare[mode] !== undefined) {
              pred = cell(
                predictMs(r, profile, link, { computeOf: sequential, commCpuShare: cpuShare[mode] }),
              );
            }
          } catch (error) {
            sim = `— (${(error as Error).message.split("\n")[0].slice(0, 60)})`;
          }
          const name = r.requested === "auto"
            ? `auto → ${r.schedule} [${r.groups.join(", ")}]`
            : r.wire !== "fp32"
            ? `${r.schedule}, ${r.wire} wire`
            : r.schedule;
          if (p && seq && r.schedule !== "hybrid" && r.wire === "fp32") overlapping.push({ name, r: p, seq });
          if (r.schedule === "hybrid") {
            collectives.push(`${name} ${mode}: ${ms(r.lastInMs)}, ${ms(r.waitMs)} and ${ms(r.turnsMs)}`);
          }
          const fcComm = r.schedule === "hybrid" ? `${ms(r.activationMs)} act.` : ms(r.fcCommMs);
          const rate = r.schedule === "hybrid" ? "—" : `${(100 * achieved / bytesPerSecond).toFixed(0)}%`;
          say(
            `| ${name} | ${mode} | ${stepCell(r.stepMs, own, launches)} | ${
              r.imagesPerSecond.toFixed(0)
            } | ${fcComm} | ${(r.wireBytes / 1e6).toFixed(1)} MB | ${hidden} | ${
              (r.hiddenFraction * 100).toFixed(0)
            }% | ${rate} | ${sim} | ${pred} |`,
          );
        }
        if (overlapping.length) goals.push(overlapGoal(mode, overlapping, ms));
      }
      // PyTorch DDP on the same hosts and link: one process per host, default buckets, gloo.
      if (pytorchWhy) {
        say(`| PyTorch DDP | — | ${pytorchWhy} | | | | | | | | |`);
      } else {
        const ddp = await medianLaunch(launches, () =>
          across<PytorchResult>(
            cluster,
            [
              "-x",
              "OMPI_COMM_WORLD_RANK",
              ...pytorchCommand({
                net: net as "alexnet-like" | "alexnet",
                batch,
                steps,
                warmup,
                threads: 1,
                master: `${cluster.addresses[0]}:29517`,
                timeoutSeconds: 3000,
              }),
            ],
            `PyTorch ${net}`,
          ), (x) => x.medianMs);
        const result = ddp.result;
        say(
          `| PyTorch ${result.version} DDP (gloo, default buckets) | allreduce | ${
            stepCell(result.medianMs, ddp, launches)
          } | ${result.imagesPerSecond.toFixed(0)} | | | | | | | |`,
        );
        // Which BLAS the peer ran on matters: Debian's reference BLAS runs its FC layers 2.3× slower.
        say();
        say(`PyTorch's libraries (rank 0): ${result.blas}.`);
      }
      say();
      if (collectives.length) {
        say(
          "**Activation collectives** (`hybrid` rows, per step, median over steps, each rank's spans on its own " +
            "clock): for each collective, the time the last rank to enter it spent inside (its peer's piece, " +
            "sent eagerly, may be there already) and how much longer the first rank to enter spent (waiting for " +
            "the other to finish computing or hand its activation over, and for its piece to cross the link), each " +
            "summed over the step's collectives; then what the ranks being late by turns cost: the sum over the " +
            "collectives of the longer rank's stretch before each (from leaving the one before: compute and both " +
            `handoffs) less the slower rank's own sum: ${
              collectives.join("; ")
            }. The simulator prices each ` +
            "piece's transfer from the link, the handoffs at their median and the step at the slower rank's " +
            "compute; it has no term for the third (its devices are alike).",
        );
        say();
      }
      // One paragraph per mode: consecutive lines would run together in Markdown.
      for (const goal of goals) {
        say(goal);
        say();
      }
    }
  } finally {
    await removeCluster(cluster);
    if (interrupt.signal.aborted) {
      console.error("bench:cluster: interrupted; the hosts are removed and no report was written");
      Deno.exit(130);
    }
  }
}

await writeFileAtomic(
  new URL(`../../${stamp.file}`, import.meta.url).pathname,
  [new TextEncoder().encode(lines.join("\n") + "\n")],
);
console.log(`written to ${stamp.file}`);
Deno.exit(0);
