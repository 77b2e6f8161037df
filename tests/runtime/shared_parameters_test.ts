/**
 * A CPU device's replica computes on the runtime's copy of its parameters in place: the runtime
 * lends the replica's backend part of its kernel memory (`Backend.lendMemory`), where the device's
 * parameters and gradients already lie, and the worker puts its parameter tensors over them. No
 * step begins by copying every parameter into the worker's memory, and the bits are those of a
 * replica that does.
 */
import assert from "node:assert/strict";
import { getBackend } from "../../mod.ts";
import type { Backend } from "../../backends/backend.ts";
import { hybridPlan, overlapPlan } from "../../schedule/plan/builtins.ts";
import type { Plan, ReductionMode } from "../../schedule/plan/plan.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import type { CpuDevice } from "../../schedule/devices/cpu_device.ts";
import {
  tinyBatch as batch,
  tinyGroups as groups,
  tinyModel as model,
  tinyOptimizers,
} from "../fixtures/data_parallel.ts";

/** Three steps on 2 CPU devices; the master's parameters and the bytes each replica copied in all. */
async function train(
  plan: Plan,
  mode: ReductionMode,
): Promise<{ parameters: Float32Array; copied: number[] }> {
  const trainer = await DataParallelTrainer.create({
    model,
    devices: 2,
    plan,
    mode,
    optimizer: tinyOptimizers.sgd,
    seed: 9,
    verifyReplicas: true,
  });
  try {
    for (let i = 0; i < 3; i++) await trainer.step(batch(i));
    const copied = trainer.devices.map((d) => (d as CpuDevice).parameterBytesCopied);
    return { parameters: trainer.masterParameters().slice(), copied };
  } finally {
    await trainer.close();
  }
}

/** The same run with the runtime's backend lending no memory: each replica copies its parameters. */
async function trainCopying(plan: Plan, mode: ReductionMode): ReturnType<typeof train> {
  const backend = getBackend() as Backend;
  backend.lendMemory = () => undefined;
  try {
    return await train(plan, mode);
  } finally {
    delete (backend as { lendMemory?: unknown }).lendMemory; // the prototype's again
  }
}

// Mutations seen failing: the worker not putting its parameter tensors over the lent parameters
// (replicas train on their zeros: other bits); `loadParameters` copying although they are (copied
// bytes where none are expected); `CpuDevice` lending no memory (the same).
const cases: { name: string; plan: Plan; mode: ReductionMode }[] = [
  { name: "overlap, master", plan: overlapPlan(groups), mode: "master" },
  { name: "overlap, allreduce", plan: overlapPlan(groups), mode: "allreduce" },
  { name: "hybrid", plan: hybridPlan(groups), mode: "master" },
];
for (const { name, plan, mode } of cases) {
  Deno.test(`CPU replicas compute on the runtime's parameters in place, with the bits of copying replicas (${name})`, async () => {
    const shared = await train(plan, mode);
    const copying = await trainCopying(plan, mode);
    // Without a loan: all parameters before each of the 3 steps (under hybrid, the body's).
    const bytes = copying.copied[0];
    if (name !== "hybrid") assert.equal(bytes, 3 * 4 * shared.parameters.length);
    assert.ok(bytes > 0, "without a loan a replica copies its parameters");
    assert.deepEqual(copying.copied, [bytes, bytes]);
    assert.deepEqual(shared.copied, [0, 0], "replicas copied their parameters before each step");
    assert.deepEqual(shared.parameters, copying.parameters);
  });
}
