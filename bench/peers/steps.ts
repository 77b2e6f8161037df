/**
 * The section of `bench:report` that runs the training steps beside PyTorch: the AlexNet-like default
 * and cifar10_quick at global batch 64, Tandem on one device and on 2 devices (`DataParallelTrainer`,
 * overlap, shared memory) against PyTorch in one process and as DistributedDataParallel over gloo with
 * 2 processes on loopback ({@link runPytorch}), the rows taking turns round by round.
 *
 * @module
 */

import { DataParallelTrainer, overlapPlan, randn, SGD, tensor, trainStep } from "../../mod.ts";
import { builtinModels } from "../../engine/models/mod.ts";
import type { ModelSpec } from "../../schedule/devices/mod.ts";
import { uniformValues } from "../../engine/mod.ts";
import { pytorchAvailable, type PytorchResult, runPytorch } from "./pytorch.ts";

/**
 * The PyTorch section's timing: every row takes `PEER_STEPS_PER_ROUND` timed steps per round, the
 * rows one after another, for `PEER_ROUNDS` rounds. This machine's speed drifts within seconds (a
 * 512³ GEMM's rate in 0.5 s windows of one process ranged 18–34 GFLOP/s while the FMA-only peak
 * probe held steady), so rows timed one after another in blocks compare the machine's moods as
 * much as the code; interleaved, every row samples the same stretch of time. Tandem warms up once
 * (`PEER_WARMUP` steps) and keeps its model or trainer across rounds; each PyTorch round is a fresh
 * process. Every row, Tandem's too, runs `PEER_WARMUP_PER_ROUND` untimed steps right before its timed
 * ones in each round: Tandem's first step after another process had used both cores for 2 s was
 * 0.5–5.0 ms slower than its second in 6 of 6 rounds (cifar10_quick, 24–31 ms steps), so timing its
 * rows without them measured Tandem cold against a PyTorch warmed in every process.
 */
/** The global batch of every training step in `bench:report`. */
export const BATCH = 64;

const PEER_ROUNDS = 5, PEER_STEPS_PER_ROUND = 2, PEER_WARMUP = 3, PEER_WARMUP_PER_ROUND = 2;

/** A net of the PyTorch section: Tandem's zoo name (also the peer's `--net`) and its SGD. */
export interface PeerNet {
  name: "alexnet-like" | "cifar-quick";
  /** For headings and progress lines. */
  title: string;
  /**
   * SGD as both sides run it; the layers' multipliers apply on both (biases lr ×2, decay ×0 in the
   * AlexNet-like net, ×1 in cifar10_quick, as Caffe's prototxt leaves it).
   */
  sgd: { lr: number; momentum: number; weightDecay: number };
}

/** The nets of the section (and of the report's per-op profile). */
export const PEER_NETS: readonly PeerNet[] = [
  {
    name: "alexnet-like",
    title: "AlexNet-like default",
    sgd: { lr: 0.01, momentum: 0.9, weightDecay: 5e-4 },
  },
  // Caffe's cifar10_quick solver's lr and momentum; weight decay as section 2.
  { name: "cifar-quick", title: "cifar10_quick", sgd: { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 } },
];

/** One fixed synthetic batch of `net` at the global batch size (the same seeds on every row). */
export function peerBatch(net: PeerNet): { images: Float32Array; labels: Int32Array; shape: number[] } {
  const { inputShape, classes } = builtinModels[net.name];
  const shape = [BATCH, ...inputShape];
  const images = randn(shape, { seed: 1 });
  try {
    return {
      images: images.dataSync() as Float32Array,
      labels: Int32Array.from(uniformValues(BATCH, { seed: 2 }), (u) => Math.floor(u * classes)),
      shape,
    };
  } finally {
    images.dispose();
  }
}

/** A Tandem row of the PyTorch section, kept open across rounds: one step, timed, in ms. */
interface StepRunner {
  step(): Promise<number>;
  close(): Promise<void>;
}

/** `trainStep` on the default backend (one device), warmed up. */
async function tandemOneDevice(net: PeerNet): Promise<StepRunner> {
  const model = builtinModels[net.name].create();
  const batch = peerBatch(net);
  const images = tensor(batch.images, { shape: batch.shape });
  const labels = tensor(batch.labels, { dtype: "int32" });
  const optimizer = new SGD(model.namedParameters(), net.sgd);
  const runner: StepRunner = {
    async step() {
      const t0 = performance.now();
      await trainStep(model, optimizer, { images, labels });
      return performance.now() - t0;
    },
    close() {
      optimizer.dispose();
      model.dispose();
      images.dispose();
      labels.dispose();
      return Promise.resolve();
    },
  };
  for (let i = 0; i < PEER_WARMUP; i++) await runner.step();
  return runner;
}

/** 2 CPU devices (Workers), overlap, shared memory, warmed up. */
async function tandemTwoDevices(net: PeerNet): Promise<StepRunner> {
  const spec: ModelSpec = { kind: "builtin", name: net.name };
  const trainer = await DataParallelTrainer.create({
    model: spec,
    devices: 2,
    plan: overlapPlan(["fc", "conv"]),
    optimizer: (p) => new SGD(p, net.sgd),
  });
  const batch = peerBatch(net);
  const runner: StepRunner = {
    async step() {
      return (await trainer.step(batch)).seconds * 1000;
    },
    close: () => trainer.close(),
  };
  for (let i = 0; i < PEER_WARMUP; i++) await runner.step();
  return runner;
}

/** The median of `xs` (the upper one for even counts, as PyTorch's peer reports it). */
function medianOf(xs: readonly number[]): number {
  return [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
}

/** One row's timed steps, round by round. */
type Rounds = number[][];

/** A PyTorch row over all rounds: its first round's details, every round's steps pooled. */
function pooled(first: PytorchResult, rounds: Rounds): PytorchResult {
  const steps = rounds.flat();
  const medianMs = medianOf(steps);
  return {
    ...first,
    stepsMs: steps,
    bestMs: Math.min(...steps),
    medianMs,
    imagesPerSecond: first.batch / (medianMs / 1000),
  };
}

/**
 * "a–b×" over the rounds both rows ran: each round's fastest step of `tandem` over that of `torch`,
 * so a slow stretch of the machine that hits one round hits both sides of its ratio.
 */
function roundRatios(tandem: Rounds, torch: Rounds): string {
  const ratios = tandem.map((steps, r) => Math.min(...steps) / Math.min(...torch[r]));
  return `${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)}×`;
}

/**
 * One net's table of the section "Training steps beside PyTorch", at global batch 64: Tandem on 1
 * and 2 devices, PyTorch in one process (2 threads) and as DDP with 2 processes (1 thread each),
 * timed in interleaved rounds (see {@link PEER_ROUNDS}).
 */
async function pytorchTable(net: PeerNet, threads: number): Promise<{ table: string; blas: string }> {
  const bestOf = (xs: number[]) => Math.min(...xs);
  const ms = (x: number) => `${x.toFixed(x >= 100 ? 0 : 1)} ms`;
  const ratio = (x: number) => `${x.toFixed(2)}×`;
  const unavailable = await pytorchAvailable();
  console.log(`${net.title} step beside PyTorch: warming up Tandem on 1 device (${threads} threads) and 2 …`);
  const runners = [await tandemOneDevice(net), await tandemTwoDevices(net)];
  const tandemRounds: [Rounds, Rounds] = [[], []];
  // Per PyTorch layout (1 × 2, 2 × 1): its first result, its rounds, or why there is none.
  const torch = [{ world: 1, threads: 2 }, { world: 2, threads: 1 }].map((layout) => ({
    ...layout,
    first: undefined as PytorchResult | undefined,
    rounds: [] as Rounds,
    failure: unavailable ? `unavailable: ${unavailable}` : undefined as string | undefined,
  }));
  try {
    for (let round = 0; round < PEER_ROUNDS; round++) {
      console.log(`${net.title} step beside PyTorch: round ${round + 1} of ${PEER_ROUNDS} …`);
      for (const [i, runner] of runners.entries()) {
        for (let s = 0; s < PEER_WARMUP_PER_ROUND; s++) await runner.step();
        const steps: number[] = [];
        for (let s = 0; s < PEER_STEPS_PER_ROUND; s++) steps.push(await runner.step());
        tandemRounds[i].push(steps);
      }
      for (const row of torch) {
        if (row.failure) continue;
        try {
          const result = await runPytorch({
            net: net.name,
            batch: BATCH,
            world: row.world,
            threads: row.threads,
            warmup: PEER_WARMUP_PER_ROUND,
            steps: PEER_STEPS_PER_ROUND,
            timeoutSeconds: 300,
          });
          row.first ??= result;
          row.rounds.push(result.stepsMs);
        } catch (error) {
          row.failure = `failed: ${(error as Error).message}`;
        }
      }
    }
  } finally {
    for (const runner of runners) await runner.close();
  }
  const [torchOne, torchDdp] = torch.map((row) => row.failure ?? pooled(row.first!, row.rounds));
  const timed = PEER_ROUNDS * PEER_STEPS_PER_ROUND;
  const how = (warmup: string) =>
    `best and median of ${timed}: ${PEER_ROUNDS} rounds of ${PEER_STEPS_PER_ROUND}, rows interleaved; ${warmup}`;
  const tandemRow = (
    label: string,
    layout: string,
    rounds: Rounds,
    against: PytorchResult | string,
    i: number,
  ) => {
    const steps = rounds.flat(), b = bestOf(steps), m = medianOf(steps);
    const vs = typeof against === "string"
      ? "— | —"
      : `${ratio(b / against.bestMs)} / ${ratio(m / against.medianMs)} | ${
        roundRatios(rounds, torch[i].rounds)
      }`;
    return `| ${label} | ${layout} | ${ms(b)} | ${ms(m)} | ${(BATCH / (m / 1000)).toFixed(0)} | ${vs} | ${
      how(`${PEER_WARMUP} warm-up steps once, ${PEER_WARMUP_PER_ROUND} more before each round's`)
    } |`;
  };
  const torchRow = (label: string, layout: string, r: PytorchResult | string) =>
    typeof r === "string"
      ? `| ${label} | ${layout} | — | — | — | — | — | ${r.replace(/\|/g, "\\|")} |`
      : `| ${label.replace("PyTorch", `PyTorch ${r.version}`)} | ${layout} | ${ms(r.bestMs)} | ${
        ms(r.medianMs)
      } | ${r.imagesPerSecond.toFixed(0)} | 1× | — | ${
        how(`a fresh process each round, ${r.warmup} warm-up steps first (rank 0)`)
      } |`;
  const table = [
    "| implementation | processes × threads | step time (best) | median | images/s (median) | Tandem / PyTorch, same layout (best / median) | round by round | how timed |",
    "|---|---|---:|---:|---:|---:|---:|---|",
    tandemRow(
      "**Tandem**, default CPU backend, 1 device (`trainStep`)",
      `1 × ${threads}`,
      tandemRounds[0],
      torchOne,
      0,
    ),
    tandemRow(
      "**Tandem**, `DataParallelTrainer`, 2 CPU devices (Workers), overlap, shared memory",
      `1 × (2 devices × ${Math.max(1, Math.floor(threads / 2))})`,
      tandemRounds[1],
      torchDdp,
      1,
    ),
    torchRow("PyTorch, one process", "1 × 2", torchOne),
    torchRow("PyTorch DDP over gloo, loopback", "2 × 1", torchDdp),
  ].join("\n");
  const blas = ([["one process", torchOne], ["each DDP process", torchDdp]] as const)
    .flatMap(([label, r]) => typeof r === "string" ? [] : [`${label}: ${r.blas}`]).join("; ");
  return { table, blas };
}

/** The section "Training steps beside PyTorch": one table per net of {@link PEER_NETS}, and notes. */
export async function pytorchSection(threads: number): Promise<string> {
  const tables: string[] = [];
  let blas = "";
  for (const net of PEER_NETS) {
    const result = await pytorchTable(net, threads);
    tables.push(`### ${net.title}\n\n${result.table}`);
    blas ||= result.blas;
  }
  const unavailable = await pytorchAvailable();
  const notes = [
    unavailable ? `PyTorch rows not measured: ${unavailable}.` : "",
    "Same nets on both sides, built layer for layer by the peer (`bench/peers/pytorch_peer.py`), which " +
    "checks each parameter count against Tandem's: the AlexNet-like default (1×28×28, 10 classes, " +
    "1,088,458 parameters; Caffe's ceil-mode 3×3/2 max pooling, conv2 in 2 groups, dropout 0.5 after fc6 " +
    "and fc7) and Caffe's cifar10_quick (3×32×32, 10 classes, 145,578 parameters; conv 5×5 pad 2 with 32, " +
    "32, 64 filters, 3×3/2 pooling max, avg, avg in ceil mode giving 16, 8, 4 — also checked —, ReLU after " +
    "pool1 and before pool2/pool3, ip1 64, ip2 10). Global batch 64 of synthetic data (one fixed batch), " +
    "softmax cross-entropy, SGD momentum 0.9, weight decay 5e-4, lr 0.01 (AlexNet-like) or 0.001 " +
    "(cifar10_quick), biases at twice the rate with Caffe's decay multipliers (×0 in the AlexNet-like net, " +
    "×1 in cifar10_quick as its prototxt leaves it; PyTorch parameter groups). A step is forward, loss, " +
    "backward, gradient exchange and update, and reading the loss back; images/s is the global batch over " +
    "the median step. Tandem's 2 devices are Workers of this process with one kernel thread each, the " +
    "communication on the main thread; PyTorch's DDP runs 2 processes of one intra-op thread each (each " +
    "rank 32 samples, default 25 MB buckets), meeting at a barrier before each step outside the timed " +
    "span. The ratio column divides Tandem's step time by PyTorch's in the same layout (1 × 2 threads, or " +
    "2 × 1): above 1× PyTorch is faster. The rows take turns: each round runs " +
    `${PEER_STEPS_PER_ROUND} timed steps of every row, each after ${PEER_WARMUP_PER_ROUND} untimed ones (PyTorch's ` +
    `in its fresh process, Tandem's on the model it keeps), one row after another, ${PEER_ROUNDS} rounds, so a ` +
    "slow stretch of a shared machine falls on every row alike; **round by round** gives the lowest and " +
    "highest ratio of the two fastest steps of one round.",
    blas
      ? `PyTorch's kernels (${blas}). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset in the peer's own ` +
        "environment, so OpenBLAS detects the core itself."
      : "",
  ].filter((l) => l).join("\n\n");
  return `${tables.join("\n\n")}\n\n${notes}`;
}
