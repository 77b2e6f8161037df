/**
 * When an update placed after every backward (`sequential`'s, `overlap`'s conv) starts. With finite
 * checks (the default) every update keeps a copy for the undo, so it starts as soon as the gradients
 * are reduced: a device failing behind it is undone like any. Without them it needs no copy and
 * waits for every device to finish first. Proved causally: device 1 hands its result over only once
 * the runtime has reported the step's `update conv`.
 */

import assert from "node:assert/strict";
import type { ComputeCommand, ComputeResult } from "../../schedule/devices/device.ts";
import { sequentialPlan } from "../../schedule/plan/builtins.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import { UpdateGate } from "../fixtures/gated_device.ts";
import { startCpuDevice, WrappedDevice } from "../fixtures/wrapped_device.ts";
import {
  tinyBatch as batch,
  tinyGroups as groups,
  tinyModel as model,
  tinyOptimizers,
} from "../fixtures/data_parallel.ts";

/** Reports every group at once, but its result only after the step's `update conv` (or `ms`). */
class ResultAfterUpdate extends WrappedDevice {
  constructor(
    inner: ConstructorParameters<typeof WrappedDevice>[0],
    readonly gate: UpdateGate,
    readonly ms: number,
  ) {
    super(inner, "late-result");
  }

  async compute(command: ComputeCommand, onGradients: (group: string) => void): Promise<ComputeResult> {
    const result = await this.inner.compute(command, onGradients);
    if (!await this.gate.wait(command.iteration, this.ms)) {
      throw new Error(`no update conv of step ${command.iteration} within ${this.ms} ms before this result`);
    }
    return result;
  }
}

async function trainer(checkFinite: boolean, ms: number): Promise<DataParallelTrainer> {
  const gate = new UpdateGate("conv");
  return await DataParallelTrainer.create({
    model,
    devices: 2,
    plan: sequentialPlan(groups),
    optimizer: tinyOptimizers.sgd,
    checkFinite,
    seed: 4,
    startDevice: async (index, spec, layout, timeoutSeconds) => {
      const device = await startCpuDevice(index, spec, layout, timeoutSeconds);
      return index === 1 ? new ResultAfterUpdate(device, gate, ms) : device;
    },
    onEvent: (event) => gate.observe(event),
  });
}

// Mutation seen failing: the executor awaiting every device before any update after the last
// backward (the rule before this test): the result waits for an update that waits for it.
Deno.test("with finite checks an update after every backward starts before the devices' results arrive", async () => {
  const t = await trainer(true, 30_000);
  try {
    for (let step = 0; step < 3; step++) await t.step(batch(step));
  } finally {
    await t.close();
  }
});

// Mutation seen failing: no update ever waiting for the devices (the step then runs; an update
// without a copy could not be undone behind a device that fails).
Deno.test("without finite checks an update after every backward waits for every device's result", async () => {
  const t = await trainer(false, 500);
  try {
    await assert.rejects(t.step(batch(0)), /no update conv of step 0 within 500 ms/);
  } finally {
    await t.close();
  }
});
