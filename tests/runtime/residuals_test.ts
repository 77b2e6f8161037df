/**
 * Error-feedback residuals in checkpoints (`schedule/runtime/exchange/residuals.ts`): a run with
 * `--wire fp16 --error-feedback` split by a checkpoint gives the straight run's bits — in process,
 * through the train command, and under MPI — and a failed step leaves the residuals as they were.
 */

import assert from "node:assert/strict";
import { DataParallelTrainer, overlapPlan, type Plan } from "../../mod.ts";
import { loadSafetensors } from "../../engine/io/mod.ts";
import type { ReductionMode } from "../../schedule/mod.ts";
import { RESIDUAL_PREFIX } from "../../schedule/runtime/exchange/residuals.ts";
import { residualsOf, residualTensors, resumeResiduals } from "../../schedule/runtime/mod.ts";
import { hybridPlan } from "../../schedule/plan/builtins.ts";
import {
  bits,
  resumeTiny,
  saveTiny,
  tinyBatch,
  tinyGroups as groups,
  tinyModel,
  tinyOptimizers,
} from "../fixtures/data_parallel.ts";
import { startFailing } from "../fixtures/devices.ts";
import type { StartDevice } from "../fixtures/wrapped_device.ts";
import { mpi, probeMpirun, rank0Report } from "../fixtures/mpirun.ts";
import { tempDirs } from "../fixtures/process.ts";

import { runSlowTests } from "../fixtures/slow.ts";

const mpirun = await probeMpirun("residuals");
const withTempDir = tempDirs("tandem_residuals_test_");

interface Run {
  mode?: ReductionMode;
  plan?: Plan;
  errorFeedback?: boolean;
  startDevice?: StartDevice;
}

function create({ mode, plan, errorFeedback = true, startDevice }: Run = {}): Promise<DataParallelTrainer> {
  return DataParallelTrainer.create({
    model: tinyModel,
    devices: 2,
    mode,
    plan: plan ?? overlapPlan(groups),
    optimizer: tinyOptimizers.sgd,
    seed: 7,
    verifyReplicas: true,
    wire: "fp16",
    errorFeedback,
    timeoutSeconds: 30,
    startDevice,
  });
}

async function parameters(trainer: DataParallelTrainer): Promise<Float32Array> {
  await trainer.syncParameters();
  return trainer.masterParameters();
}

/** Steps `from` … `to` − 1; saved to `save` at the end when given (residuals included). */
async function steps(trainer: DataParallelTrainer, from: number, to: number, save?: string): Promise<void> {
  for (let step = from; step < to; step++) await trainer.step(tinyBatch(step));
  if (!save) return;
  await saveTiny(trainer, save, residualTensors(await trainer.residuals()));
}

/** A new trainer resumed from `path` (residuals as `resumeResiduals` restores them) and its note. */
async function resumed(
  path: string,
  run: Run = {},
): Promise<{ trainer: DataParallelTrainer; note?: string }> {
  const trainer = await create(run);
  const loaded = await resumeTiny(trainer, path);
  return { trainer, note: await resumeResiduals(trainer, loaded.extraTensors) };
}

// Mutations that made this fail: the residuals left out of the checkpoint (`residualTensors`
// returning `{}`: the resumed run starts from zero residuals), device 0's residual restored to
// every device (`residuals?.[0]` in `InProcessExchange.scatterResiduals`), and the gathered
// residuals read from the buffer the last step did not commit (`#written` for `#residuals` in
// `GradientWire.residual`). The run resumed with zero residuals must differ, or the test would
// prove nothing.
Deno.test("fp16 with error feedback: 6 steps straight = 3 + checkpoint + resume + 3, bit for bit (master, allreduce, hybrid)", async () => {
  await withTempDir(async (dir) => {
    for (
      const [name, run] of [
        ["master", {}],
        ["allreduce", { mode: "allreduce" }],
        ["hybrid", { plan: hybridPlan(groups) }],
      ] as [string, Run][]
    ) {
      const path = `${dir}/${name}.safetensors`;
      const straight = await create(run);
      let expected: Float32Array;
      try {
        await steps(straight, 0, 3, path);
        await steps(straight, 3, 6);
        expected = await parameters(straight);
      } finally {
        await straight.close();
      }
      const { trainer, note } = await resumed(path, run);
      try {
        assert.equal(note, undefined, name);
        await steps(trainer, 3, 6);
        assert.deepEqual(bits(await parameters(trainer)), bits(expected), name);
      } finally {
        await trainer.close();
      }
      // The same checkpoint with its residuals zeroed: the bits differ, so they mattered.
      const zeroed = await resumed(path, run);
      try {
        await zeroed.trainer.loadResiduals(undefined);
        await steps(zeroed.trainer, 3, 6);
        assert.notDeepEqual(
          bits(await parameters(zeroed.trainer)),
          bits(expected),
          `${name}: residuals did nothing`,
        );
      } finally {
        await zeroed.trainer.close();
      }
    }
  });
});

Deno.test("a checkpoint holds one residual per device, each its own", async () => {
  await withTempDir(async (dir) => {
    const path = `${dir}/two.safetensors`;
    const trainer = await create();
    try {
      await steps(trainer, 0, 2, path);
    } finally {
      await trainer.close();
    }
    const { tensors, metadata } = await loadSafetensors(path);
    assert.deepEqual(JSON.parse(metadata.extra_tensors), [`${RESIDUAL_PREFIX}0`, `${RESIDUAL_PREFIX}1`]);
    const residuals = residualsOf({
      [`${RESIDUAL_PREFIX}0`]: tensors.get(`${RESIDUAL_PREFIX}0`)!.data as Float32Array,
      [`${RESIDUAL_PREFIX}1`]: tensors.get(`${RESIDUAL_PREFIX}1`)!.data as Float32Array,
    })!;
    assert.ok(residuals[0].some((v) => v !== 0), "device 0's residual is all zeros");
    assert.notDeepEqual(bits(residuals[0]), bits(residuals[1]), "both devices saved the same residual");
    assert.throws(() => residualsOf({ [`${RESIDUAL_PREFIX}1`]: residuals[1] }), /none for device 0/);
  });
});

// Mutation: `GradientWire.create(…, false)` in `SharedMemoryExchange` (one buffer, written in
// place) leaves the failed step's FC residuals behind, and the comparison fails.
Deno.test("a failed step leaves every device's residual as the last good step left it", async () => {
  const trainer = await create({ startDevice: startFailing({ device: 1, iteration: 2, group: "conv" }) });
  try {
    await steps(trainer, 0, 2);
    const before = (await trainer.residuals())!;
    // Under overlap device 1 reports fc, which is reduced (residuals written) before conv fails.
    await assert.rejects(trainer.step(tinyBatch(2)), /injected failure in backward conv/);
    const after = (await trainer.residuals())!;
    for (const d of [0, 1]) assert.deepEqual(bits(after[d]), bits(before[d]), `device ${d}`);
  } finally {
    await trainer.close();
  }
});

/** The train command's stderr and `--json` line. */
async function trainCommand(...args: string[]): Promise<{ stderr: string; paramsSha256: string }> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--no-check", "cli/train.ts", ...args],
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  const stderr = new TextDecoder().decode(output.stderr);
  assert.equal(output.code, 0, stderr);
  return { stderr, paramsSha256: JSON.parse(new TextDecoder().decode(output.stdout)).paramsSha256 };
}

const FAST = ["--data", "synthetic", "--model", "lenet", "--batch", "8", "--seed", "3", "--json"];
const FEEDBACK = ["--wire", "fp16", "--error-feedback"];

// Mutation: the `residuals` of cli/train/checkpoints.ts left out of `save` (`extraTensors` dropped) makes the
// resumed hash differ and the first resume say that there are no residuals.
Deno.test("train command: --error-feedback resumes bit for bit, and says in one line what it cannot restore", async () => {
  await withTempDir(async (dir) => {
    const withResiduals = `${dir}/feedback.safetensors`, without = `${dir}/plain.safetensors`;
    const [straight] = await Promise.all([
      trainCommand(...FAST, ...FEEDBACK, "--devices", "2", "--steps", "4"),
      trainCommand(...FAST, ...FEEDBACK, "--devices", "2", "--steps", "2", "--checkpoint", withResiduals),
      trainCommand(...FAST, "--wire", "fp16", "--devices", "2", "--steps", "2", "--checkpoint", without),
    ]);
    const [again, noFeedback, otherCount, none] = await Promise.all([
      trainCommand(...FAST, ...FEEDBACK, "--devices", "2", "--steps", "4", "--resume", withResiduals),
      trainCommand(...FAST, "--wire", "fp16", "--devices", "2", "--steps", "4", "--resume", withResiduals),
      trainCommand(...FAST, ...FEEDBACK, "--devices", "1", "--steps", "4", "--resume", withResiduals),
      trainCommand(...FAST, ...FEEDBACK, "--devices", "2", "--steps", "4", "--resume", without),
    ]);
    assert.equal(again.paramsSha256, straight.paramsSha256);
    assert.doesNotMatch(again.stderr, /error-feedback residuals/);
    assert.match(
      noFeedback.stderr,
      /^the checkpoint's error-feedback residuals \(2 devices\) are ignored: this run has no error feedback$/m,
    );
    assert.match(
      otherCount.stderr,
      /^the checkpoint's error-feedback residuals are for 2 devices, this run has 1: every device starts from zero residuals$/m,
    );
    assert.match(
      none.stderr,
      /^the checkpoint holds no error-feedback residuals: every device starts from zero residuals$/m,
    );
    assert.notEqual(none.paramsSha256, straight.paramsSha256);
  });
});

// Each rank's residual reaches rank 0 for the checkpoint (MPI_Igather) and goes back on resume (a
// broadcast), and a rank's residual is its shard's: the bits are the in-process run's. Mutations:
// `MpiExchange.scatterResiduals` giving every rank rank 0's residual (`all.subarray(0, total)`), and
// `gatherResiduals` skipped (`undefined` on every rank: the checkpoint holds none).
Deno.test({
  name: "mpi: --error-feedback split by a checkpoint across 2 processes equals the in-process straight run",
  // Slow (two MPI jobs and a train command): runs with the slow tests. The default set resumes error
  // feedback bit for bit in process and through the train command (above), and resumes MPI runs
  // from checkpoints (mpi_test.ts).
  ignore: !runSlowTests || !mpirun,
  fn: async () => {
    await withTempDir(async (dir) => {
      const path = `${dir}/mpi.safetensors`;
      const first = await mpi(["cli/train.ts", ...FAST, ...FEEDBACK, "--steps", "2", "--checkpoint", path]);
      rank0Report(first, "stdout must be one JSON line from rank 0");
      const second = await mpi(["cli/train.ts", ...FAST, ...FEEDBACK, "--steps", "4", "--resume", path]);
      const distributed = rank0Report<{ paramsSha256: string }>(
        second,
        "stdout must be one JSON line from rank 0",
      );
      assert.doesNotMatch(second.stderr, /error-feedback residuals/, second.stderr);
      const local = await trainCommand(...FAST, ...FEEDBACK, "--devices", "2", "--steps", "4");
      assert.equal(distributed.paramsSha256, local.paramsSha256);
    });
  },
});
