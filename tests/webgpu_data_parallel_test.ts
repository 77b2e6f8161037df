/**
 * Two WebGPU device handles (one `GPUDevice` each) in the data-parallel runtime: `overlap` and
 * `sequential` stay bit-identical, replicas agree, and the result matches two CPU devices within
 * 1e-4. Without a WebGPU adapter the test is registered as ignored, so the skip shows.
 */

import assert from "node:assert/strict";
import { createWebGpuBackend } from "../backends/webgpu/backend.ts";
import { randn, SGD, uniformValues } from "../mod.ts";
import { overlap, sequential } from "../schedule/builtins.ts";
import type { Plan } from "../schedule/plan.ts";
import { DataParallelTrainer } from "../schedule/runtime.ts";
import { WebGpuDevice } from "../schedule/webgpu_device.ts";

const probe = await createWebGpuBackend({ name: "webgpu:probe" });
if (!probe) console.log("webgpu: no adapter, skipping the WebGPU data-parallel test");
else probe.device.destroy();

const groups = ["fc", "conv"];
const model = {
  kind: "module" as const,
  url: new URL("./fixtures/networks.ts", import.meta.url).href,
  exportName: "tinyAlexNet",
  args: [1],
};

function batch(step: number) {
  const images = randn([8, 1, 16, 16], { seed: 300 + step }).dataSync() as Float32Array;
  const labels = Int32Array.from(uniformValues(8, { seed: 400 + step }), (u) => Math.floor(u * 5));
  return { images, labels, shape: [8, 1, 16, 16] };
}

async function train(plan: Plan, gpu: boolean): Promise<Float32Array> {
  const trainer = await DataParallelTrainer.create({
    model,
    devices: 2,
    plan,
    optimizer: (p) => new SGD(p, { lr: 0.01, momentum: 0.9, weightDecay: 5e-4 }),
    verifyReplicas: true,
    startDevice: gpu ? (index, spec, layout) => WebGpuDevice.start(index, spec, layout) : undefined,
  });
  try {
    assert.equal(trainer.devices[1].kind, gpu ? "webgpu" : "cpu-worker");
    for (let step = 0; step < 3; step++) await trainer.step(batch(step));
    return trainer.masterParameters();
  } finally {
    await trainer.close();
  }
}

Deno.test({
  name: "webgpu: two GPU devices — overlap equals sequential bit for bit and matches CPU devices",
  ignore: probe === null,
  fn: async () => {
    const seq = await train(sequential(groups), true);
    const ovl = await train(overlap(groups), true);
    assert.deepEqual(new Uint32Array(ovl.buffer), new Uint32Array(seq.buffer));
    const cpu = await train(overlap(groups), false);
    let diff = 0, norm = 0;
    for (let i = 0; i < cpu.length; i++) {
      diff += (ovl[i] - cpu[i]) ** 2;
      norm += cpu[i] ** 2;
    }
    const relative = Math.sqrt(diff / norm);
    console.log(
      `two WebGPU devices vs two CPU devices after 3 steps: relative L2 difference ${
        relative.toExponential(2)
      }`,
    );
    assert.ok(relative < 1e-4, `GPU devices differ from CPU devices by ${relative}`);
  },
});
