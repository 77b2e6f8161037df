/**
 * Hybrid parallelism (`hybrid` schedule): data-parallel conv body, model-parallel FC head. It must
 * train what data-parallel training trains, to rounding; keep the body's replicas identical; update
 * the head while the body's backward runs; and write checkpoints either strategy resumes.
 */

import assert from "node:assert/strict";
import type { WebGpuBackend } from "../../backends/webgpu/backend.ts";
import { DivergenceError, type Optimizer, SGD } from "../../mod.ts";
import type { ParameterEntry } from "../../engine/nn/mod.ts";
import type { Storage } from "../../backends/mod.ts";
import type { BackendDevice } from "../../schedule/devices/backend_device.ts";
import { type Device, DeviceError } from "../../schedule/devices/device.ts";
import { layoutOf } from "../../schedule/devices/parameter_layout.ts";
import { headLayout, sliceSlots, unitRange } from "../../schedule/devices/head_layout.ts";
import { hybridPlan, overlapPlan } from "../../schedule/plan/builtins.ts";
import { parseSchedule } from "../../schedule/plan/dsl.ts";
import type { Plan, ReductionMode } from "../../schedule/plan/plan.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import type { DataParallelOptions, LaneEvent } from "../../schedule/runtime/options.ts";
import {
  bits,
  probeWebGpu,
  resumeTiny,
  saveTiny,
  startGpuDevice,
  startHostPathGpuDevice,
  tinyBatch as batch,
  tinyGroups as groups,
  tinyModel as model,
  tinyOptimizers,
  webgpuTests,
} from "../fixtures/data_parallel.ts";
import { gatedTrainerOptions } from "../fixtures/gated_device.ts";
import { tinyAlexNet } from "../fixtures/networks.ts";

import { slowTest } from "../fixtures/slow.ts";

interface Run {
  plan: Plan;
  devices: number;
  mode?: ReductionMode;
  steps?: number;
  gpu?: boolean;
  accumulate?: number;
  events?: LaneEvent[];
}

async function train(
  { plan, devices, mode, steps = 20, gpu, accumulate, events }: Run,
): Promise<Float32Array> {
  const trainer = await DataParallelTrainer.create({
    model,
    devices,
    mode,
    plan,
    accumulate,
    onEvent: events ? (e) => events.push(e) : undefined,
    optimizer: tinyOptimizers.sgd,
    seed: 7,
    verifyReplicas: true,
    startDevice: gpu ? startGpuDevice : undefined,
  });
  try {
    for (let step = 0; step < steps; step++) await trainer.step(batch(step, 12));
    await trainer.syncParameters();
    return trainer.masterParameters();
  } finally {
    await trainer.close();
  }
}

const layout = (() => {
  const net = tinyAlexNet(1);
  try {
    return layoutOf(net.namedParameters());
  } finally {
    net.dispose();
  }
})();

/** The largest relative L2 difference of any one parameter tensor, and its name. */
function worstParameter(a: Float32Array, b: Float32Array): { name: string; difference: number } {
  let worst = { name: "", difference: 0 };
  for (const slot of layout.slots) {
    let diff = 0, norm = 0;
    for (let i = slot.offset; i < slot.offset + slot.size; i++) {
      diff += (a[i] - b[i]) ** 2;
      norm += b[i] ** 2;
    }
    const difference = Math.sqrt(diff / norm);
    if (!(difference <= worst.difference)) worst = { name: slot.name, difference };
  }
  return worst;
}

// Why not the same bits: the head multiplies the whole batch at once where data-parallel devices
// multiply their shards and average, so the sums over samples are grouped differently (about 1e-7
// relative per step here). Mutations that made this fail: dropping `columns` from the head's
// dropout (the slices then draw other masks), dropping the `· fround(1/N)` of the slice gradients
// (the FC update N times too large), taking the whole batch's mean loss as the seed (the conv
// gradients N times too small), and the body seed's `offset` at row 0 for every device.
Deno.test("hybrid matches data-parallel within 1e-5 on every parameter after 20 steps (2 and 3 devices)", async () => {
  for (const devices of [2, 3]) {
    const parallel = await train({ plan: overlapPlan(groups), devices });
    const split = await train({ plan: hybridPlan(groups), devices });
    const { name, difference } = worstParameter(split, parallel);
    assert.ok(difference < 1e-5, `${devices} devices: ${name} differs by ${difference}`);
    assert.ok(difference > 0, `${devices} devices: hybrid gave data-parallel's bits, so it did not split`);
  }
});

// On one device the head is the whole layer and its seed that device's shard's: every kernel sees
// the same values as data-parallel's. Mutation: the body's seed summed from the wrong partials
// (`p[1]` for `p[0]` in `HybridHead`) fails here (and in every comparison above).
Deno.test("hybrid on 1 device gives data-parallel's bits", async () => {
  const parallel = await train({ plan: overlapPlan(groups), devices: 1, steps: 4 });
  const split = await train({ plan: hybridPlan(groups), devices: 1, steps: 4 });
  assert.deepEqual(bits(split), bits(parallel));
});

// Gradient accumulation under hybrid (`head_micro_batches.ts`). On one device the head is the whole
// layer, so each micro-batch computes what data-parallel's micro-batch computes, and the sums over
// micro-batches are the same float32 additions: hybrid 1 × K gives the bits of data-parallel 1 × K
// (which are those of data-parallel K devices, accumulation_test.ts). Not those of hybrid K
// devices: there the head multiplies all K shards' rows in one product and sums the stage-0 input
// gradient over K unit slices, so only rounding-close (measured below).
// Mutations that made this fail: the head's `fround(1/K)` skipped (`SliceGradientSum.add` returning
// the sum unscaled), the body's `averageGradients` skipped in `#backwardBody`, the body gradients
// cleared between micro-batches (`this.reset()` for every micro-batch in `#forwardBody`), and the
// head's dropout without `rows` (micro-batch 1 draws micro-batch 0's masks), and the body groups
// reported after every micro-batch (`groups: step.bodyGroups` for each `backward-body`).
Deno.test("hybrid on 1 device accumulating K micro-batches gives data-parallel 1 × K's bits (K = 2, 3)", async () => {
  const single = await train({ plan: hybridPlan(groups), devices: 1, steps: 4 });
  for (const k of [2, 3]) {
    const split = await train({ plan: hybridPlan(groups), devices: 1, accumulate: k, steps: 4 });
    const parallel = await train({ plan: overlapPlan(groups), devices: 1, accumulate: k, steps: 4 });
    assert.notDeepEqual(bits(split), bits(single), `K = ${k} changed nothing`);
    assert.deepEqual(bits(split), bits(parallel), `K = ${k}`);
    const wide = await train({ plan: hybridPlan(groups), devices: k, steps: 4 });
    const { name, difference } = worstParameter(split, wide);
    assert.ok(
      difference < 1e-5,
      `K = ${k}: hybrid 1 × ${k} and hybrid ${k} devices: ${name} by ${difference}`,
    );
  }
});

// 2 devices × 2 micro-batches: the head sums each micro-batch's 2·3 gathered rows in one product
// where data-parallel sums per device, so rounding-close, not the same bits. Mutations that made
// this fail: micro-batch labels taken from the shard's start for every micro-batch (`first`
// dropped in `HybridHead.#microBatch`), the dropout `rows` of device 0's block for every block
// (`gatheredSamples` without `Math.floor(r / m) * shard`), and the sharded groups' readiness
// resolved after every micro-batch (the FC slices then update between micro-batches).
Deno.test("hybrid 2 devices × 2 micro-batches match data-parallel 2 × 2 within 1e-5 after 20 steps", async () => {
  const parallel = await train({ plan: overlapPlan(groups), devices: 2, accumulate: 2 });
  const split = await train({ plan: hybridPlan(groups), devices: 2, accumulate: 2 });
  const { name, difference } = worstParameter(split, parallel);
  assert.ok(difference < 1e-5, `${name} differs by ${difference}`);
  assert.ok(difference > 0, "hybrid gave data-parallel's bits, so it did not split");
});

// Mutation: the slice gradients written after every micro-batch (`SliceGradientSum.add` returning
// each micro-batch's gradient) trains other values and fails the first comparison with data-parallel.
// Slow (12 runs of 6 steps): runs with the slow tests. The default set checks hybrid accumulation
// against data-parallel on 1 and 2 devices (above) and master = allreduce = the sequential hybrid
// plan without accumulation (below).
Deno.test({
  name: "hybrid accumulation is lossless among hybrid runs: master, allreduce, sequential plan, 3 devices",
  ...slowTest,
}, async () => {
  const sequentialHybrid = parseSchedule(
    "shard fc\nforward\nbackward fc\nbackward conv\nupdate fc\nreduce conv\nupdate conv\nbroadcast conv",
    { groups, name: "hybrid-sequential", mode: "master" },
  );
  for (const [devices, accumulate] of [[2, 2], [2, 3], [3, 2]]) {
    const run = (plan: Plan, mode?: ReductionMode) => train({ plan, devices, accumulate, mode, steps: 6 });
    const reference = await run(hybridPlan(groups));
    const parallel = await run(overlapPlan(groups));
    const { difference } = worstParameter(reference, parallel);
    assert.ok(
      difference < 1e-5,
      `${devices} × ${accumulate}: hybrid differs from data-parallel by ${difference}`,
    );
    assert.deepEqual(
      bits(await run(hybridPlan(groups), "allreduce")),
      bits(reference),
      `${devices} × ${accumulate}`,
    );
    assert.deepEqual(bits(await run(sequentialHybrid)), bits(reference), `${devices} × ${accumulate}`);
  }
});

// Every micro-batch runs forward on every device; the conv reduce and the FC slice update start
// only after the last one. Mutation: resolving the sharded groups' readiness after every
// micro-batch (`if (last)` dropped in `HybridHead.#microBatch`) lets `update fc` start during the
// second micro-batch (and `reduce conv`, which the plan places after it).
Deno.test("a hybrid step with accumulation communicates only after the last micro-batch", async () => {
  const events: LaneEvent[] = [];
  await train({ plan: hybridPlan(groups), devices: 2, accumulate: 3, steps: 1, events });
  for (const device of [0, 1]) {
    const computes = events.filter((e) => e.lane === "compute" && e.device === device);
    assert.equal(computes.filter((e) => e.name === "forward").length, 3, `device ${device}`);
    assert.equal(computes.filter((e) => e.name === "backward conv").length, 1, `device ${device}`);
  }
  const lastForward = Math.max(
    ...events.filter((e) => e.lane === "compute" && e.name.startsWith("forward")).map((e) => e.end),
  );
  for (const name of ["update fc", "reduce conv"]) {
    const comm = events.find((e) => e.name === name)!;
    assert.ok(
      comm.start >= lastForward - 1,
      `${name} started ${lastForward - comm.start} ms before the last forward ended`,
    );
  }
});

// Mutation: the slice optimizers stepping only device 0's slice (`this.optimizers.slice(0, 1)` in
// `HybridHead.update`) leaves the other devices' units untrained and fails the first comparison.
Deno.test("hybrid runs are lossless among themselves: master, allreduce and a sequential hybrid plan", async () => {
  const reference = await train({ plan: hybridPlan(groups), devices: 2, steps: 6 });
  const allreduce = await train({ plan: hybridPlan(groups), devices: 2, steps: 6, mode: "allreduce" });
  const sequentialHybrid = parseSchedule(
    "shard fc\nforward\nbackward fc\nbackward conv\nupdate fc\nreduce conv\nupdate conv\nbroadcast conv",
    { groups, name: "hybrid-sequential", mode: "master" },
  );
  const late = await train({ plan: sequentialHybrid, devices: 2, steps: 6 });
  const parallel = await train({ plan: overlapPlan(groups), devices: 2, steps: 6 });
  assert.ok(worstParameter(reference, parallel).difference < 1e-5, "hybrid did not train like data-parallel");
  assert.deepEqual(bits(allreduce), bits(reference));
  assert.deepEqual(bits(late), bits(reference));
});

// Causal evidence, as in overlap_test.ts: device 0's conv backward report is held until that step's
// FC update has been applied, which only a runtime that updates the head during the body's backward
// can do. Mutation: `await Promise.all(computes);` before the communication loop of
// `runIteration` (`schedule/runtime/executor.ts`) makes the held report wait for ever and the step fail.
Deno.test("the FC update of a hybrid step runs while the conv backward runs", async () => {
  const gated = gatedTrainerOptions({ waitSeconds: 30 });
  const trainer = await DataParallelTrainer.create({
    model,
    devices: 2,
    plan: hybridPlan(groups),
    optimizer: tinyOptimizers.sgd,
    startDevice: gated.startDevice,
    onEvent: gated.onEvent,
  });
  try {
    for (let step = 0; step < 2; step++) await trainer.step(batch(step, 8));
  } finally {
    await trainer.close();
  }
});

// Mutations: `HybridHead.gather` without the optimizer state (momentum of the other devices' units
// lost) breaks the hybrid → hybrid resume; `scatter` skipped in `broadcastParameters` (slices keep
// zero momentum) breaks it too; gathering no parameter slices writes stale units and breaks both.
Deno.test("hybrid checkpoints hold whole tensors and resume under either strategy", async () => {
  const dir = await Deno.makeTempDir();
  const create = (plan: Plan) =>
    DataParallelTrainer.create({
      model,
      devices: 2,
      plan,
      optimizer: tinyOptimizers.sgd,
      seed: 7,
      verifyReplicas: true,
    });
  const run = async (plan: Plan, from: string | undefined, to: number, save?: string) => {
    const trainer = await create(plan);
    try {
      let step = 0;
      if (from) {
        step = (await resumeTiny(trainer, from)).step;
      }
      for (; step < to; step++) await trainer.step(batch(step, 12));
      if (save) await saveTiny(trainer, save);
      await trainer.syncParameters();
      return trainer.masterParameters();
    } finally {
      await trainer.close();
    }
  };
  try {
    const split = `${dir}/hybrid.safetensors`, whole = `${dir}/parallel.safetensors`;
    const straightHybrid = await run(hybridPlan(groups), undefined, 6);
    const straightParallel = await run(overlapPlan(groups), undefined, 6);
    await run(hybridPlan(groups), undefined, 3, split);
    await run(overlapPlan(groups), undefined, 3, whole);
    assert.deepEqual(bits(await run(hybridPlan(groups), split, 6)), bits(straightHybrid), "hybrid → hybrid");
    const parallelFromHybrid = await run(overlapPlan(groups), split, 6);
    const hybridFromParallel = await run(hybridPlan(groups), whole, 6);
    for (
      const [name, resumed, straight] of [
        ["hybrid → data-parallel", parallelFromHybrid, straightParallel],
        ["data-parallel → hybrid", hybridFromParallel, straightHybrid],
      ] as const
    ) {
      const { name: worst, difference } = worstParameter(resumed, straight);
      assert.ok(difference < 1e-5, `${name}: ${worst} differs by ${difference}`);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("each device holds its units of every head layer, as even as they split", () => {
  const net = tinyAlexNet(1);
  try {
    const head = headLayout(net, ["fc"], 3);
    assert.deepEqual(head.stages.map((s) => [s.linear, s.after, s.inFeatures, s.units]), [
      ["fc1", ["relu3", "drop1"], 256, 64],
      ["fc2", [], 64, 5],
    ]);
    assert.deepEqual([0, 1, 2].map((d) => unitRange(5, 3, d)), [
      { start: 0, end: 1 },
      { start: 1, end: 3 },
      { start: 3, end: 5 },
    ]);
    // Every element of the head belongs to exactly one device.
    const owners = new Uint8Array(layout.total);
    for (const d of [0, 1, 2]) {
      for (const slot of sliceSlots(layout, head, d)) {
        owners.fill(owners[slot.offset] + 1, slot.offset, slot.offset + slot.size);
      }
    }
    for (const slot of layout.slots) {
      const expected = slot.group === "fc" ? 1 : 0;
      assert.ok(
        owners.subarray(slot.offset, slot.offset + slot.size).every((o) => o === expected),
        slot.name,
      );
    }
  } finally {
    net.dispose();
  }
});

Deno.test("hybrid refuses what it cannot split, naming the layer, before any step", async () => {
  await assert.rejects(
    DataParallelTrainer.create({
      model: { ...model, groups: { conv2: "fc" } },
      devices: 2,
      plan: hybridPlan(groups),
      optimizer: tinyOptimizers.sgd,
    }),
    /layer conv2 \(Conv2d\) is in the model-parallel head/,
  );
  const net = tinyAlexNet(1);
  try {
    assert.throws(() => headLayout(net, ["fc"], 6), /fc2 has 5 output units, fewer than the 6 devices/);
  } finally {
    net.dispose();
  }
});

const gpuTest = webgpuTests(await probeWebGpu("hybrid on WebGPU devices"));

gpuTest("WebGPU devices run hybrid (GPU-resident) and match data-parallel within 1e-5", async () => {
  const parallel = await train({ plan: overlapPlan(groups), devices: 2, steps: 6, gpu: true });
  const split = await train({ plan: hybridPlan(groups), devices: 2, steps: 6, gpu: true });
  const { name, difference } = worstParameter(split, parallel);
  assert.ok(difference < 1e-5, `${name} differs by ${difference}`);
});

// WebGPU devices run the same head shard (GPU-resident), its sums as the GPU's kernels.
// Mutation: the head's `fround(1/K)` skipped (`SliceGradientSum.add` returning the sum) fails it.
gpuTest(
  "WebGPU devices accumulate under hybrid: 1 device × 2 micro-batches gives data-parallel 1 × 2's bits",
  async () => {
    const parallel = await train({
      plan: overlapPlan(groups),
      devices: 1,
      accumulate: 2,
      steps: 3,
      gpu: true,
    });
    const split = await train({ plan: hybridPlan(groups), devices: 1, accumulate: 2, steps: 3, gpu: true });
    assert.deepEqual(bits(split), bits(parallel));
  },
);

// ---------------------------------------------------------------------------------------------
// GPU-resident hybrid: WebGPU devices keep the body's parameters, gradients and optimizer state on
// their GPUs (exchanged by ResidentExchange), and each device's head slice and its optimizer state
// on its own GPU, updated there (`devices/head_slices.ts`).

/**
 * Asserts that `a` and `b` hold the same bits, saying how many elements differ (a plain deepEqual
 * of thousands of elements spends minutes on its diff).
 */
function sameBits(
  a: Float32Array | Uint8Array | Uint32Array,
  b: Float32Array | Uint8Array | Uint32Array,
  what: string,
): void {
  const x = a instanceof Float32Array ? bits(a) : a, y = b instanceof Float32Array ? bits(b) : b;
  assert.equal(x.length, y.length, `${what}: lengths`);
  let differ = 0, first = -1;
  for (let i = 0; i < x.length; i++) {
    if (x[i] !== y[i]) {
      differ++;
      if (first < 0) first = i;
    }
  }
  assert.equal(differ, 0, `${what}: ${differ} of ${x.length} elements differ, the first at ${first}`);
}

/** A hybrid trainer on WebGPU devices (resident unless `start` says otherwise), recording its optimizers. */
async function gpuHybrid(
  options: {
    devices?: number;
    mode?: ReductionMode;
    start?: DataParallelOptions["startDevice"];
    make?: (p: ParameterEntry[]) => Optimizer;
  } & Partial<DataParallelOptions> = {},
): Promise<{ trainer: DataParallelTrainer; optimizers: Optimizer[] }> {
  const optimizers: Optimizer[] = [];
  const { devices = 2, start = startGpuDevice, make = tinyOptimizers.sgd, ...rest } = options;
  const trainer = await DataParallelTrainer.create({
    model,
    devices,
    plan: hybridPlan(groups),
    optimizer: (p) => {
      const optimizer = make(p);
      optimizers.push(optimizer);
      return optimizer;
    },
    seed: 7,
    startDevice: start,
    ...rest,
  });
  return { trainer, optimizers };
}

/** The bits of every parameter and state slot of `optimizers`, read off their devices. */
async function optimizerBits(optimizers: readonly Optimizer[]): Promise<Uint32Array[]> {
  const values: Float32Array[] = [];
  for (const optimizer of optimizers) {
    for (const p of optimizer.parameters) values.push((await p.tensor.data()) as Float32Array);
    for (const slots of optimizer.state().perParameter.values()) {
      for (const t of Object.values(slots)) values.push((await t.data()) as Float32Array);
    }
  }
  return values.map(bits);
}

/** `steps` hybrid steps from `from`; the exchange's name and the master's parameters after them. */
async function gpuRun(
  options: Parameters<typeof gpuHybrid>[0],
  steps: number,
): Promise<{ exchange: string; parameters: Float32Array }> {
  const { trainer } = await gpuHybrid({ verifyReplicas: true, ...options });
  try {
    for (let step = 0; step < steps; step++) await trainer.step(batch(step, 12));
    await trainer.syncParameters();
    return { exchange: trainer.exchange, parameters: trainer.masterParameters() };
  } finally {
    await trainer.close();
  }
}

// Measured: 0 of 17,445 parameters differ after 6 steps between the resident run (GPU averaging,
// GPU SGD kernels for the conv body and every FC slice) and the host path (the same GPU forward and
// backward, averaging and SGD on the host), in either reduction; the WGSL SGD rounds as the host's
// kernel (one rounding per operation, no fused multiply-add). Against CPU devices (another forward)
// the difference is rounding: 3.9e-7 relative L2 on the worst tensor (fc2.bias). Mutations that
// made this fail: the hybrid exclusion put back in `startInProcess` (`&& !hybrid`: "shared memory",
// the host path, taken silently); `DeviceSlices` copying every device's slice from the layer's first
// rows (`offset: 0` for `slot.offset - fullSlot.offset`); and `DeviceSlices.gradient` not writing
// the slice's gradient (`target.assign` dropped: the slices never move). (`HybridHead.update`
// stepping only device 0's slice fails the CPU tests above, not this one: both paths share it.)
// Slow (three WebGPU runs and a CPU one): runs with the slow tests. The default set runs resident hybrid on WebGPU
// devices against data-parallel (within 1e-5) and on 1 device against resident data-parallel's bits.
gpuTest.slow(
  "WebGPU devices run hybrid GPU-resident and give the host path's bits (master, allreduce)",
  async () => {
    const host = await gpuRun({ start: startHostPathGpuDevice }, 6);
    assert.equal(host.exchange, "shared memory");
    for (const mode of ["master", "allreduce"] as const) {
      const resident = await gpuRun({ mode }, 6);
      assert.equal(resident.exchange, "GPU-resident", mode);
      sameBits(resident.parameters, host.parameters, mode);
    }
    const cpu = await train({ plan: hybridPlan(groups), devices: 2, steps: 6 });
    const { name, difference } = worstParameter(host.parameters, cpu);
    console.log(
      `resident WebGPU hybrid vs CPU hybrid after 6 steps: ${name} by ${difference.toExponential(2)}`,
    );
    assert.ok(difference < 1e-5, `${name} differs by ${difference}`);
  },
);

// Adam's fused WGSL update rounds as the host's too, and accumulation's slice sums run on the GPU
// either way (measured: 0 differing parameters after 5 steps, master and allreduce). Mutation: the
// resident device running its head on host slices (`this.#slices ??` dropped in
// `BackendDevice.#runHead`: the stale host mirrors are read, the GPU slices' gradients stay zero).
// Slow (three WebGPU runs): runs with the slow tests. The default set accumulates under hybrid on a
// WebGPU device and trains Adam on GPU devices (optimizers_data_parallel_test.ts).
gpuTest.slow("resident hybrid with Adam and 2 micro-batches gives the host path's bits", async () => {
  const options = { make: tinyOptimizers.adam, accumulate: 2 };
  const host = await gpuRun({ ...options, start: startHostPathGpuDevice }, 5);
  for (const mode of ["master", "allreduce"] as const) {
    const resident = await gpuRun({ ...options, mode }, 5);
    assert.equal(resident.exchange, "GPU-resident");
    sameBits(resident.parameters, host.parameters, mode);
  }
});

// On one device the resident head is the whole layer on the GPU, so it computes what resident
// data-parallel computes. Mutation: the resident device writing its body from the host mirror
// before each forward as on the host path (`!state &&` dropped in `BackendDevice.#runHead`) resets
// the body to its initial values every step and fails it.
gpuTest("resident hybrid on 1 WebGPU device gives resident data-parallel's bits", async () => {
  // Without `verifyReplicas`, whose syncs would refresh the host mirrors a wrong read could use.
  const split = await gpuRun({ devices: 1, verifyReplicas: false }, 4);
  const parallel = await gpuRun({ devices: 1, plan: overlapPlan(groups), verifyReplicas: false }, 4);
  assert.equal(split.exchange, "GPU-resident");
  assert.equal(parallel.exchange, "GPU-resident");
  sameBits(split.parameters, parallel.parameters, "hybrid vs data-parallel");
});

// The slices, their gradients and their optimizer state never cross to the host in a step, nor
// do the body's parameters (only its gradients, to the master, and the master's broadcast).
// Mutation: `HybridHead` given `resident: false` in `DataParallelTrainer.create` (the slice
// optimizers over the host mirrors) reads the NaN mirrors and fails the host-buffer checks.
gpuTest("a resident hybrid step keeps every FC slice and its optimizer state on its GPU", async () => {
  const { trainer, optimizers } = await gpuHybrid();
  try {
    const devices = trainer.devices as BackendDevice<WebGpuBackend>[];
    for (const device of devices) {
      device.parameters.fill(NaN);
      device.gradients.fill(NaN);
    }
    // The exchange's master optimizer first, then one per device's slice.
    assert.equal(optimizers.length, 1 + devices.length);
    const slices = optimizers.slice(1);
    const kept = devices.map(() => new Set<Storage>());
    for (const [d, optimizer] of slices.entries()) {
      for (const p of optimizer.parameters) {
        assert.ok(p.tensor.backend === devices[d].backend, `slice ${p.name} is not on device ${d}'s GPU`);
        kept[d].add(p.tensor.storage);
        kept[d].add(p.tensor.grad!.storage);
      }
      for (const slots of optimizer.state().perParameter.values()) {
        for (const t of Object.values(slots)) kept[d].add(t.storage);
      }
    }
    const moved = devices.map(() => 0);
    const stops = devices.map((device, d) =>
      device.backend.observeTransfers((e) => {
        if (kept[d].has(e.storage)) moved[d] += e.bytes;
      })
    );
    for (let step = 0; step < 3; step++) await trainer.step(batch(step, 12));
    stops.forEach((stop) => stop());
    assert.deepEqual(moved, devices.map(() => 0), "bytes of slices or slice state moved");
    for (const device of devices) {
      assert.ok(device.parameters.every(Number.isNaN), `device ${device.index}: host parameters touched`);
      assert.ok(device.gradients.every(Number.isNaN), `device ${device.index}: host gradients touched`);
    }
    await trainer.syncParameters();
    assert.ok(trainer.masterParameters().every(Number.isFinite));
    assert.deepEqual(await trainer.divergentReplicas(), []);
  } finally {
    await trainer.close();
  }
});

// `syncParameters` gathers every device's slices and slice state into the master's GPU tensors,
// which the checkpoint reads: the resident run's file is byte for byte the host path's. Resumed,
// `broadcastParameters` and `HybridHead.scatter` hand every device its slice and state back on its
// GPU. Mutations that made this fail: `gather` not copying the slice state (`wholeState` left
// empty: the momentum of device 1's units is lost and the resumed run differs; both paths share
// `gather`, so the files still agree), `gather` not writing the
// master's GPU tensors (`receiveParameters` dropped: the file holds device 0's stale rows), and
// `scatter` not writing the slices' parameters (`parameter.assign` dropped: the slices resume from
// their initial values), and `Tensor.assign` copying a tensor onto itself (`gather`'s `loadState`
// of the body's own state: WebGPU refuses one buffer bound for reading and writing in a dispatch).
// Slow (five WebGPU runs): runs with the slow tests. The default set resumes hybrid checkpoints on
// CPU devices (above) and data-parallel checkpoints on WebGPU devices (webgpu_data_parallel_test.ts).
gpuTest.slow("resident hybrid checkpoints hold whole tensors and resume bit for bit", async () => {
  const dir = await Deno.makeTempDir();
  const run = async (
    start: DataParallelOptions["startDevice"],
    from: string | undefined,
    save?: string,
    mode: ReductionMode = "master",
  ) => {
    const { trainer } = await gpuHybrid({ start, verifyReplicas: true, mode });
    try {
      let step = 0;
      if (from) {
        step = (await resumeTiny(trainer, from)).step;
      }
      for (; step < (save ? 3 : 6); step++) await trainer.step(batch(step, 12));
      await trainer.syncParameters();
      if (save) await saveTiny(trainer, save);
      return trainer.masterParameters();
    } finally {
      await trainer.close();
    }
  };
  try {
    const resident = `${dir}/resident.safetensors`, host = `${dir}/host.safetensors`;
    await run(startGpuDevice, undefined, resident);
    await run(startHostPathGpuDevice, undefined, host);
    sameBits(await Deno.readFile(resident), await Deno.readFile(host), "the checkpoint files");
    const straight = await run(startGpuDevice, undefined);
    sameBits(await run(startGpuDevice, resident), straight, "resident → resident");
    // Allreduce: every device's whole-layout optimizer takes the master's state on its GPU too.
    sameBits(await run(startGpuDevice, resident, undefined, "allreduce"), straight, "allreduce resume");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// Device 1 throws in its conv backward, reported only once the FC slices have been updated on the
// GPUs, so the rollback has slice updates to undo. Every update is undoable under the default
// `checkFinite`, on the GPU. Mutation: the trainer's failure path undoing only the exchange's
// optimizers (`...this.#hybrid?.optimizers ?? []` dropped in `#fail`) leaves the slices updated
// and their iteration half done (the read after the failure throws).
gpuTest(
  "a failed resident hybrid step rolls the slices, the body and their state back bit for bit",
  async () => {
    let fcUpdated: () => void = () => {};
    const updated = new Promise<void>((resolve) => (fcUpdated = resolve));
    let failConv = false;
    const { trainer, optimizers } = await gpuHybrid({
      onEvent: (e: LaneEvent) => {
        if (e.step === 1 && e.name === "update fc") fcUpdated();
      },
      start: async (index, spec, layout) => {
        const inner = await startGpuDevice(index, spec, layout);
        if (index !== 1) return inner;
        const device: Device = {
          index,
          kind: inner.kind,
          parameters: inner.parameters,
          gradients: inner.gradients,
          resident: inner.resident,
          sharded: {
            ...inner.sharded,
            runHead: (iteration, phase, onGradients) =>
              inner.sharded.runHead(iteration, phase, (group) => {
                if (failConv && group === "conv") throw new Error("injected failure in backward conv");
                onGradients?.(group);
              }).catch(async (error) => {
                await updated;
                throw error;
              }),
          },
          compute: (command, onGradients) => inner.compute(command, onGradients),
          close: () => inner.close(),
        };
        return device;
      },
    });
    const read = () => optimizerBits(optimizers);
    try {
      assert.equal(trainer.exchange, "GPU-resident");
      await trainer.step(batch(0, 12));
      const before = await read();
      failConv = true;
      await assert.rejects(
        trainer.step(batch(1, 12)),
        (e: unknown) =>
          e instanceof DeviceError && e.device === 1 && /injected failure in backward conv/.test(e.message),
      );
      assert.equal(trainer.iteration, 1);
      assert.deepEqual(await read(), before, "rollback");
      await assert.rejects(trainer.step(batch(2, 12)), /a device failed earlier: device 1/);
    } finally {
      await trainer.close();
    }
  },
);

// The trainer checks every updated group for NaN/∞ after its update: the slices through their own
// optimizers, on the GPU (`firstNonFinite`). A rate past float32's range (1e300 rounds to ∞) breaks
// the FC slices in step 1's first update, which the plan checks first; the step is rolled back on
// the GPUs. Mutation: the slices' check dropped (`checkLater(hybrid!.optimizers, group)` in
// `runIteration`) lets the conv check report it instead, naming a conv tensor.
gpuTest(
  "a resident hybrid update that overflows fails naming an FC slice's tensor, rolled back on the GPUs",
  async () => {
    const { trainer, optimizers } = await gpuHybrid({
      make: (p) => new SGD(p, { lr: 1e300, momentum: 0.9 }),
    });
    try {
      assert.equal(trainer.exchange, "GPU-resident");
      const before = await optimizerBits(optimizers);
      const error = await trainer.step(batch(0, 12)).then(() => undefined, (e: unknown) => e);
      assert.ok(error instanceof DivergenceError, `not a DivergenceError: ${error}`);
      assert.equal(error.step, 1);
      assert.equal(error.quantity, "parameter");
      assert.match(error.tensor!, /^fc\d\./);
      assert.match(error.message, /gradient was finite: the update overflowed/);
      assert.ok(error.rolledBack);
      assert.equal(trainer.iteration, 0);
      const after = await optimizerBits(optimizers);
      assert.equal(after.length, before.length);
      after.forEach((part, i) => sameBits(part, before[i], `parameter or state ${i}`));
    } finally {
      await trainer.close();
    }
  },
);
