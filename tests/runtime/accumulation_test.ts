/**
 * Gradient accumulation (`accumulate: K`): a device runs its shard as K micro-batches and the step
 * communicates after the last one only. Compared bit for bit with K data-parallel devices, which is
 * what the arithmetic makes it equal to (see `replicaStep`).
 */

import assert from "node:assert/strict";
import { SGD, trainStep } from "../../mod.ts";
import { overlapPlan, sequentialPlan } from "../../schedule/plan/builtins.ts";
import type { Plan, ReductionMode } from "../../schedule/plan/plan.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import type { LaneEvent } from "../../schedule/runtime/options.ts";
import { probeWebGpu, startGpuDevice, webgpuTests } from "../fixtures/data_parallel.ts";
import { tinyAlexNet } from "../fixtures/networks.ts";
import {
  bits,
  flatParameters,
  relativeDifference,
  tinyBatch as batch,
  tinyGroups as groups,
  tinyModel as model,
  tinyOptimizers,
} from "../fixtures/data_parallel.ts";
import { tensor } from "../../mod.ts";

interface Run {
  devices: number;
  accumulate?: number;
  plan?: Plan;
  mode?: ReductionMode;
  events?: LaneEvent[];
  gpu?: boolean;
}

async function train(
  { devices, accumulate, plan, mode, events, gpu }: Run,
  steps = 3,
): Promise<Float32Array> {
  const trainer = await DataParallelTrainer.create({
    model,
    devices,
    accumulate,
    mode,
    plan: plan ?? overlapPlan(groups),
    optimizer: tinyOptimizers.sgd,
    seed: 7,
    verifyReplicas: true,
    onEvent: events ? (e) => events.push(e) : undefined,
    startDevice: gpu ? startGpuDevice : undefined,
  });
  try {
    // 12 samples: shards of 12, 6 and 3 split into 2, 3 or 4 micro-batches as each test needs.
    for (let step = 0; step < steps; step++) await trainer.step(batch(step, 12));
    return trainer.masterParameters();
  } finally {
    await trainer.close();
  }
}

// Mutation: reporting the groups after every micro-batch (passing `groups` to each, not only the
// last) ships the first micro-batch's gradients alone, and these bits no longer match; so does
// dropping the final `fround(1/K)` scaling, or keying dropout by the shard instead of the
// micro-batch (`sampleOffset` without `+ k * size`).
Deno.test("1 device accumulating K micro-batches gives the bits of K devices (K = 2, 3)", async () => {
  const single = await train({ devices: 1 });
  for (const k of [2, 3]) {
    const accumulated = await train({ devices: 1, accumulate: k });
    const parallel = await train({ devices: k });
    assert.notDeepEqual(bits(accumulated), bits(single), `K = ${k} changed nothing`);
    assert.deepEqual(bits(accumulated), bits(parallel), `K = ${k}`);
  }
});

Deno.test("accumulation stays lossless across schedules and reductions", async () => {
  const reference = await train({ devices: 2, accumulate: 2, plan: sequentialPlan(groups) });
  assert.deepEqual(bits(await train({ devices: 2, accumulate: 2 })), bits(reference));
  assert.deepEqual(bits(await train({ devices: 2, accumulate: 2, mode: "allreduce" })), bits(reference));
});

// 2 devices × 2 micro-batches add ((g0 + g1) + (g2 + g3)), 4 devices (((g0 + g1) + g2) + g3): the
// same sum grouped differently, so close but not the same bits (as documented).
Deno.test("2 devices × 2 micro-batches match 4 devices within 1e-5", async () => {
  const accumulated = await train({ devices: 2, accumulate: 2 });
  const four = await train({ devices: 4 });
  const difference = relativeDifference(accumulated, four);
  assert.ok(difference < 1e-5, `differ by ${difference}`);
});

// Mutation: running the micro-batches' backward segmented (groups on every micro-batch) makes the
// device report `fc` during the first micro-batch, before the second forward has even run.
Deno.test("the step communicates only after the last micro-batch", async () => {
  const events: LaneEvent[] = [];
  await train({ devices: 2, accumulate: 3, plan: overlapPlan(groups), events }, 1);
  const computes = events.filter((e) => e.lane === "compute" && e.device === 1);
  const reduceFc = events.find((e) => e.name === "reduce fc")!;
  const forward = computes.find((e) => e.name === "forward")!;
  const backwardFc = computes.find((e) => e.name === "backward fc")!;
  assert.equal(computes.filter((e) => e.name === "backward fc").length, 1);
  // The forward span covers every micro-batch up to the last forward; fc is reported after it.
  assert.ok(backwardFc.start >= forward.end && reduceFc.start >= backwardFc.end - 1);
});

// Mutation: dropping `microBatches: options.accumulate` in trainStep makes it one pass over the
// batch, which differs in the last bits from 2 devices.
Deno.test("trainStep accumulates the same way: 2 micro-batches give the bits of 2 devices", async () => {
  const net = tinyAlexNet(1);
  const optimizer = tinyOptimizers.sgd(net.namedParameters());
  try {
    for (let step = 0; step < 3; step++) {
      const { images, labels, shape } = batch(step, 12);
      const imageTensor = tensor(images, { shape });
      const labelTensor = tensor(labels, { dtype: "int32" });
      try {
        await trainStep(net, optimizer, { images: imageTensor, labels: labelTensor }, {
          seed: 7,
          accumulate: 2,
        });
      } finally {
        imageTensor.dispose();
        labelTensor.dispose();
      }
    }
    const flat = flatParameters(net);
    const parallel = await train({ devices: 2 });
    assert.deepEqual(bits(flat), bits(parallel));
  } finally {
    net.dispose();
  }
});

Deno.test("accumulation refuses what does not split, before any work", async () => {
  const base = {
    model,
    plan: sequentialPlan(groups),
    optimizer: (p: Parameters<typeof tinyOptimizers.sgd>[0]) => new SGD(p, { lr: 0.01 }),
  };
  await assert.rejects(
    DataParallelTrainer.create({ ...base, devices: 1, accumulate: 0 }),
    /accumulate must be a positive integer, got 0/,
  );
  const trainer = await DataParallelTrainer.create({ ...base, devices: 2, accumulate: 4 });
  try {
    await assert.rejects(
      trainer.step(batch(0, 12)),
      /a shard of 6 samples per device does not split into 4 equal micro-batches/,
    );
  } finally {
    await trainer.close();
  }
});

const gpuTest = webgpuTests(await probeWebGpu("accumulation on WebGPU devices"));

gpuTest("WebGPU devices accumulate too: 1 device × 2 micro-batches gives the bits of 2 devices", async () => {
  const accumulated = await train({ devices: 1, accumulate: 2, gpu: true }, 2);
  const parallel = await train({ devices: 2, gpu: true }, 2);
  assert.deepEqual(bits(accumulated), bits(parallel));
});
