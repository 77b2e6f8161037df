/**
 * Two WebGPU device handles (one `GPUDevice` each) in the data-parallel runtime, with their
 * replicas resident on the GPUs: `overlap` and `sequential` stay bit-identical in both reduction
 * modes, replicas agree, the result matches two CPU devices within 1e-5, a step moves no parameter
 * through the host beyond the master's broadcast, and a failed step rolls the GPU-resident parameters
 * and optimizer state back bit for bit. Without a WebGPU adapter the tests are registered as ignored,
 * so the skip shows.
 */

import assert from "node:assert/strict";
import type { TransferEvent, WebGpuBackend } from "../../backends/webgpu/backend.ts";
import { loadCheckpoint, type Optimizer, saveCheckpoint } from "../../mod.ts";
import type { ParameterEntry } from "../../engine/nn/mod.ts";
import type { Storage } from "../../backends/mod.ts";
import { overlapPlan, sequentialPlan } from "../../schedule/plan/builtins.ts";
import { type Device, DeviceError } from "../../schedule/devices/device.ts";
import type { Plan, ReductionMode } from "../../schedule/plan/plan.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import type { DataParallelOptions, LaneEvent } from "../../schedule/runtime/options.ts";
import type { BackendDevice } from "../../schedule/devices/backend_device.ts";
import {
  bits,
  probeWebGpu,
  relativeDifference,
  startGpuDevice,
  tinyBatch,
  tinyGroups as groups,
  tinyModel as model,
  tinyOptimizers,
  webgpuTests,
} from "../fixtures/data_parallel.ts";

const gpuTest = webgpuTests(await probeWebGpu("webgpu: no adapter, skipping the WebGPU data-parallel tests"));

function batch(step: number) {
  return tinyBatch(step, 8, 300);
}

/** A trainer on two devices (WebGPU unless `gpu` is false), recording the optimizers it creates. */
async function createTrainer(
  plan: Plan,
  mode: ReductionMode,
  gpu: boolean,
  options: Partial<DataParallelOptions> = {},
): Promise<{ trainer: DataParallelTrainer; optimizers: Optimizer[] }> {
  const optimizers: Optimizer[] = [];
  const trainer = await DataParallelTrainer.create({
    model,
    devices: 2,
    mode,
    plan,
    optimizer: (p: ParameterEntry[]) => {
      const optimizer = tinyOptimizers.sgd(p);
      optimizers.push(optimizer);
      return optimizer;
    },
    startDevice: gpu ? startGpuDevice : undefined,
    ...options,
  });
  return { trainer, optimizers };
}

async function train(plan: Plan, mode: ReductionMode, gpu: boolean): Promise<Float32Array> {
  const { trainer } = await createTrainer(plan, mode, gpu, { verifyReplicas: true });
  try {
    assert.equal(trainer.devices[1].kind, gpu ? "webgpu" : "cpu-worker");
    for (let step = 0; step < 4; step++) await trainer.step(batch(step));
    await trainer.syncParameters();
    assert.deepEqual(await trainer.divergentReplicas(), []);
    return trainer.masterParameters();
  } finally {
    await trainer.close();
  }
}

gpuTest(
  "two GPU devices — overlap equals sequential bit for bit in both modes and matches CPU devices",
  async () => {
    const seq = await train(sequentialPlan(groups), "master", true);
    const ovl = await train(overlapPlan(groups), "master", true);
    assert.deepEqual(bits(ovl), bits(seq));
    const seqAll = await train(sequentialPlan(groups), "allreduce", true);
    const ovlAll = await train(overlapPlan(groups), "allreduce", true);
    assert.deepEqual(bits(ovlAll), bits(seqAll));
    // Both modes average the same gradients with the same kernel and apply the same update kernel.
    assert.deepEqual(bits(seqAll), bits(seq));
    const cpu = await train(overlapPlan(groups), "master", false);
    const relative = relativeDifference(ovl, cpu);
    console.log(
      `two WebGPU devices vs two CPU devices after 4 steps: relative L2 difference ${
        relative.toExponential(2)
      }`,
    );
    assert.ok(relative < 1e-5, `GPU devices differ from CPU devices by ${relative}`);
  },
);

gpuTest("a step moves no parameter through the host: averaging and SGD run on the GPUs", async () => {
  for (const mode of ["master", "allreduce"] as const) {
    const { trainer, optimizers } = await createTrainer(overlapPlan(groups), mode, true);
    try {
      const devices = trainer.devices as BackendDevice<WebGpuBackend>[];
      const parameterBytes = trainer.layout.total * 4;
      // A host average or a host optimizer would have to read these mirrors or fill them again.
      for (const device of devices) {
        device.parameters.fill(NaN);
        device.gradients.fill(NaN);
      }
      const storagesOf = (entries: readonly ParameterEntry[]) =>
        new Set(entries.map((e) => e.tensor.storage));
      const parameters = devices.map((d) => storagesOf(d.resident!.parameterEntries));
      const state = new Set<Storage>();
      for (const optimizer of optimizers) {
        for (const slots of optimizer.state().perParameter.values()) {
          for (const t of Object.values(slots)) state.add(t.storage);
        }
      }
      assert.equal(optimizers.length, mode === "master" ? 1 : 2);
      for (const optimizer of optimizers) {
        for (const p of optimizer.parameters) assert.ok(p.tensor.backend.name.startsWith("webgpu:"));
      }
      const events: TransferEvent[][] = devices.map(() => []);
      const stops = devices.map((d, i) => d.backend.observeTransfers((e) => events[i].push(e)));
      const steps = 3;
      const live: number[][] = [];
      for (let step = 0; step < steps; step++) {
        await trainer.step(batch(step));
        live.push(devices.map((d) => d.backend.liveBuffers()));
      }
      stops.forEach((stop) => stop());
      // The rollback copies taken on the GPUs every step are freed again.
      assert.deepEqual(live[steps - 1], live[0], `${mode}: live GPU buffers grew`);

      for (const device of devices) {
        assert.ok(device.parameters.every(Number.isNaN), `device ${device.index}: host parameters touched`);
        assert.ok(device.gradients.every(Number.isNaN), `device ${device.index}: host gradients touched`);
      }
      const bytes = (d: number, direction: string, where: (s: Storage) => boolean) =>
        events[d].filter((e) => e.direction === direction && where(e.storage)).reduce(
          (n, e) => n + e.bytes,
          0,
        );
      const isParameter = (d: number) => (s: Storage) => parameters[d].has(s);
      const isOther = (d: number) => (s: Storage) => !parameters[d].has(s) && !state.has(s);
      const perStep = steps * parameterBytes;
      // Parameters: only the master's broadcast moves them, staged off device 0 onto device 1.
      const broadcast = mode === "master";
      assert.equal(bytes(0, "toDevice", isParameter(0)), 0, `${mode}: parameters written to device 0`);
      assert.equal(
        bytes(0, "toHost", isParameter(0)),
        broadcast ? perStep : 0,
        `${mode}: device 0 parameters read`,
      );
      assert.equal(
        bytes(1, "toDevice", isParameter(1)),
        broadcast ? perStep : 0,
        `${mode}: device 1 parameters`,
      );
      assert.equal(bytes(1, "toHost", isParameter(1)), 0, `${mode}: device 1 parameters read`);
      // Optimizer state never leaves its GPU.
      for (const d of [0, 1]) {
        assert.equal(bytes(d, "toHost", (s) => state.has(s)) + bytes(d, "toDevice", (s) => state.has(s)), 0);
      }
      // Everything else read back: each sending device's gradients once, plus the loss and logits.
      for (const d of [0, 1]) {
        const sends = mode === "allreduce" || d === 1;
        const extra = bytes(d, "toHost", isOther(d)) - (sends ? perStep : 0);
        assert.ok(extra >= 0 && extra <= 256 * steps, `${mode}: device ${d} read ${extra} unexpected bytes`);
      }
      // The parameters are on the GPUs: a stale host copy is refused until they are synced.
      assert.throws(() => trainer.masterParameters(), /await trainer.syncParameters\(\) first/);
      await trainer.syncParameters();
      assert.ok(trainer.masterParameters().every(Number.isFinite));
      assert.deepEqual(await trainer.divergentReplicas(), []);
    } finally {
      await trainer.close();
    }
  }
});

gpuTest("a failed step rolls the GPU-resident parameters and optimizer state back bit for bit", async () => {
  for (const mode of ["master", "allreduce"] as const) {
    let fcUpdated: () => void = () => {};
    let failConv = false;
    const updated = new Promise<void>((resolve) => (fcUpdated = resolve));
    const { trainer, optimizers } = await createTrainer(overlapPlan(groups), mode, true, {
      onEvent: (e: LaneEvent) => {
        if (e.step === 1 && e.name === "update fc") fcUpdated();
      },
      // Device 1 fails in its conv backward when told to, and reports it only once the FC update has
      // run on the GPU, so the rollback has something to undo whatever the timing.
      startDevice: async (index, spec, layout) => {
        const inner = await startGpuDevice(index, spec, layout);
        if (index !== 1) return inner;
        const device: Device = {
          index,
          kind: inner.kind,
          parameters: inner.parameters,
          gradients: inner.gradients,
          resident: inner.resident,
          compute: (command, onGradients) =>
            inner.compute(command, (group) => {
              if (failConv && group === "conv") throw new Error("injected failure in backward conv");
              onGradients(group);
            }).catch(async (error) => {
              await updated;
              throw error;
            }),
          close: () => inner.close(),
        };
        return device;
      },
    });
    const read = async () => {
      const values: Float32Array[] = [];
      for (const optimizer of optimizers) {
        for (const p of optimizer.parameters) values.push((await p.tensor.data()) as Float32Array);
        for (const slots of optimizer.state().perParameter.values()) {
          for (const t of Object.values(slots)) values.push((await t.data()) as Float32Array);
        }
      }
      return values.map(bits);
    };
    try {
      await trainer.step(batch(0));
      const before = await read();
      failConv = true;
      await assert.rejects(
        trainer.step(batch(1)),
        (e: unknown) =>
          e instanceof DeviceError && e.device === 1 && /injected failure in backward conv/.test(e.message),
      );
      failConv = false;
      assert.equal(trainer.iteration, 1);
      assert.deepEqual(await read(), before, `${mode}: rollback`);
      await assert.rejects(trainer.step(batch(2)), /a device failed earlier: device 1/);
    } finally {
      await trainer.close();
    }
  }
});

gpuTest(
  "training on GPU devices resumes from a checkpoint bit for bit (state broadcast on the devices)",
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      for (const mode of ["master", "allreduce"] as const) {
        const path = `${dir}/${mode}.safetensors`;
        const { trainer: straight } = await createTrainer(overlapPlan(groups), mode, true);
        let expected: Float32Array;
        try {
          for (let step = 0; step < 4; step++) {
            await straight.step(batch(step));
            if (step === 1) {
              // The entries are device 0's GPU tensors; the checkpoint reads them like any tensor.
              await saveCheckpoint(path, {
                parameters: straight.parameterEntries,
                optimizer: straight.optimizer,
                step: straight.iteration,
                modelName: "tiny-alexnet",
              });
            }
          }
          await straight.syncParameters();
          expected = straight.masterParameters();
        } finally {
          await straight.close();
        }
        const { trainer: resumed } = await createTrainer(overlapPlan(groups), mode, true, {
          verifyReplicas: true,
        });
        try {
          const loaded = await loadCheckpoint(path, {
            parameters: resumed.parameterEntries,
            optimizer: resumed.optimizer,
            modelName: "tiny-alexnet",
          });
          // Not awaited on purpose: the next step waits for the broadcast.
          resumed.broadcastParameters();
          for (let step = loaded.step; step < 4; step++) await resumed.step(batch(step));
          await resumed.syncParameters();
          assert.deepEqual(bits(resumed.masterParameters()), bits(expected), mode);
        } finally {
          await resumed.close();
        }
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
