/**
 * A hybrid step's body runs its layers as `Sequential` runs them: a Conv2d with its ReLU (and the
 * MaxPool2d after it) as one op, not layer by layer. Same bits either way, so only the kernels a
 * step calls tell the two apart: each device's backend counts its standalone ReLU passes.
 */

import assert from "node:assert/strict";
import { BackendDevice } from "../../schedule/devices/backend_device.ts";
import { hybridPlan } from "../../schedule/plan/builtins.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import { CountingCpu } from "../backends/logged_backend.ts";
import { tinyBatch, tinyGroups, tinyModel, tinyOptimizers } from "../fixtures/data_parallel.ts";

// tinyAlexNet's body is conv1 → relu1 → norm1 → pool1 → conv2 → relu2 → pool2: two fused runs,
// each with its ReLU inside; its head's fc1 → relu3 runs as one product too. Mutation: the body's
// forward layer by layer (`sharded_head.ts`, as it was before `forwardLayers`) runs relu1 and relu2
// on their own, 2 passes per device per step.
Deno.test("a hybrid step's body runs Conv2d → ReLU (→ MaxPool2d) as one op, as Sequential does", async () => {
  const backends: CountingCpu[] = [];
  const trainer = await DataParallelTrainer.create({
    model: tinyModel,
    devices: 2,
    plan: hybridPlan(tinyGroups),
    optimizer: tinyOptimizers.sgd,
    startDevice: (index, spec, layout) =>
      BackendDevice.start(index, spec, layout, (i) => {
        const backend = new CountingCpu({ name: `cpu-counting:${i}`, threads: 1 });
        backends.push(backend);
        return Promise.resolve(backend);
      }),
  });
  try {
    assert.equal(backends.length, 2);
    for (let step = 0; step < 2; step++) await trainer.step(tinyBatch(step, 8));
    assert.deepEqual(backends.map((b) => b.reluPasses), [0, 0], "standalone ReLU passes per device");
  } finally {
    await trainer.close();
  }
});
