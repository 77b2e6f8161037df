/**
 * The simulator on a link whose hosts' CPU sets its pace: `commCpuShare` (compute beside a transfer
 * runs at `1 − share` of its speed: a host's network stack on the cores that compute) and
 * `oneWayBandwidthBytesPerSecond` (one direction alone runs faster than both at once). Timelines
 * computed by hand on `hand(…)` (below) and `HAND_COSTS`: reduce fc 11.5 s, update fc 1 s,
 * broadcast fc 10.5 s; reduce conv 1.6 s, update conv 0.1 s, broadcast conv 1.5 s.
 */
import assert from "node:assert/strict";
import { ValueError } from "../../engine/errors.ts";
import { type Profile, simulate } from "../../schedule/simulator/mod.ts";
import { actionLabel, overlapPlan, sequentialPlan } from "../../schedule/mod.ts";
import { HAND_COSTS, layer } from "../fixtures/costs.ts";
import { pipelineSeconds } from "../../schedule/simulator/costs.ts";

const GROUPS = ["fc", "conv"];
const near = (actual: number, expected: number, what: string) =>
  assert.ok(
    Math.abs(actual - expected) <= 1e-9 * Math.max(1, Math.abs(expected)),
    `${what}: ${actual} vs ${expected}`,
  );
/** forward 1.5 s; backward fc 1 s, conv `convBackward` s; conv 100 B, fc 1000 B. */
const hand = (convBackward: number): Profile => ({
  batchSize: 4,
  layers: [
    layer("conv1", "conv", 0.6, convBackward * 0.6, 60),
    layer("conv2", "conv", 0.4, convBackward * 0.4, 40),
    layer("fc", "fc", 0.5, 1, 1000),
  ],
});
const compute = (sim: ReturnType<typeof simulate>, label: string) =>
  sim.lanes[0].compute.find((e) => actionLabel(e) === label)!;

// Mutation: `slowedEnd` returning `start + seconds` (the share ignored) fails this test (conv
// backward ends at 4.5 s; the long one at 22.5 s and the step at 28.7 s), and so does counting update fc
// as a transfer (the long conv backward would end at 34 s).
Deno.test("commCpuShare: compute beside a transfer runs at 1 − share of its speed, at full speed beside an update", () => {
  const costs = { ...HAND_COSTS, commCpuShare: 0.5 };
  // Conv backward (2 s) from 2.5 s lies inside reduce fc [2.5, 14]: it takes 4 s at half speed.
  const short = simulate(overlapPlan(GROUPS), hand(2), costs);
  near(compute(short, "backward conv").end, 6.5, "conv backward end");
  near(short.hiddenCommSeconds, 4, "hidden");
  near(short.stepSeconds, 28.7, "step: the exchange still sets it");
  // A 20 s conv backward: 5.75 s of it inside reduce fc [2.5, 14], 1 s beside update fc [14, 15] at
  // full speed, 5.25 s inside broadcast fc [15, 25.5], the last 8 s alone: it ends at 33.5 s; then
  // reduce conv 1.6, update conv 0.1, broadcast conv 1.5.
  const long = simulate(overlapPlan(GROUPS), hand(20), costs);
  near(compute(long, "backward conv").end, 33.5, "long conv backward end");
  near(long.stepSeconds, 33.5 + 1.6 + 0.1 + 1.5, "step");
  // Without the share: conv ends at 22.5 s, its reduce waits for broadcast fc (25.5 s): 28.7 s.
  near(simulate(overlapPlan(GROUPS), hand(20), HAND_COSTS).stepSeconds, 28.7, "step without the share");
});

// Mutation: slowing every compute action by the share (not only beside transfers) fails this test
// (the sequential step grows by the whole backward's and forward's slowdown).
Deno.test("commCpuShare: a sequential plan computes before it transfers, so its step does not change", () => {
  const plain = simulate(sequentialPlan(GROUPS), hand(2), HAND_COSTS);
  const shared = simulate(sequentialPlan(GROUPS), hand(2), { ...HAND_COSTS, commCpuShare: 0.9 });
  near(plain.stepSeconds, 30.7, "step");
  near(shared.stepSeconds, 30.7, "step with the share");
  assert.deepEqual(shared.lanes, plain.lanes);
});

// Mutation: laying the plan out once (no repeat until it stands still) fails this test: the
// transfer comes after the compute in plan order, so a single layout never sees it (4.5 s).
Deno.test("commCpuShare: a transfer written after the compute it runs beside still slows it", () => {
  const plan = sequentialPlan(GROUPS);
  // Without program order, reduce fc (written after backward conv) starts at 2.5 s, beside it.
  const raw = { ...plan, actions: plan.actions.map(({ waitsFor: _, ...action }) => action) };
  const sim = simulate(raw, hand(2), { ...HAND_COSTS, commCpuShare: 0.5 });
  near(sim.lanes[0].comm[0].start, 2.5, "reduce fc start");
  near(compute(sim, "backward conv").end, 6.5, "conv backward end");
});

Deno.test("commCpuShare: anything outside [0, 1) is refused in one line naming what was given", () => {
  for (const share of [1, -0.1, Number.NaN, 2]) {
    assert.throws(
      () => simulate(overlapPlan(GROUPS), hand(2), { ...HAND_COSTS, commCpuShare: share }),
      (e: unknown) =>
        e instanceof ValueError &&
        e.message === `simulate: commCpuShare must be a number in [0, 1), got ${share}`,
    );
  }
});

// Mutation: pricing master mode's gathers and broadcasts at the link's two-way rate (ignoring
// oneWayBandwidthBytesPerSecond) fails this test (30.7 s).
Deno.test("oneWayBandwidth: master mode's gathers and broadcasts run at the one-way rate", () => {
  // At 200 B/s one way: reduce fc 0.5 + 5 + 1 (sum) = 6.5, reduce conv 0.5 + 0.5 + 0.1 = 1.1, update
  // fc 1, conv 0.1, broadcast fc 0.5 + 5 = 5.5, conv 0.5 + 0.5 = 1; compute 4.5.
  const sim = simulate(sequentialPlan(GROUPS), hand(2), {
    ...HAND_COSTS,
    oneWayBandwidthBytesPerSecond: 200,
  });
  near(sim.stepSeconds, 4.5 + 6.5 + 1.1 + 1 + 0.1 + 5.5 + 1, "step");
  near(simulate(sequentialPlan(GROUPS), hand(2), HAND_COSTS).stepSeconds, 30.7, "step at the link's rate");
});

// Mutations: pricing an all-reduce, or a master pipeline that sends parameters back while gradients
// arrive, at the one-way rate fails this test.
Deno.test("oneWayBandwidth: an all-reduce and a two-way pipeline keep the link's rate; a one-way pipeline does not", () => {
  const allreduce = { ...HAND_COSTS, mode: "allreduce" } as const;
  near(
    simulate(sequentialPlan(GROUPS), hand(2), { ...allreduce, oneWayBandwidthBytesPerSecond: 400 })
      .stepSeconds,
    simulate(sequentialPlan(GROUPS), hand(2), allreduce).stepSeconds,
    "all-reduce",
  );
  const chunked = { ...HAND_COSTS, pipelineChunkBytes: 64 << 10 };
  const bytes = 32 << 20;
  const both = { update: true, broadcast: true }, inbound = { update: false, broadcast: false };
  near(
    pipelineSeconds(bytes, both, { ...chunked, oneWayBandwidthBytesPerSecond: 400 }),
    pipelineSeconds(bytes, both, chunked),
    "two-way pipeline",
  );
  near(
    pipelineSeconds(bytes, inbound, { ...chunked, oneWayBandwidthBytesPerSecond: 400 }),
    pipelineSeconds(bytes, inbound, { ...chunked, link: { ...chunked.link, bandwidthBytesPerSecond: 400 } }),
    "one-way pipeline",
  );
  assert.ok(
    pipelineSeconds(bytes, inbound, { ...chunked, oneWayBandwidthBytesPerSecond: 400 }) <
      pipelineSeconds(bytes, inbound, chunked),
  );
  assert.throws(
    () => simulate(overlapPlan(GROUPS), hand(2), { ...HAND_COSTS, oneWayBandwidthBytesPerSecond: 0 }),
    (e: unknown) =>
      e instanceof ValueError &&
      e.message === "simulate: oneWayBandwidthBytesPerSecond must be a finite number > 0, got 0",
  );
});
