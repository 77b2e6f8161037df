/**
 * The overlap itself, on the in-process exchanges (shared memory between CPU Worker devices, and
 * GPU-resident WebGPU devices): under `overlap` the runtime reduces the FC gradients and applies the
 * FC update while the devices still run the conv backward; under `sequential` it does not.
 *
 * Two kinds of evidence, each failing if the runtime waits for every backward before communicating
 * (the one-line bug `await Promise.all(computes);` before the communication loop of
 * `runIteration` in `schedule/runtime/executor.ts`):
 * - causal: device 0's conv backward is held until the runtime has applied that step's FC update
 *   (tests/fixtures/gated_device.ts), which only an overlapping runtime can do;
 * - timing: in the lane trace, the master's `update fc` ends before the step's last `backward conv`.
 *
 * Without a WebGPU adapter the GPU-resident tests are registered as ignored, saying so.
 */

import assert from "node:assert/strict";
import {
  DataParallelTrainer,
  DeviceError,
  overlapPlan,
  type Plan,
  sequentialPlan,
  TraceRecorder,
} from "../../mod.ts";
import type { HostBatch } from "../../schedule/runtime/mod.ts";
import type { ReductionMode } from "../../schedule/mod.ts";
import {
  networks,
  probeWebGpu,
  startGpuDevice,
  syntheticBatch,
  tinyBatch,
  tinyGroups as groups,
  tinyModel,
  tinyOptimizers,
} from "../fixtures/data_parallel.ts";
import { gatedTrainerOptions, type StartDevice } from "../fixtures/gated_device.ts";

import { runSlowTests } from "../fixtures/slow.ts";

const webgpu = await probeWebGpu("overlap: no WebGPU adapter, skipping the GPU-resident overlap tests");

const optimizer = tinyOptimizers.sgd;

/** A model and its batches. */
interface Workload {
  model: { kind: "module"; url: string; exportName: string; args: unknown[] };
  batch: (step: number) => HostBatch;
}

/** The tiny AlexNet-shaped net: enough for the causal tests, which do not depend on timing. */
const tiny: Workload = {
  model: tinyModel,
  batch: (step) => tinyBatch(step, 8, 500),
};

/**
 * For the CPU trace: a conv backward of tens of milliseconds per 8-sample shard against well under
 * 1 ms of FC reduce and update, a margin the 2-core test machine running test files in parallel
 * keeps (in 11 full parallel runs on 2026-12-05 the FC update led the last conv backward by 10–215
 * ms under overlap; sequential's never led).
 */
const wide: Workload = {
  model: { kind: "module", url: networks, exportName: "wideConvNet", args: [1, 64] },
  batch: (step) => syntheticBatch(step, { size: 16, seed: 500, sample: [3, 32, 32], classes: 10 }),
};

/** How one exchange's devices are started. */
interface ExchangeCase {
  /** The trainer's name for it. */
  exchange: string;
  /** Starts a real device (undefined: the trainer's default CPU Worker). */
  start?: StartDevice;
  /** The trace test's workload. */
  traced: Workload;
  ignore: boolean;
}

const cases: ExchangeCase[] = [
  { exchange: "shared memory", traced: wide, ignore: false },
  {
    exchange: "GPU-resident",
    start: startGpuDevice,
    // On a software adapter (llvmpipe) the wide net takes seconds a step; the GPU-resident runtime
    // queues the FC update ahead of device 0's last synchronize whatever the net's size.
    traced: tiny,
    ignore: !webgpu,
  },
];

async function gatedTrainer(c: ExchangeCase, plan: Plan, mode: ReductionMode, waitSeconds: number) {
  const gated = gatedTrainerOptions({ start: c.start, waitSeconds });
  const trainer = await DataParallelTrainer.create({
    model: tiny.model,
    devices: 2,
    mode,
    plan,
    optimizer,
    startDevice: gated.startDevice,
    onEvent: gated.onEvent,
    timeoutSeconds: 60,
  });
  assert.equal(trainer.exchange, c.exchange);
  assert.match(trainer.devices[0].kind, /^gated-/);
  return trainer;
}

/** Per step: how long before the step's last `backward conv` ended the master's `update fc` ended. */
async function updateLeads(c: ExchangeCase, plan: Plan, steps: number): Promise<number[]> {
  const trace = new TraceRecorder();
  const trainer = await DataParallelTrainer.create({
    model: c.traced.model,
    devices: 2,
    plan,
    optimizer,
    startDevice: c.start,
    trace,
    timeoutSeconds: 60,
  });
  try {
    assert.equal(trainer.exchange, c.exchange);
    for (let step = 0; step < steps; step++) await trainer.step(c.traced.batch(step));
  } finally {
    await trainer.close();
  }
  const leads: number[] = [];
  for (let step = 0; step < steps; step++) {
    const spans = trace.spans.filter((s) => s.step === step);
    const update = spans.find((s) => s.lane === "comm" && s.device === 0 && s.name === "update fc");
    const convs = spans.filter((s) => s.lane === "compute" && s.name === "backward conv");
    assert.ok(update, `step ${step}: no "update fc" span of device 0`);
    assert.equal(convs.length, 2, `step ${step}: expected a "backward conv" span per device`);
    leads.push(Math.max(...convs.map((s) => s.end)) - update.end);
  }
  return leads;
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1];

for (const c of cases) {
  // Catches `await Promise.all(computes);` before the communication loop of
  // runIteration: the runtime then never applies the FC update while device 0's conv
  // backward is held, and the step fails with the gate's "did not overlap" error after 30 s. (The
  // gate waited 10 s until a parallel CI run, every core busy, once failed it at step 2 and then
  // passed again, alone and in the full suite; with 30 s a fresh-clone CI run failed it at step 2
  // once more (2026-12-05): a rare hang, not yet reproduced. The gate's message now says where the
  // step stood: device 0's reports in order, device 1's, and the runtime's last lane event. A lead
  // ruled out: `deno test` processes that requested a WebGPU adapter (Mesa through EGL) abort at
  // exit in 2-6% of short runs, Workers or not, and none of 300 without the adapter: at teardown a
  // tokio thread unloads Mesa's EGL libraries (dlclose) while the main thread's exit() runs
  // libEGL's destructor (gdb, core dumps). Only at exit, so it cannot stall a step; 249 runs of
  // this test beside 7 full runs (2026-12-05) gave 6 such exits and no hang.)
  Deno.test({
    name: `overlap (${c.exchange}): the FC update is applied while device 0's conv backward waits for it`,
    ignore: c.ignore,
    fn: async () => {
      for (const mode of ["master", "allreduce"] as const) {
        const trainer = await gatedTrainer(c, overlapPlan(groups), mode, 30);
        try {
          for (let step = 0; step < 4; step++) {
            const result = await trainer.step(tiny.batch(step));
            assert.ok(Number.isFinite(result.loss), `${mode}: step ${step} loss ${result.loss}`);
          }
        } finally {
          await trainer.close();
        }
      }
    },
  });

  // The control: the gate can fail. `sequential` waits for every backward before reducing, so the
  // held conv backward deadlocks the step, which the gate ends with an error naming the cause.
  Deno.test({
    name: `overlap (${c.exchange}): under sequential the gated conv backward fails fast, naming the cause`,
    ignore: c.ignore,
    fn: async () => {
      const trainer = await gatedTrainer(c, sequentialPlan(groups), "master", 2);
      try {
        // The gate's own message (its 2 s wait), not a step timeout: it failed on the cause.
        await assert.rejects(trainer.step(tiny.batch(0)), (error: Error) => {
          assert.ok(error instanceof DeviceError, `not a DeviceError: ${error}`);
          assert.equal(error.device, 0);
          // Then where the step stood: device 0's reports, device 1's progress so far (how far it
          // got in the 2 s varies with the machine's load), no lane event.
          assert.match(
            error.message,
            new RegExp(
              "^device 0: conv backward of step 0 waited 2 s for that step's FC update, which never came: " +
                "the runtime did not overlap the FC update with the conv backward " +
                "\\(reports passed: fc; held: conv; (device 1: reported fc(, reported conv(, finished)?)?; )?" +
                "the runtime's last event of step 0: none\\)$",
            ),
          );
          return true;
        });
      } finally {
        await trainer.close();
      }
    },
  });

  // Catches `await Promise.all(computes);` before the communication loop of
  // runIteration: every `update fc` then ends after the last `backward conv`.
  Deno.test({
    name: `overlap (${c.exchange}): the trace shows the FC update ending before the conv backward`,
    // GPU-resident: slow (24 traced steps on the software adapter), runs with the slow tests; the
    // default set runs its causal test above and the shared-memory trace.
    ignore: c.ignore || (c.exchange === "GPU-resident" && !runSlowTests),
    fn: async () => {
      const steps = 12;
      const overlapped = await updateLeads(c, overlapPlan(groups), steps);
      const serial = await updateLeads(c, sequentialPlan(groups), steps);
      const ms = (values: number[]) => values.map((v) => v.toFixed(1)).join(" ");
      console.log(
        `overlap (${c.exchange}): update fc ends before the last backward conv by (ms) ` +
          `overlap [${ms(overlapped)}] median ${median(overlapped).toFixed(1)}; ` +
          `sequential [${ms(serial)}] median ${median(serial).toFixed(1)}`,
      );
      const ahead = (values: number[]) => values.filter((v) => v > 0).length;
      assert.ok(
        ahead(overlapped) >= 0.9 * steps,
        `overlap: update fc ended first in only ${ahead(overlapped)} of ${steps} steps: [${ms(overlapped)}]`,
      );
      assert.equal(ahead(serial), 0, `sequential: update fc ended before a conv backward: [${ms(serial)}]`);
    },
  });
}
