import assert from "node:assert/strict";
import "../../mod.ts"; // registers the CPU backend
import { ValueError } from "../../engine/errors.ts";
import { Flatten, Linear, Network } from "../../engine/nn/mod.ts";
import {
  accumulatedProfile,
  alexnetScalingTable,
  autoSchedule,
  checkProfile,
  type CostOptions,
  hybridCandidate,
  hybridTraffic,
  judgeNetwork,
  type LayerProfile,
  measureProfile,
  type Profile,
  regroupProfile,
  simulate,
  STANDARD_LINKS,
} from "../../schedule/simulator/mod.ts";
import {
  activationCollectiveSeconds,
  commActionSeconds,
  pipelineSeconds,
} from "../../schedule/simulator/costs.ts";
import { pipelineChunkBytes } from "../../schedule/runtime/exchange/link.ts";
import { groupTimes } from "../../schedule/simulator/profile.ts";
import { tinyAlexNet } from "../fixtures/networks.ts";
import { HAND_COSTS, layer } from "../fixtures/costs.ts";
import {
  actionLabel,
  bucketedPlan,
  dependenciesOf,
  hybridPlan,
  overlapPlan,
  parseSchedule,
  scheduleBuilder,
  ScheduleError,
  sequentialPlan,
  validatePlan,
} from "../../schedule/mod.ts";

const GROUPS = ["fc", "conv"];
const near = (actual: number, expected: number, what = "", tolerance = 1e-9) =>
  assert.ok(
    Math.abs(actual - expected) <= tolerance * Math.max(1, Math.abs(expected)),
    `${what}: ${actual} vs ${expected}`,
  );

/** conv: forward 1 s, backward 2 s, 100 B; fc: forward 0.5 s, backward 1 s, 1000 B. */
const HAND: Profile = {
  batchSize: 4,
  layers: [
    layer("conv1", "conv", 0.6, 1.2, 60),
    layer("conv2", "conv", 0.4, 0.8, 40),
    layer("fc", "fc", 0.5, 1, 1000),
  ],
};

Deno.test("simulate: sequential is the sum of every action on a hand-made profile", () => {
  // forward 1.5; backward fc 1, conv 2; reduce fc 0.5 + 10 + 1 (sum) = 11.5, conv 0.5 + 1 + 0.1 = 1.6;
  // update fc 1, conv 0.1; broadcast fc 10.5, conv 1.5. Total 30.7.
  const sim = simulate(sequentialPlan(GROUPS), HAND, HAND_COSTS);
  near(sim.stepSeconds, 1.5 + 1 + 2 + 11.5 + 1.6 + 1 + 0.1 + 10.5 + 1.5, "step");
  near(sim.stepSeconds, 30.7, "step");
  const expected: [string, number, number][] = [
    ["reduce fc", 4.5, 16],
    ["reduce conv", 16, 17.6],
    ["update fc", 17.6, 18.6],
    ["update conv", 18.6, 18.7],
    ["broadcast fc", 18.7, 29.2],
    ["broadcast conv", 29.2, 30.7],
  ];
  const plan = sequentialPlan(GROUPS);
  const comm0 = sim.lanes[0].comm;
  assert.deepEqual(comm0.map((e) => actionLabel(e)), expected.map((e) => e[0]));
  comm0.forEach((e, i) => {
    near(e.start, expected[i][1], `${expected[i][0]} start`);
    near(e.end, expected[i][2], `${expected[i][0]} end`);
    assert.equal(actionLabel(plan.actions[e.action]), expected[i][0]);
  });
  assert.deepEqual(sim.lanes[0].compute.map((e) => [actionLabel(e), e.start, e.end]), [
    ["forward", 0, 1.5],
    ["backward fc", 1.5, 2.5],
    ["backward conv", 2.5, 4.5],
  ]);
  // Only device 0 updates in master mode; device 1 waits in the collectives.
  assert.deepEqual(sim.lanes[1].comm.map((e) => actionLabel(e)), [
    "reduce fc",
    "reduce conv",
    "broadcast fc",
    "broadcast conv",
  ]);
  near(sim.commSeconds, 30.7 - 4.5, "comm");
  assert.equal(sim.hiddenCommSeconds, 0);
  assert.equal(sim.hiddenFraction, 0);
  near(sim.computeSeconds, 4.5, "compute");
});

Deno.test("simulate: written order matters — reduce all after backward all waits for the whole backward", () => {
  const plan = sequentialPlan(GROUPS);
  const reduceFc = plan.actions.findIndex((s) => actionLabel(s) === "reduce fc");
  const backwardConv = plan.actions.findIndex((s) => actionLabel(s) === "backward conv");
  assert.deepEqual(plan.actions[reduceFc].waitsFor, [backwardConv]);
  assert.ok(dependenciesOf(plan, reduceFc).includes(backwardConv));
  // The overlap plan needs no extra waits: lane order and data say everything.
  assert.ok(overlapPlan(GROUPS).actions.every((s) => s.waitsFor === undefined));
  // A hand-made plan without program order does overlap reduce fc with backward conv.
  const raw = { ...plan, actions: plan.actions.map(({ waitsFor: _, ...s }) => s) };
  near(simulate(raw, HAND, HAND_COSTS).lanes[0].comm[0].start, 2.5, "reduce fc start without program order");
  const badWait = { ...plan, actions: plan.actions.map((s, i) => (i === 1 ? { ...s, waitsFor: [5] } : s)) };
  assert.throws(
    () => validatePlan(badWait, { mode: "master" }),
    (e: unknown) =>
      e instanceof ScheduleError &&
      e.reason === "backward fc waits for action 5, which is not an earlier action",
  );
});

Deno.test("simulate: overlap runs FC communication during conv backward", () => {
  const sim = simulate(overlapPlan(GROUPS), HAND, HAND_COSTS);
  // reduce fc [2.5, 14], update fc [14, 15], broadcast fc [15, 25.5], reduce conv [25.5, 27.1],
  // update conv [27.1, 27.2], broadcast conv [27.2, 28.7]; conv backward [2.5, 4.5] hides 2 s.
  near(sim.stepSeconds, 28.7, "step");
  near(sim.commSeconds, 26.2, "comm");
  near(sim.hiddenCommSeconds, 2, "hidden");
  near(sim.hiddenFraction, 2 / 26.2, "fraction");
  near(sim.groups.fc.commSeconds, 23, "fc comm");
  near(sim.groups.fc.hiddenCommSeconds, 2, "fc hidden");
  near(sim.groups.conv.commSeconds, 3.2, "conv comm");
  assert.equal(sim.groups.conv.hiddenCommSeconds, 0);
  // Same parameters, same total communication: the saving is exactly the hidden part.
  near(simulate(sequentialPlan(GROUPS), HAND, HAND_COSTS).stepSeconds - sim.stepSeconds, 2, "saving");
});

Deno.test("simulate: FC communication shorter than conv backward is hidden completely", () => {
  const profile: Profile = {
    batchSize: 1,
    layers: [layer("conv", "conv", 1, 5, 0), layer("fc", "fc", 0.5, 1, 100)],
  };
  const costs: CostOptions = { ...HAND_COSTS, link: { bandwidthBytesPerSecond: 100, latencySeconds: 0 } };
  const sim = simulate(overlapPlan(GROUPS), profile, costs);
  // reduce fc 1 + 0.1, update 0.1, broadcast 1: 2.2 s inside conv backward's 5 s.
  near(sim.groups.fc.commSeconds, 2.2, "fc comm");
  near(sim.groups.fc.hiddenCommSeconds / sim.groups.fc.commSeconds, 1, "fc fraction");
  near(sim.hiddenFraction, 1, "fraction");
  near(sim.stepSeconds, 1.5 + 1 + 5, "step is just compute");
  near(simulate(sequentialPlan(GROUPS), profile, costs).stepSeconds, 1.5 + 1 + 5 + 2.2, "sequential");
  // When FC communication outlasts conv backward, exactly the conv backward's length is hidden.
  const slow = { ...costs, link: { bandwidthBytesPerSecond: 10, latencySeconds: 0 } };
  const long = simulate(overlapPlan(GROUPS), profile, slow);
  near(long.hiddenCommSeconds, 5, "hidden = conv backward");
  near(long.stepSeconds, 1.5 + 1 + (10 + 0.1) + 0.1 + 10, "step");
});

Deno.test("cost model: latency and bandwidth scale as documented", () => {
  const b = 1e6;
  const base: CostOptions = {
    link: { bandwidthBytesPerSecond: 1e9, latencySeconds: 1e-4 },
    devices: 4,
    mode: "master",
    memoryBandwidthBytesPerSecond: 1e10,
    updateSecondsPerByte: 1e-10,
  };
  const t = 1e-4 + b / 1e9;
  near(commActionSeconds("reduce", b, base), 3 * t + (3 * b) / 1e10, "shared reduce");
  near(commActionSeconds("broadcast", b, base), 3 * t, "shared broadcast");
  near(commActionSeconds("reduce", b, { ...base, topology: "star" }), t + (3 * b) / 1e10, "star reduce");
  near(commActionSeconds("broadcast", b, { ...base, topology: "star" }), t, "star broadcast");
  // Devices sharing the master's memory: it averages their gradients where they lie (mutation seen
  // failing: the flag ignored, the gather priced anyway); the broadcast still copies.
  near(commActionSeconds("reduce", b, { ...base, gatherInPlace: true }), (3 * b) / 1e10, "in-place reduce");
  near(commActionSeconds("broadcast", b, { ...base, gatherInPlace: true }), 3 * t, "in-place broadcast");
  near(commActionSeconds("update", b, base), 1e-4, "update");
  const ring = commActionSeconds("reduce", b, { ...base, mode: "allreduce" });
  near(ring, (2 * 3 / 4) * b / 1e9 + 2 * 3 * 1e-4 + (3 / 4) * b / 1e10, "ring");
  assert.equal(commActionSeconds("broadcast", b, { ...base, mode: "allreduce" }), 0);
  assert.equal(commActionSeconds("reduce", b, { ...base, devices: 1 }), 0);
  assert.equal(commActionSeconds("broadcast", b, { ...base, devices: 1 }), 0);
  // Doubling the bandwidth halves only the byte term; latency is paid per message.
  const fast = { ...base, link: { bandwidthBytesPerSecond: 2e9, latencySeconds: 1e-4 } };
  near(
    commActionSeconds("broadcast", b, base) - commActionSeconds("broadcast", b, fast),
    3 * (b / 1e9 - b / 2e9),
    "bw",
  );
  const laggy = { ...base, link: { bandwidthBytesPerSecond: 1e9, latencySeconds: 2e-4 } };
  near(commActionSeconds("broadcast", b, laggy) - commActionSeconds("broadcast", b, base), 3e-4, "latency");
  const laggyRing = commActionSeconds("reduce", b, { ...laggy, mode: "allreduce" });
  near(laggyRing - ring, 6e-4, "ring latency");
});

Deno.test("simulate: N devices — a shared link grows linearly, a star only in the sums", () => {
  const steps = (topology: "star" | "shared") =>
    [1, 2, 3, 4, 5, 6, 7, 8].map((devices) =>
      simulate(sequentialPlan(GROUPS), HAND, { ...HAND_COSTS, devices, topology }).stepSeconds
    );
  const shared = steps("shared");
  // One device: no transfers, only compute and updates.
  near(shared[0], 1.5 + 3 + 1.1, "one device");
  // Each extra device adds one transfer per reduce and broadcast and one more sum per reduce.
  const perDevice = 2 * (0.5 + 10) + 2 * (0.5 + 1) + 1 + 0.1;
  for (let n = 2; n < 8; n++) near(shared[n] - shared[n - 1], perDevice, `shared ${n + 1}`);
  const star = steps("star");
  for (let n = 2; n < 8; n++) near(star[n] - star[n - 1], 1 + 0.1, `star ${n + 1}`);
  // All devices are in the timeline.
  const sim = simulate(overlapPlan(GROUPS), HAND, { ...HAND_COSTS, devices: 5 });
  assert.equal(sim.lanes.length, 5);
  assert.ok(sim.lanes.every((l) => l.compute.length === 3));
});

Deno.test("simulate: allreduce updates everywhere and its broadcasts take no time", () => {
  const costs = { ...HAND_COSTS, mode: "allreduce" as const, devices: 4 };
  const sim = simulate(overlapPlan(GROUPS), HAND, costs);
  for (const lanes of sim.lanes) {
    assert.deepEqual(lanes.comm.map((e) => actionLabel(e)), [
      "reduce fc",
      "update fc",
      "broadcast fc",
      "reduce conv",
      "update conv",
      "broadcast conv",
    ]);
    for (const e of lanes.comm.filter((e) => e.kind === "broadcast")) assert.equal(e.end, e.start);
  }
  const ring = (b: number) => 1.5 * b / 100 + 6 * 0.5 + 0.75 * b / 1000;
  const fcDone = 2.5 + ring(1000) + 1;
  near(sim.stepSeconds, fcDone + ring(100) + 0.1, "step");
});

// Mutations tried, each made this test fail: the pipeline costed as the sum of its three stages per
// chunk instead of their maximum; the broadcast's outbound stage counted in allreduce mode; the
// update and broadcast actions keeping their blocking lengths after the fused reduce; a reduce that
// its update does not follow priced blocking (gathers, then every sum) under pipelineChunkBytes.
Deno.test("simulate: a pipelined exchange costs one stage per chunk plus the pipeline's fill, not three actions", () => {
  const costs: CostOptions = { ...HAND_COSTS, pipelineChunkBytes: 100 };
  // fc, 1000 B in 10 chunks: inbound 1 s, CPU 100/1000 + 100 · 0.001 = 0.2 s, outbound 1 s per chunk;
  // 0.5 + 1 + 0.2 + 1 + 9 · max(1, 0.2, 1) = 11.7 s from the end of backward fc (2.5 s). conv, one
  // 100 B chunk: 0.5 + 1 + 0.2 + 1 = 2.7 s, after fc's pipeline frees the lane (14.2 s).
  const master = simulate(overlapPlan(GROUPS), HAND, costs);
  assert.deepEqual(master.lanes[0].comm.map((e) => [actionLabel(e), e.start, e.end].join(" ")), [
    "reduce fc 2.5 14.2",
    "update fc 14.2 14.2",
    "broadcast fc 14.2 14.2",
    "reduce conv 14.2 16.9",
    "update conv 16.9 16.9",
    "broadcast conv 16.9 16.9",
  ]);
  near(master.stepSeconds, 16.9, "master step");
  // Blocking, the same plan takes reduce 11.5 + update 1 + broadcast 10.5 for fc alone.
  near(
    simulate(overlapPlan(GROUPS), HAND, HAND_COSTS).stepSeconds,
    2.5 + 11.5 + 1 + 10.5 + 1.6 + 0.1 + 1.5,
    "blocking",
  );
  // All-reduce: every device all-gathers (1 s per chunk in) and updates; nothing goes back out.
  near(
    simulate(overlapPlan(GROUPS), HAND, { ...costs, mode: "allreduce" }).stepSeconds,
    2.5 + 10.7 + 1.7,
    "allreduce",
  );
  // A reduce not followed by its update (the sequential plan) is still cut into chunks, as the runtime
  // cuts it: each summed (0.1 s) while the next arrives (1 s), fc 0.5 + 1 + 0.1 + 9 · 1 = 10.6 s and
  // conv 1.6 s, against 11.5 and 1.6 blocking; its update and broadcast stay blocking.
  near(simulate(sequentialPlan(GROUPS), HAND, costs).stepSeconds, 4.5 + 10.6 + 1.6 + 1.1 + 12, "sequential");
  near(simulate(sequentialPlan(GROUPS), HAND, HAND_COSTS).stepSeconds, 30.7, "sequential, blocking");
});

Deno.test("simulate: rejects plans and profiles that do not match, and bad options", () => {
  assert.throws(() => simulate(overlapPlan(["fc", "conv", "extra"]), HAND, HAND_COSTS), /lacks/);
  assert.throws(() => simulate(overlapPlan(["fc"]), HAND, HAND_COSTS), /not in plan/);
  const broken = parseSchedule("forward; backward all; update all; reduce all; broadcast all", {
    groups: GROUPS,
  });
  assert.throws(() => simulate(broken, HAND, HAND_COSTS), ScheduleError);
  assert.throws(() => simulate(overlapPlan(GROUPS), HAND, { ...HAND_COSTS, devices: 0 }), ValueError);
  assert.throws(
    () =>
      simulate(overlapPlan(GROUPS), HAND, {
        ...HAND_COSTS,
        link: { bandwidthBytesPerSecond: 0, latencySeconds: 0 },
      }),
    ValueError,
  );
  assert.throws(
    () => simulate(overlapPlan(GROUPS), HAND, { ...HAND_COSTS, topology: "mesh" as "star" }),
    ValueError,
  );
});

Deno.test("profile: group totals in backward order; contiguity and values are checked", () => {
  assert.deepEqual(groupTimes(HAND), [
    { group: "fc", layers: ["fc"], forwardSeconds: 0.5, backwardSeconds: 1, parameterBytes: 1000 },
    { group: "conv", layers: ["conv1", "conv2"], forwardSeconds: 1, backwardSeconds: 2, parameterBytes: 100 },
  ]);
  const split = {
    batchSize: 1,
    layers: [layer("a", "x", 1, 1, 1), layer("b", "y", 1, 1, 1), layer("c", "x", 1, 1, 1)],
  };
  assert.throws(() => checkProfile(split), /group x is not contiguous/);
  assert.throws(
    () => checkProfile({ batchSize: 1, layers: [layer("a", "x", -1, 1, 1)] }),
    /forwardSeconds -1/,
  );
  assert.throws(() => checkProfile({ batchSize: 0, layers: [layer("a", "x", 1, 1, 1)] }), /batchSize/);
  assert.throws(
    () => checkProfile({ batchSize: 1, layers: [layer("a", "x", 1, 1, 1), layer("a", "x", 1, 1, 1)] }),
    /twice/,
  );
  assert.throws(() => checkProfile({ batchSize: 1, layers: [layer("a", "all", 1, 1, 1)] }), ValueError);
  assert.deepEqual(regroupProfile(HAND, { conv2: "fc" }).layers.map((l) => l.group), ["conv", "fc", "fc"]);
});

// Per-image forward multiply-adds of Caffe's AlexNet and its parameter counts, from its layer shapes
// (examples/caffe/bvlc_alexnet_train_val.prototxt).
const ALEXNET: [string, number, number][] = [
  ["conv1", 105_415_200, 34_944],
  ["norm1", 0, 0],
  ["pool1", 0, 0],
  ["conv2", 223_948_800, 307_456],
  ["norm2", 0, 0],
  ["pool2", 0, 0],
  ["conv3", 149_520_384, 885_120],
  ["conv4", 112_140_288, 663_936],
  ["conv5", 74_760_192, 442_624],
  ["pool5", 0, 0],
  ["fc6", 37_748_736, 37_752_832],
  ["fc7", 16_777_216, 16_781_312],
  ["fc8", 4_096_000, 4_097_000],
];

/**
 * A synthetic AlexNet profile at batch 128 per device: real parameter bytes (fp32), times from the
 * multiply-adds at 4 TFLOP/s for convolutions and 2 TFLOP/s for the FC layers, backward twice the
 * forward, 0.2 ms for each parameter-free layer. FC is then ~15% of the compute.
 */
function alexnetProfile(): Profile {
  const batch = 128;
  return {
    batchSize: batch,
    description: "synthetic",
    layers: ALEXNET.map(([name, macs, params]) => {
      const forward = macs === 0 ? 2e-4 : (2 * macs * batch) / (name.startsWith("fc") ? 2e12 : 4e12);
      return layer(name, name.startsWith("fc") ? "fc" : "conv", forward, 2 * forward, 4 * params);
    }),
  };
}

/** Parameters spread evenly, like a ResNet: eight 1 MB conv layers and a 0.5 MB classifier. */
function resnetLikeProfile(): Profile {
  const layers = Array.from({ length: 8 }, (_, i) => layer(`conv${i + 1}`, "conv", 0.005, 0.01, 1e6));
  return { batchSize: 32, layers: [...layers, layer("fc", "fc", 0.0005, 0.001, 5e5)] };
}

Deno.test("judgeNetwork: AlexNet is AlexNet-like; the split hides the most communication", () => {
  const profile = alexnetProfile();
  const totals = groupTimes(profile);
  const fcShare = (totals[0].forwardSeconds + totals[0].backwardSeconds) /
    profile.layers.reduce((s, l) => s + l.forwardSeconds + l.backwardSeconds, 0);
  assert.ok(fcShare > 0.05 && fcShare < 0.2, `FC share of compute ${fcShare}`);

  const link = STANDARD_LINKS.find((l) => l.label === "PCIe 3")!;
  const verdict = judgeNetwork(profile, { link, devices: 2 });
  assert.equal(verdict.alexnetLike, true);
  near(verdict.suffixParameterFraction, 58_631_144 / 60_965_224, "byte share");
  assert.ok(
    verdict.reason.startsWith(
      "AlexNet-like: the output-side layers fc6..fc8 hold 96.2% of the parameter bytes (234.5 MB of 243.9 MB) and take ",
    ),
    verdict.reason,
  );
  assert.ok(
    verdict.reason.includes("within the thresholds (≥ 50.0% of the bytes in ≤ 35.0% of the backward time)"),
  );
  assert.ok(verdict.reason.includes("at 12.0 GB/s with 2 devices (master)"));
  const split = verdict.split!;
  // Brute force: no other boundary hides more communication.
  for (let b = 1; b < profile.layers.length; b++) {
    if (profile.layers[b].parameterBytes === 0) continue;
    const assignment = Object.fromEntries(profile.layers.map((l, i) => [l.name, i < b ? "body" : "head"]));
    const sim = simulate(overlapPlan(["head", "body"]), regroupProfile(profile, assignment), {
      link,
      devices: 2,
      mode: "master",
    });
    assert.ok(sim.hiddenCommSeconds <= split.hiddenCommSeconds + 1e-12, profile.layers[b].name);
  }
  // FC traffic over PCIe 3 fits under the conv backward with room to spare, so the largest suffix
  // that still fits also takes conv4 and conv5 (their bytes are few, their backward is long).
  assert.equal(split.boundaryLayer, "conv4");
  assert.deepEqual(split.groups, ["head", "body"]);
  assert.equal(split.assignment.conv3, "body");
  assert.equal(split.assignment.conv4, "head");
  assert.equal(split.assignment.fc8, "head");
  assert.ok(split.overlapSeconds < split.sequentialSeconds);
  assert.ok(verdict.reason.includes(`Split before conv4 into head (conv4..fc8) and body (conv1..conv3)`));

  // Over 10 GbE the FC traffic dwarfs the conv backward; the best cut leaves fc6 with the input side.
  const slow = judgeNetwork(profile, { link: STANDARD_LINKS.find((l) => l.label === "10 GbE")!, devices: 2 });
  assert.equal(slow.alexnetLike, true);
  assert.equal(slow.split!.boundaryLayer, "fc7");
});

Deno.test("judgeNetwork: a network with evenly spread parameters is not AlexNet-like", () => {
  const verdict = judgeNetwork(resnetLikeProfile());
  assert.equal(verdict.alexnetLike, false);
  near(verdict.suffixParameterFraction, 4.5 / 8.5, "byte share");
  near(verdict.suffixBackwardFraction, 0.041 / 0.081, "time share");
  assert.equal(
    verdict.reason,
    "not AlexNet-like: the output-side layers conv5..fc hold 52.9% of the parameter bytes (4.5 MB of 8.5 MB) " +
      "and take 50.6% of the backward time (41.00 ms of 81.00 ms); more than 35.0% of the backward time, so " +
      "most parameters are ready too late to hide their communication; use bucketed: 3 buckets of about " +
      "equal bytes (DDP-style: conv6..fc, conv3..conv5, conv1..conv2) hide 1.32 ms of communication at " +
      "12.0 GB/s with 2 devices (master), 121.91 ms against 123.21 ms sequential",
  );
  // The buckets: contiguous, output side first, each about a third of the 8.5 MB.
  const buckets = verdict.buckets!;
  assert.deepEqual(buckets.groups, ["bucket1", "bucket2", "bucket3"]);
  assert.equal(buckets.assignment.fc, "bucket1");
  assert.equal(buckets.assignment.conv5, "bucket2");
  assert.equal(buckets.assignment.conv1, "bucket3");
  assert.ok(buckets.bucketedSeconds < buckets.sequentialSeconds);
  // One group of its own, on a link where every transfer costs far more latency than the backward
  // it could hide behind: more transfers only cost more, and the verdict says sequential.
  const oneGroup = regroupProfile(resnetLikeProfile(), { fc: "conv" });
  const slowLink = { bandwidthBytesPerSecond: 12e9, latencySeconds: 1 };
  const fast = judgeNetwork(oneGroup, { link: slowLink });
  assert.equal(fast.buckets, undefined);
  assert.ok(fast.reason.endsWith("; use sequential (no bucketing is predicted faster)"), fast.reason);
  // Looser thresholds make it pass; the verdict follows the stated numbers.
  assert.equal(
    judgeNetwork(resnetLikeProfile(), { thresholds: { maxSuffixBackwardFraction: 0.6 } }).alexnetLike,
    true,
  );
  // Nothing before the big layers has parameters: nothing to hide behind.
  const headOnly = { batchSize: 1, layers: [layer("pool", "conv", 1, 1, 0), layer("fc", "fc", 1, 1, 100)] };
  const lonely = judgeNetwork(headOnly);
  assert.equal(lonely.alexnetLike, false);
  assert.ok(lonely.reason.includes("no layer before them has parameters"), lonely.reason);
});

Deno.test("autoSchedule: overlap on the split for AlexNet, DDP-style buckets with the reason otherwise", () => {
  // Mutation tried: autoSchedule ignoring judgement.buckets (sequential for every network that is
  // not AlexNet-like) fails here.
  const link = STANDARD_LINKS[0];
  const alex = autoSchedule(alexnetProfile(), link, 4);
  assert.equal(alex.name, "overlap");
  assert.deepEqual(alex.groups, alex.judgement.split!.groups);
  assert.equal(alex.assignment.fc6, alex.groups[0]);
  validatePlan(alex, { mode: "master" });
  const resnet = autoSchedule(resnetLikeProfile(), link, 4);
  assert.equal(resnet.name, "bucketed");
  assert.deepEqual(resnet.groups, resnet.judgement.buckets!.groups);
  assert.equal(resnet.assignment.conv3, resnet.judgement.buckets!.assignment.conv3);
  assert.ok(resnet.judgement.reason.startsWith("not AlexNet-like"));
  assert.match(resnet.judgement.reason, /; use bucketed: \d buckets of about equal bytes/);
  assert.deepEqual(resnet.actions, bucketedPlan(resnet.groups).actions);
  validatePlan(resnet, { mode: "master" });
  // Where bucketing does not pay, the sequential plan on the profile's own groups.
  const oneGroup = regroupProfile(resnetLikeProfile(), { fc: "conv" });
  const fast = autoSchedule(oneGroup, { bandwidthBytesPerSecond: 12e9, latencySeconds: 1 }, 4);
  assert.equal(fast.name, "sequential");
  assert.deepEqual(fast.groups, ["conv"]);
  assert.equal(fast.assignment.fc, "conv");
  const builtIn = scheduleBuilder(["conv"]).forward().backward("all").reduce("all").update("all")
    .broadcast("all").build("sequential");
  assert.deepEqual(fast.actions, builtIn.actions);
});

Deno.test("alexnetScalingTable: every link, device count and mode; overlap never loses", () => {
  const profile = alexnetProfile();
  const table = alexnetScalingTable(profile);
  assert.equal(table.rows.length, 5 * 2 * 7);
  for (const row of table.rows) {
    assert.ok(row.overlapSeconds <= row.sequentialSeconds + 1e-12, JSON.stringify(row));
    assert.ok(row.hiddenFraction > 0 && row.hiddenFraction <= 1);
    near(row.imagesPerSecond, (row.devices * 128) / row.overlapSeconds, "images/s");
    assert.ok(row.scalingEfficiency > 0 && row.scalingEfficiency <= 1 + 1e-12, JSON.stringify(row));
  }
  const at = (link: string, devices: number, mode: string) =>
    table.rows.find((r) => r.link === link && r.devices === devices && r.mode === mode)!;
  assert.ok(at("NVLink", 8, "allreduce").scalingEfficiency > at("10 GbE", 8, "allreduce").scalingEfficiency);
  // Master mode through one shared link degrades with N; the ring barely does.
  assert.ok(at("PCIe 3", 8, "master").overlapSeconds > at("PCIe 3", 2, "master").overlapSeconds * 2);
  assert.ok(at("PCIe 3", 8, "allreduce").overlapSeconds < at("PCIe 3", 2, "allreduce").overlapSeconds * 1.5);
  // PCIe 3 and 100 GbE have the same bandwidth here; only latency differs.
  near(
    at("PCIe 3", 4, "master").sequentialSeconds,
    at("100 GbE", 4, "master").sequentialSeconds,
    "same link",
    1e-6,
  );
  const lines = table.markdown.trimEnd().split("\n");
  assert.equal(lines.length, 2 + 70);
  assert.ok(lines[0].startsWith("| link | devices | mode | sequential ms | overlap ms |"));
  const small = alexnetScalingTable(profile, { devices: [2], modes: ["master"], links: [STANDARD_LINKS[2]] });
  assert.equal(small.rows.length, 1);
});

// ---------------------------------------------------------------------------------------------
// Hybrid plans: FC layers model-parallel, their activations travel instead of their gradients.

const fcLayer = (
  name: string,
  group: string,
  f: number,
  b: number,
  bytes: number,
  outputBytes: number,
  kind: string,
): LayerProfile => ({ ...layer(name, group, f, b, bytes), outputBytes, kind });

/**
 * HAND's totals (conv forward 1 s, backward 2 s, 100 B; fc forward 0.5 s, backward 1 s, 1000 B) with
 * activation sizes at the per-device batch of 4: the body output is 80 B (5 features × 4 samples ×
 * 4 B), fc1 has 3 outputs (48 B), a ReLU keeps them, fc2 has 2 (32 B, the logits).
 */
const HYBRID_PROFILE: Profile = {
  batchSize: 4,
  layers: [
    fcLayer("conv1", "conv", 0.6, 1.2, 60, 160, "Conv2d"),
    fcLayer("conv2", "conv", 0.4, 0.8, 40, 80, "Conv2d"),
    fcLayer("fc1", "fc", 0.3, 0.6, 600, 48, "Linear"),
    fcLayer("relu", "fc", 0.1, 0.1, 0, 48, "ReLU"),
    fcLayer("fc2", "fc", 0.1, 0.3, 400, 32, "Linear"),
  ],
};

// Mutations tried, each made this test fail: dropping the logits' all-gather (the last sharded
// layer's output; step 12.388 s); pricing the reduce-scatter without its sums (step 13.08 s); master
// mode running the sharded update on device 0 only (device 1's comm lane lost update fc).
Deno.test("simulate hybrid: a hand-computed step on 2 devices, activation traffic on the compute lane", () => {
  const plan = hybridPlan(GROUPS);
  const sim = simulate(plan, HYBRID_PROFILE, HAND_COSTS);
  // One message per collective (N − 1 = 1), 0.5 s latency + bytes / 100 B/s; sums at 1000 B/s.
  // forward: 1.5 s of compute + all-gathers of conv2's 80 B (1.3), fc1's 48 B (0.98), fc2's 32 B
  //   (0.82) = 4.6 s.
  // backward fc: 1 s + reduce-scatters of fc2's input, 48 B (0.5 + 0.48 + 0.048), and fc1's, 80 B
  //   (0.5 + 0.8 + 0.08) = 3.408 s, ending at 8.008 s.
  // update fc, on both devices: 1000 B / 2 · 1 ms/B = 0.5 s beside backward conv [8.008, 10.008].
  // reduce conv 0.5 + 1 + 0.1 = 1.6, update conv 0.1, broadcast conv 1.5: 13.208 s.
  assert.deepEqual(sim.lanes[0].compute.map((e) => actionLabel(e)), [
    "forward",
    "backward fc",
    "backward conv",
  ]);
  const ends = (entries: readonly { start: number; end: number }[]) =>
    entries.flatMap((e) => [e.start, e.end]);
  ends(sim.lanes[0].compute).forEach((t, i) =>
    near(t, [0, 4.6, 4.6, 8.008, 8.008, 10.008][i], `compute ${i}`)
  );
  for (const d of [0, 1]) {
    const comm = sim.lanes[d].comm;
    assert.deepEqual(
      comm.map((e) => actionLabel(e)),
      d === 0
        ? ["update fc", "reduce conv", "update conv", "broadcast conv"]
        : ["update fc", "reduce conv", "broadcast conv"],
    );
    near(comm[0].start, 8.008, "update fc start");
    near(comm[0].end, 8.508, "update fc end");
  }
  near(sim.stepSeconds, 13.208, "step");
  // Traffic per device per step: all-gathers 80 + 48 + 32, reduce-scatters 48 + 80.
  const t = sim.hybrid!;
  assert.deepEqual(t.sharded, ["fc"]);
  assert.equal(t.allGatherBytes, 160);
  assert.equal(t.reduceScatterBytes, 128);
  assert.equal(t.bytes, 288);
  near(t.allGatherSeconds, 3.1, "all-gathers");
  near(t.reduceScatterSeconds, 2.408, "reduce-scatters");
  assert.deepEqual(t.updateBytes, { fc: 500 });
  assert.deepEqual(t.transfers.map((x) => [x.kind, x.layer, x.action, x.pieceBytes, x.bytes]), [
    ["all-gather", "conv2", "forward", 80, 80],
    ["all-gather", "fc1", "forward", 48, 48],
    ["all-gather", "fc2", "forward", 32, 32],
    ["reduce-scatter", "fc2", "backward fc", 48, 48],
    ["reduce-scatter", "fc1", "backward fc", 80, 80],
  ]);
  // The FC collectives are not on the comm lane: only the update and the conv exchange are.
  near(sim.commSeconds, 0.5 + 1.6 + 0.1 + 1.5, "comm");
  // The same profile under overlap exchanges the 1000 B of FC gradients instead: 28.7 s (see above).
  near(simulate(overlapPlan(GROUPS), HYBRID_PROFILE, HAND_COSTS).stepSeconds, 28.7, "overlap");
  // Allreduce: the activations cost the same (no master); conv's ring 1 + 1 + 0.05, update 0.1.
  const ring = simulate(plan, HYBRID_PROFILE, { ...HAND_COSTS, mode: "allreduce" });
  near(ring.stepSeconds, 10.008 + 2.05 + 0.1, "allreduce step");
  assert.deepEqual(ring.hybrid, t);
  // No `hybrid` figures for data-parallel plans.
  assert.equal("hybrid" in simulate(overlapPlan(GROUPS), HYBRID_PROFILE, HAND_COSTS), false);
});

// Mutation tried: the pieces taken from parameterBytes instead of outputBytes (every transfer then
// changed with the FC parameters; this test and the hand-computed one failed).
Deno.test("simulate hybrid: traffic follows batch and widths, not FC parameter bytes", () => {
  const plan = hybridPlan(GROUPS);
  const base = simulate(plan, HYBRID_PROFILE, HAND_COSTS);
  const scale = (p: Profile, f: (l: LayerProfile) => Partial<LayerProfile>): Profile => ({
    ...p,
    layers: p.layers.map((l) => ({ ...l, ...f(l) })),
  });
  // 1000× the FC parameters: the collectives and the compute lane do not move; only the local update grows.
  const heavy = simulate(
    plan,
    scale(
      HYBRID_PROFILE,
      (l) => ({ parameterBytes: l.group === "fc" ? 1000 * l.parameterBytes : l.parameterBytes }),
    ),
    HAND_COSTS,
  );
  assert.deepEqual(heavy.hybrid!.transfers, base.hybrid!.transfers);
  assert.deepEqual(heavy.lanes[0].compute, base.lanes[0].compute);
  assert.deepEqual(heavy.hybrid!.updateBytes, { fc: 500_000 });
  // …whereas the data-parallel FC exchange grows with them (11.5 + 10.5 s → over 10,000 s).
  assert.ok(
    simulate(
      overlapPlan(GROUPS),
      scale(HYBRID_PROFILE, (l) => ({ parameterBytes: 1000 * l.parameterBytes })),
      HAND_COSTS,
    )
      .groups.fc.commSeconds > 10_000,
  );
  // Twice the batch per device: twice the bytes; the byte terms double, the latencies stay.
  const doubled = simulate(
    plan,
    { ...scale(HYBRID_PROFILE, (l) => ({ outputBytes: 2 * l.outputBytes! })), batchSize: 8 },
    HAND_COSTS,
  ).hybrid!;
  assert.equal(doubled.bytes, 2 * 288);
  near(doubled.allGatherSeconds, 3 * 0.5 + 2 * 160 / 100, "all-gathers at twice the batch");
  near(doubled.reduceScatterSeconds, 2 * 0.5 + 2 * 128 / 100 + 2 * 128 / 1000, "reduce-scatters");
  // A wider fc1 (6 outputs, 96 B, through the ReLU): its all-gather and fc2's input reduce-scatter grow.
  const wide = hybridTraffic(
    scale(HYBRID_PROFILE, (l) => (l.name === "fc1" || l.name === "relu" ? { outputBytes: 96 } : {})),
    ["fc"],
    HAND_COSTS,
  );
  assert.equal(wide.bytes, 288 + 2 * 48);
  // More devices: each receives N − 1 pieces.
  assert.equal(hybridTraffic(HYBRID_PROFILE, ["fc"], { ...HAND_COSTS, devices: 4 }).bytes, 3 * 288);
});

// Mutation tried: a star also sending its N − 1 messages one after another (the star figures failed).
Deno.test("activation collectives: N − 1 messages through a shared link, side by side in a star, both modes", () => {
  const x = 1e6;
  const base: CostOptions = {
    link: { bandwidthBytesPerSecond: 1e9, latencySeconds: 1e-4 },
    devices: 4,
    mode: "master",
    memoryBandwidthBytesPerSecond: 1e10,
  };
  const message = 1e-4 + x / 1e9;
  near(activationCollectiveSeconds("all-gather", x, base), 3 * message, "shared all-gather");
  near(
    activationCollectiveSeconds("reduce-scatter", x, base),
    3 * message + 3 * x / 1e10,
    "shared reduce-scatter",
  );
  const star = { ...base, topology: "star" as const };
  near(activationCollectiveSeconds("all-gather", x, star), message, "star all-gather");
  near(activationCollectiveSeconds("reduce-scatter", x, star), message + 3 * x / 1e10, "star reduce-scatter");
  for (const kind of ["all-gather", "reduce-scatter"] as const) {
    assert.equal(
      activationCollectiveSeconds(kind, x, { ...base, mode: "allreduce" }),
      activationCollectiveSeconds(kind, x, base),
    );
    assert.equal(activationCollectiveSeconds(kind, x, { ...base, devices: 1 }), 0);
  }
  // In a whole step at 3 devices: the star saves one message per collective.
  const at3 = (topology: "star" | "shared") =>
    simulate(hybridPlan(GROUPS), HYBRID_PROFILE, { ...HAND_COSTS, devices: 3, topology }).hybrid!;
  near(at3("shared").allGatherSeconds, 2 * (3 * 0.5 + 160 / 100), "3 devices, shared");
  near(at3("star").allGatherSeconds, 3 * 0.5 + 160 / 100, "3 devices, star");
  assert.equal(at3("star").bytes, at3("shared").bytes);
  assert.throws(() => activationCollectiveSeconds("all-gather", x, { ...base, devices: 0 }), ValueError);
});

// Mutations tried, each made this test fail: handoffSeconds read but not added (the step did not
// move); added to the all-gathers only (the reduce-scatters did not move).
Deno.test("simulate hybrid: the runtime's handoff costs once per activation collective, on the critical path", () => {
  const plan = hybridPlan(GROUPS);
  const without = simulate(plan, HYBRID_PROFILE, HAND_COSTS);
  const withHandoff = simulate(plan, HYBRID_PROFILE, { ...HAND_COSTS, handoffSeconds: 0.25 });
  const collectives = without.hybrid!.transfers.length;
  assert.equal(collectives, 5); // 3 all-gathers (body output, fc1, fc2) and 2 reduce-scatters
  near(withHandoff.stepSeconds - without.stepSeconds, collectives * 0.25, "step");
  withHandoff.hybrid!.transfers.forEach((t, i) =>
    near(t.seconds - without.hybrid!.transfers[i].seconds, 0.25, t.layer)
  );
  // Data-parallel plans move no activations: the handoff does not touch them.
  assert.equal(
    simulate(overlapPlan(GROUPS), HYBRID_PROFILE, { ...HAND_COSTS, handoffSeconds: 0.25 }).stepSeconds,
    simulate(overlapPlan(GROUPS), HYBRID_PROFILE, HAND_COSTS).stepSeconds,
  );
  for (const bad of [-1, Infinity, NaN]) {
    assert.throws(
      () => simulate(plan, HYBRID_PROFILE, { ...HAND_COSTS, handoffSeconds: bad }),
      (e: unknown) =>
        e instanceof ValueError &&
        e.message.includes(`handoffSeconds must be a finite number >= 0, got ${bad}`),
    );
  }
});

// Mutations tried, each made this test fail: skipping the outputBytes check (the step priced as
// NaN, no error); skipping the kind check (a sharded Conv2d priced).
Deno.test("simulate hybrid: refuses profiles that cannot price it, naming what is missing", () => {
  assert.throws(
    () => simulate(hybridPlan(GROUPS), HAND, HAND_COSTS),
    (e: unknown) =>
      e instanceof ValueError &&
      e.message.includes(
        "the profile lacks outputBytes (activation bytes at the per-device batch) for conv2, fc, which a hybrid plan's all-gathers and reduce-scatters move; measure it with measureProfile",
      ),
  );
  const convHead: Profile = {
    ...HYBRID_PROFILE,
    layers: HYBRID_PROFILE.layers.map((l) => (l.name === "fc2" ? { ...l, kind: "Conv2d" } : l)),
  };
  assert.throws(
    () => simulate(hybridPlan(GROUPS), convHead, HAND_COSTS),
    /fully-connected layers only, but fc2 \(Conv2d\)/,
  );
  // The sharded group must be the profile's output side.
  const inverted: Profile = {
    ...HYBRID_PROFILE,
    layers: [...HYBRID_PROFILE.layers.slice(2), ...HYBRID_PROFILE.layers.slice(0, 2)],
  };
  assert.throws(() => hybridTraffic(inverted, ["fc"], HAND_COSTS), /must be the profile's output side/);
  assert.throws(() => hybridTraffic(HYBRID_PROFILE, ["lstm"], HAND_COSTS), /not in the profile/);
  assert.throws(
    () => checkProfile({ batchSize: 1, layers: [{ ...layer("a", "x", 1, 1, 1), outputBytes: -1 }] }),
    /outputBytes -1/,
  );
  assert.throws(
    () => checkProfile({ batchSize: 1, layers: [{ ...layer("a", "x", 1, 1, 1), kind: "" }] }),
    /kind ""/,
  );
});

// Mutation tried: outputBytes from the layer's input instead of its output (conv1 then read the
// 1×16×16 image's 6144 B, fc2 the 1536 B of its input).
Deno.test("measureProfile records each layer's output bytes and kind, enough to price hybrid", () => {
  const network = tinyAlexNet(1);
  const profile = measureProfile(network, 6, { repeats: 1 });
  network.dispose();
  const byName = Object.fromEntries(profile.layers.map((l) => [l.name, l]));
  // fp32 at 6 samples: conv1 8×16×16, pool2 and flatten 16×4×4, fc1 64, fc2 5.
  assert.equal(byName.conv1.outputBytes, 4 * 6 * 8 * 16 * 16);
  assert.equal(byName.pool2.outputBytes, 4 * 6 * 256);
  assert.equal(byName.flatten.outputBytes, 4 * 6 * 256);
  assert.equal(byName.fc1.outputBytes, 4 * 6 * 64);
  assert.equal(byName.drop1.outputBytes, 4 * 6 * 64);
  assert.equal(byName.fc2.outputBytes, 4 * 6 * 5);
  assert.deepEqual(
    profile.layers.map((l) => l.kind),
    [
      "Conv2d",
      "ReLU",
      "LRN",
      "MaxPool2d",
      "Conv2d",
      "ReLU",
      "MaxPool2d",
      "Flatten",
      "Linear",
      "ReLU",
      "Dropout",
      "Linear",
    ],
  );
  const groups = groupTimes(profile).map((t) => t.group);
  assert.deepEqual(groups, ["fc", "conv"]);
  const traffic = simulate(hybridPlan(groups), profile, { ...HAND_COSTS, devices: 2 }).hybrid!;
  // All-gathers: flatten's output, fc1's, fc2's; reduce-scatters: fc2's input (drop1's output), fc1's.
  assert.equal(traffic.allGatherBytes, 4 * 6 * (256 + 64 + 5));
  assert.equal(traffic.reduceScatterBytes, 4 * 6 * (64 + 256));
});

/** {@link alexnetProfile} with fp32 activation sizes at batch 128 and the layers' kinds. */
function alexnetWithActivations(): Profile {
  const features: Record<string, number> = {
    conv1: 96 * 55 * 55,
    norm1: 96 * 55 * 55,
    pool1: 96 * 27 * 27,
    conv2: 256 * 27 * 27,
    norm2: 256 * 27 * 27,
    pool2: 256 * 13 * 13,
    conv3: 384 * 13 * 13,
    conv4: 384 * 13 * 13,
    conv5: 256 * 13 * 13,
    pool5: 256 * 6 * 6,
    fc6: 4096,
    fc7: 4096,
    fc8: 1000,
  };
  const kind = (name: string) =>
    name.startsWith("fc")
      ? "Linear"
      : name.startsWith("conv")
      ? "Conv2d"
      : name.startsWith("norm")
      ? "LRN"
      : "MaxPool2d";
  const profile = alexnetProfile();
  return {
    ...profile,
    layers: profile.layers.map((l) => ({
      ...l,
      outputBytes: 4 * 128 * features[l.name],
      kind: kind(l.name),
    })),
  };
}

// Mutations tried, each made this test fail: choosing hybrid when it is slower (the comparison
// reversed: NVLink picked hybrid); allowHybrid ignored (defaulting to true: the default call then
// picked hybrid over PCIe 3 ×4).
// A step of K micro-batches: hybrid pays its activations every micro-batch, data-parallel its
// gradients once, so the same plan over K micro-batches of 128 is priced from K times the compute
// and activation bytes and the same gradient bytes. Mutation: `accumulatedProfile` leaving
// `outputBytes` unscaled prices hybrid's activations once per step and fails the traffic check.
Deno.test("accumulatedProfile prices K micro-batches as one step: compute and activations K times, gradients once", () => {
  const profile = alexnetWithActivations();
  const pcie3 = STANDARD_LINKS.find((l) => l.label === "PCIe 3")!;
  const once = autoSchedule(profile, pcie3, 4, { allowHybrid: true }).judgement.hybrid!;
  const four = accumulatedProfile(profile, 4);
  assert.equal(four.batchSize, 4 * profile.batchSize);
  const perStep = autoSchedule(four, pcie3, 4, { allowHybrid: true }).judgement.hybrid!;
  assert.equal(perStep.traffic.bytes, 4 * once.traffic.bytes);
  assert.equal(perStep.dataParallelBytes, once.dataParallelBytes);
  near(
    groupTimes(four).reduce((t, g) => t + g.backwardSeconds, 0),
    4 * groupTimes(profile).reduce((t, g) => t + g.backwardSeconds, 0),
    "backward",
  );
  assert.equal(accumulatedProfile(profile, 1), profile);
  assert.throws(() => accumulatedProfile(profile, 0), /microBatches must be a positive integer, got 0/);
});

Deno.test("autoSchedule: hybrid when allowed and predicted faster, with the reason in numbers", () => {
  const profile = alexnetWithActivations();
  const pcie3 = STANDARD_LINKS.find((l) => l.label === "PCIe 3")!;
  // Off by default: exactly the data-parallel choice, as without activation sizes.
  const plain = autoSchedule(profile, pcie3, 4);
  assert.equal(plain.name, "overlap");
  assert.deepEqual(plain, autoSchedule(alexnetProfile(), pcie3, 4));
  assert.equal(plain.judgement.hybrid, undefined);

  // 4 devices behind one PCIe 3 slot: the 234.5 MB FC exchange outlasts the conv backward, while
  // fc6..fc8's activations are 55 MB per device.
  const auto = autoSchedule(profile, pcie3, 4, { allowHybrid: true });
  assert.equal(auto.name, "hybrid");
  assert.deepEqual(auto.groups, ["fc", "conv"]);
  assert.deepEqual(auto.sharded, ["fc"]);
  assert.equal(auto.assignment.pool5, "conv");
  assert.equal(auto.assignment.fc6, "fc");
  validatePlan(auto, { mode: "master" });
  const h = auto.judgement.hybrid!;
  assert.equal(h.boundaryLayer, "fc6");
  assert.deepEqual(h.shardedLayers, ["fc6", "fc7", "fc8"]);
  // Per device: 3 × (pool5 + fc6 + fc7 + fc8 outputs) gathered, 3 × (pool5 + fc6 + fc7) scattered.
  const mb = 4 * 128;
  assert.equal(h.traffic.allGatherBytes, 3 * mb * (9216 + 4096 + 4096 + 1000));
  assert.equal(h.traffic.reduceScatterBytes, 3 * mb * (9216 + 4096 + 4096));
  assert.equal(h.dataParallelBytes, 4 * (37_752_832 + 16_781_312 + 4_097_000));
  near(
    h.dataParallelExchangeSeconds,
    commActionSeconds("reduce", h.dataParallelBytes, { link: pcie3, devices: 4, mode: "master" }) +
      commActionSeconds("broadcast", h.dataParallelBytes, { link: pcie3, devices: 4, mode: "master" }),
    "data-parallel FC exchange",
  );
  const overlapSeconds = plain.judgement.split!.overlapSeconds;
  assert.ok(h.stepSeconds < overlapSeconds, `${h.stepSeconds} vs ${overlapSeconds}`);
  near(
    h.stepSeconds,
    simulate(auto, regroupProfile(profile, auto.assignment), { link: pcie3, devices: 4, mode: "master" })
      .stepSeconds,
    "step",
  );
  assert.equal(
    auto.judgement.reason.split(". Data-parallel verdict: ")[0],
    "hybrid: shard fc6..fc8 (cut before fc6) and keep the rest data-parallel: at 12.0 GB/s with 4 devices (master) " +
      "the sharded layers fc6..fc8 move 55.0 MB of activations per device per step (all-gathers 28.3 MB, " +
      "reduce-scatters 26.7 MB) in 4.93 ms on the compute lane, instead of exchanging their 234.5 MB of gradients " +
      `(reduce and broadcast: 120.84 ms); predicted step ${(h.stepSeconds * 1e3).toFixed(2)} ms against ${
        (overlapSeconds * 1e3).toFixed(2)
      } ms with overlap`,
  );
  assert.ok(auto.judgement.reason.endsWith(plain.judgement.reason));

  // Over NVLink the FC exchange hides under the conv backward: overlap stays, and the reason says why.
  const nvlink = STANDARD_LINKS.find((l) => l.label === "NVLink")!;
  const fast = autoSchedule(profile, nvlink, 2, { allowHybrid: true });
  assert.equal(fast.name, "overlap");
  assert.equal(fast.sharded, undefined);
  assert.ok(fast.judgement.hybrid!.stepSeconds > fast.judgement.split!.overlapSeconds);
  assert.ok(
    fast.judgement.reason.startsWith(
      autoSchedule(profile, nvlink, 2).judgement.reason + "; hybrid priced too and not faster: at 150.0 GB/s",
    ),
    fast.judgement.reason,
  );

  // A profile that cannot say which layers are fully connected: the data-parallel choice, and why.
  const unknown = autoSchedule(alexnetProfile(), pcie3, 4, { allowHybrid: true });
  assert.equal(unknown.name, "overlap");
  assert.ok(
    unknown.judgement.reason.endsWith(
      "; hybrid not considered: the profile does not say which layers are fully connected (no `kind`; measureProfile records it)",
    ),
  );
  assert.equal(
    autoSchedule(resnetLikeProfile(), pcie3, 4, { allowHybrid: true }).name,
    "bucketed",
  );
  // The candidate on its own; a convolutional output side has none.
  const found = hybridCandidate(profile, { link: pcie3, devices: 4, mode: "master" });
  assert.ok("candidate" in found && found.candidate.stepSeconds === h.stepSeconds);
  const convOut = {
    ...profile,
    layers: profile.layers.map((l) => (l.name === "fc8" ? { ...l, kind: "Conv2d" } : l)),
  };
  assert.deepEqual(hybridCandidate(convOut, { link: pcie3, devices: 4, mode: "master" }), {
    why: "the output-side layer with parameters, fc8, is Conv2d, not fully connected",
  });
});

// Mutation seen caught: the backward run on a first layer without parameters (a flatten, as the
// exchange probes of bench:cluster start with), which threw "the root … does not require gradients".
Deno.test("measureProfile: a parameter-free first layer has no backward to time", () => {
  const network = new Network("flatten-first", [1, 4, 4], 10, {
    flatten: new Flatten(),
    fc1: new Linear(16, 32),
    fc2: new Linear(32, 10),
  }).initialize(1);
  const profile = measureProfile(network, 4, { repeats: 1 });
  network.dispose();
  assert.deepEqual(profile.layers.map((l) => l.name), ["flatten", "fc1", "fc2"]);
  assert.equal(profile.layers[0].backwardSeconds, 0);
  assert.ok(profile.layers[1].backwardSeconds > 0 && profile.layers[2].backwardSeconds > 0);
});

/**
 * Costs of a pipelined exchange between 2 devices in 1 MiB chunks at most, over a link of
 * `bytesPerSecond` without latency, with free sums and updates of `updateSecondsPerByte`.
 */
function pipelineCosts(
  mode: "master" | "allreduce",
  bytesPerSecond: number,
  updateSecondsPerByte = 0,
): CostOptions {
  return {
    link: { bandwidthBytesPerSecond: bytesPerSecond, latencySeconds: 0 },
    devices: 2,
    mode,
    pipelineChunkBytes: 1 << 20,
    memoryBandwidthBytesPerSecond: 1e15,
    updateSecondsPerByte,
  };
}

// Mutations tried, each made this test fail: pipelineSeconds cutting every group into chunks of the
// maximum (the rule before: 1 MiB whatever the group); the floor of 64 KiB dropped; a 16th instead of
// a 32nd.
Deno.test("simulate: a group's pipeline runs in chunks of a 32nd of it, 64 KiB up to the maximum, as the MPI exchange cuts them", () => {
  assert.equal(pipelineChunkBytes(4 << 20, 1 << 20), 128 << 10);
  assert.equal(pipelineChunkBytes(1 << 20, 1 << 20), 64 << 10);
  assert.equal(pipelineChunkBytes(234_524_576, 1 << 20), 1 << 20);
  assert.equal(pipelineChunkBytes(4 << 20, 1000), 1000); // a smaller maximum wins over the floor
  // 4 MiB in master mode over 1 Gbit/s, free CPU: the gathers, then the last 128 KiB chunk's return.
  near(
    pipelineSeconds(4 << 20, { update: true, broadcast: true }, pipelineCosts("master", 125e6)),
    ((4 << 20) + (128 << 10)) / 125e6,
    "4 MiB pipeline",
    1e-6,
  );
});

// Mutations tried, each made this test fail: the allreduce rule ignored (a 32nd of the group, as in
// master mode: 32 chunks); pipelineSeconds not passing the mode (its allreduce chunk 128 KiB).
Deno.test("simulate: in allreduce mode, where nothing is sent back, a group's pipeline runs in chunks of the maximum", () => {
  assert.equal(pipelineChunkBytes(4 << 20, 1 << 20, "allreduce"), 1 << 20);
  assert.equal(pipelineChunkBytes(234_524_576, 1 << 20, "allreduce"), 1 << 20);
  assert.equal(pipelineChunkBytes(4 << 20, 1 << 20, "master"), 128 << 10);
  // 4 MiB in allreduce mode over 1 Gbit/s (both ways at once), an update at 1 GB/s: the link paces
  // the 4 chunks of 1 MiB, and the last one's update (1 ms; 0.13 ms for a 128 KiB chunk) follows.
  near(
    pipelineSeconds(4 << 20, { update: true, broadcast: false }, pipelineCosts("allreduce", 125e6, 1e-9)),
    (4 << 20) / 125e6 + (1 << 20) * 1e-9,
    "4 MiB allreduce pipeline",
    1e-6,
  );
});

// Mutations tried, each made this test fail: the link's rate ignored (a 32nd of the group at
// 10 Gbit/s too: 128 KiB); pipelineSeconds not passing its link's rate (the same); the floor applied
// in allreduce mode as a cap (875,000 bytes there instead of the maximum).
Deno.test("simulate: in master mode a chunk spends at least 1 ms on the link where its rate is known, within the maximum", () => {
  // 7 Gbit/s both ways (the rate 2 hosts measured over a 10 Gbit/s link): 875,000 bytes a ms.
  assert.equal(pipelineChunkBytes(4 << 20, 1 << 20, "master", 875e6), 875_000);
  // Over 1 Gbit/s the 32nd is longer than 1 ms (125,000 bytes): it stays.
  assert.equal(pipelineChunkBytes(4 << 20, 1 << 20, "master", 125e6), 128 << 10);
  assert.equal(pipelineChunkBytes(4 << 20, 1 << 20, "master", 100e9), 1 << 20); // the maximum caps it
  assert.equal(pipelineChunkBytes(4 << 20, 1 << 20, "allreduce", 125e6), 1 << 20);
  // 4 MiB in master mode at 875 MB/s both ways, free CPU: 4 chunks of 875,000 bytes, 1 ms each, and
  // a last one of the 694,304 left; the last one's return starts when the fourth one's has left (at
  // 5 ms) and takes 0.79 ms. 128 KiB chunks would take 33 · 0.15 ms.
  near(
    pipelineSeconds(4 << 20, { update: true, broadcast: true }, pipelineCosts("master", 875e6)),
    (5 * 875_000 + 694_304) / 875e6,
    "4 MiB pipeline at 7 Gbit/s",
    1e-6,
  );
});

// Mutation tried, which made this test fail: every chunk priced whole (the rule before, which put
// 6.8 ms too many on this group and made the AlexNet-like net's first DDP bucket over 1 Gbit/s the
// simulator's one miss, +15%).
Deno.test("simulate: a group that is not a whole number of chunks ends with a short chunk, priced by its size", () => {
  // AlexNet-like's first DDP bucket (fc7, fc8: 2,393,128 bytes) in allreduce mode at 1 Gbit/s:
  // 2 chunks of 1 MiB, then 295,976 bytes. The link paces all three; the last one's update follows.
  const bytes = 2_393_128, last = bytes - 2 * (1 << 20);
  assert.equal(last, 295_976);
  const update = 1e-9;
  near(
    pipelineSeconds(bytes, { update: true, broadcast: false }, pipelineCosts("allreduce", 125e6, update)),
    bytes / 125e6 + last * update,
    "2.39 MB allreduce pipeline",
    1e-9,
  );
  // Where the CPU is the slower resource it paces every chunk from the first one's arrival on: the
  // sum at 100 MB/s behind a 1 GB/s link, 2 MiB and 1 byte (two chunks and a byte).
  const slowCpu: CostOptions = { ...pipelineCosts("allreduce", 1e9), memoryBandwidthBytesPerSecond: 1e8 };
  const total = (2 << 20) + 1;
  near(
    pipelineSeconds(total, { update: false, broadcast: false }, slowCpu),
    (1 << 20) / 1e9 + total / 1e8,
    "CPU-paced pipeline",
    1e-9,
  );
});
