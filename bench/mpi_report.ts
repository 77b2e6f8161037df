/**
 * The MPI transport on this machine, written to `bench/MPI.md`: training step time of `sequential`
 * vs `overlap` with one device per process across 2 MPI ranks (the AlexNet-like default, global
 * batch 64, both reduction modes, beside the same runs on 2 Workers in one process), and the
 * bandwidth the transport reaches for FC-sized gradients next to raw `MPI_Allreduce` in the same run.
 *
 * Run: `npx deno task bench:mpi` (it starts itself under `mpirun -np 2`; about two minutes). Leave the
 * machine otherwise idle: two ranks, each with a computing Worker, already share its cores.
 *
 * Bandwidth is the gradient's bytes over the time from posting to completion on rank 0, after a
 * barrier (nccl-tests' "algorithm bandwidth"); for 2 ranks an allreduce moves as many bytes each way.
 *
 * @module
 */

import {
  type CpuBackend,
  DataParallelTrainer,
  getBackend,
  overlapPlan,
  type Plan,
  randn,
  sequentialPlan,
  SGD,
} from "../mod.ts";
import { averageInDeviceOrder } from "../schedule/runtime/exchange/host_parameters.ts";
import { buildModel, layoutOf, type ModelSpec } from "../schedule/devices/mod.ts";
import { type DataParallelStepResult, type LaneEvent, spanKind } from "../schedule/runtime/mod.ts";
import { detectMpiLaunch, MpiTransport } from "../schedule/mpi/mod.ts";
import type { ParameterEntry } from "../engine/nn/mod.ts";
import type { ReductionMode } from "../schedule/mod.ts";
import { uniformValues } from "../engine/mod.ts";
import { writeFileAtomic } from "../engine/io/mod.ts";
import { cpuKernelsLabel } from "./kernels/backend_label.ts";
import { type BenchStamp, measureStamp, readStamp, stampBlock, type StampRequest } from "./stamp.ts";
import { localMpirunArguments } from "../cli/cluster.ts";

const RANKS = 2;
const STAMP: StampRequest = {
  file: "bench/MPI.md",
  command: "npx deno task bench:mpi",
  sources: ["bench/mpi_report.ts", "bench/kernels/backend_label.ts"],
};
/** The stamp travels from the launching process to the ranks in this variable (see below). */
const STAMP_VARIABLE = "TANDEM_BENCH_STAMP";

if (!detectMpiLaunch()) {
  // Started directly: run again as RANKS MPI processes on this machine. The stamp (with the peak,
  // which needs every core) is taken here, before any rank runs, and handed to rank 0.
  const stamp = await measureStamp(STAMP);
  try {
    const status = await new Deno.Command("mpirun", {
      args: [
        ...localMpirunArguments(RANKS),
        Deno.execPath(),
        "run",
        "-A",
        new URL(import.meta.url).pathname,
      ],
      // One host: shared memory between the ranks unless the caller chose otherwise.
      env: {
        OMPI_MCA_btl: Deno.env.get("OMPI_MCA_btl") ?? "self,vader",
        [STAMP_VARIABLE]: `<!-- tandem-bench-stamp ${JSON.stringify(stamp)} -->`,
      },
      stdin: "inherit",
      stdout: "inherit",
      stderr: "inherit",
    }).spawn().status;
    Deno.exit(status.code);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
    console.log("bench:mpi: mpirun not found (apt-get install openmpi-bin libopenmpi-dev); skipped");
    Deno.exit(0);
  }
}

const GLOBAL_BATCH = 64, WARMUP = 3, TIMED = 15;
const mpi = MpiTransport.init();
const root = mpi.rank === 0;
const lines: string[] = [];
const say = (line = "") => {
  if (!root) return;
  console.log(line);
  lines.push(line);
};
const long = () => ({ deadline: performance.now() + 600_000 });
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

/** A markdown table, its columns padded as `deno fmt` pads them, so the console shows it aligned. */
function table(header: string[], rows: string[][]): void {
  const widths = header.map((h, c) => Math.max(3, h.length, ...rows.map((r) => r[c].length)));
  const line = (cells: string[]) => `| ${cells.map((cell, c) => cell.padEnd(widths[c])).join(" | ")} |`;
  say(line(header));
  say(line(widths.map((w) => "-".repeat(w))));
  for (const row of rows) say(line(row));
}

const model: ModelSpec = {
  kind: "module",
  url: new URL("../engine/models/mod.ts", import.meta.url).href,
  exportName: "alexnetLike",
};

function batchFor(step: number) {
  const shape = [GLOBAL_BATCH, 1, 28, 28];
  const images = randn(shape, { seed: 1000 + step }).dataSync() as Float32Array;
  const labels = Int32Array.from(
    uniformValues(GLOBAL_BATCH, { seed: 2000 + step }),
    (u) => Math.floor(u * 10),
  );
  return { images, labels, shape };
}

interface StepFigures {
  bestMs: number;
  medianMs: number;
  commMs: number;
  hiddenMs: number;
  fcCommMs: number;
}

/** Times WARMUP + TIMED steps; `trainer.step` is the only thing each iteration does. */
async function timeSteps(
  step: (i: number) => Promise<DataParallelStepResult>,
  fcMs: () => number,
): Promise<StepFigures> {
  const seconds: number[] = [], comm: number[] = [], hidden: number[] = [], fc: number[] = [];
  for (let i = 0; i < WARMUP + TIMED; i++) {
    const before = fcMs();
    const result = await step(i);
    if (i < WARMUP) continue;
    seconds.push(result.seconds);
    comm.push(result.ms.communication);
    hidden.push(result.ms.hiddenCommunication);
    fc.push(fcMs() - before);
  }
  return {
    bestMs: Math.min(...seconds) * 1000,
    medianMs: median(seconds) * 1000,
    commMs: median(comm),
    hiddenMs: median(hidden),
    fcCommMs: median(fc),
  };
}

const optimizer = (p: ParameterEntry[]) => new SGD(p, { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 });

async function acrossProcesses(mode: ReductionMode, plan: Plan): Promise<StepFigures> {
  let fcMs = 0;
  const onEvent = (e: LaneEvent) => {
    if (spanKind(e) === "communication" && / fc$/.test(e.name)) fcMs += e.end - e.start;
  };
  const trainer = await DataParallelTrainer.create({ model, mode, plan, optimizer, onEvent, transport: mpi });
  try {
    return await timeSteps((i) => trainer.step(batchFor(i)), () => fcMs);
  } finally {
    await trainer.close();
  }
}

/** The same run on 2 Workers in rank 0's process, the other rank idling in a barrier meanwhile. */
async function inOneProcess(mode: ReductionMode, plan: Plan): Promise<StepFigures | undefined> {
  let figures: StepFigures | undefined;
  if (root) {
    let fcMs = 0;
    const trainer = await DataParallelTrainer.create({
      model,
      devices: RANKS,
      mode,
      plan,
      optimizer,
      onEvent: (e) => {
        if (spanKind(e) === "communication" && e.device === 0 && / fc$/.test(e.name)) fcMs += e.end - e.start;
      },
    });
    try {
      figures = await timeSteps((i) => trainer.step(batchFor(i)), () => fcMs);
    } finally {
      await trainer.close();
    }
  }
  await mpi.barrier("wait for the in-process run").wait(long());
  return figures;
}

/** Rank 0's stamp: the launcher's, or, started under mpirun by hand, its own (the peak then shares the cores). */
async function rankStamp(): Promise<BenchStamp> {
  const given = readStamp(Deno.env.get(STAMP_VARIABLE) ?? "");
  return "missing" in given ? await measureStamp(STAMP) : given;
}

if (root) {
  say("# The MPI transport on this machine");
  say();
  say(stampBlock(await rankStamp()));
}
say();
say(
  `Open MPI (${mpi.library.path}) with ${mpi.size} ranks on one host (shared-memory BTL \`vader\`), ` +
    `the ${
      cpuKernelsLabel(getBackend() as CpuBackend)
    }, one CPU device (a Worker) per rank. Written by \`bench/mpi_report.ts\`.`,
);

say();
say("## Training steps: sequential vs overlap across processes");
say();
say(
  `AlexNet-like default (1,088,458 parameters; FC gradients 4.2 MB), global batch ${GLOBAL_BATCH} ` +
    `(${
      GLOBAL_BATCH / RANKS
    } per device), ${TIMED} timed steps after ${WARMUP} warm-up steps: best and median ` +
    `step time, and per step (median) the communication time of rank 0's lane, the part of it hidden ` +
    `behind rank 0's compute, and the FC group's communication. "Workers" is the in-process runtime with ` +
    `${RANKS} Worker devices in one process on the same cores, for comparison.`,
);
say();
const stepRows: string[][] = [];
for (const mode of ["master", "allreduce"] as const) {
  const runs: [string, StepFigures | undefined][] = [];
  for (const plan of [sequentialPlan(["fc", "conv"]), overlapPlan(["fc", "conv"])]) {
    runs.push([`MPI, ${RANKS} processes`, await acrossProcesses(mode, plan)]);
    runs.push([`Workers, 1 process`, await inOneProcess(mode, plan)]);
  }
  for (const [index, [transport, f]] of runs.entries()) {
    if (!f) continue;
    const name = index < 2 ? "sequential" : "overlap";
    stepRows.push([
      mode,
      transport,
      name,
      `${f.bestMs.toFixed(0)} ms`,
      `${f.medianMs.toFixed(0)} ms`,
      `${f.commMs.toFixed(1)} ms`,
      `${f.hiddenMs.toFixed(1)} ms (${(100 * f.hiddenMs / (f.commMs || 1)).toFixed(0)}%)`,
      `${f.fcCommMs.toFixed(1)} ms`,
    ]);
  }
}
table(
  ["reduction", "transport", "schedule", "best step", "median step", "comm / step", "hidden", "FC comm"],
  stepRows,
);

say();
say("## Transfer bandwidth for FC-sized gradients");
say();
say(
  "Time from posting to completion on rank 0 (median of the timed repetitions, each after a barrier) and " +
    "the gradient's bytes over that time. Raw `MPI_Allreduce` is the blocking library call with `MPI_SUM`; " +
    "`MPI_Iallreduce`, polled is the same reduction driven by the transport's `MPI_Test` loop; " +
    "`MPI_Iallgather`, polled is the transfer the exact allreduce makes, alone; the " +
    "transport's allreduce mode (`MPI_Iallgather`, then the average in rank order on every rank) and " +
    "master mode (`MPI_Igather` to rank 0, the average there, `MPI_Ibcast` of the result) are what the " +
    "trainer runs per group: exact for any number of ranks, where MPI's own sum order is the library's choice.",
);
say();

const reference = await buildModel(model);
const fcFloats = layoutOf(reference.namedParameters()).groups.find((g) => g.name === "fc")!.size;
reference.dispose();
const sizes = [
  { label: "AlexNet-like FC", floats: fcFloats },
  { label: "16 MB", floats: 4 << 20 },
  { label: "64 MB", floats: 16 << 20 },
  { label: "AlexNet FC", floats: 58_631_144 },
];
const shared = (n: number) => new Float32Array(new SharedArrayBuffer(4 * n));
const bandwidthRows: string[][] = [];
let exactMatchesMpiSum = true;
for (const { label, floats } of sizes) {
  const send = shared(floats).map((_, i) => Math.fround((i % 1013) * 1e-3 + mpi.rank));
  const received = shared(floats), gathered = shared(floats * mpi.size), average = shared(floats);
  const slices = () =>
    Array.from({ length: mpi.size }, (_, r) => gathered.subarray(r * floats, (r + 1) * floats));
  const methods: [string, () => Promise<void>][] = [
    ["raw MPI_Allreduce (blocking)", () => Promise.resolve(mpi.allreduceSumBlocking(send, received))],
    ["MPI_Iallreduce, polled", () => mpi.allreduceSum(send, received).wait(long())],
    ["MPI_Iallgather, polled (the transfer alone)", () => mpi.allgather(send, gathered).wait(long())],
    ["transport, allreduce mode (exact)", async () => {
      await mpi.allgather(send, gathered).wait(long());
      averageInDeviceOrder(slices(), average);
    }],
    ["transport, master mode (exact)", async () => {
      await mpi.gather(send, root ? gathered : undefined, 0).wait(long());
      if (root) averageInDeviceOrder(slices(), average);
      await mpi.broadcast(average, 0).wait(long());
    }],
  ];
  const repetitions = floats > 20e6 ? 5 : 15;
  const results: number[] = [];
  for (const [, run] of methods) {
    const times: number[] = [];
    for (let i = 0; i <= repetitions; i++) {
      await mpi.barrier().wait(long());
      const started = performance.now();
      await run();
      if (i > 0) times.push(performance.now() - started); // the first one pays for page faults
    }
    results.push(median(times));
  }
  // For 2 ranks MPI's sum is one IEEE addition, which commutes: the exact average must match it.
  const scale = Math.fround(1 / mpi.size);
  for (let i = 0; i < floats && mpi.size === 2; i += 997) {
    if (Math.fround(received[i] * scale) !== average[i]) exactMatchesMpiSum = false;
  }
  const bytes = floats * 4;
  bandwidthRows.push([
    `${label} (${(bytes / 1e6).toFixed(1)} MB)`,
    ...results.map((ms) => `${ms.toFixed(1)} ms, ${(bytes / ms / 1e6).toFixed(2)} GB/s`),
    `${(100 * results[0] / results[2]).toFixed(0)}% / ${(100 * results[0] / results[3]).toFixed(0)}%`,
  ]);
}
table(
  [
    "gradient",
    ...[
      "raw MPI_Allreduce",
      "MPI_Iallreduce, polled",
      "MPI_Iallgather, polled",
      "allreduce mode",
      "master mode",
    ],
    "raw vs transfer / vs allreduce mode",
  ],
  bandwidthRows,
);
say();
say(
  "The last column divides raw `MPI_Allreduce`'s time by the transport's transfer alone and by its whole " +
    "exact allreduce: 100% is as fast as the library's blocking call, more is faster. " +
    `The exact averages ${exactMatchesMpiSum ? "equal" : "DIFFER from"} MPI_SUM x 1/2 bit for bit (2 ranks).`,
);

if (root) {
  const path = new URL("./MPI.md", import.meta.url).pathname;
  await writeFileAtomic(path, [new TextEncoder().encode(`${lines.join("\n")}\n`)]);
  // Wrapped to the repository's line width, so the file passes `deno fmt --check` as written.
  await new Deno.Command(Deno.execPath(), { args: ["fmt", "--quiet", path], stdout: "null", stderr: "null" })
    .output();
  console.log("\nwritten to bench/MPI.md");
}
mpi.finalize();
Deno.exit(0);
