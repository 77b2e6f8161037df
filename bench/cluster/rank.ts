/**
 * One cluster-benchmark run, as every MPI rank runs it (`bench/cluster/report.ts` launches it across
 * the hosts of `deno task cluster`): trains a net for a few steps under one schedule and reduction,
 * gathers every rank's trace to rank 0, and prints there one JSON line of figures, all medians over
 * the timed steps:
 *
 * - `stepMs`, `bestStepMs`, `imagesPerSecond`;
 * - `computeMs` (rank 0's forward and backward), `slowestComputeMs` (the slowest rank's in each
 *   step, from the gathered trace: it sets a synchronous step's pace), `fcCommMs` (rank 0's FC
 *   reduce and broadcast, transfers only; the FC group is the plan's first, nearest the output),
 *   `fcExchangeMs` (the whole exchange the link carries, on every rank's spans: from the moment the
 *   last rank starts its FC reduce to the moment the last rank holds the new FC parameters, its
 *   broadcast received or, in allreduce mode, its update done), `fcBytes`;
 * - `bodyBackwardMs`: the backward of every group but the FC one (the conv layers), the slowest
 *   rank's in each step: what an overlapping schedule can hide the FC exchange behind;
 * - `hiddenFraction`: rank 0's communication that overlapped compute (trace);
 * - `activationMs`: a hybrid schedule's all-gathers and reduce-scatters on rank 0 (its FC traffic);
 *   `lastInMs`, `waitMs` and `turnsMs`: that time as the last rank to enter each collective spent
 *   it, how much longer the first rank spent, and what the ranks being late by turns cost
 *   ({@link collectiveTimes});
 * - `handoffMs`: a hybrid step's handoff around each of those collectives ({@link handoffMs});
 * - `wireBytes`: the bytes rank 0's transfers carried per step, from the trace (gradients as sent:
 *   half as many under `wire: "fp16"`; activations for a hybrid schedule);
 * - `cpuCores`, `kernelCores`, `exchangeCores`, `cores`: what the machine's cores did over the timed
 *   steps (`/proc/stat`; {@link cpuFigures}), where Linux has it;
 * - the schedule actually run (`auto` names its choice), and `paramsSha256`, the master's parameters
 *   after the last step as the train command digests them (by name, so any grouping compares);
 * - `paired`: with `pairedWith`, the same figures of that schedule, whose steps alternated with this
 *   one's (a second trainer on the same ranks and link; which of the two goes first alternates).
 *
 * Usage: `deno run -A bench/cluster/rank.ts '<json config>'`, config `{ net, schedule, mode, batch,
 * steps, warmup, linkBytesPerSecond, wire?, deviceThreads?, dataPlane?, pairedWith? }`; `net` is `alexnet-like`, `alexnet` or `probe:<MB>`.
 *
 * @module
 */

import {
  autoSchedule,
  builtinPlan,
  CpuBackend,
  DataParallelTrainer,
  getBackend,
  type Plan,
  randn,
  registerBackend,
  setBackend,
  SGD,
  TraceRecorder,
} from "../../mod.ts";
import {
  layerParameterBytes,
  layoutOf,
  type ModelSpec,
  parametersSha256,
} from "../../schedule/devices/mod.ts";
import { ddpBuckets } from "../../schedule/mod.ts";
import { type AutoPlan, measureProfile, type Profile } from "../../schedule/simulator/mod.ts";
import { type DataPlane, type MeasuredLink, measureLink, MpiTransport } from "../../schedule/mpi/mod.ts";
import {
  type DataParallelStepResult,
  spanKind,
  stepFigures,
  type TraceSpan,
  type WireFormat,
} from "../../schedule/runtime/mod.ts";
import { uniformValues } from "../../engine/mod.ts";
import { buildModel } from "../../schedule/devices/model_spec.ts";
import { type CpuTimes, readCpuTimes } from "../../schedule/mpi/cpu_use.ts";

/** What one run does. */
export interface RankConfig {
  /** `alexnet-like`, `alexnet` or `probe:<MB>` (one FC layer of that many MB). */
  net: string;
  /** `sequential`, `overlap`, `bucketed`, `hybrid` or `auto`. */
  schedule: string;
  /** `master` or `allreduce`. */
  mode: "master" | "allreduce";
  /** Global batch. */
  batch: number;
  /** Timed steps. */
  steps: number;
  /** Warm-up steps before them. */
  warmup: number;
  /** The link's nominal rate (`auto` measures the link itself, as the train command does). */
  linkBytesPerSecond: number;
  /** How gradients travel (default fp32). */
  wire?: WireFormat;
  /** Kernel threads of each rank's device (default: the cores of its host). */
  deviceThreads?: number;
  /** How gradients and parameters travel (default `sockets`). */
  dataPlane?: DataPlane;
  /**
   * A schedule (`sequential`) to run beside this one, step for step in turn in the same launch, over
   * the model's own groups and float32 gradients: its figures come out as `paired`, so that a comparison
   * between the two (the hidden fraction) is not at the mercy of the machine's drift between launches.
   */
  pairedWith?: string;
}

/**
 * What `auto` chooses for `config` on `devices` ranks from the net's per-layer `profile`, as the train
 * command chooses across ranks: every candidate priced at the link `measured` between the ranks (both
 * ways, one way, the share of the cores it takes; `measureLink`), else at the nominal rate, in the
 * config's reduction mode.
 */
export function autoChoice(
  profile: Profile,
  config: RankConfig,
  devices: number,
  measured?: MeasuredLink,
): AutoPlan {
  const link = measured?.link ??
    { bandwidthBytesPerSecond: config.linkBytesPerSecond, latencySeconds: 50e-6 };
  return autoSchedule(profile, link, devices, {
    allowHybrid: true,
    mode: config.mode,
    oneWayBandwidthBytesPerSecond: measured?.oneWayBytesPerSecond,
    commCpuShare: measured?.commCpuShare,
  });
}

/** The model spec of a config's net. */
export function specOf(net: string): ModelSpec {
  if (net.startsWith("probe:")) {
    return {
      kind: "module",
      url: new URL("./nets.ts", import.meta.url).href,
      exportName: "exchangeProbe",
      args: [Number(net.slice("probe:".length))],
    };
  }
  if (net === "alexnet" || net === "alexnet-like") return { kind: "builtin", name: net };
  throw new Error(`unknown net "${net}"`);
}

/** A hybrid step's activation all-gathers and reduce-scatters, by their span names. */
const ACTIVATION_COLLECTIVE = /^(gather|scatter) /;

/**
 * A hybrid step's handoff around each activation collective, median over every rank and collective:
 * from the compute span before it ends to the collective's start, plus from the collective's end to
 * the next compute span's start, on one rank's own lanes (the device telling the runtime its
 * activation is ready, and the runtime handing the gathered one back); 0 without collectives.
 */
export function handoffMs(spans: readonly TraceSpan[]): number {
  const handoffs: number[] = [];
  const keys = new Set(spans.map((s) => `${s.step}/${s.device}`));
  for (const key of keys) {
    const mine = spans
      .filter((s) => `${s.step}/${s.device}` === key)
      .filter((s) => s.lane === "compute" || ACTIVATION_COLLECTIVE.test(s.name))
      .sort((a, b) => a.start - b.start);
    for (let i = 1; i + 1 < mine.length; i++) {
      const [before, collective, after] = [mine[i - 1], mine[i], mine[i + 1]];
      if (collective.lane !== "comm" || before.lane !== "compute" || after.lane !== "compute") continue;
      handoffs.push(collective.start - before.end + after.start - collective.end);
    }
  }
  return median(handoffs);
}

/**
 * Where one hybrid step's time at its activation collectives went, from every rank's spans of that
 * step, each rank's on its own clock (no clock need agree with another's). For each collective the
 * shortest of the ranks' spans, `lastInMs`, is the last rank to enter's: its peers' pieces, sent
 * eagerly, may be there already. The longest less the shortest, `waitMs`, is how much longer the
 * first rank to enter spent: waiting for the others to enter (still computing, or handing their
 * activation over) and for their pieces to cross the link. Each is summed over the step's
 * collectives, matched by name; a step without them, or with one rank's alone, gives zeros.
 *
 * `turnsMs` is what the ranks being late by turns costs: a rank's stretch before each collective
 * runs from when it left the one before (or began the step) to when it enters this one (compute and
 * both handoffs), the step waits at each collective for the longest, and the sum of those longest
 * stretches less the slower rank's own sum is the time no one rank's pace explains (0 where one rank
 * is the slower every time; 0 too where the ranks' collectives differ).
 *
 * @example
 * ```ts
 * import { collectiveTimes } from "./rank.ts";
 * const span = (device: number, start: number, end: number) =>
 *   ({ step: 1, device, lane: "comm", name: "gather fc6 input", start, end }) as const;
 * collectiveTimes([span(0, 0, 5), span(1, 4, 5.5)]); // { lastInMs: 1.5, waitMs: 3.5, turnsMs: 0 }
 * ```
 */
export function collectiveTimes(
  spans: readonly TraceSpan[],
): { lastInMs: number; waitMs: number; turnsMs: number } {
  const lengths = new Map<string, number[]>();
  for (const s of spans) {
    if (s.lane === "comm" && ACTIVATION_COLLECTIVE.test(s.name)) {
      lengths.set(s.name, [...lengths.get(s.name) ?? [], s.end - s.start]);
    }
  }
  let lastInMs = 0, waitMs = 0;
  for (const each of lengths.values()) {
    if (each.length < 2) continue;
    const shortest = Math.min(...each);
    lastInMs += shortest;
    waitMs += Math.max(...each) - shortest;
  }
  return { lastInMs, waitMs, turnsMs: turns(spans) };
}

/** The `turnsMs` of {@link collectiveTimes}. */
function turns(spans: readonly TraceSpan[]): number {
  const stretches = [...new Set(spans.map((s) => s.device))].map((device) => {
    const mine = spans.filter((s) => s.device === device).sort((a, b) => a.start - b.start);
    let left = mine[0].start;
    return mine.filter((s) => s.lane === "comm" && ACTIVATION_COLLECTIVE.test(s.name)).map((collective) => {
      const stretch = collective.start - left;
      left = collective.end;
      return stretch;
    });
  });
  if (stretches.length < 2 || stretches.some((s) => s.length !== stretches[0].length)) return 0;
  const sum = (values: number[]) => values.reduce((n, v) => n + v, 0);
  const paced = sum(stretches[0].map((_, i) => Math.max(...stretches.map((s) => s[i]))));
  return paced - Math.max(...stretches.map(sum));
}

/** {@link collectiveTimes} of each step's spans, each figure's median over the steps. */
function collectiveMedians(steps: readonly (readonly TraceSpan[])[]) {
  const times = steps.map(collectiveTimes);
  return {
    lastInMs: median(times.map((t) => t.lastInMs)),
    waitMs: median(times.map((t) => t.waitMs)),
    turnsMs: median(times.map((t) => t.turnsMs)),
  };
}

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length ? sorted[Math.floor(sorted.length / 2)] : 0;
};

/**
 * What the machine's cores did over the timed steps, from rank 0's brackets of `/proc/stat` (which
 * the hosts of one machine share): `cpuCores`, the cores busy on average, `kernelCores` the kernel's
 * part of them, and `exchangeCores`, the cores kept busy beyond the devices' compute (every rank's
 * compute spans, each keeping its device's `threads` busy) per second of FC exchange: on a probe,
 * whose step is compute and then exchange, what an exchange takes from the cores. Absent without
 * `/proc/stat`.
 */
function cpuFigures(
  cpu: StepCpu[],
  timed: DataParallelStepResult[],
  spans: readonly TraceSpan[],
  ranks: number,
  { threads, exchangeSeconds }: { threads: number; exchangeSeconds: number },
): { cpuCores?: number; kernelCores?: number; exchangeCores?: number; cores?: number } {
  if (cpu.length === 0 || cpu.length !== timed.length) return {};
  const total = (f: (c: StepCpu) => number) => cpu.reduce((n, c) => n + f(c), 0);
  const wall = total((c) => c.seconds);
  const busy = total((c) => c.after.busy - c.before.busy);
  let computeSeconds = 0;
  for (const r of timed) {
    for (let d = 0; d < ranks; d++) {
      computeSeconds += stepFigures(
        spans.filter((s) => s.step === r.iteration && s.device === d),
        0,
      ).compute /
        1000;
    }
  }
  return {
    cores: cpu[0].after.cores,
    cpuCores: busy / wall,
    kernelCores: total((c) => c.after.kernel - c.before.kernel) / wall,
    exchangeCores: exchangeSeconds > 0 ? Math.max(0, busy - threads * computeSeconds) / exchangeSeconds : 0,
  };
}

/** The machine's CPU times around one step on rank 0, and the step's wall-clock seconds there. */
interface StepCpu {
  before: CpuTimes;
  after: CpuTimes;
  seconds: number;
}

/**
 * The step figures of one trainer's timed steps (see the module notes), from rank 0's step results
 * and the trace gathered from every rank: medians over the timed steps.
 */
function stepFiguresOf(
  run: { results: DataParallelStepResult[]; trace: TraceRecorder; cpu: StepCpu[] },
  config: RankConfig,
  groups: readonly string[],
  ranks: number,
) {
  const { trace } = run;
  const fcGroup = groups[0];
  // The body's backward spans: a hybrid head's layers have spans of their own (`backward fc7`).
  const bodyBackward = new Set(groups.slice(1).map((g) => `backward ${g}`));
  const timed = run.results.slice(config.warmup);
  const perStep = timed.map((r) => {
    const spans = trace.spans.filter((s) => s.step === r.iteration && s.device === 0);
    // Every rank's FC reduce, update and broadcast spans of this step; rank 0's are its own.
    const everyRank = trace.spans.filter((s) =>
      s.step === r.iteration && s.lane === "comm" &&
      ["reduce", "update", "broadcast"].some((k) => s.name === `${k} ${fcGroup}`)
    );
    const fcComm = everyRank.filter((s) => s.device === 0 && spanKind(s) === "communication");
    // The exchange on every rank's FC spans (common clock): from when the last rank began it (its
    // gradients exist) to when the last rank holds the new parameters. Rank 0's spans alone would
    // end when its broadcast left for the kernel's buffers, before the peers have it.
    const devices = [...new Set(everyRank.map((s) => s.device))];
    const exchange = everyRank.length
      ? Math.max(...everyRank.map((s) => s.end)) -
        Math.max(
          ...devices.map((d) => Math.min(...everyRank.filter((s) => s.device === d).map((s) => s.start))),
        )
      : 0;
    const activations = spans.filter((s) => s.lane === "comm" && ACTIVATION_COLLECTIVE.test(s.name));
    return {
      fcComm: fcComm.reduce((n, s) => n + s.end - s.start, 0),
      exchange,
      activation: activations.reduce((n, s) => n + s.end - s.start, 0),
      bytes: spans.reduce((n, s) => n + (s.bytes ?? 0), 0),
    };
  });
  // A figure of each rank's own spans, the slowest rank's in each timed step, median over steps.
  const slowestRank = (figure: (spans: TraceSpan[]) => number) =>
    median(
      timed.map((r) =>
        Math.max(...Array.from({ length: ranks }, (_, d) =>
          figure(trace.spans.filter((s) =>
            s.step === r.iteration && s.device === d
          ))))
      ),
    );
  const stepMs = median(timed.map((r) => r.ms.total));
  return {
    ...cpuFigures(run.cpu.slice(config.warmup), timed, trace.spans, ranks, {
      threads: config.deviceThreads ?? navigator.hardwareConcurrency,
      exchangeSeconds: perStep.reduce((n, s) => n + s.exchange, 0) / 1000,
    }),
    stepMs,
    bestStepMs: Math.min(...timed.map((r) => r.ms.total)),
    computeMs: median(timed.map((r) => r.ms.compute)),
    // Each rank's compute as the step figures count rank 0's (`computeMs`), from its spans.
    slowestComputeMs: slowestRank((spans) => stepFigures(spans, 0).compute),
    // The backward of every group but the FC one: what an overlapping schedule can hide the FC
    // exchange behind.
    bodyBackwardMs: slowestRank((spans) =>
      spans.filter((s) => s.lane === "compute" && bodyBackward.has(s.name)).reduce(
        (n, s) => n + s.end - s.start,
        0,
      )
    ),
    commMs: median(timed.map((r) => r.ms.communication)),
    updateMs: median(timed.map((r) => r.ms.update)),
    hiddenFraction: median(timed.map((r) => r.hiddenFraction)),
    fcCommMs: median(perStep.map((s) => s.fcComm)),
    fcExchangeMs: median(perStep.map((s) => s.exchange)),
    activationMs: median(perStep.map((s) => s.activation)),
    ...collectiveMedians(timed.map((r) => trace.spans.filter((s) => s.step === r.iteration))),
    handoffMs: handoffMs(trace.spans.filter((s) => timed.some((r) => r.iteration === s.step))),
    wireBytes: median(perStep.map((s) => s.bytes)),
    imagesPerSecond: config.batch / (stepMs / 1000),
  };
}

if (import.meta.main) {
  const transport = MpiTransport.init();
  try {
    const config = JSON.parse(Deno.args[0]) as RankConfig;
    let spec = specOf(config.net);
    const reference = await buildModel(spec);
    const groups = layoutOf(reference.namedParameters()).groups.map((g) => g.name);
    let plan: Plan;
    /** The link `auto` measured, which the exchange's master-mode chunks then follow (as in `train`). */
    let measuredBytesPerSecond: number | undefined;
    if (config.schedule === "auto") {
      // Measured on rank 0 and sent to every rank, as the train command does: ranks must agree.
      // Every rank measures the link together, over the data plane training will use.
      const measured = await measureLink(transport, {
        bytes: 4 * reference.parameterCount(),
        dataPlane: config.dataPlane,
      });
      measuredBytesPerSecond = measured.link.bandwidthBytesPerSecond;
      const auto = transport.rank === 0
        ? autoChoice(
          measureProfile(reference, config.batch / transport.size, { description: config.net }),
          config,
          transport.size,
          measured,
        )
        : undefined;
      const choice = auto ? { plan: auto as Plan, assignment: auto.assignment } : null;
      const shared = await transport.broadcastJson(
        choice,
        0,
        { deadline: performance.now() + 600_000 },
        "auto",
      );
      plan = shared!.plan;
      spec = { ...spec, groups: shared!.assignment };
    } else if (config.schedule === "bucketed") {
      // PyTorch DDP's default buckets, as the train command's `--schedule bucketed` regroups the layers.
      const buckets = ddpBuckets(layerParameterBytes(reference));
      plan = buckets.plan;
      spec = { ...spec, groups: buckets.assignment };
    } else {
      plan = builtinPlan(config.schedule as "sequential", groups);
    }
    const [channels, height, width] = reference.inputShape;
    const classes = reference.classes;
    reference.dispose();
    /** A trainer of `plan` on these ranks, recording its own trace. */
    const start = async (plan: Plan, wire: WireFormat | undefined, model: ModelSpec) => {
      const trace = new TraceRecorder();
      const trainer = await DataParallelTrainer.create({
        transport,
        model,
        plan,
        mode: config.mode,
        optimizer: (p) => new SGD(p, { lr: 1e-4, momentum: 0.9, weightDecay: 5e-4 }),
        trace,
        timeoutSeconds: 600,
        wire,
        deviceThreads: config.deviceThreads,
        dataPlane: config.dataPlane,
        linkBytesPerSecond: measuredBytesPerSecond,
      });
      return {
        plan,
        trace,
        trainer,
        results: [] as DataParallelStepResult[],
        cpu: [] as StepCpu[],
        paramsSha256: "",
      };
    };
    const runs = [await start(plan, config.wire, spec)];
    if (config.pairedWith) {
      // Over the model's own groups (FC, conv), as the `sequential` row runs: its T_fc_comm is the FC
      // exchange whatever groups (an automatic split, DDP's buckets) this row regroups the layers into.
      // On a CPU backend of its own: a rank's bvlc_alexnet trainer holds 1.2-1.5 GB of kernel memory,
      // two do not fit one backend's 2 GiB, and the second's updates would take the TypeScript path.
      const own = getBackend().name;
      registerBackend(new CpuBackend({ name: "cpu-paired" }));
      setBackend("cpu-paired");
      try {
        runs.push(
          await start(builtinPlan(config.pairedWith as "sequential", groups), "fp32", specOf(config.net)),
        );
      } finally {
        setBackend(own);
      }
    }
    // One synthetic batch, made before the first step and fed to every step, as the PyTorch peer
    // does: made per step on the main thread (3-11 ms for the AlexNet-like net's 50,176 values) it
    // ran between steps at a different moment on each rank, and a rank that started late held the
    // other in the step's first collective, inside the timed span.
    const shape = [config.batch, channels, height, width];
    const batch = {
      images: randn(shape, { seed: 100 }).dataSync() as Float32Array,
      labels: Int32Array.from(uniformValues(config.batch, { seed: 200 }), (u) => Math.floor(u * classes)),
      shape,
    };
    for (let step = 0; step < config.warmup + config.steps; step++) {
      // Paired runs take turns, and which goes first alternates, so neither always follows the other.
      for (const run of step % 2 ? [...runs].reverse() : runs) {
        // The ranks meet before each step, outside the timed span, as the peer's ranks do (dist.barrier).
        await transport.barrier(`before step ${step}`).wait({ deadline: performance.now() + 600_000 });
        const [before, start] = [readCpuTimes(), performance.now()];
        run.results.push(await run.trainer.step(batch));
        const [after, end] = [readCpuTimes(), performance.now()];
        if (before && after) run.cpu.push({ before, after, seconds: (end - start) / 1000 });
      }
    }
    for (const run of runs) {
      await run.trainer.gatherTrace();
      // Collective (a hybrid head's slices come together on rank 0).
      await run.trainer.syncParameters();
      run.paramsSha256 = await parametersSha256(run.trainer.layout, run.trainer.masterParameters());
    }
    // The FC exchange: the group nearest the output (`fc`, an automatic split's `head`, DDP's first bucket).
    const fcGroup = plan.groups[0];
    const fcBytes = runs[0].trainer.layout.groups.find((g) => g.name === fcGroup)!.size * 4;
    for (const run of runs) await run.trainer.close();
    if (transport.rank === 0) {
      const [own, paired] = runs.map((run) => stepFiguresOf(run, config, run.plan.groups, transport.size));
      console.log(JSON.stringify({
        net: config.net,
        schedule: plan.name,
        requested: config.schedule,
        groups: plan.groups,
        plan,
        assignment: spec.groups,
        mode: config.mode,
        ranks: transport.size,
        batch: config.batch,
        ...own,
        fcBytes,
        wire: config.wire ?? "fp32",
        paramsSha256: runs[0].paramsSha256,
        ...(paired
          ? { paired: { schedule: runs[1].plan.name, ...paired, paramsSha256: runs[1].paramsSha256 } }
          : {}),
      }));
    }
    transport.finalize();
    Deno.exit(0);
  } catch (error) {
    console.error(`cluster rank ${transport.rank}: ${(error as Error)?.stack ?? error}`);
    transport.abort(1);
  }
}
