/**
 * Side-by-side measurement of the data-parallel schedules on this machine, written to
 * `bench/SCHEDULE.md` (and the lanes of each run's best step, both schedules on one time axis, to
 * `bench/SCHEDULE.html`): step time of `sequential` vs `overlap` on 2 CPU devices for the AlexNet-like
 * default and cifar10_quick, without link emulation and over emulated links, the hidden
 * communication, the simulator's predictions for the same runs, and 2-device vs 1-device scaling.
 *
 * Run: `npx deno task bench:schedule` (under a minute; leave the machine otherwise idle, since
 * the two devices and the communication thread already share its two cores).
 *
 * `(T_seq − T_ovl) / T_fc_comm` compares two separately measured medians, so it is only meaningful
 * where the FC communication is large next to the step-to-step noise (a few percent of a step); the
 * trace-based hidden fraction is measured within each overlap step and holds everywhere.
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
import { calibrateProfile, measureProfile, type Profile, simulate } from "../schedule/simulator/mod.ts";
import { groupTimes } from "../schedule/simulator/profile.ts";
import { type Link, parseLink, spanKind, type TraceSpan } from "../schedule/runtime/mod.ts";
import { waitUntil } from "../schedule/runtime/exchange/link.ts";
import type { ModelSpec } from "../schedule/devices/mod.ts";
import { uniformValues } from "../engine/mod.ts";
import { writeFileAtomic } from "../engine/io/mod.ts";
import { type RunsReportInput, writeRunsReport } from "../cli/report.ts";
import { cpuKernelsLabel } from "./kernels/backend_label.ts";
import { measureStamp, stampBlock, stampSummary } from "./stamp.ts";
import { measureExchangeRates } from "./exchange_rates.ts";
import { buildModel } from "../schedule/devices/model_spec.ts";

const GLOBAL_BATCH = 64;
const WARMUP = 3, TIMED = 7;

const models: { label: string; spec: ModelSpec }[] = [
  {
    label: "AlexNet-like default (28×28)",
    spec: {
      kind: "module",
      url: new URL("../engine/models/mod.ts", import.meta.url).href,
      exportName: "alexnetLike",
    },
  },
  {
    label: "cifar10_quick (32×32×3)",
    spec: {
      kind: "module",
      url: new URL("../engine/models/mod.ts", import.meta.url).href,
      exportName: "cifarQuick",
    },
  },
];

const links: (Link | undefined)[] = [
  undefined,
  parseLink("12GB/s"),
  parseLink("1.2GB/s"),
  parseLink("100MB/s"),
];

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

function batchFor(shape: readonly number[], step: number, classes: number) {
  const images = randn([GLOBAL_BATCH, ...shape], { seed: 1000 + step }).dataSync() as Float32Array;
  const labels = Int32Array.from(
    uniformValues(GLOBAL_BATCH, { seed: 2000 + step }),
    (u) => Math.floor(u * classes),
  );
  return { images, labels, shape: [GLOBAL_BATCH, ...shape] };
}

interface Run {
  seconds: number;
  fcCommMs: number;
  commMs: number;
  hiddenMs: number;
  /** Median per-device compute time of each compute action (`forward`, `backward fc`, …), seconds. */
  compute: Record<string, number>;
  /**
   * The best step's slowest device (most compute in all): its time in each compute action, seconds.
   * A step waits for its slowest device, so the simulator's alike devices are given this one's.
   */
  slowestCompute: Record<string, number>;
  /** Every device's spans of the best timed step, for the lanes figure. */
  spans: TraceSpan[];
}

async function run(
  spec: ModelSpec,
  plan: Plan,
  devices: number,
  link: Link | undefined,
  input: number[],
  classes: number,
): Promise<Run> {
  const fcSpans: number[] = [];
  const computeTimes: Record<string, number[]> = {};
  let step = -1;
  const stepSpans: TraceSpan[] = [];
  let best = { seconds: Infinity, spans: [] as TraceSpan[] };
  const slowestDevice = (spans: readonly TraceSpan[]): Record<string, number> => {
    const byDevice = new Map<number, Record<string, number>>();
    for (const s of spans) {
      if (s.lane !== "compute") continue;
      const times = byDevice.get(s.device) ?? {};
      times[s.name] = (times[s.name] ?? 0) + (s.end - s.start) / 1000;
      byDevice.set(s.device, times);
    }
    const total = (times: Record<string, number>) => Object.values(times).reduce((a, b) => a + b, 0);
    return [...byDevice.values()].reduce((a, b) => (total(b) > total(a) ? b : a));
  };
  const trainer = await DataParallelTrainer.create({
    model: spec,
    devices,
    plan,
    link,
    optimizer: (p) => new SGD(p, { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 }),
    onEvent: (e) => {
      if (e.step !== step) return;
      stepSpans.push({ ...e });
      if (spanKind(e) === "communication" && e.device === 0 && / fc$/.test(e.name)) {
        fcSpans.push(e.end - e.start);
      }
      if (e.lane === "compute" && step >= WARMUP) {
        (computeTimes[e.name] ??= []).push((e.end - e.start) / 1000);
      }
    },
  });
  const seconds: number[] = [], comm: number[] = [], hidden: number[] = [], fc: number[] = [];
  try {
    for (let i = 0; i < WARMUP + TIMED; i++) {
      step = i;
      fcSpans.length = 0;
      stepSpans.length = 0;
      const result = await trainer.step(batchFor(input, i, classes));
      if (i >= WARMUP) {
        seconds.push(result.seconds);
        comm.push(result.ms.communication);
        hidden.push(result.ms.hiddenCommunication);
        fc.push(fcSpans.reduce((a, b) => a + b, 0));
        if (result.seconds < best.seconds) best = { seconds: result.seconds, spans: [...stepSpans] };
      }
    }
  } finally {
    await trainer.close();
  }
  const compute = Object.fromEntries(
    Object.entries(computeTimes).map(([name, times]) => [name, median(times)]),
  );
  return {
    // Best of the timed steps: on two shared cores the step-to-step noise (GC, the OS, the third
    // thread) is one-sided and a few percent, as large as the effect measured on fast links.
    seconds: Math.min(...seconds),
    fcCommMs: median(fc),
    commMs: median(comm),
    hiddenMs: median(hidden),
    compute,
    slowestCompute: slowestDevice(best.spans),
    spans: best.spans,
  };
}

const lines: string[] = [];
const figures: RunsReportInput["figures"] = [];
const say = (line = "") => {
  console.log(line);
  lines.push(line);
};

const stamp = await measureStamp({
  file: "bench/SCHEDULE.md",
  command: "npx deno task bench:schedule",
  sources: ["bench/schedule_report.ts", "bench/kernels/backend_label.ts", "cli/report.ts"],
});
say("# Data-parallel schedules on this machine");
say();
say(stampBlock(stamp));
say();
say(
  `${cpuKernelsLabel(getBackend() as CpuBackend)}, 2 CPU devices (Workers, ${
    Math.max(1, Math.floor(navigator.hardwareConcurrency / 2))
  } kernel thread(s) each), master reduction, global batch ${GLOBAL_BATCH}, ` +
    `best of ${TIMED} steps after ${WARMUP} warm-up steps (medians for the communication figures). Links marked "emulated" add latency + bytes/bandwidth ` +
    `to every transfer; without one, devices share memory.`,
);

// The runtime averages and updates on this thread's backend: the simulator's CPU rates, measured on it.
const rates = measureExchangeRates(getBackend() as CpuBackend);
say();
say(
  `Gradient exchange on this thread, as the simulator prices it: device-order sum ${
    (rates.sumBytesPerSecond / 1e9).toFixed(1)
  } GB/s per input, SGD update ${(1 / rates.updateSecondsPerByte / 1e9).toFixed(2)} GB/s of parameters, ` +
    `the same update also saving the parameter and its momentum for the undo ${
      (1 / (rates.updateSecondsPerByte + rates.undoSecondsPerByte) / 1e9).toFixed(2)
    } GB/s of parameters; both updates check the new parameters for NaN and ±∞ in the same pass (a separate ` +
    `scan, as an Adam update needs, ${(1 / rates.checkSecondsPerByte / 1e9).toFixed(1)} GB/s). ` +
    "The trainers here keep the runtime's defaults, finite checks on and failed steps undone over shared " +
    "memory, so every update checks what it wrote and saves what it overwrites (`plan/undo.ts`): the " +
    "simulator prices the saving; the check is in the update's rate.",
);
// An emulated transfer ends when the link's clock thread wakes (`waitUntil`), a little after its
// deadline: every transfer on an emulated link lasts that much longer than the link would take.
// Measured here, after the clock is up, and priced as part of the emulated link's latency.
const overshoot = await (async () => {
  const late: number[] = [], endedBy: string[] = [];
  for (let i = 0; i < 41; i++) {
    const deadline = performance.now() + 0.5;
    endedBy.push(await waitUntil(deadline));
    if (i >= 20) late.push(performance.now() - deadline);
  }
  return { ms: median(late), byClock: endedBy.slice(20).filter((by) => by === "clock").length };
})();
const overshootMs = overshoot.ms;
say(
  `An emulated transfer ends when the link's clock thread wakes, which here was ${
    overshootMs.toFixed(2)
  } ms after the deadline (median of 21 waits of 0.5 ms, ${overshoot.byClock} of them ended by the clock ` +
    `thread, the rest by the fallback timer): each transfer on an emulated link takes that much longer than ` +
    `the link's latency plus bytes over bandwidth, so the simulator adds it to the emulated link's latency.`,
);

for (const { label, spec } of models) {
  const reference = await buildModel(spec);
  const input = [...reference.inputShape], classes = reference.classes;
  const groups = ["fc", "conv"];
  const profile: Profile = measureProfile(reference, GLOBAL_BATCH / 2, { description: label });
  const totals = groupTimes(profile);
  const fcBytes = totals.find((t) => t.group === "fc")!.parameterBytes;
  const convBackward = totals.find((t) => t.group === "conv")!.backwardSeconds;
  reference.dispose();

  say();
  say(`## ${label}`);
  say();
  say(
    `Profile at ${GLOBAL_BATCH / 2} samples per device: FC ${(fcBytes / 1e6).toFixed(2)} MB of gradients, ` +
      `conv backward ${(convBackward * 1000).toFixed(0)} ms, FC backward ${
        (totals.find((t) => t.group === "fc")!.backwardSeconds * 1000).toFixed(0)
      } ms.`,
  );
  const runs = [];
  for (const link of links) {
    runs.push({
      link,
      seq: await run(spec, sequentialPlan(groups), 2, link, input, classes),
      ovl: await run(spec, overlapPlan(groups), 2, link, input, classes),
    });
  }
  // Per-layer times on an idle core are optimistic next to two devices sharing the machine: each
  // row's simulation scales them to the compute its own best step's slowest device took.
  const calibrated = (compute: Record<string, number>) =>
    calibrateProfile(profile, {
      forwardSeconds: compute["forward"],
      backwardSeconds: Object.fromEntries(groups.map((g) => [g, compute[`backward ${g}`]])),
    });
  const measured = runs[0].seq.compute;
  say();
  say(
    `Compute measured on the devices (per device, median): forward ${
      (measured["forward"] * 1000).toFixed(0)
    } ms, ` +
      groups.map((g) => `backward ${g} ${(measured[`backward ${g}`] * 1000).toFixed(0)} ms`).join(", ") +
      "; the simulator scales the per-layer profile to the compute of each row's best step on its slowest " +
      "device (a step waits for the slowest).",
  );
  say();
  say(
    "| link | sequential | overlap | ratio | FC comm (seq) | (T_seq − T_ovl) / T_fc_comm | hidden comm (trace, overlap) | simulated seq / ovl | sim. error seq / ovl |",
  );
  say("|---|---|---|---|---|---|---|---|---|");
  for (const { link, seq, ovl } of runs) {
    figures.push({
      heading: `${label}, link ${link?.label ?? "none (shared memory)"}`,
      runs: [{ label: "sequential", spans: seq.spans }, { label: "overlap", spans: ovl.spans }],
    });
    // Without a link a broadcast is one pass over memory (a reduce moves nothing); over an emulated
    // one each transfer also pays the clock's lateness, as latency.
    const simLink = link
      ? { ...link, latencySeconds: link.latencySeconds + overshootMs / 1000 }
      : { bandwidthBytesPerSecond: rates.sumBytesPerSecond, latencySeconds: 0 };
    const simOptions = {
      link: simLink,
      devices: 2,
      mode: "master" as const,
      topology: "star" as const,
      // Without a link the master averages the peers' gradients where they lie.
      gatherInPlace: !link,
      memoryBandwidthBytesPerSecond: rates.sumBytesPerSecond,
      updateSecondsPerByte: rates.updateSecondsPerByte,
      // SGD's update on the CPU checks its new parameters in its own pass (`Optimizer.checkedFinite`):
      // no scan follows it, and the update's rate already includes the check.
      checkSecondsPerByte: 0,
      // The shared-memory exchange with the trainer's default checkFinite.
      undo: {
        rule: { rollsBack: true, transfersCanFail: false, checkFinite: true },
        secondsPerByte: rates.undoSecondsPerByte,
      },
    };
    const simSeq = simulate(sequentialPlan(groups), calibrated(seq.slowestCompute), simOptions).stepSeconds;
    const simOvl = simulate(overlapPlan(groups), calibrated(ovl.slowestCompute), simOptions).stepSeconds;
    const hiddenByTime = (seq.seconds - ovl.seconds) * 1000 / seq.fcCommMs;
    const error = (measured: number, predicted: number) =>
      `${((predicted - measured) / measured * 100).toFixed(1)}%`;
    say(
      `| ${link?.label ?? "none (shared memory)"} | ${(seq.seconds * 1000).toFixed(0)} ms | ${
        (ovl.seconds * 1000).toFixed(0)
      } ms | ${(seq.seconds / ovl.seconds).toFixed(3)}× | ${seq.fcCommMs.toFixed(1)} ms | ${
        hiddenByTime.toFixed(2)
      } | ${(ovl.hiddenMs / (ovl.commMs || 1)).toFixed(2)} | ${(simSeq * 1000).toFixed(0)} / ${
        (simOvl * 1000).toFixed(0)
      } ms | ${error(seq.seconds, simSeq)} / ${error(ovl.seconds, simOvl)} |`,
    );
  }
  const one = await run(spec, sequentialPlan(groups), 1, undefined, input, classes);
  const two = await run(spec, overlapPlan(groups), 2, undefined, input, classes);
  say();
  say(
    `Scaling, no emulation: 1 device ${(GLOBAL_BATCH / one.seconds).toFixed(1)} images/s, 2 devices ${
      (GLOBAL_BATCH / two.seconds).toFixed(1)
    } images/s: ${(one.seconds / two.seconds).toFixed(2)}×.`,
  );
}

await writeRunsReport(new URL("./SCHEDULE.html", import.meta.url).pathname, {
  title: "Data-parallel schedules: lanes of the best step",
  facts: [
    ["measured", stampSummary(stamp)],
    ["devices", "2 CPU devices (Workers), master reduction"],
    ["global batch", `${GLOBAL_BATCH}`],
    ["figures", "bench/SCHEDULE.md"],
  ],
  figures,
});
await writeFileAtomic(new URL("./SCHEDULE.md", import.meta.url).pathname, [
  new TextEncoder().encode(lines.join("\n") + "\n"),
]);
