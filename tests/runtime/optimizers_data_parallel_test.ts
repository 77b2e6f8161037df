/**
 * SGD and Adam in data-parallel training on the in-process exchanges — shared memory (CPU Worker
 * devices) and GPU-resident (WebGPU devices): `overlap` equals `sequential` bit for bit in both
 * reduction modes, `allreduce` equals `master`, and a run split by a checkpoint equals the straight
 * run bit for bit with Adam (whose per-parameter update counts and two moments must travel). The MPI
 * exchange has the same checks in tests/mpi/mpi_test.ts. Without a WebGPU adapter the GPU tests are
 * registered as ignored, and a line says so.
 */

import assert from "node:assert/strict";
import { loadCheckpoint, saveCheckpoint } from "../../mod.ts";
import { overlapPlan, sequentialPlan } from "../../schedule/plan/builtins.ts";
import type { Plan, ReductionMode } from "../../schedule/plan/plan.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import {
  bits,
  type OptimizerName,
  OPTIMIZERS,
  probeWebGpu,
  relativeDifference,
  startGpuDevice,
  tinyBatch,
  tinyGroups as groups,
  tinyModel as model,
  tinyOptimizers,
  webgpuTests,
} from "../fixtures/data_parallel.ts";

const gpuTest = webgpuTests(
  await probeWebGpu("webgpu: no adapter, skipping the WebGPU optimizer data-parallel tests"),
);

type Exchange = "shared memory" | "GPU-resident";

/** The batches of tests/runtime/data_parallel_test.ts (shared memory) and tests/runtime/webgpu_data_parallel_test.ts (GPU). */
function batch(exchange: Exchange, step: number) {
  return exchange === "shared memory" ? tinyBatch(step, 12, 100) : tinyBatch(step, 8, 300);
}

function create(
  exchange: Exchange,
  optimizer: OptimizerName,
  mode: ReductionMode,
  plan: Plan = overlapPlan(groups),
): Promise<DataParallelTrainer> {
  return DataParallelTrainer.create({
    model,
    devices: 2,
    mode,
    plan,
    optimizer: tinyOptimizers[optimizer],
    seed: 4,
    // Every step ends with every replica compared to device 0's, bit for bit.
    verifyReplicas: true,
    startDevice: exchange === "GPU-resident" ? startGpuDevice : undefined,
  });
}

async function parametersOf(trainer: DataParallelTrainer): Promise<Float32Array> {
  await trainer.syncParameters();
  return trainer.masterParameters();
}

/** The initial parameters and those after `steps` steps of one run. */
async function train(
  exchange: Exchange,
  optimizer: OptimizerName,
  mode: ReductionMode,
  plan: Plan,
  batches: Exchange = exchange,
): Promise<{ initial: Float32Array; final: Float32Array }> {
  const trainer = await create(exchange, optimizer, mode, plan);
  try {
    assert.equal(trainer.exchange, exchange);
    const initial = await parametersOf(trainer);
    for (let step = 0; step < 4; step++) await trainer.step(batch(batches, step));
    const final = await parametersOf(trainer);
    assert.deepEqual(await trainer.divergentReplicas(), []);
    return { initial, final };
  } finally {
    await trainer.close();
  }
}

/** Fails unless `actual` and `expected` hold the same bits, naming the first difference (fast, unlike a deep diff). */
function assertSameBits(actual: Float32Array, expected: Float32Array, message: string): void {
  assert.equal(actual.length, expected.length, `${message}: lengths`);
  const differing = changed(actual, expected);
  if (differing === 0) return;
  const x = bits(actual), y = bits(expected);
  const first = x.findIndex((v, i) => v !== y[i]);
  assert.fail(
    `${message}: ${differing} of ${actual.length} parameters differ, first at ${first}: ` +
      `${actual[first]} vs ${expected[first]}`,
  );
}

/** Elements whose bits differ. */
function changed(a: Float32Array, b: Float32Array): number {
  const x = bits(a), y = bits(b);
  let n = 0;
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) n++;
  return n;
}

/**
 * overlap ≡ sequential and allreduce ≡ master, bit for bit, for each optimizer; training moved (nearly)
 * every parameter, and SGD and Adam end in different places (so the optimizer really is the one named).
 */
async function checkSchedulesAndModes(exchange: Exchange): Promise<Record<OptimizerName, Float32Array>> {
  const results = {} as Record<OptimizerName, Float32Array>;
  for (const optimizer of OPTIMIZERS) {
    const seq = await train(exchange, optimizer, "master", sequentialPlan(groups));
    const ovl = await train(exchange, optimizer, "master", overlapPlan(groups));
    const seqAll = await train(exchange, optimizer, "allreduce", sequentialPlan(groups));
    const ovlAll = await train(exchange, optimizer, "allreduce", overlapPlan(groups));
    const label = `${exchange}, ${optimizer}`;
    assertSameBits(ovl.final, seq.final, `${label}, master: overlap vs sequential`);
    assertSameBits(ovlAll.final, seqAll.final, `${label}, allreduce: overlap vs sequential`);
    assertSameBits(seqAll.final, seq.final, `${label}: allreduce vs master`);
    const moved = changed(seq.initial, seq.final);
    assert.ok(
      moved > 0.9 * seq.final.length,
      `${label}: training changed only ${moved} of ${seq.final.length} parameters`,
    );
    results[optimizer] = seq.final;
  }
  assert.ok(changed(results.sgd, results.adam) > 0.9 * results.sgd.length, `${exchange}: SGD equals Adam`);
  return results;
}

/**
 * A run split by a checkpoint after step 2 equals the straight 4-step run bit for bit, in both modes;
 * the resumed trainer checks its replicas after every step.
 */
async function checkResume(exchange: Exchange, optimizer: OptimizerName): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "tandem_optimizers_test_" });
  try {
    for (const mode of ["master", "allreduce"] as const) {
      const path = `${dir}/${mode}.safetensors`;
      const straight = await create(exchange, optimizer, mode);
      let expected: Float32Array, atCheckpoint: Float32Array;
      try {
        for (let step = 0; step < 4; step++) {
          await straight.step(batch(exchange, step));
          if (step === 1) {
            await saveCheckpoint(path, {
              parameters: straight.parameterEntries,
              optimizer: straight.optimizer,
              step: straight.iteration,
              modelName: "tiny-alexnet",
            });
            atCheckpoint = await parametersOf(straight);
          }
        }
        expected = await parametersOf(straight);
      } finally {
        await straight.close();
      }
      const label = `${exchange}, ${optimizer}, ${mode}`;
      assert.ok(
        changed(atCheckpoint!, expected) > 0.9 * expected.length,
        `${label}: steps 2-3 changed nothing`,
      );
      const resumed = await create(exchange, optimizer, mode);
      try {
        const loaded = await loadCheckpoint(path, {
          parameters: resumed.parameterEntries,
          optimizer: resumed.optimizer,
          modelName: "tiny-alexnet",
        });
        assert.equal(loaded.step, 2);
        await resumed.broadcastParameters();
        assert.equal(resumed.iteration, 2, `${label}: iteration after resuming`);
        assertSameBits(await parametersOf(resumed), atCheckpoint!, `${label}: loaded parameters`);
        for (let step = loaded.step; step < 4; step++) await resumed.step(batch(exchange, step));
        assertSameBits(await parametersOf(resumed), expected, `${label}: resumed vs straight`);
      } finally {
        await resumed.close();
      }
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

// Catches: an update that is not elementwise per group — e.g. Adam scaling its step by a statistic
// of every parameter's gradient (global-norm clipping), which under `overlap` reads the conv
// gradients before they are final — and `allreduce` replicas applying a different update than the
// master (replicas are compared after every step, and allreduce against master at the end).
Deno.test("shared memory: SGD and Adam — overlap equals sequential and allreduce equals master, bit for bit", async () => {
  await checkSchedulesAndModes("shared memory");
});

// Catches: `SharedMemoryExchange.broadcastParameters` not copying the master's optimizer state to
// the allreduce replicas (their Adam moments and update counts stay fresh, so they diverge on the
// first resumed step), and a checkpoint that drops Adam's per-parameter update counts (the bias
// correction restarts at t = 1).
Deno.test("shared memory: Adam training resumes from a checkpoint bit for bit in both modes", async () => {
  await checkResume("shared memory", "adam");
});

// Catches: a GPU Adam or SGD kernel whose result depends on the schedule or the mode (e.g. the
// averaged gradients of a group read before they are final, or peers updating with other bits than
// the master), and a GPU Adam kernel far from the CPU one (both modes wrong alike would still agree).
// Slow (ten WebGPU and CPU runs): runs with the slow tests. The default set runs both optimizers'
// schedules and modes on CPU devices (above), Adam on GPU devices (below), SGD's overlap against
// sequential on GPU devices (webgpu_data_parallel_test.ts) and the fused kernels against the CPU's.
gpuTest.slow(
  "SGD and Adam on GPU devices — overlap equals sequential and allreduce equals master, bit for bit, near the CPU",
  async () => {
    const gpu = await checkSchedulesAndModes("GPU-resident");
    for (const optimizer of OPTIMIZERS) {
      // Two CPU devices trained on the same (GPU) batches.
      const cpu =
        (await train("shared memory", optimizer, "master", overlapPlan(groups), "GPU-resident")).final;
      const relative = relativeDifference(gpu[optimizer], cpu);
      console.log(
        `${optimizer}: two WebGPU devices vs two CPU devices, relative L2 ${relative.toExponential(2)}`,
      );
      assert.ok(relative < 1e-5, `${optimizer}: GPU devices differ from CPU devices by ${relative}`);
    }
  },
);

// Catches: `ResidentExchange.broadcastParameters` not loading the master's optimizer state into the
// peers' optimizers on their GPUs (allreduce: device 1's Adam moments and counts stay fresh and
// its replica diverges on the first resumed step), or not staging the parameters to the peers.
gpuTest("Adam training on GPU devices resumes from a checkpoint bit for bit in both modes", async () => {
  await checkResume("GPU-resident", "adam");
});
