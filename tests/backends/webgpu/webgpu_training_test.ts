/**
 * Whole training steps on the WebGPU backend against the CPU backend: cifar10_quick's losses and
 * parameters after SGD steps agree within 1e-4, and 200 steps leave the number of live GPU buffers
 * flat. Without a WebGPU adapter the tests are registered as ignored, so the skip shows.
 */

import assert from "node:assert/strict";
import type { WebGpuBackend } from "../../../backends/webgpu/backend.ts";
import { moduleWebGpu } from "../../fixtures/webgpu.ts";
import {
  cifarQuick,
  type Network,
  randn,
  registerBackend,
  setBackend,
  SGD,
  type Tensor,
  tensor,
  trainStep,
} from "../../../mod.ts";
import { uniformValues } from "../../../engine/mod.ts";
import { tinyAlexNet } from "../../fixtures/networks.ts";

import { runSlowTests } from "../../fixtures/slow.ts";

const gpu: WebGpuBackend | null = await moduleWebGpu();
if (!gpu) console.log("webgpu: no adapter, skipping WebGPU training tests");
else registerBackend(gpu);

/** Runs `fn` with `backend` current, restoring the CPU backend afterwards. */
async function on<T>(backend: string, fn: () => Promise<T>): Promise<T> {
  setBackend(backend);
  try {
    return await fn();
  } finally {
    setBackend("cpu");
  }
}

function batchOf(model: Network, size: number, step: number): { images: Tensor; labels: Tensor } {
  return {
    images: randn([size, ...model.inputShape], { seed: 50 + step }),
    labels: tensor(
      Int32Array.from(uniformValues(size, { seed: 60 + step }), (u) => Math.floor(u * model.classes)),
      {
        dtype: "int32",
      },
    ),
  };
}

async function train(
  backend: string,
  steps: number,
): Promise<{ losses: number[]; parameters: Float32Array[] }> {
  return await on(backend, async () => {
    const model = cifarQuick({ seed: 3 });
    const optimizer = new SGD(model.namedParameters(), { lr: 0.01, momentum: 0.9, weightDecay: 0.004 });
    const losses: number[] = [];
    for (let step = 0; step < steps; step++) {
      const batch = batchOf(model, 4, step);
      losses.push((await trainStep(model, optimizer, batch, { seed: 1 })).loss);
      batch.images.dispose();
      batch.labels.dispose();
    }
    const parameters = await Promise.all(
      model.parameters().map(async (p) => (await p.data()) as Float32Array),
    );
    optimizer.dispose();
    model.dispose();
    return { losses, parameters };
  });
}

Deno.test({
  name: "webgpu: cifar10_quick training steps match the CPU backend within 1e-4",
  ignore: gpu === null,
  fn: async () => {
    const cpuRun = await train("cpu", 3);
    const gpuRun = await train("webgpu", 3);
    gpuRun.losses.forEach((loss, i) => {
      const expected = cpuRun.losses[i];
      assert.ok(
        Math.abs(loss - expected) <= 1e-4 * Math.abs(expected),
        `step ${i}: loss ${loss} vs ${expected}`,
      );
    });
    gpuRun.parameters.forEach((values, i) => {
      const expected = cpuRun.parameters[i];
      let diff = 0, ref = 0;
      for (let j = 0; j < values.length; j++) {
        diff = Math.max(diff, Math.abs(values[j] - expected[j]));
        ref = Math.max(ref, Math.abs(expected[j]));
      }
      assert.ok(diff <= 1e-4 * (ref + 1e-6), `parameter ${i}: max diff ${diff}, max |ref| ${ref}`);
    });
  },
});

Deno.test({
  name: "webgpu: 200 training steps keep the number of live GPU buffers flat",
  // Slow (200 steps): runs with the slow tests. The default set checks for leaked GPU buffers after
  // every op and an engine forward and backward (webgpu_test.ts), and that live buffers stay flat
  // over 3 data-parallel WebGPU training steps (webgpu_data_parallel_test.ts).
  ignore: !runSlowTests || gpu === null,
  fn: async () => {
    await on("webgpu", async () => {
      const model = tinyAlexNet(2);
      const optimizer = new SGD(model.namedParameters(), { lr: 0.01, momentum: 0.9 });
      const batch = batchOf(model, 4, 0);
      const samples: number[] = [];
      for (let step = 0; step < 200; step++) {
        await trainStep(model, optimizer, batch, { seed: 1 });
        if (step === 9 || step === 199) samples.push(gpu!.liveBuffers());
      }
      assert.equal(samples[1], samples[0], `live GPU buffers grew from ${samples[0]} to ${samples[1]}`);
      batch.images.dispose();
      batch.labels.dispose();
      optimizer.dispose();
      model.dispose();
    });
  },
});
