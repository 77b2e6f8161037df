/**
 * Device failures in one process: a CPU device's worker that exits, crashes, throws in its backward
 * (injected through a wrapping device), or cannot build its replica fails the step naming the
 * device, promptly — not at the step timeout — and the master keeps the parameters it had before
 * the failed step.
 *
 * Each test names the one-line mutation it was seen to catch.
 */

import assert from "node:assert/strict";
import { SGD } from "../../mod.ts";
import { DeviceError } from "../../schedule/devices/device.ts";
import { overlapPlan, sequentialPlan } from "../../schedule/plan/builtins.ts";
import type { Plan } from "../../schedule/plan/plan.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import type { DataParallelOptions } from "../../schedule/runtime/options.ts";
import {
  bits,
  networks,
  tinyBatch as batch,
  tinyGroups as groups,
  tinyModel as model,
} from "../fixtures/data_parallel.ts";
import { startFailing } from "../fixtures/devices.ts";
import type { DeathKind } from "../fixtures/networks.ts";
import { evalLines } from "../fixtures/process.ts";

/** tiny-alexnet whose replica on device 1 dies as `death` says in the forward of `step`. */
function dying(death: DeathKind, step: number) {
  return { kind: "module" as const, url: networks, exportName: "dyingAlexNet", args: [1, death, step] };
}

/** Two devices under `plan`, with a 30 s timeout that no test here may ever reach. */
function create(options: Partial<DataParallelOptions> & { plan?: Plan } = {}) {
  return DataParallelTrainer.create({
    model,
    devices: 2,
    plan: overlapPlan(groups),
    optimizer: (p) => new SGD(p, { lr: 0.01, momentum: 0.9 }),
    timeoutSeconds: 30,
    ...options,
  });
}

/** A device that failed because its worker died, with the way it died in the message. */
function deathOf(pattern: RegExp) {
  return (e: unknown) => {
    assert.ok(e instanceof DeviceError, `not a DeviceError: ${e}`);
    assert.equal(e.device, 1);
    assert.match(e.message, pattern);
    return true;
  };
}

// Catches: deleting the `exit` listener in the CpuDevice constructor — the step then fails with
// "device 1: no answer within 30 s (iteration 1)" after 30 s.
Deno.test("a worker that exits mid-step fails that step naming its device, and the master keeps its parameters", async () => {
  const trainer = await create({ model: dying("exit", 1) });
  try {
    await trainer.step(batch(0));
    const before = trainer.masterParameters();
    await assert.rejects(
      trainer.step(batch(1)),
      deathOf(/^device 1: worker exited with code 3 during iteration 1$/),
    );
    assert.deepEqual(bits(trainer.masterParameters()), bits(before));
    await assert.rejects(trainer.step(batch(2)), /a device failed earlier: device 1: worker exited/);
  } finally {
    await trainer.close();
  }
});

// Catches: deleting the `error` listener in the CpuDevice constructor — the failure then only says
// "worker exited with code 1", not that it crashed nor why.
// And: deleting `if (this.#failure) return Promise.reject(this.#failure);` in CpuDevice.compute —
// step 2 is then posted to the dead worker and fails with the 30 s "no answer" timeout.
Deno.test("a worker killed by an uncaught error fails the next step naming its device, and the master keeps its parameters", async () => {
  const trainer = await create({ model: dying("crash", 1) });
  try {
    await trainer.step(batch(0));
    // Device 1's forward of step 1 schedules a throwing timer. A timer runs only once the worker is
    // back in its event loop, after it sent step 1's result, so step 1 completes and the worker dies
    // between steps.
    await trainer.step(batch(1));
    // Let the death be noticed while no step is in flight, so step 2 meets a device already known
    // to be failed (had it not been noticed yet, step 2 would fail the same way, in flight).
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const before = trainer.masterParameters();
    await assert.rejects(
      trainer.step(batch(2)),
      deathOf(/^device 1: worker crashed (after iteration 1|during iteration 2): simulated crash$/),
    );
    assert.deepEqual(bits(trainer.masterParameters()), bits(before));
    await assert.rejects(trainer.step(batch(3)), /a device failed earlier: device 1: worker crashed/);
  } finally {
    await trainer.close();
  }
});

// Catches: deleting `optimizer.undoIteration();` in the trainer's failure path (the rollback) —
// under overlap the FC update has been applied by the time device 1 fails in its conv backward, so
// the master's parameters then differ from before the step.
Deno.test("a device that throws in its conv backward fails the step naming it, and the master keeps its parameters (rollback)", async () => {
  const trainer = await create({ startDevice: startFailing({ device: 1, iteration: 1, group: "conv" }) });
  try {
    await trainer.step(batch(0));
    const before = trainer.masterParameters();
    await assert.rejects(
      trainer.step(batch(1)),
      deathOf(/^device 1: injected failure in backward conv$/),
    );
    assert.deepEqual(bits(trainer.masterParameters()), bits(before));
    await assert.rejects(trainer.step(batch(2)), /a device failed earlier: device 1/);
  } finally {
    await trainer.close();
  }
});

// Catches: deleting `starting?.reject(error);` in CpuDevice.#fail — creation then waits out the 30 s
// start timeout and fails with "device 0: did not start within 30 s".
Deno.test("a model or a replica that cannot be built fails the trainer's creation with the reason", async () => {
  // The trainer builds the model itself first (for the layout): that fails before any device.
  await assert.rejects(
    create({ model: { ...model, exportName: "brokenNetwork", args: [] }, plan: sequentialPlan(groups) }),
    /this model cannot be built/,
  );
  // Only the devices' workers fail to build this one.
  await assert.rejects(
    create({ model: { ...model, exportName: "brokenReplica" }, plan: sequentialPlan(groups) }),
    (e: unknown) => {
      assert.ok(e instanceof DeviceError, `not a DeviceError: ${e}`);
      assert.match(e.message, /^device \d: failed to build the replica: this replica cannot be built$/);
      return true;
    },
  );
});

// Catches: deleting `this.#worker.unref()` in the CpuDevice constructor — the devices' workers then
// keep the process alive and it is killed after 60 s.
Deno.test("a process whose devices ran (kernel threads included) and died exits by itself, without closing them", async () => {
  const url = (path: string) => JSON.stringify(new URL(path, import.meta.url).href);
  // Two kernel threads per device: the CPU backend inside each device's worker starts its own
  // node:worker_threads threads for the convolutions of a 64-sample shard.
  const script = `
    import { randn } from ${url("../../mod.ts")};
    import { CpuDevice } from ${url("../../schedule/devices/cpu_device.ts")};
    import { layoutOf } from ${url("../../schedule/devices/parameter_layout.ts")};
    import { tinyAlexNet } from ${url("../fixtures/networks.ts")};
    const layout = layoutOf(tinyAlexNet(1).namedParameters());
    const spec = ${JSON.stringify(dying("exit", 1))};
    const devices = await Promise.all(
      [0, 1].map((d) => CpuDevice.start(d, spec, layout, { timeoutSeconds: 30, threads: 2 })),
    );
    const images = randn([64, 1, 16, 16], { seed: 1 }).dataSync();
    for (const iteration of [0, 1]) {
      const outcomes = await Promise.allSettled(devices.map((device) =>
        device.compute({
          iteration, images, labels: new Int32Array(64), shape: [64, 1, 16, 16],
          sampleOffset: 64 * device.index, seed: 0, backwardGroups: ["fc", "conv"],
        }, () => {})
      ));
      console.log(outcomes.map((o) => o.status === "fulfilled" ? "ok" : o.reason.message).join(" | "));
    }
  `;
  assert.deepEqual(await evalLines(script, 60_000), [
    "ok | ok",
    "ok | device 1: worker exited with code 3 during iteration 1",
  ]);
});
