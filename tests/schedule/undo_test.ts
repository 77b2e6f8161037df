/**
 * Which updates copy for the undo of a failed step (`schedule/plan/undo.ts`, the rule the executor
 * runs by) and what the simulator charges for those copies and for the finite checks.
 *
 * Mutations, each failing a test here: `undoableUpdates` ignoring `checkFinite` (late updates never
 * copy), or treating every update as early (late updates always copy), or ignoring `rollsBack`, or
 * `transfersCanFail`; the simulator adding the copy to every update (ignoring the rule), or dropping
 * the finite check's seconds, or charging the sharded (hybrid) update for the whole group's bytes.
 */

import assert from "node:assert/strict";
import "../../mod.ts"; // registers the CPU backend
import { ValueError } from "../../engine/errors.ts";
import { type CostOptions, type Profile, simulate } from "../../schedule/simulator/mod.ts";
import { HAND_COSTS } from "../fixtures/costs.ts";
import {
  actionLabel,
  hybridPlan,
  overlapPlan,
  parseSchedule,
  sequentialPlan,
  undoableUpdates,
  type UndoRule,
} from "../../schedule/mod.ts";

const GROUPS = ["fc", "conv"];

/** The labels of the updates that copy under `rule`. */
function copying(plan: ReturnType<typeof sequentialPlan>, rule: UndoRule): string[] {
  const table = undoableUpdates(plan, rule);
  assert.equal(table.length, plan.actions.length);
  plan.actions.forEach((a, i) => {
    if (a.kind !== "update") assert.equal(table[i], false, `${actionLabel(a)} is not an update`);
  });
  return plan.actions.filter((_, i) => table[i]).map((a) => actionLabel(a));
}

Deno.test("undoableUpdates: a copy only where a failure can still follow the update", () => {
  const sharedMemory = { rollsBack: true, transfersCanFail: false, checkFinite: false };
  // sequential: every update after the last backward, nothing left to fail: no copies.
  assert.deepEqual(copying(sequentialPlan(GROUPS), sharedMemory), []);
  // overlap: the FC update runs while the conv backward is still computing.
  assert.deepEqual(copying(overlapPlan(GROUPS), sharedMemory), ["update fc"]);
  // Finite checks: every update may still be failed by its own check.
  const checked = { ...sharedMemory, checkFinite: true };
  assert.deepEqual(copying(sequentialPlan(GROUPS), checked), ["update fc", "update conv"]);
  assert.deepEqual(copying(overlapPlan(GROUPS), checked), ["update fc", "update conv"]);
  // Transfers that can fail (GPU-resident replicas): a late update copies where a reduce or
  // broadcast follows it, and the last one does not.
  const resident = { ...sharedMemory, transfersCanFail: true };
  assert.deepEqual(copying(sequentialPlan(GROUPS), resident), ["update fc", "update conv"]);
  const lastUpdateLast = parseSchedule(
    "forward; backward fc; backward conv; reduce fc; reduce conv; broadcast fc; broadcast conv; update fc; update conv",
    { groups: GROUPS, mode: "allreduce" },
  );
  assert.deepEqual(copying(lastUpdateLast, resident), []);
  // An exchange that does not undo (MPI) never copies, whatever else holds.
  const mpi = { rollsBack: false, transfersCanFail: true, checkFinite: true };
  assert.deepEqual(copying(overlapPlan(GROUPS), mpi), []);
});

/** fc: 1000 parameter bytes, conv: 100; compute long enough that nothing overlaps by accident. */
const PROFILE: Profile = {
  batchSize: 4,
  layers: [
    { name: "conv", group: "conv", forwardSeconds: 1, backwardSeconds: 2, parameterBytes: 100 },
    { name: "fc", group: "fc", forwardSeconds: 0.5, backwardSeconds: 1, parameterBytes: 1000 },
  ],
};

const COSTS: CostOptions = HAND_COSTS;

/** Seconds of each update on device 0's communication lane. */
function updateSeconds(sim: ReturnType<typeof simulate>): Record<string, number> {
  return Object.fromEntries(
    sim.lanes[0].comm.filter((e) => e.kind === "update").map((e) => [actionLabel(e), e.end - e.start]),
  );
}

const near = (actual: number, expected: number, what: string) =>
  assert.ok(
    Math.abs(actual - expected) <= 1e-9 * Math.max(1, Math.abs(expected)),
    `${what}: ${actual} vs ${expected}`,
  );

Deno.test("simulate: an update adds its finite check always and its undo copy where the rule says", () => {
  const base = updateSeconds(simulate(sequentialPlan(GROUPS), PROFILE, COSTS));
  near(base["update fc"], 1, "update fc without checks");
  near(base["update conv"], 0.1, "update conv without checks");
  const rule = { rollsBack: true, transfersCanFail: false, checkFinite: false };
  const priced: CostOptions = {
    ...COSTS,
    checkSecondsPerByte: 0.0005,
    undo: { rule, secondsPerByte: 0.002 },
  };
  // sequential, no finite checks in the rule: no copies; the check's seconds still count.
  const seq = updateSeconds(simulate(sequentialPlan(GROUPS), PROFILE, priced));
  near(seq["update fc"], 1000 * (0.001 + 0.0005), "sequential update fc");
  near(seq["update conv"], 100 * (0.001 + 0.0005), "sequential update conv");
  // overlap: the FC update copies (the conv backward is still running), the conv update does not.
  const ovl = updateSeconds(simulate(overlapPlan(GROUPS), PROFILE, priced));
  near(ovl["update fc"], 1000 * (0.001 + 0.0005 + 0.002), "overlap update fc");
  near(ovl["update conv"], 100 * (0.001 + 0.0005), "overlap update conv");
  // With finite checks in the rule every update copies, and sequential's step grows by exactly that.
  const checked = { ...priced, undo: { rule: { ...rule, checkFinite: true }, secondsPerByte: 0.002 } };
  const seqChecked = simulate(sequentialPlan(GROUPS), PROFILE, checked);
  near(updateSeconds(seqChecked)["update fc"], 1000 * 0.0035, "checked update fc");
  near(
    seqChecked.stepSeconds - simulate(sequentialPlan(GROUPS), PROFILE, COSTS).stepSeconds,
    1100 * (0.0005 + 0.002),
    "what checks and copies add to sequential",
  );
});

Deno.test("simulate: a sharded (hybrid) update copies and checks its own slice only", () => {
  const profile: Profile = {
    batchSize: 4,
    layers: [
      {
        name: "conv",
        group: "conv",
        forwardSeconds: 1,
        backwardSeconds: 2,
        parameterBytes: 100,
        outputBytes: 64,
      },
      {
        name: "fc",
        group: "fc",
        forwardSeconds: 0.5,
        backwardSeconds: 1,
        parameterBytes: 1000,
        outputBytes: 8,
      },
    ],
  };
  const plan = hybridPlan(GROUPS, ["fc"]);
  const rule = { rollsBack: true, transfersCanFail: false, checkFinite: true };
  const plain = updateSeconds(simulate(plan, profile, COSTS));
  const priced = updateSeconds(
    simulate(plan, profile, { ...COSTS, checkSecondsPerByte: 0.0005, undo: { rule, secondsPerByte: 0.002 } }),
  );
  // The FC slice is half the group's bytes on each of 2 devices.
  near(plain["update fc"], 500 * 0.001, "sharded update fc");
  near(priced["update fc"], 500 * 0.0035, "sharded update fc with its copy and check");
});

Deno.test("simulate: bad check and undo costs are refused in one line", () => {
  assert.throws(
    () => simulate(overlapPlan(GROUPS), PROFILE, { ...COSTS, checkSecondsPerByte: -1 }),
    (e) =>
      e instanceof ValueError && /checkSecondsPerByte must be a finite number >= 0, got -1/.test(e.message),
  );
  const rule = { rollsBack: true, transfersCanFail: false, checkFinite: true };
  assert.throws(
    () => simulate(overlapPlan(GROUPS), PROFILE, { ...COSTS, undo: { rule, secondsPerByte: NaN } }),
    (e) =>
      e instanceof ValueError && /undo.secondsPerByte must be a finite number >= 0, got NaN/.test(e.message),
  );
  const partial = { rollsBack: true } as unknown as UndoRule;
  assert.throws(
    () => simulate(overlapPlan(GROUPS), PROFILE, { ...COSTS, undo: { rule: partial, secondsPerByte: 1 } }),
    (e) =>
      e instanceof ValueError &&
      /undo.rule must give rollsBack, transfersCanFail, checkFinite as booleans, got \{"rollsBack":true\}/
        .test(e.message),
  );
});
