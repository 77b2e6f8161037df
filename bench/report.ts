/**
 * Side-by-side report: Tandem's CPU kernels and training step against the peers a user would pick
 * instead (TensorFlow.js 4.22.0 on its pure-JS CPU backend and on its WebAssembly backend, XNNPACK,
 * SIMD, one thread), all measured in this one run, plus the data-parallel schedule figures from
 * `bench/SCHEDULE.md` and `bench/ALEXNET_SCALING.md` (read, not rerun: each only when its stamp is there
 * and the code it measured is unchanged, else one line says why; `bench/stamp.ts`). Prints the tables
 * and writes `bench/RESULTS.md` atomically, stamped at its top.
 *
 * Tandem appears as its default CPU backend (generated WebAssembly SIMD kernels, one thread per
 * core), the same kernels on one thread, on one thread with plain SIMD128 (no relaxed-SIMD fused
 * multiply-add, as on runtimes without it), and its pure-TypeScript kernels.
 *
 * The report first measures the machine's 128-bit WebAssembly peak (`backends/cpu/wasm/peak.ts`,
 * one thread and all cores) and states it at the top; every GEMM figure is the best and the median
 * of 5 warm calls (tfjs-cpu: fewer, as noted), each also as a percentage of the peak of its thread
 * count.
 *
 * The training steps of the AlexNet-like default and of cifar10_quick also run beside PyTorch
 * (`bench/peers/steps.ts`, through `bench/peers/pytorch.ts`: Debian's python3-torch 1.13, CPU): Tandem
 * on one device and on 2 devices (`DataParallelTrainer`, overlap, shared memory) against PyTorch in one
 * process and as DistributedDataParallel over gloo with 2 processes on loopback. Run as root, it
 * installs python3-torch and libopenblas0-pthread with apt-get where missing; without them those rows
 * say why.
 *
 * Then it profiles those two steps on one device (`bench/kernels/op_profile.ts`): time, calls and GFLOP/s per
 * category of backend call (GEMM, convolution, pooling, LRN, elementwise, softmax, optimizer, copies,
 * allocation), the rest of the step outside the kernels, and the step's time over what its GEMM and
 * convolution FLOPs would take at the measured 1024³ GEMM rate.
 *
 * Run: `npx deno task bench:report` (a few minutes, most of it tfjs-cpu's one cifar10_quick step and
 * tfjs-wasm's slow transposed FC products). `--skip-slow` leaves out the tfjs-cpu training step.
 * `--only pytorch` runs only the PyTorch section (about 15 s) and prints it without writing
 * `bench/RESULTS.md`.
 *
 * It stays one file although long: it is the report itself, written top to bottom in the order of
 * its sections; what measures lives apart (`bench/kernels/`, `bench/peers/`, `bench/stamp.ts`).
 *
 * @module
 */

import { CpuBackend } from "../backends/cpu/backend.ts";
import { describeWasmFeatures } from "../backends/cpu/wasm/features.ts";
import { measureWasmPeak, type WasmPeak } from "../backends/cpu/wasm/peak.ts";
import { describeMachineBlocks, machineGemmBlocks } from "../backends/cpu/wasm/blocking.ts";
import { GEMM_TILE } from "../backends/cpu/wasm/gemm.ts";
import { cpuModel, measureStamp, readForEmbedding, repositoryState, stampBlock } from "./stamp.ts";
import { getBackend, registerBackend, SGD, tensor, trainStep } from "../mod.ts";
import { builtinModels } from "../engine/models/mod.ts";
import { writeFileAtomic } from "../engine/io/mod.ts";
import {
  CATEGORY_LABELS,
  OP_CATEGORIES,
  type OpCategory,
  OpProfiler,
  stepBreakdown,
  type StepBreakdownRow,
  withBackend,
} from "./kernels/op_profile.ts";
import { BATCH, PEER_NETS, peerBatch, type PeerNet, pytorchSection } from "./peers/steps.ts";
import { checkConvRewrite, cifarQuickStep, tf, TFJS_VERSION, useBackend } from "./peers/tfjs.ts";
import {
  FC_SHAPES,
  gemmFlops,
  gemmGflops,
  type GemmShape,
  peakFor,
  percentOfPeak,
  squareShape,
} from "./kernels/gemm_shapes.ts";
import {
  type CallTimes,
  cifarQuickStepSeconds,
  gemmDrift,
  MEMORY_PROBE_BYTES,
  memoryReadRate,
  type PairedSpeedup,
  pairedSpeedups,
  tandemGemmSeconds,
  tfGemmSeconds,
  TIMED_CALLS,
  warmGemm,
} from "./kernels/kernel_timing.ts";

/**
 * Rounds behind the paired scaling column ({@link pairedSpeedups}: one pair of calls of every product
 * per round): 21, about 20 s in all here, so that each product's pairs span many of the machine's
 * stretches (seconds long, see the drift lines). 9 pairs of one product back to back spanned from a
 * fraction of a second to 3 s, and its median fell on whichever stretch that was (the FC input gradient
 * 1.81× and 1.87× in two runs, 1.91× in another process of the same code).
 */
const PAIRED_CALLS = 21;

const started = performance.now();
const skipSlow = Deno.args.includes("--skip-slow");
const onlyIndex = Deno.args.indexOf("--only");
const only = onlyIndex >= 0 ? Deno.args[onlyIndex + 1] : undefined;
if (onlyIndex >= 0 && only !== "pytorch") {
  console.error(`report: --only takes "pytorch", got ${only === undefined ? "nothing" : `"${only}"`}`);
  Deno.exit(2);
}
/** tfjs-cpu GEMMs predicted (from its 1024³ rate) to take longer than this are skipped. */
const TFJS_CPU_GEMM_LIMIT_S = 20;
/** A tfjs-cpu training step slower than this is timed once. */
const TFJS_CPU_STEP_LIMIT_S = 60;

// ---------------------------------------------------------------- machine

/** The files this report embeds (read, not rerun), checked before anything is measured. */
const EMBEDDED = {
  schedule: { file: "bench/SCHEDULE.md", command: "npx deno task bench:schedule" },
  scaling: { file: "bench/ALEXNET_SCALING.md", command: "npx deno task bench:alexnet" },
} as const;
if (only === undefined) {
  for (const { file, command } of Object.values(EMBEDDED)) {
    const { refusal } = await readForEmbedding(file, command, repositoryState());
    if (refusal) console.error(`report: ${refusal}`);
  }
}

const machine = {
  cores: navigator.hardwareConcurrency,
  cpu: cpuModel(),
  deno: Deno.version.deno,
  v8: Deno.version.v8,
  os: `${Deno.build.os} ${Deno.build.arch}`,
};

// ---------------------------------------------------------------- Tandem backends

/** The default backend `mod.ts` registered: WebAssembly kernels, one thread per core. */
const tandemDefault = getBackend() as CpuBackend;
const tandemOne = new CpuBackend({ name: "cpu-wasm-1-thread", threads: 1 });
const tandemSimd128 = new CpuBackend({ name: "cpu-wasm-simd128-1-thread", threads: 1, relaxedSimd: false });
const tandemTs = new CpuBackend({ name: "cpu-typescript", kernels: "ts" });
for (const backend of [tandemOne, tandemSimd128, tandemTs]) registerBackend(backend);
const tandemThreads = await tandemDefault.startThreads();
const runtimeLine = `${describeWasmFeatures()}; the default backend's GEMM uses ${
  tandemDefault.fusedMultiplyAdd
    ? "the fused `f32x4.relaxed_madd`"
    : "`f32x4.mul` + `f32x4.add` (no relaxed SIMD)"
} on ${tandemThreads} thread${tandemThreads > 1 ? "s" : ""}`;
console.log(`WebAssembly: ${runtimeLine}`);

if (only === "pytorch") {
  console.log(`\n## Training steps beside PyTorch\n\n${await pytorchSection(tandemThreads)}\n`);
  console.log(
    `Machine: ${machine.cores} cores, ${machine.cpu}, Deno ${machine.deno}; ` +
      `took ${((performance.now() - started) / 1000).toFixed(0)} s. bench/RESULTS.md not written (--only).`,
  );
  for (const backend of [tandemDefault, tandemOne, tandemSimd128, tandemTs]) backend.dispose();
  Deno.exit(0);
}

// ---------------------------------------------------------------- peak

console.log("Peak: measuring this machine's 128-bit WebAssembly peak (backends/cpu/wasm/peak.ts) …");
// The stamp measures the peak; measureWasmPeak then returns that same measurement.
const stamp = await measureStamp({
  file: "bench/RESULTS.md",
  command: "npx deno task bench:report",
  sources: [
    "bench/report.ts",
    "bench/kernels/op_profile.ts",
    "bench/kernels/kernel_timing.ts",
    "bench/kernels/gemm_shapes.ts",
    "bench/peers",
  ],
});
let peak: WasmPeak | undefined;
let peakLine: string;
try {
  peak = await measureWasmPeak();
  const op = peak.fma ? "`f32x4.relaxed_madd`" : "`f32x4.mul` + `f32x4.add` (no relaxed SIMD here)";
  peakLine = `**${peak.perCore.toFixed(1)} GFLOP/s on 1 thread, ${peak.allCores.toFixed(1)} GFLOP/s on ` +
    `${peak.threads} thread${peak.threads > 1 ? "s" : ""} at once** (\`backends/cpu/wasm/peak.ts\`: ` +
    `${peak.shape.chains} independent ${op} accumulator chains in registers, no memory traffic, 8 flops per ` +
    "f32x4 multiply-add; best of 5 calls of about 80 ms after a warm-up on this thread, and for all threads " +
    "one Worker per core started together by a shared gate, their rates summed, best of 5 rounds).";
} catch (error) {
  peakLine = `not measured (${(error as Error).message}); the percentages of peak below are left blank.`;
}
console.log(`Peak: ${peakLine}`);

// How far this machine drifts: one product, the same operands, for 10 s in 0.5 s windows, on 1 thread and
// then on both: the cores a VM is lent need not be free at once (on the 2-core EPYC, 2026-12-04, a 512³
// product ran at 57 to 104 GFLOP/s on 2 threads in windows of 0.5 s, in stretches of seconds, where 1 thread
// mostly held 48 to 53), so a ratio of 2 threads to 1 is only as steady as the second range.
const driftOf = (backend: CpuBackend, threads: number, peakRate: number | undefined): string => {
  console.log(`Drift: one 512³ product on ${threads} thread${threads > 1 ? "s" : ""} for 10 s …`);
  const drift = gemmDrift(backend, squareShape(512), 10, 0.5);
  const sorted = [...drift.windows].sort((a, b) => a - b);
  const g = (x: number) => x.toFixed(1);
  const pct = (x: number) => (peakRate ? ` (${percentOfPeak(x, peakRate)})` : "");
  return `on ${threads} thread${threads > 1 ? "s" : ""} ${g(sorted[0])}${pct(sorted[0])} to ${
    g(sorted.at(-1)!)
  }${pct(sorted.at(-1)!)} GFLOP/s (median ${g(sorted[Math.floor(sorted.length / 2)])})`;
};
const driftLines = [driftOf(tandemOne, 1, peak?.perCore)];
if (tandemThreads > 1) driftLines.push(driftOf(tandemDefault, tandemThreads, peak?.allCores));
const driftLine = `a 512³ product, back to back for 10 s on the same operands, ran in windows of 0.5 s ` +
  `${driftLines.join("; ")}: the spread is the machine's, not the code's, and every comparison below is ` +
  "only as fine as it";
console.log(`Drift: ${driftLine}`);
// Memory read at the start and (below) at the end: steps move with it where GEMM does not.
const memoryAtStart = memoryReadRate(tandemOne);
console.log(`GEMM blocks: ${describeMachineBlocks(machineGemmBlocks())}`);

// ---------------------------------------------------------------- GEMM

const SHAPES: GemmShape[] = [squareShape(256), squareShape(512), squareShape(1024), ...FC_SHAPES];

const flops = gemmFlops;

interface GemmRow {
  shape: GemmShape;
  /** Calls of the default backend (all threads), one thread, one thread SIMD128 only, TypeScript. */
  threaded: CallTimes;
  one: CallTimes;
  simd128: CallTimes;
  ts: CallTimes;
  wasm: CallTimes;
  cpu: CallTimes | null;
  cpuNote: string;
  /** All threads over one thread, from calls taken in turn (`pairedSpeedups`). */
  scaling: PairedSpeedup;
}

console.log(`GEMM: Tandem (WebAssembly ${tandemThreads} threads, 1 thread, SIMD128 only, TypeScript) …`);
const tandemSeconds = SHAPES.map((s) => ({
  threaded: tandemGemmSeconds(tandemDefault, s),
  one: tandemGemmSeconds(tandemOne, s),
  simd128: tandemGemmSeconds(tandemSimd128, s),
  ts: tandemGemmSeconds(tandemTs, s),
}));
console.log(`GEMM: ${tandemThreads} threads over 1, ${PAIRED_CALLS} rounds of pairs …`);
const scalings = pairedSpeedups(tandemDefault, tandemOne, SHAPES, PAIRED_CALLS);
console.log("GEMM: tfjs-wasm (XNNPACK, SIMD, 1 thread) …");
await useBackend("wasm");
const wasmSimd = tf.env().getBool("WASM_HAS_SIMD_SUPPORT");
const wasmSeconds = SHAPES.map((s) => tfGemmSeconds(s));
console.log("GEMM: tfjs-cpu (pure JS) …");
await useBackend("cpu");
const gemmRows: GemmRow[] = [];
let cpuRate = 0; // GFLOP/s measured at the largest square shape, for predictions
SHAPES.forEach((s, i) => {
  let cpu: CallTimes | null = null, cpuNote = "";
  const square = s.m === s.n && s.n === s.k;
  const predicted = cpuRate > 0 ? flops(s) / (cpuRate * 1e9) : 0;
  if (!square && predicted > TFJS_CPU_GEMM_LIMIT_S) {
    cpuNote = `skipped: one call predicted ≈ ${predicted.toFixed(0)} s from its 1024³ rate`;
  } else {
    const small = flops(s) < 1e8;
    cpu = tfGemmSeconds(s, small ? 3 : 1, small);
    cpuNote = small ? "best / median of 3 after a warm-up" : "one call, no warm-up";
    if (square) cpuRate = gemmGflops(s, cpu.best);
  }
  gemmRows.push({ shape: s, ...tandemSeconds[i], scaling: scalings[i], cpu, cpuNote, wasm: wasmSeconds[i] });
});

const fmtG = (x: number) => (x >= 10 ? x.toFixed(1) : x.toFixed(2));
const fmtRatio = (x: number) =>
  (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x >= 0.1 ? x.toFixed(2) : x.toPrecision(2)) + "×";
const square512 = gemmRows.find((r) => r.shape.m === 512 && r.shape.n === 512)!;
/** "best / median GFLOP/s (best / median % of the peak of `threads` threads)"; one figure for one call. */
/** The highest best-call share of its peak in the table (above 1: the probe ran on a busier machine). */
let highestShare = 0;
const gemmCell = (shape: GemmShape, t: CallTimes, threads: number) => {
  const b = gemmGflops(shape, t.best), m = gemmGflops(shape, t.median);
  const p = peak ? peakFor(peak, threads) : undefined;
  if (p) highestShare = Math.max(highestShare, b / p);
  return t.seconds.length > 1
    ? `${fmtG(b)} / ${fmtG(m)} (${percentOfPeak(b, p)} / ${percentOfPeak(m, p)})`
    : `${fmtG(b)} (${percentOfPeak(b, p)})`;
};

const gemmTable = [
  `| product (M×N×K) | GFLOP | Tandem ${tandemThreads} threads | Tandem 1 thread | 1 thread, SIMD128 only | Tandem TypeScript | tfjs-wasm | tfjs-cpu | 1 thread / tfjs-wasm | SIMD128 only / tfjs-wasm | ${tandemThreads} threads / 1 thread | ${tandemThreads} threads / 1 thread, paired (range) | 1 thread / its 512³ | tfjs-cpu note |`,
  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
  ...gemmRows.map((r) => {
    // Ratios of medians.
    const g = (t: CallTimes, shape = r.shape) => gemmGflops(shape, t.median);
    const { m, n, k } = r.shape;
    const name = r.shape.name.includes(`${m}×${n}×${k}`) ? r.shape.name : `${r.shape.name} (${m}×${n}×${k})`;
    return `| ${name} | ${(flops(r.shape) / 1e9).toFixed(2)} | ${
      gemmCell(r.shape, r.threaded, tandemThreads)
    } | ${gemmCell(r.shape, r.one, 1)} | ${gemmCell(r.shape, r.simd128, 1)} | ${
      gemmCell(r.shape, r.ts, 1)
    } | ${gemmCell(r.shape, r.wasm, 1)} | ${r.cpu === null ? "—" : gemmCell(r.shape, r.cpu, 1)} | ${
      fmtRatio(g(r.one) / g(r.wasm))
    } | ${fmtRatio(g(r.simd128) / g(r.wasm))} | ${fmtRatio(g(r.threaded) / g(r.one))} | ${
      fmtRatio(r.scaling.median)
    } (${r.scaling.low.toFixed(2)}–${fmtRatio(r.scaling.high)}) | ${
      (g(r.one) / g(square512.one, square512.shape)).toFixed(2)
    } | ${r.cpuNote} |`;
  }),
].join("\n");
console.log("\n" + gemmTable + "\n");
const overPeakNote = highestShare > 1
  ? ` Some figures exceed 100% of the peak (up to ${
    (100 * highestShare).toFixed(1)
  }%): the probe ran while ` +
    "this machine was busier (it is shared) than during those calls; rerun on a quiet machine."
  : "";
if (overPeakNote) console.log(`Peak:${overPeakNote}`);

// ---------------------------------------------------------------- training step

console.log(`cifar10_quick step: Tandem (WebAssembly ${tandemThreads} threads, 1 thread, TypeScript) …`);
// Untimed steps before the timed ones, for Tandem and tfjs-wasm alike (tfjs-cpu's minutes-long step excepted).
const STEP_WARMUP = 3;
const tandemSteps = await cifarQuickStepSeconds(tandemDefault.name, BATCH, 5, STEP_WARMUP);
const tandemOneSteps = await cifarQuickStepSeconds(tandemOne.name, BATCH, 5, STEP_WARMUP);
const tandemTsSteps = await cifarQuickStepSeconds(tandemTs.name, BATCH, 3, STEP_WARMUP);

console.log("cifar10_quick step: tfjs-wasm with conv gradients rewritten as forward convs …");
const rewriteError = checkConvRewrite(); // on tfjs-cpu, against tfjs's own conv gradients
await useBackend("wasm");
const wasmNet = cifarQuickStep(BATCH, { rewriteConvGrads: true });
const timeStep = (step: () => number) => {
  const t0 = performance.now();
  step();
  return (performance.now() - t0) / 1000;
};
for (let i = 0; i < STEP_WARMUP; i++) timeStep(wasmNet.step);
const wasmSteps = [0, 1, 2, 3, 4].map(() => timeStep(wasmNet.step));
wasmNet.dispose();
let wasmAsShipped = "";
try {
  const shipped = cifarQuickStep(BATCH, { rewriteConvGrads: false });
  try {
    shipped.step();
    wasmAsShipped = "trains as shipped";
  } finally {
    shipped.dispose();
  }
} catch (error) {
  wasmAsShipped = `fails as shipped: ${(error as Error).message}`;
}

let cpuSteps: number[] = [];
let cpuNote = "";
if (skipSlow) {
  cpuNote = "not run (--skip-slow)";
} else {
  console.log("cifar10_quick step: tfjs-cpu (expect minutes) …");
  await useBackend("cpu");
  const cpuNet = cifarQuickStep(BATCH, { rewriteConvGrads: false });
  cpuSteps = [timeStep(cpuNet.step)];
  if (cpuSteps[0] > TFJS_CPU_STEP_LIMIT_S) {
    cpuNote = `one step timed (cold, it took more than ${TFJS_CPU_STEP_LIMIT_S} s)`;
  } else {
    cpuSteps = [0, 1, 2].map(() => timeStep(cpuNet.step));
    cpuNote = "best of 3 after the first step";
  }
  cpuNet.dispose();
}

const best = (xs: number[]) => Math.min(...xs);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const tT = best(tandemSteps), tW = best(wasmSteps);
const fmtS = (s: number) => (s >= 10 ? `${s.toFixed(1)} s` : `${(s * 1000).toFixed(0)} ms`);
const tandemRow = (label: string, steps: number[], how: string) =>
  `| ${label} | ${fmtS(best(steps))} | ${fmtS(median(steps))} | ${(BATCH / best(steps)).toFixed(0)} | ${
    fmtRatio(best(steps) / tT)
  } | ${fmtRatio(tW / best(steps))} | ${how} |`;
const trainTable = [
  "| implementation | step time (best) | median | images/s | time / Tandem default | tfjs-wasm time / this | how timed |",
  "|---|---:|---:|---:|---:|---:|---|",
  tandemRow(
    `**Tandem default CPU backend**: WebAssembly SIMD kernels, ${tandemThreads} threads, 1 device (\`trainStep\`, SGD momentum 0.9, wd 5e-4)`,
    tandemSteps,
    `best of 5 after ${STEP_WARMUP} warm-up steps`,
  ),
  tandemRow(
    "Tandem, WebAssembly SIMD kernels, 1 thread",
    tandemOneSteps,
    `best of 5 after ${STEP_WARMUP} warm-up steps`,
  ),
  tandemRow(
    'Tandem, pure-TypeScript kernels (`kernels: "ts"`), 1 thread',
    tandemTsSteps,
    `best of 3 after ${STEP_WARMUP} warm-up steps`,
  ),
  `| tfjs-wasm ${TFJS_VERSION}, SIMD ${
    wasmSimd ? "on" : "off"
  }, 1 thread, **conv gradients rewritten as forward convs** (tf.customGrad), momentum SGD | ${fmtS(tW)} | ${
    fmtS(median(wasmSteps))
  } | ${(BATCH / tW).toFixed(0)} | ${
    fmtRatio(tW / tT)
  } | 1× | best of 5 after ${STEP_WARMUP} warm-up steps |`,
  cpuSteps.length
    ? `| tfjs-cpu ${TFJS_VERSION} (pure JS, tfjs's own autograd), momentum SGD | ${fmtS(best(cpuSteps))} | ${
      fmtS(median(cpuSteps))
    } | ${(BATCH / best(cpuSteps)).toFixed(2)} | ${fmtRatio(best(cpuSteps) / tT)} | ${
      fmtRatio(tW / best(cpuSteps))
    } | ${cpuNote} |`
    : `| tfjs-cpu ${TFJS_VERSION} | — | — | — | — | — | ${cpuNote} |`,
].join("\n");
const trainNotes = [
  `tfjs-wasm ${
    wasmAsShipped.replace(/\s+/g, " ")
  }. The rewrite computes the weight gradient as a forward conv of the ` +
  "input with dy (batch and channels swapped) and the input gradient as a forward conv of dy with the flipped, " +
  "channel-swapped weights; on tfjs-cpu it matches tfjs's own conv gradients within " +
  `${rewriteError.toExponential(1)} relative (checked in this run).`,
  'Both peers run the same architecture in tfjs ops (NHWC; pools with "same" padding give Caffe\'s ceil-mode ' +
  "sizes 16, 8, 4; ip1 reads Caffe's C×H×W order), softmax cross-entropy, batch 64 of synthetic data. " +
  "tfjs-wasm runs one thread: its threaded build needs a browser's cross-origin isolation and does not " +
  "start in Deno.",
].join("\n\n");
console.log("\n" + trainTable + "\n\n" + trainNotes + "\n");

const peerSection = await pytorchSection(tandemThreads);
console.log("\n" + peerSection + "\n");

// ---------------------------------------------------------------- where the step's time goes

/** Warm-up and timed steps of each net's profile (each of the plain and the profiled copy). */
const PROFILE_WARMUP = 3, PROFILE_TIMED = 10;

/** Section 1's 1024³ product on the default backend: its median call's rate prices a step's FLOPs. */
const gemm1024 = gemmRows.find((r) => r.shape.m === 1024 && r.shape.n === 1024 && r.shape.k === 1024)!;
const gemmRate = gemmGflops(gemm1024.shape, gemm1024.threaded.median);

/** One net's profile: the rows of {@link stepBreakdown} and the step times with and without the wrapper. */
interface NetProfile {
  net: PeerNet;
  rows: StepBreakdownRow[];
  /** Milliseconds of each timed step on the default backend itself. */
  plainMs: number[];
  /** Milliseconds of each timed step through the profiler. */
  profiledMs: number[];
  /** Categories with no calls in the timed steps (left out of the table). */
  absent: OpCategory[];
  /** Seconds of each 1024³ product timed between the timed steps (the rate of the same stretch). */
  gemmSeconds: number[];
}

/**
 * Profiles `trainStep` of `net` on the default backend: two copies of the net built from the same
 * seeds, one on the backend itself and one on an {@link OpProfiler} wrapping it, step in turn (the
 * order swapped every step), so both see the same machine; the profiler counts only the timed steps.
 * After each timed pair one {@link gemm1024} product runs on the same backend, so that the GEMM rate
 * a step is priced at comes from the same stretch of the machine as the step (its speed moves by a
 * fifth between sections of one report).
 */
async function profileNet(net: PeerNet): Promise<NetProfile> {
  const profiler = new OpProfiler(tandemDefault, { name: `${tandemDefault.name}-profiled` });
  const batch = peerBatch(net);
  const build = () => {
    const model = builtinModels[net.name].create();
    return {
      model,
      images: tensor(batch.images, { shape: batch.shape }),
      labels: tensor(batch.labels, { dtype: "int32" }),
      optimizer: new SGD(model.namedParameters(), net.sgd),
    };
  };
  const plain = build();
  const profiled = await withBackend(profiler.backend, build);
  const gemm = warmGemm(tandemDefault, gemm1024.shape);
  const gemmSeconds: number[] = [];
  const timed = async (run: typeof plain) => {
    const t0 = performance.now();
    await trainStep(run.model, run.optimizer, { images: run.images, labels: run.labels });
    return performance.now() - t0;
  };
  const plainMs: number[] = [], profiledMs: number[] = [];
  try {
    for (let i = 0; i < PROFILE_WARMUP + PROFILE_TIMED; i++) {
      if (i === PROFILE_WARMUP) profiler.reset();
      const keep = i >= PROFILE_WARMUP;
      const runPlain = async () => {
        const ms = await timed(plain);
        if (keep) plainMs.push(ms);
      };
      const runProfiled = async () => {
        const ms = await withBackend(profiler.backend, () => timed(profiled));
        if (keep) profiledMs.push(ms);
      };
      if (i % 2 === 0) {
        await runPlain();
        await runProfiled();
      } else {
        await runProfiled();
        await runPlain();
      }
      if (keep) {
        const t0 = performance.now();
        gemm.product();
        gemmSeconds.push((performance.now() - t0) / 1000);
      }
    }
  } finally {
    gemm.release();
    for (const run of [plain, profiled]) {
      run.optimizer.dispose();
      run.model.dispose();
      run.images.dispose();
      run.labels.dispose();
    }
  }
  const profile = profiler.snapshot();
  const rows = stepBreakdown(profile, PROFILE_TIMED, profiledMs.reduce((s, x) => s + x, 0));
  const absent = OP_CATEGORIES.filter((c) => profile.categories[c].calls === 0);
  return { net, rows, plainMs, profiledMs, absent, gemmSeconds };
}

/** The section "Where the step's time goes": one table per net of {@link PEER_NETS}, then notes. */
async function profileSection(threads: number): Promise<string> {
  const p = peak ? peakFor(peak, threads) : undefined;
  const ms = (x: number) => (Math.abs(x) >= 10 ? x.toFixed(1) : x.toFixed(2));
  const parts: string[] = [];
  const overheads: string[] = [], absent: string[] = [];
  let messages = true;
  for (const net of PEER_NETS) {
    console.log(`${net.title} step: per-op profile (${threads} threads, with and without the profiler) …`);
    const r = await profileNet(net);
    messages &&= r.absent.includes("messages");
    const left = r.absent.filter((c) => c !== "messages" && c !== "other").map((c) => CATEGORY_LABELS[c]);
    if (left.length) absent.push(`${net.title}: ${left.join(", ")}`);
    const meanStep = r.profiledMs.reduce((s, x) => s + x, 0) / r.profiledMs.length;
    const table = [
      `| category | ms per step | % of step | calls per step | GFLOP/s | % of ${threads}-thread peak |`,
      "|---|---:|---:|---:|---:|---:|",
      ...r.rows.map((row) =>
        `| ${row.label} | ${ms(row.msPerStep)} | ${(100 * row.share).toFixed(1)}% | ${
          row.category === "outside" ? "—" : Number(row.callsPerStep.toFixed(1))
        } | ${row.gflops === undefined ? "—" : fmtG(row.gflops)} | ${
          row.gflops === undefined ? "—" : percentOfPeak(row.gflops, p)
        } |`
      ),
      `| **step, through the profiler (mean)** | ${ms(meanStep)} | 100% | ${
        Number(r.rows.reduce((s, row) => s + row.callsPerStep, 0).toFixed(1))
      } | | |`,
    ].join("\n");
    const flops = r.rows.reduce((s, row) => s + row.flopsPerStep, 0);
    const gemmFlopsPerStep = r.rows.find((row) => row.category === "gemm")?.flopsPerStep ?? 0;
    const convFlopsPerStep = r.rows.find((row) => row.category === "convolution")?.flopsPerStep ?? 0;
    const atGemmRate = flops / (gemmRate * 1e6); // ms
    const localRate = gemmGflops(gemm1024.shape, median(r.gemmSeconds));
    const atLocalRate = flops / (localRate * 1e6); // ms
    const b = best(r.plainMs), m = median(r.plainMs);
    const overhead = median(r.profiledMs) / m - 1;
    overheads.push(
      `${net.title} ${ms(m)} → ${ms(median(r.profiledMs))} ms (${overhead >= 0 ? "+" : ""}${
        (100 * overhead).toFixed(1)
      }%)`,
    );
    const line =
      `Step FLOPs (GEMM + convolution, counted): ${(flops / 1e9).toFixed(3)} GFLOP (GEMM ${
        (gemmFlopsPerStep / 1e9).toFixed(3)
      }, convolution ${(convFlopsPerStep / 1e9).toFixed(3)}). Step without the profiler: best ${ms(b)} ms, ` +
      `median ${ms(m)} ms. Those FLOPs at the GEMM rate of the same stretch (${gemm1024.shape.name}, ` +
      `timed between these steps: ${fmtG(localRate)} GFLOP/s, ${
        percentOfPeak(localRate, p)
      } of the peak) take ${ms(atLocalRate)} ms: **step / (FLOPs at the GEMM rate) = ${
        (m / atLocalRate).toFixed(2)
      }× at the median, ${
        (b / atLocalRate).toFixed(2)
      }× at the best** (target ≤ 1.4×); at section 1's rate (${fmtG(gemmRate)} GFLOP/s, ${
        ms(atGemmRate)
      } ms) ${(m / atGemmRate).toFixed(2)}× and ${(b / atGemmRate).toFixed(2)}×.`;
    parts.push(`### ${net.title}\n\n${table}\n\n${line}`);
  }
  const notes = [
    `Each backend call of \`trainStep\` on one device, batch 64, the default backend (${threads} threads), ` +
    "timed with `performance.now()` around the call by a wrapper (`bench/kernels/op_profile.ts`, a Proxy over the " +
    "backend). The CPU backend's kernels are synchronous — its kernel threads are woken through shared " +
    "memory and `Atomics` inside the call and have finished when it returns — so a call's time is the " +
    `kernel's. Two copies of each net, built from the same seeds, one on the backend itself and one on ` +
    `the wrapper, step in turn (the order swapped every step), ${PROFILE_WARMUP} warm-up steps each, then ` +
    `${PROFILE_TIMED} timed; ms and calls per step are means over the ${PROFILE_TIMED} profiled steps, ` +
    "% of step is of their mean.",
    "GEMM is `matmul` (the fully connected layers); convolution is the three convolution calls " +
    "(forward, input gradient, filter gradient), whose WebAssembly kernels pack im2col panels, or for " +
    "3×3 and 5×5 stride-1 layers with at least 8 channels transform Winograd F(4×4, r×r) tiles, inside " +
    "the call, so that row is GEMM and packing or transforms together. GFLOP/s counts 2·batch·m·n·k per " +
    "product and 2·N·outC·outH·outW·(inC/groups)·kH·kW per convolution pass (the direct convolution's " +
    "FLOPs, whichever algorithm ran: Winograd's multiplications are 4× (3×3) to 6.25× (5×5) fewer, so " +
    "its rate is an effective one and can pass the peak), over the time inside those calls, and " +
    `is shown as a share of the measured ${threads}-thread peak. Elementwise is unary, binary (bias adds, ` +
    "ReLU gradients, applying dropout masks), reduce, fill and drawing dropout masks (`dropoutMask`); copies are copyStrided, upload, read/readSync, " +
    "write and view; allocation is allocate, allocateUninitialized and release. Outside kernels is the " +
    "step's time minus the time inside backend calls: the engine's JavaScript (autograd graph, tensor " +
    "bookkeeping), and the profiler's own timing.",
    (messages
      ? "One device sends no Worker or device messages: that category (synchronize, stageToHost, " +
        "averageInOrder) had no calls in either net, and the kernel threads' wake-ups are inside each " +
        "kernel's row."
      : "Device messages (synchronize, stageToHost, averageInOrder) are in their own row.") +
    (absent.length ? ` Categories with no calls are left out of a table (${absent.join("; ")}).` : ""),
    `The GEMM rate is the median of ${PROFILE_TIMED} ${gemm1024.shape.name} products on ${threads} threads, ` +
    "one after each timed pair of steps of the net, so that it and the step sample the same stretch of the " +
    `machine; section 1's median of the same product (${fmtG(gemmRate)} GFLOP/s, ${
      percentOfPeak(gemmRate, p)
    } of the peak) is given beside it. The ratio divides the step without the profiler by the time its ` +
    "counted (direct-convolution) FLOPs would take at that rate, the issue's target being " +
    `1.4× at most. The profiler's overhead, median step without → with it: ${overheads.join("; ")}.`,
  ].join("\n\n");
  return `${parts.join("\n\n")}\n\n${notes}`;
}

const profileSectionText = await profileSection(tandemThreads);
console.log("\n" + profileSectionText + "\n");

// ---------------------------------------------------------------- schedule figures (read, not rerun)

/** Demotes Markdown headings by `levels` so an included file nests under this report's sections. */
const demote = (text: string, levels: number) =>
  text.replace(/^(#+) /gm, (_, hashes: string) => "#".repeat(Math.min(6, hashes.length + levels)) + " ");

// A file whose stamp is missing, or whose measured code changed since, is not embedded: the section
// says why in one line (bench/stamp.ts).
const schedule = await readForEmbedding(EMBEDDED.schedule.file, EMBEDDED.schedule.command, repositoryState());
const scheduleSection = schedule.refusal === undefined
  ? [
    `Included from \`bench/SCHEDULE.md\` (its own stamp below: not rerun by this report, so its figures ` +
    "come from that run, on the code it names, not this one).",
    "",
    demote(schedule.text.trim(), 2),
  ].join("\n")
  : `Not included: ${schedule.refusal}.`;
if (schedule.refusal) console.error(`report: ${schedule.refusal}`);

const scaling = await readForEmbedding(EMBEDDED.scaling.file, EMBEDDED.scaling.command, repositoryState());
let scalingSection: string;
if (scaling.refusal === undefined) {
  const lines = scaling.text.split("\n");
  const tableStart = lines.findIndex((l) => l.startsWith("|"));
  const intro = lines.slice(1, tableStart).join("\n").trim();
  const table = lines.slice(tableStart).filter((l) => l.startsWith("|"));
  const shown = table.slice(0, 2 + 14); // header, rule and the first link's master and allreduce rows
  scalingSection = [
    `First ${shown.length - 2} of ${table.length - 2} rows of \`bench/ALEXNET_SCALING.md\` (its own ` +
    "stamp below; not rerun here). Simulator predictions, not measurements.",
    "",
    intro,
    "",
    ...shown,
  ].join("\n");
} else {
  scalingSection = `Not included: ${scaling.refusal}.`;
  console.error(`report: ${scaling.refusal}`);
}

// ---------------------------------------------------------------- write

const memoryAtEnd = memoryReadRate(tandemOne);
const memoryLine = `One thread read memory (a ${(MEMORY_PROBE_BYTES / 1e6).toFixed(0)} MB array summed, ` +
  `best / median of ${TIMED_CALLS} calls) at ${memoryAtStart.best.toFixed(1)} / ` +
  `${memoryAtStart.median.toFixed(1)} GB/s at the start of the run and ${memoryAtEnd.best.toFixed(1)} / ` +
  `${memoryAtEnd.median.toFixed(1)} GB/s at its end: the steps (sections 3 and 4) lean on memory far more ` +
  "than GEMM does, so compare them across runs only where this rate held.";
console.log(`Memory: ${memoryLine}`);

const elapsed = (performance.now() - started) / 1000;
const machineLine =
  `${machine.cores} cores, ${machine.cpu}, ${machine.os}, Deno ${machine.deno} (V8 ${machine.v8}), ` +
  `TensorFlow.js ${TFJS_VERSION}; measured ${stamp.date}; this report took ${elapsed.toFixed(0)} s.`;
const markdown = [
  "# Tandem against its peers, measured side by side",
  "",
  stampBlock(stamp),
  "",
  `Machine: ${machineLine} Written by \`npx deno task bench:report\` (\`bench/report.ts\`); every figure in ` +
  "sections 1 to 4 comes from this one run. fp32 throughout.",
  "",
  `Measured peak of this machine (128-bit WebAssembly SIMD, the ceiling of every WebAssembly kernel here): ${peakLine}`,
  "",
  `How steady this machine was: ${driftLine}. ${memoryLine}`,
  "",
  `GEMM cache blocks of this run: ${
    describeMachineBlocks(machineGemmBlocks())
  } (\`backends/cpu/wasm/blocking.ts\`; ` +
  "`npx deno task tune` measures and files this machine's own; they never change a bit).",
  "",
  "## 1. GEMM",
  "",
  `WebAssembly in this runtime: ${runtimeLine}.`,
  "",
  "Tandem's default CPU backend runs GEMM as WebAssembly SIMD kernels generated at run time " +
  `(\`backends/cpu/wasm/\`: ${GEMM_TILE.mr}×${GEMM_TILE.nr} register tile, packed panels` +
  " for every transpose layout, except that a product of few rows by a transposed matrix (the FC " +
  `forward X·Wᵀ) reads W in place, in tiles of the in-place rows above × ${GEMM_TILE.nr}; threads split the ` +
  "output), shown on all cores, on one thread, on one thread with plain SIMD128 (`f32x4.mul` + " +
  "`f32x4.add`, as on a runtime without relaxed SIMD), and beside its pure-TypeScript kernels " +
  "(`backends/cpu/gemm.ts`, the oracle). Operands are uploaded once, as a model's tensors are. Peers: " +
  "`tf.matMul` with `transposeA`/`transposeB` on tfjs-wasm (XNNPACK, SIMD " +
  `${wasmSimd ? "on" : "off"}, one thread: tfjs-wasm in Deno has no threads) and tfjs-cpu (pure JS). ` +
  `Each cell is **best / median GFLOP/s of ${TIMED_CALLS} timed calls** after warming up (Tandem: at least ` +
  "one call and 0.2 s, so V8 has optimised every thread's WebAssembly; tfjs-wasm: one call), then the same " +
  "two as a percentage of the measured peak: the 1-thread columns (Tandem 1 thread, SIMD128 only, " +
  "TypeScript, tfjs-wasm, tfjs-cpu) of the 1-thread peak, " +
  `the ${tandemThreads}-thread column of the ${tandemThreads}-thread peak. ` +
  "tfjs-cpu, pure JS at about 1 GFLOP/s, keeps a reduced method: best / median of 3 after a warm-up call " +
  `for products under 0.1 GFLOP, one cold call otherwise, and FC products predicted over ` +
  `${TFJS_CPU_GEMM_LIMIT_S} s skipped (its note column). The ratio columns divide medians, except the paired one: the median, and the range, ` +
  `of ${PAIRED_CALLS} pairs of calls, one on ${tandemThreads} threads and one on 1 thread back to back (which ` +
  "goes first alternating; each timed call right after an untimed one of its own, so both are warm as in " +
  "the other columns), so that the machine's drift between stretches falls on both; the products take " +
  `turns, one pair each per round, so each product's pairs spread over the ${PAIRED_CALLS} rounds. The FC rows are ` +
  `the three products of a 9216→4096 fully connected layer at batch 64.${overPeakNote}`,
  "",
  gemmTable,
  "",
  "## 2. cifar10_quick training step, batch 64",
  "",
  trainTable,
  "",
  trainNotes,
  "",
  "## 3. Training steps beside PyTorch: AlexNet-like default and cifar10_quick, global batch 64",
  "",
  peerSection,
  "",
  "## 4. Where the step's time goes: a per-op profile of one device",
  "",
  profileSectionText,
  "",
  "## 5. Data-parallel schedules: overlap vs sequential on 2 devices",
  "",
  scheduleSection,
  "",
  "## 6. AlexNet on 2–8 GPUs (simulator)",
  "",
  scalingSection,
  "",
].join("\n");
console.log(`Machine: ${machineLine}`);
/** Runs the text through `deno fmt` (the repository's settings) so `deno fmt --check` passes on the file. */
async function formatMarkdown(text: string): Promise<string> {
  try {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["fmt", "--ext=md", "-"],
      cwd: new URL("..", import.meta.url).pathname,
      stdin: "piped",
      stdout: "piped",
      stderr: "null",
    }).spawn();
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(text));
    await writer.close();
    const { success, stdout } = await child.output();
    return success ? new TextDecoder().decode(stdout) : text;
  } catch {
    return text;
  }
}

const formatted = await formatMarkdown(markdown);
for (const backend of [tandemDefault, tandemOne, tandemSimd128, tandemTs]) backend.dispose();
await writeFileAtomic(new URL("./RESULTS.md", import.meta.url).pathname, [
  new TextEncoder().encode(formatted),
]);
console.log("wrote bench/RESULTS.md");
