/**
 * Divergence: the runtime checks every update's parameters for NaN and ±∞ (a backend reduction),
 * and a step that breaks the weights or the loss fails with a `DivergenceError` naming the step and
 * tensor, rolled back to the last finite parameters and optimizer state (CPU and WebGPU alike: the
 * WebGPU reduction is compared with the CPU scan). Checkpoints never hold a
 * non-finite value: saving refuses one, and loading refuses one naming the tensor.
 *
 * Each test names the mutation it was seen to catch.
 */

import assert from "node:assert/strict";
import { Adam, CheckpointError, loadCheckpoint, saveCheckpoint, SGD, tensor } from "../../mod.ts";
import { findNonFinite } from "../../engine/mod.ts";
import { loadSafetensors, saveSafetensors } from "../../engine/io/mod.ts";
import type { ParameterEntry } from "../../engine/nn/mod.ts";
import { firstNonFiniteIndex } from "../../backends/cpu/elementwise.ts";
import { moduleWebGpu } from "../fixtures/webgpu.ts";
import { overlapPlan, sequentialPlan } from "../../schedule/plan/builtins.ts";
import type { Plan, ReductionMode } from "../../schedule/plan/plan.ts";
import { checkUpdatedGroup, DivergenceError } from "../../schedule/runtime/finite.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import type { DataParallelOptions } from "../../schedule/runtime/options.ts";
import {
  bits,
  startGpuDevice,
  tinyBatch as batch,
  tinyGroups as groups,
  tinyModel as model,
} from "../fixtures/data_parallel.ts";

/** Floats whose bits are on the edge of finite: a check must keep every one of them. */
const FINITE_EDGES = [0, -0, 1e-45, -1e-45, 1.1754942e-38, 3.4028234663852886e38, -3.4028234663852886e38];

// Mutation: `v !== v` instead of `v - v !== 0` (misses ±∞) fails the ∞ cases.
Deno.test("firstNonFiniteIndex finds the first NaN or ±∞ and keeps every finite edge value", () => {
  const finite = new Float32Array(FINITE_EDGES);
  assert.equal(firstNonFiniteIndex(finite), -1);
  for (const bad of [NaN, Infinity, -Infinity]) {
    const values = new Float32Array([...FINITE_EDGES, bad, 1, bad]);
    assert.equal(firstNonFiniteIndex(values), FINITE_EDGES.length, `${bad}`);
  }
  assert.equal(firstNonFiniteIndex(new Float32Array(0)), -1);
});

// The WebGPU reduction against the CPU scan on the same values. Mutations: testing `v != v` in the
// shader (llvmpipe folds it to false, or misses ±∞), and atomicMax instead of atomicMin (answers
// the last bad index), each fail here.
const gpu = await moduleWebGpu({ name: "webgpu:finite" });
Deno.test({
  name: "webgpu: firstNonFinite gives the CPU scan's index on every edge value",
  ignore: !gpu,
  fn: async () => {
    const n = 70_001; // more than one workgroup row, not a multiple of the workgroup size
    for (const [at, bad] of [[-1, 0], [0, NaN], [n - 1, Infinity], [4_097, -Infinity], [65, NaN]] as const) {
      const values = new Float32Array(n).map((_, i) => FINITE_EDGES[i % FINITE_EDGES.length]);
      if (at >= 0) {
        values[at] = bad;
        values[n - 1 - (n - 1 - at) % 7] = bad; // a later bad value must not win
      }
      const expected = firstNonFiniteIndex(values);
      assert.equal(await gpu!.firstNonFinite(gpu!.upload(values)), expected, `bad ${bad} at ${at}`);
    }
  },
});
if (gpu) addEventListener("unload", () => gpu.device.destroy());

// Mutation: `checkUpdatedGroup` checking the gradients instead of the parameters misses this
// overflow (the gradient is finite), and the message's gradient part is asserted.
Deno.test("an update that overflows is named with its finite gradient; a NaN gradient is named as such", async () => {
  const w = tensor([1, 2, 3], { requiresGrad: true });
  const entries: ParameterEntry[] = [{ name: "w", tensor: w, group: "fc", lrMult: 1, decayMult: 1 }];
  const optimizer = new SGD(entries, { lr: 3e38 });
  w.grad = tensor([0, 10, 0]);
  optimizer.step("fc");
  await assert.rejects(
    checkUpdatedGroup([optimizer], "fc", 6),
    (e: unknown) =>
      e instanceof DivergenceError && e.step === 7 && e.quantity === "parameter" && e.tensor === "w" &&
      /holds -Infinity at element 1 .*gradient was finite: the update overflowed/.test(e.message),
  );
  optimizer.finishIteration();
  w.grad = tensor([NaN, 0, 0]);
  optimizer.step("fc");
  await assert.rejects(
    checkUpdatedGroup([optimizer], "fc", 7),
    /holds NaN at element 0 after the update \(its gradient held NaN/,
  );
});

// The CPU's fused SGD update checks its new parameters in its own pass, so the runtime's check reads
// nothing again for what it found finite, and scans only where the update did not look (Adam) or
// found a bad one (to name it). Mutation seen failing: `checkUpdatedGroup` scanning every updated
// parameter whatever the update found (two scans here where none should run).
Deno.test("the finite check scans only what the update itself did not find finite", async () => {
  const w = tensor([1, 2, 3], { requiresGrad: true }), b = tensor([0.5], { requiresGrad: true });
  const entries: ParameterEntry[] = [
    { name: "w", tensor: w, group: "fc", lrMult: 1, decayMult: 1 },
    { name: "b", tensor: b, group: "fc", lrMult: 2, decayMult: 0 },
  ];
  const backend = w.backend as { firstNonFinite?: (x: unknown) => number | Promise<number> };
  const scan = backend.firstNonFinite!.bind(backend);
  let scans = 0;
  backend.firstNonFinite = (x) => (scans++, scan(x));
  try {
    const sgd = new SGD(entries, { lr: 0.1, momentum: 0.9 });
    w.grad = tensor([0.1, 0.2, 0.3]);
    b.grad = tensor([0.4]);
    sgd.step("fc", { undoable: true });
    await checkUpdatedGroup([sgd], "fc", 0);
    assert.equal(scans, 0, "SGD found every new parameter finite in its own pass");
    sgd.finishIteration();
    const adam = new Adam(entries, { lr: 0.1 });
    adam.step("fc");
    await checkUpdatedGroup([adam], "fc", 1);
    assert.equal(scans, 2, "Adam's update does not look: both parameters scanned");
    adam.dispose();
    sgd.dispose();
  } finally {
    delete backend.firstNonFinite; // the prototype's again
  }
});

/** The master's parameters and momentum, to compare bit for bit (read back from a GPU too). */
async function stateOf(trainer: DataParallelTrainer): Promise<Uint32Array[]> {
  await trainer.syncParameters();
  const history: Uint32Array[] = [];
  for (const s of trainer.optimizer.state().perParameter.values()) {
    history.push(bits((await s.history.data() as Float32Array).slice()));
  }
  return [bits(trainer.masterParameters().slice()), ...history];
}

/** Steps with `lr` until a step fails; returns the error and the state before the failing step. */
async function trainUntilDivergence(
  plan: Plan,
  mode: ReductionMode,
  lr: number,
  startDevice?: DataParallelOptions["startDevice"],
): Promise<{ error: unknown; before: Uint32Array[]; after: Uint32Array[]; iteration: number }> {
  const trainer = await DataParallelTrainer.create({
    model,
    devices: 2,
    plan,
    mode,
    optimizer: (p) => new SGD(p, { lr, momentum: 0.9 }),
    seed: 4,
    startDevice,
  });
  try {
    for (let step = 0; step < 8; step++) {
      const before = await stateOf(trainer);
      try {
        await trainer.step(batch(step));
      } catch (error) {
        return { error, before, after: await stateOf(trainer), iteration: trainer.iteration };
      }
    }
    throw new Error(`lr ${lr} did not diverge in 8 steps`);
  } finally {
    await trainer.close();
  }
}

// Two ways to break the weights. A rate past float32's range (1e300 rounds to ∞) breaks them in
// the first update while the gradient and loss are finite; 1e30 leaves finite but huge weights,
// whose next forward overflows: the devices' loss check reports it (this seed, deterministically).
// Mutations: removing the `checkUpdatedGroup` call after `update` (the 1e300 runs then fail one
// step later on the loss, with NaN parameters that sequential cannot roll back: quantity, step and
// bits fail); leaving late updates non-undoable under finite checks (`undoable` without
// `checkFinite ||`: sequential's parameters stay broken after the failure, the bits fail); and not
// turning the device's loss report into a DivergenceError in `#fail` (the 1e30 runs then fail
// with a DeviceError, as if the device were broken).
for (const lr of [1e300, 1e30]) {
  for (
    const [plan, mode] of [
      [sequentialPlan(groups), "master"],
      [overlapPlan(groups), "master"],
      [overlapPlan(groups), "allreduce"],
    ] as const
  ) {
    Deno.test(`${plan.name}, ${mode}, lr ${lr}: the step that breaks the weights fails naming step and tensor, rolled back bit for bit`, async () => {
      const { error, before, after, iteration } = await trainUntilDivergence(plan, mode, lr);
      assert.ok(error instanceof DivergenceError, `not a DivergenceError: ${error}`);
      assert.match(error.message, new RegExp(`^training: diverged at step ${error.step}: `));
      if (lr === 1e300) {
        assert.equal(error.step, 1);
        assert.equal(error.quantity, "parameter");
        assert.match(error.tensor!, /^(fc|conv)\d/);
        assert.match(error.message, /gradient was finite: the update overflowed/);
      } else {
        assert.equal(error.quantity, "loss");
        assert.match(error.message, /the loss is not finite \(the loss of sample \d+ is (NaN|-?Infinity)/);
      }
      assert.ok(error.rolledBack);
      assert.equal(iteration, error.step - 1, "the iteration count moved");
      assert.deepEqual(after, before, "parameters or momentum differ from the step before");
      for (const part of after) assert.ok(part.every((b) => (b & 0x7f800000) !== 0x7f800000));
    });
  }
}

// GPU-resident replicas: the check is the WGSL reduction on device 0's GPU, and the undo copies
// are GPU copies. Mutation: the resident exchange's optimizers skipped by the check (`checked`
// empty) lets the step pass with infinite weights.
Deno.test({
  name: "webgpu: GPU-resident devices stop at the step that breaks the weights, rolled back bit for bit",
  ignore: !gpu,
  fn: async () => {
    const { error, before, after } = await trainUntilDivergence(
      overlapPlan(groups),
      "master",
      1e300,
      startGpuDevice,
    );
    assert.ok(error instanceof DivergenceError, `not a DivergenceError: ${error}`);
    assert.equal(error.step, 1);
    assert.equal(error.quantity, "parameter");
    assert.ok(error.rolledBack);
    assert.deepEqual(after, before);
  },
});

/** One parameter `w` holding `values`. */
function entriesOf(values: number[]): ParameterEntry[] {
  const w = tensor(values);
  return [{ name: "w", tensor: w, group: "fc", lrMult: 1, decayMult: 1 }];
}

// Mutation: deleting the finite check in `saveCheckpoint` writes the file (and replaces the good one).
Deno.test("saveCheckpoint refuses a non-finite tensor and leaves the file there as it was", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/run.safetensors`;
    await saveCheckpoint(path, { parameters: entriesOf([1, 2]), step: 3, modelName: "m" });
    const good = await Deno.readFile(path);
    await assert.rejects(
      saveCheckpoint(path, { parameters: entriesOf([1, Infinity]), step: 4, modelName: "m" }),
      (e: unknown) => e instanceof CheckpointError && /"w" holds Infinity at element 1/.test(e.message),
    );
    assert.deepEqual(await Deno.readFile(path), good);
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), ["run.safetensors"]);
    assert.equal(await findNonFinite([{ name: "w", tensor: entriesOf([1, 2])[0].tensor }]), undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// Mutation: deleting `nonFiniteIn` from `loadCheckpoint`'s checks loads the NaN into the model.
Deno.test("loadCheckpoint refuses a checkpoint holding NaN, naming the tensor and changing nothing", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/run.safetensors`;
    await saveCheckpoint(path, { parameters: entriesOf([1, 2, 3]), step: 3, modelName: "m" });
    // Break one weight as a diverged run would have, keeping the file otherwise valid.
    const { tensors, metadata } = await loadSafetensors(path);
    const w = tensors.get("w")!;
    (w.data as Float32Array)[2] = NaN;
    await saveSafetensors(path, { w }, metadata);
    const target = entriesOf([7, 8, 9]);
    await assert.rejects(
      loadCheckpoint(path, { parameters: target, modelName: "m" }),
      (e: unknown) =>
        e instanceof CheckpointError &&
        /not finite: parameter "w" holds 1 NaN or infinite values of 3 \(the first, NaN, at element 2\)/.test(
          e.message,
        ),
    );
    assert.deepEqual([...target[0].tensor.dataSync()], [7, 8, 9]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** `deno task train` as a subprocess, in `cwd`. */
async function train(cwd: string, ...args: string[]): Promise<{ code: number; stderr: string }> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL("../../cli/train.ts", import.meta.url).pathname, ...args],
    cwd,
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  return { code: output.code, stderr: new TextDecoder().decode(output.stderr) };
}

const LENET = ["--model", "lenet", "--data", "synthetic", "--batch", "16", "--seed", "2"];

// The run: a good checkpoint at the path, then --lr 1e30. Mutations: saving the rolled-back
// state over --checkpoint (the good file's bytes change), and not rolling back (the aside file
// would hold NaN: saveCheckpoint refuses it and the run ends with a CheckpointError instead).
Deno.test("cli: a diverging run leaves a good --checkpoint as it was and saves its last finite state beside it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const good = await train(dir, ...LENET, "--steps", "2", "--checkpoint", "run.safetensors");
    assert.equal(good.code, 0, good.stderr);
    const before = await Deno.readFile(`${dir}/run.safetensors`);
    const bad = await train(
      dir,
      ...LENET,
      "--steps",
      "10",
      "--lr",
      "1e30",
      "--checkpoint",
      "run.safetensors",
    );
    assert.equal(bad.code, 1, bad.stderr);
    const line = bad.stderr.trim().split("\n").at(-1)!;
    assert.match(
      line,
      /^tandem train: training diverged at step (\d+): .* \(try a smaller --lr than 1e\+30\); the last finite state \(step \d+\) is saved in run\.before-divergence\.safetensors, run\.safetensors is left as it was$/,
    );
    assert.deepEqual(await Deno.readFile(`${dir}/run.safetensors`), before);
    // The aside file holds the rolled-back state: every value finite, the step before the failure.
    const aside = await loadSafetensors(`${dir}/run.before-divergence.safetensors`);
    const failedAt = Number(line.match(/diverged at step (\d+)/)![1]);
    assert.equal(aside.metadata.step, String(failedAt - 1));
    for (const [name, t] of aside.tensors) {
      assert.equal(firstNonFiniteIndex(t.data as Float32Array), -1, `${name} is not finite`);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// Mutation: deleting `nonFiniteIn` from loadCheckpoint's checks lets this run train on NaN, exit 0.
Deno.test("cli: --resume refuses a checkpoint with one NaN weight, naming the tensor", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const first = await train(dir, ...LENET, "--steps", "2", "--checkpoint", "run.safetensors");
    assert.equal(first.code, 0, first.stderr);
    const { tensors, metadata } = await loadSafetensors(`${dir}/run.safetensors`);
    (tensors.get("conv2.weight")!.data as Float32Array)[17] = NaN;
    await saveSafetensors(`${dir}/nan.safetensors`, tensors, metadata);
    const run = await train(dir, ...LENET, "--steps", "4", "--resume", "nan.safetensors");
    assert.equal(run.code, 1);
    assert.match(
      run.stderr,
      /not finite: parameter "conv2\.weight" holds 1 NaN or infinite values of 25,000 \(the first, NaN, at element 17\)/,
    );
    assert.doesNotMatch(run.stderr, /^\s+at /m);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
